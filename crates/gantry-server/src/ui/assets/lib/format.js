// @ts-check
// Text in and out: the numbers, sizes, times and model sources the tables show, and the
// parsers of what the forms take as text (labels, headers, lists, command lines).

/** @import { ModelSource } from './api-types' */

/**
 * A size in bytes: "512 B", "3.2 GiB"; "—" when unknown.
 * @param {number | null | undefined} bytes
 * @returns {string}
 */
export function fmtBytes(bytes) {
  if (bytes == null) return '—';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let value = Number(bytes);
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return (unit === 0 ? value : value.toFixed(value >= 100 ? 0 : 1)) + ' ' + units[unit];
}

/**
 * "12 s ago", "in 3 d": coarse on purpose; the exact time is in the title.
 * @param {string | null | undefined} iso
 * @returns {string}
 */
export function fmtAgo(iso) {
  if (!iso) return '—';
  const then = Date.parse(iso);
  if (Number.isNaN(then)) return iso;
  const seconds = Math.round((Date.now() - then) / 1000);
  const abs = Math.abs(seconds);
  let text;
  if (abs < 5) return 'just now';
  if (abs < 60) text = abs + ' s';
  else if (abs < 3600) text = Math.floor(abs / 60) + ' min';
  else if (abs < 86400) text = Math.floor(abs / 3600) + ' h';
  else text = Math.floor(abs / 86400) + ' d';
  return seconds >= 0 ? text + ' ago' : 'in ' + text;
}

/**
 * "45 s", "4 min 20 s", "3 h 5 min", "2 d 3 h": a duration, as precise as it is useful.
 * @param {number} seconds
 * @returns {string}
 */
export function fmtDuration(seconds) {
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return s + ' s';
  if (s < 600) return Math.floor(s / 60) + ' min ' + (s % 60) + ' s';
  if (s < 3600) return Math.floor(s / 60) + ' min';
  if (s < 86400) return Math.floor(s / 3600) + ' h ' + Math.floor((s % 3600) / 60) + ' min';
  return Math.floor(s / 86400) + ' d ' + Math.floor((s % 86400) / 3600) + ' h';
}

/**
 * A count with thousands separators: "12,345".
 * @param {number | null | undefined} n
 * @returns {string}
 */
export function fmtCount(n) {
  return Number(n || 0).toLocaleString('en-US');
}

/**
 * The text, cut to `max` characters with an ellipsis.
 * @param {string} text
 * @param {number} max
 * @returns {string}
 */
export function truncate(text, max) {
  return text.length > max ? text.slice(0, max - 1) + '…' : text;
}

/**
 * The first line of a message that is not blank.
 * @param {string | null | undefined} text
 * @returns {string}
 */
export function firstLine(text) {
  return (text || '').split('\n').find((l) => l.trim()) || '';
}

/**
 * A model source in one line: a path, "hf:owner/name/file", a URL.
 * @param {ModelSource | null | undefined} source
 * @returns {string}
 */
export function describeSource(source) {
  if (!source) return '';
  switch (source.type) {
    case 'local_path': return source.path;
    case 'huggingface': return 'hf:' + source.repo_id + (source.file ? '/' + source.file : '');
    case 'modelscope': return 'modelscope:' + source.repo_id + (source.file ? '/' + source.file : '');
    case 's3': return 's3://' + source.bucket + '/' + source.key;
    // One URL, or the parts of a split file.
    case 'url': return /** @type {string[]} */ ([]).concat(source.url).join(' + ');
    case 'upload': return 'upload ' + source.id;
    default: return JSON.stringify(source);
  }
}

/**
 * Parses "k=v, k2=v2" or one pair per line into an object.
 * @param {string} text
 * @returns {Record<string, string>}
 */
export function parseLabels(text) {
  /** @type {Record<string, string>} */
  const labels = {};
  for (const part of text.split(/[\n,]/)) {
    const item = part.trim();
    if (!item) continue;
    const eq = item.indexOf('=');
    if (eq < 0) labels[item] = '';
    else labels[item.slice(0, eq).trim()] = item.slice(eq + 1).trim();
  }
  return labels;
}

/**
 * Labels as "k=v" joined by `separator`, as parseLabels reads them.
 * @param {Record<string, string> | null | undefined} labels
 * @param {string} separator
 * @returns {string}
 */
export function formatLabels(labels, separator) {
  return Object.entries(labels || {}).map(([k, v]) => k + '=' + v).join(separator);
}

/**
 * Splits a command line like a shell would (quotes and backslashes), without running one.
 * @param {string} text
 * @returns {string[]}
 */
export function splitArgs(text) {
  const args = [];
  let current = '';
  let inWord = false;
  /** @type {string | null} */
  let quote = null;
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (quote) {
      if (c === quote) quote = null;
      else if (c === '\\' && quote === '"' && i + 1 < text.length) current += text[++i];
      else current += c;
    } else if (c === "'" || c === '"') {
      quote = c;
      inWord = true;
    } else if (c === '\\' && i + 1 < text.length) {
      current += text[++i];
      inWord = true;
    } else if (/\s/.test(c)) {
      if (inWord) args.push(current);
      current = '';
      inWord = false;
    } else {
      current += c;
      inWord = true;
    }
  }
  if (quote) throw new Error('backend arguments: unclosed ' + quote + ' quote');
  if (inWord) args.push(current);
  return args;
}

/**
 * Arguments as one command line, quoted where a shell would need it.
 * @param {string[] | null | undefined} args
 * @returns {string}
 */
export function joinArgs(args) {
  return (args || []).map((a) => (/^[\w@%+=:,./-]+$/.test(a) ? a : "'" + a.replace(/'/g, "'\\''") + "'")).join(' ');
}

/**
 * Parses "Name: value", one header per line, into an object.
 * @param {string} text
 * @returns {Record<string, string>}
 */
export function parseHeaders(text) {
  /** @type {Record<string, string>} */
  const headers = {};
  for (const line of text.split('\n')) {
    const item = line.trim();
    if (!item) continue;
    const colon = item.indexOf(':');
    if (colon <= 0) throw new Error('Headers: “' + item + '” is not “Name: value”.');
    headers[item.slice(0, colon).trim()] = item.slice(colon + 1).trim();
  }
  return headers;
}

/**
 * Headers as "Name: value" lines, as parseHeaders reads them.
 * @param {Record<string, string> | null | undefined} headers
 * @returns {string}
 */
export function formatHeaders(headers) {
  return Object.entries(headers || {}).map(([k, v]) => k + ': ' + v).join('\n');
}

/**
 * Splits a list typed with commas, spaces or one item per line.
 * @param {string} text
 * @returns {string[]}
 */
export function parseList(text) {
  return text.split(/[\s,]+/).map((item) => item.trim()).filter(Boolean);
}

/**
 * Whether two values are the same once written as JSON.
 * @param {unknown} a
 * @param {unknown} b
 * @returns {boolean}
 */
export function sameJson(a, b) {
  return JSON.stringify(a) === JSON.stringify(b);
}

/**
 * The last component of a path: what the file is called.
 * @param {string} path
 * @returns {string}
 */
export function baseName(path) {
  const parts = String(path).split('/');
  return parts[parts.length - 1] || String(path);
}
