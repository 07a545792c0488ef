// @ts-check
// The screens before the console: the login form, the password change an account must
// make first, and what is shown when the server cannot be reached. They set the session's
// user; what follows (the console, a logout) is app.js's, which passes it in.

import { api } from '../lib/api.js';
import { field, h, pageElement } from '../lib/dom.js';
import { currentUser, session } from '../lib/session.js';
import { brand } from '../lib/widgets.js';

/** @import { ApiError } from '../lib/api.js' */

/**
 * What went wrong before anything could be shown (the server cannot be reached), with a
 * button that tries again.
 * @param {Error} error
 * @param {() => void} retry
 */
export function showFatal(error, retry) {
  const app = pageElement('app');
  app.replaceChildren(
    h('div', { class: 'auth-page' },
      h('div', { class: 'auth-card' },
        brand(),
        h('div', { class: 'alert' }, error.message),
        h('div', { class: 'form-actions' }, h('button', { class: 'primary', onclick: () => retry() }, 'Try again')))),
  );
}

/**
 * The login form. Once the server accepts it, `session.user` is set and `loggedIn` is
 * called with the password typed (a forced password change need not ask for it again).
 * @param {string | undefined} notice why the form is shown
 * @param {(password: string) => void} loggedIn
 */
export function showLogin(notice, loggedIn) {
  const app = pageElement('app');
  const username = h('input', { name: 'username', autocomplete: 'username', required: true, autofocus: true });
  const password = h('input', { name: 'password', type: 'password', autocomplete: 'current-password', required: true });
  const error = h('div', { class: 'alert', role: 'alert' });
  const submit = h('button', { class: 'primary', type: 'submit' }, 'Log in');
  const form = h('form', {
    class: 'auth-card',
    onsubmit: async (event) => {
      event.preventDefault();
      error.textContent = '';
      submit.disabled = true;
      try {
        const login = await api('POST', '/auth/login', { username: username.value.trim(), password: password.value }, { auth: false });
        session.user = login.user;
        loggedIn(password.value);
      } catch (e) {
        error.textContent = e.message;
        submit.disabled = false;
        password.select();
      }
    },
  },
  brand(),
  notice ? h('div', { class: 'alert info' }, notice) : null,
  h('p', null, 'Log in to manage models, instances and workers.'),
  field('Username', username),
  field('Password', password),
  error,
  submit);
  app.replaceChildren(h('div', { class: 'auth-page' }, form));
  username.focus();
}

/**
 * The password form; `forced` when the account must change it before anything else. Once
 * the server accepts the new password, `session.user` is set and `changed` is called;
 * `ended` is called with the refusal when the session is over instead.
 * @param {boolean} forced
 * @param {string | null | undefined} knownCurrent the current password, when it need not be asked
 * @param {() => void} changed
 * @param {(error: ApiError) => void} ended
 * @returns {{form: HTMLFormElement, focus: () => void}}
 */
export function passwordForm(forced, knownCurrent, changed, ended) {
  const current = h('input', { type: 'password', autocomplete: 'current-password', required: true, value: knownCurrent || '' });
  const next = h('input', { type: 'password', autocomplete: 'new-password', required: true, minlength: 8 });
  const again = h('input', { type: 'password', autocomplete: 'new-password', required: true, minlength: 8 });
  const error = h('div', { class: 'alert', role: 'alert' });
  const submit = h('button', { class: 'primary', type: 'submit' }, forced ? 'Set password and continue' : 'Change password');
  const form = h('form', {
    onsubmit: async (event) => {
      event.preventDefault();
      error.textContent = '';
      if (next.value !== again.value) {
        error.textContent = 'The two new passwords differ.';
        return;
      }
      submit.disabled = true;
      try {
        const login = await api('POST', '/auth/change-password',
          { current_password: current.value, new_password: next.value }, { auth: false });
        session.user = login.user;
        changed();
      } catch (e) {
        if (e.status === 401 && e.code === 'unauthorized' && !/current_password/.test(e.message)) {
          ended(e);
          return;
        }
        error.textContent = e.message;
        submit.disabled = false;
      }
    },
  },
  knownCurrent ? null : field('Current password', current),
  field('New password', next, 'At least 8 characters.'),
  field('New password again', again),
  error,
  submit);
  return { form, focus: () => (knownCurrent ? next : current).focus() };
}

/**
 * The password change an account must make before anything else, as a page of its own.
 * @param {string | undefined} knownCurrent the password just typed at login
 * @param {{changed: () => void, logout: () => void, ended: () => void}} flow what follows:
 *   the console, a logout, or the login form when the session is over
 */
export function showPasswordChange(knownCurrent, flow) {
  const app = pageElement('app');
  const { form, focus } = passwordForm(true, knownCurrent, flow.changed, flow.ended);
  form.className = 'auth-card';
  form.prepend(
    brand(),
    h('p', null, 'Choose a new password for ', h('strong', null, currentUser().username),
      ' before you continue: this account still has the password it was created with.'),
  );
  form.append(h('div', { class: 'form-actions' }, h('button', {
    type: 'button',
    class: 'link',
    onclick: () => flow.logout(),
  }, 'Log out instead')));
  app.replaceChildren(h('div', { class: 'auth-page' }, form));
  focus();
}
