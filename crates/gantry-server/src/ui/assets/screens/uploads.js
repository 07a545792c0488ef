// @ts-check
// The uploads part of the model files screen: the files uploaded to the servers, the form
// that uploads one (sent in chunks by lib/transfers.js, resumable), their progress,
// deploying one (the new-model form with the file as its source), and deleting one no model
// uses.

import { api } from '../lib/api.js';
import { confirmDialog, openDialog } from '../lib/dialogs.js';
import { field, h, toast } from '../lib/dom.js';
import { fmtBytes } from '../lib/format.js';
import { sendUpload, transferListeners, transfers } from '../lib/transfers.js';
import { progressBar, stateBadge, timeCell } from '../lib/widgets.js';
import { modelForm } from './model-form.js';

/** @import { CatalogEntry, Upload } from '../lib/api-types' */

/** @type {Record<string, string>} */
const UPLOAD_STATE_CLASS = { uploading: 'info', ready: 'ok' };

/**
 * Runs a transfer and says how it ended: a toast when it is done or stopped, the error in
 * `alert` (or a toast, when its screen is gone).
 * @param {Upload} upload
 * @param {File} file
 * @param {HTMLElement} alert
 * @param {() => void} reload
 */
async function runUpload(upload, file, alert, reload) {
  alert.textContent = '';
  try {
    const done = await sendUpload(upload, file);
    if (done) toast(done.name + ' is uploaded (' + fmtBytes(done.size) + '): a model can use it as its source now.');
    else toast('The upload of ' + upload.name + ' stopped; “Resume” continues it.');
  } catch (e) {
    const message = 'The upload of ' + upload.name + ' stopped: ' + e.message;
    if (alert.isConnected) alert.textContent = message;
    else toast(message, 'error');
  }
  reload();
}

/**
 * The model files screen's second part: the files uploaded to the servers, the control
 * that uploads one, and the progress of the transfers. Answers its element and its
 * cleanup.
 * @param {number} pollMs how often the list is read again
 * @returns {{element: HTMLElement, cleanup: () => void}}
 */
export function uploadsSection(pollMs) {
  const tableBox = h('div', null, h('div', { class: 'panel empty' }, 'Loading…'));
  const deployBox = h('div', { class: 'deploy-box', 'data-upload-deploy': '' });
  /** @param {Upload} upload */
  const deploy = (upload) => {
    deployBox.replaceChildren(modelForm((model) => {
      deployBox.replaceChildren();
      if (model) location.hash = '#/models/' + encodeURIComponent(model.name);
    }, uploadPreset(upload)));
    deployBox.scrollIntoView({ block: 'start' });
  };
  const transfersBox = h('div', { class: 'transfers' });
  const chooser = h('input', { type: 'file', 'aria-label': 'File to upload', required: true });
  const digest = h('input', { class: 'mono', placeholder: 'optional: 64 hex digits', pattern: '[0-9a-fA-F]{64}', 'aria-label': 'SHA-256' });
  const error = h('div', { class: 'alert', role: 'alert' });
  const submit = h('button', { class: 'primary', type: 'submit' }, 'Upload');
  const form = h('form', {
    class: 'panel',
    onsubmit: async (event) => {
      event.preventDefault();
      error.textContent = '';
      // A file is chosen: the input is required.
      const file = /** @type {FileList} */ (chooser.files)[0];
      /** @type {{name: string, size: number, sha256?: string}} */
      const body = { name: file.name, size: file.size };
      if (digest.value.trim()) body.sha256 = digest.value.trim().toLowerCase();
      submit.disabled = true;
      let upload;
      try {
        upload = await api('POST', '/api/v1/model-files/uploads', body);
      } catch (e) {
        error.textContent = e.message;
        return;
      } finally {
        submit.disabled = false;
      }
      form.reset();
      load();
      runUpload(upload, file, error, load);
    },
  },
  h('h2', null, 'Upload a file'),
  h('div', { class: 'upload-form' },
    field('File', chooser, 'A model file, such as a GGUF for llama.cpp.'),
    field('SHA-256', digest, 'Checked when the last byte arrives.'),
    submit),
  error,
  transfersBox);

  /** @type {Upload[] | null} the last answer */
  let list = null;
  /** @type {Error | null} why the last read failed */
  let loadError = null;
  const draw = () => {
    transfersBox.replaceChildren(...Array.from(transfers.values()).map((t) =>
      h('div', { class: 'transfer', 'data-transfer': t.upload.id },
        h('strong', { class: 'mono' }, t.upload.name),
        progressBar(t.upload.bytes_received, t.upload.size, { speed: t.speed, label: 'Upload of ' + t.upload.name }),
        h('button', { class: 'small', type: 'button', onclick: () => t.controller.abort() }, 'Stop'))));

    if (!list) {
      tableBox.replaceChildren(loadError
        ? h('div', { class: 'panel' }, h('div', { class: 'alert' }, loadError.message))
        : h('div', { class: 'panel empty' }, 'Loading…'));
      return;
    }
    // Keep the last answer on screen when a refresh fails, and say that it is stale.
    const notices = loadError ? [h('div', { class: 'alert' }, 'Cannot refresh the uploads: ' + loadError.message)] : [];
    if (!list.length) {
      tableBox.replaceChildren(...notices, h('div', { class: 'panel empty' }, 'No uploads yet.'));
      return;
    }
    const rows = list.map((listed) => {
      const sending = transfers.get(listed.id);
      // What this page sends is newer than the last listing.
      const u = sending ? sending.upload : listed;
      const waiting = u.state === 'uploading' && !sending;
      return h('tr', { 'data-upload': u.id },
        h('td', { class: 'file-name' },
          h('strong', { class: 'mono', 'data-part': 'name' }, u.name),
          h('div', { class: 'muted small mono', title: 'Where the bytes are kept' }, u.location)),
        h('td', { class: 'num opt', 'data-part': 'size' }, fmtBytes(u.size)),
        h('td', null, stateBadge(u.state, UPLOAD_STATE_CLASS),
          u.state === 'uploading'
            ? progressBar(u.bytes_received, u.size, { paused: waiting, label: 'Upload of ' + u.name })
            : null,
          waiting ? h('div', { class: 'state-message' }, 'Not being sent from this page: “Resume” continues it.') : null),
        h('td', { class: 'opt', 'data-part': 'sha256' }, u.sha256
          ? h('code', { class: 'small', title: u.sha256 + (u.state === 'ready' ? '' : '\nDeclared: checked when the last byte arrives') }, u.sha256.slice(0, 12) + '…')
          : h('span', { class: 'muted', title: 'Computed when the last byte arrives' }, '—')),
        h('td', { class: 'opt' }, timeCell(u.created_at)),
        h('td', { class: 'actions' },
          waiting ? h('button', { class: 'small', onclick: () => resumeUpload(u, error, load) }, 'Resume') : null,
          u.state === 'ready' ? h('button', { class: 'small primary', title: 'Declare a model served from ' + u.name, onclick: () => deploy(u) }, 'Deploy') : null,
          h('button', { class: 'small danger', onclick: () => deleteUpload(u, load) }, 'Delete')));
    });
    tableBox.replaceChildren(...notices, h('div', { class: 'panel flush' }, h('table', null,
      h('thead', null, h('tr', null,
        h('th', null, 'File'), h('th', { class: 'num opt' }, 'Size'), h('th', null, 'State'),
        h('th', { class: 'opt' }, 'SHA-256'), h('th', { class: 'opt' }, 'Created'), h('th', null))),
      h('tbody', null, rows))));
  };

  let stopped = false;
  /** @type {ReturnType<typeof setTimeout> | undefined} the next read */
  let timer;
  // Only the latest read draws and schedules the next: an upload or a delete reloads at once.
  let latest = 0;
  const load = async () => {
    clearTimeout(timer);
    const mine = ++latest;
    try {
      const answer = await api('GET', '/api/v1/model-files/uploads');
      if (stopped || mine !== latest) return;
      list = answer.items;
      loadError = null;
    } catch (e) {
      if (stopped || mine !== latest) return;
      loadError = e;
    }
    draw();
    timer = setTimeout(load, pollMs);
  };
  load();
  transferListeners.add(draw);

  const element = h('section', { 'data-uploads': '' },
    h('h2', { class: 'section-head' }, 'Uploads'),
    h('p', { class: 'section-note muted small' },
      'Files uploaded to the servers, to deploy as a model’s source (“Uploaded file” in a new model). The workers download them from the servers.'),
    deployBox, form, tableBox);
  return {
    element,
    cleanup: () => {
      stopped = true;
      clearTimeout(timer);
      transferListeners.delete(draw);
    },
  };
}

/**
 * What the new-model form starts from for an upload, as the catalog's Deploy gives it an
 * entry: the file as the source, and a name made of the file's (lowercase, without its
 * extension, in the characters a model name may have).
 * @param {Upload} upload
 * @returns {CatalogEntry}
 */
function uploadPreset(upload) {
  const name = upload.name.toLowerCase().replace(/\.gguf$/, '').replace(/[^a-z0-9._-]+/g, '-')
    .replace(/^[^a-z0-9]+/, '').slice(0, 63);
  return {
    name,
    title: upload.name,
    description: '',
    tags: [],
    parameters: '',
    size: fmtBytes(upload.size),
    source: { type: 'upload', id: upload.id },
    backend: 'llama.cpp',
    backend_args: [],
  };
}

/**
 * Asks for the file of an interrupted upload again, and continues it from where it stopped.
 * @param {Upload} upload
 * @param {HTMLElement} alert
 * @param {() => void} reload
 */
function resumeUpload(upload, alert, reload) {
  const chooser = h('input', { type: 'file', 'aria-label': 'File to upload', required: true });
  openDialog('Resume ' + upload.name, [
    h('p', null, 'Pick ', h('strong', { class: 'mono' }, upload.name), ' (' + fmtBytes(upload.size) + ') again: the upload continues from '
      + fmtBytes(upload.bytes_received) + ' of ' + fmtBytes(upload.size) + '.'),
    field('File', chooser),
  ], {
    submitLabel: 'Resume',
    onSubmit: async () => {
      const file = /** @type {FileList} */ (chooser.files)[0];
      if (file.size !== upload.size) {
        throw new Error(file.name + ' has ' + file.size + ' bytes, but ' + upload.name + ' has ' + upload.size
          + ': pick the same file.');
      }
      if (transfers.has(upload.id)) throw new Error('This page is sending ' + upload.name + ' already.');
      // Where the server is now: another page may have sent more since the list was read.
      const current = await api('GET', '/api/v1/model-files/uploads/' + upload.id);
      runUpload(current, file, alert, reload);
    },
  });
}

/**
 * @param {Upload} upload
 * @param {() => void} reload
 */
function deleteUpload(upload, reload) {
  confirmDialog('Delete ' + upload.name + '?',
    'The file goes from the servers. The server refuses while a model uses it as its source.',
    'Delete upload',
    async () => {
      const sending = transfers.get(upload.id);
      if (sending) sending.controller.abort();
      await api('DELETE', '/api/v1/model-files/uploads/' + upload.id);
      toast(upload.name + ' deleted.');
      reload();
    });
}
