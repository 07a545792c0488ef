// @ts-check
// Clusters as the other screens use them: the clusters the caller may see (every one for
// an admin, the ones they administer for anyone else, none for a plain user), read once
// per screen; the cluster a screen is filtered by, kept in its hash (`?cluster=ID`); and
// the select that chooses it, shown only where there is a choice (more than one cluster).

import { api } from './api.js';
import { h } from './dom.js';

/** @import { Cluster } from './api-types' */

/** The default cluster's id (gantry-types' `DEFAULT_CLUSTER_ID`): it is never deleted. */
export const DEFAULT_CLUSTER_ID = 1;

/**
 * The clusters the caller may see, by id; none when they may see none or the list could
 * not be read (a screen then shows no cluster choice, and everything it may see).
 * @returns {Promise<Cluster[]>}
 */
export async function loadClusters() {
  try {
    /** @type {Cluster[]} */
    const clusters = await api('GET', '/api/v1/clusters');
    return clusters.slice().sort((a, b) => a.id - b.id);
  } catch (_) {
    return [];
  }
}

/**
 * The cluster a screen's hash names (`?cluster=ID`), or null for every cluster.
 * @param {URLSearchParams} params
 * @returns {number | null}
 */
export function clusterParam(params) {
  const id = Number(params.get('cluster'));
  return Number.isInteger(id) && id > 0 ? id : null;
}

/**
 * A cluster's name among `clusters`, else its id in words.
 * @param {Cluster[]} clusters
 * @param {number} id
 * @returns {string}
 */
export function clusterName(clusters, id) {
  const cluster = clusters.find((c) => c.id === id);
  return cluster ? cluster.name : 'cluster ' + id;
}

/**
 * The cluster filter of a list screen: a select of every cluster the caller may see,
 * shown once they are read and there is more than one (or the hash names one). Choosing
 * one changes the hash, which draws the screen again for that cluster; the hash's other
 * filters stay, but a model's and a worker's, which belong to one cluster.
 * @param {URLSearchParams} params the screen's hash query as it was drawn
 * @param {string} screen the screen's hash path: `#/workers`
 * @param {(clusters: Cluster[]) => void} [loaded] called with the clusters once read
 * @returns {HTMLLabelElement}
 */
export function clusterFilter(params, screen, loaded) {
  const chosen = clusterParam(params);
  const select = h('select', { 'aria-label': 'Cluster', 'data-cluster-filter': '' },
    h('option', { value: '' }, 'all clusters'));
  const label = h('label', { class: 'hidden' }, 'Cluster', select);
  select.addEventListener('change', () => {
    // The hash as it is now: a screen may have changed its other filters in place.
    const at = location.hash.indexOf('?');
    const query = new URLSearchParams(at >= 0 ? location.hash.slice(at + 1) : '');
    query.delete('model');
    query.delete('worker');
    if (select.value) query.set('cluster', select.value);
    else query.delete('cluster');
    location.hash = screen + (query.toString() ? '?' + query : '');
  });
  loadClusters().then((clusters) => {
    select.append(...clusters.map((c) => h('option', { value: String(c.id) }, c.name)));
    if (chosen != null && !clusters.some((c) => c.id === chosen)) {
      // A cluster the list does not hold (deleted, or not the caller's): still named.
      select.append(h('option', { value: String(chosen) }, 'cluster ' + chosen));
    }
    select.value = chosen == null ? '' : String(chosen);
    label.classList.toggle('hidden', clusters.length < 2 && chosen == null);
    if (loaded) loaded(clusters);
  });
  return label;
}
