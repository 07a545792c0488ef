// @ts-check
// gantry web UI: a dependency-free single-page app over the management API, in ES modules
// the server serves as they are (no build step). This is its entry: it asks who is logged
// in, leads to the login or password screens when needed, and routes between the screens
// of the console, one module each under screens/; what they share is under lib/.
//
// It calls only the JSON API the CLI and scripts use, authenticated by the
// `gantry_session` cookie that POST /auth/login sets. Screens are chosen by the URL
// hash (#/models, #/instances/12/logs, ...), so the server serves one page. Every
// element is built with DOM calls (never innerHTML), so names, labels and log lines
// coming from the API are always text. Lists that change on their own (instances,
// workers, models) follow the API's ?watch=true NDJSON streams and fall back to
// polling when a stream cannot be held open; lists without a stream (servers, model
// files) are re-read every few seconds while their screen is open.

import { api, onAuthFailure } from './lib/api.js';
import { h, pageElement, toast } from './lib/dom.js';
import { stopLiveLists } from './lib/live.js';
import { administersSomeCluster, currentUser, isAdmin, session } from './lib/session.js';
import { stopTransfers } from './lib/transfers.js';
import { applyTheme, storedTheme, themeControl } from './lib/theme.js';
import { brand } from './lib/widgets.js';
import { renderAccount } from './screens/account.js';
import { renderApiKeys } from './screens/api-keys.js';
import { renderCatalog } from './screens/catalog.js';
import { renderClusters } from './screens/clusters.js';
import { renderInstances } from './screens/instances.js';
import { showFatal, showLogin, showPasswordChange } from './screens/login.js';
import { renderModelFiles } from './screens/model-files.js';
import { renderModel } from './screens/model.js';
import { renderModels } from './screens/models.js';
import { renderOverview } from './screens/overview.js';
import { renderPlayground } from './screens/playground.js';
import { renderProviders } from './screens/providers.js';
import { renderRoutes } from './screens/routes.js';
import { renderServers } from './screens/servers.js';
import { renderUsage } from './screens/usage.js';
import { renderUsers } from './screens/users.js';
import { renderWorkers } from './screens/workers.js';

/** @import { ApiError } from './lib/api.js' */

/**
 * Draws a screen into `main`, from the rest of the hash's path and its query; answers what
 * stops it (timers, subscriptions) when another screen takes its place.
 * @typedef {(main: HTMLElement, parts: string[], params: URLSearchParams) => (() => void) | void} Render
 */

/**
 * A screen of the navigation: `admin` ones are offered to admins only, `clusterAdmin` ones
 * to admins and the administrators of some cluster (who see their clusters' part of it),
 * `hidden` ones are reached by a link instead.
 * @typedef {{id: string, title: string, render: Render, admin?: boolean, clusterAdmin?: boolean, hidden?: boolean}} Screen
 */

/** @type {Screen[]} */
const SCREENS = [
  { id: 'overview', title: 'Overview', render: renderOverview },
  // A model's own page is #/models/<name>.
  { id: 'models', title: 'Models', render: (main, parts, params) => (parts[0] ? renderModel(main, parts[0]) : renderModels(main, params)) },
  { id: 'instances', title: 'Instances', render: renderInstances },
  { id: 'catalog', title: 'Catalog', render: renderCatalog },
  { id: 'routes', title: 'Routes', render: renderRoutes, admin: true },
  { id: 'providers', title: 'Providers', render: renderProviders, admin: true },
  { id: 'playground', title: 'Playground', render: renderPlayground },
  { id: 'usage', title: 'Usage', render: renderUsage },
  { id: 'workers', title: 'Workers', render: renderWorkers, clusterAdmin: true },
  // A cluster's own page, with how a machine joins it, is #/clusters/<id>.
  { id: 'clusters', title: 'Clusters', render: renderClusters, clusterAdmin: true },
  { id: 'model-files', title: 'Model files', render: renderModelFiles, admin: true },
  { id: 'servers', title: 'Servers', render: renderServers, admin: true },
  { id: 'api-keys', title: 'API keys', render: renderApiKeys },
  { id: 'users', title: 'Users', render: renderUsers, admin: true },
  { id: 'account', title: 'Account', render: renderAccount, hidden: true },
];

/**
 * The navigation's groups, in order, with their screens in order: what a person serves,
 * what runs where, and who may call what. A screen in none is listed under the last.
 * @type {{title: string, screens: string[]}[]}
 */
const NAV_GROUPS = [
  { title: 'Serve', screens: ['overview', 'models', 'catalog', 'playground'] },
  { title: 'Operate', screens: ['instances', 'workers', 'clusters', 'model-files', 'servers'] },
  { title: 'Access', screens: ['api-keys', 'users', 'routes', 'providers', 'usage'] },
];

/**
 * Whether the logged-in user may open `screen`.
 * @param {Screen} screen
 * @returns {boolean}
 */
function mayOpen(screen) {
  if (screen.admin) return Boolean(isAdmin());
  if (screen.clusterAdmin) return administersSomeCluster();
  return true;
}

/**
 * The groups of `screens` as the navigation lists them; empty groups left out.
 * @param {Screen[]} screens
 * @returns {{title: string, screens: Screen[]}[]}
 */
function navGroups(screens) {
  const groups = NAV_GROUPS.map((g) => ({
    title: g.title,
    screens: /** @type {Screen[]} */ (g.screens.map((id) => screens.find((s) => s.id === id)).filter(Boolean)),
  }));
  const grouped = new Set(NAV_GROUPS.flatMap((g) => g.screens));
  groups[groups.length - 1].screens.push(...screens.filter((s) => !grouped.has(s.id)));
  return groups.filter((g) => g.screens.length);
}

/** True from a refused session's redirect until the next login: later refusals are its echo. */
let authRedirecting = false;

/** @type {(() => void) | null} stops the screen shown now */
let currentCleanup = null;

/** @type {{nav: HTMLElement, main: HTMLElement, menu: HTMLButtonElement, menuLabel: HTMLElement} | null} the console's frame, once started */
let shell = null;

/**
 * Routes 401 and 403 password_change_required to the screens that resolve them.
 * @param {ApiError} error
 */
function authFailure(error) {
  if (!session.user || authRedirecting) return;
  if (error.status === 401) {
    authRedirecting = true;
    endSession();
    login('Your session has ended; log in again.');
  } else if (error.status === 403 && error.code === 'password_change_required') {
    authRedirecting = true;
    session.user.require_password_change = true;
    stopAll();
    changePassword();
  }
}

function stopAll() {
  stopLiveLists();
  if (currentCleanup) currentCleanup();
  currentCleanup = null;
}

function endSession() {
  stopAll();
  // The next chunk would be refused anyway; the uploads wait for “Resume”.
  stopTransfers();
  session.user = null;
}

async function boot() {
  try {
    session.user = await api('GET', '/auth/me', undefined, { auth: false });
  } catch (e) {
    if (e.status === 401) login();
    else showFatal(e, boot);
    return;
  }
  if (currentUser().require_password_change) changePassword();
  else startApp();
}

/**
 * The login form; once it succeeded, the console or the forced password change.
 * @param {string} [notice] why the form is shown
 */
function login(notice) {
  showLogin(notice, (password) => {
    authRedirecting = false;
    if (currentUser().require_password_change) changePassword(password);
    else startApp();
  });
}

/**
 * The password change an account must make before anything else.
 * @param {string} [knownCurrent] the current password, just typed into the login form
 */
function changePassword(knownCurrent) {
  showPasswordChange(knownCurrent, {
    changed: () => {
      authRedirecting = false;
      toast('Password changed.');
      startApp();
    },
    logout,
    ended: () => {
      endSession();
      login('Your session has ended; log in again.');
    },
  });
}

async function logout() {
  try {
    await api('POST', '/auth/logout', undefined, { auth: false });
  } catch (_) {
    // The session may already be gone; the login screen is right either way.
  }
  endSession();
  location.hash = '#/overview';
  login('You are logged out.');
}

function startApp() {
  authRedirecting = false;
  // A sidebar of groups on a wide screen; on a narrow one, a menu the top bar's button opens.
  const nav = h('nav', {
    class: 'nav',
    id: 'nav',
    'aria-label': 'Screens',
    // Choosing the screen shown already changes no hash: close the menu here too.
    onclick: (event) => {
      if (/** @type {Element} */ (event.target).closest('a')) setMenu(false);
    },
  },
    navGroups(SCREENS.filter((s) => !s.hidden && mayOpen(s))).map((g) =>
      h('div', { class: 'nav-group' },
        h('div', { class: 'nav-group-title' }, g.title),
        g.screens.map((s) => h('a', { href: '#/' + s.id, 'data-screen': s.id }, s.title)))),
    themeControl());
  const main = h('main', { id: 'main' });
  const menuLabel = h('span', null, 'Menu');
  const menu = h('button', {
    type: 'button',
    class: 'menu-button',
    'aria-controls': 'nav',
    'aria-expanded': 'false',
    title: 'Screens',
    onclick: () => setMenu(!nav.classList.contains('open')),
  }, h('span', { class: 'menu-icon', 'aria-hidden': 'true' }, '☰'), menuLabel);
  const top = h('header', { class: 'topbar' },
    menu,
    brand(),
    h('span', { class: 'spacer' }),
    h('div', { class: 'session' },
      h('span', { id: 'live', class: 'live' }, 'idle'),
      h('a', { href: '#/account', title: 'Account and password' },
        currentUser().username, isAdmin() ? h('span', { class: 'muted' }, ' (admin)') : null),
      h('button', { class: 'small', onclick: () => logout() }, 'Log out')));
  shell = { nav, main, menu, menuLabel };
  pageElement('app').replaceChildren(top, h('div', { class: 'shell' }, nav, main));
  route();
}

/**
 * Opens or closes the narrow screen's menu (on a wide one the navigation is always shown).
 * @param {boolean} open
 */
function setMenu(open) {
  if (!shell) return;
  shell.nav.classList.toggle('open', open);
  shell.menu.setAttribute('aria-expanded', String(open));
}

/** The hash as the screen's path (`#/instances/12/logs` → instances, 12, logs) and query. */
function parseHash() {
  const raw = location.hash.replace(/^#\/?/, '');
  const q = raw.indexOf('?');
  const path = q >= 0 ? raw.slice(0, q) : raw;
  const params = new URLSearchParams(q >= 0 ? raw.slice(q + 1) : '');
  return { parts: path.split('/').filter(Boolean).map(decodeURIComponent), params };
}

/** Shows the screen the hash names (the overview for an unknown one), stopping the last. */
function route() {
  if (!session.user || session.user.require_password_change || !shell) return;
  const { parts, params } = parseHash();
  let screen = SCREENS.find((s) => s.id === parts[0]) || SCREENS[0];
  if (!mayOpen(screen)) screen = SCREENS[0];
  if (currentCleanup) currentCleanup();
  currentCleanup = null;
  for (const a of shell.nav.querySelectorAll('a')) a.classList.toggle('active', a.dataset.screen === screen.id);
  shell.menuLabel.textContent = screen.title;
  setMenu(false);
  document.title = screen.title + ' · gantry';
  shell.main.replaceChildren();
  currentCleanup = screen.render(shell.main, parts.slice(1), params) || null;
}

onAuthFailure(authFailure);
window.addEventListener('hashchange', route);
// The open menu closes on Escape and on a click outside it.
document.addEventListener('keydown', (event) => {
  if (event.key === 'Escape') setMenu(false);
});
document.addEventListener('click', (event) => {
  const target = /** @type {Node} */ (event.target);
  if (shell && !shell.nav.contains(target) && !shell.menu.contains(target)) setMenu(false);
});
applyTheme(storedTheme());
boot();
