// @ts-check
// Who is logged in: set by app.js when a login succeeds or /auth/me answers, cleared when
// the session ends. Screens read it to show what only admins may do.

/** @import { User } from './api-types' */

/** @type {{user: User | null}} */
export const session = { user: null };

/** Whether the logged-in user is an admin. */
export function isAdmin() {
  return session.user && session.user.role === 'admin';
}

/**
 * The logged-in user, for the screens, which are shown only while there is one.
 * @returns {User}
 */
export function currentUser() {
  if (!session.user) throw new Error('nobody is logged in');
  return session.user;
}
