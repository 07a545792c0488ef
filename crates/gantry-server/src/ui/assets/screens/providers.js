// @ts-check
// The providers screen (admins): external OpenAI-compatible endpoints that routes can send
// requests to, with the routes that use each, and the form that adds or edits one (its
// API key write-only; "Discover models" asks the provider which models it has).

import { api, itemsOf } from '../lib/api.js';
import { confirmDialog } from '../lib/dialogs.js';
import { field, h, pageHead, toast } from '../lib/dom.js';
import { formatHeaders, parseHeaders, parseList, sameJson } from '../lib/format.js';
import { combine, ticker } from '../lib/live.js';
import { someChips, timeCell } from '../lib/widgets.js';

/** @import { Provider, Route } from '../lib/api-types' */

/**
 * @param {HTMLElement} main
 */
export function renderProviders(main) {
  const formBox = h('div');
  const tableBox = h('div', null, h('div', { class: 'panel empty' }, 'Loading…'));
  const closeForm = () => formBox.replaceChildren();
  /** @param {Provider | null} provider */
  const openForm = (provider) => {
    formBox.replaceChildren(providerForm(provider, () => {
      closeForm();
      load();
    }));
    // The form sits under the page's head: show both.
    window.scrollTo({ top: 0 });
    const first = /** @type {HTMLInputElement | null} */ (formBox.querySelector('input:not([disabled])'));
    if (first) first.focus();
  };
  main.append(pageHead('Providers',
    h('span', { class: 'muted small' }, 'External OpenAI-compatible endpoints that routes can send requests to.'),
    // Toggles the new-provider form; replaces an open edit form.
    h('button', { class: 'primary', onclick: () => (formBox.querySelector('[data-provider-form=""]') ? closeForm() : openForm(null)) }, 'New provider')),
  formBox, tableBox);

  /**
   * @param {Provider[]} providers
   * @param {Route[]} routes
   */
  const draw = (providers, routes) => {
    if (!providers.length) {
      tableBox.replaceChildren(h('div', { class: 'panel empty' }, 'No providers yet. Add one with “New provider”, then send a route’s traffic to it.'));
      return;
    }
    /** @type {Map<string, Set<string>>} the routes that send traffic to each provider */
    const usedBy = new Map();
    for (const r of routes) {
      for (const t of r.targets) {
        if (!t.provider) continue;
        const names = usedBy.get(t.provider) || new Set();
        names.add(r.name);
        usedBy.set(t.provider, names);
      }
    }
    const rows = providers.map((p) => {
      const routeNames = Array.from(usedBy.get(p.name) || []).sort();
      const headerCount = Object.keys(p.headers || {}).length;
      return h('tr', { 'data-provider': p.name },
        h('td', null, h('strong', null, p.name), p.description ? h('div', { class: 'muted small' }, p.description) : null),
        h('td', { class: 'url-cell' }, h('span', { class: 'mono small' }, p.base_url),
          headerCount ? h('div', { class: 'muted small', title: Object.keys(p.headers).join('\n') },
            '+ ' + headerCount + ' header' + (headerCount === 1 ? '' : 's')) : null),
        h('td', { 'data-part': 'key' }, p.has_api_key
          ? h('span', { class: 'badge ok' }, 'set')
          : h('span', { class: 'badge idle' }, 'none')),
        h('td', { 'data-part': 'models' }, p.models.length
          ? someChips(p.models, 4)
          : h('span', { class: 'muted', title: 'Routes may name any model id of this provider' }, 'any')),
        h('td', { class: 'num' }, p.timeout_seconds + ' s'),
        h('td', null, routeNames.length
          ? routeNames.map((name) => h('span', { class: 'chip' }, name))
          : h('span', { class: 'muted' }, '—')),
        h('td', null, timeCell(p.updated_at)),
        h('td', { class: 'actions' },
          h('button', { class: 'small', onclick: () => openForm(p) }, 'Edit'),
          h('button', { class: 'small danger', onclick: () => deleteProvider(p, load) }, 'Delete')));
    });
    tableBox.replaceChildren(h('div', { class: 'panel flush' }, h('table', { 'data-providers': '' },
      h('thead', null, h('tr', null,
        h('th', null, 'Name'), h('th', null, 'Base URL'), h('th', null, 'API key'), h('th', null, 'Models'),
        h('th', { class: 'num', title: 'Time the provider has to start its answer before a route falls back' }, 'Timeout'),
        h('th', null, 'Used by routes'), h('th', null, 'Updated'), h('th', null))),
      h('tbody', null, rows))));
  };

  let stopped = false;
  const load = async () => {
    try {
      const [providers, routes] = await Promise.all([
        api('GET', '/api/v1/model-providers'),
        api('GET', '/api/v1/model-routes').catch(() => []),
      ]);
      if (!stopped) draw(itemsOf(providers), itemsOf(routes));
    } catch (e) {
      if (!stopped) tableBox.replaceChildren(h('div', { class: 'panel' }, h('div', { class: 'alert' }, e.message)));
    }
  };
  load();
  return combine(ticker(load, 30000), () => (stopped = true));
}

/**
 * The form that creates a provider (`provider` null) or edits one. Its API key is
 * write-only: on edit the field starts empty, which keeps the key; "Remove the key"
 * sends null. "Discover models" asks the saved provider which models it has.
 * @param {Provider | null} provider
 * @param {() => void} onDone
 * @returns {HTMLFormElement}
 */
function providerForm(provider, onDone) {
  const editing = provider != null;
  /** @type {Omit<Provider, 'updated_at'>} */
  const p = provider || { name: '', description: '', base_url: '', has_api_key: false, headers: {}, timeout_seconds: 120, models: [] };
  const name = h('input', { required: !editing, disabled: editing, placeholder: 'openai', maxlength: 63, value: p.name, autocomplete: 'off' });
  const description = h('input', { placeholder: 'optional', value: p.description });
  const baseUrl = h('input', { type: 'url', required: true, placeholder: 'https://api.openai.com/v1', value: p.base_url });
  const apiKey = h('input', {
    type: 'password',
    'aria-label': 'API key',
    autocomplete: 'new-password',
    placeholder: editing ? (p.has_api_key ? 'set: leave empty to keep it' : 'none set') : 'optional',
  });
  const removeKey = h('input', { type: 'checkbox' });
  removeKey.addEventListener('change', () => {
    apiKey.disabled = removeKey.checked;
    if (removeKey.checked) apiKey.value = '';
  });
  const timeout = h('input', { type: 'number', min: 1, max: 3600, required: true, value: String(p.timeout_seconds) });
  const models = h('textarea', { rows: 3, 'aria-label': 'Models', placeholder: 'empty: any model id', value: p.models.join('\n') });
  const headers = h('textarea', { rows: 2, placeholder: 'OpenAI-Organization: org-123', value: formatHeaders(p.headers) });
  const discovered = h('div', { class: 'discovered', 'data-discovered': '' });
  const error = h('div', { class: 'alert', role: 'alert' });
  const submit = h('button', { class: 'primary', type: 'submit' }, editing ? 'Save' : 'Create provider');

  // Offered once the provider is saved (editing).
  const discover = h('button', {
    type: 'button',
    class: 'small',
    onclick: async () => {
      discover.disabled = true;
      discovered.replaceChildren(h('div', { class: 'muted small' }, 'Asking ' + p.name + ' for its models…'));
      try {
        const answer = await api('GET', '/api/v1/model-providers/' + encodeURIComponent(p.name) + '/models');
        discovered.replaceChildren(discoveredModels(answer.models, models));
      } catch (e) {
        discovered.replaceChildren(h('div', { class: 'alert' }, e.message));
      } finally {
        discover.disabled = false;
      }
    },
  }, 'Discover models');

  const form = h('form', {
    class: 'panel',
    'data-provider-form': editing ? p.name : '',
    onsubmit: async (event) => {
      event.preventDefault();
      error.textContent = '';
      let wanted;
      try {
        wanted = {
          description: description.value.trim(),
          base_url: baseUrl.value.trim(),
          headers: parseHeaders(headers.value),
          timeout_seconds: Number(timeout.value),
          models: parseList(models.value),
        };
      } catch (e) {
        error.textContent = e.message;
        return;
      }
      submit.disabled = true;
      try {
        if (editing) {
          /** @type {Record<string, unknown>} */
          const update = {};
          for (const [key, value] of Object.entries(wanted)) {
            if (!sameJson(value, p[/** @type {keyof typeof p} */ (key)])) update[key] = value;
          }
          if (removeKey.checked) update.api_key = null;
          else if (apiKey.value) update.api_key = apiKey.value;
          if (Object.keys(update).length) {
            await api('PATCH', '/api/v1/model-providers/' + encodeURIComponent(p.name), update);
            toast('Provider ' + p.name + ' updated.');
          }
        } else {
          /** @type {Record<string, unknown>} */
          const body = Object.assign({ name: name.value.trim() }, wanted);
          if (apiKey.value) body.api_key = apiKey.value;
          const created = await api('POST', '/api/v1/model-providers', body);
          toast('Provider ' + created.name + ' created.' + (created.models.length ? '' : ' Edit it to discover its models.'));
        }
        onDone();
      } catch (e) {
        error.textContent = e.message;
        submit.disabled = false;
      }
    },
  },
  h('h2', null, editing ? 'Edit provider ' + p.name : 'New provider'),
  h('div', { class: 'form-grid' },
    field('Name', name, editing ? 'Routes name the provider by it; it cannot change.' : 'Lowercase letters, digits, “-”, “_”, “.”'),
    field('Base URL', baseUrl, 'With the API’s version: requests go to <base URL>/chat/completions.'),
    // A div, not a label: it holds the remove checkbox's own label.
    h('div', { class: 'field' },
      h('span', null, 'API key'),
      apiKey,
      h('span', { class: 'hint' }, editing ? 'Write-only: it is never shown again.' : 'Sent as Authorization: Bearer; never shown again.'),
      editing && p.has_api_key ? h('label', { class: 'inline-check' }, removeKey, 'Remove the key') : null),
    field('Timeout (seconds)', timeout, 'To start answering, before a route falls back.'),
    field('Description', description),
    h('div', { class: 'field wide' },
      h('span', null, 'Models'),
      models,
      h('span', { class: 'hint' },
        'Model ids the provider offers, one per line or comma-separated; empty: routes may name any. ',
        editing ? 'Discover asks the saved provider (its GET /models).' : 'Once it is created, Edit → Discover models asks the provider.'),
      editing ? h('div', null, discover) : null,
      discovered),
    field('Extra headers', headers, 'One “Name: value” per line; not secret (keep credentials in the API key).', 'wide')),
  error,
  h('div', { class: 'form-actions' },
    submit,
    h('button', { type: 'button', onclick: () => onDone() }, 'Cancel')));
  return form;
}

/**
 * The models a provider listed, to tick and copy into the form's models.
 * @param {string[]} ids
 * @param {HTMLTextAreaElement} target
 * @returns {HTMLDivElement}
 */
function discoveredModels(ids, target) {
  if (!ids.length) return h('div', { class: 'muted small' }, 'The provider lists no models.');
  const current = new Set(parseList(target.value));
  const boxes = ids.map((id) => h('input', { type: 'checkbox', value: id, checked: current.has(id) }));
  /** @param {boolean} checked */
  const setAll = (checked) => boxes.forEach((b) => (b.checked = checked));
  return h('div', null,
    h('div', { class: 'discovered-head' },
      h('span', { class: 'small' }, ids.length + (ids.length === 1 ? ' model' : ' models') + ' at the provider'),
      h('button', { type: 'button', class: 'small', onclick: () => setAll(true) }, 'All'),
      h('button', { type: 'button', class: 'small', onclick: () => setAll(false) }, 'None'),
      h('button', {
        type: 'button',
        class: 'small primary',
        onclick: () => {
          target.value = boxes.filter((b) => b.checked).map((b) => b.value).join('\n');
          target.focus();
        },
      }, 'Use the ticked ones')),
    h('div', { class: 'discovered-list' }, ids.map((id, i) =>
      h('label', { class: 'discovered-item', title: id }, boxes[i], h('span', { class: 'mono small' }, id)))));
}

/**
 * @param {Provider} provider
 * @param {() => void} reload
 */
function deleteProvider(provider, reload) {
  confirmDialog('Delete provider ' + provider.name + '?',
    'Its key is forgotten. The server refuses while a route sends traffic to it: change those routes first.',
    'Delete provider',
    async () => {
      await api('DELETE', '/api/v1/model-providers/' + encodeURIComponent(provider.name));
      toast('Deleted provider “' + provider.name + '”.');
      reload();
    });
}
