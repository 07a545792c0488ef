// @ts-check
// The usage screen: requests and tokens over the last day, week or month, as stacked bars
// by model, API key or (for admins) user, with the totals and a table of each group.

import { api, listAll } from '../lib/api.js';
import { chartLegend, SERIES_COLOURS, stackedBars } from '../lib/charts.js';
import { h, pageHead } from '../lib/dom.js';
import { fmtCount } from '../lib/format.js';
import { currentUser, isAdmin } from '../lib/session.js';

/** @import { UsageReport, UsageTotals } from '../lib/api-types' */

/** @typedef {NonNullable<UsageReport['series']>[number]} UsagePoint one bucket of one model, key and user */

/**
 * The windows the screen offers: how far back.
 * @type {Record<string, {label: string, hours: number}>}
 */
const USAGE_WINDOWS = {
  '24h': { label: 'Last 24 h', hours: 24 },
  '7d': { label: 'Last 7 days', hours: 24 * 7 },
  '30d': { label: 'Last 30 days', hours: 24 * 30 },
};

/**
 * The bucket of a window's bars, of those the API offers (minute, hour, day): hours up to
 * two days, so a day has 24 bars, and days beyond, so a week has 7 rather than 168 bars
 * too thin to see.
 * @param {number} hours
 * @returns {'hour' | 'day'}
 */
function usageBucket(hours) {
  return hours <= 48 ? 'hour' : 'day';
}

/** @type {Record<string, number>} */
const BUCKET_MS = { hour: 3600000, day: 86400000 };

/**
 * @param {HTMLElement} main
 * @param {string[]} parts
 * @param {URLSearchParams} params
 */
export function renderUsage(main, parts, params) {
  const askedWindow = params.get('window') || '';
  let windowKey = USAGE_WINDOWS[askedWindow] ? askedWindow : '24h';
  let groupBy = params.get('by') || 'model';
  let metric = params.get('metric') === 'requests' ? 'requests' : 'tokens';
  if (groupBy === 'user' && !isAdmin()) groupBy = 'model';
  const body = h('div', null, h('div', { class: 'panel empty' }, 'Loading usage…'));
  /**
   * A row of buttons of which one is pressed: `options` are [value, label] pairs.
   * @param {string} name
   * @param {string[][]} options
   * @param {string} current
   * @param {(value: string) => void} set
   */
  const choice = (name, options, current, set) => h('div', { class: 'segmented', role: 'group', 'aria-label': name },
    options.map(([value, label]) => h('button', {
      type: 'button',
      class: 'small' + (value === current ? ' primary' : ''),
      'aria-pressed': value === current ? 'true' : 'false',
      onclick: () => { set(value); controls(); load(); },
    }, label)));
  const controlBox = h('div', { class: 'usage-controls' });
  const controls = () => {
    /** @type {string[][]} */
    const groups = [['model', 'Model'], ['key', 'API key']];
    if (isAdmin()) groups.push(['user', 'User']);
    controlBox.replaceChildren(
      choice('Window', Object.entries(USAGE_WINDOWS).map(([k, w]) => [k, w.label]), windowKey, (v) => (windowKey = v)),
      choice('Group by', groups, groupBy, (v) => (groupBy = v)),
      choice('Show', [['tokens', 'Tokens'], ['requests', 'Requests']], metric, (v) => (metric = v)));
    history.replaceState(null, '', '#/usage?window=' + windowKey + '&by=' + groupBy + '&metric=' + metric);
  };
  main.append(pageHead('Usage', controlBox), body);
  controls();

  /** @type {{keys: Map<number, string>, users: Map<number, string>}} the names of the ids in the report */
  let names = { keys: new Map(), users: new Map() };
  const loadNames = async () => {
    const [keys, users] = await Promise.all([
      listAll('/api/v1/api-keys').catch(() => []),
      isAdmin() ? listAll('/api/v1/users').catch(() => []) : Promise.resolve([currentUser()]),
    ]);
    names = { keys: new Map(keys.map((k) => [k.id, k.name])), users: new Map(users.map((u) => [u.id, u.username])) };
  };
  /** @param {UsagePoint} point */
  const groupOf = (point) => {
    if (groupBy === 'key') {
      if (point.api_key_id == null) return 'console session' + (isAdmin() ? ' (' + (names.users.get(point.user_id) || 'user ' + point.user_id) + ')' : '');
      return names.keys.get(point.api_key_id) || 'deleted key ' + point.api_key_id;
    }
    if (groupBy === 'user') return names.users.get(point.user_id) || 'user ' + point.user_id;
    return point.model;
  };

  let loading = false;
  const load = async () => {
    if (loading) return;
    loading = true;
    try {
      const w = USAGE_WINDOWS[windowKey];
      const bucket = usageBucket(w.hours);
      const step = BUCKET_MS[bucket];
      // Whole buckets: the first starts on a bucket boundary (UTC), the last holds now.
      const now = Date.now();
      const start = Math.floor((now - w.hours * 3600000) / step) * step + step;
      const count = Math.round((Math.floor(now / step) * step - start) / step) + 1;
      const report = await api('GET', '/api/v1/usage?bucket=' + bucket + '&from=' + encodeURIComponent(new Date(start).toISOString()));
      draw(report, start, step, count);
    } catch (e) {
      body.replaceChildren(h('div', { class: 'panel' }, h('div', { class: 'alert' }, e.message)));
    } finally {
      loading = false;
    }
  };

  /**
   * @param {UsageReport} report asked for with a bucket, so it has its series
   * @param {number} start
   * @param {number} step
   * @param {number} count
   */
  const draw = (report, start, step, count) => {
    /** @param {UsageTotals} p */
    const value = (p) => (metric === 'tokens' ? p.total_tokens : p.requests);
    /** @type {Map<string, UsageTotals & {name: string, values: Map<number, number>}>} */
    const groups = new Map();
    for (const p of /** @type {UsagePoint[]} */ (report.series)) {
      const name = groupOf(p);
      const g = groups.get(name) || { name, requests: 0, prompt_tokens: 0, completion_tokens: 0, total_tokens: 0, values: new Map() };
      g.requests += p.requests;
      g.prompt_tokens += p.prompt_tokens;
      g.completion_tokens += p.completion_tokens;
      g.total_tokens += p.total_tokens;
      const i = Math.round((Date.parse(p.start) - start) / step);
      if (i >= 0 && i < count) g.values.set(i, (g.values.get(i) || 0) + value(p));
      groups.set(name, g);
    }
    const ranked = [...groups.values()].sort((a, b) => value(b) - value(a) || a.name.localeCompare(b.name));
    // The biggest series by name, the rest as one "other".
    const shown = ranked.slice(0, SERIES_COLOURS.length - 1).map((g, i) => ({ name: g.name, colour: SERIES_COLOURS[i], values: g.values }));
    const rest = ranked.slice(SERIES_COLOURS.length - 1);
    if (rest.length) {
      /** @type {Map<number, number>} */
      const values = new Map();
      for (const g of rest) for (const [i, v] of g.values) values.set(i, (values.get(i) || 0) + v);
      shown.push({ name: rest.length + ' others', colour: SERIES_COLOURS[SERIES_COLOURS.length - 1], values });
    }
    const t = report.total;
    const cards = h('div', { class: 'cards' },
      h('div', { class: 'card' }, h('h2', null, 'Requests'), h('div', { class: 'big', 'data-total': 'requests' }, fmtCount(t.requests))),
      h('div', { class: 'card' }, h('h2', null, 'Prompt tokens'), h('div', { class: 'big', 'data-total': 'prompt_tokens' }, fmtCount(t.prompt_tokens))),
      h('div', { class: 'card' }, h('h2', null, 'Completion tokens'), h('div', { class: 'big', 'data-total': 'completion_tokens' }, fmtCount(t.completion_tokens))));
    const unit = metric === 'tokens' ? 'tokens' : 'requests';
    const legend = chartLegend(shown);
    const chartPanel = h('div', { class: 'panel' },
      h('h2', null, (metric === 'tokens' ? 'Tokens' : 'Requests') + ' per ' + (step >= 86400000 ? 'day' : 'hour') + ', by ' + /** @type {Record<string, string>} */ ({ model: 'model', key: 'API key', user: 'user' })[groupBy]),
      ranked.length ? [stackedBars(shown, start, step, count, unit), legend]
        : h('div', { class: 'empty muted' }, 'Nothing served in this window yet.'));
    const rows = ranked.map((g) => h('tr', null,
      h('td', null, g.name),
      h('td', { class: 'num' }, fmtCount(g.requests)),
      h('td', { class: 'num' }, fmtCount(g.prompt_tokens)),
      h('td', { class: 'num' }, fmtCount(g.completion_tokens)),
      h('td', { class: 'num' }, fmtCount(g.total_tokens))));
    const table = ranked.length ? h('div', { class: 'panel flush' }, h('table', { 'data-usage-table': '' },
      h('thead', null, h('tr', null,
        h('th', null, /** @type {Record<string, string>} */ ({ model: 'Model', key: 'API key', user: 'User' })[groupBy]),
        h('th', { class: 'num' }, 'Requests'), h('th', { class: 'num' }, 'Prompt tokens'),
        h('th', { class: 'num' }, 'Completion tokens'), h('th', { class: 'num' }, 'Total tokens'))),
      h('tbody', null, rows))) : null;
    // Without a table when nothing was served (replaceChildren would write null).
    body.replaceChildren(cards, chartPanel, ...(table ? [table] : []),
      h('p', { class: 'muted small' }, 'Times are in your browser\'s time zone; buckets start on the hour or at midnight UTC. Usage older than the server\'s usage_retention is kept per day.'));
  };

  loadNames().finally(load);
  // Usage arrives about once a second; every 10 s is enough to watch it move.
  const timer = setInterval(load, 10000);
  return () => clearInterval(timer);
}
