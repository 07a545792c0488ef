// @ts-check
// The worker pools of a cluster's page (#/clusters/<id>): machines the cluster makes and
// deletes through a provider (DigitalOcean, a program of yours run by `exec`, or `local`
// gantry workers on the server's machine) between each pool's min and max. Each pool shows
// its settings (its credentials only as "has credentials": they are write-only), its
// machines with their state, their worker's state, since when they have hosted nothing
// and what the provider or the leader last said, and its latest decisions with their
// reasons. "New pool" asks for the fields the chosen provider needs; Edit changes the
// bounds, labels, idle time or credentials; Delete asks first, saying that the pool's
// machines are deleted at the provider. The administrator of a cluster who is not an admin
// sees its pools without these actions (pools are changed by admins only). Pools have no watch stream: the cluster's page
// reads them again with the cluster, every few seconds.

import { api } from '../lib/api.js';
import { confirmDialog, openDialog } from '../lib/dialogs.js';
import { field, h, toast } from '../lib/dom.js';
import { formatLabels, parseLabels } from '../lib/format.js';
import { POOL_FIELDS, sentence } from '../lib/sentence.js';
import { labelChips, stateBadge, timeCell, WORKER_STATE_CLASS } from '../lib/widgets.js';

/** @import { PoolEvent, PoolMachine, PoolProvider, WorkerPool } from '../lib/api-types' */

/** How many of a pool's latest events its block shows. */
const EVENTS_SHOWN = 6;

/**
 * What each provider is, for the select and the chips' titles.
 * @type {Record<PoolProvider, string>}
 */
const PROVIDERS = {
  digitalocean: 'Droplets made through DigitalOcean’s API, with your API token',
  exec: 'A program of yours in the servers’ pool_commands_dir, run to create, find or delete a machine',
  local: 'gantry worker processes with simulated GPUs on the server’s own machine, for trying pools',
};

/**
 * The badge class of each machine state.
 * @type {Record<string, string>}
 */
const MACHINE_STATE_CLASS = { provisioning: 'info', initializing: 'info', registered: 'ok', deleting: 'warn' };

/**
 * The badge class of each kind of event: failures stand out.
 * @type {Record<string, string>}
 */
const EVENT_CLASS = {
  failed: 'danger',
  waiting: 'warn',
  deleting: 'warn',
  scale_up: 'info',
  created: 'info',
  registered: 'ok',
  scale_down: 'idle',
  deleted: 'idle',
};

/**
 * @typedef {object} PoolsSection
 * @property {HTMLElement} element the section, to put on the page
 * @property {() => Promise<void>} load reads the pools and their events again, and draws them
 * @property {() => void} hide for a cluster that is gone
 */

/**
 * The worker pools section of cluster `clusterId`'s page; `readOnly`: without "New pool",
 * Edit and Delete, for a cluster administrator who is not an admin.
 * @param {number} clusterId
 * @param {{readOnly?: boolean}} [options]
 * @returns {PoolsSection}
 */
export function poolsSection(clusterId, options) {
  const readOnly = Boolean(options && options.readOnly);
  const formBox = h('div');
  const listBox = h('div', { 'data-pool-list': '' }, h('div', { class: 'muted' }, 'Loading the worker pools…'));
  const closeForm = () => formBox.replaceChildren();
  const newPool = h('button', {
    class: 'primary small',
    onclick: () => {
      if (formBox.childElementCount) return closeForm();
      formBox.replaceChildren(poolForm(clusterId, closeForm, () => {
        closeForm();
        load();
      }));
      const first = /** @type {HTMLInputElement | null} */ (formBox.querySelector('input'));
      if (first) first.focus();
    },
  }, 'New pool');
  const element = h('section', { class: 'panel', 'data-pools': '' },
    h('div', { class: 'panel-head' }, h('h2', null, 'Worker pools'), h('span', { class: 'spacer' }), readOnly ? null : newPool),
    h('p', { class: 'muted small section-note' },
      'Machines this cluster makes and deletes through a provider: a new one when a pending replica fits no worker but would fit it, up to the pool’s max; '
        + 'one that has hosted nothing for the pool’s idle time is drained and deleted, down to its min.'),
    formBox, listBox);

  const load = async () => {
    try {
      /** @type {WorkerPool[]} */
      const pools = await api('GET', '/api/v1/clusters/' + clusterId + '/worker-pools');
      // A pool deleted between the two reads has no events any more: it is drawn without.
      const events = await Promise.all(pools.map((p) => api('GET', poolPath(clusterId, p.id) + '/events')
        .catch(() => /** @type {PoolEvent[]} */ ([]))));
      draw(pools, events);
    } catch (e) {
      listBox.replaceChildren(h('div', { class: 'alert' }, 'Cannot show the worker pools: ' + sentence(e)));
    }
  };

  /**
   * @param {WorkerPool[]} pools
   * @param {PoolEvent[][]} events each pool's, newest first
   */
  const draw = (pools, events) => {
    if (!pools.length) {
      listBox.replaceChildren(h('div', { class: 'muted small pools-empty' }, readOnly
        ? 'No worker pools: machines join this cluster only by its join command, which an admin has.'
        : 'No worker pools: machines join this cluster only by its join command. Add a pool to have the cluster make its own as its models need them.'));
      return;
    }
    const sorted = pools.map((pool, i) => ({ pool, events: events[i] })).sort((a, b) => a.pool.name.localeCompare(b.pool.name));
    listBox.replaceChildren(...sorted.map(({ pool, events }) => poolBlock(clusterId, pool, events, readOnly ? null : load)));
  };

  return { element, load, hide: () => element.classList.add('hidden') };
}

/**
 * The API path of a pool.
 * @param {number} clusterId
 * @param {number} poolId
 * @returns {string}
 */
function poolPath(clusterId, poolId) {
  return '/api/v1/clusters/' + clusterId + '/worker-pools/' + poolId;
}

/**
 * `n thing`, or `n things`.
 * @param {number} n
 * @param {string} thing
 * @returns {string}
 */
function count(n, thing) {
  return n + ' ' + thing + (n === 1 ? '' : 's');
}

/**
 * A labelled setting of a pool.
 * @param {string} label
 * @param {string} key `data-setting`
 * @param {import('../lib/dom-types').Child} value
 * @returns {HTMLDivElement}
 */
function setting(label, key, value) {
  return h('div', { class: 'fact', 'data-setting': key }, h('span', null, label), h('div', null, value));
}

/**
 * One pool: its head (name, provider, shape, bounds, actions), its settings, its machines
 * and its latest events.
 * @param {number} clusterId
 * @param {WorkerPool} pool
 * @param {PoolEvent[]} events newest first
 * @param {(() => void) | null} reload after Edit or Delete; null: a read-only block, without them
 * @returns {HTMLElement}
 */
function poolBlock(clusterId, pool, events, reload) {
  const ready = pool.machines.filter((m) => m.state === 'registered' && m.worker_state === 'ready').length;
  const settings = [
    setting('GPUs per machine', 'gpus', h('strong', null, pool.gpus)),
    setting('Min–max machines', 'bounds', h('strong', null, pool.min + '–' + pool.max)),
    setting('Ready', 'ready', ready + ' of ' + pool.machines.length),
    setting('Idle time', 'scale-down-after', pool.scale_down_after),
  ];
  if (pool.memory) settings.push(setting('Memory', 'memory', pool.memory));
  if (pool.provider !== 'local') {
    if (pool.instance_type) settings.push(setting(pool.provider === 'digitalocean' ? 'Size' : 'Instance type', 'instance-type', h('span', { class: 'mono small' }, pool.instance_type)));
    if (pool.image) settings.push(setting('Image', 'image', h('span', { class: 'mono small' }, pool.image)));
    if (pool.region) settings.push(setting('Region', 'region', pool.region));
  }
  if (pool.command) settings.push(setting('Command', 'command', h('span', { class: 'mono small' }, pool.command)));
  if (pool.api_url) settings.push(setting('API URL', 'api-url', h('span', { class: 'mono small' }, pool.api_url)));
  settings.push(setting('Labels', 'labels', labelChips(pool.labels)));
  settings.push(setting('Credentials', 'credentials', pool.has_credentials
    ? h('span', { class: 'badge ok', title: 'Stored sealed; never shown again. Edit the pool to replace them.' }, 'has credentials')
    : h('span', { class: 'muted' }, 'none')));

  return h('div', { class: 'pool' + (pool.deleting ? ' deleting' : ''), 'data-pool': pool.name },
    h('div', { class: 'pool-head' },
      h('h3', null, pool.name),
      h('span', { class: 'chip', title: PROVIDERS[pool.provider], 'data-part': 'provider' }, pool.provider),
      pool.deleting ? h('span', { class: 'badge warn', 'data-part': 'deleting' }, 'deleting') : null,
      h('span', { class: 'spacer' }),
      pool.deleting || !reload ? null : h('span', { class: 'page-actions' },
        h('button', { class: 'small', onclick: () => editPool(clusterId, pool, reload) }, 'Edit'),
        h('button', { class: 'small danger', onclick: () => deletePool(clusterId, pool, reload) }, 'Delete'))),
    pool.deleting
      ? h('div', { class: 'state-message pool-note' }, 'Deleted: its machines are being deleted at the provider; the pool goes once they are gone.')
      : null,
    h('div', { class: 'facts pool-settings' }, settings),
    machinesTable(pool),
    eventsList(events));
}

/**
 * A pool's machines, or what an empty pool waits for.
 * @param {WorkerPool} pool
 * @returns {HTMLElement}
 */
function machinesTable(pool) {
  if (!pool.machines.length) {
    return h('div', { class: 'muted small pool-machines-empty' }, pool.deleting
      ? 'No machines left.'
      : 'No machines: the pool makes one when a pending replica of this cluster fits no worker but would fit one of its machines'
        + (pool.min ? ', and keeps at least ' + pool.min + '.' : '.'));
  }
  const rows = pool.machines.slice().sort((a, b) => a.name.localeCompare(b.name)).map((m) => machineRow(m));
  return h('div', { class: 'table-scroll' }, h('table', { class: 'compact pool-machines', 'data-machines': '' },
    h('thead', null, h('tr', null,
      h('th', null, 'Machine'), h('th', null, 'State, and why'), h('th', null, 'Worker'),
      h('th', { class: 'opt', title: 'Since when its worker has hosted no instance' }, 'Idle since'),
      h('th', { class: 'opt' }, 'Address'), h('th', { class: 'opt' }, 'Created'))),
    h('tbody', null, rows)));
}

/**
 * @param {PoolMachine} m
 * @returns {HTMLTableRowElement}
 */
function machineRow(m) {
  return h('tr', { 'data-machine': m.name },
    h('td', null, h('strong', null, m.name),
      m.external_id ? h('div', { class: 'muted small mono', title: 'The provider’s id of it' }, m.external_id) : null),
    h('td', { 'data-part': 'state' }, stateBadge(m.state, MACHINE_STATE_CLASS),
      m.state_message ? h('div', { class: 'state-message', 'data-part': 'message' }, m.state_message) : null),
    h('td', { 'data-part': 'worker' }, m.worker_state
      ? [stateBadge(m.worker_state, WORKER_STATE_CLASS), m.worker_id != null ? [' ', h('a', { href: '#/workers/' + m.worker_id }, 'worker')] : null]
      : h('span', { class: 'muted', title: 'Its worker has not registered yet' }, '—')),
    h('td', { class: 'opt', 'data-part': 'idle' }, m.idle_since
      ? timeCell(m.idle_since)
      : h('span', { class: 'muted', title: m.worker_state ? 'It hosts instances' : '' }, '—')),
    h('td', { class: 'opt' }, m.address ? h('span', { class: 'mono small' }, m.address) : h('span', { class: 'muted' }, '—')),
    h('td', { class: 'opt' }, timeCell(m.created_at)));
}

/**
 * A pool's latest decisions, newest first, with their reasons.
 * @param {PoolEvent[]} events
 * @returns {HTMLElement}
 */
function eventsList(events) {
  const latest = events.slice(0, EVENTS_SHOWN);
  return h('div', { class: 'pool-events', 'data-events': '' },
    h('h4', null, 'Recent events'),
    latest.length
      ? h('ul', null, latest.map((e) => h('li', { 'data-event': e.kind },
        timeCell(e.at), stateBadge(e.kind, EVENT_CLASS), h('span', { class: 'event-message' }, e.message))))
      : h('div', { class: 'muted small' }, 'None yet: the leader looks at the pool every few seconds.'),
    events.length > latest.length
      ? h('div', { class: 'muted small' }, 'The latest ' + latest.length + ' of ' + events.length + '; gantry pools events lists them all.')
      : null);
}

/**
 * The new-pool form: the provider chosen shows the fields it needs.
 * @param {number} clusterId
 * @param {() => void} onCancel
 * @param {() => void} onCreated
 * @returns {HTMLFormElement}
 */
function poolForm(clusterId, onCancel, onCreated) {
  const name = h('input', { required: true, placeholder: 'h100', maxlength: 40, autocomplete: 'off' });
  const provider = /** @type {HTMLSelectElement} */ (h('select', { 'aria-label': 'Provider', value: 'digitalocean' },
    h('option', { value: 'digitalocean' }, 'digitalocean: droplets'),
    h('option', { value: 'exec' }, 'exec: a program of yours'),
    h('option', { value: 'local' }, 'local: workers on this server’s machine')));
  const gpus = h('input', { required: true, placeholder: '1x80GiB', maxlength: 40, autocomplete: 'off' });
  const memory = h('input', { placeholder: 'optional: 240GiB', maxlength: 40, autocomplete: 'off' });
  const min = h('input', { type: 'number', min: 0, max: 1000, required: true, value: '0' });
  const max = h('input', { type: 'number', min: 1, max: 1000, required: true, value: '1' });
  const idle = h('input', { placeholder: '10m', maxlength: 40, autocomplete: 'off' });
  const labels = h('input', { placeholder: 'tier=burst, zone=a', autocomplete: 'off' });
  const instanceType = h('input', { maxlength: 200, autocomplete: 'off' });
  const image = h('input', { maxlength: 200, autocomplete: 'off' });
  const region = h('input', { maxlength: 100, autocomplete: 'off' });
  const command = h('input', { placeholder: 'my-cloud.sh --zone a', maxlength: 2000, autocomplete: 'off' });
  const apiUrl = h('input', { type: 'url', placeholder: 'optional: https://api.digitalocean.com', autocomplete: 'off' });
  const credentials = h('input', { type: 'password', 'aria-label': 'Credentials', autocomplete: 'new-password' });

  const instanceField = field('Size', instanceType);
  const imageField = field('Image', image);
  const regionField = field('Region', region);
  const commandField = field('Command', command, 'Its program is the name of an executable in the servers’ pool_commands_dir; create, find or delete is added as its last argument.', 'wide');
  const apiUrlField = field('API URL', apiUrl);
  const credentialsField = field('API token', credentials);
  const providerNote = h('div', { class: 'muted small provider-note field wide' });
  const error = h('div', { class: 'alert', role: 'alert' });
  const submit = h('button', { class: 'primary', type: 'submit' }, 'Create pool');

  /**
   * Sets a field's label and hint.
   * @param {HTMLLabelElement} label
   * @param {string} text
   * @param {string} hint
   */
  const words = (label, text, hint) => {
    const [span] = label.children;
    span.textContent = text;
    let hintBox = label.querySelector('.hint');
    if (!hintBox) {
      hintBox = h('span', { class: 'hint' });
      label.append(hintBox);
    }
    hintBox.textContent = hint;
  };

  /** Shows the fields of the chosen provider, and makes those it needs required. */
  const fit = () => {
    const p = /** @type {PoolProvider} */ (provider.value);
    const cloud = p === 'digitalocean';
    for (const f of [instanceField, imageField, regionField]) f.classList.toggle('hidden', p === 'local');
    commandField.classList.toggle('hidden', p !== 'exec');
    apiUrlField.classList.toggle('hidden', !cloud);
    credentialsField.classList.toggle('hidden', p === 'local');
    instanceType.required = image.required = region.required = credentials.required = cloud;
    command.required = p === 'exec';
    if (cloud) {
      words(instanceField, 'Size', 'The droplet’s size slug, such as gpu-h100x1-80gb.');
      words(imageField, 'Image', 'An image slug, such as gpu-h100x1-base.');
      words(regionField, 'Region', 'Such as nyc2.');
      words(credentialsField, 'API token', 'A personal access token with droplet and ssh_key scopes; stored sealed, never shown again.');
      instanceType.placeholder = 'gpu-h100x1-80gb';
      image.placeholder = 'gpu-h100x1-base';
      region.placeholder = 'nyc2';
      credentials.placeholder = 'dop_v1_…';
    } else {
      words(instanceField, 'Instance type', 'Optional: handed to the command as it is.');
      words(imageField, 'Image', 'Optional: handed to the command as it is.');
      words(regionField, 'Region', 'Optional: handed to the command as it is.');
      words(credentialsField, 'Credentials', 'Optional: the command gets them as GANTRY_POOL_CREDENTIALS; stored sealed, never shown again.');
      instanceType.placeholder = image.placeholder = region.placeholder = credentials.placeholder = 'optional';
    }
    providerNote.textContent = PROVIDERS[p] + (p === 'local' ? ' (at most 8 machines).' : '.');
  };
  provider.addEventListener('change', fit);
  fit();

  return h('form', {
    class: 'pool-form',
    'data-pool-form': '',
    onsubmit: async (event) => {
      event.preventDefault();
      error.textContent = '';
      const p = provider.value;
      /** @type {Record<string, unknown>} */
      const body = {
        name: name.value.trim(),
        provider: p,
        gpus: gpus.value.trim(),
        min: Number(min.value),
        max: Number(max.value),
        labels: parseLabels(labels.value),
      };
      if (memory.value.trim()) body.memory = memory.value.trim();
      if (idle.value.trim()) body.scale_down_after = idle.value.trim();
      if (p !== 'local') {
        body.instance_type = instanceType.value.trim();
        body.image = image.value.trim();
        body.region = region.value.trim();
        if (credentials.value) body.credentials = credentials.value;
      }
      if (p === 'exec') body.command = command.value.trim();
      if (p === 'digitalocean' && apiUrl.value.trim()) body.api_url = apiUrl.value.trim();
      submit.disabled = true;
      try {
        /** @type {WorkerPool} */
        const created = await api('POST', '/api/v1/clusters/' + clusterId + '/worker-pools', body);
        toast('Pool ' + created.name + ' created: ' + (created.min
          ? 'the leader makes its first ' + count(created.min, 'machine') + ' now.'
          : 'it makes machines as pending replicas need them.'));
        onCreated();
      } catch (e) {
        error.textContent = sentence(e, POOL_FIELDS);
        submit.disabled = false;
      }
    },
  },
  h('h3', null, 'New worker pool'),
  h('div', { class: 'form-grid' },
    field('Name', name, 'Its machines are named <name>-<n>.'),
    field('Provider', provider),
    providerNote,
    // What the provider needs, then what every pool has.
    commandField, instanceField, imageField, regionField, credentialsField, apiUrlField,
    field('GPUs per machine', gpus, 'COUNTxMEMORY: what the scheduler counts a new machine as.'),
    field('Memory per machine', memory),
    field('Min machines', min, 'Kept even when idle.'),
    field('Max machines', max, 'Each costs money while it lives.'),
    field('Idle time', idle, 'Before a machine that hosts nothing is deleted; 10m when empty.'),
    field('Labels', labels, 'Every machine’s worker carries them, for models’ worker selectors.')),
  error,
  h('div', { class: 'form-actions' }, submit, h('button', { type: 'button', onclick: onCancel }, 'Cancel')));
}

/**
 * The dialog that changes a pool's bounds, labels, idle time or credentials.
 * @param {number} clusterId
 * @param {WorkerPool} pool
 * @param {() => void} reload
 */
function editPool(clusterId, pool, reload) {
  const min = h('input', { type: 'number', min: 0, max: 1000, required: true, value: String(pool.min) });
  const max = h('input', { type: 'number', min: 1, max: 1000, required: true, value: String(pool.max) });
  const labels = h('input', { value: formatLabels(pool.labels, ', '), placeholder: 'tier=burst', autocomplete: 'off' });
  const idle = h('input', { value: pool.scale_down_after, required: true, autocomplete: 'off' });
  const credentials = h('input', {
    type: 'password',
    'aria-label': 'New credentials',
    autocomplete: 'new-password',
    placeholder: pool.has_credentials ? 'leave empty to keep them' : 'none',
  });
  openDialog('Edit pool ' + pool.name, [
    h('div', { class: 'form-grid' },
      field('Min machines', min),
      field('Max machines', max),
      field('Labels', labels, 'For machines made from now on; registered workers keep theirs.', 'wide'),
      field('Idle time', idle, 'Before a machine that hosts nothing is deleted, such as 10m.'),
      field('New credentials', credentials, pool.has_credentials
        ? 'It has credentials: these replace them. Never shown again.'
        : 'It has none. Never shown once set.')),
  ], {
    submitLabel: 'Save',
    onSubmit: async () => {
      /** @type {Record<string, unknown>} */
      const update = {};
      if (Number(min.value) !== pool.min) update.min = Number(min.value);
      if (Number(max.value) !== pool.max) update.max = Number(max.value);
      const wanted = parseLabels(labels.value);
      if (formatLabels(wanted, ',') !== formatLabels(pool.labels, ',')) update.labels = wanted;
      if (idle.value.trim() !== pool.scale_down_after) update.scale_down_after = idle.value.trim();
      if (credentials.value) update.credentials = credentials.value;
      if (!Object.keys(update).length) return;
      try {
        await api('PATCH', poolPath(clusterId, pool.id), update);
      } catch (e) {
        throw new Error(sentence(e, POOL_FIELDS));
      }
      toast('Pool ' + pool.name + ' saved.');
      reload();
    },
  });
}

/**
 * Asks before deleting a pool, saying that its machines are deleted at the provider and
 * the instances on them stop.
 * @param {number} clusterId
 * @param {WorkerPool} pool
 * @param {() => void} reload
 */
function deletePool(clusterId, pool, reload) {
  const machines = pool.machines.length;
  confirmDialog('Delete pool ' + pool.name + '?',
    machines
      ? 'Its ' + count(machines, 'machine') + (machines === 1 ? ' will be deleted at the provider, and the instances on it stop' : ' will be deleted at the provider, and the instances on them stop') + '; then the pool goes.'
      : 'It has no machines; it goes at the leader’s next look. Machines that join by the cluster’s join command are not affected.',
    'Delete pool',
    async () => {
      try {
        await api('DELETE', poolPath(clusterId, pool.id));
      } catch (e) {
        throw new Error(sentence(e));
      }
      toast('Pool ' + pool.name + ' is being deleted' + (machines ? ', with its machines.' : '.'));
      reload();
    });
}
