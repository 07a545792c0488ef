// @ts-check
// The models screen: every model with its backend, source, replicas and how many of its
// instances run (a bar while they download), and an admin's "New model", "Edit" and
// "Delete".

import { api } from '../lib/api.js';
import { confirmDialog, openDialog } from '../lib/dialogs.js';
import { field, h, pageHead, toast } from '../lib/dom.js';
import { describeSource, formatLabels, joinArgs, parseLabels, splitArgs, truncate } from '../lib/format.js';
import { combine, follow, listStatus, live, ticker } from '../lib/live.js';
import { isAdmin } from '../lib/session.js';
import { labelChips, progressBar, timeCell } from '../lib/widgets.js';
import { modelForm } from './model-form.js';

/** @import { DownloadProgress, Instance, Model } from '../lib/api-types' */

/** @typedef {Instance & {download: DownloadProgress}} Downloading an instance downloading its model's files */

/**
 * @param {HTMLElement} main
 */
export function renderModels(main) {
  const tableBox = h('div');
  const formBox = h('div', { class: 'hidden' });
  const newButton = isAdmin()
    ? h('button', {
      class: 'primary',
      onclick: () => {
        formBox.classList.toggle('hidden');
        const first = formBox.querySelector('input');
        if (first && !formBox.classList.contains('hidden')) first.focus();
      },
    }, 'New model')
    : null;
  if (isAdmin()) formBox.append(modelForm(() => formBox.classList.add('hidden')));
  main.append(pageHead('Models', newButton), formBox, tableBox);

  const draw = () => {
    const status = listStatus([live.models, live.instances]);
    if (status) {
      tableBox.replaceChildren(status);
      return;
    }
    const models = live.models.values();
    if (!models.length) {
      tableBox.replaceChildren(h('div', { class: 'panel empty' },
        isAdmin() ? 'No models yet. Declare one with “New model”.' : 'No models yet.'));
      return;
    }
    /** @type {Map<number, {running: number, total: number, failed: number, downloading: Downloading[]}>} */
    const byModel = new Map();
    for (const i of live.instances.values()) {
      const entry = byModel.get(i.model_id) || { running: 0, total: 0, failed: 0, downloading: [] };
      entry.total += 1;
      if (i.state === 'running') entry.running += 1;
      if (i.state === 'error' || i.state === 'unreachable') entry.failed += 1;
      if (i.state === 'downloading' && i.download) entry.downloading.push(/** @type {Downloading} */ (i));
      byModel.set(i.model_id, entry);
    }
    const rows = models.map((m) => {
      const counts = byModel.get(m.id) || { running: 0, total: 0, failed: 0, downloading: [] };
      const health = counts.total === 0 ? 'idle' : counts.running === counts.total ? 'ok' : counts.failed ? 'danger' : 'warn';
      return h('tr', null,
        h('td', { class: 'nowrap' }, h('a', { href: '#/instances?model=' + m.id }, h('strong', null, m.name)),
          m.description ? h('div', { class: 'muted small' }, m.description) : null),
        h('td', null, h('span', { class: 'chip' }, m.backend)),
        h('td', null, h('div', { class: 'mono small', title: describeSource(m.source) }, truncate(describeSource(m.source), 48))),
        h('td', { class: 'num' }, m.replicas),
        h('td', { class: 'num' }, h('span', { class: 'badge ' + health, title: 'running / total instances' }, counts.running + ' / ' + counts.total),
          modelDownload(counts.downloading)),
        h('td', null, m.placement_strategy,
          Object.keys(m.worker_selector || {}).length ? h('div', null, labelChips(m.worker_selector)) : null),
        h('td', null, m.backend_args.length ? h('code', { class: 'small' }, truncate(joinArgs(m.backend_args), 40)) : h('span', { class: 'muted' }, '—')),
        h('td', null, timeCell(m.created_at)),
        h('td', { class: 'actions' },
          counts.running ? h('a', { class: 'button small', href: '#/playground?model=' + encodeURIComponent(m.name), title: 'Chat with ' + m.name }, 'Chat') : null,
          isAdmin() ? h('button', { class: 'small', onclick: () => editModel(m) }, 'Edit') : null,
          isAdmin() ? h('button', { class: 'small danger', onclick: () => deleteModel(m) }, 'Delete') : null));
    });
    tableBox.replaceChildren(h('div', { class: 'panel flush' }, h('table', null,
      h('thead', null, h('tr', null,
        h('th', null, 'Name'), h('th', null, 'Backend'), h('th', null, 'Source'),
        h('th', { class: 'num' }, 'Replicas'), h('th', { class: 'num' }, 'Running'),
        h('th', null, 'Placement'), h('th', null, 'Backend args'), h('th', null, 'Created'),
        h('th', null))),
      h('tbody', null, rows))));
  };
  return combine(follow([live.models, live.instances], draw), ticker(draw, 30000));
}

/**
 * The download of a model's instances as one bar: the bytes of all of them (unknown
 * when one's total is), so a model on several workers shows how much is left overall.
 * @param {Downloading[]} instances
 * @returns {HTMLDivElement | null}
 */
function modelDownload(instances) {
  if (!instances.length) return null;
  const done = instances.reduce((sum, i) => sum + i.download.bytes_done, 0);
  const total = instances.every((i) => i.download.bytes_total != null)
    ? instances.reduce((sum, i) => sum + (i.download.bytes_total || 0), 0)
    : null;
  return h('div', { class: 'model-download' },
    h('div', { class: 'muted small' }, instances.length === 1 ? '1 downloading' : instances.length + ' downloading'),
    progressBar(done, total, {
      compact: true,
      label: 'Download of the model’s files',
      title: instances.map((i) => i.name + ': ' + (i.state_message || 'downloading')).join('\n'),
    }));
}

/**
 * @param {Model} model
 */
function editModel(model) {
  const replicas = h('input', { type: 'number', min: 0, max: 1000, value: String(model.replicas), required: true });
  const args = h('input', { value: joinArgs(model.backend_args) });
  const strategy = h('select', { value: model.placement_strategy },
    h('option', { value: 'spread' }, 'spread'), h('option', { value: 'binpack' }, 'binpack'));
  const selector = h('input', { value: formatLabels(model.worker_selector, ', ') });
  openDialog('Edit ' + model.name, [
    field('Replicas', replicas, 'Adding replicas creates instances; removing them stops the highest-numbered ones.'),
    field('Backend arguments', args, 'Changing them restarts the instances.'),
    field('Placement strategy', strategy),
    field('Worker selector', selector, 'k=v, comma-separated; empty for any worker.'),
  ], {
    submitLabel: 'Save',
    onSubmit: async () => {
      /** @type {Record<string, unknown>} */
      const update = {};
      const wanted = Number(replicas.value);
      if (wanted !== model.replicas) update.replicas = wanted;
      const newArgs = splitArgs(args.value);
      if (JSON.stringify(newArgs) !== JSON.stringify(model.backend_args)) update.backend_args = newArgs;
      if (strategy.value !== model.placement_strategy) update.placement_strategy = strategy.value;
      const newSelector = parseLabels(selector.value);
      if (JSON.stringify(newSelector) !== JSON.stringify(model.worker_selector || {})) update.worker_selector = newSelector;
      if (!Object.keys(update).length) return;
      await api('PATCH', '/api/v1/models/' + model.id, update);
      toast('Model ' + model.name + ' updated.');
    },
  });
}

/**
 * @param {Model} model
 */
function deleteModel(model) {
  confirmDialog('Delete ' + model.name + '?',
    'This deletes the model and stops all of its instances. Clients calling it get errors at once.',
    'Delete model',
    async () => {
      await api('DELETE', '/api/v1/models/' + model.id);
      toast('Model ' + model.name + ' deleted.');
    });
}
