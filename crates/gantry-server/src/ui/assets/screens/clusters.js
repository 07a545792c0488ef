// @ts-check
// The clusters screen (admins, and the administrators of given clusters, who see theirs):
// every cluster with its state and what it means, its workers (ready of all), GPUs and
// models; for admins "New cluster", renaming or describing one, and deleting an empty one
// (the server names what is still in it; the default cluster stays). A cluster's page
// (#/clusters/<id>): its facts, its worker pools (cluster-pools.js, read-only but for
// admins), and for admins the `gantry worker` command that joins a machine to it, with a
// copy button, for a Kubernetes cluster the manifests that join its GPU nodes, and "Rotate
// token" behind a confirmation: registration tokens are shown to admins only.
// Clusters and pools have no watch stream: the screen re-reads them every few seconds, so
// a machine that joins shows in the counts.

import { api } from '../lib/api.js';
import { confirmDialog, openDialog } from '../lib/dialogs.js';
import { field, h, pageHead, toast } from '../lib/dom.js';
import { combine, ticker } from '../lib/live.js';
import { CLUSTER_FIELDS, sentence } from '../lib/sentence.js';
import { isAdmin } from '../lib/session.js';
import { copyButton, stateBadge, timeCell } from '../lib/widgets.js';
import { poolsSection } from './cluster-pools.js';

/** @import { Cluster, ClusterRegistration } from '../lib/api-types' */

/** How often the clusters are read again: their counts follow their workers. */
const CLUSTER_POLL_MS = 5000;

/**
 * The badge class of each cluster state.
 * @type {Record<string, string>}
 */
const CLUSTER_STATE_CLASS = { ready: 'ok', provisioning: 'info', pending: 'warn' };

/** What each provider means, for the select and the titles. */
const PROVIDERS = {
  custom: 'Machines you bring: each runs the join command',
  kubernetes: 'The GPU nodes of a Kubernetes cluster, joined by a worker DaemonSet',
};

/**
 * What a cluster's state means, as a sentence: the server's message, but for a cluster no
 * worker has joined, where it says what to do on this screen (the server's names the API).
 * @param {Cluster} cluster
 * @param {boolean} onItsPage the join command is below, rather than a link away
 * @returns {import('../lib/dom-types').Child}
 */
function stateText(cluster, onItsPage) {
  // A cluster whose pools are making machines says so (the server's message).
  if (cluster.counts.workers === 0 && cluster.state !== 'provisioning') {
    // Only admins see the join command.
    if (!isAdmin()) return 'No worker has joined yet: an admin has the command that joins a machine to it.';
    if (onItsPage && cluster.provider === 'kubernetes') {
      return 'No worker has joined yet: apply the manifests below, or run the join command on a GPU machine.';
    }
    return onItsPage
      ? 'No worker has joined yet: run the join command below on a GPU machine.'
      : ['No worker has joined yet: run ', h('a', { href: '#/clusters/' + cluster.id }, 'its join command'), ' on a GPU machine.'];
  }
  return sentence({ message: cluster.state_message });
}

/**
 * A select of the providers, `current` chosen.
 * @param {string} current
 * @returns {HTMLSelectElement}
 */
function providerSelect(current) {
  return h('select', { 'aria-label': 'Provider', value: current },
    h('option', { value: 'custom' }, 'custom: machines you bring'),
    h('option', { value: 'kubernetes' }, 'kubernetes: a Kubernetes cluster’s GPU nodes'));
}

/**
 * @param {HTMLElement} main
 * @param {string[]} parts
 */
export function renderClusters(main, parts) {
  if (parts[0]) return renderCluster(main, Number(parts[0]));
  const formBox = h('div');
  const tableBox = h('div', null, h('div', { class: 'panel empty' }, 'Loading…'));
  const closeForm = () => formBox.replaceChildren();
  const openForm = () => {
    formBox.replaceChildren(clusterForm(closeForm));
    const first = /** @type {HTMLInputElement | null} */ (formBox.querySelector('input'));
    if (first) first.focus();
  };
  const admin = isAdmin();
  main.append(pageHead('Clusters',
    h('span', { class: 'muted small' }, admin
      ? 'Sets of workers, each with its own join command; a model runs in the cluster it is deployed into.'
      : 'The clusters you administer: you deploy models into them and label their workers.'),
    admin ? h('button', { class: 'primary', onclick: () => (formBox.childElementCount ? closeForm() : openForm()) }, 'New cluster') : null),
  formBox, tableBox);

  let stopped = false;
  const load = async () => {
    try {
      /** @type {Cluster[]} */
      const clusters = await api('GET', '/api/v1/clusters');
      if (!stopped) draw(clusters);
    } catch (e) {
      if (!stopped) tableBox.replaceChildren(h('div', { class: 'panel' }, h('div', { class: 'alert' }, sentence(e))));
    }
  };
  /** @param {Cluster[]} clusters */
  const draw = (clusters) => {
    const rows = clusters.slice().sort((a, b) => a.id - b.id).map((c) => h('tr', { 'data-cluster': c.name },
      h('td', null,
        h('a', { href: '#/clusters/' + c.id, title: admin ? 'How a machine joins ' + c.name : 'Its facts and worker pools' }, h('strong', null, c.name)),
        c.is_default ? [' ', h('span', { class: 'badge idle', title: 'Models that name no cluster go here; it cannot be deleted' }, 'default')] : null,
        c.description ? h('div', { class: 'muted small' }, c.description) : null),
      h('td', { class: 'opt' }, h('span', { class: 'chip', title: PROVIDERS[c.provider] }, c.provider)),
      h('td', { 'data-part': 'state' }, stateBadge(c.state, CLUSTER_STATE_CLASS),
        h('div', { class: 'state-message' }, stateText(c, false))),
      h('td', { class: 'num', 'data-part': 'workers' },
        h('a', { href: '#/workers?cluster=' + c.id, title: 'Ready workers of all its workers' }, c.counts.ready_workers + ' / ' + c.counts.workers)),
      h('td', { class: 'num opt', 'data-part': 'gpus' }, c.counts.gpus),
      h('td', { class: 'num opt', 'data-part': 'models' }, h('a', { href: '#/models?cluster=' + c.id }, c.counts.models)),
      h('td', { class: 'opt' }, timeCell(c.created_at)),
      h('td', { class: 'actions' }, admin
        ? [h('a', { class: 'button small', href: '#/clusters/' + c.id }, 'Join'),
          h('button', { class: 'small', onclick: () => editCluster(c, load) }, 'Edit'),
          c.is_default ? null : h('button', { class: 'small danger', onclick: () => deleteCluster(c, load) }, 'Delete')]
        : h('a', { class: 'button small', href: '#/clusters/' + c.id }, 'Open'))));
    tableBox.replaceChildren(h('div', { class: 'panel flush' }, h('table', { 'data-clusters': '' },
      h('thead', null, h('tr', null,
        h('th', null, 'Cluster'), h('th', { class: 'opt' }, 'Provider'), h('th', null, 'State'),
        h('th', { class: 'num', title: 'Ready workers of all its workers' }, 'Workers'), h('th', { class: 'num opt' }, 'GPUs'),
        h('th', { class: 'num opt' }, 'Models'), h('th', { class: 'opt' }, 'Created'), h('th', null))),
      h('tbody', null, rows))));
  };
  load();
  return combine(ticker(load, CLUSTER_POLL_MS), () => (stopped = true));
}

/**
 * The new-cluster form; once it is created, its page, which shows how a machine joins.
 * @param {() => void} onCancel
 * @returns {HTMLFormElement}
 */
function clusterForm(onCancel) {
  const name = h('input', { required: true, placeholder: 'east', maxlength: 63, autocomplete: 'off' });
  const description = h('input', { placeholder: 'optional' });
  const provider = providerSelect('custom');
  const error = h('div', { class: 'alert', role: 'alert' });
  const submit = h('button', { class: 'primary', type: 'submit' }, 'Create cluster');
  return h('form', {
    class: 'panel',
    'data-cluster-form': '',
    onsubmit: async (event) => {
      event.preventDefault();
      error.textContent = '';
      submit.disabled = true;
      try {
        /** @type {Cluster} */
        const created = await api('POST', '/api/v1/clusters', {
          name: name.value.trim(),
          description: description.value.trim(),
          provider: provider.value,
        });
        toast('Cluster ' + created.name + ' created: run its join command on the machines that belong to it.');
        location.hash = '#/clusters/' + created.id;
      } catch (e) {
        error.textContent = sentence(e, CLUSTER_FIELDS);
        submit.disabled = false;
      }
    },
  },
  h('h2', null, 'New cluster'),
  h('div', { class: 'form-grid' },
    field('Name', name, 'Lowercase letters, digits, “-”, “_”, “.”'),
    field('Provider', provider, 'Where its machines come from.'),
    field('Description', description, null, 'wide')),
  error,
  h('div', { class: 'form-actions' }, submit, h('button', { type: 'button', onclick: onCancel }, 'Cancel')));
}

/**
 * The dialog that renames a cluster or changes its description or provider; its workers,
 * models and token stay.
 * @param {Cluster} cluster
 * @param {() => void} reload
 */
function editCluster(cluster, reload) {
  const name = h('input', { required: true, maxlength: 63, value: cluster.name, autocomplete: 'off' });
  const description = h('input', { value: cluster.description, placeholder: 'optional' });
  const provider = providerSelect(cluster.provider);
  openDialog('Edit cluster ' + cluster.name, [
    field('Name', name, 'Its workers, models and join token stay as they are.'),
    field('Description', description),
    field('Provider', provider, 'A Kubernetes cluster’s page also shows the manifests that join its GPU nodes.'),
  ], {
    submitLabel: 'Save',
    onSubmit: async () => {
      /** @type {Record<string, string>} */
      const update = {};
      if (name.value.trim() !== cluster.name) update.name = name.value.trim();
      if (description.value.trim() !== cluster.description) update.description = description.value.trim();
      if (provider.value !== cluster.provider) update.provider = provider.value;
      if (!Object.keys(update).length) return;
      try {
        await api('PATCH', '/api/v1/clusters/' + cluster.id, update);
      } catch (e) {
        throw new Error(sentence(e, CLUSTER_FIELDS));
      }
      toast('Cluster ' + (update.name || cluster.name) + ' saved.');
      reload();
    },
  });
}

/**
 * Asks before deleting a cluster; the server refuses while workers or models are in it,
 * and its sentence, naming them, stays in the dialog.
 * @param {Cluster} cluster
 * @param {() => void} done after the deletion
 */
function deleteCluster(cluster, done) {
  confirmDialog('Delete cluster ' + cluster.name + '?',
    'Its join command stops working. A cluster with workers or models cannot go: delete its models, and its workers (or join the machines to another cluster), first.',
    'Delete cluster',
    async () => {
      try {
        await api('DELETE', '/api/v1/clusters/' + cluster.id);
      } catch (e) {
        throw new Error(sentence(e));
      }
      toast('Deleted cluster “' + cluster.name + '”.');
      done();
    });
}

/**
 * A labelled value of the facts panel.
 * @param {string} label
 * @param {string} key `data-fact`
 * @param {...import('../lib/dom-types').Child} value
 * @returns {HTMLDivElement}
 */
function fact(label, key, ...value) {
  return h('div', { class: 'fact', 'data-fact': key }, h('span', null, label), h('div', null, value));
}

/**
 * One cluster: its facts, its worker pools, how a machine (or, for a Kubernetes cluster,
 * its GPU nodes) joins it, and the rotation of its token.
 * @param {HTMLElement} main
 * @param {number} id
 * @returns {() => void}
 */
function renderCluster(main, id) {
  // A cluster administrator sees the cluster and its pools, never its token.
  const admin = Boolean(isAdmin());
  const head = h('div', { class: 'page-head' }, h('a', { href: '#/clusters' }, '← Clusters'), h('h1', null, 'Cluster ' + id));
  const factsBox = h('div', null, h('div', { class: 'panel empty' }, 'Loading…'));
  const joinBox = h('div', { class: 'panel join-cluster', 'data-cluster-join': '' }, h('div', { class: 'muted' }, 'Loading how a machine joins…'));
  const pools = poolsSection(id, { readOnly: !admin });
  main.append(head, factsBox, pools.element, ...(admin ? [joinBox] : []));
  /** @type {Cluster | null} the cluster as last read */
  let shown = null;
  /** The image the manifests' DaemonSet runs; empty for the server's default. */
  let image = '';
  let stopped = false;

  /** @param {Cluster} c */
  const drawFacts = (c) => {
    head.replaceChildren(h('a', { href: '#/clusters' }, '← Clusters'), h('h1', null, 'Cluster ' + c.name),
      stateBadge(c.state, CLUSTER_STATE_CLASS),
      ...(c.is_default ? [h('span', { class: 'badge idle', title: 'Models that name no cluster go here; it cannot be deleted' }, 'default')] : []),
      h('span', { class: 'spacer' }),
      ...(admin ? [h('span', { class: 'page-actions' },
        h('button', { class: 'small', onclick: () => editCluster(c, load) }, 'Edit'),
        c.is_default ? null : h('button', {
          class: 'small danger',
          onclick: () => deleteCluster(c, () => (location.hash = '#/clusters')),
        }, 'Delete'))] : []));
    factsBox.replaceChildren(h('div', { class: 'panel' },
      c.description ? h('p', { class: 'muted cluster-description' }, c.description) : null,
      h('div', { class: 'facts' },
        fact('Provider', 'provider', h('span', { class: 'chip', title: PROVIDERS[c.provider] }, c.provider)),
        fact('Workers ready', 'workers', h('a', { href: '#/workers?cluster=' + c.id }, c.counts.ready_workers + ' of ' + c.counts.workers)),
        fact('GPUs', 'gpus', h('strong', null, c.counts.gpus)),
        fact('Models', 'models', h('a', { href: '#/models?cluster=' + c.id }, c.counts.models)),
        fact('Created', 'created', timeCell(c.created_at))),
      h('div', { class: 'state-message cluster-state', 'data-part': 'state-message' }, stateText(c, true))));
  };

  /** @param {ClusterRegistration} registration */
  const drawJoin = (registration) => {
    const command = h('pre', { class: 'code', 'data-join-command': '' }, registration.command);
    const manifests = registration.kubernetes_manifests;
    /** @type {HTMLElement[]} the command that joins one machine */
    const machine = [
      h('h2', { class: manifests ? 'section-head' : null }, manifests ? 'Or join one machine' : 'Join a machine'),
      h('p', { class: 'section-note' }, 'On the new machine, with the same gantry binary, run:'),
      h('div', { class: 'join-command' }, command, copyButton(() => registration.command, command)),
      h('p', { class: 'muted small' },
        'The token lets any machine join ' + registration.cluster_name + ': keep it secret. Add --label key=value for models’ worker selectors; ',
        'the worker must reach a server at these addresses, and the servers the worker’s port 10150 (see docs/workers.md).'),
    ];
    /** @type {HTMLElement[]} the manifests first, for a Kubernetes cluster */
    const parts = [];
    if (manifests) {
      const yaml = h('pre', { class: 'code manifests', 'data-manifests': '' }, manifests);
      const imageInput = h('input', { value: image, placeholder: 'gantry:<this server’s version>', 'aria-label': 'Image', autocomplete: 'off' });
      const imageError = h('div', { class: 'alert', role: 'alert' });
      const useImage = h('button', {
        type: 'submit',
        class: 'small',
      }, 'Use this image');
      parts.push(
        h('h2', null, 'Join the GPU nodes of a Kubernetes cluster'),
        h('p', { class: 'section-note' },
          'Apply these manifests (kubectl apply -f): a namespace, the token as a Secret, and a worker DaemonSet on the nodes labelled nvidia.com/gpu.present=true.'),
        h('form', {
          class: 'image-choice',
          onsubmit: async (event) => {
            event.preventDefault();
            imageError.textContent = '';
            useImage.disabled = true;
            try {
              const wanted = imageInput.value.trim();
              const registration = await registrationOf(id, wanted);
              image = wanted;
              drawJoin(registration);
            } catch (e) {
              imageError.textContent = sentence(e, CLUSTER_FIELDS);
              useImage.disabled = false;
            }
          },
        }, field('Image', imageInput, 'gantry’s Dockerfile, built and pushed where the nodes pull from.'), useImage),
        imageError,
        h('div', { class: 'join-command' }, yaml, copyButton(() => manifests, yaml)));
    }
    parts.push(...machine, rotateRow());
    joinBox.replaceChildren(...parts);
  };

  /** The rotation, under what it replaces. */
  const rotateRow = () => h('div', { class: 'form-actions' },
    h('button', {
      class: 'danger',
      onclick: () => {
        const name = shown ? shown.name : 'cluster ' + id;
        confirmDialog('Rotate the registration token of ' + name + '?',
          'A new token replaces it: from now on machines join with the new join command only, and the one shown until now stops working. '
            + 'Workers already registered keep working: they use their own credentials.',
          'Rotate token',
          async () => {
            let rotated;
            try {
              rotated = await api('POST', '/api/v1/clusters/' + id + '/registration-token' + imageQuery(image));
            } catch (e) {
              throw new Error(sentence(e));
            }
            drawJoin(rotated);
            toast('Token of ' + name + ' rotated: machines join with the command shown now.');
          });
      },
    }, 'Rotate token'),
    h('span', { class: 'muted small' }, 'Registered workers keep working; new machines need the new command.'));

  const loadJoin = async () => {
    try {
      const registration = await registrationOf(id, image);
      if (!stopped) drawJoin(registration);
    } catch (e) {
      if (stopped) return;
      joinBox.replaceChildren(h('h2', null, 'Join a machine'),
        h('div', { class: 'alert' }, 'Cannot show how a machine joins: ' + sentence(e)), rotateRow());
    }
  };

  const load = async () => {
    try {
      /** @type {Cluster} */
      const c = await api('GET', '/api/v1/clusters/' + id);
      if (stopped) return;
      // The join box is read again when the provider changes: the manifests come or go.
      const joinStale = !shown || shown.provider !== c.provider || shown.name !== c.name;
      shown = c;
      drawFacts(c);
      if (joinStale && admin) loadJoin();
      await pools.load();
    } catch (e) {
      if (stopped) return;
      if (e.status === 404) {
        head.replaceChildren(h('a', { href: '#/clusters' }, '← Clusters'), h('h1', null, 'Cluster ' + id));
        factsBox.replaceChildren(h('div', { class: 'panel empty', 'data-cluster-missing': '' },
          'There is no cluster ' + id + ': it may have been deleted. See the ', h('a', { href: '#/clusters' }, 'Clusters'), ' screen.'));
        joinBox.replaceChildren();
        joinBox.classList.add('hidden');
        pools.hide();
      } else {
        factsBox.replaceChildren(h('div', { class: 'panel' }, h('div', { class: 'alert' }, sentence(e))));
      }
    }
  };
  load();
  return combine(ticker(load, CLUSTER_POLL_MS), () => (stopped = true));
}

/**
 * The `?image=` of a registration request, when one is chosen.
 * @param {string} image
 * @returns {string}
 */
function imageQuery(image) {
  return image ? '?image=' + encodeURIComponent(image) : '';
}

/**
 * How a machine joins cluster `id`: its token, command and, for Kubernetes, manifests
 * whose DaemonSet runs `image` (the server's default when empty).
 * @param {number} id
 * @param {string} image
 * @returns {Promise<ClusterRegistration>}
 */
function registrationOf(id, image) {
  return api('GET', '/api/v1/clusters/' + id + '/registration-token' + imageQuery(image));
}
