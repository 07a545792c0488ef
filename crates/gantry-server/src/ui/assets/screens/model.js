// @ts-check
// One model's page (#/models/<name>): its settings (the cluster it is deployed into among
// them), its instances with their state and why they are in it, where one more instance would fit now (admins and the
// administrators of its cluster), what it served in the last 7 days, and the routes that send requests to it (admins).

import { api, itemsOf } from '../lib/api.js';
import { chartLegend, SERIES_COLOURS, stackedBars } from '../lib/charts.js';
import { clusterName, DEFAULT_CLUSTER_ID, loadClusters } from '../lib/clusters.js';
import { h } from '../lib/dom.js';
import { describeSource, fmtBytes, fmtCount, joinArgs } from '../lib/format.js';
import { combine, follow, listStatus, live, ticker } from '../lib/live.js';
import { administers, isAdmin } from '../lib/session.js';
import { INSTANCE_STATE_CLASS, instanceProgress, labelChips, stateBadge, timeCell } from '../lib/widgets.js';
import { estimateView } from './model-form.js';

/** @import { Cluster, Instance, Model, Route, UsageReport } from '../lib/api-types' */

/** How far back the page's usage goes, in days (one bar a day). */
const USAGE_DAYS = 7;
const DAY_MS = 86400000;

/**
 * @param {HTMLElement} main
 * @param {string} name the model's name, from the hash
 * @returns {() => void}
 */
export function renderModel(main, name) {
  const title = h('h1', null, name);
  const health = h('span');
  const actions = h('span', { class: 'page-actions' });
  const settingsBox = h('div', { 'data-model-settings': '' });
  const instancesBox = h('div', { 'data-model-instances': '' });
  const estimateBox = h('div', { 'data-model-estimate': '' });
  const usageBox = h('div', { 'data-model-usage': '' }, h('div', { class: 'panel empty' }, 'Loading usage…'));
  const routesBox = h('div', { 'data-model-routes': '' });
  const details = h('div', null, settingsBox, instancesBox, estimateBox, usageBox, routesBox);
  main.append(
    h('div', { class: 'page-head' }, h('a', { href: '#/models' }, '← Models'), title, health, h('span', { class: 'spacer' }), actions),
    details);

  /** @type {Model | null} the model as last drawn, to load what depends on it once */
  let shown = null;
  let stopped = false;
  /** @type {Cluster[]} the clusters the caller may see, to name the model's */
  let clusters = [];
  loadClusters().then((read) => {
    clusters = read;
    if (shown && !stopped) settingsBox.replaceChildren(settingsPanel(shown, clusters));
  });

  const draw = () => {
    const status = listStatus([live.models, live.instances]);
    if (status) {
      settingsBox.replaceChildren(status);
      return;
    }
    const model = live.models.values().find((m) => m.name === name);
    if (!model) {
      details.replaceChildren(h('div', { class: 'panel empty', 'data-model-missing': '' },
        'There is no model named “' + name + '”: it may have been deleted. See the ', h('a', { href: '#/models' }, 'Models'), ' screen.'));
      health.replaceChildren();
      actions.replaceChildren();
      shown = null;
      return;
    }
    if (!details.contains(settingsBox)) details.replaceChildren(settingsBox, instancesBox, estimateBox, usageBox, routesBox);
    const instances = live.instances.values().filter((i) => i.model_id === model.id);
    const running = instances.filter((i) => i.state === 'running').length;
    const failed = instances.some((i) => i.state === 'error' || i.state === 'unreachable');
    const healthClass = instances.length === 0 ? 'idle' : running === instances.length ? 'ok' : failed ? 'danger' : 'warn';
    health.replaceChildren(h('span', { class: 'badge ' + healthClass, title: 'running / total instances', 'data-model-health': '' },
      running + ' / ' + instances.length + ' running'));
    actions.replaceChildren(h('a', { class: 'button small', href: '#/instances?model=' + model.id }, 'In the instances list'));
    if (running) actions.append(h('a', { class: 'button small', href: '#/playground?model=' + encodeURIComponent(model.name) }, 'Chat'));
    settingsBox.replaceChildren(settingsPanel(model, clusters));
    instancesBox.replaceChildren(instancesPanel(model, instances));
    // What depends on the settings is read again only when they change.
    if (!shown || shown.updated_at !== model.updated_at) {
      if (administers(model.cluster_id)) loadEstimate(model, estimateBox);
      if (!shown) {
        loadUsage(model, usageBox);
        if (isAdmin()) loadRoutes(model, routesBox);
      }
    }
    shown = model;
  };
  // Usage arrives about once a second; every 30 s is enough on a page about settings.
  const usageTimer = setInterval(() => {
    if (shown && !stopped) loadUsage(shown, usageBox);
  }, 30000);
  return combine(follow([live.models, live.instances], draw), ticker(draw, 10000), () => {
    stopped = true;
    clearInterval(usageTimer);
  });
}

/**
 * One setting: its name, and its value or a dash.
 * @param {string} label
 * @param {import('../lib/dom-types').Child} value
 * @param {string} [key] `data-setting` for tests and styles
 */
function setting(label, value, key) {
  const empty = value == null || value === '' || (Array.isArray(value) && !value.length);
  return [
    h('dt', null, label),
    h('dd', { 'data-setting': key || null }, empty ? h('span', { class: 'muted' }, '—') : value),
  ];
}

/** @type {Map<number, string>} the names of uploads, by id: an upload keeps its name */
const uploadNames = new Map();

/**
 * A model's source; an upload by its file's name too (admins may read the uploads).
 * @param {Model} model
 * @returns {HTMLElement}
 */
function sourceView(model) {
  const source = model.source;
  const view = h('span', { class: 'mono' }, describeSource(source));
  if (source.type !== 'upload' || !isAdmin()) return view;
  const id = source.id;
  const show = () => {
    view.textContent = uploadNames.get(id) + ' (' + describeSource(source) + ')';
  };
  if (uploadNames.has(id)) {
    show();
  } else {
    api('GET', '/api/v1/model-files/uploads/' + id).then((upload) => {
      uploadNames.set(id, upload.name);
      show();
    }, () => {
      // Deleted, or unreadable: the id alone says which it was.
    });
  }
  return view;
}

/**
 * The cluster a model is deployed into: its name (a link to it for those who administer
 * it) where the
 * caller may see it; else its id, unless it is the default cluster, which a person who
 * sees no clusters need not hear of.
 * @param {Model} model
 * @param {Cluster[]} clusters
 * @returns {import('../lib/dom-types').Child}
 */
function clusterSetting(model, clusters) {
  if (!clusters.some((c) => c.id === model.cluster_id)) {
    return model.cluster_id === DEFAULT_CLUSTER_ID ? null : setting('Cluster', 'cluster ' + model.cluster_id, 'cluster');
  }
  const name = clusterName(clusters, model.cluster_id);
  return setting('Cluster', administers(model.cluster_id) ? h('a', { href: '#/clusters/' + model.cluster_id }, name) : name, 'cluster');
}

/**
 * @param {Model} model
 * @param {Cluster[]} clusters
 * @returns {HTMLElement}
 */
function settingsPanel(model, clusters) {
  return h('div', { class: 'panel' },
    h('h2', null, 'Settings'),
    model.description ? h('p', { class: 'muted' }, model.description) : null,
    h('dl', { class: 'settings' },
      clusterSetting(model, clusters),
      setting('Source', sourceView(model), 'source'),
      setting('Backend', [h('span', { class: 'chip' }, model.backend), model.backend_version ? ' version ' + model.backend_version : null], 'backend'),
      setting('Replicas', String(model.replicas), 'replicas'),
      setting('Placement', model.placement_strategy, 'placement'),
      setting('Worker selector', Object.keys(model.worker_selector || {}).length ? labelChips(model.worker_selector) : null, 'selector'),
      setting('Backend arguments', model.backend_args.length ? h('code', null, joinArgs(model.backend_args)) : null, 'args'),
      model.backend === 'llama.cpp' ? setting('CPU offload', model.cpu_offload ? 'allowed' : 'not allowed', 'cpu-offload') : null,
      model.custom_command ? setting('Command', h('code', null, model.custom_command), 'command') : null,
      Object.keys(model.labels || {}).length ? setting('Labels', labelChips(model.labels), 'labels') : null,
      setting('Created', timeCell(model.created_at)),
      setting('Changed', timeCell(model.updated_at))));
}

/**
 * The GPUs and RAM the scheduler booked for an instance.
 * @param {Instance} instance
 * @returns {string}
 */
function claimed(instance) {
  const reservation = instance.placement && instance.placement.reservation;
  if (!reservation) return '';
  const placement = reservation.placement;
  const gpus = placement.gpus.map((g) => 'GPU ' + g.index + ': ' + fmtBytes(g.bytes));
  if (placement.ram_bytes) gpus.push(fmtBytes(placement.ram_bytes) + ' RAM');
  return gpus.join(', ');
}

/**
 * @param {Model} model
 * @param {Instance[]} instances
 * @returns {HTMLElement}
 */
function instancesPanel(model, instances) {
  if (!instances.length) {
    return h('div', { class: 'panel' }, h('h2', null, 'Instances'),
      h('div', { class: 'muted' }, model.replicas
        ? 'No instances yet: the scheduler creates ' + model.replicas + ' for its replicas.'
        : 'No instances: the model has 0 replicas.'));
  }
  const rows = instances.map((i) => {
    const progress = instanceProgress(i);
    const reason = i.state_message && i.state !== 'running'
      ? (i.state === 'error' ? h('pre', { class: 'stderr', 'data-part': 'reason' }, i.state_message) : h('div', { class: 'state-message', 'data-part': 'reason' }, i.state_message))
      : null;
    return h('tr', { 'data-instance': i.id },
      h('td', null, h('strong', null, i.name)),
      h('td', { class: 'reason-cell' }, stateBadge(i.state, INSTANCE_STATE_CLASS), progress || reason),
      h('td', null, i.worker_id == null ? h('span', { class: 'muted' }, 'not placed')
        : administers(model.cluster_id) ? h('a', { href: '#/workers/' + i.worker_id }, i.worker_name) : i.worker_name),
      h('td', { class: 'small' }, claimed(i) || h('span', { class: 'muted' }, '—')),
      h('td', null, i.address ? h('span', { class: 'mono small' }, i.address) : h('span', { class: 'muted' }, '—')),
      h('td', { class: 'num' }, i.restart_count),
      h('td', null, timeCell(i.updated_at)),
      h('td', { class: 'actions' }, i.worker_id == null
        ? null
        : h('a', { class: 'button small', href: '#/instances/' + i.id + '/logs' }, 'Logs')));
  });
  return h('div', { class: 'panel flush' },
    h('h2', { class: 'panel-title' }, 'Instances'),
    h('table', null,
      h('thead', null, h('tr', null,
        h('th', null, 'Instance'), h('th', null, 'State, and why'), h('th', null, 'Worker'), h('th', null, 'Claimed'),
        h('th', null, 'Address'), h('th', { class: 'num' }, 'Restarts'), h('th', null, 'Updated'), h('th', null))),
      h('tbody', null, rows)));
}

/**
 * Asks where one more instance of the model would go now, with its settings.
 * @param {Model} model
 * @param {HTMLElement} box
 */
async function loadEstimate(model, box) {
  const again = h('button', { class: 'small', type: 'button', onclick: () => loadEstimate(model, box) }, 'Check again');
  const head = h('div', { class: 'panel-head' }, h('h2', null, 'Estimate'), h('span', { class: 'spacer' }), again);
  const note = h('p', { class: 'muted small' },
    'What one instance of ' + model.name + ' needs, and which workers could take one more now, next to what is placed already.');
  box.replaceChildren(h('div', { class: 'panel' }, head, note, h('div', { class: 'muted' }, 'Reading the model’s headers…')));
  /** @type {Record<string, unknown>} */
  const request = {
    name: model.name,
    source: model.source,
    backend: model.backend,
    backend_version: model.backend_version,
    backend_args: model.backend_args,
    replicas: 1,
    // The model's own cluster's workers, not the default cluster's.
    cluster_id: model.cluster_id,
    worker_selector: model.worker_selector,
    placement_strategy: model.placement_strategy,
    cpu_offload: model.cpu_offload,
    custom_command: model.custom_command,
  };
  let view;
  try {
    view = estimateView(await api('POST', '/api/v1/models/estimate', request));
  } catch (e) {
    view = h('div', { class: 'alert' }, 'Cannot estimate ' + model.name + ': ' + e.message);
  }
  if (box.isConnected) box.replaceChildren(h('div', { class: 'panel' }, head, note, view));
}

/**
 * What the model served in the last days: totals and one bar a day.
 * @param {Model} model
 * @param {HTMLElement} box
 */
async function loadUsage(model, box) {
  const now = Date.now();
  // Whole days (UTC, as the API's buckets): the last one holds now.
  const start = Math.floor(now / DAY_MS) * DAY_MS - (USAGE_DAYS - 1) * DAY_MS;
  /** @type {UsageReport} */
  let report;
  try {
    report = await api('GET', '/api/v1/usage?bucket=day&model=' + encodeURIComponent(model.name) +
      '&from=' + encodeURIComponent(new Date(start).toISOString()));
  } catch (e) {
    if (box.isConnected) box.replaceChildren(h('div', { class: 'panel' }, h('h2', null, 'Usage'), h('div', { class: 'alert' }, e.message)));
    return;
  }
  /** @type {Map<number, number>} */
  const prompt = new Map();
  /** @type {Map<number, number>} */
  const completion = new Map();
  for (const p of report.series || []) {
    const i = Math.round((Date.parse(p.start) - start) / DAY_MS);
    if (i < 0 || i >= USAGE_DAYS) continue;
    prompt.set(i, (prompt.get(i) || 0) + p.prompt_tokens);
    completion.set(i, (completion.get(i) || 0) + p.completion_tokens);
  }
  const t = report.total;
  const series = [
    { name: 'prompt tokens', colour: SERIES_COLOURS[0], values: prompt },
    { name: 'completion tokens', colour: SERIES_COLOURS[1], values: completion },
  ];
  const panel = h('div', { class: 'panel' },
    h('div', { class: 'panel-head' }, h('h2', null, 'Usage, last ' + USAGE_DAYS + ' days'), h('span', { class: 'spacer' }),
      h('a', { class: 'small', href: '#/usage?window=7d&by=model' }, 'All usage')),
    h('div', { class: 'facts' },
      h('div', { class: 'fact' }, h('span', null, 'Requests'), h('strong', { 'data-model-usage-total': 'requests' }, fmtCount(t.requests))),
      h('div', { class: 'fact' }, h('span', null, 'Prompt tokens'), h('strong', { 'data-model-usage-total': 'prompt_tokens' }, fmtCount(t.prompt_tokens))),
      h('div', { class: 'fact' }, h('span', null, 'Completion tokens'), h('strong', { 'data-model-usage-total': 'completion_tokens' }, fmtCount(t.completion_tokens)))),
    t.requests
      ? [stackedBars(series, start, DAY_MS, USAGE_DAYS, 'tokens'), chartLegend(series)]
      : h('p', { class: 'muted' }, 'No requests in the last ' + USAGE_DAYS + ' days.'));
  if (box.isConnected) box.replaceChildren(panel);
}

/**
 * The routes with a target that is this model (not a provider's model of that name).
 * @param {Model} model
 * @param {HTMLElement} box
 */
async function loadRoutes(model, box) {
  /** @type {Route[]} */
  let routes;
  try {
    routes = itemsOf(await api('GET', '/api/v1/model-routes'));
  } catch (e) {
    if (box.isConnected) box.replaceChildren(h('div', { class: 'panel' }, h('h2', null, 'Routes'), h('div', { class: 'alert' }, e.message)));
    return;
  }
  const using = routes.filter((r) => r.targets.some((t) => !t.provider && t.model === model.name));
  const body = using.length
    ? h('table', { class: 'compact' },
      h('thead', null, h('tr', null, h('th', null, 'Route'), h('th', null, 'This model'), h('th', null, 'Other targets'))),
      h('tbody', null, using.map((r) => {
        const mine = /** @type {Route['targets'][number]} */ (r.targets.find((t) => !t.provider && t.model === model.name));
        const others = r.targets.filter((t) => t !== mine);
        // The lowest priority present is tried first; higher ones are fallbacks.
        const firstChoice = mine.priority === Math.min(...r.targets.map((t) => t.priority));
        return h('tr', { 'data-model-route': r.name },
          h('td', null, h('a', { href: '#/routes' }, h('strong', null, r.name))),
          h('td', null, 'weight ' + mine.weight + ', ' + (firstChoice ? 'first choice' : 'fallback (priority ' + mine.priority + ')')),
          h('td', null, others.length
            ? others.map((t) => h('span', { class: 'chip' }, (t.provider ? t.provider + '/' : '') + t.model))
            : h('span', { class: 'muted' }, 'none')));
      })))
    : h('div', { class: 'muted' }, 'No route sends requests to ' + model.name + '; clients call it by its own name.');
  if (box.isConnected) box.replaceChildren(h('div', { class: 'panel' }, h('h2', null, 'Routes'), body));
}
