// @ts-check
// The models screen: every model with its backend, source, replicas and how many of its
// instances run (a bar while they download), filtered by cluster (#/models?cluster=<id>)
// where there is more than one, and "New model", "Edit" and "Delete" for admins and for the
// administrators of a model's cluster (who deploy into their clusters only).

import { api, itemsOf, listAll } from '../lib/api.js';
import { clusterFilter, clusterName, clusterParam } from '../lib/clusters.js';
import { openDialog } from '../lib/dialogs.js';
import { field, h, pageHead, toast } from '../lib/dom.js';
import { describeSource, firstLine, formatLabels, joinArgs, parseLabels, splitArgs, truncate } from '../lib/format.js';
import { combine, follow, listStatus, live, liveIn, ticker } from '../lib/live.js';
import { administers, administersSomeCluster, isAdmin } from '../lib/session.js';
import { MODEL_FIELDS, sentence } from '../lib/sentence.js';
import { gravest } from '../lib/trouble.js';
import { labelChips, progressBar, timeCell } from '../lib/widgets.js';
import { modelForm } from './model-form.js';

/** @import { Cluster, DownloadProgress, Instance, Model, ModelSource, Route, RouteTarget } from '../lib/api-types' */

/** @typedef {Instance & {download: DownloadProgress}} Downloading an instance downloading its model's files */

/**
 * @param {HTMLElement} main
 * @param {URLSearchParams} params
 */
export function renderModels(main, params) {
  const clusterId = clusterParam(params);
  const lists = liveIn(clusterId);
  /** @type {Cluster[]} */
  let clusters = [];
  const tableBox = h('div');
  const formBox = h('div', { class: 'hidden' });
  // An admin deploys anywhere, a cluster administrator into their clusters (the form
  // offers only those).
  const deploys = administersSomeCluster();
  const newButton = deploys
    ? h('button', {
      class: 'primary',
      onclick: () => {
        formBox.classList.toggle('hidden');
        const first = formBox.querySelector('input');
        if (first && !formBox.classList.contains('hidden')) first.focus();
      },
    }, 'New model')
    : null;
  // A new model goes into the cluster the list shows, unless another is chosen.
  if (deploys) formBox.append(modelForm(() => formBox.classList.add('hidden'), undefined, clusterId));
  const filter = clusterFilter(params, '#/models', (read) => {
    clusters = read;
    draw();
  });
  main.append(pageHead('Models', h('div', { class: 'filters' }, filter), newButton), formBox, tableBox);

  const draw = () => {
    const status = listStatus([lists.models, lists.instances]);
    if (status) {
      tableBox.replaceChildren(status);
      return;
    }
    const models = lists.models.values();
    if (!models.length) {
      const where = clusterId == null ? '' : ' in ' + clusterName(clusters, clusterId);
      tableBox.replaceChildren(h('div', { class: 'panel empty' },
        deploys ? 'No models' + where + ' yet. Declare one with “New model”.' : 'No models' + where + ' yet.'));
      return;
    }
    // Which cluster each model is in, where there are several and the list shows them all.
    const showCluster = clusters.length > 1 && clusterId == null;
    /** @type {Map<number, {running: number, total: number, failed: number, downloading: Downloading[], instances: Instance[]}>} */
    const byModel = new Map();
    for (const i of lists.instances.values()) {
      const entry = byModel.get(i.model_id) || { running: 0, total: 0, failed: 0, downloading: [], instances: [] };
      entry.total += 1;
      entry.instances.push(i);
      if (i.state === 'running') entry.running += 1;
      if (i.state === 'error' || i.state === 'unreachable') entry.failed += 1;
      if (i.state === 'downloading' && i.download) entry.downloading.push(/** @type {Downloading} */ (i));
      byModel.set(i.model_id, entry);
    }
    const rows = models.flatMap((m) => {
      const counts = byModel.get(m.id) || { running: 0, total: 0, failed: 0, downloading: [], instances: [] };
      const health = counts.total === 0 ? 'idle' : counts.running === counts.total ? 'ok' : counts.failed ? 'danger' : 'warn';
      // Why the model is not (all) serving, in the words of whoever could tell.
      const why = gravest(counts.instances);
      const row = h('tr', { class: why ? 'has-detail' : null },
        h('td', { class: 'nowrap' }, h('a', { href: '#/models/' + encodeURIComponent(m.name), title: 'Settings, instances, usage and routes of ' + m.name }, h('strong', null, m.name)),
          m.description ? h('div', { class: 'muted small' }, m.description) : null,
          showCluster ? h('div', { class: 'small', 'data-model-cluster': '' }, 'cluster ',
            h('a', { href: '#/models?cluster=' + m.cluster_id }, clusterName(clusters, m.cluster_id))) : null),
        h('td', { class: 'opt' }, h('span', { class: 'chip' }, m.backend)),
        h('td', { class: 'opt' }, h('div', { class: 'mono small', title: describeSource(m.source) }, truncate(describeSource(m.source), 48))),
        h('td', { class: 'num opt' }, m.replicas),
        h('td', { class: 'num' }, h('span', { class: 'badge ' + health, title: 'running / total instances' }, counts.running + ' / ' + counts.total),
          modelDownload(counts.downloading)),
        h('td', { class: 'opt' }, m.placement_strategy,
          Object.keys(m.worker_selector || {}).length ? h('div', null, labelChips(m.worker_selector)) : null),
        h('td', { class: 'opt' }, m.backend_args.length ? h('code', { class: 'small' }, truncate(joinArgs(m.backend_args), 40)) : h('span', { class: 'muted' }, '—')),
        h('td', { class: 'opt' }, timeCell(m.created_at)),
        h('td', { class: 'actions' },
          counts.running ? h('a', { class: 'button small', href: '#/playground?model=' + encodeURIComponent(m.name), title: 'Chat with ' + m.name }, 'Chat') : null,
          administers(m.cluster_id) ? h('button', { class: 'small', onclick: () => editModel(m) }, 'Edit') : null,
          administers(m.cluster_id) ? h('button', { class: 'small danger', onclick: () => deleteModel(m) }, 'Delete') : null));
      // The reason gets the table's whole width under its row, so it is read whole.
      return why ? [row, h('tr', { class: 'detail', 'data-reason-of': m.name }, h('td', { colspan: 9 },
        h('div', { class: 'state-message model-reason', 'data-model-reason': why.state },
          h('strong', null, why.name + ' ' + why.state.replace('_', ' ') + ': '), firstLine(why.state_message))))] : [row];
    });
    tableBox.replaceChildren(h('div', { class: 'panel flush' }, h('table', null,
      h('thead', null, h('tr', null,
        h('th', null, 'Name'), h('th', { class: 'opt' }, 'Backend'), h('th', { class: 'opt' }, 'Source'),
        h('th', { class: 'num opt' }, 'Replicas'), h('th', { class: 'num' }, 'Running'),
        h('th', { class: 'opt' }, 'Placement'), h('th', { class: 'opt' }, 'Backend args'), h('th', { class: 'opt' }, 'Created'),
        h('th', null))),
      h('tbody', null, rows))));
  };
  return combine(follow([lists.models, lists.instances], draw), ticker(draw, 30000));
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
 * The source fields of the edit dialog: a local path, a Hugging Face repository or a URL,
 * or the model's own source kept as it is when the dialog has no fields for its type
 * (ModelScope, S3, an upload).
 * @param {ModelSource} current
 * @returns {{fields: HTMLElement[], source: () => ModelSource}}
 */
function sourceEditor(current) {
  const fielded = ['local_path', 'huggingface', 'url'];
  const type = h('select', { 'aria-label': 'Source' },
    fielded.includes(current.type) ? null : h('option', { value: 'current' }, 'As it is: ' + truncate(describeSource(current), 60)),
    h('option', { value: 'local_path' }, 'Local path'),
    h('option', { value: 'huggingface' }, 'Hugging Face repository'),
    h('option', { value: 'url' }, 'URL'));
  type.value = fielded.includes(current.type) ? current.type : 'current';
  const path = h('input', { value: current.type === 'local_path' ? current.path : '', placeholder: '/models/llama-3-8b.Q4_K_M.gguf' });
  const repo = h('input', { value: current.type === 'huggingface' ? current.repo_id : '', placeholder: 'owner/name' });
  const file = h('input', { value: current.type === 'huggingface' ? current.file || '' : '', placeholder: 'optional: one file, e.g. model.Q4_K_M.gguf' });
  const url = h('input', { type: 'url', value: current.type === 'url' ? /** @type {string[]} */ ([]).concat(current.url)[0] : '', placeholder: 'https://example.com/model.gguf' });
  const pathField = field('Path', path, 'On the server (which reads its header) and on the workers, under their model directories.');
  const repoField = field('Repository', repo);
  const fileField = field('File', file);
  const urlField = field('URL', url);
  const sync = () => {
    pathField.classList.toggle('hidden', type.value !== 'local_path');
    repoField.classList.toggle('hidden', type.value !== 'huggingface');
    fileField.classList.toggle('hidden', type.value !== 'huggingface');
    urlField.classList.toggle('hidden', type.value !== 'url');
  };
  type.addEventListener('change', sync);
  sync();
  /** @returns {ModelSource} */
  const source = () => {
    switch (type.value) {
      case 'local_path': return { type: 'local_path', path: path.value.trim() };
      case 'huggingface': return Object.assign({ type: /** @type {'huggingface'} */ ('huggingface'), repo_id: repo.value.trim() }, file.value.trim() ? { file: file.value.trim() } : {});
      case 'url':
        // A URL with a digest keeps it while the URL is the same.
        if (current.type === 'url' && /** @type {string[]} */ ([]).concat(current.url)[0] === url.value.trim()) return current;
        return { type: 'url', url: url.value.trim() };
      default: return current;
    }
  };
  return {
    fields: [field('Source', type, 'Changing it moves the instances onto the new files, one at a time.'), pathField, repoField, fileField, urlField],
    source,
  };
}

/**
 * Whether two sources name the same files: the same fields, whatever their order.
 * @param {ModelSource} a
 * @param {ModelSource} b
 * @returns {boolean}
 */
function sameSource(a, b) {
  /** @param {Record<string, unknown>} s */
  const canonical = (s) => JSON.stringify(Object.keys(s).sort().map((k) => [k, s[k]]));
  return canonical(a) === canonical(b);
}

/**
 * The edit dialog: source, replicas, arguments, placement and selector. A refusal is
 * shown as a sentence about the dialog's own fields, and the dialog stays open.
 * @param {Model} model
 */
function editModel(model) {
  const replicas = h('input', { type: 'number', min: 0, max: 1000, value: String(model.replicas), required: true });
  const args = h('input', { value: joinArgs(model.backend_args) });
  const strategy = h('select', { value: model.placement_strategy },
    h('option', { value: 'spread' }, 'spread'), h('option', { value: 'binpack' }, 'binpack'));
  const selector = h('input', { value: formatLabels(model.worker_selector, ', ') });
  const source = sourceEditor(model.source);
  openDialog('Edit ' + model.name, [
    ...source.fields,
    field('Replicas', replicas, 'Adding replicas creates instances; removing them stops the highest-numbered ones.'),
    field('Backend arguments', args, 'Changing them restarts the instances.'),
    field('Placement strategy', strategy),
    field('Worker selector', selector, 'k=v, comma-separated; empty for any worker.'),
  ], {
    submitLabel: 'Save',
    onSubmit: async () => {
      /** @type {Record<string, unknown>} */
      const update = {};
      const newSource = source.source();
      if (!sameSource(newSource, model.source)) update.source = newSource;
      const wanted = Number(replicas.value);
      if (wanted !== model.replicas) update.replicas = wanted;
      const newArgs = splitArgs(args.value);
      if (JSON.stringify(newArgs) !== JSON.stringify(model.backend_args)) update.backend_args = newArgs;
      if (strategy.value !== model.placement_strategy) update.placement_strategy = strategy.value;
      const newSelector = parseLabels(selector.value);
      if (JSON.stringify(newSelector) !== JSON.stringify(model.worker_selector || {})) update.worker_selector = newSelector;
      if (!Object.keys(update).length) return;
      try {
        await api('PATCH', '/api/v1/models/' + model.id, update);
      } catch (e) {
        throw new Error(sentence(e, MODEL_FIELDS));
      }
      toast('Model ' + model.name + ' updated' + (update.source || update.backend_args ? '; its instances move onto the new settings.' : '.'));
    },
  });
}

/**
 * Asks before deleting a model, naming the routes that send requests to it (they skip it
 * once it is gone; one with no other target refuses its clients).
 * @param {Model} model
 */
export async function deleteModel(model) {
  /** @type {Route[] | null} null when the routes could not be read */
  let routes = null;
  /** @type {Set<string>} the names of the deployed models, of every cluster */
  let deployed = new Set();
  if (!isAdmin()) {
    // Routes are the admins': a cluster administrator neither reads nor is warned of them.
    routes = [];
  } else {
    try {
      /** @type {Route[]} */
      const all = itemsOf(await api('GET', '/api/v1/model-routes'));
      // A list filtered by cluster follows that cluster's models only; a route's targets
      // may be in any.
      /** @type {Model[]} */
      const models = live.models.loaded ? live.models.values() : await listAll('/api/v1/models');
      deployed = new Set(models.map((m) => m.name));
      routes = all.filter((r) => targetsModel(r, model.name));
    } catch (_) {
      // Asked anyway: the warning says the routes are not known.
    }
  }
  /** @type {import('../lib/dom-types').Child[]} */
  const body = [];
  if (routes === null) {
    body.push(h('div', { class: 'alert warn confirm-warning', 'data-route-warning': '' },
      'The routes could not be read: check on the Routes screen whether one sends requests to ' + model.name + '.'));
  } else if (routes.length) {
    body.push(h('div', { class: 'alert warn confirm-warning', 'data-route-warning': '' },
      (routes.length === 1 ? 'A route sends' : routes.length + ' routes send') + ' requests to ' + model.name + ':',
      h('ul', null, routes.map((r) => h('li', { 'data-route': r.name },
        h('strong', null, r.name), ' — ', afterDeletion(r, model.name, deployed))))));
  }
  body.push(h('p', null, 'This deletes the model and stops all of its instances. Clients calling it get errors at once.'));
  openDialog('Delete ' + model.name + '?', body, {
    submitLabel: 'Delete model',
    danger: true,
    onSubmit: async () => {
      try {
        await api('DELETE', '/api/v1/models/' + model.id);
      } catch (e) {
        throw new Error(sentence(e));
      }
      toast('Deleted model “' + model.name + '”.');
    },
  });
}

/**
 * What becomes of a route once the deployed model `name`, one of its targets, is gone.
 * @param {Route} route
 * @param {string} name
 * @param {Set<string>} deployed the names of the deployed models
 * @returns {string}
 */
function afterDeletion(route, name, deployed) {
  const others = route.targets.filter((t) => !targetsThis(t, name));
  if (others.some((t) => t.provider || deployed.has(t.model))) return 'its other targets answer instead.';
  return (others.length ? 'none of its other targets is deployed' : 'it has no other target')
    + ': its clients get errors until a model of this name runs again.';
}

/**
 * Whether a route target is the deployed model `name` (not a provider's model of that name).
 * @param {RouteTarget} target
 * @param {string} name
 * @returns {boolean}
 */
function targetsThis(target, name) {
  return !target.provider && target.model === name;
}

/**
 * Whether one of a route's targets is the deployed model `name`.
 * @param {Route} route
 * @param {string} name
 * @returns {boolean}
 */
function targetsModel(route, name) {
  return route.targets.some((t) => targetsThis(t, name));
}
