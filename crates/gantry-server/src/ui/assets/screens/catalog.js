// @ts-check
// The catalog screen: well-known models (the server's list, or its model_catalog_file's),
// found by a search over their names, titles and tags, each deployed by an admin (or the
// administrator of a cluster, into theirs) through the new-model form filled in from the entry.

import { api } from '../lib/api.js';
import { h, pageHead } from '../lib/dom.js';
import { describeSource } from '../lib/format.js';
import { administersSomeCluster } from '../lib/session.js';
import { modelForm } from './model-form.js';

/** @import { CatalogEntry } from '../lib/api-types' */

/**
 * The words of an entry a search matches: its name, title and tags.
 * @param {CatalogEntry} entry
 * @returns {string}
 */
function searchText(entry) {
  return [entry.name, entry.title].concat(entry.tags || []).join(' ').toLowerCase();
}

/**
 * @param {HTMLElement} main
 * @param {string[]} parts
 * @param {URLSearchParams} params
 */
export function renderCatalog(main, parts, params) {
  const deploy = h('div', { class: 'deploy-box' });
  const list = h('div', null, h('div', { class: 'panel empty' }, 'Loading the catalog…'));
  const search = h('input', {
    type: 'search',
    placeholder: 'Search by name, title or tag',
    'aria-label': 'Search the catalog',
    value: params.get('q') || '',
  });
  const count = h('span', { class: 'muted small', 'data-catalog-count': '' });
  main.append(pageHead('Catalog', h('div', { class: 'filters' }, count, search)),
    h('p', { class: 'page-note muted small' }, 'Well-known models; the server’s model_catalog_file replaces this list.'),
    deploy, list);
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
    // Every card has the same parts in the same order, an empty one included, so that
    // the Deploy buttons, at the bottom of each, line up along a row.
    const cards = catalog.items.map((entry) => ({
      words: searchText(entry),
      card: h('div', { class: 'card catalog-card', 'data-catalog-entry': entry.name },
        h('h2', null, entry.title),
        h('div', { class: 'muted small mono catalog-source', title: describeSource(entry.source) }, describeSource(entry.source)),
        h('p', { class: 'small' }, entry.description || ''),
        h('div', { class: 'breakdown' },
          h('span', { class: 'chip' }, entry.backend),
          entry.parameters ? h('span', { class: 'badge idle' }, entry.parameters + ' parameters') : null,
          entry.size ? h('span', { class: 'badge idle' }, '≈ ' + entry.size) : null,
          (entry.tags || []).map((t) => h('span', { class: 'chip' }, t))),
        administersSomeCluster() ? h('div', { class: 'form-actions' }, h('button', { class: 'primary small', onclick: () => open(entry) }, 'Deploy')) : null),
    }));
    const grid = h('div', { class: 'catalog' });
    const none = h('div', { class: 'panel empty', 'data-catalog-none': '' });
    const filter = () => {
      const query = search.value.trim().toLowerCase();
      const words = query.split(/\s+/).filter(Boolean);
      const shown = cards.filter((c) => words.every((w) => c.words.includes(w)));
      grid.replaceChildren(...shown.map((c) => c.card));
      count.textContent = words.length ? shown.length + ' of ' + cards.length + ' models' : cards.length + ' models';
      none.textContent = 'No model in the catalog matches “' + search.value.trim() + '”: search by a name, a title or a tag such as “chat”.';
      list.replaceChildren(shown.length ? grid : none);
      history.replaceState(null, '', '#/catalog' + (query ? '?q=' + encodeURIComponent(search.value.trim()) : ''));
    };
    search.addEventListener('input', filter);
    filter();
  })();
}
