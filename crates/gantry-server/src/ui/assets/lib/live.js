// @ts-check
// Keeping screens current. The lists that change on their own (models, instances,
// workers) follow the API's ?watch=true NDJSON streams and fall back to polling while a
// stream cannot be held open; a screen subscribes to them and is redrawn at most once per
// animation frame, however many changes arrive. A screen filtered by cluster follows that
// cluster's lists (liveIn(), the same lists with ?cluster_id=), which the server filters.
// ticker() redraws for relative times, and a screen's render answers one cleanup
// (combine()) that the router runs when it leaves.

import { errorFrom, listAll, reportAuthFailure } from './api.js';
import { h } from './dom.js';

/** @import { ApiError } from './api.js' */
/** @import { Instance, Model, Worker } from './api-types' */

/**
 * The lists that change on their own: every model, instance and worker the caller may
 * see, or a cluster's.
 * @typedef {{models: LiveList<Model>, instances: LiveList<Instance>, workers: LiveList<Worker>}} LiveLists
 */

const POLL_INTERVAL_MS = 5000;

const SNAPSHOT_QUIET_MS = 150;

const STOP_AFTER_IDLE_MS = 10000;

/**
 * A list kept current: a watch stream (the server first sends every object as
 * CREATED, then changes), or polling while a stream cannot be held. Views subscribe
 * and are called (batched per frame) whenever the items change.
 * @template {{id: number}} T
 */
export class LiveList {
  /** @param {string} path the list's API path, which also answers `?watch=true` */
  constructor(path) {
    this.path = path;
    /** @type {Map<number, T>} the objects by id; empty until loaded */
    this.items = new Map();
    /** Whether `items` holds a whole answer (or `error` says why not). */
    this.loaded = false;
    /** @type {ApiError | Error | null} why the last read failed */
    this.error = null;
    /** @type {'idle' | 'connecting' | 'live' | 'polling' | 'offline'} */
    this.mode = 'idle';
    /** @type {Set<() => void>} */
    this.listeners = new Set();
    /** Bumped by every (re)start and stop: a stream or poll of an older one gives up. */
    this.generation = 0;
    this.retryDelay = 2000;
    /** @type {Set<ReturnType<typeof setTimeout>>} */
    this.timers = new Set();
    this.frame = 0;
    /** @type {ReturnType<typeof setTimeout> | undefined} stops the list once nobody follows it */
    this.idleStop = undefined;
    /** @type {AbortController | null} ends the open stream */
    this.abort = null;
  }

  /**
   * Calls `listener` now (starting the list if it is idle) and at every change.
   * @param {() => void} listener
   * @returns {() => void} the unsubscribe
   */
  subscribe(listener) {
    this.listeners.add(listener);
    clearTimeout(this.idleStop);
    if (this.mode === 'idle') this.start();
    else listener();
    return () => {
      this.listeners.delete(listener);
      if (!this.listeners.size) {
        // Keep the stream a little while: the next screen probably wants it too.
        this.idleStop = setTimeout(() => this.stop(), STOP_AFTER_IDLE_MS);
      }
    };
  }

  /** @returns {T[]} the objects by id */
  values() {
    return Array.from(this.items.values()).sort((a, b) => a.id - b.id);
  }

  notify() {
    if (this.frame) return;
    this.frame = requestAnimationFrame(() => {
      this.frame = 0;
      for (const listener of Array.from(this.listeners)) listener();
    });
    updateLiveIndicator();
  }

  /** @param {LiveList<T>['mode']} mode */
  setMode(mode) {
    this.mode = mode;
    updateLiveIndicator();
  }

  /**
   * Runs `fn` after `ms`, unless the list stops first.
   * @param {() => void} fn
   * @param {number} ms
   */
  later(fn, ms) {
    const timer = setTimeout(() => {
      this.timers.delete(timer);
      fn();
    }, ms);
    this.timers.add(timer);
  }

  start() {
    this.generation += 1;
    this.setMode('connecting');
    this.watch(this.generation);
  }

  stop() {
    this.generation += 1;
    if (this.abort) this.abort.abort();
    this.abort = null;
    for (const timer of this.timers) clearTimeout(timer);
    this.timers.clear();
    clearTimeout(this.idleStop);
    this.items = new Map();
    this.loaded = false;
    this.error = null;
    this.setMode('idle');
  }

  /** @param {number} generation */
  async watch(generation) {
    const controller = new AbortController();
    this.abort = controller;
    const sep = this.path.includes('?') ? '&' : '?';
    let response;
    try {
      response = await fetch(this.path + sep + 'watch=true', {
        credentials: 'same-origin',
        headers: { accept: 'application/x-ndjson' },
        signal: controller.signal,
      });
    } catch (e) {
      if (generation === this.generation) this.fallBack(generation);
      return;
    }
    if (generation !== this.generation) return;
    if (!response.ok) {
      const error = await errorFrom(response);
      if (error.status === 401 || error.status === 403) {
        this.fail(error);
        return;
      }
      this.fallBack(generation);
      return;
    }
    if (!response.body || !window.TextDecoder) {
      // No streaming in this browser: polling is all there is.
      this.poll(generation, false);
      return;
    }
    this.retryDelay = 2000;
    this.setMode('live');
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = '';
    // The snapshot goes into a fresh map that replaces the old one once the burst of
    // initial CREATED lines is over, so objects deleted while disconnected vanish.
    /** @type {Map<number, T> | null} */
    let fresh = new Map();
    const settle = () => {
      if (generation !== this.generation || !fresh) return;
      this.items = fresh;
      fresh = null;
      this.loaded = true;
      this.error = null;
      this.notify();
    };
    let quiet = setTimeout(settle, SNAPSHOT_QUIET_MS);
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done || generation !== this.generation) break;
        buffer += decoder.decode(value, { stream: true });
        let newline;
        while ((newline = buffer.indexOf('\n')) >= 0) {
          const line = buffer.slice(0, newline).trim();
          buffer = buffer.slice(newline + 1);
          if (line) this.apply(JSON.parse(line), fresh || this.items);
        }
        if (fresh) {
          clearTimeout(quiet);
          quiet = setTimeout(settle, SNAPSHOT_QUIET_MS);
        } else {
          this.notify();
        }
      }
    } catch (e) {
      // A dropped connection or an ERROR line (the stream fell behind): re-list.
    } finally {
      clearTimeout(quiet);
    }
    if (generation === this.generation) this.fallBack(generation);
  }

  /**
   * One line of a watch stream.
   * @param {{type: string, object: T, error?: {message: string}}} event
   * @param {Map<number, T>} into
   */
  apply(event, into) {
    if (event.type === 'CREATED' || event.type === 'UPDATED') into.set(event.object.id, event.object);
    else if (event.type === 'DELETED') into.delete(event.object.id);
    else if (event.type === 'ERROR') throw new Error(event.error ? event.error.message : 'watch error');
  }

  /** @param {ApiError} error */
  fail(error) {
    this.error = error;
    this.loaded = true;
    this.setMode('offline');
    reportAuthFailure(error);
    this.notify();
  }

  /**
   * Stream lost: poll now and every few seconds, and try the stream again later.
   * @param {number} generation
   */
  fallBack(generation) {
    this.setMode('polling');
    this.poll(generation, true);
  }

  /**
   * @param {number} generation
   * @param {boolean} retryWatch
   */
  async poll(generation, retryWatch) {
    if (generation !== this.generation) return;
    try {
      const items = await listAll(this.path);
      if (generation !== this.generation) return;
      this.items = new Map(items.map((item) => [item.id, item]));
      this.loaded = true;
      this.error = null;
      if (this.mode !== 'polling') this.setMode('polling');
    } catch (e) {
      if (generation !== this.generation) return;
      if (e.status === 401 || e.status === 403) {
        this.fail(e);
        return;
      }
      this.error = e;
      this.setMode('offline');
    }
    this.notify();
    if (retryWatch) {
      const delay = this.retryDelay;
      this.retryDelay = Math.min(this.retryDelay * 2, 60000);
      this.later(() => {
        if (generation === this.generation) {
          this.generation += 1;
          this.watch(this.generation);
        }
      }, delay);
      // Keep polling until the retried stream takes over (it bumps the generation).
      this.later(() => this.poll(generation, false), POLL_INTERVAL_MS);
    } else {
      this.later(() => this.poll(generation, false), POLL_INTERVAL_MS);
    }
  }
}

/**
 * The lists of one cluster (`query`: `?cluster_id=ID`), or of every cluster (none).
 * @param {string} query
 * @returns {LiveLists}
 */
function liveLists(query) {
  return {
    models: new LiveList('/api/v1/models' + query),
    instances: new LiveList('/api/v1/model-instances' + query),
    workers: new LiveList('/api/v1/workers' + query),
  };
}

/** The lists that change on their own, shared by every screen that shows them. */
export const live = liveLists('');

/** @type {Map<number, LiveLists>} the lists of each cluster a screen was filtered by */
const byCluster = new Map();

/**
 * The lists of cluster `clusterId`, as the server filters them; every cluster's for
 * null. Each stops on its own a while after its last screen left, like the others.
 * @param {number | null} clusterId
 * @returns {LiveLists}
 */
export function liveIn(clusterId) {
  if (clusterId == null) return live;
  let lists = byCluster.get(clusterId);
  if (!lists) {
    lists = liveLists('?cluster_id=' + clusterId);
    byCluster.set(clusterId, lists);
  }
  return lists;
}

/** @returns {LiveList<any>[]} every list there is */
function allLists() {
  return [live, ...byCluster.values()].flatMap((lists) => [lists.models, lists.instances, lists.workers]);
}

/**
 * Shows in the top bar's #live how the lists are followed: live, polling, disconnected.
 */
function updateLiveIndicator() {
  const el = document.getElementById('live');
  if (!el) return;
  const modes = allLists().map((l) => l.mode).filter((m) => m !== 'idle');
  let text = 'idle';
  let cls = '';
  if (modes.includes('offline')) {
    text = 'disconnected';
    cls = 'live-offline';
  } else if (modes.includes('polling')) {
    text = 'polling';
    cls = 'live-polling';
  } else if (modes.includes('live')) {
    text = 'live';
    cls = 'live-on';
  } else if (modes.includes('connecting')) {
    text = 'connecting';
  }
  el.className = 'live ' + cls;
  el.textContent = text;
  /** @type {Record<string, string>} */
  const titles = {
    live: 'Following changes as they happen (watch streams)',
    polling: 'The watch stream is unavailable; re-reading every 5 s',
    disconnected: 'Cannot reach the server; retrying',
  };
  el.title = titles[text] || '';
}

/**
 * Subscribes a view to lists; returns the unsubscribe-all.
 * @param {LiveList<any>[]} lists
 * @param {() => void} draw
 * @returns {() => void}
 */
export function follow(lists, draw) {
  const unsubscribe = lists.map((list) => list.subscribe(draw));
  return () => unsubscribe.forEach((u) => u());
}

/**
 * Shown in place of a table while a list loads or when it failed.
 * @param {LiveList<any>[]} lists
 * @returns {HTMLDivElement | null}
 */
export function listStatus(lists) {
  const failed = lists.find((l) => l.error && !l.items.size);
  if (failed && failed.error) return h('div', { class: 'panel' }, h('div', { class: 'alert' }, failed.error.message));
  if (lists.some((l) => !l.loaded)) return h('div', { class: 'panel empty' }, 'Loading…');
  return null;
}

/**
 * A redraw every few seconds, for relative times ("12 s ago").
 * @param {() => void} draw
 * @param {number} [ms]
 * @returns {() => void} the stop
 */
export function ticker(draw, ms) {
  const timer = setInterval(draw, ms || 5000);
  return () => clearInterval(timer);
}

/**
 * One cleanup that runs them all: what a screen's render answers.
 * @param {...(() => void)} cleanups
 * @returns {() => void}
 */
export function combine(...cleanups) {
  return () => cleanups.forEach((c) => c());
}

/** Stops following every list, at once (the session ended). */
export function stopLiveLists() {
  for (const list of allLists()) list.stop();
}
