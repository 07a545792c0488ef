// @ts-check
// The routes screen (admins): the names clients call, each with its targets (deployed
// models and providers' models, by priority and weight), what share of the last day's
// traffic each target served, and the form that edits a route's targets in place.

import { api, itemsOf } from '../lib/api.js';
import { confirmDialog } from '../lib/dialogs.js';
import { field, h, pageHead, toast } from '../lib/dom.js';
import { fmtCount, sameJson } from '../lib/format.js';
import { combine, follow, live } from '../lib/live.js';
import { timeCell } from '../lib/widgets.js';

/** @import { Provider, Route, RouteTarget, UsageReport } from '../lib/api-types' */

/**
 * A row of the targets editor: `value()` reads the target it says.
 * @typedef {object} TargetRow
 * @property {HTMLTableRowElement} element
 * @property {HTMLButtonElement} remove
 * @property {(names: string[]) => void} offerModels
 * @property {() => void} focus
 * @property {() => RouteTarget} value
 */

/** How often the routes screen re-reads the routes and their last day's traffic. */
const ROUTES_POLL_MS = 10000;

/**
 * How accounting and `x-gantry-target` name a target: the model, or provider/model.
 * @param {RouteTarget} target
 * @returns {string}
 */
function targetLabel(target) {
  return target.provider ? target.provider + '/' + target.model : target.model;
}

/**
 * Each target's planned share of its priority's traffic (weight over the weights of
 * its priority), and which priority is the first: the others are fallbacks.
 * @param {RouteTarget[]} targets
 * @returns {{share: number, fallback: boolean}[]}
 */
function plannedShares(targets) {
  const sums = new Map();
  for (const t of targets) sums.set(t.priority, (sums.get(t.priority) || 0) + t.weight);
  const first = Math.min(...targets.map((t) => t.priority));
  return targets.map((t) => ({ share: sums.get(t.priority) ? t.weight / sums.get(t.priority) : 0, fallback: t.priority !== first }));
}

/**
 * A share as a percent: "25 %", "<1 %".
 * @param {number} share
 * @returns {string}
 */
function fmtShare(share) {
  const percent = share * 100;
  return (percent > 0 && percent < 1 ? '<1' : Math.round(percent)) + ' %';
}

/**
 * @param {HTMLElement} main
 */
export function renderRoutes(main) {
  const formBox = h('div');
  const tableBox = h('div', null, h('div', { class: 'panel empty' }, 'Loading…'));
  /** @type {{routes: Route[], providers: Provider[], usage: Map<string, UsageReport | null>} | null} the last read */
  let state = null;
  /** @type {Error | null} why the last read failed */
  let loadError = null;
  /** @type {ReturnType<typeof routeForm> | null} the open form, which follows the deployed models too */
  let form = null;
  const closeForm = () => {
    form = null;
    formBox.replaceChildren();
  };
  /** @param {Route | null} route */
  const openForm = (route) => {
    const providers = state ? state.providers : [];
    form = routeForm(route, providers, () => {
      closeForm();
      load();
    });
    formBox.replaceChildren(form.element);
    // The form sits under the page's head: show both.
    window.scrollTo({ top: 0 });
    const first = /** @type {HTMLInputElement | null} */ (formBox.querySelector('input:not([disabled])'));
    if (first) first.focus();
  };
  main.append(pageHead('Routes',
    h('span', { class: 'muted small' }, 'Model names clients call, served by deployed models and providers.'),
    h('button', { class: 'primary', onclick: () => (formBox.querySelector('[data-route-form=""]') ? closeForm() : openForm(null)) }, 'New route')),
  formBox, tableBox);

  const draw = () => {
    if (form) form.refreshModels();
    if (!state) {
      tableBox.replaceChildren(loadError
        ? h('div', { class: 'panel' }, h('div', { class: 'alert' }, loadError.message))
        : h('div', { class: 'panel empty' }, 'Loading…'));
      return;
    }
    const notices = loadError ? [h('div', { class: 'alert' }, 'Cannot refresh the routes: ' + loadError.message)] : [];
    if (!state.routes.length) {
      tableBox.replaceChildren(...notices, h('div', { class: 'panel empty' },
        'No routes yet: every deployed model answers to its own name. A route gives one name several targets, with weights and fallbacks.'));
      return;
    }
    const deployed = new Set(live.models.values().map((m) => m.name));
    const usageOf = state.usage;
    const rows = state.routes.map((r) => {
      const usage = usageOf.get(r.name);
      /** @type {Map<string, number>} requests by target label */
      const traffic = new Map();
      let served = 0;
      for (const t of (usage && usage.targets) || []) {
        if (t.model !== r.name) continue;
        traffic.set(t.target, (traffic.get(t.target) || 0) + t.requests);
        served += t.requests;
      }
      const planned = plannedShares(r.targets);
      const order = r.targets.map((t, i) => i).sort((a, b) => r.targets[a].priority - r.targets[b].priority || a - b);
      const targetRows = order.map((i) => {
        const t = r.targets[i];
        const label = targetLabel(t);
        const got = traffic.get(label) || 0;
        const missing = !t.provider && live.models.loaded && !deployed.has(t.model);
        return h('tr', { 'data-target': label },
          h('td', null,
            h('span', { class: 'badge ' + (t.provider ? 'idle' : 'info') }, t.provider ? 'provider' : 'local'), ' ',
            h('span', { class: 'mono small' }, label),
            missing ? h('span', { class: 'badge warn', title: 'No deployed model has this name: the route skips it' }, 'not deployed') : null),
          h('td', { class: 'num', 'data-part': 'priority' }, t.priority,
            planned[i].fallback ? h('span', { class: 'muted small' }, ' fallback') : null),
          h('td', { class: 'num', 'data-part': 'weight' }, t.weight,
            h('span', { class: 'muted small', title: 'Its share of its priority’s traffic while all of them can answer' }, ' (' + fmtShare(planned[i].share) + ')')),
          h('td', { 'data-part': 'traffic' }, trafficShare(got, served, usage)));
      });
      return h('tr', { 'data-route': r.name },
        h('td', null, h('strong', null, r.name), r.description ? h('div', { class: 'muted small' }, r.description) : null),
        h('td', { class: 'targets-cell' }, h('table', { class: 'compact targets' },
          h('thead', null, h('tr', null,
            h('th', null, 'Target'), h('th', { class: 'num col-priority' }, 'Priority'), h('th', { class: 'num col-weight' }, 'Weight'),
            h('th', { class: 'col-traffic' }, 'Traffic, last 24 h'))),
          h('tbody', null, targetRows))),
        h('td', { class: 'num', 'data-part': 'requests' }, usage ? fmtCount(usage.total.requests) : h('span', { class: 'muted' }, '—')),
        h('td', null, timeCell(r.updated_at)),
        h('td', { class: 'actions' },
          h('a', { class: 'button small', href: '#/playground?model=' + encodeURIComponent(r.name), title: 'Chat with ' + r.name }, 'Chat'),
          h('button', { class: 'small', onclick: () => openForm(r) }, 'Edit'),
          h('button', { class: 'small danger', onclick: () => deleteRoute(r, load) }, 'Delete')));
    });
    tableBox.replaceChildren(...notices, h('div', { class: 'panel flush' }, h('table', { 'data-routes': '' },
      h('thead', null, h('tr', null,
        h('th', null, 'Route'), h('th', null, 'Targets (lower priority first; weights split a priority)'),
        h('th', { class: 'num' }, 'Requests, 24 h'), h('th', null, 'Updated'), h('th', null))),
      h('tbody', null, rows))));
  };

  let stopped = false;
  /** @type {ReturnType<typeof setTimeout> | undefined} the next read */
  let timer;
  const load = async () => {
    clearTimeout(timer);
    try {
      /** @type {[Route[], Provider[]]} */
      const [routes, providers] = await Promise.all([
        api('GET', '/api/v1/model-routes').then(itemsOf),
        api('GET', '/api/v1/model-providers').then(itemsOf),
      ]);
      const from = encodeURIComponent(new Date(Date.now() - 86400000).toISOString());
      // One report per route; a route whose report fails shows no traffic.
      const reports = await Promise.all(routes.map((r) =>
        api('GET', '/api/v1/usage?from=' + from + '&model=' + encodeURIComponent(r.name)).catch(() => null)));
      state = { routes, providers, usage: new Map(routes.map((r, i) => [r.name, reports[i]])) };
      loadError = null;
    } catch (e) {
      loadError = e;
    }
    if (stopped) return;
    draw();
    timer = setTimeout(load, ROUTES_POLL_MS);
  };
  load();
  return combine(follow([live.models, live.instances], draw), () => {
    stopped = true;
    clearTimeout(timer);
  });
}

/**
 * A target's share of its route's requests: a bar, the percent and the count.
 * @param {number} requests
 * @param {number} total
 * @param {UsageReport | null | undefined} usage
 * @returns {HTMLElement}
 */
function trafficShare(requests, total, usage) {
  if (!usage) return h('span', { class: 'muted small', title: 'The usage report could not be read' }, '—');
  if (!total) return h('span', { class: 'muted small' }, 'no requests');
  const fill = h('div');
  fill.style.width = ((requests / total) * 100).toFixed(1) + '%';
  return h('div', { class: 'share', title: fmtCount(requests) + ' of ' + fmtCount(total) + ' requests' },
    h('div', { class: 'meter' }, fill),
    h('span', { class: 'small' }, fmtShare(requests / total)),
    h('span', { class: 'muted small' }, fmtCount(requests) + ' req'));
}

/**
 * The form that creates a route (`route` null) or edits one: its targets are rows of
 * kind, model, weight and priority, added and removed in place, with the plan they
 * make written under them. Answers `{element, refreshModels()}`: the latter offers the
 * models deployed now (they may arrive after the form opens).
 * @param {Route | null} route
 * @param {Provider[]} providers
 * @param {() => void} onDone
 * @returns {{element: HTMLFormElement, refreshModels: () => void}}
 */
function routeForm(route, providers, onDone) {
  const editing = route != null;
  const r = route || { name: '', description: '', targets: [] };
  const name = h('input', { required: !editing, disabled: editing, placeholder: 'chat', maxlength: 63, value: r.name, autocomplete: 'off' });
  const description = h('input', { placeholder: 'optional', value: r.description });
  const body = h('tbody');
  const plan = h('div', { class: 'route-plan muted small', 'data-plan': '' });
  const idle = h('div', { class: 'alert warn hidden', 'data-route-warning': '' });
  const error = h('div', { class: 'alert', role: 'alert' });
  const submit = h('button', { class: 'primary', type: 'submit' }, editing ? 'Save' : 'Create route');
  const deployedNames = () => live.models.values().map((m) => m.name).sort();
  let modelNames = deployedNames();
  /** @type {TargetRow[]} */
  const rows = [];

  const renumber = () => {
    rows.forEach((row, i) => {
      row.element.dataset.targetRow = String(i);
      row.remove.setAttribute('aria-label', 'Remove target ' + (i + 1));
      row.remove.disabled = rows.length === 1;
    });
  };
  const describePlan = () => {
    const targets = rows.map((row) => row.value()).filter((t) => t.model);
    const warning = idleWarning(targets, editing ? r.name : name.value.trim() || 'the route');
    idle.textContent = warning || '';
    idle.classList.toggle('hidden', !warning);
    if (!targets.length) {
      plan.textContent = 'Add a target.';
      return;
    }
    const planned = plannedShares(targets);
    const priorities = Array.from(new Set(targets.map((t) => t.priority))).sort((a, b) => a - b);
    plan.replaceChildren(...priorities.map((priority, n) => h('div', null,
      h('strong', null, n === 0 ? 'First' : 'Then, if none of those can answer'),
      ' (priority ' + priority + '): ',
      targets.map((t, i) => /** @type {[RouteTarget, number]} */ ([t, i])).filter(([t]) => t.priority === priority)
        .map(([t, i]) => targetLabel(t) + ' ' + fmtShare(planned[i].share)).join(', '))));
  };
  /** @param {RouteTarget} target */
  const addRow = (target) => {
    const row = targetRow(target, modelNames, providers, () => {
      rows.splice(rows.indexOf(row), 1);
      row.element.remove();
      renumber();
      describePlan();
    }, describePlan);
    rows.push(row);
    body.append(row.element);
    renumber();
    describePlan();
    return row;
  };
  for (const t of r.targets) addRow(t);
  if (!rows.length) addRow({ model: modelNames[0] || '', weight: 1, priority: 0 });
  name.addEventListener('input', describePlan);

  const form = h('form', {
    class: 'panel',
    'data-route-form': editing ? r.name : '',
    onsubmit: async (event) => {
      event.preventDefault();
      error.textContent = '';
      rows.forEach((row) => row.element.classList.remove('invalid'));
      const targets = rows.map((row) => row.value());
      const empty = targets.findIndex((t) => !t.model || (t.provider === ''));
      if (empty >= 0) {
        rows[empty].element.classList.add('invalid');
        error.textContent = 'Target ' + (empty + 1) + ' needs a ' + (targets[empty].provider === '' ? 'provider' : 'model') + '.';
        return;
      }
      submit.disabled = true;
      try {
        if (editing) {
          const update = {};
          if (description.value.trim() !== r.description) update.description = description.value.trim();
          if (!sameJson(targets, r.targets.map(normalTarget))) update.targets = targets;
          if (Object.keys(update).length) {
            await api('PATCH', '/api/v1/model-routes/' + encodeURIComponent(r.name), update);
            toast('Route ' + r.name + ' updated.');
          }
        } else {
          const created = await api('POST', '/api/v1/model-routes', { name: name.value.trim(), description: description.value.trim(), targets });
          toast(idleWarning(targets, created.name)
            ? 'Route ' + created.name + ' created: it answers through each target once that one runs.'
            : 'Route ' + created.name + ' created: clients may call it now.');
        }
        onDone();
      } catch (e) {
        // The API names the field it refused (targets[1].weight): mark that row.
        const at = /targets\[(\d+)\]/.exec(e.message);
        if (at && rows[Number(at[1])]) rows[Number(at[1])].element.classList.add('invalid');
        error.textContent = e.message;
        submit.disabled = false;
      }
    },
  },
  h('h2', null, editing ? 'Edit route ' + r.name : 'New route'),
  h('div', { class: 'form-grid' },
    field('Name', name, editing ? 'What clients send as “model”; it cannot change.' : 'What clients send as “model”. A deployed model’s name makes the route replace it.'),
    field('Description', description)),
  h('h3', { class: 'form-subhead' }, 'Targets'),
  h('p', { class: 'muted small form-note' },
    'The gateway sends each request to the targets of the lowest priority number that can answer, split by weight; a higher number is a fallback for when none of the lower ones can.'),
  h('div', { class: 'target-editor-box' }, h('table', { class: 'compact target-editor' },
    h('thead', null, h('tr', null,
      h('th', null, 'Kind'), h('th', null, 'Model'), h('th', null, 'Weight'), h('th', null, 'Priority'), h('th', null))),
    body)),
  h('div', { class: 'form-actions' }, h('button', {
    type: 'button',
    class: 'small',
    onclick: () => {
      const used = new Set(rows.map((x) => x.value()).filter((t) => t.provider == null).map((t) => t.model));
      const unused = modelNames.find((n) => !used.has(n));
      // Every deployed model is a target already: the next is likely a provider's.
      const row = addRow({
        model: unused || '',
        provider: unused || !providers.length ? null : providers[0].name,
        weight: 1,
        priority: rows.length ? Math.max(...rows.map((x) => x.value().priority)) : 0,
      });
      row.focus();
    },
  }, 'Add target')),
  plan,
  idle,
  error,
  h('div', { class: 'form-actions' },
    submit,
    h('button', { type: 'button', onclick: () => onDone() }, 'Cancel')));
  return {
    element: form,
    refreshModels: () => {
      const now = deployedNames();
      // Whether the targets run changes without the names changing.
      describePlan();
      if (sameJson(now, modelNames)) return;
      modelNames = now;
      rows.forEach((row) => row.offerModels(modelNames));
      describePlan();
    },
  };
}

/**
 * What to say of a route's deployed-model targets that have no running instance: a route
 * may name them (it is accepted), but answers through them only once they run. Null when
 * every one runs.
 * @param {RouteTarget[]} targets
 * @param {string} routeName
 * @returns {string | null}
 */
function idleWarning(targets, routeName) {
  const running = new Set(live.instances.values().filter((i) => i.state === 'running').map((i) => i.model_name));
  const local = targets.filter((t) => !t.provider && t.model);
  const idle = [...new Set(local.filter((t) => !running.has(t.model)).map((t) => t.model))];
  if (!idle.length) return null;
  const one = idle.length === 1;
  const list = one ? idle[0] : idle.slice(0, -1).join(', ') + ' and ' + idle[idle.length - 1];
  const none = local.length === targets.length && idle.length === new Set(local.map((t) => t.model)).size;
  return list + (one ? ' has' : ' have') + ' no running instance: the route answers through ' + (one ? 'it only once it runs.' : 'them only once they run.')
    + (none ? ' Until then, clients calling ' + routeName + ' get errors.' : '');
}

/**
 * A target as the form sends it: defaults spelled out, no provider key for a local one.
 * @param {RouteTarget} t
 * @returns {RouteTarget}
 */
function normalTarget(t) {
  const weight = t.weight == null ? 1 : t.weight;
  const priority = t.priority == null ? 0 : t.priority;
  // In this key order: the form compares targets as JSON.
  return t.provider != null
    ? { model: t.model, provider: t.provider, weight, priority }
    : { model: t.model, weight, priority };
}

/** Numbers the provider-model lists of the targets' rows, whose inputs name them by id. */
let datalistCount = 0;

/**
 * One row of the targets editor. A local target picks a deployed model; a provider
 * target picks a provider and types its model id, with the provider's listed models
 * offered. Answers `{element, value(), focus(), remove, offerModels(names)}`.
 * @param {RouteTarget} target
 * @param {string[]} modelNames
 * @param {Provider[]} providers
 * @param {() => void} onRemove
 * @param {() => void} onChange
 * @returns {TargetRow}
 */
function targetRow(target, modelNames, providers, onRemove, onChange) {
  const t = normalTarget(target);
  const kind = h('select', { 'aria-label': 'Kind', value: t.provider != null ? 'provider' : 'local' },
    h('option', { value: 'local' }, 'Deployed model'),
    h('option', { value: 'provider', disabled: !providers.length && t.provider == null }, providers.length ? 'Provider' : 'Provider (none yet)'));
  const local = h('select', { 'aria-label': 'Deployed model' });
  // The deployed models, and the chosen one though it is not (a route may name a model
  // before it is deployed, or after it is deleted).
  /** @param {string[]} deployed */
  const offerModels = (deployed) => {
    const chosen = local.value || (t.provider == null ? t.model : '');
    const names = chosen && !deployed.includes(chosen) ? deployed.concat([chosen]) : deployed;
    local.replaceChildren(...(names.length
      ? names.map((n) => h('option', { value: n }, n + (deployed.includes(n) ? '' : ' (not deployed)')))
      : [h('option', { value: '' }, 'no models deployed')]));
    local.value = chosen || names[0] || '';
  };
  offerModels(modelNames);
  const providerNames = providers.map((p) => p.name);
  if (t.provider != null && !providerNames.includes(t.provider)) providerNames.push(t.provider);
  const provider = h('select', { 'aria-label': 'Provider', value: t.provider || providerNames[0] || '' },
    providerNames.map((n) => h('option', { value: n }, n)));
  const listId = 'provider-models-' + ++datalistCount;
  const list = h('datalist', { id: listId });
  const remote = h('input', { 'aria-label': 'Provider model', list: listId, placeholder: 'model id', value: t.provider != null ? t.model : '', autocomplete: 'off' });
  const weight = h('input', { type: 'number', 'aria-label': 'Weight', min: 0, max: 10000, step: 1, required: true, value: String(t.weight) });
  const priority = h('input', { type: 'number', 'aria-label': 'Priority', min: 0, max: 100, step: 1, required: true, value: String(t.priority) });
  const remove = h('button', { type: 'button', class: 'small', title: 'Remove this target', onclick: () => onRemove() }, '×');
  const localBox = h('div', { class: 'target-model' }, local);
  const remoteBox = h('div', { class: 'target-model' }, provider, remote, list);
  const sync = () => {
    const isProvider = kind.value === 'provider';
    if (!isProvider && !local.value && local.options.length) local.selectedIndex = 0;
    localBox.classList.toggle('hidden', isProvider);
    remoteBox.classList.toggle('hidden', !isProvider);
    const chosen = providers.find((p) => p.name === provider.value);
    list.replaceChildren(...(chosen ? chosen.models : []).map((m) => h('option', { value: m })));
    onChange();
  };
  kind.addEventListener('change', sync);
  provider.addEventListener('change', sync);
  for (const input of [local, remote, weight, priority]) input.addEventListener('input', onChange);
  const element = h('tr', null,
    h('td', null, kind),
    h('td', null, localBox, remoteBox),
    h('td', null, weight),
    h('td', null, priority),
    h('td', { class: 'actions' }, remove));
  // The first sync's onChange runs before the row is in the form's list: harmless.
  sync();
  return {
    element,
    remove,
    offerModels,
    focus: () => (kind.value === 'provider' ? remote : local).focus(),
    value: () => (kind.value === 'provider'
      ? { model: remote.value.trim(), provider: provider.value, weight: Number(weight.value), priority: Number(priority.value) }
      : { model: local.value, weight: Number(weight.value), priority: Number(priority.value) }),
  };
}

/**
 * @param {Route} route
 * @param {() => void} reload
 */
function deleteRoute(route, reload) {
  confirmDialog('Delete route ' + route.name + '?',
    'Clients that call ' + route.name + ' are refused at once, unless a deployed model has that name: it answers again then.',
    'Delete route',
    async () => {
      await api('DELETE', '/api/v1/model-routes/' + encodeURIComponent(route.name));
      toast('Deleted route “' + route.name + '”.');
      reload();
    });
}
