// @ts-check
// The model files screen (admins): what the workers' model caches hold, file by file with
// its state and the models that use it, which workers did not answer, and deleting a file
// no instance uses; then the models whose files the workers read in place (local paths,
// which are in no cache); the uploads to the servers are its last part (uploads.js).

import { api } from '../lib/api.js';
import { confirmDialog } from '../lib/dialogs.js';
import { h, pageHead, toast } from '../lib/dom.js';
import { baseName, fmtBytes } from '../lib/format.js';
import { combine, follow, live } from '../lib/live.js';
import { INSTANCE_STATE_CLASS, progressBar, stateBadge, timeCell } from '../lib/widgets.js';
import { uploadsSection } from './uploads.js';

/** @import { Instance, Model, ModelFile, ModelFileList } from '../lib/api-types' */

/**
 * How often the model files screen re-reads the list: it has no watch stream.
 */
const MODEL_FILES_POLL_MS = 4000;

/** @type {Record<string, string>} */
const FILE_STATE_CLASS = { ready: 'ok', downloading: 'info', partial: 'warn', error: 'danger' };

/**
 * @param {HTMLElement} main
 * @param {string[]} parts
 * @param {URLSearchParams} params
 */
export function renderModelFiles(main, parts, params) {
  const wanted = { worker: params.get('worker') || '' };
  const workerFilter = h('select', { 'aria-label': 'Worker' }, h('option', { value: '' }, 'all workers'));
  const updated = h('span', { class: 'muted small', 'data-updated': '' });
  const notice = h('div', { class: 'notices' });
  const tableBox = h('div', { 'data-cache': '' }, h('div', { class: 'panel empty' }, 'Loading…'));
  const localBox = h('section', { 'data-local-paths': '' });
  const uploads = uploadsSection(MODEL_FILES_POLL_MS);
  main.append(pageHead('Model files', h('div', { class: 'filters' }, updated, h('label', null, 'Worker', workerFilter))),
    h('p', { class: 'page-note muted small' },
      'What the workers’ model caches hold. A file that no instance uses can be deleted; it is downloaded again when a model needs it.'),
    notice, tableBox, localBox, uploads.element);

  /** @type {ModelFileList | null} the last answer */
  let list = null;
  /** @type {Error | null} why the last read failed */
  let error = null;
  /** @type {Date | null} */
  let loadedAt = null;
  const draw = () => {
    // Keep the worker choices current without losing the selection.
    const workers = live.workers.values();
    const choices = workers.map((w) => [String(w.id), w.name]);
    if (wanted.worker && !choices.some(([id]) => id === wanted.worker)) choices.push([wanted.worker, 'worker ' + wanted.worker]);
    if (workerFilter.options.length !== choices.length + 1 || choices.some(([id], i) => workerFilter.options[i + 1].value !== id)) {
      workerFilter.replaceChildren(h('option', { value: '' }, 'all workers'), ...choices.map(([id, name]) => h('option', { value: id }, name)));
    }
    workerFilter.value = wanted.worker;
    drawLocal();

    if (!list) {
      notice.replaceChildren();
      tableBox.replaceChildren(error
        ? h('div', { class: 'panel' }, h('div', { class: 'alert' }, error.message))
        : h('div', { class: 'panel empty' }, 'Loading…'));
      return;
    }
    const files = list.items;
    const bytes = files.reduce((sum, f) => sum + f.bytes_done, 0);
    updated.textContent = files.length + (files.length === 1 ? ' file' : ' files') + ' in the caches, ' + fmtBytes(bytes) + ' on disk'
      + (loadedAt ? ' · updated ' + loadedAt.toLocaleTimeString() : '');

    // Keep the last answer on screen when a refresh fails, and say that it is stale.
    const notices = [];
    if (error) notices.push(h('div', { class: 'alert' }, 'Cannot refresh: ' + error.message));
    if (list.unreachable.length) {
      notices.push(h('div', { class: 'alert warn', 'data-unreachable': '' },
        h('strong', null, list.unreachable.length === 1
          ? 'A worker did not answer: its files are not listed.'
          : list.unreachable.length + ' workers did not answer: their files are not listed.'),
        h('ul', null, list.unreachable.map((u) =>
          h('li', { 'data-worker': u.worker_id }, h('strong', null, u.worker_name), ': ', u.error)))));
    }
    // The server asks only the workers it can reach; say which ones it left out.
    const lost = live.workers.values().filter((w) => w.state === 'unreachable' && (!wanted.worker || String(w.id) === wanted.worker));
    if (lost.length) {
      notices.push(h('div', { class: 'alert warn' }, 'Not asked, because they are unreachable: ',
        lost.map((w, i) => [i ? ', ' : '', h('strong', null, w.name)]), '.'));
    }
    notice.replaceChildren(...notices);

    if (!files.length) {
      let empty = 'No files in the workers’ caches: a worker downloads a model’s files into its cache when an instance of the model starts there.'
        + (localModels().length ? ' Models with a local path are read where they are, and listed under “Local paths”.' : '');
      if (wanted.worker) {
        empty = list.unreachable.length ? 'The worker did not answer: its files cannot be listed now.' : 'No files in this worker’s cache.';
      } else if (list.unreachable.length) {
        empty = 'No files on the workers that answered.';
      }
      tableBox.replaceChildren(h('div', { class: 'panel empty' }, empty));
      return;
    }
    const rows = files.map((f) => {
      const names = f.names || [];
      const name = names.length ? baseName(names[0]) : f.blob;
      // The model directory the name is in, shown under it; every name on hover.
      const where = names.length ? names[0].slice(0, names[0].length - name.length).replace(/\/$/, '') : '';
      const title = names.concat(['blob ' + f.blob]).join('\n');
      // Of a download whose size the worker does not know, `size` is only what is on disk.
      const total = f.size > f.bytes_done ? f.size : null;
      const progress = f.state === 'downloading' || f.state === 'partial'
        ? progressBar(f.bytes_done, total, { paused: f.state === 'partial', label: 'Download of ' + name })
        : null;
      return h('tr', { 'data-file': f.id },
        h('td', { class: 'file-name' },
          h('strong', { class: 'mono', title, 'data-part': 'name' }, name),
          where ? h('div', { class: 'muted small mono', title }, where) : null,
          names.length > 1 ? h('div', { class: 'muted small', title }, '+ ' + (names.length - 1) + ' more name' + (names.length > 2 ? 's' : '')) : null),
        h('td', null, h('a', { href: '#/model-files?worker=' + f.worker_id }, f.worker_name)),
        h('td', { class: 'num' }, fmtBytes(f.size)),
        h('td', null, stateBadge(f.state, FILE_STATE_CLASS), progress,
          f.error ? h('div', { class: 'state-message' }, f.error) : null),
        h('td', null, f.models.length ? f.models.map((m) => h('span', { class: 'chip' }, m)) : h('span', { class: 'muted' }, '—')),
        h('td', null, f.last_used_at ? timeCell(f.last_used_at) : h('span', { class: 'muted' }, 'never')),
        h('td', { class: 'actions' }, h('button', {
          class: 'small danger',
          title: f.models.length ? 'Used by ' + f.models.join(', ') + ': the worker keeps it while they run' : null,
          onclick: () => deleteModelFile(f, name, load),
        }, 'Delete')));
    });
    tableBox.replaceChildren(h('div', { class: 'panel flush' }, h('table', null,
      h('thead', null, h('tr', null,
        h('th', null, 'File'), h('th', null, 'Worker'), h('th', { class: 'num' }, 'Size'), h('th', null, 'State'),
        h('th', null, 'Used by'), h('th', null, 'Last used'), h('th', null))),
      h('tbody', null, rows))));
  };

  /** @returns {Model[]} the models whose source is a path on the workers */
  const localModels = () => live.models.values().filter((m) => m.source.type === 'local_path');
  // The files of local-path models are not in a cache: the workers read them where they
  // are. They are listed by path, with the instances that read them, so a running model
  // is never missing from this screen.
  const drawLocal = () => {
    const models = localModels();
    if (!live.models.loaded || !models.length) {
      localBox.replaceChildren();
      return;
    }
    /** @type {Map<string, Model[]>} */
    const byPath = new Map();
    for (const m of models) {
      const path = /** @type {{path: string}} */ (m.source).path;
      byPath.set(path, (byPath.get(path) || []).concat([m]));
    }
    const instances = live.instances.values();
    const rows = Array.from(byPath.entries()).sort(([a], [b]) => a.localeCompare(b)).map(([path, users]) => {
      const ids = new Set(users.map((m) => m.id));
      /** @type {Instance[]} */
      const readers = instances.filter((i) => ids.has(i.model_id) && i.worker_id != null
        && (!wanted.worker || String(i.worker_id) === wanted.worker));
      return h('tr', { 'data-local-path': path },
        h('td', { class: 'file-name' },
          h('strong', { class: 'mono', title: path }, baseName(path) || path),
          h('div', { class: 'muted small mono', title: path }, path),
          h('div', { class: 'local-models' }, h('span', { class: 'muted small' }, 'used by '),
            users.map((m) => h('a', { class: 'chip', href: '#/models/' + encodeURIComponent(m.name) }, m.name)))),
        h('td', null, readers.length
          ? readers.map((i) => h('div', { class: 'nowrap' }, h('a', { href: '#/model-files?worker=' + i.worker_id }, i.worker_name), ' ',
            h('span', { class: 'muted small' }, i.name), ' ', stateBadge(i.state, INSTANCE_STATE_CLASS)))
          : h('span', { class: 'muted' }, wanted.worker ? 'no instance on this worker' : 'no instance placed')));
    });
    localBox.replaceChildren(
      h('h2', { class: 'section-head' }, 'Local paths'),
      h('p', { class: 'section-note muted small' },
        'Models whose source is a path on the workers: each worker reads the file where it is, so it is in no cache and not counted above. Delete it on the worker itself.'),
      h('div', { class: 'panel flush' }, h('table', null,
        h('thead', null, h('tr', null, h('th', null, 'Path'), h('th', null, 'Read by'))),
        h('tbody', null, rows))));
  };

  let stopped = false;
  /** @type {ReturnType<typeof setTimeout> | undefined} the next read */
  let timer;
  // Only the latest read draws and schedules the next: a delete reloads at once.
  let latest = 0;
  const load = async () => {
    clearTimeout(timer);
    const mine = ++latest;
    const query = wanted.worker ? '?worker_id=' + encodeURIComponent(wanted.worker) : '';
    try {
      const answer = await api('GET', '/api/v1/model-files' + query);
      if (stopped || mine !== latest) return;
      list = answer;
      error = null;
      loadedAt = new Date();
    } catch (e) {
      if (stopped || mine !== latest) return;
      error = e;
    }
    draw();
    timer = setTimeout(load, MODEL_FILES_POLL_MS);
  };
  workerFilter.addEventListener('change', () => {
    wanted.worker = workerFilter.value;
    history.replaceState(null, '', '#/model-files' + (wanted.worker ? '?worker=' + encodeURIComponent(wanted.worker) : ''));
    list = null;
    error = null;
    draw();
    load();
  });
  load();
  return combine(follow([live.workers, live.models, live.instances], draw), uploads.cleanup, () => {
    stopped = true;
    clearTimeout(timer);
  });
}

/**
 * @param {ModelFile} file
 * @param {string} name
 * @param {() => void} reload
 */
function deleteModelFile(file, name, reload) {
  confirmDialog('Delete ' + name + ' from ' + file.worker_name + '?',
    'The file and its names go from the worker’s cache. A model that needs it again downloads it again. The worker refuses while an instance uses the file.',
    'Delete file',
    async () => {
      await api('DELETE', '/api/v1/model-files/' + file.worker_id + '/' + encodeURIComponent(file.blob));
      toast(name + ' deleted from ' + file.worker_name + '.');
      reload();
    });
}
