// @ts-check
// The account screen: who is logged in, the password form, and where the API is
// described.

import { reportAuthFailure } from '../lib/api.js';
import { h, pageHead, toast } from '../lib/dom.js';
import { fmtAgo } from '../lib/format.js';
import { currentUser } from '../lib/session.js';
import { passwordForm } from './login.js';

/**
 * @param {HTMLElement} main
 */
export function renderAccount(main) {
  // A session that ended meanwhile is handled as any refused call is.
  const { form } = passwordForm(false, null, () => {
    toast('Password changed. Your other sessions have ended.');
    form.reset();
  }, reportAuthFailure);
  form.className = 'panel';
  form.prepend(h('h2', null, 'Change password'));
  const user = currentUser();
  main.append(pageHead('Account'),
    h('div', { class: 'panel' },
      h('h2', null, user.username),
      h('div', null, 'Role: ', h('strong', null, user.role)),
      user.full_name ? h('div', null, 'Name: ', user.full_name) : null,
      h('div', { class: 'muted small' }, 'Account created ', fmtAgo(user.created_at), '.')),
    form,
    h('div', { class: 'panel muted small' }, 'The API is described at ', h('a', { href: '/docs' }, '/docs'),
      ' (OpenAPI: ', h('a', { href: '/api/openapi.json' }, '/api/openapi.json'), ').'));
  return () => {};
}
