// @ts-check
// The API keys screen: the user's keys (an admin's: everyone's) with their limits at the
// gateway, the form that creates one (its secret shown once), and editing or deleting one.

import { api, listAll } from '../lib/api.js';
import { confirmDialog, openDialog } from '../lib/dialogs.js';
import { field, h, pageHead, toast } from '../lib/dom.js';
import { fmtCount, parseList, sameJson, truncate } from '../lib/format.js';
import { currentUser, isAdmin } from '../lib/session.js';
import { timeCell } from '../lib/widgets.js';

/** @import { ApiKey, ApiKeyCreated } from '../lib/api-types' */

/**
 * A key's limits at the gateway; null for "no limit".
 * @typedef {{allowed_routes: string[] | null, requests_per_minute: number | null, tokens_per_minute: number | null}} KeyLimits
 */

/**
 * @param {HTMLElement} main
 */
export function renderApiKeys(main) {
  const tableBox = h('div', null, h('div', { class: 'panel empty' }, 'Loading…'));
  const created = h('div');
  let usernames = new Map();
  const load = async () => {
    try {
      const [keys, users] = await Promise.all([
        listAll('/api/v1/api-keys'),
        isAdmin() ? listAll('/api/v1/users').catch(() => []) : Promise.resolve([currentUser()]),
      ]);
      usernames = new Map(users.map((u) => [u.id, u.username]));
      drawKeys(keys);
    } catch (e) {
      tableBox.replaceChildren(h('div', { class: 'panel' }, h('div', { class: 'alert' }, e.message)));
    }
  };
  /** @param {ApiKey[]} keys */
  const drawKeys = (keys) => {
    if (!keys.length) {
      tableBox.replaceChildren(h('div', { class: 'panel empty' }, 'No API keys yet.'));
      return;
    }
    const rows = keys.map((k) => {
      const expired = k.expires_at && Date.parse(k.expires_at) < Date.now();
      return h('tr', null,
        h('td', null, h('strong', null, k.name), k.description ? h('div', { class: 'muted small' }, k.description) : null),
        h('td', null, h('code', null, 'gantry_' + k.access_key + '_…')),
        isAdmin() ? h('td', null, usernames.get(k.user_id) || 'user ' + k.user_id) : null,
        h('td', null, k.expires_at ? (expired ? h('span', { class: 'badge danger' }, 'expired') : timeCell(k.expires_at)) : h('span', { class: 'muted' }, 'never')),
        h('td', { 'data-part': 'limits' }, keyLimits(k)),
        h('td', null, k.last_used_at ? timeCell(k.last_used_at) : h('span', { class: 'muted' }, 'never')),
        h('td', null, timeCell(k.created_at)),
        h('td', { class: 'actions' },
          h('button', { class: 'small', onclick: () => editKey(k, served, load) }, 'Edit'),
          h('button', { class: 'small danger', onclick: () => deleteKey(k, load) }, 'Delete')));
    });
    tableBox.replaceChildren(h('div', { class: 'panel flush' }, h('table', { 'data-api-keys': '' },
      h('thead', null, h('tr', null, h('th', null, 'Name'), h('th', null, 'Key'), isAdmin() ? h('th', null, 'Owner') : null,
        h('th', null, 'Expires'), h('th', null, 'Limits'), h('th', null, 'Last used'), h('th', null, 'Created'), h('th', null))),
      h('tbody', null, rows))));
  };

  const name = h('input', { required: true, placeholder: 'laptop', maxlength: 63 });
  const description = h('input', { placeholder: 'optional' });
  const expires = h('input', { type: 'number', min: 1, max: 3650, placeholder: 'never' });
  // The names the gateway serves now, offered in the allowed-routes hints.
  /** @type {Promise<string[]>} */
  const served = api('GET', '/v1/models').then((list) => list.data.map((/** @type {{id: string}} */ m) => m.id).sort()).catch(() => []);
  const limits = keyLimitFields(null, served);
  const error = h('div', { class: 'alert', role: 'alert' });
  const submit = h('button', { class: 'primary', type: 'submit' }, 'Create key');
  const form = h('form', {
    class: 'panel',
    onsubmit: async (event) => {
      event.preventDefault();
      error.textContent = '';
      submit.disabled = true;
      /** @type {Record<string, unknown>} */
      const body = { name: name.value.trim(), description: description.value.trim() };
      if (expires.value) body.expires_in_days = Number(expires.value);
      for (const [key, value] of Object.entries(limits.value())) {
        if (value != null) body[key] = value;
      }
      try {
        const key = await api('POST', '/api/v1/api-keys', body);
        form.reset();
        showNewKey(created, key);
        load();
      } catch (e) {
        error.textContent = e.message;
      } finally {
        submit.disabled = false;
      }
    },
  },
  h('h2', null, 'New API key'),
  h('div', { class: 'form-grid' },
    field('Name', name, 'Unique among your keys.'),
    field('Description', description),
    field('Expires after (days)', expires, 'Empty: never expires.')),
  h('h3', { class: 'form-subhead' }, 'Limits at the gateway'),
  h('div', { class: 'form-grid' }, limits.fields),
  error,
  h('div', { class: 'form-actions' }, submit));

  main.append(pageHead('API keys', h('span', { class: 'muted small' },
    isAdmin() ? 'Every user’s keys. Use a key as Authorization: Bearer <key>.' : 'Your keys. Use one as Authorization: Bearer <key>.')),
  created, form, tableBox);
  load();
  return () => {};
}

/**
 * @param {HTMLElement} box
 * @param {ApiKeyCreated} key
 */
function showNewKey(box, key) {
  const input = h('input', { readonly: true, value: key.key, 'aria-label': 'The new API key' });
  const copy = h('button', {
    class: 'primary',
    type: 'button',
    onclick: async () => {
      input.select();
      try {
        await navigator.clipboard.writeText(key.key);
      } catch (_) {
        // No clipboard API on plain http to another host: the selected text copies.
        document.execCommand('copy');
      }
      copy.textContent = 'Copied';
      setTimeout(() => (copy.textContent = 'Copy'), 2000);
    },
  }, 'Copy');
  box.replaceChildren(h('div', { class: 'panel' },
    h('h2', null, 'Key ' + key.name + ' created'),
    h('div', { class: 'alert info' }, 'Copy the key now: it is shown only this once and cannot be recovered.'),
    h('div', { class: 'secret' }, input, copy,
      h('button', { type: 'button', onclick: () => box.replaceChildren() }, 'Done'))));
  input.focus();
  input.select();
}

/**
 * A key's gateway limits as chips; "none" when it has none.
 * @param {ApiKey} key
 * @returns {HTMLSpanElement | HTMLSpanElement[]}
 */
function keyLimits(key) {
  const chips = [];
  if (key.allowed_routes != null) {
    const names = key.allowed_routes.join(', ');
    chips.push(h('span', { class: 'chip', title: 'May call only: ' + (names || 'nothing') },
      key.allowed_routes.length ? 'only ' + truncate(names, 40) : 'no routes'));
  }
  if (key.requests_per_minute != null) chips.push(h('span', { class: 'chip' }, fmtCount(key.requests_per_minute) + ' req/min'));
  if (key.tokens_per_minute != null) chips.push(h('span', { class: 'chip' }, fmtCount(key.tokens_per_minute) + ' tokens/min'));
  return chips.length ? chips : h('span', { class: 'muted' }, 'none');
}

/**
 * The limit fields of the new-key form and of the edit dialog, filled from `key` when
 * there is one. `value()` answers the three limits, null for "no limit".
 * @param {ApiKey | null} key
 * @param {Promise<string[]>} served the names the gateway serves, offered as hints
 * @returns {{fields: HTMLLabelElement[], value: () => KeyLimits}}
 */
function keyLimitFields(key, served) {
  /** @type {Partial<KeyLimits>} */
  const k = key || {};
  const routes = h('input', { placeholder: 'any', value: k.allowed_routes ? k.allowed_routes.join(', ') : '' });
  const requests = h('input', { type: 'number', min: 1, max: 1000000, step: 1, placeholder: 'no limit',
    value: k.requests_per_minute != null ? String(k.requests_per_minute) : '' });
  const tokens = h('input', { type: 'number', min: 1, max: 1000000000000, step: 1, placeholder: 'no limit',
    value: k.tokens_per_minute != null ? String(k.tokens_per_minute) : '' });
  const known = h('span');
  served.then((names) => {
    if (names.length) known.textContent = ' Served now: ' + truncate(names.join(', '), 80) + '.';
  });
  return {
    fields: [
      field('Allowed routes', routes, ['Route or model names, comma-separated; empty: any.', known]),
      field('Requests per minute', requests, 'Past it the gateway answers 429. Empty: no limit.'),
      field('Tokens per minute', tokens, 'Prompt and completion tokens. Empty: no limit.'),
    ],
    value: () => ({
      allowed_routes: routes.value.trim() ? parseList(routes.value) : null,
      requests_per_minute: requests.value ? Number(requests.value) : null,
      tokens_per_minute: tokens.value ? Number(tokens.value) : null,
    }),
  };
}

/**
 * @param {ApiKey} key
 * @param {Promise<string[]>} served
 * @param {() => void} reload
 */
function editKey(key, served, reload) {
  const description = h('input', { placeholder: 'optional', value: key.description || '' });
  // Only admins change a key's limits: others set them when they create the key.
  const limits = isAdmin() ? keyLimitFields(key, served) : null;
  openDialog('Edit key ' + key.name, [
    field('Description', description),
    limits ? limits.fields : h('p', { class: 'muted small' }, 'Limits: ', keyLimits(key),
      h('br'), 'Only an admin can change them; a new key can have its own.'),
  ], {
    submitLabel: 'Save',
    onSubmit: async () => {
      /** @type {Record<string, unknown>} */
      const update = {};
      if (description.value.trim() !== (key.description || '')) update.description = description.value.trim();
      for (const [name, value] of Object.entries(limits ? limits.value() : {})) {
        const current = key[/** @type {keyof KeyLimits} */ (name)];
        if (!sameJson(value, current == null ? null : current)) update[name] = value;
      }
      if (!Object.keys(update).length) return;
      await api('PATCH', '/api/v1/api-keys/' + key.id, update);
      toast('Key ' + key.name + ' updated.');
      reload();
    },
  });
}

/**
 * @param {ApiKey} key
 * @param {() => void} reload
 */
function deleteKey(key, reload) {
  confirmDialog('Delete key ' + key.name + '?', 'Anything using this key is refused at once.', 'Delete key', async () => {
    await api('DELETE', '/api/v1/api-keys/' + key.id);
    toast('Deleted API key “' + key.name + '”.');
    reload();
  });
}
