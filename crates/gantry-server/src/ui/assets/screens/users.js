// @ts-check
// The users screen (admins): every user with their role (changed in place once confirmed;
// the server keeps the last admin's) and the clusters they administer without being an
// admin (chosen when the user is created, changed with "Clusters"), creating a user,
// resetting a password and deleting a user.

import { api, listAll } from '../lib/api.js';
import { clusterName, loadClusters } from '../lib/clusters.js';
import { confirmDialog, openDialog } from '../lib/dialogs.js';
import { checkField, field, h, pageHead, toast } from '../lib/dom.js';
import { currentUser } from '../lib/session.js';
import { timeCell } from '../lib/widgets.js';

/** @import { Cluster, User } from '../lib/api-types' */

/**
 * A tick box per cluster, those of `chosen` ticked: the clusters a user administers.
 * @param {Cluster[]} clusters
 * @param {number[]} chosen
 * @returns {{element: HTMLElement, ids: () => number[]}}
 */
function clusterChoice(clusters, chosen) {
  const boxes = clusters.map((c) => h('input', { type: 'checkbox', value: String(c.id), checked: chosen.includes(c.id) }));
  const element = h('fieldset', { class: 'cluster-choice', 'data-cluster-choice': '' },
    h('legend', null, 'Administers clusters'),
    clusters.length
      ? clusters.map((c, i) => h('label', { class: 'inline-check' }, boxes[i], c.name))
      : h('span', { class: 'muted small' }, 'There are no clusters.'),
    h('span', { class: 'hint' }, 'Deploys, scales and deletes models there, and sees and labels its workers, without being an admin.'));
  return { element, ids: () => boxes.filter((b) => b.checked).map((b) => Number(b.value)) };
}

/**
 * The clusters a user administers, by name: every one for an admin.
 * @param {User} user
 * @param {Cluster[]} clusters
 * @returns {import('../lib/dom-types').Child}
 */
function administered(user, clusters) {
  if (user.role === 'admin') return h('span', { class: 'muted' }, 'every cluster (admin)');
  const ids = user.cluster_admin_of || [];
  if (!ids.length) return h('span', { class: 'muted' }, '—');
  return ids.map((id) => h('span', { class: 'chip' }, clusterName(clusters, id)));
}

/**
 * @param {HTMLElement} main
 */
export function renderUsers(main) {
  const tableBox = h('div', null, h('div', { class: 'panel empty' }, 'Loading…'));
  /** @type {Cluster[]} */
  let clusters = [];
  const load = async () => {
    try {
      const [users, read] = await Promise.all([listAll('/api/v1/users'), loadClusters()]);
      clusters = read;
      drawUsers(users);
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
        h('td', { class: 'opt', 'data-part': 'clusters' }, administered(u, clusters)),
        h('td', null, u.require_password_change ? h('span', { class: 'badge warn' }, 'must change password') : h('span', { class: 'muted' }, '—')),
        h('td', null, timeCell(u.created_at)),
        h('td', { class: 'actions' },
          u.role === 'admin' ? null : h('button', {
            class: 'small',
            title: 'The clusters ' + u.username + ' administers',
            onclick: () => editClusters(u, clusters, load),
          }, 'Clusters'),
          h('button', { class: 'small', onclick: () => resetPassword(u, load) }, 'Reset password'),
          h('button', { class: 'small danger', disabled: self, title: self ? 'You cannot delete yourself' : null, onclick: () => deleteUser(u, load) }, 'Delete')));
    });
    tableBox.replaceChildren(h('div', { class: 'panel flush' }, h('table', null,
      h('thead', null, h('tr', null, h('th', null, 'Username'), h('th', null, 'Full name'), h('th', null, 'Role'),
        h('th', { class: 'opt' }, 'Administers'), h('th', null, 'Password'), h('th', null, 'Created'), h('th', null))),
      h('tbody', null, rows))));
  };

  const username = h('input', { required: true, placeholder: 'alice', maxlength: 63, autocomplete: 'off' });
  const fullName = h('input', { placeholder: 'optional' });
  const password = h('input', { type: 'password', required: true, minlength: 8, autocomplete: 'new-password' });
  const role = h('select', null, h('option', { value: 'user' }, 'user'), h('option', { value: 'admin' }, 'admin'));
  const mustChange = h('input', { type: 'checkbox', checked: true });
  // Filled with the clusters when the form opens; none chosen.
  const clustersBox = h('div', { class: 'field wide' });
  let chosenClusters = clusterChoice([], []);
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
          cluster_admin_of: role.value === 'admin' ? [] : chosenClusters.ids(),
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
    checkField('Must choose a new password at first login', mustChange),
    clustersBox),
  error,
  h('div', { class: 'form-actions' }, submit,
    h('button', { type: 'button', onclick: () => { form.reset(); form.classList.add('hidden'); } }, 'Cancel')));

  main.append(pageHead('Users', h('button', {
    class: 'primary',
    onclick: () => {
      form.classList.toggle('hidden');
      chosenClusters = clusterChoice(clusters, []);
      clustersBox.replaceChildren(chosenClusters.element);
      clustersBox.classList.toggle('hidden', role.value === 'admin');
      username.focus();
    },
  }, 'New user')), form, tableBox);
  // An admin administers every cluster: the choice is for users.
  role.addEventListener('change', () => clustersBox.classList.toggle('hidden', role.value === 'admin'));
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
 * The dialog that chooses the clusters a user administers.
 * @param {User} user
 * @param {Cluster[]} clusters
 * @param {() => void} reload
 */
function editClusters(user, clusters, reload) {
  const choice = clusterChoice(clusters, user.cluster_admin_of || []);
  openDialog('Clusters ' + user.username + ' administers', choice.element, {
    submitLabel: 'Save clusters',
    onSubmit: async () => {
      await api('PATCH', '/api/v1/users/' + user.id, { cluster_admin_of: choice.ids() });
      toast('Clusters of ' + user.username + ' saved.');
      reload();
    },
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
