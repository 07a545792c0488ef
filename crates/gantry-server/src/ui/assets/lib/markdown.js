// @ts-check
// Markdown for the playground's answers: parseMarkdown() reads the text a model wrote into
// blocks and inline spans (plain data, no DOM), renderMarkdown() builds them with h(). It
// covers what chat models write: paragraphs, headings, fenced code, lists (nested, ordered
// or not), block quotes, rules, pipe tables, and inline code, emphasis, strikethrough and
// links. Raw HTML is not Markdown here: it stays text, as every other character does, so
// an answer cannot add a script, a style or an event handler to the page. A link keeps
// its target only when it is an absolute http, https or mailto URL; any other (a
// `javascript:` URL, a relative path) is shown as its text alone. The text may be cut
// anywhere, as it is while an answer streams: an open code fence runs to the end, an
// unclosed emphasis shows its stars.

import { h } from './dom.js';

/** @typedef {import('./dom-types').Child} Child */

/**
 * A span of a line: text, code, emphasis (`em`, `strong`, `del` around more spans), a
 * link (its href already checked), or a line break inside a paragraph.
 * @typedef {{type: 'text', text: string}
 *   | {type: 'code', text: string}
 *   | {type: 'em' | 'strong' | 'del', children: Inline[]}
 *   | {type: 'link', href: string, children: Inline[]}
 *   | {type: 'br'}} Inline
 */

/**
 * A block of the text. A list item holds blocks; a `tight` list (no blank line between
 * its items) shows an item's paragraph without a paragraph's margins.
 * @typedef {{type: 'paragraph', children: Inline[]}
 *   | {type: 'heading', level: number, children: Inline[]}
 *   | {type: 'code', lang: string, text: string}
 *   | {type: 'list', ordered: boolean, start: number, tight: boolean, items: Block[][]}
 *   | {type: 'quote', children: Block[]}
 *   | {type: 'rule'}
 *   | {type: 'table', align: ('left' | 'center' | 'right' | null)[], head: Inline[][], rows: Inline[][][]}} Block
 */

/** The URL schemes a link may keep: the web and mail. */
const SAFE_SCHEMES = ['http:', 'https:', 'mailto:'];

const FENCE = /^( {0,3})(`{3,}|~{3,})[ \t]*([^`]*?)[ \t]*$/;
const HEADING = /^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$/;
const RULE = /^ {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$/;
const QUOTE = /^ {0,3}> ?(.*)$/;
const LIST_ITEM = /^( *)([-*+]|\d{1,9}[.)])(?:([ \t]+)(.*))?$/;
const TABLE_SEPARATOR = /^ {0,3}\|?[ \t]*:?-+:?[ \t]*(?:\|[ \t]*:?-+:?[ \t]*)*\|?[ \t]*$/;
/** Characters a backslash makes literal (CommonMark's ASCII punctuation). */
const ESCAPABLE = '!"#$%&\'()*+,-./:;<=>?@[\\]^_`{|}~';

/**
 * The href a link may have: an absolute URL of a safe scheme, else null.
 * @param {string} url
 * @returns {string | null}
 */
export function safeHref(url) {
  const trimmed = url.trim();
  // Browsers drop control characters and spaces from a scheme (`java\tscript:`): an
  // absolute URL is judged by what the browser would read.
  let parsed;
  try {
    parsed = new URL(trimmed);
  } catch (_) {
    return null;
  }
  return SAFE_SCHEMES.includes(parsed.protocol) ? parsed.href : null;
}

/**
 * A list item's marker at the start of a line.
 * @param {string} line
 * @returns {{indent: number, ordered: boolean, number: number, content: number, rest: string} | null}
 */
function listItem(line) {
  const m = LIST_ITEM.exec(line);
  if (!m) return null;
  const indent = m[1].length;
  const marker = m[2];
  const spaces = m[3] ? m[3].length : 0;
  const ordered = /\d/.test(marker[0]);
  // Five or more spaces after the marker start an indented block: the content is one
  // space in. An empty item's content starts after the marker and one space.
  const gap = spaces >= 1 && spaces <= 4 ? spaces : 1;
  return {
    indent,
    ordered,
    number: ordered ? parseInt(marker, 10) : 1,
    content: indent + marker.length + gap,
    rest: spaces > 4 ? m[3].slice(1) + (m[4] || '') : (m[4] || ''),
  };
}

/**
 * @param {string} line
 * @returns {number} its leading spaces (a tab counts as four)
 */
function indentOf(line) {
  let width = 0;
  for (const c of line) {
    if (c === ' ') width += 1;
    else if (c === '\t') width += 4 - (width % 4);
    else break;
  }
  return width;
}

/**
 * A line without its first `n` columns of indentation.
 * @param {string} line
 * @param {number} n
 */
function dedent(line, n) {
  let width = 0;
  let i = 0;
  while (i < line.length && width < n && (line[i] === ' ' || line[i] === '\t')) {
    width += line[i] === '\t' ? 4 - (width % 4) : 1;
    i += 1;
  }
  return line.slice(i);
}

/** @param {string} line */
const blank = (line) => line.trim() === '';

/**
 * Whether a line starts a block other than a paragraph, ending the paragraph above it.
 * @param {string} line
 */
function startsBlock(line) {
  if (FENCE.test(line) || HEADING.test(line) || RULE.test(line) || QUOTE.test(line)) return true;
  const item = listItem(line);
  // An ordered list interrupts a paragraph only from 1, as in CommonMark, so a sentence
  // that wraps before "2019. was …" stays one paragraph.
  return !!item && item.indent < 4 && item.rest.trim() !== '' && (!item.ordered || item.number === 1);
}

/**
 * The cells of a table row.
 * @param {string} line
 * @returns {string[]}
 */
function tableCells(line) {
  let text = line.trim();
  if (text.startsWith('|')) text = text.slice(1);
  if (text.endsWith('|') && !text.endsWith('\\|')) text = text.slice(0, -1);
  /** @type {string[]} */
  const cells = [];
  let cell = '';
  for (let i = 0; i < text.length; i++) {
    if (text[i] === '\\' && text[i + 1] === '|') {
      cell += '|';
      i += 1;
    } else if (text[i] === '|') {
      cells.push(cell.trim());
      cell = '';
    } else {
      cell += text[i];
    }
  }
  cells.push(cell.trim());
  return cells;
}

/**
 * Reads lines into blocks.
 * @param {string[]} lines
 * @returns {Block[]}
 */
function parseBlocks(lines) {
  /** @type {Block[]} */
  const blocks = [];
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    if (blank(line)) {
      i += 1;
      continue;
    }
    const fence = FENCE.exec(line);
    if (fence) {
      const [, indent, marks, info] = fence;
      /** @type {string[]} */
      const code = [];
      i += 1;
      while (i < lines.length) {
        const close = /^ {0,3}(`{3,}|~{3,})[ \t]*$/.exec(lines[i]);
        if (close && close[1][0] === marks[0] && close[1].length >= marks.length) {
          i += 1;
          break;
        }
        code.push(dedent(lines[i], indent.length));
        i += 1;
      }
      blocks.push({ type: 'code', lang: info.split(/\s+/)[0] || '', text: code.join('\n') });
      continue;
    }
    const heading = HEADING.exec(line);
    if (heading) {
      blocks.push({ type: 'heading', level: heading[1].length, children: parseInline(heading[2] || '') });
      i += 1;
      continue;
    }
    if (RULE.test(line)) {
      blocks.push({ type: 'rule' });
      i += 1;
      continue;
    }
    if (QUOTE.test(line)) {
      /** @type {string[]} */
      const inner = [];
      while (i < lines.length && !blank(lines[i])) {
        const quoted = QUOTE.exec(lines[i]);
        // A line without ">" continues the quote's paragraph (a lazy line).
        if (!quoted && startsBlock(lines[i])) break;
        inner.push(quoted ? quoted[1] : lines[i]);
        i += 1;
      }
      blocks.push({ type: 'quote', children: parseBlocks(inner) });
      continue;
    }
    const item = listItem(line);
    if (item && item.indent < 4) {
      i = parseList(lines, i, blocks);
      continue;
    }
    if (line.includes('|') && i + 1 < lines.length && TABLE_SEPARATOR.test(lines[i + 1]) && lines[i + 1].includes('-')) {
      const head = tableCells(line);
      const align = tableCells(lines[i + 1]).map((spec) => {
        const left = spec.startsWith(':');
        const right = spec.endsWith(':');
        return left && right ? 'center' : right ? 'right' : left ? 'left' : null;
      });
      if (align.length === head.length) {
        i += 2;
        /** @type {Inline[][][]} */
        const rows = [];
        while (i < lines.length && !blank(lines[i]) && lines[i].includes('|')) {
          const cells = tableCells(lines[i]);
          rows.push(head.map((_, c) => parseInline(cells[c] || '')));
          i += 1;
        }
        blocks.push({ type: 'table', align, head: head.map((cell) => parseInline(cell)), rows });
        continue;
      }
    }
    /** @type {string[]} */
    const paragraph = [line.trim()];
    i += 1;
    while (i < lines.length && !blank(lines[i]) && !startsBlock(lines[i])) {
      paragraph.push(lines[i].trim());
      i += 1;
    }
    blocks.push({ type: 'paragraph', children: parseInline(paragraph.join('\n')) });
  }
  return blocks;
}

/**
 * Reads the list that starts at `lines[start]` into `blocks`; answers the line after it.
 * @param {string[]} lines
 * @param {number} start
 * @param {Block[]} blocks
 * @returns {number}
 */
function parseList(lines, start, blocks) {
  const first = /** @type {NonNullable<ReturnType<typeof listItem>>} */ (listItem(lines[start]));
  /** @type {Block[][]} */
  const items = [];
  let tight = true;
  let i = start;
  for (;;) {
    const item = i < lines.length ? listItem(lines[i]) : null;
    if (!item || item.ordered !== first.ordered || item.indent >= first.content || indentOf(lines[i]) < first.indent) break;
    /** @type {string[]} */
    const inner = [item.rest];
    i += 1;
    let blankBefore = false;
    while (i < lines.length) {
      const line = lines[i];
      if (blank(line)) {
        blankBefore = true;
        inner.push('');
        i += 1;
        continue;
      }
      const indent = indentOf(line);
      const nested = listItem(line);
      if (indent >= item.content || (nested && indent > item.indent && !blankBefore)) {
        inner.push(dedent(line, Math.min(indent, item.content)));
      } else if (!blankBefore && !nested && !startsBlock(line)) {
        // A lazy line: the paragraph of the item goes on.
        inner.push(line.trim());
      } else {
        break;
      }
      blankBefore = false;
      i += 1;
    }
    // Blank lines at the end of an item belong between items, not inside the last one.
    while (inner.length > 1 && blank(inner[inner.length - 1])) inner.pop();
    if (inner.slice(1).some(blank)) tight = false;
    items.push(parseBlocks(inner));
    const next = i < lines.length ? listItem(lines[i]) : null;
    if (blankBefore && next && next.ordered === first.ordered && next.indent < first.content) tight = false;
  }
  blocks.push({ type: 'list', ordered: first.ordered, start: first.number, tight, items });
  return i;
}

/**
 * Where the emphasis opened at `from` by `marker` closes, or -1: the next run of the same
 * marker that follows a non-space (and, for `_`, that no letter follows).
 * @param {string} text
 * @param {number} from the first character inside
 * @param {string} marker
 */
function closingOf(text, from, marker) {
  for (let j = from; j < text.length; j++) {
    const c = text[j];
    if (c === '\\') {
      j += 1;
      continue;
    }
    if (c === '`') {
      // A code span is opaque: its stars are text.
      const run = /^`+/.exec(text.slice(j))?.[0] || '`';
      const end = text.indexOf(run, j + run.length);
      if (end >= 0) j = end + run.length - 1;
      continue;
    }
    if (!text.startsWith(marker, j) || j === from || /\s/.test(text[j - 1])) continue;
    const after = text[j + marker.length];
    // "**" does not close "*": a single marker skips a double one.
    if (marker.length === 1 && after === marker[0]) {
      j += 1;
      continue;
    }
    if (marker[0] === '_' && after !== undefined && /[\p{L}\p{N}]/u.test(after)) continue;
    return j;
  }
  return -1;
}

/**
 * Finds the `]` that closes the `[` at `open`, counting nested brackets.
 * @param {string} text
 * @param {number} open
 */
function closingBracket(text, open) {
  let depth = 0;
  for (let j = open; j < text.length; j++) {
    if (text[j] === '\\') j += 1;
    else if (text[j] === '[') depth += 1;
    else if (text[j] === ']' && --depth === 0) return j;
  }
  return -1;
}

/**
 * The destination of a link after its `]`: `(url "title")`, balanced parentheses
 * allowed. Answers the URL and the index after the `)`, or null.
 * @param {string} text
 * @param {number} at the index of the `(`
 * @returns {{url: string, end: number} | null}
 */
function linkDestination(text, at) {
  if (text[at] !== '(') return null;
  let depth = 0;
  for (let j = at; j < text.length; j++) {
    if (text[j] === '\\') {
      j += 1;
    } else if (text[j] === '(') {
      depth += 1;
    } else if (text[j] === ')' && --depth === 0) {
      let inside = text.slice(at + 1, j).trim();
      if (inside.startsWith('<')) inside = inside.slice(1, inside.indexOf('>') > 0 ? inside.indexOf('>') : undefined);
      // A title after the URL is dropped: the link's text says what it is.
      const url = inside.split(/\s+/)[0] || '';
      return { url, end: j + 1 };
    } else if (text[j] === '\n') {
      return null;
    }
  }
  return null;
}

/**
 * Reads a paragraph's text (lines joined with "\n") into inline spans.
 * @param {string} text
 * @returns {Inline[]}
 */
export function parseInline(text) {
  /** @type {Inline[]} */
  const out = [];
  let plain = '';
  const flush = () => {
    if (plain) out.push({ type: 'text', text: plain });
    plain = '';
  };
  let i = 0;
  while (i < text.length) {
    const c = text[i];
    if (c === '\\' && i + 1 < text.length && ESCAPABLE.includes(text[i + 1])) {
      plain += text[i + 1];
      i += 2;
      continue;
    }
    if (c === '\n') {
      flush();
      out.push({ type: 'br' });
      i += 1;
      continue;
    }
    if (c === '`') {
      const run = /^`+/.exec(text.slice(i))?.[0] || '`';
      let end = text.indexOf(run, i + run.length);
      // A longer run of backticks is not the closing one.
      while (end >= 0 && text[end + run.length] === '`') {
        end = text.indexOf(run, end + run.length + 1);
      }
      if (end >= 0) {
        flush();
        let code = text.slice(i + run.length, end).replace(/\n/g, ' ');
        if (code.length > 2 && code.startsWith(' ') && code.endsWith(' ') && code.trim()) code = code.slice(1, -1);
        out.push({ type: 'code', text: code });
        i = end + run.length;
      } else {
        plain += run;
        i += run.length;
      }
      continue;
    }
    if (c === '[' || (c === '!' && text[i + 1] === '[')) {
      const open = c === '!' ? i + 1 : i;
      const close = closingBracket(text, open);
      const target = close >= 0 ? linkDestination(text, close + 1) : null;
      if (target) {
        flush();
        const label = text.slice(open + 1, close);
        const href = safeHref(target.url);
        // An image is shown as a link to it: the page loads nothing from elsewhere.
        const children = c === '!' ? [/** @type {Inline} */ ({ type: 'text', text: label || target.url })] : parseInline(label);
        if (href) out.push({ type: 'link', href, children });
        else out.push(...children);
        i = target.end;
        continue;
      }
    }
    if (c === '<') {
      const auto = /^<([a-zA-Z][a-zA-Z0-9+.-]{1,31}:[^\s<>]*)>/.exec(text.slice(i));
      if (auto) {
        flush();
        const href = safeHref(auto[1]);
        out.push(href ? { type: 'link', href, children: [{ type: 'text', text: auto[1] }] } : { type: 'text', text: auto[0] });
        i += auto[0].length;
        continue;
      }
    }
    if ((c === 'h' || c === 'w') && (i === 0 || !/[\p{L}\p{N}]/u.test(text[i - 1]))) {
      // A bare web address becomes a link, without the punctuation that ends a sentence.
      const bare = /^(?:https?:\/\/|www\.)[^\s<]+/.exec(text.slice(i));
      if (bare) {
        let url = bare[0];
        while (/[.,:;!?'")\]*_~]$/.test(url)) {
          if (url.endsWith(')') && (url.match(/\(/g) || []).length >= (url.match(/\)/g) || []).length) break;
          url = url.slice(0, -1);
        }
        const href = safeHref(url.startsWith('www.') ? 'https://' + url : url);
        if (href && url.length > 'www.'.length) {
          flush();
          out.push({ type: 'link', href, children: [{ type: 'text', text: url }] });
          i += url.length;
          continue;
        }
      }
    }
    if (c === '*' || c === '_' || (c === '~' && text[i + 1] === '~')) {
      const run = c === '~' ? 2 : Math.min(3, /^(\*+|_+)/.exec(text.slice(i, i + 3))?.[0].length || 1);
      const marker = c.repeat(run);
      const inside = i + marker.length;
      // An opening marker is followed by a non-space; "_" also needs no letter before it,
      // so snake_case_names stay as they are.
      const opens = inside < text.length && !/\s/.test(text[inside]) &&
        !(c === '_' && i > 0 && /[\p{L}\p{N}]/u.test(text[i - 1]));
      const close = opens ? closingOf(text, inside, marker) : -1;
      if (close >= 0) {
        flush();
        const children = parseInline(text.slice(inside, close));
        if (c === '~') out.push({ type: 'del', children });
        else if (run === 3) out.push({ type: 'strong', children: [{ type: 'em', children }] });
        else out.push({ type: run === 2 ? 'strong' : 'em', children });
        i = close + marker.length;
        continue;
      }
      plain += marker;
      i += marker.length;
      continue;
    }
    plain += c;
    i += 1;
  }
  flush();
  return out;
}

/**
 * Reads Markdown into blocks.
 * @param {string} text
 * @returns {Block[]}
 */
export function parseMarkdown(text) {
  return parseBlocks(text.replace(/\r\n?/g, '\n').split('\n'));
}

/**
 * @param {Inline[]} spans
 * @returns {Child[]}
 */
function renderInline(spans) {
  return spans.map((span) => {
    switch (span.type) {
      case 'text': return span.text;
      case 'br': return h('br');
      case 'code': return h('code', null, span.text);
      case 'link': return h('a', { href: span.href, target: '_blank', rel: 'noopener noreferrer nofollow' }, renderInline(span.children));
      default: return h(span.type, null, renderInline(span.children));
    }
  });
}

/**
 * @param {Block} block
 * @param {boolean} [tight] a tight list's item: its paragraphs without their margins
 * @returns {HTMLElement}
 */
function renderBlock(block, tight) {
  switch (block.type) {
    case 'paragraph': return tight ? h('span', { class: 'md-line' }, renderInline(block.children)) : h('p', null, renderInline(block.children));
    case 'heading': return h(/** @type {'h1' | 'h2' | 'h3' | 'h4' | 'h5' | 'h6'} */ ('h' + block.level), null, renderInline(block.children));
    case 'code': return h('pre', { class: 'md-code', 'data-lang': block.lang || null }, h('code', null, block.text));
    case 'rule': return h('hr');
    case 'quote': return h('blockquote', null, block.children.map((child) => renderBlock(child)));
    case 'list': return h(block.ordered ? 'ol' : 'ul', { start: block.ordered && block.start !== 1 ? block.start : null },
      block.items.map((item) => h('li', null, item.map((child) => renderBlock(child, block.tight)))));
    case 'table': {
      /** @param {number} c */
      const cellClass = (c) => (block.align[c] ? 'align-' + block.align[c] : null);
      return h('div', { class: 'md-table' }, h('table', null,
        h('thead', null, h('tr', null, block.head.map((cell, c) => h('th', { class: cellClass(c) }, renderInline(cell))))),
        h('tbody', null, block.rows.map((row) => h('tr', null, row.map((cell, c) => h('td', { class: cellClass(c) }, renderInline(cell))))))));
    }
  }
}

/**
 * Markdown as elements, built with h(): every character of `text` ends up as text, and
 * a link's href is an absolute http, https or mailto URL.
 * @param {string} text
 * @returns {HTMLElement[]} one element per block
 */
export function renderMarkdown(text) {
  return parseMarkdown(text).map((block) => renderBlock(block));
}
