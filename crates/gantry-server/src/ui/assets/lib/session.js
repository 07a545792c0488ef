// @ts-check
// Who is logged in: set by app.js when a login succeeds or /auth/me answers, cleared when
// the session ends. Screens read it to show what only admins may do, and what the
// administrators of given clusters (`cluster_admin_of`, users who are not admins) may do
// in those clusters: their workers, and the models and instances deployed there.

/** @import { User } from './api-types' */

/** @type {{user: User | null}} */
export const session = { user: null };

/** Whether the logged-in user is an admin. */
export function isAdmin() {
  return session.user && session.user.role === 'admin';
}

/**
 * Whether the logged-in user administers some cluster: every one for an admin, those of
 * `cluster_admin_of` for a user. Such a user sees the clusters and workers screens.
 * @returns {boolean}
 */
export function administersSomeCluster() {
  return Boolean(isAdmin() || (session.user && (session.user.cluster_admin_of || []).length));
}

/**
 * Whether the logged-in user administers cluster `clusterId`: deploys, changes and deletes
 * its models, restarts their instances, and labels its workers.
 * @param {number} clusterId
 * @returns {boolean}
 */
export function administers(clusterId) {
  return Boolean(isAdmin() || (session.user && (session.user.cluster_admin_of || []).includes(clusterId)));
}

/**
 * The logged-in user, for the screens, which are shown only while there is one.
 * @returns {User}
 */
export function currentUser() {
  if (!session.user) throw new Error('nobody is logged in');
  return session.user;
}
