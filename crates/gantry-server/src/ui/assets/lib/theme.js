// @ts-check
// The colour theme: the operating system's (the default), or light or dark as chosen in the
// console and remembered in this browser (localStorage). The choice is an attribute on the
// root element that app.css reads (`data-theme`); without one the page follows the system.

import { h } from './dom.js';

/** @typedef {'system' | 'light' | 'dark'} Theme */

const STORAGE_KEY = 'gantry.theme';

/** @type {{value: Theme, label: string}[]} */
const THEMES = [
  { value: 'system', label: 'System' },
  { value: 'light', label: 'Light' },
  { value: 'dark', label: 'Dark' },
];

/**
 * The theme this browser chose; `system` when none (or storage is not allowed).
 * @returns {Theme}
 */
export function storedTheme() {
  let stored = null;
  try {
    stored = localStorage.getItem(STORAGE_KEY);
  } catch (_) {
    // Storage refused (a privacy setting): the system's theme.
  }
  return stored === 'light' || stored === 'dark' ? stored : 'system';
}

/**
 * Shows the page in `theme`.
 * @param {Theme} theme
 */
export function applyTheme(theme) {
  if (theme === 'system') delete document.documentElement.dataset.theme;
  else document.documentElement.dataset.theme = theme;
}

/**
 * Shows the page in `theme` and remembers it in this browser.
 * @param {Theme} theme
 */
function chooseTheme(theme) {
  applyTheme(theme);
  try {
    if (theme === 'system') localStorage.removeItem(STORAGE_KEY);
    else localStorage.setItem(STORAGE_KEY, theme);
  } catch (_) {
    // Not remembered; it still applies to this page.
  }
}

/**
 * The theme choice: three buttons, the chosen one pressed.
 * @returns {HTMLDivElement}
 */
export function themeControl() {
  const buttons = THEMES.map((t) => h('button', {
    type: 'button',
    class: 'small',
    'data-theme-choice': t.value,
    title: t.value === 'system' ? 'Follow the operating system’s light or dark setting' : 'Always ' + t.label.toLowerCase(),
    onclick: () => {
      chooseTheme(t.value);
      mark(t.value);
    },
  }, t.label));
  /** @param {Theme} current */
  const mark = (current) => {
    for (const b of buttons) b.setAttribute('aria-pressed', String(b.dataset.themeChoice === current));
  };
  mark(storedTheme());
  return h('div', { class: 'theme-choice', role: 'group', 'aria-label': 'Colour theme' },
    h('span', { class: 'theme-label' }, 'Theme'), buttons);
}
