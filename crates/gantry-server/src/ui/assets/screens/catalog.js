// @ts-check
// The catalog screen: well-known models (the server's list, or its model_catalog_file's),
// each deployed by an admin through the new-model form filled in from the entry.

import { api } from '../lib/api.js';
import { h, pageHead } from '../lib/dom.js';
import { describeSource } from '../lib/format.js';
import { isAdmin } from '../lib/session.js';
import { modelForm } from './model-form.js';

/** @import { CatalogEntry } from '../lib/api-types' */

/**
 * @param {HTMLElement} main
 */
export function renderCatalog(main) {
  const deploy = h('div');
  const list = h('div', null, h('div', { class: 'panel empty' }, 'Loading the catalog…'));
  main.append(pageHead('Catalog', h('span', { class: 'muted small' }, 'Well-known models; the server’s model_catalog_file replaces this list.')), deploy, list);
  (async () => {
    /** @type {{items: CatalogEntry[]}} */
    let catalog;
    try {
      catalog = await api('GET', '/api/v1/model-catalog');
    } catch (e) {
      list.replaceChildren(h('div', { class: 'panel' }, h('div', { class: 'alert' }, e.message)));
      return;
    }
    if (!catalog.items.length) {
      list.replaceChildren(h('div', { class: 'panel empty' }, 'The catalog is empty.'));
      return;
    }
    /** @param {CatalogEntry} entry */
    const open = (entry) => {
      deploy.replaceChildren(modelForm((model) => {
        deploy.replaceChildren();
        if (model) location.hash = '#/models';
      }, entry));
      deploy.scrollIntoView({ block: 'start' });
    };
    list.replaceChildren(h('div', { class: 'catalog' }, catalog.items.map((entry) => h('div', { class: 'card', 'data-catalog-entry': entry.name },
      h('h2', null, entry.title),
      h('div', { class: 'muted small mono' }, describeSource(entry.source)),
      entry.description ? h('p', { class: 'small' }, entry.description) : null,
      h('div', { class: 'breakdown' },
        h('span', { class: 'chip' }, entry.backend),
        entry.parameters ? h('span', { class: 'badge idle' }, entry.parameters + ' parameters') : null,
        entry.size ? h('span', { class: 'badge idle' }, '≈ ' + entry.size) : null,
        (entry.tags || []).map((t) => h('span', { class: 'chip' }, t))),
      isAdmin() ? h('div', { class: 'form-actions' }, h('button', { class: 'primary small', onclick: () => open(entry) }, 'Deploy')) : null))));
  })();
}
