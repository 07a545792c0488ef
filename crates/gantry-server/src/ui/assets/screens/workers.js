// @ts-check
// The workers screen (admins, and the administrators of given clusters, who see those
// clusters' workers and change their labels, but delete none and see no join command):
// every worker with its state, labels, GPUs (memory claimed by
// the instances placed there beside what the worker reports in use), the backends it runs
// and how, and the command that joins another machine to the default cluster (other
// clusters' are on the clusters screen); filtered by cluster (#/workers?cluster=<id>)
// where there is more than one. One worker's page (#/workers/<id>):
// its facts, the instances placed on it, its last hour of CPU, RAM and GPU use as charts,
// its backends, and (admins) the versions gantry installed there.

import { api } from '../lib/api.js';
import { hourChart, pct, SERIES_COLOURS } from '../lib/charts.js';
import { clusterFilter, clusterName, clusterParam, loadClusters } from '../lib/clusters.js';
import { confirmDialog, openDialog } from '../lib/dialogs.js';
import { field, h, pageHead, toast } from '../lib/dom.js';
import { firstLine, fmtBytes, formatLabels, parseLabels } from '../lib/format.js';
import { combine, follow, listStatus, live, liveIn, ticker } from '../lib/live.js';
import { sentence } from '../lib/sentence.js';
import { administers, isAdmin } from '../lib/session.js';
import { copyButton, countBy, INSTANCE_STATE_CLASS, labelChips, stateBadge, timeCell, WORKER_STATE_CLASS } from '../lib/widgets.js';

/** @import { Cluster, GpuDevice, Instance, SystemInfo, Worker, WorkerHistory, WorkerJoin, WorkerStatus, InstalledBackendStatus } from '../lib/api-types' */

/**
 * How a worker runs one backend: `found` (its program is configured or on PATH),
 * `installed` (gantry installed versions of it there), `installable` (installed on first
 * use), or `custom` (the command comes with each model).
 * @typedef {{name: string, how: 'found' | 'installed' | 'installable' | 'custom', detail: string}} BackendWay
 */

/**
 * The GPU memory the scheduler booked on each GPU of a worker, by GPU index, for the
 * instances placed there.
 * @param {number} workerId
 * @returns {Map<number, number>}
 */
function claimsOn(workerId) {
  /** @type {Map<number, number>} */
  const claims = new Map();
  for (const i of live.instances.values()) {
    const reservation = i.worker_id === workerId && i.placement ? i.placement.reservation : null;
    for (const g of reservation ? reservation.placement.gpus : []) claims.set(g.index, (claims.get(g.index) || 0) + g.bytes);
  }
  return claims;
}

/**
 * One line of a GPU's memory: a label, a bar of the GPU's total, the bytes.
 * @param {string} what `claimed` or `in use`
 * @param {number} value
 * @param {number} total
 * @param {string} cls the bar's colour class
 * @returns {HTMLDivElement}
 */
function memoryLine(what, value, total, cls) {
  const bar = h('div', { class: cls });
  bar.style.width = (total ? Math.min(100, (value / total) * 100) : 0).toFixed(1) + '%';
  return h('div', { class: 'gpu-memory-line', 'data-gpu-memory': what },
    h('span', null, what), h('div', { class: 'meter' + (total && value / total > 0.9 ? ' high' : '') }, bar),
    h('span', { class: 'num' }, fmtBytes(value)));
}

/**
 * A worker's GPUs, each with its memory claimed by placed instances beside what the
 * worker reports in use (simulated GPUs report none in use).
 * @param {GpuDevice[] | null | undefined} gpus
 * @param {Map<number, number>} claims bytes claimed by GPU index
 * @returns {HTMLElement}
 */
function gpuList(gpus, claims) {
  if (!gpus || !gpus.length) return h('span', { class: 'muted' }, 'no GPUs (CPU only)');
  return h('div', { class: 'gpus' }, gpus.map((g) => {
    const meta = [];
    if (g.utilization != null) meta.push(g.utilization + '% util');
    if (g.temperature != null) meta.push(g.temperature + ' °C');
    return h('div', { class: 'gpu', title: g.uuid, 'data-gpu': g.index },
      h('div', { class: 'gpu-head' },
        h('span', { class: 'idx' }, '#' + g.index),
        h('span', null, g.name),
        h('span', { class: 'muted' }, fmtBytes(g.memory_total)),
        g.simulated ? h('span', { class: 'badge sim', title: 'Declared with --simulate-gpus: not real hardware' }, 'simulated') : null),
      h('div', { class: 'gpu-claims' },
        memoryLine('claimed', claims.get(g.index) || 0, g.memory_total, 'claimed'),
        memoryLine('in use', g.memory_used, g.memory_total, 'used')),
      meta.length ? h('div', { class: 'gpu-meta' }, meta.join(' · ')) : null);
  }));
}

/**
 * @param {SystemInfo | null | undefined} system
 * @returns {HTMLElement}
 */
function systemCell(system) {
  if (!system || !system.cpu_count) return h('span', { class: 'muted' }, '—');
  const used = system.memory_total - system.memory_available;
  return h('div', { class: 'small host' },
    h('div', null, system.cpu_count + ' CPUs · load ' + Number(system.load_average).toFixed(2)),
    h('div', null, fmtBytes(used) + ' / ' + fmtBytes(system.memory_total) + ' RAM'),
    h('div', { class: 'muted' }, fmtBytes(system.disk_free) + ' disk free'));
}

/**
 * How a worker runs each backend it reports, from its status: one truth for the list and
 * the worker's page.
 * @param {WorkerStatus | null | undefined} status
 * @returns {BackendWay[]}
 */
function backendWays(status) {
  if (!status) return [];
  const found = status.found_backends;
  const installed = status.installed_backends || [];
  const names = new Set([...(status.backends || []), ...(found || []).map((f) => f.name), ...installed.map((i) => i.name)]);
  return [...names].sort((a, b) => Number(a === 'custom') - Number(b === 'custom') || a.localeCompare(b)).map((name) => {
    const program = found ? found.find((f) => f.name === name) : undefined;
    const versions = installed.filter((i) => i.name === name).map((i) => i.version + ' (' + i.variant + ')');
    if (name === 'custom') return { name, how: 'custom', detail: 'runs the command each model gives' };
    if (program) {
      return {
        name,
        how: 'found',
        detail: (program.program || 'its program') + (versions.length ? '; gantry also installed ' + versions.join(', ') : ''),
      };
    }
    if (versions.length) return { name, how: 'installed', detail: 'gantry installed ' + versions.join(', ') };
    return {
      name,
      how: 'installable',
      detail: found ? 'not on this machine: gantry installs it when an instance first needs it' : 'this worker does not say whether it found the program or installs it on first use',
    };
  });
}

/** What each way of running a backend is called on screen. */
const HOW_LABEL = { found: 'found', installed: 'installed by gantry', installable: 'installed on first use', custom: 'custom command' };

/**
 * A worker's backends as chips, each saying how the worker runs it (its title the detail).
 * @param {BackendWay[]} ways
 * @returns {HTMLDivElement | null}
 */
function backendChips(ways) {
  if (!ways.length) return null;
  return h('div', { class: 'backend-truth small', 'data-backends': '' },
    ways.map((w) => h('span', { class: 'chip ' + w.how, 'data-backend': w.name, title: w.detail },
      w.name + (w.how === 'custom' ? '' : ' · ' + (w.how === 'installable' ? 'on first use' : HOW_LABEL[w.how])))));
}

/**
 * How a machine joins the default cluster, folded under "Add a worker": the `gantry
 * worker` command with the registration token (admins only see this screen) and a copy
 * button, and where the other clusters' commands are.
 * @returns {HTMLDetailsElement}
 */
function joinPanel() {
  const body = h('div', null, h('div', { class: 'muted' }, 'Loading…'));
  const panel = h('details', { class: 'panel join-worker', 'data-join': '' }, h('summary', null, 'Add a worker'), body);
  let loaded = false;
  const load = async () => {
    if (loaded) return;
    loaded = true;
    try {
      /** @type {WorkerJoin} */
      const join = await api('GET', '/api/v1/workers/join');
      if (join.command) {
        const command = h('pre', { class: 'code', 'data-join-command': '' }, join.command);
        body.replaceChildren(
          h('p', { class: 'section-note' }, 'On the new machine, with the same gantry binary, run:'),
          h('div', { class: 'join-command' }, command, copyButton(() => join.command || '', command)),
          h('p', { class: 'muted small' },
            'The token lets any machine join this cluster: keep it secret. Add --label key=value for models’ worker selectors; ',
            'the worker must reach the server at this address, and the server the worker’s port 10150 (see docs/workers.md).'),
          otherClusters());
      } else {
        body.replaceChildren(
          h('p', { class: 'section-note' }, 'On the new machine, with the same gantry binary, run:'),
          h('pre', { class: 'code', 'data-join-command': '' }, 'gantry worker --server-url ' + join.server_urls.join(',') + ' --token <registration token>'),
          h('div', { class: 'alert warn' },
            'This server does not hold the registration token: it is in the file registration_token in the data directory of the server that created it.'),
          otherClusters());
      }
    } catch (e) {
      loaded = false;
      body.replaceChildren(h('div', { class: 'alert' }, 'Cannot read how a worker joins: ' + e.message));
    }
  };
  panel.addEventListener('toggle', () => {
    if (panel.open) load();
  });
  return panel;
}

/**
 * Where the join box sends a machine meant for another cluster than the default one.
 * @returns {HTMLParagraphElement}
 */
function otherClusters() {
  return h('p', { class: 'small', 'data-join-other-clusters': '' },
    'This command joins the default cluster. Each other cluster has its own join command (and, for Kubernetes, manifests) on the ',
    h('a', { href: '#/clusters' }, 'Clusters'), ' screen.');
}

/**
 * @param {HTMLElement} main
 * @param {string[]} parts
 * @param {URLSearchParams} params
 */
export function renderWorkers(main, parts, params) {
  if (parts[0]) return renderWorker(main, Number(parts[0]));
  const clusterId = clusterParam(params);
  const lists = liveIn(clusterId);
  /** @type {Cluster[]} */
  let clusters = [];
  const tableBox = h('div');
  // The join command holds a registration token: admins only.
  const join = isAdmin() ? joinPanel() : null;
  main.append(pageHead('Workers', h('div', { class: 'filters' }, clusterFilter(params, '#/workers', (read) => {
    clusters = read;
    draw();
  }))), ...(join ? [join] : []), tableBox);
  let first = true;
  const draw = () => {
    const status = listStatus([lists.workers]);
    if (status) {
      tableBox.replaceChildren(status);
      return;
    }
    const workers = lists.workers.values();
    // Nothing to list yet: how to add one is what the page is for.
    if (first && join) join.open = !workers.length && clusterId == null;
    first = false;
    if (!workers.length) {
      const where = clusterId == null ? '' : ' in ' + clusterName(clusters, clusterId);
      tableBox.replaceChildren(h('div', { class: 'panel empty' }, !join
        ? 'No workers' + (where || ' in your clusters') + ' yet: an admin has the command that joins a machine.'
        : clusterId == null
          ? 'No workers yet. Start one on a GPU machine with the command under “Add a worker”.'
          : ['No workers' + where + ' yet: run ',
            h('a', { href: '#/clusters/' + clusterId }, 'its join command'), ' on a GPU machine.']));
      return;
    }
    // Which cluster each worker is in, where there are several and the list shows them all.
    const showCluster = clusters.length > 1 && clusterId == null;
    const instancesOn = countBy(live.instances.values().filter((i) => i.worker_id != null), 'worker_id');
    const rows = workers.map((w) => h('tr', { 'data-worker': w.name },
      h('td', null, h('a', { href: '#/workers/' + w.id, title: 'Instances, backends and the last hour of ' + w.name }, h('strong', null, w.name)),
        h('div', { class: 'muted small mono' }, w.address),
        showCluster ? h('div', { class: 'small', 'data-worker-cluster': '' }, 'cluster ',
          h('a', { href: '#/workers?cluster=' + w.cluster_id }, clusterName(clusters, w.cluster_id))) : null,
        backendChips(backendWays(w.status))),
      h('td', null, stateBadge(w.state, WORKER_STATE_CLASS),
        w.state_message ? h('div', { class: 'state-message' }, w.state_message) : null),
      h('td', { class: 'opt' }, labelChips(w.labels)),
      h('td', { class: 'opt' }, gpuList(w.status && w.status.gpus, claimsOn(w.id))),
      h('td', { class: 'opt' }, systemCell(w.status && w.status.system)),
      h('td', { class: 'num opt' }, h('a', { href: '#/instances?worker=' + w.id }, instancesOn[w.id] || 0)),
      h('td', { class: 'opt' }, timeCell(w.last_heartbeat_at)),
      h('td', { class: 'actions' },
        administers(w.cluster_id) ? h('button', { class: 'small', onclick: () => editLabels(w) }, 'Labels') : null,
        isAdmin() ? h('button', { class: 'small danger', onclick: () => deleteWorker(w) }, 'Delete') : null)));
    tableBox.replaceChildren(h('div', { class: 'panel flush' }, h('table', { 'data-workers': '' },
      h('thead', null, h('tr', null,
        h('th', null, 'Worker'), h('th', null, 'State'), h('th', { class: 'opt' }, 'Labels'), h('th', { class: 'opt' }, 'GPUs'),
        h('th', { class: 'opt' }, 'Host'), h('th', { class: 'num opt' }, 'Instances'), h('th', { class: 'opt' }, 'Last heartbeat'), h('th', null))),
      h('tbody', null, rows))));
  };
  return combine(follow([lists.workers, live.instances], draw), ticker(draw, 5000));
}

/**
 * The instances placed on a worker: name, model, state (and why), GPUs with what each
 * claims there.
 * @param {Instance[]} instances
 * @returns {HTMLElement}
 */
function instancesTable(instances) {
  if (!instances.length) return h('div', { class: 'panel empty' }, 'No instances are placed on this worker.');
  return h('div', { class: 'panel flush' }, h('table', { 'data-worker-instances': '' },
    h('thead', null, h('tr', null, h('th', null, 'Instance'), h('th', null, 'Model'), h('th', null, 'State'),
      h('th', { class: 'opt' }, 'GPUs'), h('th', { class: 'opt' }, 'Since'))),
    h('tbody', null, instances.map((i) => {
      const reservation = i.placement ? i.placement.reservation : null;
      const gpus = reservation && reservation.placement.gpus.length
        ? reservation.placement.gpus.map((g) => '#' + g.index + ' ' + fmtBytes(g.bytes)).join(', ')
        : i.gpu_indexes.length ? i.gpu_indexes.map((n) => '#' + n).join(', ') : 'CPU';
      return h('tr', { 'data-instance': i.name },
        h('td', null, h('a', { href: '#/instances/' + i.id + '/logs', title: 'Logs of ' + i.name }, h('strong', null, i.name))),
        h('td', null, h('a', { href: '#/models/' + encodeURIComponent(i.model_name) }, i.model_name)),
        h('td', null, stateBadge(i.state, INSTANCE_STATE_CLASS),
          i.state !== 'running' && i.state_message ? h('div', { class: 'state-message' }, firstLine(i.state_message)) : null),
        h('td', { class: 'opt small', 'data-part': 'gpus' }, gpus),
        h('td', { class: 'opt' }, timeCell(i.updated_at)));
    }))));
}

/**
 * A worker's backends as a table: each with how the worker runs it.
 * @param {BackendWay[]} ways
 * @returns {HTMLElement}
 */
function backendsTable(ways) {
  if (!ways.length) return h('div', { class: 'panel empty' }, 'This worker reported no backends.');
  return h('div', { class: 'panel flush' }, h('table', { 'data-backend-ways': '' },
    h('thead', null, h('tr', null, h('th', null, 'Backend'), h('th', null, 'On this worker'), h('th', null, 'Where'))),
    h('tbody', null, ways.map((w) => h('tr', { 'data-backend': w.name },
      h('td', null, h('strong', null, w.name)),
      h('td', null, h('span', { class: 'badge ' + ({ found: 'ok', installed: 'info', installable: 'idle', custom: 'idle' })[w.how] }, HOW_LABEL[w.how])),
      h('td', { class: 'backend-where small' + (w.how === 'found' ? ' mono' : ' muted') }, w.detail))))));
}

/**
 * One worker: its facts and GPUs, the instances on it, the last hour of how busy it was,
 * its backends and the versions gantry installed there.
 * @param {HTMLElement} main
 * @param {number} id
 */
function renderWorker(main, id) {
  const head = h('div');
  const facts = h('div');
  const placed = h('div');
  const charts = h('div', { class: 'panel' }, h('div', { class: 'empty muted' }, 'Loading the last hour…'));
  const ways = h('div');
  const backends = h('div');
  main.append(head, facts, h('h2', null, 'Instances on this worker'), placed, charts, h('h2', null, 'Backends'), ways, backends);
  /** @type {Cluster[]} */
  let clusters = [];
  const drawFacts = () => {
    const w = live.workers.items.get(id);
    head.replaceChildren(pageHead('Worker ' + (w ? w.name : id), h('a', { href: '#/workers' }, '← Workers')));
    const status = listStatus([live.workers, live.instances]);
    if (status) {
      facts.replaceChildren(status);
      return;
    }
    if (!w) {
      facts.replaceChildren(h('div', { class: 'panel empty' }, 'There is no worker ' + id + ': it may have been deleted.'));
      return;
    }
    facts.replaceChildren(h('div', { class: 'panel' }, h('div', { class: 'facts' },
      h('div', { class: 'fact' }, h('span', null, 'State'), stateBadge(w.state, WORKER_STATE_CLASS)),
      h('div', { class: 'fact', 'data-fact': 'cluster' }, h('span', null, 'Cluster'),
        h('a', { href: '#/clusters/' + w.cluster_id }, clusterName(clusters, w.cluster_id))),
      h('div', { class: 'fact' }, h('span', null, 'Address'), h('code', null, w.address)),
      h('div', { class: 'fact' }, h('span', null, 'Last heartbeat'), timeCell(w.last_heartbeat_at)),
      h('div', { class: 'fact' }, h('span', null, 'Labels'), labelChips(w.labels)),
      h('div', { class: 'fact' }, h('span', null, 'Host'), systemCell(w.status && w.status.system))),
    h('h3', { class: 'form-subhead' }, 'GPUs: memory claimed by the instances here, and in use as the worker reports it'),
    h('div', { 'data-worker-gpus': '' }, gpuList(w.status && w.status.gpus, claimsOn(id)))));
    placed.replaceChildren(instancesTable(live.instances.values().filter((i) => i.worker_id === id)));
    ways.replaceChildren(backendsTable(backendWays(w.status)));
  };
  loadClusters().then((read) => {
    clusters = read;
    drawFacts();
  });
  const load = async () => {
    try {
      /** @type {WorkerHistory} */
      const history = await api('GET', '/api/v1/workers/' + id + '/history');
      const samples = history.samples.map((s) => Object.assign({ ms: Date.parse(s.at) }, s));
      const boxes = [];
      if (!samples.length) {
        charts.replaceChildren(h('div', { class: 'empty muted' }, 'No samples yet: the worker sends one with its heartbeats (one kept per 10 s).'));
      } else {
        boxes.push(hourChart('CPU busy', [{ name: 'CPU', colour: SERIES_COLOURS[0], points: samples.filter((s) => s.cpu_percent != null).map((s) => /** @type {[number, number]} */ ([s.ms, s.cpu_percent])) }], 100, pct,
          'measured from the second sample on'));
        const ramTotal = samples[samples.length - 1].memory_total;
        boxes.push(hourChart('RAM used of ' + fmtBytes(ramTotal), [{ name: 'RAM', colour: SERIES_COLOURS[1], points: samples.map((s) => /** @type {[number, number]} */ ([s.ms, s.memory_used])) }], ramTotal, fmtBytes));
        const indexes = [...new Set(samples.flatMap((s) => s.gpus.map((g) => g.index)))].sort((a, b) => a - b);
        /** @param {(gpu: WorkerHistory['samples'][number]['gpus'][number]) => number | null | undefined} value */
        const gpuLine = (value) => indexes.map((index, i) => ({
          name: 'GPU ' + index,
          colour: SERIES_COLOURS[i % (SERIES_COLOURS.length - 1)],
          // The samples that have a value: [ms, value] pairs.
          points: /** @type {[number, number][]} */ (samples.flatMap((s) => s.gpus.filter((g) => g.index === index).map((g) => [s.ms, value(g)]).filter((p) => p[1] != null))),
        }));
        if (indexes.length) {
          const memory = hourChart('GPU memory used', gpuLine((g) => (g.memory_total ? (g.memory_used / g.memory_total) * 100 : null)), 100, pct);
          const w = live.workers.items.get(id);
          const gpus = (w && w.status && w.status.gpus) || [];
          // What the worker measures; simulated GPUs measure nothing, so say where the
          // claims are rather than let a flat line look like an idle GPU.
          if (gpus.length && gpus.every((g) => g.simulated)) {
            memory.append(h('p', { class: 'muted small chart-note', 'data-chart-note': '' },
              'As the worker measures it: simulated GPUs report none in use. What the instances here claim is under GPUs above.'));
          }
          boxes.push(memory);
          boxes.push(hourChart('GPU utilisation', gpuLine((g) => g.utilization), 100, pct,
            'not reported (simulated GPUs have none)'));
        }
        const missing = history.servers_missing || [];
        charts.replaceChildren(h('h2', null, 'Last hour'),
          ...(missing.length ? [h('div', { class: 'alert' }, 'Missing the part heard by ' + missing.join(', ') + ' (did not answer).')] : []),
          h('div', { class: 'history-charts' }, boxes));
      }
    } catch (e) {
      charts.replaceChildren(h('div', { class: 'alert' }, sentence(e)));
    }
    // What gantry installed is read from the worker itself, for admins only.
    if (!isAdmin()) return;
    try {
      /** @type {InstalledBackendStatus[]} */
      const installed = await api('GET', '/api/v1/workers/' + id + '/backends');
      backends.replaceChildren(h('h3', { class: 'form-subhead' }, 'Installed backends'), installed.length
        ? h('div', { class: 'panel flush' }, h('table', { 'data-installed-backends': '' },
          h('thead', null, h('tr', null, h('th', null, 'Backend'), h('th', null, 'Version'), h('th', null, 'State'), h('th', null, 'Used by'))),
          h('tbody', null, installed.map((b) => h('tr', null,
            h('td', null, b.name), h('td', null, h('code', null, b.version)),
            h('td', null, h('span', { class: 'badge ' + ({ installed: 'ok', installing: 'info', failed: 'danger' })[b.state] }, b.state),
              b.state !== 'installed' ? h('div', { class: 'state-message' }, b.message) : h('span', { class: 'muted small' }, ' ' + b.message)),
            h('td', null, b.used_by && b.used_by.length ? b.used_by.join(', ') : h('span', { class: 'muted' }, '—')))))))
        : h('div', { class: 'panel empty', 'data-installed-backends': '' },
          'gantry has installed no backend versions here yet: the backends above run from the programs this worker found, and the others are installed when an instance first needs them.'));
    } catch (e) {
      backends.replaceChildren(h('h3', { class: 'form-subhead' }, 'Installed backends'), h('div', { class: 'panel' }, h('div', { class: 'alert' }, e.message)));
    }
  };
  load();
  const timer = setInterval(load, 10000);
  return combine(follow([live.workers, live.instances], drawFacts), ticker(drawFacts, 5000), () => clearInterval(timer));
}

/**
 * @param {Worker} worker
 */
function editLabels(worker) {
  const text = h('textarea', { rows: 5, placeholder: 'gpu=a100\nzone=eu-1' }, formatLabels(worker.labels, '\n'));
  openDialog('Labels of ' + worker.name, [
    field('Labels', text, 'One key=value per line. Model worker selectors match these. Replaces every label.'),
  ], {
    submitLabel: 'Save labels',
    onSubmit: async () => {
      try {
        await api('PUT', '/api/v1/workers/' + worker.id + '/labels', { labels: parseLabels(text.value) });
      } catch (e) {
        throw new Error(sentence(e));
      }
      toast('Labels of ' + worker.name + ' saved.');
    },
  });
}

/**
 * @param {Worker} worker
 */
function deleteWorker(worker) {
  confirmDialog('Delete worker ' + worker.name + '?',
    'Its instances go back to pending to be placed elsewhere. A worker that is still running will fail to authenticate and must be registered again.',
    'Delete worker',
    async () => {
      try {
        await api('DELETE', '/api/v1/workers/' + worker.id);
      } catch (e) {
        throw new Error(sentence(e));
      }
      toast('Deleted worker “' + worker.name + '”.');
    });
}
