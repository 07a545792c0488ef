// @ts-check
// The instances screen: every instance with its state (a bar while it downloads), worker,
// GPUs and address, filtered by model, state or worker, and by cluster where there is more
// than one (the cluster's instances as the server lists them), "Restart" for admins and the
// administrators of an instance's cluster, and
// the logs of one instance (#/instances/<id>/logs), followed every two seconds.

import { api } from '../lib/api.js';
import { clusterFilter, clusterParam } from '../lib/clusters.js';
import { confirmDialog } from '../lib/dialogs.js';
import { h, pageHead, toast } from '../lib/dom.js';
import { combine, follow, listStatus, live, liveIn, ticker } from '../lib/live.js';
import { sentence } from '../lib/sentence.js';
import { administers } from '../lib/session.js';
import { INSTANCE_STATE_CLASS, INSTANCE_STATES, instanceProgress, stateBadge, timeCell } from '../lib/widgets.js';

/** @import { Instance } from '../lib/api-types' */

/**
 * @param {HTMLElement} main
 * @param {string[]} parts
 * @param {URLSearchParams} params
 */
export function renderInstances(main, parts, params) {
  if (parts[0] && parts[1] === 'logs') return renderLogs(main, Number(parts[0]), params);
  const clusterId = clusterParam(params);
  const lists = liveIn(clusterId);
  const modelFilter = h('select', { 'aria-label': 'Model' }, h('option', { value: '' }, 'all models'));
  const stateFilter = h('select', { 'aria-label': 'State' }, h('option', { value: '' }, 'all states'),
    INSTANCE_STATES.map((s) => h('option', { value: s }, s)));
  const wanted = { model: params.get('model') || '', state: params.get('state') || '', worker: params.get('worker') || '' };
  const workerFilter = h('span', { class: 'filter-chip' });
  stateFilter.value = wanted.state;
  const setQuery = () => {
    const q = new URLSearchParams();
    if (modelFilter.value) q.set('model', modelFilter.value);
    if (stateFilter.value) q.set('state', stateFilter.value);
    if (wanted.worker) q.set('worker', wanted.worker);
    if (clusterId != null) q.set('cluster', String(clusterId));
    const hash = '#/instances' + (q.toString() ? '?' + q : '');
    history.replaceState(null, '', hash);
    wanted.model = modelFilter.value;
    wanted.state = stateFilter.value;
    draw();
  };
  modelFilter.addEventListener('change', setQuery);
  stateFilter.addEventListener('change', setQuery);
  const tableBox = h('div');
  // The cluster's choice draws the screen again, with the model and state chosen kept.
  const clusterChoice = clusterFilter(params, '#/instances');
  main.append(pageHead('Instances', h('div', { class: 'filters' },
    workerFilter, clusterChoice, h('label', null, 'Model', modelFilter), h('label', null, 'State', stateFilter))), tableBox);

  const draw = () => {
    // Keep the model choices current without losing the selection.
    const models = lists.models.values();
    const options = [h('option', { value: '' }, 'all models')].concat(models.map((m) => h('option', { value: String(m.id) }, m.name)));
    if (modelFilter.options.length !== options.length || models.some((m, i) => modelFilter.options[i + 1].value !== String(m.id))) {
      modelFilter.replaceChildren(...options);
    }
    modelFilter.value = wanted.model;
    workerFilter.replaceChildren();
    if (wanted.worker) {
      const sample = lists.instances.values().find((i) => String(i.worker_id) === wanted.worker);
      workerFilter.append(h('span', { class: 'chip' }, 'worker ' + (sample ? sample.worker_name : wanted.worker)),
        h('button', { class: 'small', title: 'Show every worker', onclick: () => { wanted.worker = ''; setQuery(); } }, '×'));
    }

    const status = listStatus([lists.instances]);
    if (status) {
      tableBox.replaceChildren(status);
      return;
    }
    const instances = lists.instances.values().filter((i) =>
      (!wanted.model || String(i.model_id) === wanted.model) && (!wanted.state || i.state === wanted.state)
      && (!wanted.worker || String(i.worker_id) === wanted.worker));
    if (!instances.length) {
      tableBox.replaceChildren(h('div', { class: 'panel empty' },
        lists.instances.items.size ? 'No instance matches the filter.' : 'No instances: they appear when a model has replicas.'));
      return;
    }
    const columns = 9;
    const rows = [];
    for (const i of instances) {
      const isError = i.state === 'error' && i.state_message;
      // A download shows as a bar; its state message says the same in words (its title).
      const progress = instanceProgress(i);
      rows.push(h('tr', { class: isError ? 'has-detail' : null, 'data-instance': i.id },
        h('td', null, h('strong', null, i.name)),
        h('td', { class: 'opt' }, h('a', { href: '#/instances?model=' + i.model_id }, i.model_name)),
        h('td', null, stateBadge(i.state, INSTANCE_STATE_CLASS),
          progress || (!isError && i.state_message ? h('div', { class: 'state-message' }, i.state_message) : null)),
        h('td', { class: 'opt' }, i.worker_name || h('span', { class: 'muted' }, '—')),
        h('td', { class: 'opt' }, i.worker_id == null ? h('span', { class: 'muted' }, '—')
          : h('span', { class: 'mono small' }, i.gpu_indexes.length ? i.gpu_indexes.join(', ') : 'CPU')),
        h('td', { class: 'opt' }, i.address ? h('span', { class: 'mono small' }, i.address) : h('span', { class: 'muted' }, '—')),
        h('td', { class: 'num opt', 'data-restarts': '' }, i.restart_count),
        h('td', { class: 'opt' }, timeCell(i.updated_at)),
        h('td', { class: 'actions' },
          i.worker_id == null
            ? h('button', { class: 'small', disabled: true, title: 'Not placed on a worker yet: no logs' }, 'Logs')
            : h('a', { class: 'button small', href: '#/instances/' + i.id + '/logs' }, 'Logs'),
          administers(i.cluster_id) ? h('button', i.worker_id == null
            ? { class: 'small danger', disabled: true, title: 'Not placed on a worker yet: nothing runs to restart' }
            : { class: 'small danger', title: 'Stop the backend and start it again where it is', onclick: () => restartInstance(i) }, 'Restart') : null)));
      if (isError) {
        rows.push(h('tr', { class: 'detail' }, h('td', { colspan: columns },
          h('pre', { class: 'stderr' }, i.state_message))));
      }
    }
    tableBox.replaceChildren(h('div', { class: 'panel flush' }, h('table', null,
      h('thead', null, h('tr', null,
        h('th', null, 'Instance'), h('th', { class: 'opt' }, 'Model'), h('th', null, 'State'), h('th', { class: 'opt' }, 'Worker'),
        h('th', { class: 'opt' }, 'GPUs'), h('th', { class: 'opt' }, 'Address'), h('th', { class: 'num opt' }, 'Restarts'),
        h('th', { class: 'opt' }, 'Updated'), h('th', null))),
      h('tbody', null, rows))));
  };
  return combine(follow([lists.instances, lists.models], draw), ticker(draw, 10000));
}

/**
 * @param {Instance} instance
 */
function restartInstance(instance) {
  confirmDialog('Restart ' + instance.name + '?',
    'Its backend on ' + (instance.worker_name || 'its worker') + ' is stopped (requests in progress may finish first) and started again with the same GPUs and address. It answers no requests until it is running again.',
    'Restart',
    async () => {
      try {
        await api('POST', '/api/v1/model-instances/' + instance.id + '/restart');
      } catch (e) {
        throw new Error(sentence(e));
      }
      toast('Instance ' + instance.name + ' is restarting.');
    });
}

/**
 * @param {HTMLElement} main
 * @param {number} id
 * @param {URLSearchParams} params
 */
function renderLogs(main, id, params) {
  const tail = h('select', { 'aria-label': 'Lines' }, [100, 200, 1000, 5000].map((n) => h('option', { value: String(n) }, 'last ' + n + ' lines')));
  tail.value = params.get('tail') || '200';
  const followBox = h('input', { type: 'checkbox', checked: params.get('follow') !== 'false' });
  const refresh = h('button', { class: 'small' }, 'Refresh');
  const header = h('span', { class: 'muted' }, 'instance ' + id);
  const error = h('div', { class: 'alert', role: 'alert' });
  const output = h('pre', { class: 'logs', tabindex: 0 }, 'Loading…');
  const outputPanel = h('div', { class: 'panel' }, output);
  const updated = h('span', { class: 'muted small' });
  main.append(
    h('div', { class: 'page-head' },
      h('a', { href: '#/instances' }, '← Instances'),
      h('h1', null, 'Logs'), header, h('span', { class: 'spacer' }),
      h('div', { class: 'log-controls' }, tail, h('label', null, followBox, 'Follow'), refresh, updated)),
    error,
    outputPanel);

  let busy = false;
  /** @type {ReturnType<typeof setInterval> | undefined} follows the logs while `Follow` is ticked */
  let timer;
  let stopped = false;
  const load = async () => {
    if (busy || stopped) return;
    busy = true;
    const atBottom = output.scrollTop + output.clientHeight >= output.scrollHeight - 24;
    try {
      const text = await api('GET', '/api/v1/model-instances/' + id + '/logs?tail=' + tail.value);
      if (stopped) return;
      error.textContent = '';
      outputPanel.classList.remove('hidden');
      const content = text === '' ? '(no output yet)' : String(text);
      if (output.textContent !== content) {
        output.textContent = content;
        if (atBottom || output.dataset.first !== 'no') output.scrollTop = output.scrollHeight;
      }
      output.dataset.first = 'no';
      updated.textContent = 'updated ' + new Date().toLocaleTimeString();
    } catch (e) {
      if (stopped) return;
      error.textContent = e.message;
      if (output.textContent === 'Loading…') output.textContent = '';
      // Keep the last good output visible; hide an empty box.
      outputPanel.classList.toggle('hidden', output.textContent === '');
    } finally {
      busy = false;
    }
  };
  const schedule = () => {
    clearInterval(timer);
    timer = followBox.checked ? setInterval(load, 2000) : undefined;
  };
  tail.addEventListener('change', load);
  followBox.addEventListener('change', () => {
    schedule();
    if (followBox.checked) load();
  });
  refresh.addEventListener('click', load);
  load();
  schedule();

  const drawHeader = () => {
    const instance = live.instances.items.get(id);
    if (!instance) {
      header.replaceChildren(live.instances.loaded ? h('span', { class: 'muted' }, 'instance ' + id + ' (gone)') : 'instance ' + id);
      return;
    }
    // Through h()'s rules: an instance without a worker has no " on …" (replaceChildren would write null).
    header.replaceChildren(h('strong', null, instance.name), ' ', stateBadge(instance.state, INSTANCE_STATE_CLASS),
      ...(instance.worker_name ? [h('span', { class: 'muted' }, ' on ' + instance.worker_name)] : []));
  };
  return combine(follow([live.instances], drawHeader), () => {
    stopped = true;
    clearInterval(timer);
  });
}
