// @ts-check
// Charts drawn as SVG with svg(): the usage screen's stacked bars over days and a worker's
// lines of its last hour, with their axes and legends. Colours are set as attributes or
// through the CSSOM, never as inline style attributes, which the CSP forbids.

import { h, svg } from './dom.js';
import { fmtCount } from './format.js';

/**
 * One series of stacked bars: its values by bucket index.
 * @typedef {{name: string, colour: string, values: Map<number, number>}} BarSeries
 */

/**
 * One line of an hour chart: [time in ms, value] points, oldest first.
 * @typedef {{name: string, colour: string, points: [number, number][]}} Line
 */

/** Colours of a chart's series, in order; the last is "other". */
export const SERIES_COLOURS = ['#3b6fe0', '#18a078', '#e08a1e', '#b04fd1', '#d9434a', '#2aa3c4', '#8a93a3'];

/**
 * The value axis of a chart from 0 to `top`: a grid line and a label at 0, half and the
 * top, from `left` to `right`; `yOf` places a value, `format` writes it.
 * @param {SVGElement} chart
 * @param {number} left
 * @param {number} right
 * @param {number} top
 * @param {(value: number) => number} yOf
 * @param {(value: number) => string} format
 */
function valueAxis(chart, left, right, top, yOf, format) {
  for (const fraction of [0, 0.5, 1]) {
    const value = top * fraction;
    const y = yOf(value);
    chart.append(
      svg('line', { x1: left, x2: right, y1: y, y2: y, class: 'grid' }),
      svg('text', { x: left - 6, y: y + 4, 'text-anchor': 'end', class: 'axis' }, format(value)));
  }
}

/**
 * A chart's legend: one swatch of its colour and the name per series.
 * @param {{name: string, colour: string}[]} series
 * @returns {HTMLDivElement}
 */
export function chartLegend(series) {
  return h('div', { class: 'legend' }, series.map((s) => {
    const swatch = h('span', { class: 'swatch' });
    // Set through the CSSOM: the page's CSP allows no inline style attribute.
    swatch.style.background = s.colour;
    return h('span', { class: 'legend-item' }, swatch, s.name);
  }));
}

/**
 * A stacked bar chart: one bar per bucket from `start` (`count` buckets of `step` ms),
 * one segment per series. `series`: [{name, colour, values: Map(bucketIndex → value)}].
 * @param {BarSeries[]} series
 * @param {number} start
 * @param {number} step
 * @param {number} count
 * @param {string} unit what the values count (`tokens`)
 * @returns {SVGElement}
 */
export function stackedBars(series, start, step, count, unit) {
  const width = 960;
  const height = 240;
  const left = 56;
  const bottom = 24;
  const plotW = width - left - 8;
  const plotH = height - bottom - 8;
  /** @type {number[]} */
  const totals = new Array(count).fill(0);
  for (const s of series) for (const [i, v] of s.values) totals[i] += v;
  const max = Math.max(1, ...totals);
  // A round top for the axis: 1, 2 or 5 times a power of ten.
  const magnitude = Math.pow(10, Math.floor(Math.log10(max)));
  // Always found: ten times the magnitude is above the largest total.
  const top = /** @type {number} */ ([1, 2, 5, 10].map((m) => m * magnitude).find((t) => t >= max));
  const barW = plotW / count;
  const chart = svg('svg', { viewBox: '0 0 ' + width + ' ' + height, class: 'chart', role: 'img', 'aria-label': unit + ' over time', 'data-chart': '' });
  valueAxis(chart, left, width - 8, top, (v) => 8 + plotH * (1 - v / top),
    (v) => (Number.isInteger(v) ? fmtCount(v) : v.toFixed(1)));
  const labelEvery = Math.max(1, Math.ceil(count / 8));
  for (let i = 0; i < count; i++) {
    const at = new Date(start + i * step);
    let y = 8 + plotH;
    for (const s of series) {
      const value = s.values.get(i) || 0;
      if (!value) continue;
      const barH = (value / top) * plotH;
      y -= barH;
      chart.append(svg('rect', {
        x: (left + i * barW + barW * 0.12).toFixed(1),
        y: y.toFixed(1),
        width: Math.max(1, barW * 0.76).toFixed(1),
        height: Math.max(0.5, barH).toFixed(1),
        fill: s.colour,
        'data-series': s.name,
      }, svg('title', null, s.name + ' · ' + at.toLocaleString() + ': ' + fmtCount(value) + ' ' + unit)));
    }
    if (i % labelEvery === 0) {
      const text = step >= 86400000
        ? at.toLocaleDateString(undefined, { month: 'short', day: 'numeric' })
        : at.toLocaleString(undefined, count > 48 ? { month: 'short', day: 'numeric', hour: '2-digit' } : { hour: '2-digit', minute: '2-digit' });
      chart.append(svg('text', { x: left + i * barW + barW / 2, y: height - 6, 'text-anchor': 'middle', class: 'axis' }, text));
    }
  }
  return chart;
}

/**
 * A small line chart of the last hour: `lines` [{name, colour, points: [[ms, value]]}]
 * on one scale from 0 to `max` (the largest value when null), `format` for its labels.
 * @param {string} title
 * @param {Line[]} lines
 * @param {number | null} max
 * @param {(value: number) => string} format
 * @param {string} [empty] said when nothing was reported in the hour
 * @returns {HTMLDivElement}
 */
export function hourChart(title, lines, max, format, empty) {
  const width = 460;
  const height = 130;
  const left = 52;
  const top = 8;
  const plotW = width - left - 8;
  const plotH = height - top - 22;
  const now = Date.now();
  const from = now - 3600000;
  const values = lines.flatMap((l) => l.points.map((p) => p[1]));
  const ceiling = max || Math.max(1, ...values);
  /** @param {number} ms */
  const x = (ms) => left + ((ms - from) / 3600000) * plotW;
  /** @param {number} v */
  const y = (v) => top + plotH * (1 - Math.min(1, v / ceiling));
  const chart = svg('svg', { viewBox: '0 0 ' + width + ' ' + height, class: 'chart', role: 'img', 'aria-label': title, 'data-history-chart': title });
  valueAxis(chart, left, width - 8, ceiling, y, format);
  for (const [ms, label] of /** @type {[number, string][]} */ ([[from, '60 min ago'], [from + 1800000, '30 min'], [now, 'now']])) {
    chart.append(svg('text', { x: x(ms), y: height - 4, 'text-anchor': ms === from ? 'start' : ms === now ? 'end' : 'middle', class: 'axis' }, label));
  }
  if (!lines.some((l) => l.points.some((p) => p[0] >= from))) {
    chart.append(svg('text', { x: left + plotW / 2, y: top + plotH / 2, 'text-anchor': 'middle', class: 'axis' },
      empty || 'nothing reported yet'));
  }
  for (const line of lines) {
    const points = line.points.filter((p) => p[0] >= from);
    if (!points.length) continue;
    chart.append(svg('polyline', {
      points: points.map((p) => x(p[0]).toFixed(1) + ',' + y(p[1]).toFixed(1)).join(' '),
      fill: 'none',
      stroke: line.colour,
      'stroke-width': 1.8,
      'data-line': line.name,
    }, svg('title', null, line.name + ': ' + format(points[points.length - 1][1]) + ' now')));
    // The newest point as a dot, so a line of one sample shows too.
    const [lastMs, lastValue] = points[points.length - 1];
    chart.append(svg('circle', { cx: x(lastMs).toFixed(1), cy: y(lastValue).toFixed(1), r: 2.5, fill: line.colour }));
  }
  const legend = lines.length > 1 ? chartLegend(lines) : null;
  return h('div', { class: 'history-chart' }, h('h3', null, title), chart, legend);
}

/**
 * A share in percent: "42%".
 * @param {number} v
 */
export const pct = (v) => Math.round(v) + '%';
