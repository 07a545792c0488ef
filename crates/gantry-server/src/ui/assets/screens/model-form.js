// @ts-check
// The form that declares a model (the models screen's "New model", the catalog's and an
// upload's "Deploy"): its source, backend, cluster (where there is more than one) and
// placement, and "Check fit", which asks the server where replicas of it would go in that
// cluster. A cluster administrator who is not an admin deploys into their clusters only:
// the form always names one of them, the first unless the list shows another.

import { api } from '../lib/api.js';
import { loadClusters } from '../lib/clusters.js';
import { checkField, field, h, toast } from '../lib/dom.js';
import { describeSource, fmtBytes, joinArgs, parseLabels, splitArgs } from '../lib/format.js';
import { MODEL_FIELDS, sentence } from '../lib/sentence.js';
import { isAdmin } from '../lib/session.js';

/** @import { CatalogEntry, Estimate, Model, Page, Upload } from '../lib/api-types' */

/**
 * What an estimate says: the parts of one instance, and where replicas would go.
 * @param {Estimate} estimate
 * @returns {HTMLDivElement}
 */
export function estimateView(estimate) {
  const p = estimate.parts;
  const total = p.weights_bytes + p.kv_cache_bytes + p.host_compute_buffer_bytes + p.base_ram_bytes +
    (p.per_gpu_compute_buffer_bytes + p.per_gpu_overhead_bytes) * Math.max(1, p.declared_gpu_count || 1);
  const fitting = estimate.workers.filter((w) => w.fits);
  /** @param {{placement: {gpus: {index: number, bytes: number}[], ram_bytes: number} | null}} v */
  const where = (v) => {
    const placement = v.placement;
    if (!placement) return '';
    const gpus = placement.gpus.map((g) => 'GPU ' + g.index + ' ' + fmtBytes(g.bytes)).join(', ');
    return (gpus || 'CPU only') + (placement.ram_bytes ? ' + ' + fmtBytes(placement.ram_bytes) + ' RAM' : '');
  };
  // Each replica booked before the next, as the scheduler does: two replicas on one
  // worker land on two GPUs, which one instance's verdict per worker cannot show.
  const replicas = estimate.replicas || [];
  const replicaTable = replicas.length > 1 ? h('table', { class: 'compact', 'data-estimate-replicas': '' },
    h('caption', null, 'Where the ' + replicas.length + ' replicas would go, placed together'),
    h('thead', null, h('tr', null, h('th', { class: 'num' }, 'Replica'), h('th', null, 'Would go to'))),
    h('tbody', null, replicas.map((r, n) => h('tr', { 'data-estimate-replica': n + 1 },
      h('td', { class: 'num' }, String(n + 1)),
      h('td', { class: 'small' }, r.fits && r.placement
        ? [h('strong', null, r.placement.worker_name), ' ', where(r)]
        : h('span', { class: 'badge warn' }, 'does not fit'), r.fits ? null : [' ', r.reason]))))) : null;
  return h('div', { class: 'estimate', 'data-estimate': '' },
    h('div', { class: 'facts' },
      h('div', { class: 'fact' }, h('span', null, 'One instance needs'), h('strong', { 'data-estimate-total': '' }, fmtBytes(total))),
      h('div', { class: 'fact' }, h('span', null, 'Weights'), fmtBytes(p.weights_bytes)),
      h('div', { class: 'fact' }, h('span', null, 'KV cache'), fmtBytes(p.kv_cache_bytes) +
        (estimate.context_size ? ' (' + estimate.context_size.toLocaleString('en-US') + ' tokens)' : '')),
      h('div', { class: 'fact' }, h('span', null, 'Fits on'), h('strong', { 'data-estimate-fits': fitting.length }, fitting.length + ' of ' + estimate.workers.length + ' workers'))),
    estimate.workers.length ? h('table', { class: 'compact' },
      h('caption', null, 'One instance, worker by worker'),
      h('thead', null, h('tr', null, h('th', null, 'Worker'), h('th', null, 'Fits'), h('th', null, 'Where, or why not'))),
      h('tbody', null, estimate.workers.map((w) => h('tr', { 'data-estimate-worker': w.worker_name },
        h('td', null, w.worker_name, w.simulated_gpus ? [' ', h('span', { class: 'badge sim' }, 'simulated')] : null),
        h('td', null, h('span', { class: 'badge ' + (w.fits ? 'ok' : 'warn') }, w.fits ? 'yes' : 'no')),
        h('td', { class: 'small' }, w.fits ? where(w) : w.reason))))) : h('div', { class: 'muted' }, 'No workers yet.'),
    replicaTable);
}

/**
 * The new-model form. `preset` (a catalog entry, or one made of an upload) fills it in and
 * checks at once where the model would fit. Where the caller may see more than one
 * cluster, it asks which to deploy into: `clusterId` chosen first, else the default one
 * (for an admin) or the first of theirs (for a cluster administrator, who is asked even
 * for one: a model that names no cluster goes into the default one, which may not be theirs).
 * @param {(model?: Model) => void} onDone called with the model created, or without one on Cancel
 * @param {CatalogEntry} [preset]
 * @param {number | null} [clusterId]
 * @returns {HTMLFormElement}
 */
export function modelForm(onDone, preset, clusterId) {
  const name = h('input', { required: true, placeholder: 'llama-3-8b', maxlength: 63 });
  const cluster = h('select', { 'aria-label': 'Cluster', 'data-cluster-select': '' });
  const description = h('input', { placeholder: 'optional' });
  const admin = Boolean(isAdmin());
  const sourceType = h('select', null,
    h('option', { value: 'local_path' }, 'Local path'),
    h('option', { value: 'huggingface' }, 'Hugging Face repository'),
    h('option', { value: 'url' }, 'URL'),
    // The uploads are the admins' (the model files screen).
    admin ? h('option', { value: 'upload' }, 'Uploaded file') : null);
  const path = h('input', { placeholder: '/models/llama-3-8b.Q4_K_M.gguf' });
  const repo = h('input', { placeholder: 'owner/name' });
  const file = h('input', { placeholder: 'optional: one file, e.g. model.Q4_K_M.gguf' });
  const url = h('input', { type: 'url', placeholder: 'https://example.com/model.gguf' });
  const upload = h('select', { 'aria-label': 'Uploaded file' });
  const backend = h('select', null, ['llama.cpp', 'vllm', 'sglang', 'custom'].map((b) => h('option', { value: b }, b)));
  const customCommand = h('input', { placeholder: 'my-server --model {model_path} --port {port} --host {host}' });
  const replicas = h('input', { type: 'number', min: 0, max: 1000, value: '1', required: true });
  const args = h('input', { placeholder: '--ctx-size 4096 --parallel 4' });
  const strategy = h('select', null, h('option', { value: 'spread' }, 'spread'), h('option', { value: 'binpack' }, 'binpack'));
  const selector = h('input', { placeholder: 'gpu=a100, zone=eu-1' });
  const cpuOffload = h('input', { type: 'checkbox', checked: true });
  const error = h('div', { class: 'alert', role: 'alert' });
  const submit = h('button', { class: 'primary', type: 'submit' }, 'Create model');

  const pathField = field('Path', path, 'Absolute path of a file or directory, present on the server (which reads its header) and on the workers, under their model directories.', 'wide');
  // Wide: a repository's and a file's names are long, and shown whole.
  const repoField = field('Repository', repo, null, 'wide');
  const fileField = field('File', file, null, 'wide');
  const urlField = field('URL', url, null, 'wide');
  const uploadField = field('Uploaded file', upload,
    ['Complete uploads. Upload a file on the ', h('a', { href: '#/model-files' }, 'Model files'), ' screen.'], 'wide');
  const commandField = field('Command template', customCommand,
    'Placeholders: {model_path} {port} {gpu_ids} {host}. Split like a shell would, run without one.', 'wide');
  const offloadField = checkField('Allow CPU offload (llama.cpp)', cpuOffload);
  const clusterField = field('Cluster', cluster, 'Its instances run on this cluster’s workers only.');
  clusterField.classList.add('hidden');
  // Offered once the clusters are read, and only when there is a choice; the option
  // chosen first is the one a reset of the form goes back to.
  const clustersRead = loadClusters().then((clusters) => {
    if (clusters.length < (admin ? 2 : 1)) return;
    const wanted = clusters.find((c) => c.id === clusterId)
      || (admin ? clusters.find((c) => c.is_default) : undefined) || clusters[0];
    cluster.replaceChildren(...clusters.map((c) => {
      const option = h('option', { value: String(c.id) }, c.name + (c.is_default ? ' (default)' : ''));
      option.defaultSelected = c === wanted;
      return option;
    }));
    cluster.value = String(wanted.id);
    clusterField.classList.remove('hidden');
  });

  const sync = () => {
    pathField.classList.toggle('hidden', sourceType.value !== 'local_path');
    repoField.classList.toggle('hidden', sourceType.value !== 'huggingface');
    fileField.classList.toggle('hidden', sourceType.value !== 'huggingface');
    urlField.classList.toggle('hidden', sourceType.value !== 'url');
    uploadField.classList.toggle('hidden', sourceType.value !== 'upload');
    commandField.classList.toggle('hidden', backend.value !== 'custom');
    offloadField.classList.toggle('hidden', backend.value !== 'llama.cpp');
  };
  // The uploads are read when they are asked for, so one finished since the form was
  // built is offered too.
  /** @param {number} [wanted] the upload to choose, else the one chosen now */
  const loadUploads = async (wanted) => {
    const chosen = wanted != null ? String(wanted) : upload.value;
    upload.replaceChildren(h('option', { value: '' }, 'Loading…'));
    try {
      /** @type {Page<Upload>} */
      const uploads = await api('GET', '/api/v1/model-files/uploads');
      const ready = uploads.items.filter((u) => u.state === 'ready');
      upload.replaceChildren(...(ready.length
        ? ready.map((u) => h('option', { value: String(u.id) }, u.name + ' (' + fmtBytes(u.size) + ')'))
        : [h('option', { value: '' }, 'no complete uploads yet')]));
      if (ready.some((u) => String(u.id) === chosen)) upload.value = chosen;
    } catch (e) {
      upload.replaceChildren(h('option', { value: '' }, 'cannot list the uploads: ' + e.message));
    }
  };
  sourceType.addEventListener('change', () => {
    sync();
    if (sourceType.value === 'upload') loadUploads();
  });
  backend.addEventListener('change', sync);

  /** The `source` of the new model, from the fields of the chosen type. */
  const source = () => {
    switch (sourceType.value) {
      case 'local_path': return { type: 'local_path', path: path.value.trim() };
      case 'huggingface': return Object.assign({ type: 'huggingface', repo_id: repo.value.trim() }, file.value.trim() ? { file: file.value.trim() } : {});
      case 'upload':
        if (!upload.value) throw new Error('Choose an uploaded file: upload one on the Model files screen first.');
        return { type: 'upload', id: Number(upload.value) };
      // Offered only when the form was opened from a catalog entry.
      case 'preset': return /** @type {CatalogEntry} */ (preset).source;
      default: return { type: 'url', url: url.value.trim() };
    }
  };

  /** The `POST /api/v1/models` body the fields make. */
  const request = () => {
    /** @type {Record<string, unknown>} */
    const body = {
      name: name.value.trim(),
      description: description.value.trim(),
      source: source(),
      backend: backend.value,
      replicas: Number(replicas.value),
      backend_args: splitArgs(args.value),
      placement_strategy: strategy.value,
      worker_selector: parseLabels(selector.value),
    };
    if (cluster.value) body.cluster_id = Number(cluster.value);
    if (backend.value === 'custom' && customCommand.value.trim()) body.custom_command = customCommand.value.trim();
    if (backend.value === 'llama.cpp') body.cpu_offload = cpuOffload.checked;
    return body;
  };
  const estimateBox = h('div');
  const checkFit = h('button', {
    type: 'button',
    onclick: async () => {
      error.textContent = '';
      checkFit.disabled = true;
      estimateBox.replaceChildren(h('div', { class: 'muted' }, 'Reading the model’s headers…'));
      try {
        estimateBox.replaceChildren(estimateView(await api('POST', '/api/v1/models/estimate', request())));
      } catch (e) {
        estimateBox.replaceChildren();
        error.textContent = sentence(e, MODEL_FIELDS);
      } finally {
        checkFit.disabled = false;
      }
    },
  }, 'Check fit');

  const form = h('form', {
    class: 'panel',
    onsubmit: async (event) => {
      event.preventDefault();
      error.textContent = '';
      let body;
      try {
        body = request();
      } catch (e) {
        error.textContent = e.message;
        return;
      }
      submit.disabled = true;
      try {
        const model = await api('POST', '/api/v1/models', body);
        toast('Model ' + model.name + ' created with ' + model.replicas + ' replica' + (model.replicas === 1 ? '' : 's') + '.');
        form.reset();
        estimateBox.replaceChildren();
        sync();
        onDone(model);
      } catch (e) {
        error.textContent = sentence(e, MODEL_FIELDS);
      } finally {
        submit.disabled = false;
      }
    },
  },
  h('h2', null, preset ? 'Deploy ' + preset.title : 'New model'),
  h('div', { class: 'form-grid' },
    field('Name', name, 'Lowercase letters, digits, “-”, “_”, “.”'),
    clusterField,
    field('Backend', backend),
    field('Replicas', replicas),
    field('Placement strategy', strategy, 'spread: emptiest worker first; binpack: fullest that fits.'),
    field('Source', sourceType),
    pathField, repoField, fileField, urlField, uploadField,
    commandField,
    field('Backend arguments', args, 'Passed to the backend as written (quotes group words).', 'wide'),
    field('Worker selector', selector, 'Labels a worker must have: k=v, comma-separated.'),
    field('Description', description, null, 'wide'),
    offloadField),
  estimateBox,
  error,
  h('div', { class: 'form-actions' },
    submit,
    checkFit,
    h('button', { type: 'button', onclick: () => { form.reset(); estimateBox.replaceChildren(); sync(); error.textContent = ''; onDone(); } }, 'Cancel')));
  sync();
  if (preset) {
    name.value = preset.name;
    description.value = preset.description || '';
    backend.value = preset.backend;
    args.value = joinArgs(preset.backend_args || []);
    const src = preset.source;
    const fielded = ['local_path', 'huggingface', 'url', 'upload'];
    if (!fielded.includes(src.type)) {
      // A source the form has no fields for (ModelScope, S3): kept as it is.
      sourceType.append(h('option', { value: 'preset' }, 'As in the catalog: ' + describeSource(src)));
    }
    sourceType.value = fielded.includes(src.type) ? src.type : 'preset';
    if (src.type === 'local_path') path.value = src.path;
    if (src.type === 'huggingface') {
      repo.value = src.repo_id;
      file.value = src.file || '';
    }
    if (src.type === 'url') url.value = /** @type {string[]} */ ([]).concat(src.url)[0];
    sync();
    // The uploads and clusters are read first, so the check has the file to read and asks
    // about the cluster chosen.
    Promise.all([src.type === 'upload' ? loadUploads(src.id) : null, clustersRead]).then(() => checkFit.click());
  }
  return form;
}
