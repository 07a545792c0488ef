// @ts-check
// Which instances need a person, and why: the models screen shows a model's worst one on
// its row, and the overview lists such models under "Needs attention". The reason is the
// instance's own `state_message`, written by whoever can tell: the server (a file it
// cannot read, no worker that fits) or the worker (a path outside its model directories,
// a backend that exits).

/** @import { Instance } from './api-types' */

/**
 * How long an instance may stay pending with a reason before it counts as stuck: the
 * scheduler places a placeable one within a pass, and a roll's or a reschedule's note
 * lasts only until then.
 */
export const STUCK_PENDING_MS = 20000;

/** The order of gravity: the first state of a model's instances in this list is shown. */
const GRAVITY = ['error', 'unreachable', 'unhealthy', 'pending'];

/**
 * Whether an instance needs a person now: it failed (`error`), lost its worker
 * (`unreachable`), or has waited in `pending` with a reason for longer than
 * STUCK_PENDING_MS. `unhealthy` is left to the worker, which restarts it.
 * @param {Instance} instance
 * @param {number} now milliseconds since the epoch
 * @returns {boolean}
 */
export function needsAttention(instance, now) {
  if (instance.state === 'error' || instance.state === 'unreachable') return true;
  return instance.state === 'pending' && !!instance.state_message &&
    now - Date.parse(instance.updated_at) >= STUCK_PENDING_MS;
}

/**
 * Whether an instance's message says why it is not serving: failed, unhealthy, or pending
 * with a reason (at once, unlike needsAttention: a row can say what happens now).
 * @param {Instance} instance
 * @returns {boolean}
 */
export function hasReason(instance) {
  return GRAVITY.includes(instance.state) && !!instance.state_message;
}

/**
 * Of a model's instances, the one whose reason to show: the gravest state first, then
 * the most recently changed.
 * @param {Instance[]} instances
 * @param {(instance: Instance) => boolean} [which] the instances to consider; those with a reason by default
 * @returns {Instance | null}
 */
export function gravest(instances, which) {
  const candidates = instances.filter(which || hasReason);
  candidates.sort((a, b) => GRAVITY.indexOf(a.state) - GRAVITY.indexOf(b.state) ||
    Date.parse(b.updated_at) - Date.parse(a.updated_at));
  return candidates[0] || null;
}
