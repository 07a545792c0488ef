// @ts-check
// The users screen (admins): every user with their role (changed in place once confirmed;
// the server keeps the last admin's), creating a user, resetting a password and deleting a
// user.

import { api, listAll } from '../lib/api.js';
import { confirmDialog, openDialog } from '../lib/dialogs.js';
import { checkField, field, h, pageHead, toast } from '../lib/dom.js';
import { currentUser } from '../lib/session.js';
import { timeCell } from '../lib/widgets.js';

/** @import { User } from '../lib/api-types' */

/**
 * @param {HTMLElement} main
 */
export function renderUsers(main) {
  const tableBox = h('div', null, h('div', { class: 'panel empty' }, 'Loading…'));
  const load = async () => {
    try {
      drawUsers(await listAll('/api/v1/users'));
    } catch (e) {
      tableBox.replaceChildren(h('div', { class: 'panel' }, h('div', { class: 'alert' }, e.message)));
    }
  };
  /** @param {User[]} users */
  const drawUsers = (users) => {
    const rows = users.map((u) => {
      const role = h('select', { 'aria-label': 'Role of ' + u.username, value: u.role },
        h('option', { value: 'user' }, 'user'), h('option', { value: 'admin' }, 'admin'));
      role.addEventListener('change', () => confirmRole(u, role, load));
      const self = u.id === currentUser().id;
      return h('tr', null,
        h('td', null, h('strong', null, u.username), self ? h('span', { class: 'muted' }, ' (you)') : null),
        h('td', null, u.full_name || h('span', { class: 'muted' }, '—')),
        h('td', null, role),
        h('td', null, u.require_password_change ? h('span', { class: 'badge warn' }, 'must change password') : h('span', { class: 'muted' }, '—')),
        h('td', null, timeCell(u.created_at)),
        h('td', { class: 'actions' },
          h('button', { class: 'small', onclick: () => resetPassword(u, load) }, 'Reset password'),
          h('button', { class: 'small danger', disabled: self, title: self ? 'You cannot delete yourself' : null, onclick: () => deleteUser(u, load) }, 'Delete')));
    });
    tableBox.replaceChildren(h('div', { class: 'panel flush' }, h('table', null,
      h('thead', null, h('tr', null, h('th', null, 'Username'), h('th', null, 'Full name'), h('th', null, 'Role'),
        h('th', null, 'Password'), h('th', null, 'Created'), h('th', null))),
      h('tbody', null, rows))));
  };

  const username = h('input', { required: true, placeholder: 'alice', maxlength: 63, autocomplete: 'off' });
  const fullName = h('input', { placeholder: 'optional' });
  const password = h('input', { type: 'password', required: true, minlength: 8, autocomplete: 'new-password' });
  const role = h('select', null, h('option', { value: 'user' }, 'user'), h('option', { value: 'admin' }, 'admin'));
  const mustChange = h('input', { type: 'checkbox', checked: true });
  const error = h('div', { class: 'alert', role: 'alert' });
  const submit = h('button', { class: 'primary', type: 'submit' }, 'Create user');
  const form = h('form', {
    class: 'panel hidden',
    onsubmit: async (event) => {
      event.preventDefault();
      error.textContent = '';
      submit.disabled = true;
      try {
        const user = await api('POST', '/api/v1/users', {
          username: username.value.trim(),
          password: password.value,
          full_name: fullName.value.trim(),
          role: role.value,
          require_password_change: mustChange.checked,
        });
        toast('User ' + user.username + ' created.');
        form.reset();
        form.classList.add('hidden');
        load();
      } catch (e) {
        error.textContent = e.message;
      } finally {
        submit.disabled = false;
      }
    },
  },
  h('h2', null, 'New user'),
  h('div', { class: 'form-grid' },
    field('Username', username, 'Lowercase letters, digits, “-”, “_”, “.”'),
    field('Full name', fullName),
    field('Password', password, 'At least 8 characters.'),
    field('Role', role),
    checkField('Must choose a new password at first login', mustChange)),
  error,
  h('div', { class: 'form-actions' }, submit,
    h('button', { type: 'button', onclick: () => { form.reset(); form.classList.add('hidden'); } }, 'Cancel')));

  main.append(pageHead('Users', h('button', {
    class: 'primary',
    onclick: () => {
      form.classList.toggle('hidden');
      username.focus();
    },
  }, 'New user')), form, tableBox);
  load();
  return () => {};
}

/**
 * Asks before a role changes: the dropdown shows the new role only once it is confirmed
 * and saved; cancelled or refused (the last admin keeps the role), it goes back.
 * @param {User} user
 * @param {HTMLSelectElement} select the user's role dropdown, showing the role chosen
 * @param {() => void} reload
 */
function confirmRole(user, select, reload) {
  const wanted = /** @type {User['role']} */ (select.value);
  const self = user.id === currentUser().id;
  let saved = false;
  const message = wanted === 'admin'
    ? user.username + ' will be able to change every model, worker, route, key and user, other admins’ roles included.'
    : self
      ? 'You lose the admin screens at once, and only another admin can give the role back.'
      : user.username + ' keeps their API keys but can no longer change the cluster.';
  const dialog = openDialog(wanted === 'admin' ? 'Make ' + user.username + ' an admin?' : self ? 'Give up your admin role?' : 'Take the admin role from ' + user.username + '?',
    h('p', null, message), {
      submitLabel: wanted === 'admin' ? 'Make admin' : 'Make user',
      danger: wanted === 'user',
      onSubmit: async () => {
        try {
          await api('PATCH', '/api/v1/users/' + user.id, { role: wanted });
        } catch (e) {
          // The one refusal of a role change: the cluster would have no admin left.
          if (e.status === 409) {
            throw new Error(self
              ? 'You are the last admin, so you cannot give up the role. Make another user an admin first.'
              : user.username + ' is the last admin, so the role stays. Make another user an admin first.');
          }
          throw e;
        }
        saved = true;
        user.role = wanted;
        toast(user.username + ' is now ' + (wanted === 'admin' ? 'an admin' : 'a user') + '.');
      },
    });
  dialog.addEventListener('close', () => {
    if (!saved) {
      select.value = user.role;
      return;
    }
    // Without the role, this page and the admin screens are no longer yours.
    if (self && wanted === 'user') {
      location.hash = '#/overview';
      location.reload();
      return;
    }
    reload();
  });
}

/**
 * @param {User} user
 * @param {() => void} reload
 */
function resetPassword(user, reload) {
  const password = h('input', { type: 'password', required: true, minlength: 8, autocomplete: 'new-password' });
  const mustChange = h('input', { type: 'checkbox', checked: true });
  openDialog('Reset the password of ' + user.username, [
    field('New password', password, 'Their sessions end at once.'),
    checkField('Must choose a new password at next login', mustChange),
  ], {
    submitLabel: 'Reset password',
    onSubmit: async () => {
      await api('PATCH', '/api/v1/users/' + user.id, { password: password.value, require_password_change: mustChange.checked });
      toast('Password of ' + user.username + ' reset.');
      reload();
    },
  });
}

/**
 * @param {User} user
 * @param {() => void} reload
 */
function deleteUser(user, reload) {
  confirmDialog('Delete user ' + user.username + '?', 'Their API keys are deleted too and stop working at once.', 'Delete user', async () => {
    await api('DELETE', '/api/v1/users/' + user.id);
    toast('Deleted user “' + user.username + '”.');
    reload();
  });
}
