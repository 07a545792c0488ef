// @ts-check
// The overview: counts of workers, GPUs (memory claimed and in use), models and instances,
// the downloads under way, and what needs attention (models with failed, lost or stuck
// instances, workers that are not ready), all following the live lists: every cluster's,
// or one cluster's where there is more than one to choose from (#/overview?cluster=<id>).

import { clusterFilter, clusterParam } from '../lib/clusters.js';
import { h, pageHead } from '../lib/dom.js';
import { firstLine, fmtBytes } from '../lib/format.js';
import { combine, follow, listStatus, liveIn, ticker } from '../lib/live.js';
import { administersSomeCluster } from '../lib/session.js';
import { gravest, needsAttention } from '../lib/trouble.js';
import { countBy, INSTANCE_STATE_CLASS, INSTANCE_STATES, instanceProgress, stateBadge, timeCell, WORKER_STATE_CLASS, WORKER_STATES } from '../lib/widgets.js';

/** @import { Instance } from '../lib/api-types' */
/** @import { LiveList } from '../lib/live.js' */

/**
 * Counts by state as badges, the known states first in `order`.
 * @param {Record<string, number>} counts
 * @param {string[]} order
 * @param {Record<string, string>} classes
 * @returns {HTMLDivElement}
 */
function breakdown(counts, order, classes) {
  const states = order.filter((s) => counts[s]).concat(Object.keys(counts).filter((s) => !order.includes(s)));
  if (!states.length) return h('div', { class: 'breakdown muted small' }, 'none yet');
  return h('div', { class: 'breakdown' }, states.map((s) =>
    h('span', { class: 'badge ' + (classes[s] || 'idle') }, counts[s] + ' ' + s.replace('_', ' '))));
}

/**
 * The GPU memory the scheduler booked for an instance placed on a worker.
 * @param {Instance} instance
 * @returns {number}
 */
function claimedBytes(instance) {
  const reservation = instance.worker_id != null && instance.placement ? instance.placement.reservation : null;
  return reservation ? reservation.placement.gpus.reduce((sum, g) => sum + g.bytes, 0) : 0;
}

/**
 * @param {HTMLElement} main
 * @param {string[]} _parts
 * @param {URLSearchParams} params
 */
export function renderOverview(main, _parts, params) {
  const clusterId = clusterParam(params);
  const live = liveIn(clusterId);
  // Links into the other lists keep the cluster chosen here.
  const inCluster = clusterId == null ? '' : 'cluster=' + clusterId;
  /** @param {string} screen */
  const to = (screen) => '#/' + screen + (inCluster ? '?' + inCluster : '');
  const body = h('div');
  main.append(pageHead('Overview', h('div', { class: 'filters' }, clusterFilter(params, '#/overview'))), body);
  // Workers are listed to admins, and to cluster administrators (their clusters').
  const workersShown = administersSomeCluster();
  /** @type {LiveList<any>[]} */
  const lists = workersShown ? [live.models, live.instances, live.workers] : [live.models, live.instances];
  const draw = () => {
    const status = listStatus(lists);
    if (status) {
      body.replaceChildren(status);
      return;
    }
    const models = live.models.values();
    const instances = live.instances.values();
    const cards = [];
    if (workersShown) {
      const workers = live.workers.values();
      const gpus = workers.flatMap((w) => (w.status && w.status.gpus) || []);
      const simulated = gpus.filter((g) => g.simulated).length;
      cards.push(h('div', { class: 'card' },
        h('h2', null, 'Workers', h('a', { href: to('workers') }, 'View')),
        h('div', { class: 'big' }, workers.length),
        breakdown(countBy(workers, 'state'), WORKER_STATES, WORKER_STATE_CLASS)));
      // Claimed: what the scheduler booked for the instances placed; used: what the
      // workers last reported in use.
      const total = gpus.reduce((sum, g) => sum + (g.memory_total || 0), 0);
      const used = gpus.reduce((sum, g) => sum + (g.memory_used || 0), 0);
      const claimed = instances.reduce((sum, i) => sum + claimedBytes(i), 0);
      /**
       * @param {number} value
       * @param {string} cls
       * @param {string} what
       */
      const meter = (value, cls, what) => {
        const bar = h('div', { class: 'meter-fill ' + cls });
        bar.style.width = (total ? Math.min(100, (value / total) * 100) : 0).toFixed(1) + '%';
        return h('div', { class: 'gpu-memory-line', 'data-gpu-memory': what },
          h('span', null, what), h('div', { class: 'meter' }, bar), h('span', { class: 'num' }, fmtBytes(value)));
      };
      cards.push(h('div', { class: 'card' },
        h('h2', null, 'GPUs', h('a', { href: to('workers') }, 'View')),
        h('div', { class: 'big' }, gpus.length),
        h('div', { class: 'breakdown' },
          h('span', { class: 'badge idle' }, fmtBytes(total) + ' memory'),
          simulated ? h('span', { class: 'badge sim' }, simulated + ' simulated') : null),
        gpus.length ? h('div', { class: 'gpu-memory' }, meter(claimed, 'claimed', 'claimed'), meter(used, 'used', 'in use')) : null));
    }
    const desired = models.reduce((sum, m) => sum + m.replicas, 0);
    cards.push(h('div', { class: 'card' },
      h('h2', null, 'Models', h('a', { href: to('models') }, 'View')),
      h('div', { class: 'big' }, models.length),
      h('div', { class: 'breakdown' }, h('span', { class: 'badge idle' }, desired + ' replicas wanted'))));
    cards.push(h('div', { class: 'card' },
      h('h2', null, 'Instances', h('a', { href: to('instances') }, 'View')),
      h('div', { class: 'big' }, instances.length),
      breakdown(countBy(instances, 'state'), INSTANCE_STATES, INSTANCE_STATE_CLASS)));

    const problems = [];
    // One row per model with instances that need a person (failed, lost, or stuck
    // pending with a reason), showing its gravest instance's reason.
    const now = Date.now();
    /** @type {Map<number, Instance[]>} */
    const troubled = new Map();
    for (const i of instances.filter((x) => needsAttention(x, now))) {
      troubled.set(i.model_id, (troubled.get(i.model_id) || []).concat(i));
    }
    for (const [modelId, stuck] of troubled) {
      const i = /** @type {Instance} */ (gravest(stuck, () => true));
      const of = instances.filter((x) => x.model_id === modelId).length;
      problems.push(h('tr', { 'data-attention-model': i.model_name },
        h('td', null, h('a', { href: '#/instances?model=' + modelId }, 'model ' + i.model_name),
          h('div', { class: 'muted small' }, stuck.length + ' of ' + of + (of === 1 ? ' instance' : ' instances'))),
        h('td', null, stateBadge(i.state, INSTANCE_STATE_CLASS)),
        h('td', null, h('div', { class: 'state-message', title: i.state_message }, firstLine(i.state_message) || '—')),
        h('td', { class: 'opt' }, timeCell(i.updated_at))));
    }
    if (workersShown) {
      for (const w of live.workers.values().filter((x) => x.state !== 'ready')) {
        problems.push(h('tr', null,
          h('td', null, h('a', { href: '#/workers' }, 'worker ' + w.name)),
          h('td', null, stateBadge(w.state, WORKER_STATE_CLASS)),
          h('td', null, h('div', { class: 'state-message' }, w.state_message || '—')),
          h('td', { class: 'opt' }, timeCell(w.last_heartbeat_at))));
      }
    }
    const downloading = instances.filter((i) => i.state === 'downloading');
    const downloads = downloading.length
      ? [h('h2', null, 'Downloading'),
        h('div', { class: 'panel flush', 'data-downloads': '' }, h('table', null,
          h('thead', null, h('tr', null, h('th', null, 'Instance'), h('th', null, 'Worker'), h('th', null, 'Progress'), h('th', null, 'Since'))),
          h('tbody', null, downloading.map((i) => h('tr', { 'data-instance': i.id },
            h('td', null, h('a', { href: '#/instances?model=' + i.model_id }, i.name)),
            h('td', null, i.worker_name || h('span', { class: 'muted' }, '—')),
            h('td', null, instanceProgress(i) || h('span', { class: 'state-message' }, i.state_message || 'starting the download')),
            h('td', null, timeCell(i.updated_at)))))))]
      : [];
    body.replaceChildren(
      h('div', { class: 'cards' }, cards),
      ...downloads,
      h('h2', null, 'Needs attention'),
      problems.length
        ? h('div', { class: 'panel flush' }, h('table', null,
          h('thead', null, h('tr', null, h('th', null, 'What'), h('th', null, 'State'), h('th', null, 'Why'), h('th', { class: 'opt' }, 'Since'))),
          h('tbody', null, problems)))
        : h('div', { class: 'panel empty' }, 'Nothing: every instance and worker is healthy or on its way.'),
    );
  };
  return combine(follow(lists, draw), ticker(draw, 10000));
}
