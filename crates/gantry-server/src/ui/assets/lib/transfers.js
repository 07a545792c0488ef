// @ts-check
// Uploads under way: sendUpload() sends a file to the servers a chunk per PATCH, resends a
// chunk that failed for a reason that may pass, and measures the speed. The transfers
// outlive the model files screen that starts them (it listens to them while it is open),
// and stop when the session ends.

import { api } from './api.js';

/** @import { ApiError } from './api.js' */
/** @import { Upload } from './api-types' */

/**
 * One upload this page is sending: where it started and when, its speed so far
 * (undefined until a chunk arrived), and what stops it.
 * @typedef {object} Transfer
 * @property {Upload} upload the server's latest answer
 * @property {number} from
 * @property {number} startedAt
 * @property {number | undefined} speed bytes per second
 * @property {AbortController} controller
 */

/**
 * Bytes sent per PATCH of an upload. A chunk that fails is sent again from the offset
 * the server reports, so a dropped connection costs at most this much twice; the
 * progress moves once per chunk.
 */
const UPLOAD_CHUNK_BYTES = 8 << 20;

/** Tries at one chunk before the transfer gives up and the upload waits for “Resume”. */
const UPLOAD_CHUNK_TRIES = 4;

/**
 * The uploads this page is sending now, by upload id. Leaving the model files screen
 * does not stop a transfer, so they live here and the screen listens to them.
 * @type {Map<number, Transfer>}
 */
export const transfers = new Map();

/**
 * Called at every change of `transfers`: a chunk sent, a transfer begun or ended.
 * @type {Set<() => void>}
 */
export const transferListeners = new Set();

/** Tells the listeners that `transfers` changed. */
function transfersChanged() {
  for (const listener of Array.from(transferListeners)) listener();
}

/** Stops every transfer: each upload waits for “Resume”. */
export function stopTransfers() {
  for (const transfer of transfers.values()) transfer.controller.abort();
}

/**
 * Refusals that may pass: the network, a conflict over the offset, a busy server.
 * @param {ApiError} error
 * @returns {boolean}
 */
function worthRetrying(error) {
  return error.status === 0 || error.status === 408 || error.status === 409 || error.status === 429 || error.status >= 500;
}

/**
 * @param {number} ms
 * @returns {Promise<void>}
 */
function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/**
 * Sends `file` into `upload` from its `bytes_received` on, a chunk per PATCH, until the
 * server answers that it is ready. Answers the ready upload, or null when the transfer
 * was stopped. A chunk that fails for a reason that may pass is sent again from the
 * offset GET reports; any other refusal (a wrong SHA-256, a deleted upload) is thrown,
 * and the upload waits for “Resume”.
 * @param {Upload} upload
 * @param {File} file
 * @returns {Promise<Upload | null>}
 */
export async function sendUpload(upload, file) {
  /** @type {Transfer} */
  const transfer = {
    upload,
    from: upload.bytes_received,
    startedAt: Date.now(),
    speed: undefined,
    controller: new AbortController(),
  };
  transfers.set(upload.id, transfer);
  transfersChanged();
  const path = '/api/v1/model-files/uploads/' + upload.id;
  const signal = transfer.controller.signal;
  let failures = 0;
  let resync = false;
  try {
    while (transfer.upload.state !== 'ready') {
      try {
        if (resync) {
          transfer.upload = await api('GET', path, undefined, { signal });
          resync = false;
          continue;
        }
        const offset = transfer.upload.bytes_received;
        // Empty when every byte arrived but the upload is not complete yet (its last
        // PATCH failed after writing): this PATCH completes it.
        const chunk = file.slice(offset, offset + UPLOAD_CHUNK_BYTES);
        transfer.upload = await api('PATCH', path, chunk, {
          signal,
          headers: { 'content-type': 'application/offset+octet-stream', 'upload-offset': String(offset) },
        });
        failures = 0;
      } catch (e) {
        if (signal.aborted) return null;
        failures += 1;
        if (!worthRetrying(e) || failures >= UPLOAD_CHUNK_TRIES) throw e;
        resync = true;
        await sleep(1000 * failures);
        continue;
      }
      const seconds = (Date.now() - transfer.startedAt) / 1000;
      transfer.speed = (transfer.upload.bytes_received - transfer.from) / Math.max(seconds, 0.001);
      transfersChanged();
    }
    return transfer.upload;
  } finally {
    transfers.delete(upload.id);
    transfersChanged();
  }
}
