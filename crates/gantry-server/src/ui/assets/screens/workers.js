// @ts-check
// The workers screen (admins): every worker with its state, labels, GPUs and host, and one
// worker's page (#/workers/<id>): its last hour of CPU, RAM and GPU use as charts, and the
// backends gantry installed on it.

import { api } from '../lib/api.js';
import { hourChart, pct, SERIES_COLOURS } from '../lib/charts.js';
import { confirmDialog, openDialog } from '../lib/dialogs.js';
import { field, h, pageHead, toast } from '../lib/dom.js';
import { fmtBytes, formatLabels, parseLabels } from '../lib/format.js';
import { combine, follow, listStatus, live, ticker } from '../lib/live.js';
import { countBy, labelChips, stateBadge, timeCell, WORKER_STATE_CLASS } from '../lib/widgets.js';

/** @import { GpuDevice, SystemInfo, Worker, WorkerHistory, InstalledBackendStatus } from '../lib/api-types' */

/**
 * @param {GpuDevice[] | null | undefined} gpus
 * @returns {HTMLElement}
 */
function gpuList(gpus) {
  if (!gpus || !gpus.length) return h('span', { class: 'muted' }, 'no GPUs (CPU only)');
  return h('div', { class: 'gpus' }, gpus.map((g) => {
    const share = g.memory_total ? g.memory_used / g.memory_total : 0;
    const bar = h('div');
    bar.style.width = Math.min(100, Math.round(share * 100)) + '%';
    const meta = [fmtBytes(g.memory_used) + ' / ' + fmtBytes(g.memory_total)];
    if (g.utilization != null) meta.push(g.utilization + '% util');
    if (g.temperature != null) meta.push(g.temperature + ' °C');
    return h('div', { class: 'gpu', title: g.uuid },
      h('div', { class: 'gpu-head' },
        h('span', { class: 'idx' }, '#' + g.index),
        h('span', null, g.name),
        g.simulated ? h('span', { class: 'badge sim', title: 'Declared with --simulate-gpus: not real hardware' }, 'simulated') : null),
      h('div', { class: 'meter' + (share > 0.9 ? ' high' : '') }, bar),
      h('div', { class: 'gpu-meta' }, meta.join(' · ')));
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
 * @param {HTMLElement} main
 * @param {string[]} parts
 */
export function renderWorkers(main, parts) {
  if (parts[0]) return renderWorker(main, Number(parts[0]));
  const tableBox = h('div');
  main.append(pageHead('Workers', h('span', { class: 'muted small' },
    'Workers join with the registration token: gantry worker --server-url … --token …')), tableBox);
  const draw = () => {
    const status = listStatus([live.workers]);
    if (status) {
      tableBox.replaceChildren(status);
      return;
    }
    const workers = live.workers.values();
    if (!workers.length) {
      tableBox.replaceChildren(h('div', { class: 'panel empty' },
        'No workers yet. Start one on a GPU machine with the registration token from the server’s data directory.'));
      return;
    }
    const instancesOn = countBy(live.instances.values().filter((i) => i.worker_id != null), 'worker_id');
    const rows = workers.map((w) => h('tr', null,
      h('td', null, h('a', { href: '#/workers/' + w.id, title: 'The last hour of ' + w.name }, h('strong', null, w.name)), h('div', { class: 'muted small mono' }, w.address),
        w.status && w.status.backends && w.status.backends.length
          ? h('div', { class: 'small muted' }, 'backends: ' + w.status.backends.join(', ')) : null),
      h('td', null, stateBadge(w.state, WORKER_STATE_CLASS),
        w.state_message ? h('div', { class: 'state-message' }, w.state_message) : null),
      h('td', null, labelChips(w.labels)),
      h('td', null, gpuList(w.status && w.status.gpus)),
      h('td', null, systemCell(w.status && w.status.system)),
      h('td', { class: 'num' }, h('a', { href: '#/instances?worker=' + w.id }, instancesOn[w.id] || 0)),
      h('td', null, timeCell(w.last_heartbeat_at)),
      h('td', { class: 'actions' },
        h('button', { class: 'small', onclick: () => editLabels(w) }, 'Labels'),
        h('button', { class: 'small danger', onclick: () => deleteWorker(w) }, 'Delete'))));
    tableBox.replaceChildren(h('div', { class: 'panel flush' }, h('table', null,
      h('thead', null, h('tr', null,
        h('th', null, 'Worker'), h('th', null, 'State'), h('th', null, 'Labels'), h('th', null, 'GPUs'),
        h('th', null, 'Host'), h('th', { class: 'num' }, 'Instances'), h('th', null, 'Last heartbeat'), h('th', null))),
      h('tbody', null, rows))));
  };
  return combine(follow([live.workers, live.instances], draw), ticker(draw, 5000));
}

/**
 * One worker: its facts, the last hour of how busy it was, its installed backends.
 * @param {HTMLElement} main
 * @param {number} id
 */
function renderWorker(main, id) {
  const head = h('div');
  const facts = h('div');
  const charts = h('div', { class: 'panel' }, h('div', { class: 'empty muted' }, 'Loading the last hour…'));
  const backends = h('div');
  main.append(head, facts, charts, backends);
  const drawFacts = () => {
    const w = live.workers.items.get(id);
    head.replaceChildren(pageHead('Worker ' + (w ? w.name : id), h('a', { href: '#/workers' }, '← Workers')));
    if (!w) return;
    facts.replaceChildren(h('div', { class: 'panel' }, h('div', { class: 'facts' },
      h('div', { class: 'fact' }, h('span', null, 'State'), stateBadge(w.state, WORKER_STATE_CLASS)),
      h('div', { class: 'fact' }, h('span', null, 'Address'), h('code', null, w.address)),
      h('div', { class: 'fact' }, h('span', null, 'Last heartbeat'), timeCell(w.last_heartbeat_at)),
      h('div', { class: 'fact' }, h('span', null, 'Labels'), labelChips(w.labels)),
      h('div', { class: 'fact' }, h('span', null, 'Host'), systemCell(w.status && w.status.system))),
    h('div', null, gpuList(w.status && w.status.gpus))));
  };
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
          boxes.push(hourChart('GPU memory used', gpuLine((g) => (g.memory_total ? (g.memory_used / g.memory_total) * 100 : null)), 100, pct));
          boxes.push(hourChart('GPU utilisation', gpuLine((g) => g.utilization), 100, pct,
            'not reported (simulated GPUs have none)'));
        }
        const missing = history.servers_missing || [];
        charts.replaceChildren(h('h2', null, 'Last hour'),
          ...(missing.length ? [h('div', { class: 'alert' }, 'Missing the part heard by ' + missing.join(', ') + ' (did not answer).')] : []),
          h('div', { class: 'history-charts' }, boxes));
      }
    } catch (e) {
      charts.replaceChildren(h('div', { class: 'alert' }, e.message));
    }
    try {
      /** @type {InstalledBackendStatus[]} */
      const installed = await api('GET', '/api/v1/workers/' + id + '/backends');
      backends.replaceChildren(h('h2', null, 'Installed backends'), installed.length
        ? h('div', { class: 'panel flush' }, h('table', { 'data-installed-backends': '' },
          h('thead', null, h('tr', null, h('th', null, 'Backend'), h('th', null, 'Version'), h('th', null, 'State'), h('th', null, 'Used by'))),
          h('tbody', null, installed.map((b) => h('tr', null,
            h('td', null, b.name), h('td', null, h('code', null, b.version)),
            h('td', null, h('span', { class: 'badge ' + ({ installed: 'ok', installing: 'info', failed: 'danger' })[b.state] }, b.state),
              b.state !== 'installed' ? h('div', { class: 'state-message' }, b.message) : h('span', { class: 'muted small' }, ' ' + b.message)),
            h('td', null, b.used_by && b.used_by.length ? b.used_by.join(', ') : h('span', { class: 'muted' }, '—')))))))
        : h('div', { class: 'panel empty' }, 'Nothing installed by gantry on this worker yet.'));
    } catch (e) {
      backends.replaceChildren(h('h2', null, 'Installed backends'), h('div', { class: 'panel' }, h('div', { class: 'alert' }, e.message)));
    }
  };
  load();
  const timer = setInterval(load, 10000);
  return combine(follow([live.workers], drawFacts), () => clearInterval(timer));
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
      await api('PUT', '/api/v1/workers/' + worker.id + '/labels', { labels: parseLabels(text.value) });
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
      await api('DELETE', '/api/v1/workers/' + worker.id);
      toast('Worker ' + worker.name + ' deleted.');
    });
}
