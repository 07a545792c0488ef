// @ts-check
// Small pieces of page that several screens show: states as badges, times as "12 s ago",
// progress bars of downloads and uploads, labels as chips, a copy button, and gantry's
// mark.

import { h } from './dom.js';
import { fmtAgo, fmtBytes, fmtDuration } from './format.js';

/** @import { Instance } from './api-types' */

/**
 * How progressBar() draws: `speed` in bytes per second (undefined: none measured),
 * `paused` for an interrupted transfer, `compact` without speed and time left, and the
 * bar's `label` and `title`.
 * @typedef {object} ProgressOptions
 * @property {number} [speed]
 * @property {boolean} [paused]
 * @property {boolean} [compact]
 * @property {string} [label]
 * @property {string | null} [title]
 */

/**
 * The name and mark of gantry, a link to the overview.
 * @returns {HTMLAnchorElement}
 */
export function brand() {
  const icon = /** @type {HTMLLinkElement | null} */ (document.querySelector('link[rel="icon"]'));
  return h('a', { class: 'brand', href: '#/overview' }, h('img', { src: icon ? icon.href : '/ui/favicon.svg', alt: '' }), 'gantry');
}

/**
 * A time as "12 s ago", with the exact time in its title.
 * @param {string | null | undefined} iso
 * @returns {HTMLSpanElement}
 */
export function timeCell(iso) {
  return h('span', { class: 'nowrap', title: iso ? new Date(iso).toLocaleString() : '' }, fmtAgo(iso));
}

/**
 * The badge class of each instance state; an unknown one is `idle`.
 * @type {Record<string, string>}
 */
export const INSTANCE_STATE_CLASS = {
  running: 'ok',
  starting: 'info',
  downloading: 'info',
  scheduled: 'info',
  analyzing: 'info',
  pending: 'warn',
  error: 'danger',
  unreachable: 'danger',
};

/** The instance states in the order the overview and filters list them. */
export const INSTANCE_STATES = ['running', 'starting', 'downloading', 'scheduled', 'analyzing', 'pending', 'error', 'unreachable'];

/**
 * The badge class of each worker state.
 * @type {Record<string, string>}
 */
export const WORKER_STATE_CLASS = { ready: 'ok', not_ready: 'warn', unreachable: 'danger', maintenance: 'idle' };

/** The worker states in the order the overview lists them. */
export const WORKER_STATES = ['ready', 'not_ready', 'unreachable', 'maintenance'];

/**
 * A state as a coloured badge.
 * @param {string} state
 * @param {Record<string, string>} classes the badge class of each state
 * @returns {HTMLSpanElement}
 */
export function stateBadge(state, classes) {
  return h('span', { class: 'badge ' + (classes[state] || 'idle') }, String(state).replace('_', ' '));
}

/**
 * A progress bar with its numbers under it: percent, bytes done of the total, and, when
 * a speed is given, the speed and the time left at that speed. Shared by downloading
 * instances and by the files of the workers' caches.
 *
 * `total` null (or 0): the size is not known yet, so the bar only shows that something
 * moves and no percent or time left is promised. `options.speed` undefined: no speed is
 * measured (a cached file), so neither it nor the time left is shown. `options.paused`
 * draws an interrupted download; `options.compact` leaves out the speed and time left.
 * @param {number} done
 * @param {number | null | undefined} total
 * @param {ProgressOptions} [options]
 * @returns {HTMLDivElement}
 */
export function progressBar(done, total, options) {
  const opts = options || {};
  const known = total != null && total > 0;
  // The total, read only where `known` says there is one.
  const size = Number(total);
  // Floored, so a file is at 100 % only when it is complete.
  const percent = known ? Math.min(100, Math.floor((done / size) * 100)) : null;
  const fill = h('div', { class: 'progress-fill' });
  if (known) fill.style.width = Math.min(100, (done / size) * 100).toFixed(2) + '%';
  const bytes = fmtBytes(done) + ' / ' + (known ? fmtBytes(size) : '?');
  const parts = [
    h('span', { class: 'progress-percent' + (known ? '' : ' unknown'), 'data-part': 'percent' }, known ? percent + '%' : '—'),
    h('span', { 'data-part': 'bytes', title: known ? null : 'The total size is not known yet' }, bytes),
  ];
  if (opts.speed !== undefined && !opts.compact) {
    const speed = Number(opts.speed) || 0;
    parts.push(h('span', { 'data-part': 'speed' }, fmtBytes(speed) + '/s'));
    parts.push(h('span', {
      'data-part': 'eta',
      title: known && speed > 0 ? 'At the current speed' : 'Unknown: ' + (known ? 'nothing arrived lately' : 'the total size is not known'),
    }, known && speed > 0 ? fmtDuration((size - done) / speed) + ' left' : '— left'));
  }
  return h('div', {
    class: 'progress' + (opts.paused ? ' paused' : '') + (opts.compact ? ' compact' : ''),
    'data-progress': '',
    title: opts.title || null,
  },
  h('div', {
    class: 'progress-bar' + (known ? '' : ' indeterminate'),
    role: 'progressbar',
    'aria-label': opts.label || 'Download progress',
    'aria-valuemin': 0,
    'aria-valuemax': 100,
    'aria-valuenow': known ? percent : null,
    'aria-valuetext': (known ? percent + '%, ' : '') + bytes,
  }, fill),
  h('div', { class: 'progress-meta' }, parts));
}

/**
 * A downloading instance's progress, from its `download` (null when it has none).
 * @param {Instance} instance
 * @returns {HTMLDivElement | null}
 */
export function instanceProgress(instance) {
  const d = instance.download;
  if (instance.state !== 'downloading' || !d) return null;
  return progressBar(d.bytes_done, d.bytes_total, {
    speed: d.bytes_per_second,
    label: 'Download of ' + instance.name,
    title: instance.state_message || null,
  });
}

/**
 * Labels as chips ("k=v", or "k" when empty); a dash when there are none.
 * @param {Record<string, string> | null | undefined} labels
 * @returns {HTMLSpanElement | HTMLSpanElement[]}
 */
export function labelChips(labels) {
  const entries = Object.entries(labels || {});
  if (!entries.length) return h('span', { class: 'muted' }, '—');
  return entries.map(([k, v]) => h('span', { class: 'chip' }, v === '' ? k : k + '=' + v));
}

/**
 * A few chips, then "+N more" with the rest in its title.
 * @param {string[]} items
 * @param {number} max
 * @returns {HTMLSpanElement[]}
 */
export function someChips(items, max) {
  const shown = items.slice(0, max).map((item) => h('span', { class: 'chip' }, item));
  if (items.length > max) {
    shown.push(h('span', { class: 'muted small', title: items.slice(max).join('\n') }, '+' + (items.length - max) + ' more'));
  }
  return shown;
}

/**
 * How many items have each value of `key`.
 * @param {any[]} items
 * @param {string} key
 * @returns {Record<string, number>}
 */
export function countBy(items, key) {
  /** @type {Record<string, number>} */
  const counts = {};
  for (const item of items) counts[item[key]] = (counts[item[key]] || 0) + 1;
  return counts;
}

/**
 * A button that copies `text()` and says so.
 * @param {() => string} text
 * @param {HTMLElement} selectable what to select when the clipboard API is refused
 * @param {string} [label] the button's text; `Copy` by default
 * @returns {HTMLButtonElement}
 */
export function copyButton(text, selectable, label) {
  const idle = label || 'Copy';
  /** @type {HTMLButtonElement} */
  const button = h('button', {
    type: 'button',
    class: 'primary',
    onclick: async () => {
      try {
        await navigator.clipboard.writeText(text());
      } catch (_) {
        // No clipboard API on plain http to another host: the selected text copies.
        const range = document.createRange();
        range.selectNodeContents(selectable);
        const selection = /** @type {Selection} */ (getSelection());
        selection.removeAllRanges();
        selection.addRange(range);
        document.execCommand('copy');
      }
      button.textContent = 'Copied';
      setTimeout(() => (button.textContent = idle), 2000);
    },
  }, idle);
  return button;
}
