// @ts-check
// The servers screen (admins): the cluster's scheduling mode, leader and fencing token,
// and every server with its role, heartbeat and load, re-read every few seconds.

import { api } from '../lib/api.js';
import { h, pageHead } from '../lib/dom.js';
import { timeCell } from '../lib/widgets.js';

/** @import { Child } from '../lib/dom.js' */
/** @import { ClusterStatus, ServerInfo } from '../lib/api-types' */

/** How often the servers screen re-reads the cluster: it has no watch stream. */
const CLUSTER_POLL_MS = 5000;

/**
 * The leader first, then active servers, each group by id.
 * @param {ServerInfo} a
 * @param {ServerInfo} b
 * @returns {number}
 */
function serverOrder(a, b) {
  return Number(b.role === 'leader') - Number(a.role === 'leader')
    || Number(b.active) - Number(a.active)
    || a.server_id.localeCompare(b.server_id);
}

/**
 * A labelled value of a facts panel.
 * @param {string} label
 * @param {...Child} value
 * @returns {HTMLDivElement}
 */
function fact(label, ...value) {
  return h('div', { class: 'fact' }, h('span', null, label), h('div', null, value));
}

/**
 * Scheduling mode, leader, fencing token and totals, above the table.
 * @param {ClusterStatus} cluster
 * @returns {HTMLDivElement}
 */
function clusterFacts(cluster) {
  const leader = cluster.leader;
  // A local server holds no lease: its times are the epoch (or absent), so they are left out.
  /** @param {string} iso */
  const known = (iso) => Date.parse(iso) > 0;
  const since = leader.server_id && known(leader.acquired_at) ? fact('Leader since', timeCell(leader.acquired_at)) : null;
  const lease = cluster.scheduling_mode === 'distributed' && known(leader.expires_at)
    ? fact('Lease expires', timeCell(leader.expires_at))
    : null;
  return h('div', { class: 'panel facts', 'data-cluster': '' },
    fact('Scheduling mode', h('strong', { 'data-fact': 'scheduling-mode',
      title: 'local: one server schedules alone; distributed: servers sharing a PostgreSQL database elect a leader through a lease' }, cluster.scheduling_mode)),
    fact('Leader', leader.server_id
      ? h('strong', { class: 'mono', 'data-fact': 'leader' }, leader.server_id)
      : h('span', { class: 'badge warn', 'data-fact': 'leader', title: 'The lease is free: a server takes it over within a few seconds' }, 'none')),
    fact('Fencing token', h('strong', { class: 'mono', 'data-fact': 'fencing-token',
      title: 'Grows by one each time leadership changes hands; writes with an older token are refused' }, leader.fencing_token)),
    since,
    lease,
    fact('Active servers', h('strong', null, cluster.active_servers), h('span', { class: 'muted' }, ' of ' + cluster.servers.length)),
    fact('Registered workers', h('strong', null, cluster.total_workers)),
    fact('In-flight requests', h('strong', null, cluster.total_load)));
}

/**
 * @param {HTMLElement} main
 */
export function renderServers(main) {
  const notice = h('div');
  const summaryBox = h('div');
  const tableBox = h('div', null, h('div', { class: 'panel empty' }, 'Loading…'));
  main.append(pageHead('Servers', h('span', { class: 'muted small' },
    'The leader runs the controllers; the others serve the API and the gateway and take over when it goes.')),
  notice, summaryBox, tableBox);

  /** @type {ClusterStatus | null} the last answer */
  let cluster = null;
  /** @type {Error | null} why the last read failed */
  let error = null;
  const draw = () => {
    if (!cluster) {
      tableBox.replaceChildren(error
        ? h('div', { class: 'panel' }, h('div', { class: 'alert' }, error.message))
        : h('div', { class: 'panel empty' }, 'Loading…'));
      return;
    }
    // Keep the last answer on screen when a refresh fails, and say that it is stale.
    notice.replaceChildren(...(error ? [h('div', { class: 'alert' }, 'Cannot refresh: ' + error.message)] : []));
    summaryBox.replaceChildren(clusterFacts(cluster));
    if (!cluster.servers.length) {
      tableBox.replaceChildren(h('div', { class: 'panel empty' }, 'No server has registered yet.'));
      return;
    }
    const rows = cluster.servers.slice().sort(serverOrder).map((s) => {
      const leads = s.role === 'leader';
      return h('tr', { class: leads ? 'leader' : null, 'data-server': s.server_id },
        h('td', null, h('strong', { class: 'mono' }, s.server_id),
          s.version ? h('div', { class: 'muted small' }, 'gantry ' + s.version) : null),
        h('td', null, h('span', { class: 'mono small' }, s.url)),
        h('td', null, h('span', { class: 'badge ' + (leads ? 'leader' : 'idle'), 'data-role': s.role }, s.role)),
        h('td', null, s.active
          ? h('span', { class: 'badge ok' }, 'active')
          : h('span', { class: 'badge danger', title: 'Silent for longer than the server timeout: workers are not sent here' }, 'inactive')),
        h('td', null, timeCell(s.last_heartbeat_at)),
        h('td', null, timeCell(s.started_at)),
        h('td', { class: 'num' }, s.load.inflight_requests),
        h('td', { class: 'num' }, s.load.connected_workers),
        h('td', { class: 'num', title: 'Worker share × 0.4 + request share × 0.6 among the active servers; a connecting worker prefers the lowest' },
          Number(s.load_score).toFixed(2)));
    });
    tableBox.replaceChildren(h('div', { class: 'panel flush' }, h('table', null,
      h('thead', null, h('tr', null,
        h('th', null, 'Server'), h('th', null, 'URL'), h('th', null, 'Role'), h('th', null, 'State'),
        h('th', null, 'Last heartbeat'), h('th', null, 'Started'), h('th', { class: 'num' }, 'In-flight requests'),
        h('th', { class: 'num' }, 'Connected workers'), h('th', { class: 'num' }, 'Load score'))),
      h('tbody', null, rows))));
  };

  let stopped = false;
  /** @type {ReturnType<typeof setTimeout> | undefined} the next read */
  let timer;
  const load = async () => {
    try {
      cluster = await api('GET', '/api/v1/coordinator/cluster');
      error = null;
    } catch (e) {
      error = e;
    }
    if (stopped) return;
    draw();
    timer = setTimeout(load, CLUSTER_POLL_MS);
  };
  load();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}
