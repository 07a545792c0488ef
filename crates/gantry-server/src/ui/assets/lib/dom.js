// @ts-check
// Building the page: h() makes an element from a tag, attributes and children, svg() the
// same for charts, and the few pieces every screen's markup is made of (a form field, a
// page's head, a toast). Everything is built with DOM calls, never innerHTML, so names,
// labels and log lines coming from the API are always text.

/** @typedef {import('./dom-types').Child} Child */

/**
 * The attributes of h(): `class` sets the class name; `on<event>` with a function adds it
 * as that event's listener; `value`, `checked` and `selected` are set as properties after
 * the children exist; any other is an attribute, empty for `true`. null, undefined and
 * false leave it out.
 * @typedef {{
 *   [name: string]: unknown,
 *   onclick?: (event: MouseEvent) => unknown,
 *   onsubmit?: (event: SubmitEvent) => unknown,
 * }} Attrs
 */

/**
 * Builds an element: h('td', {class: 'num'}, 'text', childNode, [more]).
 * @template {keyof HTMLElementTagNameMap} K
 * @param {K} tag
 * @param {Attrs | null} [attrs]
 * @param {...Child} children
 * @returns {HTMLElementTagNameMap[K]}
 */
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  /** @type {Record<string, unknown>} */
  const late = {};
  if (attrs) {
    for (const [key, value] of Object.entries(attrs)) {
      if (value == null || value === false) continue;
      if (key === 'class') el.className = String(value);
      else if (key.startsWith('on') && typeof value === 'function') el.addEventListener(key.slice(2), /** @type {EventListener} */ (value));
      else if (key === 'value' || key === 'checked' || key === 'selected') late[key] = value;
      else el.setAttribute(key, value === true ? '' : String(value));
    }
  }
  append(el, children);
  // Set after the options exist, so a <select> can take its value.
  Object.assign(el, late);
  return el;
}

/**
 * Appends children to an element as h() does: nodes as they are, anything else as text.
 * @template {Element} E
 * @param {E} el
 * @param {Child[]} children
 * @returns {E}
 */
function append(el, children) {
  // Flattened as any[]: the checker cannot expand Child's nesting to any depth.
  for (const child of /** @type {any[]} */ (children).flat(Infinity)) {
    if (child == null || child === false) continue;
    el.append(child instanceof Node ? child : String(child));
  }
  return el;
}

const SVG_NS = 'http://www.w3.org/2000/svg';

/**
 * Builds an SVG element: svg('rect', {x: 1}, child...).
 * @param {string} tag
 * @param {Record<string, unknown> | null} [attrs]
 * @param {...Child} children
 * @returns {SVGElement}
 */
export function svg(tag, attrs, ...children) {
  const el = /** @type {SVGElement} */ (document.createElementNS(SVG_NS, tag));
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value != null) el.setAttribute(key, String(value));
  }
  append(el, children);
  return el;
}

/**
 * An element of index.html, which is always there (`app`, `toasts`).
 * @param {string} id
 * @returns {HTMLElement}
 */
export function pageElement(id) {
  const el = document.getElementById(id);
  if (!el) throw new Error('the page has no #' + id);
  return el;
}

/**
 * A message in the corner that goes away by itself; errors stay longer.
 * @param {string} message
 * @param {'error'} [kind]
 */
export function toast(message, kind) {
  const box = pageElement('toasts');
  const el = h('div', { class: 'toast' + (kind === 'error' ? ' error' : ''), role: 'status' }, message);
  box.append(el);
  setTimeout(() => el.remove(), kind === 'error' ? 7000 : 3500);
}

/**
 * A form control with its label above it and a hint under it.
 * @param {string} label
 * @param {Child} control
 * @param {Child} [hint]
 * @param {string} [extraClass] `wide` spans the form's grid
 * @returns {HTMLLabelElement}
 */
export function field(label, control, hint, extraClass) {
  return h('label', { class: 'field' + (extraClass ? ' ' + extraClass : '') },
    h('span', null, label), control, hint ? h('span', { class: 'hint' }, hint) : null);
}

/**
 * A checkbox with its label.
 * @param {string} label
 * @param {HTMLInputElement} control
 * @returns {HTMLLabelElement}
 */
export function checkField(label, control) {
  return h('label', { class: 'field check' }, h('span', null, label), control);
}

/**
 * A screen's title, with what goes at its right (buttons, filters, a note).
 * @param {string} title
 * @param {...Child} rest
 * @returns {HTMLDivElement}
 */
export function pageHead(title, ...rest) {
  return h('div', { class: 'page-head' }, h('h1', null, title), h('span', { class: 'spacer' }), rest);
}
