// gantry web UI: a dependency-free single-page app over the management API.
//
// It calls only the JSON API the CLI and scripts use, authenticated by the
// `gantry_session` cookie that POST /auth/login sets. Screens are chosen by the URL
// hash (#/models, #/instances/12/logs, ...), so the server serves one page. Every
// element is built with DOM calls (never innerHTML), so names, labels and log lines
// coming from the API are always text. Lists that change on their own (instances,
// workers, models) follow the API's ?watch=true NDJSON streams and fall back to
// polling when a stream cannot be held open; lists without a stream (servers, model
// files) are re-read every few seconds while their screen is open.
'use strict';

(function () {
  // ---------------------------------------------------------------- DOM helpers

  /** Builds an element: h('td', {class: 'num'}, 'text', childNode, [more]). */
  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    const late = {};
    if (attrs) {
      for (const [key, value] of Object.entries(attrs)) {
        if (value == null || value === false) continue;
        if (key === 'class') el.className = value;
        else if (key.startsWith('on') && typeof value === 'function') el.addEventListener(key.slice(2), value);
        else if (key === 'value' || key === 'checked' || key === 'selected') late[key] = value;
        else el.setAttribute(key, value === true ? '' : String(value));
      }
    }
    append(el, children);
    // Set after the options exist, so a <select> can take its value.
    for (const [key, value] of Object.entries(late)) el[key] = value;
    return el;
  }

  function append(el, children) {
    for (const child of children.flat(Infinity)) {
      if (child == null || child === false) continue;
      el.append(child instanceof Node ? child : String(child));
    }
    return el;
  }

  function toast(message, kind) {
    const box = document.getElementById('toasts');
    const el = h('div', { class: 'toast' + (kind === 'error' ? ' error' : ''), role: 'status' }, message);
    box.append(el);
    setTimeout(() => el.remove(), kind === 'error' ? 7000 : 3500);
  }

  // ---------------------------------------------------------------- formatting

  function fmtBytes(bytes) {
    if (bytes == null) return '—';
    const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let value = Number(bytes);
    let unit = 0;
    while (value >= 1024 && unit < units.length - 1) {
      value /= 1024;
      unit += 1;
    }
    return (unit === 0 ? value : value.toFixed(value >= 100 ? 0 : 1)) + ' ' + units[unit];
  }

  /** "12 s ago", "in 3 d": coarse on purpose; the exact time is in the title. */
  function fmtAgo(iso) {
    if (!iso) return '—';
    const then = Date.parse(iso);
    if (Number.isNaN(then)) return iso;
    const seconds = Math.round((Date.now() - then) / 1000);
    const abs = Math.abs(seconds);
    let text;
    if (abs < 5) return 'just now';
    if (abs < 60) text = abs + ' s';
    else if (abs < 3600) text = Math.floor(abs / 60) + ' min';
    else if (abs < 86400) text = Math.floor(abs / 3600) + ' h';
    else text = Math.floor(abs / 86400) + ' d';
    return seconds >= 0 ? text + ' ago' : 'in ' + text;
  }

  /** "45 s", "4 min 20 s", "3 h 5 min", "2 d 3 h": a duration, as precise as it is useful. */
  function fmtDuration(seconds) {
    const s = Math.max(0, Math.round(seconds));
    if (s < 60) return s + ' s';
    if (s < 600) return Math.floor(s / 60) + ' min ' + (s % 60) + ' s';
    if (s < 3600) return Math.floor(s / 60) + ' min';
    if (s < 86400) return Math.floor(s / 3600) + ' h ' + Math.floor((s % 3600) / 60) + ' min';
    return Math.floor(s / 86400) + ' d ' + Math.floor((s % 86400) / 3600) + ' h';
  }

  function timeCell(iso) {
    return h('span', { class: 'nowrap', title: iso ? new Date(iso).toLocaleString() : '' }, fmtAgo(iso));
  }

  const INSTANCE_STATE_CLASS = {
    running: 'ok',
    starting: 'info',
    downloading: 'info',
    scheduled: 'info',
    analyzing: 'info',
    pending: 'warn',
    error: 'danger',
    unreachable: 'danger',
  };
  const INSTANCE_STATES = ['running', 'starting', 'downloading', 'scheduled', 'analyzing', 'pending', 'error', 'unreachable'];
  const WORKER_STATE_CLASS = { ready: 'ok', not_ready: 'warn', unreachable: 'danger', maintenance: 'idle' };
  const WORKER_STATES = ['ready', 'not_ready', 'unreachable', 'maintenance'];

  function stateBadge(state, classes) {
    return h('span', { class: 'badge ' + (classes[state] || 'idle') }, String(state).replace('_', ' '));
  }

  /**
   * A progress bar with its numbers under it: percent, bytes done of the total, and, when
   * a speed is given, the speed and the time left at that speed. Shared by downloading
   * instances and by the files of the workers' caches.
   *
   * `total` null (or 0): the size is not known yet, so the bar only shows that something
   * moves and no percent or time left is promised. `options.speed` undefined: no speed is
   * measured (a cached file), so neither it nor the time left is shown. `options.paused`
   * draws an interrupted download; `options.compact` leaves out the speed and time left.
   */
  function progressBar(done, total, options) {
    const opts = options || {};
    const known = total != null && total > 0;
    // Floored, so a file is at 100 % only when it is complete.
    const percent = known ? Math.min(100, Math.floor((done / total) * 100)) : null;
    const fill = h('div', { class: 'progress-fill' });
    if (known) fill.style.width = Math.min(100, (done / total) * 100).toFixed(2) + '%';
    const bytes = fmtBytes(done) + ' / ' + (known ? fmtBytes(total) : '?');
    const parts = [
      h('span', { class: 'progress-percent' + (known ? '' : ' unknown'), 'data-part': 'percent' }, known ? percent + '%' : '—'),
      h('span', { 'data-part': 'bytes', title: known ? null : 'The total size is not known yet' }, bytes),
    ];
    if (opts.speed !== undefined && !opts.compact) {
      const speed = Number(opts.speed) || 0;
      parts.push(h('span', { 'data-part': 'speed' }, fmtBytes(speed) + '/s'));
      parts.push(h('span', {
        'data-part': 'eta',
        title: known && speed > 0 ? 'At the current speed' : 'Unknown: ' + (known ? 'nothing arrived lately' : 'the total size is not known'),
      }, known && speed > 0 ? fmtDuration((total - done) / speed) + ' left' : '— left'));
    }
    return h('div', {
      class: 'progress' + (opts.paused ? ' paused' : '') + (opts.compact ? ' compact' : ''),
      'data-progress': '',
      title: opts.title || null,
    },
    h('div', {
      class: 'progress-bar' + (known ? '' : ' indeterminate'),
      role: 'progressbar',
      'aria-label': opts.label || 'Download progress',
      'aria-valuemin': 0,
      'aria-valuemax': 100,
      'aria-valuenow': known ? percent : null,
      'aria-valuetext': (known ? percent + '%, ' : '') + bytes,
    }, fill),
    h('div', { class: 'progress-meta' }, parts));
  }

  /** A downloading instance's progress, from its `download` (null when it has none). */
  function instanceProgress(instance) {
    const d = instance.download;
    if (instance.state !== 'downloading' || !d) return null;
    return progressBar(d.bytes_done, d.bytes_total, {
      speed: d.bytes_per_second,
      label: 'Download of ' + instance.name,
      title: instance.state_message || null,
    });
  }

  function labelChips(labels) {
    const entries = Object.entries(labels || {});
    if (!entries.length) return h('span', { class: 'muted' }, '—');
    return entries.map(([k, v]) => h('span', { class: 'chip' }, v === '' ? k : k + '=' + v));
  }

  function describeSource(source) {
    if (!source) return '';
    switch (source.type) {
      case 'local_path': return source.path;
      case 'huggingface': return 'hf:' + source.repo_id + (source.file ? '/' + source.file : '');
      case 'modelscope': return 'modelscope:' + source.repo_id + (source.file ? '/' + source.file : '');
      case 's3': return 's3://' + source.bucket + '/' + source.key;
      // One URL, or the parts of a split file.
      case 'url': return [].concat(source.url).join(' + ');
      case 'upload': return 'upload ' + source.id;
      default: return JSON.stringify(source);
    }
  }

  /** Parses "k=v, k2=v2" or one pair per line into an object. */
  function parseLabels(text) {
    const labels = {};
    for (const part of text.split(/[\n,]/)) {
      const item = part.trim();
      if (!item) continue;
      const eq = item.indexOf('=');
      if (eq < 0) labels[item] = '';
      else labels[item.slice(0, eq).trim()] = item.slice(eq + 1).trim();
    }
    return labels;
  }

  function formatLabels(labels, separator) {
    return Object.entries(labels || {}).map(([k, v]) => k + '=' + v).join(separator);
  }

  /** Splits a command line like a shell would (quotes and backslashes), without running one. */
  function splitArgs(text) {
    const args = [];
    let current = '';
    let inWord = false;
    let quote = null;
    for (let i = 0; i < text.length; i++) {
      const c = text[i];
      if (quote) {
        if (c === quote) quote = null;
        else if (c === '\\' && quote === '"' && i + 1 < text.length) current += text[++i];
        else current += c;
      } else if (c === "'" || c === '"') {
        quote = c;
        inWord = true;
      } else if (c === '\\' && i + 1 < text.length) {
        current += text[++i];
        inWord = true;
      } else if (/\s/.test(c)) {
        if (inWord) args.push(current);
        current = '';
        inWord = false;
      } else {
        current += c;
        inWord = true;
      }
    }
    if (quote) throw new Error('backend arguments: unclosed ' + quote + ' quote');
    if (inWord) args.push(current);
    return args;
  }

  function joinArgs(args) {
    return (args || []).map((a) => (/^[\w@%+=:,./-]+$/.test(a) ? a : "'" + a.replace(/'/g, "'\\''") + "'")).join(' ');
  }

  // ---------------------------------------------------------------- the API

  class ApiError extends Error {
    constructor(status, code, message) {
      super(message);
      this.status = status;
      this.code = code;
    }
  }

  async function errorFrom(response) {
    const text = await response.text().catch(() => '');
    try {
      const body = JSON.parse(text);
      if (body && body.error) return new ApiError(response.status, body.error.code, body.error.message);
    } catch (_) {
      // Not JSON: a proxy's page, say. Fall through to the status line.
    }
    return new ApiError(response.status, 'http_' + response.status, text.trim() || response.status + ' ' + response.statusText);
  }

  /**
   * One API call. Answers the parsed JSON (null for 204, a string for text bodies).
   * A session that ended (401) or must change its password (403
   * password_change_required) sends the whole app to the matching screen, unless the
   * caller handles authentication itself (`{auth: false}`).
   *
   * `body` is sent as JSON, except a Blob (a slice of a file), which is sent as it is with
   * the content type the caller names in `options.headers`. `options.signal` aborts the
   * call.
   */
  async function api(method, path, body, options) {
    const opts = options || {};
    const init = { method, credentials: 'same-origin', headers: { accept: 'application/json' }, signal: opts.signal };
    if (body instanceof Blob) {
      init.body = body;
    } else if (body !== undefined) {
      init.headers['content-type'] = 'application/json';
      init.body = JSON.stringify(body);
    }
    Object.assign(init.headers, opts.headers);
    let response;
    try {
      response = await fetch(path, init);
    } catch (e) {
      throw new ApiError(0, 'network', 'cannot reach the gantry server (' + e.message + ')');
    }
    if (!response.ok) {
      const error = await errorFrom(response);
      if (opts.auth !== false) authFailure(error);
      throw error;
    }
    if (response.status === 204) return null;
    const type = response.headers.get('content-type') || '';
    return type.includes('json') ? response.json() : response.text();
  }

  /** Every item of a list, page by page. */
  async function listAll(path) {
    const items = [];
    const sep = path.includes('?') ? '&' : '?';
    for (let page = 1; ; page++) {
      const body = await api('GET', path + sep + 'per_page=1000&page=' + page);
      items.push(...body.items);
      if (body.items.length < 1000 || items.length >= body.pagination.total) return items;
    }
  }

  // ---------------------------------------------------------------- live lists

  const POLL_INTERVAL_MS = 5000;
  const SNAPSHOT_QUIET_MS = 150;
  const STOP_AFTER_IDLE_MS = 10000;

  /**
   * A list kept current: a watch stream (the server first sends every object as
   * CREATED, then changes), or polling while a stream cannot be held. Views subscribe
   * and are called (batched per frame) whenever the items change.
   */
  class LiveList {
    constructor(path) {
      this.path = path;
      this.items = new Map();
      this.loaded = false;
      this.error = null;
      this.mode = 'idle'; // idle | connecting | live | polling | offline
      this.listeners = new Set();
      this.generation = 0;
      this.retryDelay = 2000;
      this.timers = new Set();
      this.frame = 0;
    }

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

    setMode(mode) {
      this.mode = mode;
      updateLiveIndicator();
    }

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

    apply(event, into) {
      if (event.type === 'CREATED' || event.type === 'UPDATED') into.set(event.object.id, event.object);
      else if (event.type === 'DELETED') into.delete(event.object.id);
      else if (event.type === 'ERROR') throw new Error(event.error ? event.error.message : 'watch error');
    }

    fail(error) {
      this.error = error;
      this.loaded = true;
      this.setMode('offline');
      authFailure(error);
      this.notify();
    }

    /** Stream lost: poll now and every few seconds, and try the stream again later. */
    fallBack(generation) {
      this.setMode('polling');
      this.poll(generation, true);
    }

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

  const live = {
    models: new LiveList('/api/v1/models'),
    instances: new LiveList('/api/v1/model-instances'),
    workers: new LiveList('/api/v1/workers'),
  };

  function updateLiveIndicator() {
    const el = document.getElementById('live');
    if (!el) return;
    const modes = Object.values(live).map((l) => l.mode).filter((m) => m !== 'idle');
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
    el.title = {
      live: 'Following changes as they happen (watch streams)',
      polling: 'The watch stream is unavailable; re-reading every 5 s',
      disconnected: 'Cannot reach the server; retrying',
    }[text] || '';
  }

  /** Subscribes a view to lists; returns the unsubscribe-all. */
  function follow(lists, draw) {
    const unsubscribe = lists.map((list) => list.subscribe(draw));
    return () => unsubscribe.forEach((u) => u());
  }

  /** Shown in place of a table while a list loads or when it failed. */
  function listStatus(lists) {
    const failed = lists.find((l) => l.error && !l.items.size);
    if (failed) return h('div', { class: 'panel' }, h('div', { class: 'alert' }, failed.error.message));
    if (lists.some((l) => !l.loaded)) return h('div', { class: 'panel empty' }, 'Loading…');
    return null;
  }

  // ---------------------------------------------------------------- session

  const session = { user: null };

  function isAdmin() {
    return session.user && session.user.role === 'admin';
  }

  let authRedirecting = false;

  /** Routes 401 and 403 password_change_required to the screens that resolve them. */
  function authFailure(error) {
    if (!session.user || authRedirecting) return;
    if (error.status === 401) {
      authRedirecting = true;
      endSession();
      showLogin('Your session has ended; log in again.');
    } else if (error.status === 403 && error.code === 'password_change_required') {
      authRedirecting = true;
      session.user.require_password_change = true;
      stopAll();
      showPasswordChange(true);
    }
  }

  function stopAll() {
    for (const list of Object.values(live)) list.stop();
    if (currentCleanup) currentCleanup();
    currentCleanup = null;
  }

  function endSession() {
    stopAll();
    // The next chunk would be refused anyway; the uploads wait for “Resume”.
    stopTransfers();
    session.user = null;
  }

  async function boot() {
    try {
      session.user = await api('GET', '/auth/me', undefined, { auth: false });
    } catch (e) {
      if (e.status === 401) showLogin();
      else showFatal(e);
      return;
    }
    if (session.user.require_password_change) showPasswordChange(true);
    else startApp();
  }

  function showFatal(error) {
    const app = document.getElementById('app');
    app.replaceChildren(
      h('div', { class: 'auth-page' },
        h('div', { class: 'auth-card' },
          brand(),
          h('div', { class: 'alert' }, error.message),
          h('div', { class: 'form-actions' }, h('button', { class: 'primary', onclick: () => boot() }, 'Try again')))),
    );
  }

  function brand() {
    const icon = document.querySelector('link[rel="icon"]');
    return h('a', { class: 'brand', href: '#/overview' }, h('img', { src: icon ? icon.href : '/ui/favicon.svg', alt: '' }), 'gantry');
  }

  function field(label, control, hint, extraClass) {
    return h('label', { class: 'field' + (extraClass ? ' ' + extraClass : '') },
      h('span', null, label), control, hint ? h('span', { class: 'hint' }, hint) : null);
  }

  function checkField(label, control) {
    return h('label', { class: 'field check' }, h('span', null, label), control);
  }

  function showLogin(notice) {
    const app = document.getElementById('app');
    const username = h('input', { name: 'username', autocomplete: 'username', required: true, autofocus: true });
    const password = h('input', { name: 'password', type: 'password', autocomplete: 'current-password', required: true });
    const error = h('div', { class: 'alert', role: 'alert' });
    const submit = h('button', { class: 'primary', type: 'submit' }, 'Log in');
    const form = h('form', {
      class: 'auth-card',
      onsubmit: async (event) => {
        event.preventDefault();
        error.textContent = '';
        submit.disabled = true;
        try {
          const login = await api('POST', '/auth/login', { username: username.value.trim(), password: password.value }, { auth: false });
          session.user = login.user;
          authRedirecting = false;
          if (login.user.require_password_change) showPasswordChange(true, password.value);
          else startApp();
        } catch (e) {
          error.textContent = e.message;
          submit.disabled = false;
          password.select();
        }
      },
    },
    brand(),
    notice ? h('div', { class: 'alert info' }, notice) : null,
    h('p', null, 'Log in to manage models, instances and workers.'),
    field('Username', username),
    field('Password', password),
    error,
    submit);
    app.replaceChildren(h('div', { class: 'auth-page' }, form));
    username.focus();
  }

  /** The password form; `forced` when the account must change it before anything else. */
  function passwordForm(forced, knownCurrent, done) {
    const current = h('input', { type: 'password', autocomplete: 'current-password', required: true, value: knownCurrent || '' });
    const next = h('input', { type: 'password', autocomplete: 'new-password', required: true, minlength: 8 });
    const again = h('input', { type: 'password', autocomplete: 'new-password', required: true, minlength: 8 });
    const error = h('div', { class: 'alert', role: 'alert' });
    const submit = h('button', { class: 'primary', type: 'submit' }, forced ? 'Set password and continue' : 'Change password');
    const form = h('form', {
      onsubmit: async (event) => {
        event.preventDefault();
        error.textContent = '';
        if (next.value !== again.value) {
          error.textContent = 'The two new passwords differ.';
          return;
        }
        submit.disabled = true;
        try {
          const login = await api('POST', '/auth/change-password',
            { current_password: current.value, new_password: next.value }, { auth: false });
          session.user = login.user;
          authRedirecting = false;
          done();
        } catch (e) {
          if (e.status === 401 && e.code === 'unauthorized' && !/current_password/.test(e.message)) {
            endSession();
            showLogin('Your session has ended; log in again.');
            return;
          }
          error.textContent = e.message;
          submit.disabled = false;
        }
      },
    },
    knownCurrent ? null : field('Current password', current),
    field('New password', next, 'At least 8 characters.'),
    field('New password again', again),
    error,
    submit);
    return { form, focus: () => (knownCurrent ? next : current).focus() };
  }

  function showPasswordChange(forced, knownCurrent) {
    const app = document.getElementById('app');
    const { form, focus } = passwordForm(forced, knownCurrent, () => {
      toast('Password changed.');
      startApp();
    });
    form.className = 'auth-card';
    form.prepend(
      brand(),
      h('p', null, 'Choose a new password for ', h('strong', null, session.user.username),
        ' before you continue: this account still has the password it was created with.'),
    );
    form.append(h('div', { class: 'form-actions' }, h('button', {
      type: 'button',
      class: 'link',
      onclick: () => logout(),
    }, 'Log out instead')));
    app.replaceChildren(h('div', { class: 'auth-page' }, form));
    focus();
  }

  async function logout() {
    try {
      await api('POST', '/auth/logout', undefined, { auth: false });
    } catch (_) {
      // The session may already be gone; the login screen is right either way.
    }
    endSession();
    location.hash = '#/overview';
    showLogin('You are logged out.');
  }

  // ---------------------------------------------------------------- the shell

  const SCREENS = [
    { id: 'overview', title: 'Overview', render: renderOverview },
    { id: 'models', title: 'Models', render: renderModels },
    { id: 'instances', title: 'Instances', render: renderInstances },
    { id: 'catalog', title: 'Catalog', render: renderCatalog },
    { id: 'routes', title: 'Routes', render: renderRoutes, admin: true },
    { id: 'providers', title: 'Providers', render: renderProviders, admin: true },
    { id: 'playground', title: 'Playground', render: renderPlayground },
    { id: 'usage', title: 'Usage', render: renderUsage },
    { id: 'workers', title: 'Workers', render: renderWorkers, admin: true },
    { id: 'model-files', title: 'Model files', render: renderModelFiles, admin: true },
    { id: 'servers', title: 'Servers', render: renderServers, admin: true },
    { id: 'api-keys', title: 'API keys', render: renderApiKeys },
    { id: 'users', title: 'Users', render: renderUsers, admin: true },
    { id: 'account', title: 'Account', render: renderAccount, hidden: true },
  ];

  let currentCleanup = null;
  let shell = null;

  function startApp() {
    authRedirecting = false;
    const nav = h('nav', { class: 'nav' },
      SCREENS.filter((s) => !s.hidden && (!s.admin || isAdmin())).map((s) =>
        h('a', { href: '#/' + s.id, 'data-screen': s.id }, s.title)));
    const main = h('main', { id: 'main' });
    const top = h('header', { class: 'topbar' },
      brand(),
      nav,
      h('div', { class: 'session' },
        h('span', { id: 'live', class: 'live' }, 'idle'),
        h('a', { href: '#/account', title: 'Account and password' },
          session.user.username, isAdmin() ? h('span', { class: 'muted' }, ' (admin)') : null),
        h('button', { class: 'small', onclick: () => logout() }, 'Log out')));
    shell = { nav, main };
    document.getElementById('app').replaceChildren(top, main);
    route();
  }

  function parseHash() {
    const raw = location.hash.replace(/^#\/?/, '');
    const q = raw.indexOf('?');
    const path = q >= 0 ? raw.slice(0, q) : raw;
    const params = new URLSearchParams(q >= 0 ? raw.slice(q + 1) : '');
    return { parts: path.split('/').filter(Boolean).map(decodeURIComponent), params };
  }

  function route() {
    if (!session.user || session.user.require_password_change || !shell) return;
    const { parts, params } = parseHash();
    let screen = SCREENS.find((s) => s.id === parts[0]) || SCREENS[0];
    if (screen.admin && !isAdmin()) screen = SCREENS[0];
    if (currentCleanup) currentCleanup();
    currentCleanup = null;
    for (const a of shell.nav.querySelectorAll('a')) a.classList.toggle('active', a.dataset.screen === screen.id);
    document.title = screen.title + ' · gantry';
    shell.main.replaceChildren();
    currentCleanup = screen.render(shell.main, parts.slice(1), params) || null;
  }

  window.addEventListener('hashchange', route);

  function pageHead(title, ...rest) {
    return h('div', { class: 'page-head' }, h('h1', null, title), h('span', { class: 'spacer' }), rest);
  }

  /** A redraw every few seconds, for relative times ("12 s ago"). */
  function ticker(draw, ms) {
    const timer = setInterval(draw, ms || 5000);
    return () => clearInterval(timer);
  }

  // ---------------------------------------------------------------- dialogs

  /**
   * A modal form. `onSubmit` may throw; its message is shown in the dialog, which
   * stays open so the input can be fixed.
   */
  function openDialog(title, body, options) {
    const error = h('div', { class: 'alert', role: 'alert' });
    const submit = h('button', { class: options.danger ? 'danger solid' : 'primary', type: 'submit' }, options.submitLabel || 'Save');
    const dialog = h('dialog', null);
    const close = () => {
      dialog.close();
      dialog.remove();
    };
    const form = h('form', {
      onsubmit: async (event) => {
        event.preventDefault();
        error.textContent = '';
        submit.disabled = true;
        try {
          await options.onSubmit();
          close();
        } catch (e) {
          error.textContent = e.message;
          submit.disabled = false;
        }
      },
    },
    h('h2', null, title),
    body,
    error,
    h('div', { class: 'form-actions' }, h('button', { type: 'button', onclick: close }, 'Cancel'), submit));
    dialog.append(form);
    dialog.addEventListener('close', () => dialog.remove());
    document.body.append(dialog);
    dialog.showModal();
    const first = form.querySelector('input, select, textarea');
    (first || submit).focus();
    return dialog;
  }

  function confirmDialog(title, message, label, action) {
    openDialog(title, h('p', null, message), { submitLabel: label, danger: true, onSubmit: action });
  }

  /** Runs an action from a button and reports its outcome as a toast. */
  async function act(button, action, success) {
    if (button) button.disabled = true;
    try {
      await action();
      if (success) toast(success);
    } catch (e) {
      toast(e.message, 'error');
    } finally {
      if (button) button.disabled = false;
    }
  }

  // ---------------------------------------------------------------- overview

  function countBy(items, key) {
    const counts = {};
    for (const item of items) counts[item[key]] = (counts[item[key]] || 0) + 1;
    return counts;
  }

  function breakdown(counts, order, classes) {
    const states = order.filter((s) => counts[s]).concat(Object.keys(counts).filter((s) => !order.includes(s)));
    if (!states.length) return h('div', { class: 'breakdown muted small' }, 'none yet');
    return h('div', { class: 'breakdown' }, states.map((s) =>
      h('span', { class: 'badge ' + (classes[s] || 'idle') }, counts[s] + ' ' + s.replace('_', ' '))));
  }

  function renderOverview(main) {
    const body = h('div');
    main.append(pageHead('Overview'), body);
    const lists = isAdmin() ? [live.models, live.instances, live.workers] : [live.models, live.instances];
    const draw = () => {
      const status = listStatus(lists);
      if (status) {
        body.replaceChildren(status);
        return;
      }
      const models = live.models.values();
      const instances = live.instances.values();
      const cards = [];
      if (isAdmin()) {
        const workers = live.workers.values();
        const gpus = workers.flatMap((w) => (w.status && w.status.gpus) || []);
        const simulated = gpus.filter((g) => g.simulated).length;
        cards.push(h('div', { class: 'card' },
          h('h2', null, 'Workers', h('a', { href: '#/workers' }, 'View')),
          h('div', { class: 'big' }, workers.length),
          breakdown(countBy(workers, 'state'), WORKER_STATES, WORKER_STATE_CLASS)));
        // Claimed: what the scheduler booked for the instances placed; used: what the
        // workers last reported in use.
        const total = gpus.reduce((sum, g) => sum + (g.memory_total || 0), 0);
        const used = gpus.reduce((sum, g) => sum + (g.memory_used || 0), 0);
        const claimed = instances
          .filter((i) => i.worker_id != null && i.placement && i.placement.reservation)
          .reduce((sum, i) => sum + i.placement.reservation.placement.gpus.reduce((s, g) => s + g.bytes, 0), 0);
        const meter = (value, cls, what) => {
          const bar = h('div', { class: 'meter-fill ' + cls });
          bar.style.width = (total ? Math.min(100, (value / total) * 100) : 0).toFixed(1) + '%';
          return h('div', { class: 'gpu-memory-line', 'data-gpu-memory': what },
            h('span', null, what), h('div', { class: 'meter' }, bar), h('span', { class: 'num' }, fmtBytes(value)));
        };
        cards.push(h('div', { class: 'card' },
          h('h2', null, 'GPUs', h('a', { href: '#/workers' }, 'View')),
          h('div', { class: 'big' }, gpus.length),
          h('div', { class: 'breakdown' },
            h('span', { class: 'badge idle' }, fmtBytes(total) + ' memory'),
            simulated ? h('span', { class: 'badge sim' }, simulated + ' simulated') : null),
          gpus.length ? h('div', { class: 'gpu-memory' }, meter(claimed, 'claimed', 'claimed'), meter(used, 'used', 'in use')) : null));
      }
      const desired = models.reduce((sum, m) => sum + m.replicas, 0);
      cards.push(h('div', { class: 'card' },
        h('h2', null, 'Models', h('a', { href: '#/models' }, 'View')),
        h('div', { class: 'big' }, models.length),
        h('div', { class: 'breakdown' }, h('span', { class: 'badge idle' }, desired + ' replicas wanted'))));
      cards.push(h('div', { class: 'card' },
        h('h2', null, 'Instances', h('a', { href: '#/instances' }, 'View')),
        h('div', { class: 'big' }, instances.length),
        breakdown(countBy(instances, 'state'), INSTANCE_STATES, INSTANCE_STATE_CLASS)));

      const problems = [];
      for (const i of instances.filter((x) => x.state === 'error' || x.state === 'unreachable')) {
        problems.push(h('tr', null,
          h('td', null, h('a', { href: '#/instances?model=' + i.model_id }, i.name)),
          h('td', null, stateBadge(i.state, INSTANCE_STATE_CLASS)),
          h('td', null, h('div', { class: 'state-message' }, firstLine(i.state_message) || '—')),
          h('td', null, timeCell(i.updated_at))));
      }
      if (isAdmin()) {
        for (const w of live.workers.values().filter((x) => x.state !== 'ready')) {
          problems.push(h('tr', null,
            h('td', null, h('a', { href: '#/workers' }, 'worker ' + w.name)),
            h('td', null, stateBadge(w.state, WORKER_STATE_CLASS)),
            h('td', null, h('div', { class: 'state-message' }, w.state_message || '—')),
            h('td', null, timeCell(w.last_heartbeat_at))));
        }
      }
      const downloading = instances.filter((i) => i.state === 'downloading');
      const downloads = downloading.length
        ? [h('h2', null, 'Downloading'),
          h('div', { class: 'panel flush', 'data-downloads': '' }, h('table', null,
            h('thead', null, h('tr', null, h('th', null, 'Instance'), h('th', null, 'Worker'), h('th', null, 'Progress'), h('th', null, 'Since'))),
            h('tbody', null, downloading.map((i) => h('tr', { 'data-instance': i.id },
              h('td', null, h('a', { href: '#/instances?model=' + i.model_id }, i.name)),
              h('td', null, i.worker_name || h('span', { class: 'muted' }, '—')),
              h('td', null, instanceProgress(i) || h('span', { class: 'state-message' }, i.state_message || 'starting the download')),
              h('td', null, timeCell(i.updated_at)))))))]
        : [];
      body.replaceChildren(
        h('div', { class: 'cards' }, cards),
        ...downloads,
        h('h2', null, 'Needs attention'),
        problems.length
          ? h('div', { class: 'panel flush' }, h('table', null,
            h('thead', null, h('tr', null, h('th', null, 'What'), h('th', null, 'State'), h('th', null, 'Why'), h('th', null, 'Since'))),
            h('tbody', null, problems)))
          : h('div', { class: 'panel empty' }, 'Nothing: every instance and worker is healthy or on its way.'),
      );
    };
    return combine(follow(lists, draw), ticker(draw, 10000));
  }

  function firstLine(text) {
    return (text || '').split('\n').find((l) => l.trim()) || '';
  }

  function combine(...cleanups) {
    return () => cleanups.forEach((c) => c());
  }

  // ---------------------------------------------------------------- models

  function renderModels(main) {
    const tableBox = h('div');
    const formBox = h('div', { class: 'hidden' });
    const newButton = isAdmin()
      ? h('button', {
        class: 'primary',
        onclick: () => {
          formBox.classList.toggle('hidden');
          const first = formBox.querySelector('input');
          if (first && !formBox.classList.contains('hidden')) first.focus();
        },
      }, 'New model')
      : null;
    if (isAdmin()) formBox.append(modelForm(() => formBox.classList.add('hidden')));
    main.append(pageHead('Models', newButton), formBox, tableBox);

    const draw = () => {
      const status = listStatus([live.models, live.instances]);
      if (status) {
        tableBox.replaceChildren(status);
        return;
      }
      const models = live.models.values();
      if (!models.length) {
        tableBox.replaceChildren(h('div', { class: 'panel empty' },
          isAdmin() ? 'No models yet. Declare one with “New model”.' : 'No models yet.'));
        return;
      }
      const byModel = new Map();
      for (const i of live.instances.values()) {
        const entry = byModel.get(i.model_id) || { running: 0, total: 0, failed: 0, downloading: [] };
        entry.total += 1;
        if (i.state === 'running') entry.running += 1;
        if (i.state === 'error' || i.state === 'unreachable') entry.failed += 1;
        if (i.state === 'downloading' && i.download) entry.downloading.push(i);
        byModel.set(i.model_id, entry);
      }
      const rows = models.map((m) => {
        const counts = byModel.get(m.id) || { running: 0, total: 0, failed: 0, downloading: [] };
        const health = counts.total === 0 ? 'idle' : counts.running === counts.total ? 'ok' : counts.failed ? 'danger' : 'warn';
        return h('tr', null,
          h('td', { class: 'nowrap' }, h('a', { href: '#/instances?model=' + m.id }, h('strong', null, m.name)),
            m.description ? h('div', { class: 'muted small' }, m.description) : null),
          h('td', null, h('span', { class: 'chip' }, m.backend)),
          h('td', null, h('div', { class: 'mono small', title: describeSource(m.source) }, truncate(describeSource(m.source), 48))),
          h('td', { class: 'num' }, m.replicas),
          h('td', { class: 'num' }, h('span', { class: 'badge ' + health, title: 'running / total instances' }, counts.running + ' / ' + counts.total),
            modelDownload(counts.downloading)),
          h('td', null, m.placement_strategy,
            Object.keys(m.worker_selector || {}).length ? h('div', null, labelChips(m.worker_selector)) : null),
          h('td', null, m.backend_args.length ? h('code', { class: 'small' }, truncate(joinArgs(m.backend_args), 40)) : h('span', { class: 'muted' }, '—')),
          h('td', null, timeCell(m.created_at)),
          h('td', { class: 'actions' },
            counts.running ? h('a', { class: 'button small', href: '#/playground?model=' + encodeURIComponent(m.name), title: 'Chat with ' + m.name }, 'Chat') : null,
            isAdmin() ? h('button', { class: 'small', onclick: () => editModel(m) }, 'Edit') : null,
            isAdmin() ? h('button', { class: 'small danger', onclick: () => deleteModel(m) }, 'Delete') : null));
      });
      tableBox.replaceChildren(h('div', { class: 'panel flush' }, h('table', null,
        h('thead', null, h('tr', null,
          h('th', null, 'Name'), h('th', null, 'Backend'), h('th', null, 'Source'),
          h('th', { class: 'num' }, 'Replicas'), h('th', { class: 'num' }, 'Running'),
          h('th', null, 'Placement'), h('th', null, 'Backend args'), h('th', null, 'Created'),
          h('th', null))),
        h('tbody', null, rows))));
    };
    return combine(follow([live.models, live.instances], draw), ticker(draw, 30000));
  }

  /**
   * The download of a model's instances as one bar: the bytes of all of them (unknown
   * when one's total is), so a model on several workers shows how much is left overall.
   */
  function modelDownload(instances) {
    if (!instances.length) return null;
    const done = instances.reduce((sum, i) => sum + i.download.bytes_done, 0);
    const total = instances.every((i) => i.download.bytes_total != null)
      ? instances.reduce((sum, i) => sum + i.download.bytes_total, 0)
      : null;
    return h('div', { class: 'model-download' },
      h('div', { class: 'muted small' }, instances.length === 1 ? '1 downloading' : instances.length + ' downloading'),
      progressBar(done, total, {
        compact: true,
        label: 'Download of the model’s files',
        title: instances.map((i) => i.name + ': ' + (i.state_message || 'downloading')).join('\n'),
      }));
  }

  function truncate(text, max) {
    return text.length > max ? text.slice(0, max - 1) + '…' : text;
  }

  /** What an estimate says: the parts of one instance, and where replicas would go. */
  function estimateView(estimate) {
    const p = estimate.parts;
    const total = p.weights_bytes + p.kv_cache_bytes + p.host_compute_buffer_bytes + p.base_ram_bytes +
      (p.per_gpu_compute_buffer_bytes + p.per_gpu_overhead_bytes) * Math.max(1, p.declared_gpu_count || 1);
    const fitting = estimate.workers.filter((w) => w.fits);
    const where = (v) => {
      const placement = v.placement;
      if (!placement) return '';
      const gpus = placement.gpus.map((g) => 'GPU ' + g.index + ' ' + fmtBytes(g.bytes)).join(', ');
      return (gpus || 'CPU only') + (placement.ram_bytes ? ' + ' + fmtBytes(placement.ram_bytes) + ' RAM' : '');
    };
    return h('div', { class: 'estimate', 'data-estimate': '' },
      h('div', { class: 'facts' },
        h('div', { class: 'fact' }, h('span', null, 'One instance needs'), h('strong', { 'data-estimate-total': '' }, fmtBytes(total))),
        h('div', { class: 'fact' }, h('span', null, 'Weights'), fmtBytes(p.weights_bytes)),
        h('div', { class: 'fact' }, h('span', null, 'KV cache'), fmtBytes(p.kv_cache_bytes) +
          (estimate.context_size ? ' (' + estimate.context_size.toLocaleString('en-US') + ' tokens)' : '')),
        h('div', { class: 'fact' }, h('span', null, 'Fits on'), h('strong', { 'data-estimate-fits': fitting.length }, fitting.length + ' of ' + estimate.workers.length + ' workers'))),
      estimate.workers.length ? h('table', { class: 'compact' },
        h('thead', null, h('tr', null, h('th', null, 'Worker'), h('th', null, 'Fits'), h('th', null, 'Where, or why not'))),
        h('tbody', null, estimate.workers.map((w) => h('tr', { 'data-estimate-worker': w.worker_name },
          h('td', null, w.worker_name, w.simulated_gpus ? h('span', { class: 'badge sim' }, 'simulated') : null),
          h('td', null, h('span', { class: 'badge ' + (w.fits ? 'ok' : 'warn') }, w.fits ? 'yes' : 'no')),
          h('td', { class: 'small' }, w.fits ? where(w) : w.reason))))) : h('div', { class: 'muted' }, 'No workers yet.'));
  }

  /**
   * The new-model form. `preset` (a catalog entry) fills it in and checks at once where the
   * model would fit.
   */
  function modelForm(onDone, preset) {
    const name = h('input', { required: true, placeholder: 'llama-3-8b', maxlength: 63 });
    const description = h('input', { placeholder: 'optional' });
    const sourceType = h('select', null,
      h('option', { value: 'local_path' }, 'Local path on the workers'),
      h('option', { value: 'huggingface' }, 'Hugging Face repository'),
      h('option', { value: 'url' }, 'URL'),
      h('option', { value: 'upload' }, 'Uploaded file'));
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

    const pathField = field('Path', path, 'Absolute path of a file or directory present on the workers.', 'wide');
    const repoField = field('Repository', repo);
    const fileField = field('File', file);
    const urlField = field('URL', url, null, 'wide');
    const uploadField = field('Uploaded file', upload,
      ['Complete uploads. Upload a file on the ', h('a', { href: '#/model-files' }, 'Model files'), ' screen.'], 'wide');
    const commandField = field('Command template', customCommand,
      'Placeholders: {model_path} {port} {gpu_ids} {host}. Split like a shell would, run without one.', 'wide');
    const offloadField = checkField('Allow CPU offload (llama.cpp)', cpuOffload);

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
    const loadUploads = async () => {
      const chosen = upload.value;
      upload.replaceChildren(h('option', { value: '' }, 'Loading…'));
      try {
        const ready = (await api('GET', '/api/v1/model-files/uploads')).items.filter((u) => u.state === 'ready');
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
        case 'preset': return preset.source;
        default: return { type: 'url', url: url.value.trim() };
      }
    };

    /** The `POST /api/v1/models` body the fields make. */
    const request = () => {
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
          error.textContent = e.message;
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
          error.textContent = e.message;
        } finally {
          submit.disabled = false;
        }
      },
    },
    h('h2', null, preset ? 'Deploy ' + preset.title : 'New model'),
    h('div', { class: 'form-grid' },
      field('Name', name, 'Lowercase letters, digits, “-”, “_”, “.”'),
      field('Backend', backend),
      field('Replicas', replicas),
      field('Placement strategy', strategy, 'spread: emptiest worker first; binpack: fullest that fits.'),
      field('Source', sourceType),
      pathField, repoField, fileField, urlField, uploadField,
      commandField,
      field('Backend arguments', args, 'Passed to the backend as written (quotes group words).', 'wide'),
      field('Worker selector', selector, 'Labels a worker must have: k=v, comma-separated.'),
      field('Description', description),
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
      if (!['local_path', 'huggingface', 'url'].includes(src.type)) {
        // A source the form has no fields for (ModelScope, S3, an upload): kept as it is.
        sourceType.append(h('option', { value: 'preset' }, 'As in the catalog: ' + describeSource(src)));
      }
      sourceType.value = ['local_path', 'huggingface', 'url'].includes(src.type) ? src.type : 'preset';
      if (src.type === 'local_path') path.value = src.path;
      if (src.type === 'huggingface') {
        repo.value = src.repo_id;
        file.value = src.file || '';
      }
      if (src.type === 'url') url.value = [].concat(src.url)[0];
      sync();
      checkFit.click();
    }
    return form;
  }

  // ---------------------------------------------------------------- catalog

  function renderCatalog(main) {
    const deploy = h('div');
    const list = h('div', null, h('div', { class: 'panel empty' }, 'Loading the catalog…'));
    main.append(pageHead('Catalog', h('span', { class: 'muted small' }, 'Well-known models; the server’s model_catalog_file replaces this list.')), deploy, list);
    (async () => {
      let catalog;
      try {
        catalog = await api('GET', '/api/v1/model-catalog');
      } catch (e) {
        list.replaceChildren(h('div', { class: 'panel' }, h('div', { class: 'alert' }, e.message)));
        return;
      }
      if (!catalog.items.length) {
        list.replaceChildren(h('div', { class: 'panel empty' }, 'The catalog is empty.'));
        return;
      }
      const open = (entry) => {
        deploy.replaceChildren(modelForm((model) => {
          deploy.replaceChildren();
          if (model) location.hash = '#/models';
        }, entry));
        deploy.scrollIntoView({ block: 'start' });
      };
      list.replaceChildren(h('div', { class: 'catalog' }, catalog.items.map((entry) => h('div', { class: 'card', 'data-catalog-entry': entry.name },
        h('h2', null, entry.title),
        h('div', { class: 'muted small mono' }, describeSource(entry.source)),
        entry.description ? h('p', { class: 'small' }, entry.description) : null,
        h('div', { class: 'breakdown' },
          h('span', { class: 'chip' }, entry.backend),
          entry.parameters ? h('span', { class: 'badge idle' }, entry.parameters + ' parameters') : null,
          entry.size ? h('span', { class: 'badge idle' }, '≈ ' + entry.size) : null,
          (entry.tags || []).map((t) => h('span', { class: 'chip' }, t))),
        isAdmin() ? h('div', { class: 'form-actions' }, h('button', { class: 'primary small', onclick: () => open(entry) }, 'Deploy')) : null))));
    })();
  }

  function editModel(model) {
    const replicas = h('input', { type: 'number', min: 0, max: 1000, value: String(model.replicas), required: true });
    const args = h('input', { value: joinArgs(model.backend_args) });
    const strategy = h('select', { value: model.placement_strategy },
      h('option', { value: 'spread' }, 'spread'), h('option', { value: 'binpack' }, 'binpack'));
    const selector = h('input', { value: formatLabels(model.worker_selector, ', ') });
    openDialog('Edit ' + model.name, [
      field('Replicas', replicas, 'Adding replicas creates instances; removing them stops the highest-numbered ones.'),
      field('Backend arguments', args, 'Changing them restarts the instances.'),
      field('Placement strategy', strategy),
      field('Worker selector', selector, 'k=v, comma-separated; empty for any worker.'),
    ], {
      submitLabel: 'Save',
      onSubmit: async () => {
        const update = {};
        const wanted = Number(replicas.value);
        if (wanted !== model.replicas) update.replicas = wanted;
        const newArgs = splitArgs(args.value);
        if (JSON.stringify(newArgs) !== JSON.stringify(model.backend_args)) update.backend_args = newArgs;
        if (strategy.value !== model.placement_strategy) update.placement_strategy = strategy.value;
        const newSelector = parseLabels(selector.value);
        if (JSON.stringify(newSelector) !== JSON.stringify(model.worker_selector || {})) update.worker_selector = newSelector;
        if (!Object.keys(update).length) return;
        await api('PATCH', '/api/v1/models/' + model.id, update);
        toast('Model ' + model.name + ' updated.');
      },
    });
  }

  function deleteModel(model) {
    confirmDialog('Delete ' + model.name + '?',
      'This deletes the model and stops all of its instances. Clients calling it get errors at once.',
      'Delete model',
      async () => {
        await api('DELETE', '/api/v1/models/' + model.id);
        toast('Model ' + model.name + ' deleted.');
      });
  }

  // ---------------------------------------------------------------- providers

  /** The items of a list answer: a plain array, or a page's `items`. */
  function itemsOf(body) {
    return Array.isArray(body) ? body : (body && body.items) || [];
  }

  /** Parses "Name: value", one header per line, into an object. */
  function parseHeaders(text) {
    const headers = {};
    for (const line of text.split('\n')) {
      const item = line.trim();
      if (!item) continue;
      const colon = item.indexOf(':');
      if (colon <= 0) throw new Error('Headers: “' + item + '” is not “Name: value”.');
      headers[item.slice(0, colon).trim()] = item.slice(colon + 1).trim();
    }
    return headers;
  }

  function formatHeaders(headers) {
    return Object.entries(headers || {}).map(([k, v]) => k + ': ' + v).join('\n');
  }

  /** Splits a list typed with commas, spaces or one item per line. */
  function parseList(text) {
    return text.split(/[\s,]+/).map((item) => item.trim()).filter(Boolean);
  }

  function sameJson(a, b) {
    return JSON.stringify(a) === JSON.stringify(b);
  }

  /** A few chips, then "+N more" with the rest in its title. */
  function someChips(items, max) {
    const shown = items.slice(0, max).map((item) => h('span', { class: 'chip' }, item));
    if (items.length > max) {
      shown.push(h('span', { class: 'muted small', title: items.slice(max).join('\n') }, '+' + (items.length - max) + ' more'));
    }
    return shown;
  }

  function renderProviders(main) {
    const formBox = h('div');
    const tableBox = h('div', null, h('div', { class: 'panel empty' }, 'Loading…'));
    const closeForm = () => formBox.replaceChildren();
    const openForm = (provider) => {
      formBox.replaceChildren(providerForm(provider, () => {
        closeForm();
        load();
      }));
      // The form sits under the page's head: show both.
      window.scrollTo({ top: 0 });
      const first = formBox.querySelector('input:not([disabled])');
      if (first) first.focus();
    };
    main.append(pageHead('Providers',
      h('span', { class: 'muted small' }, 'External OpenAI-compatible endpoints that routes can send requests to.'),
      // Toggles the new-provider form; replaces an open edit form.
      h('button', { class: 'primary', onclick: () => (formBox.querySelector('[data-provider-form=""]') ? closeForm() : openForm(null)) }, 'New provider')),
    formBox, tableBox);

    const draw = (providers, routes) => {
      if (!providers.length) {
        tableBox.replaceChildren(h('div', { class: 'panel empty' }, 'No providers yet. Add one with “New provider”, then send a route’s traffic to it.'));
        return;
      }
      const usedBy = new Map();
      for (const r of routes) {
        for (const t of r.targets) {
          if (!t.provider) continue;
          const names = usedBy.get(t.provider) || new Set();
          names.add(r.name);
          usedBy.set(t.provider, names);
        }
      }
      const rows = providers.map((p) => {
        const routeNames = Array.from(usedBy.get(p.name) || []).sort();
        const headerCount = Object.keys(p.headers || {}).length;
        return h('tr', { 'data-provider': p.name },
          h('td', null, h('strong', null, p.name), p.description ? h('div', { class: 'muted small' }, p.description) : null),
          h('td', { class: 'url-cell' }, h('span', { class: 'mono small' }, p.base_url),
            headerCount ? h('div', { class: 'muted small', title: Object.keys(p.headers).join('\n') },
              '+ ' + headerCount + ' header' + (headerCount === 1 ? '' : 's')) : null),
          h('td', { 'data-part': 'key' }, p.has_api_key
            ? h('span', { class: 'badge ok' }, 'set')
            : h('span', { class: 'badge idle' }, 'none')),
          h('td', { 'data-part': 'models' }, p.models.length
            ? someChips(p.models, 4)
            : h('span', { class: 'muted', title: 'Routes may name any model id of this provider' }, 'any')),
          h('td', { class: 'num' }, p.timeout_seconds + ' s'),
          h('td', null, routeNames.length
            ? routeNames.map((name) => h('span', { class: 'chip' }, name))
            : h('span', { class: 'muted' }, '—')),
          h('td', null, timeCell(p.updated_at)),
          h('td', { class: 'actions' },
            h('button', { class: 'small', onclick: () => openForm(p) }, 'Edit'),
            h('button', { class: 'small danger', onclick: () => deleteProvider(p, load) }, 'Delete')));
      });
      tableBox.replaceChildren(h('div', { class: 'panel flush' }, h('table', { 'data-providers': '' },
        h('thead', null, h('tr', null,
          h('th', null, 'Name'), h('th', null, 'Base URL'), h('th', null, 'API key'), h('th', null, 'Models'),
          h('th', { class: 'num', title: 'Time the provider has to start its answer before a route falls back' }, 'Timeout'),
          h('th', null, 'Used by routes'), h('th', null, 'Updated'), h('th', null))),
        h('tbody', null, rows))));
    };

    let stopped = false;
    const load = async () => {
      try {
        const [providers, routes] = await Promise.all([
          api('GET', '/api/v1/model-providers'),
          api('GET', '/api/v1/model-routes').catch(() => []),
        ]);
        if (!stopped) draw(itemsOf(providers), itemsOf(routes));
      } catch (e) {
        if (!stopped) tableBox.replaceChildren(h('div', { class: 'panel' }, h('div', { class: 'alert' }, e.message)));
      }
    };
    load();
    return combine(ticker(load, 30000), () => (stopped = true));
  }

  /**
   * The form that creates a provider (`provider` null) or edits one. Its API key is
   * write-only: on edit the field starts empty, which keeps the key; "Remove the key"
   * sends null. "Discover models" asks the saved provider which models it has.
   */
  function providerForm(provider, onDone) {
    const editing = provider != null;
    const p = provider || { name: '', description: '', base_url: '', has_api_key: false, headers: {}, timeout_seconds: 120, models: [] };
    const name = h('input', { required: !editing, disabled: editing, placeholder: 'openai', maxlength: 63, value: p.name, autocomplete: 'off' });
    const description = h('input', { placeholder: 'optional', value: p.description });
    const baseUrl = h('input', { type: 'url', required: true, placeholder: 'https://api.openai.com/v1', value: p.base_url });
    const apiKey = h('input', {
      type: 'password',
      'aria-label': 'API key',
      autocomplete: 'new-password',
      placeholder: editing ? (p.has_api_key ? 'set: leave empty to keep it' : 'none set') : 'optional',
    });
    const removeKey = h('input', { type: 'checkbox' });
    removeKey.addEventListener('change', () => {
      apiKey.disabled = removeKey.checked;
      if (removeKey.checked) apiKey.value = '';
    });
    const timeout = h('input', { type: 'number', min: 1, max: 3600, required: true, value: String(p.timeout_seconds) });
    const models = h('textarea', { rows: 3, 'aria-label': 'Models', placeholder: 'empty: any model id', value: p.models.join('\n') });
    const headers = h('textarea', { rows: 2, placeholder: 'OpenAI-Organization: org-123', value: formatHeaders(p.headers) });
    const discovered = h('div', { class: 'discovered', 'data-discovered': '' });
    const error = h('div', { class: 'alert', role: 'alert' });
    const submit = h('button', { class: 'primary', type: 'submit' }, editing ? 'Save' : 'Create provider');

    const discover = editing ? h('button', {
      type: 'button',
      class: 'small',
      onclick: async () => {
        discover.disabled = true;
        discovered.replaceChildren(h('div', { class: 'muted small' }, 'Asking ' + p.name + ' for its models…'));
        try {
          const answer = await api('GET', '/api/v1/model-providers/' + encodeURIComponent(p.name) + '/models');
          discovered.replaceChildren(discoveredModels(answer.models, models));
        } catch (e) {
          discovered.replaceChildren(h('div', { class: 'alert' }, e.message));
        } finally {
          discover.disabled = false;
        }
      },
    }, 'Discover models') : null;

    const form = h('form', {
      class: 'panel',
      'data-provider-form': editing ? p.name : '',
      onsubmit: async (event) => {
        event.preventDefault();
        error.textContent = '';
        let wanted;
        try {
          wanted = {
            description: description.value.trim(),
            base_url: baseUrl.value.trim(),
            headers: parseHeaders(headers.value),
            timeout_seconds: Number(timeout.value),
            models: parseList(models.value),
          };
        } catch (e) {
          error.textContent = e.message;
          return;
        }
        submit.disabled = true;
        try {
          if (editing) {
            const update = {};
            for (const [key, value] of Object.entries(wanted)) {
              if (!sameJson(value, p[key])) update[key] = value;
            }
            if (removeKey.checked) update.api_key = null;
            else if (apiKey.value) update.api_key = apiKey.value;
            if (Object.keys(update).length) {
              await api('PATCH', '/api/v1/model-providers/' + encodeURIComponent(p.name), update);
              toast('Provider ' + p.name + ' updated.');
            }
          } else {
            const body = Object.assign({ name: name.value.trim() }, wanted);
            if (apiKey.value) body.api_key = apiKey.value;
            const created = await api('POST', '/api/v1/model-providers', body);
            toast('Provider ' + created.name + ' created.' + (created.models.length ? '' : ' Edit it to discover its models.'));
          }
          onDone();
        } catch (e) {
          error.textContent = e.message;
          submit.disabled = false;
        }
      },
    },
    h('h2', null, editing ? 'Edit provider ' + p.name : 'New provider'),
    h('div', { class: 'form-grid' },
      field('Name', name, editing ? 'Routes name the provider by it; it cannot change.' : 'Lowercase letters, digits, “-”, “_”, “.”'),
      field('Base URL', baseUrl, 'With the API’s version: requests go to <base URL>/chat/completions.'),
      // A div, not a label: it holds the remove checkbox's own label.
      h('div', { class: 'field' },
        h('span', null, 'API key'),
        apiKey,
        h('span', { class: 'hint' }, editing ? 'Write-only: it is never shown again.' : 'Sent as Authorization: Bearer; never shown again.'),
        editing && p.has_api_key ? h('label', { class: 'inline-check' }, removeKey, 'Remove the key') : null),
      field('Timeout (seconds)', timeout, 'To start answering, before a route falls back.'),
      field('Description', description),
      h('div', { class: 'field wide' },
        h('span', null, 'Models'),
        models,
        h('span', { class: 'hint' },
          'Model ids the provider offers, one per line or comma-separated; empty: routes may name any. ',
          editing ? 'Discover asks the saved provider (its GET /models).' : 'Once it is created, Edit → Discover models asks the provider.'),
        discover ? h('div', null, discover) : null,
        discovered),
      field('Extra headers', headers, 'One “Name: value” per line; not secret (keep credentials in the API key).', 'wide')),
    error,
    h('div', { class: 'form-actions' },
      submit,
      h('button', { type: 'button', onclick: () => onDone() }, 'Cancel')));
    return form;
  }

  /** The models a provider listed, to tick and copy into the form's models. */
  function discoveredModels(ids, target) {
    if (!ids.length) return h('div', { class: 'muted small' }, 'The provider lists no models.');
    const current = new Set(parseList(target.value));
    const boxes = ids.map((id) => h('input', { type: 'checkbox', value: id, checked: current.has(id) }));
    const setAll = (checked) => boxes.forEach((b) => (b.checked = checked));
    return h('div', null,
      h('div', { class: 'discovered-head' },
        h('span', { class: 'small' }, ids.length + (ids.length === 1 ? ' model' : ' models') + ' at the provider'),
        h('button', { type: 'button', class: 'small', onclick: () => setAll(true) }, 'All'),
        h('button', { type: 'button', class: 'small', onclick: () => setAll(false) }, 'None'),
        h('button', {
          type: 'button',
          class: 'small primary',
          onclick: () => {
            target.value = boxes.filter((b) => b.checked).map((b) => b.value).join('\n');
            target.focus();
          },
        }, 'Use the ticked ones')),
      h('div', { class: 'discovered-list' }, ids.map((id, i) =>
        h('label', { class: 'discovered-item', title: id }, boxes[i], h('span', { class: 'mono small' }, id)))));
  }

  function deleteProvider(provider, reload) {
    confirmDialog('Delete provider ' + provider.name + '?',
      'Its key is forgotten. The server refuses while a route sends traffic to it: change those routes first.',
      'Delete provider',
      async () => {
        await api('DELETE', '/api/v1/model-providers/' + encodeURIComponent(provider.name));
        toast('Provider ' + provider.name + ' deleted.');
        reload();
      });
  }

  // ---------------------------------------------------------------- routes

  /** How often the routes screen re-reads the routes and their last day's traffic. */
  const ROUTES_POLL_MS = 10000;

  /** How accounting and `x-gantry-target` name a target: the model, or provider/model. */
  function targetLabel(target) {
    return target.provider ? target.provider + '/' + target.model : target.model;
  }

  /**
   * Each target's planned share of its priority's traffic (weight over the weights of
   * its priority), and which priority is the first: the others are fallbacks.
   */
  function plannedShares(targets) {
    const sums = new Map();
    for (const t of targets) sums.set(t.priority, (sums.get(t.priority) || 0) + t.weight);
    const first = Math.min(...targets.map((t) => t.priority));
    return targets.map((t) => ({ share: sums.get(t.priority) ? t.weight / sums.get(t.priority) : 0, fallback: t.priority !== first }));
  }

  function fmtShare(share) {
    const percent = share * 100;
    return (percent > 0 && percent < 1 ? '<1' : Math.round(percent)) + ' %';
  }

  function renderRoutes(main) {
    const formBox = h('div');
    const tableBox = h('div', null, h('div', { class: 'panel empty' }, 'Loading…'));
    let state = null;
    let loadError = null;
    // The open form, which follows the deployed models too.
    let form = null;
    const closeForm = () => {
      form = null;
      formBox.replaceChildren();
    };
    const openForm = (route) => {
      const providers = state ? state.providers : [];
      form = routeForm(route, providers, () => {
        closeForm();
        load();
      });
      formBox.replaceChildren(form.element);
      // The form sits under the page's head: show both.
      window.scrollTo({ top: 0 });
      const first = formBox.querySelector('input:not([disabled])');
      if (first) first.focus();
    };
    main.append(pageHead('Routes',
      h('span', { class: 'muted small' }, 'Model names clients call, served by deployed models and providers.'),
      h('button', { class: 'primary', onclick: () => (formBox.querySelector('[data-route-form=""]') ? closeForm() : openForm(null)) }, 'New route')),
    formBox, tableBox);

    const draw = () => {
      if (form) form.refreshModels();
      if (!state) {
        tableBox.replaceChildren(loadError
          ? h('div', { class: 'panel' }, h('div', { class: 'alert' }, loadError.message))
          : h('div', { class: 'panel empty' }, 'Loading…'));
        return;
      }
      const notices = loadError ? [h('div', { class: 'alert' }, 'Cannot refresh the routes: ' + loadError.message)] : [];
      if (!state.routes.length) {
        tableBox.replaceChildren(...notices, h('div', { class: 'panel empty' },
          'No routes yet: every deployed model answers to its own name. A route gives one name several targets, with weights and fallbacks.'));
        return;
      }
      const deployed = new Set(live.models.values().map((m) => m.name));
      const rows = state.routes.map((r) => {
        const usage = state.usage.get(r.name);
        const traffic = new Map();
        let served = 0;
        for (const t of (usage && usage.targets) || []) {
          if (t.model !== r.name) continue;
          traffic.set(t.target, (traffic.get(t.target) || 0) + t.requests);
          served += t.requests;
        }
        const planned = plannedShares(r.targets);
        const order = r.targets.map((t, i) => i).sort((a, b) => r.targets[a].priority - r.targets[b].priority || a - b);
        const targetRows = order.map((i) => {
          const t = r.targets[i];
          const label = targetLabel(t);
          const got = traffic.get(label) || 0;
          const missing = !t.provider && live.models.loaded && !deployed.has(t.model);
          return h('tr', { 'data-target': label },
            h('td', null,
              h('span', { class: 'badge ' + (t.provider ? 'idle' : 'info') }, t.provider ? 'provider' : 'local'), ' ',
              h('span', { class: 'mono small' }, label),
              missing ? h('span', { class: 'badge warn', title: 'No deployed model has this name: the route skips it' }, 'not deployed') : null),
            h('td', { class: 'num', 'data-part': 'priority' }, t.priority,
              planned[i].fallback ? h('span', { class: 'muted small' }, ' fallback') : null),
            h('td', { class: 'num', 'data-part': 'weight' }, t.weight,
              h('span', { class: 'muted small', title: 'Its share of its priority’s traffic while all of them can answer' }, ' (' + fmtShare(planned[i].share) + ')')),
            h('td', { 'data-part': 'traffic' }, trafficShare(got, served, usage)));
        });
        return h('tr', { 'data-route': r.name },
          h('td', null, h('strong', null, r.name), r.description ? h('div', { class: 'muted small' }, r.description) : null),
          h('td', { class: 'targets-cell' }, h('table', { class: 'compact targets' },
            h('thead', null, h('tr', null,
              h('th', null, 'Target'), h('th', { class: 'num col-priority' }, 'Priority'), h('th', { class: 'num col-weight' }, 'Weight'),
              h('th', { class: 'col-traffic' }, 'Traffic, last 24 h'))),
            h('tbody', null, targetRows))),
          h('td', { class: 'num', 'data-part': 'requests' }, usage ? fmtCount(usage.total.requests) : h('span', { class: 'muted' }, '—')),
          h('td', null, timeCell(r.updated_at)),
          h('td', { class: 'actions' },
            h('a', { class: 'button small', href: '#/playground?model=' + encodeURIComponent(r.name), title: 'Chat with ' + r.name }, 'Chat'),
            h('button', { class: 'small', onclick: () => openForm(r) }, 'Edit'),
            h('button', { class: 'small danger', onclick: () => deleteRoute(r, load) }, 'Delete')));
      });
      tableBox.replaceChildren(...notices, h('div', { class: 'panel flush' }, h('table', { 'data-routes': '' },
        h('thead', null, h('tr', null,
          h('th', null, 'Route'), h('th', null, 'Targets (lower priority first; weights split a priority)'),
          h('th', { class: 'num' }, 'Requests, 24 h'), h('th', null, 'Updated'), h('th', null))),
        h('tbody', null, rows))));
    };

    let stopped = false;
    let timer = null;
    const load = async () => {
      clearTimeout(timer);
      try {
        const [routes, providers] = await Promise.all([
          api('GET', '/api/v1/model-routes').then(itemsOf),
          api('GET', '/api/v1/model-providers').then(itemsOf),
        ]);
        const from = encodeURIComponent(new Date(Date.now() - 86400000).toISOString());
        // One report per route; a route whose report fails shows no traffic.
        const reports = await Promise.all(routes.map((r) =>
          api('GET', '/api/v1/usage?from=' + from + '&model=' + encodeURIComponent(r.name)).catch(() => null)));
        state = { routes, providers, usage: new Map(routes.map((r, i) => [r.name, reports[i]])) };
        loadError = null;
      } catch (e) {
        loadError = e;
      }
      if (stopped) return;
      draw();
      timer = setTimeout(load, ROUTES_POLL_MS);
    };
    load();
    return combine(follow([live.models], draw), () => {
      stopped = true;
      clearTimeout(timer);
    });
  }

  /** A target's share of its route's requests: a bar, the percent and the count. */
  function trafficShare(requests, total, usage) {
    if (!usage) return h('span', { class: 'muted small', title: 'The usage report could not be read' }, '—');
    if (!total) return h('span', { class: 'muted small' }, 'no requests');
    const fill = h('div');
    fill.style.width = ((requests / total) * 100).toFixed(1) + '%';
    return h('div', { class: 'share', title: fmtCount(requests) + ' of ' + fmtCount(total) + ' requests' },
      h('div', { class: 'meter' }, fill),
      h('span', { class: 'small' }, fmtShare(requests / total)),
      h('span', { class: 'muted small' }, fmtCount(requests) + ' req'));
  }

  /**
   * The form that creates a route (`route` null) or edits one: its targets are rows of
   * kind, model, weight and priority, added and removed in place, with the plan they
   * make written under them. Answers `{element, refreshModels()}`: the latter offers the
   * models deployed now (they may arrive after the form opens).
   */
  function routeForm(route, providers, onDone) {
    const editing = route != null;
    const r = route || { name: '', description: '', targets: [] };
    const name = h('input', { required: !editing, disabled: editing, placeholder: 'chat', maxlength: 63, value: r.name, autocomplete: 'off' });
    const description = h('input', { placeholder: 'optional', value: r.description });
    const body = h('tbody');
    const plan = h('div', { class: 'route-plan muted small', 'data-plan': '' });
    const error = h('div', { class: 'alert', role: 'alert' });
    const submit = h('button', { class: 'primary', type: 'submit' }, editing ? 'Save' : 'Create route');
    const deployedNames = () => live.models.values().map((m) => m.name).sort();
    let modelNames = deployedNames();
    const rows = [];

    const renumber = () => {
      rows.forEach((row, i) => {
        row.element.dataset.targetRow = String(i);
        row.remove.setAttribute('aria-label', 'Remove target ' + (i + 1));
        row.remove.disabled = rows.length === 1;
      });
    };
    const describePlan = () => {
      const targets = rows.map((row) => row.value()).filter((t) => t.model);
      if (!targets.length) {
        plan.textContent = 'Add a target.';
        return;
      }
      const planned = plannedShares(targets);
      const priorities = Array.from(new Set(targets.map((t) => t.priority))).sort((a, b) => a - b);
      plan.replaceChildren(...priorities.map((priority, n) => h('div', null,
        h('strong', null, n === 0 ? 'First' : 'Then, if none of those can answer'),
        ' (priority ' + priority + '): ',
        targets.map((t, i) => [t, i]).filter(([t]) => t.priority === priority)
          .map(([t, i]) => targetLabel(t) + ' ' + fmtShare(planned[i].share)).join(', '))));
    };
    const addRow = (target) => {
      const row = targetRow(target, modelNames, providers, () => {
        rows.splice(rows.indexOf(row), 1);
        row.element.remove();
        renumber();
        describePlan();
      }, describePlan);
      rows.push(row);
      body.append(row.element);
      renumber();
      describePlan();
      return row;
    };
    for (const t of r.targets) addRow(t);
    if (!rows.length) addRow({ model: modelNames[0] || '', weight: 1, priority: 0 });

    const form = h('form', {
      class: 'panel',
      'data-route-form': editing ? r.name : '',
      onsubmit: async (event) => {
        event.preventDefault();
        error.textContent = '';
        rows.forEach((row) => row.element.classList.remove('invalid'));
        const targets = rows.map((row) => row.value());
        const empty = targets.findIndex((t) => !t.model || (t.provider === ''));
        if (empty >= 0) {
          rows[empty].element.classList.add('invalid');
          error.textContent = 'Target ' + (empty + 1) + ' needs a ' + (targets[empty].provider === '' ? 'provider' : 'model') + '.';
          return;
        }
        submit.disabled = true;
        try {
          if (editing) {
            const update = {};
            if (description.value.trim() !== r.description) update.description = description.value.trim();
            if (!sameJson(targets, r.targets.map(normalTarget))) update.targets = targets;
            if (Object.keys(update).length) {
              await api('PATCH', '/api/v1/model-routes/' + encodeURIComponent(r.name), update);
              toast('Route ' + r.name + ' updated.');
            }
          } else {
            const created = await api('POST', '/api/v1/model-routes', { name: name.value.trim(), description: description.value.trim(), targets });
            toast('Route ' + created.name + ' created: clients may call it now.');
          }
          onDone();
        } catch (e) {
          // The API names the field it refused (targets[1].weight): mark that row.
          const at = /targets\[(\d+)\]/.exec(e.message);
          if (at && rows[Number(at[1])]) rows[Number(at[1])].element.classList.add('invalid');
          error.textContent = e.message;
          submit.disabled = false;
        }
      },
    },
    h('h2', null, editing ? 'Edit route ' + r.name : 'New route'),
    h('div', { class: 'form-grid' },
      field('Name', name, editing ? 'What clients send as “model”; it cannot change.' : 'What clients send as “model”. A deployed model’s name makes the route replace it.'),
      field('Description', description)),
    h('h3', { class: 'form-subhead' }, 'Targets'),
    h('p', { class: 'muted small form-note' },
      'The gateway sends each request to the targets of the lowest priority number that can answer, split by weight; a higher number is a fallback for when none of the lower ones can.'),
    h('div', { class: 'target-editor-box' }, h('table', { class: 'compact target-editor' },
      h('thead', null, h('tr', null,
        h('th', null, 'Kind'), h('th', null, 'Model'), h('th', null, 'Weight'), h('th', null, 'Priority'), h('th', null))),
      body)),
    h('div', { class: 'form-actions' }, h('button', {
      type: 'button',
      class: 'small',
      onclick: () => {
        const used = new Set(rows.map((x) => x.value()).filter((t) => t.provider == null).map((t) => t.model));
        const unused = modelNames.find((n) => !used.has(n));
        // Every deployed model is a target already: the next is likely a provider's.
        const row = addRow({
          model: unused || '',
          provider: unused || !providers.length ? null : providers[0].name,
          weight: 1,
          priority: rows.length ? Math.max(...rows.map((x) => x.value().priority)) : 0,
        });
        row.focus();
      },
    }, 'Add target')),
    plan,
    error,
    h('div', { class: 'form-actions' },
      submit,
      h('button', { type: 'button', onclick: () => onDone() }, 'Cancel')));
    return {
      element: form,
      refreshModels: () => {
        const now = deployedNames();
        if (sameJson(now, modelNames)) return;
        modelNames = now;
        rows.forEach((row) => row.offerModels(modelNames));
        describePlan();
      },
    };
  }

  /** A target as the form sends it: defaults spelled out, no provider key for a local one. */
  function normalTarget(t) {
    const out = { model: t.model };
    if (t.provider != null) out.provider = t.provider;
    out.weight = t.weight == null ? 1 : t.weight;
    out.priority = t.priority == null ? 0 : t.priority;
    return out;
  }

  let datalistCount = 0;

  /**
   * One row of the targets editor. A local target picks a deployed model; a provider
   * target picks a provider and types its model id, with the provider's listed models
   * offered. Answers `{element, value(), focus(), remove, offerModels(names)}`.
   */
  function targetRow(target, modelNames, providers, onRemove, onChange) {
    const t = normalTarget(target);
    const kind = h('select', { 'aria-label': 'Kind', value: t.provider != null ? 'provider' : 'local' },
      h('option', { value: 'local' }, 'Deployed model'),
      h('option', { value: 'provider', disabled: !providers.length && t.provider == null }, providers.length ? 'Provider' : 'Provider (none yet)'));
    const local = h('select', { 'aria-label': 'Deployed model' });
    // The deployed models, and the chosen one though it is not (a route may name a model
    // before it is deployed, or after it is deleted).
    const offerModels = (deployed) => {
      const chosen = local.value || (t.provider == null ? t.model : '');
      const names = chosen && !deployed.includes(chosen) ? deployed.concat([chosen]) : deployed;
      local.replaceChildren(...(names.length
        ? names.map((n) => h('option', { value: n }, n + (deployed.includes(n) ? '' : ' (not deployed)')))
        : [h('option', { value: '' }, 'no models deployed')]));
      local.value = chosen || names[0] || '';
    };
    offerModels(modelNames);
    const providerNames = providers.map((p) => p.name);
    if (t.provider != null && !providerNames.includes(t.provider)) providerNames.push(t.provider);
    const provider = h('select', { 'aria-label': 'Provider', value: t.provider || providerNames[0] || '' },
      providerNames.map((n) => h('option', { value: n }, n)));
    const listId = 'provider-models-' + ++datalistCount;
    const list = h('datalist', { id: listId });
    const remote = h('input', { 'aria-label': 'Provider model', list: listId, placeholder: 'model id', value: t.provider != null ? t.model : '', autocomplete: 'off' });
    const weight = h('input', { type: 'number', 'aria-label': 'Weight', min: 0, max: 10000, step: 1, required: true, value: String(t.weight) });
    const priority = h('input', { type: 'number', 'aria-label': 'Priority', min: 0, max: 100, step: 1, required: true, value: String(t.priority) });
    const remove = h('button', { type: 'button', class: 'small', title: 'Remove this target', onclick: () => onRemove() }, '×');
    const localBox = h('div', { class: 'target-model' }, local);
    const remoteBox = h('div', { class: 'target-model' }, provider, remote, list);
    const sync = () => {
      const isProvider = kind.value === 'provider';
      if (!isProvider && !local.value && local.options.length) local.selectedIndex = 0;
      localBox.classList.toggle('hidden', isProvider);
      remoteBox.classList.toggle('hidden', !isProvider);
      const chosen = providers.find((p) => p.name === provider.value);
      list.replaceChildren(...(chosen ? chosen.models : []).map((m) => h('option', { value: m })));
      onChange();
    };
    kind.addEventListener('change', sync);
    provider.addEventListener('change', sync);
    for (const input of [local, remote, weight, priority]) input.addEventListener('input', onChange);
    const element = h('tr', null,
      h('td', null, kind),
      h('td', null, localBox, remoteBox),
      h('td', null, weight),
      h('td', null, priority),
      h('td', { class: 'actions' }, remove));
    // The first sync's onChange runs before the row is in the form's list: harmless.
    sync();
    return {
      element,
      remove,
      offerModels,
      focus: () => (kind.value === 'provider' ? remote : local).focus(),
      value: () => {
        const out = kind.value === 'provider'
          ? { model: remote.value.trim(), provider: provider.value }
          : { model: local.value };
        out.weight = Number(weight.value);
        out.priority = Number(priority.value);
        return out;
      },
    };
  }

  function deleteRoute(route, reload) {
    confirmDialog('Delete route ' + route.name + '?',
      'Clients that call ' + route.name + ' are refused at once, unless a deployed model has that name: it answers again then.',
      'Delete route',
      async () => {
        await api('DELETE', '/api/v1/model-routes/' + encodeURIComponent(route.name));
        toast('Route ' + route.name + ' deleted.');
        reload();
      });
  }

  // ---------------------------------------------------------------- playground

  /**
   * Reads an OpenAI server-sent event stream: calls `onEvent` with each `data:` line's
   * JSON until `[DONE]` or the end of the body. Aborting the request's signal ends it.
   */
  async function readEvents(response, onEvent) {
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffered = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffered += decoder.decode(value, { stream: true });
      let newline;
      while ((newline = buffered.indexOf('\n')) >= 0) {
        const line = buffered.slice(0, newline).trim();
        buffered = buffered.slice(newline + 1);
        if (!line.startsWith('data:')) continue;
        const data = line.slice(5).trim();
        if (data === '[DONE]') return;
        try {
          onEvent(JSON.parse(data));
        } catch (_) {
          // A line that is not JSON (a comment, a keep-alive) carries nothing to show.
        }
      }
    }
  }

  /** The request a pane sends: the settings, the system prompt and its conversation. */
  function chatRequest(model, settings, messages) {
    const all = settings.system ? [{ role: 'system', content: settings.system }].concat(messages) : messages;
    return {
      model,
      messages: all,
      temperature: settings.temperature,
      top_p: settings.top_p,
      max_tokens: settings.max_tokens,
      stream: true,
      stream_options: { include_usage: true },
    };
  }

  function shellQuote(text) {
    return "'" + text.replace(/'/g, "'\\''") + "'";
  }

  /** The same request as a curl command and as Python with OpenAI's client. */
  function requestAsCode(request, language) {
    const base = location.origin;
    if (language === 'curl') {
      return 'curl -N ' + base + '/v1/chat/completions \\\n' +
        '  -H "Authorization: Bearer $GANTRY_API_KEY" \\\n' +
        '  -H "Content-Type: application/json" \\\n' +
        '  -d ' + shellQuote(JSON.stringify(request, null, 2));
    }
    const py = (value) => JSON.stringify(value, null, 4)
      .replace(/\btrue\b/g, 'True').replace(/\bfalse\b/g, 'False').replace(/\bnull\b/g, 'None');
    return 'import os\nfrom openai import OpenAI\n\n' +
      'client = OpenAI(base_url="' + base + '/v1", api_key=os.environ["GANTRY_API_KEY"])\n' +
      'stream = client.chat.completions.create(\n' +
      '    model=' + JSON.stringify(request.model) + ',\n' +
      '    messages=' + py(request.messages).replace(/\n/g, '\n    ') + ',\n' +
      '    temperature=' + request.temperature + ',\n' +
      '    top_p=' + request.top_p + ',\n' +
      '    max_tokens=' + request.max_tokens + ',\n' +
      '    stream=True,\n' +
      ')\n' +
      'for chunk in stream:\n' +
      '    if chunk.choices:\n' +
      '        print(chunk.choices[0].delta.content or "", end="", flush=True)\n' +
      'print()\n';
  }

  function showCode(request) {
    const code = h('pre', { class: 'code', 'data-code': '' });
    const tabs = ['curl', 'python'].map((language) => h('button', {
      type: 'button',
      class: 'small',
      'data-language': language,
      onclick: () => choose(language),
    }, language === 'curl' ? 'curl' : 'Python'));
    const choose = (language) => {
      code.textContent = requestAsCode(request, language);
      for (const tab of tabs) tab.classList.toggle('primary', tab.dataset.language === language);
    };
    choose('curl');
    const copy = h('button', {
      type: 'button',
      onclick: async () => {
        try {
          await navigator.clipboard.writeText(code.textContent);
        } catch (_) {
          const range = document.createRange();
          range.selectNodeContents(code);
          getSelection().removeAllRanges();
          getSelection().addRange(range);
          document.execCommand('copy');
        }
        copy.textContent = 'Copied';
        setTimeout(() => (copy.textContent = 'Copy'), 2000);
      },
    }, 'Copy');
    const dialog = h('dialog', { class: 'wide' },
      h('h2', null, 'This request as code'),
      h('p', { class: 'muted small' }, 'Set GANTRY_API_KEY to an API key (API keys screen). The console itself sends it with your session.'),
      h('div', { class: 'tabs' }, tabs),
      code,
      h('div', { class: 'form-actions' }, copy, h('button', { type: 'button', class: 'primary', onclick: () => dialog.close() }, 'Close')));
    dialog.addEventListener('close', () => dialog.remove());
    document.body.append(dialog);
    dialog.showModal();
  }

  /**
   * One conversation with one model: its transcript, and a send that streams the answer
   * into it with time to first token and tokens per second under it.
   */
  function chatPane(index, models, chosen, routeNames) {
    const select = h('select', { 'aria-label': 'Model of pane ' + (index + 1), 'data-pane-model': index },
      models.map((m) => h('option', { value: m }, routeNames.has(m) ? m + ' (route)' : m)));
    if (chosen && models.includes(chosen)) select.value = chosen;
    const transcript = h('div', { class: 'transcript', 'data-transcript': index, 'aria-live': 'polite' },
      h('div', { class: 'muted small empty-chat' }, 'Send a message to start.'));
    const messages = [];
    let controller = null;
    const pane = {
      element: h('section', { class: 'panel chat-pane', 'data-pane': index },
        h('div', { class: 'chat-pane-head' }, h('label', { class: 'field' }, h('span', null, 'Model'), select)),
        transcript),
      model: () => select.value,
      busy: () => controller !== null,
      stop: () => controller && controller.abort(),
      clear: () => {
        pane.stop();
        messages.length = 0;
        transcript.replaceChildren(h('div', { class: 'muted small empty-chat' }, 'Send a message to start.'));
      },
      request: (settings, prompt) => chatRequest(select.value, settings, messages.concat([{ role: 'user', content: prompt }])),
      send: async (settings, prompt) => {
        if (!select.value) return;
        const request = pane.request(settings, prompt);
        transcript.querySelector('.empty-chat')?.remove();
        transcript.append(h('div', { class: 'message user' }, h('div', { class: 'role' }, 'You'), h('div', { class: 'content' }, prompt)));
        const content = h('div', { class: 'content', 'data-answer': '' });
        const stats = h('div', { class: 'stats muted small', 'data-stats': '' }, 'waiting for the first token…');
        const answer = h('div', { class: 'message assistant streaming' },
          h('div', { class: 'role' }, select.value), content, stats);
        transcript.append(answer);
        transcript.scrollTop = transcript.scrollHeight;
        controller = new AbortController();
        const sent = performance.now();
        let first = null;
        let chunks = 0;
        let usage = null;
        // The target of a route that answered (x-gantry-target): a model, or provider/model.
        let target = null;
        let outcome = 'done';
        try {
          const response = await fetch('/v1/chat/completions', {
            method: 'POST',
            credentials: 'same-origin',
            headers: { 'content-type': 'application/json', accept: 'text/event-stream' },
            body: JSON.stringify(request),
            signal: controller.signal,
          });
          if (!response.ok) throw await errorFrom(response);
          target = response.headers.get('x-gantry-target');
          await readEvents(response, (event) => {
            if (event.usage) usage = event.usage;
            const delta = event.choices && event.choices[0] && event.choices[0].delta;
            const text = delta && (delta.content || '');
            if (!text) return;
            if (first === null) first = performance.now();
            chunks += 1;
            content.append(text);
            transcript.scrollTop = transcript.scrollHeight;
          });
        } catch (e) {
          if (e.name === 'AbortError') {
            outcome = 'stopped';
          } else {
            outcome = 'failed';
            answer.append(h('div', { class: 'alert', role: 'alert' }, e.message));
          }
        } finally {
          controller = null;
        }
        const ended = performance.now();
        answer.classList.remove('streaming');
        answer.dataset.outcome = outcome;
        const tokens = usage && usage.completion_tokens != null ? usage.completion_tokens : chunks;
        const parts = [];
        if (first !== null) {
          parts.push('first token ' + Math.round(first - sent) + ' ms');
          const generating = (ended - first) / 1000;
          if (tokens > 1 && generating > 0) parts.push(((tokens - 1) / generating).toFixed(1) + ' tokens/s');
          parts.push(tokens + (usage ? ' tokens' : ' chunks'));
        } else if (outcome === 'done') {
          parts.push('no text in the answer');
        }
        if (outcome === 'stopped') parts.push('stopped');
        // A model that answers to its own name needs no "via".
        if (target && target !== request.model) parts.push('via ' + target);
        stats.textContent = parts.join(' · ');
        if (content.textContent) {
          messages.push({ role: 'user', content: prompt }, { role: 'assistant', content: content.textContent });
        }
      },
    };
    return pane;
  }

  function renderPlayground(main, parts, params) {
    const body = h('div', null, h('div', { class: 'panel empty' }, 'Loading the running models…'));
    main.append(pageHead('Playground'), body);
    let panes = [];
    let closed = false;
    (async () => {
      let models;
      // The gateway lists routes and models alike; admins may read which are routes.
      let routeNames = new Set();
      try {
        const [list, routes] = await Promise.all([
          api('GET', '/v1/models'),
          isAdmin() ? api('GET', '/api/v1/model-routes').then(itemsOf).catch(() => []) : Promise.resolve([]),
        ]);
        models = list.data.map((m) => m.id).sort();
        routeNames = new Set(routes.map((r) => r.name));
      } catch (e) {
        body.replaceChildren(h('div', { class: 'panel' }, h('div', { class: 'alert' }, e.message)));
        return;
      }
      if (closed) return;
      if (!models.length) {
        body.replaceChildren(h('div', { class: 'panel empty' },
          'No model has a running instance and there are no routes yet. Deploy a model on the ', h('a', { href: '#/models' }, 'Models'), ' screen.'));
        return;
      }
      const system = h('textarea', { rows: 2, placeholder: 'You are a helpful assistant.', 'aria-label': 'System prompt' });
      const temperature = h('input', { type: 'number', min: 0, max: 2, step: 0.1, value: 0.7, 'aria-label': 'Temperature' });
      const maxTokens = h('input', { type: 'number', min: 1, max: 32768, step: 1, value: 256, 'aria-label': 'Max tokens' });
      const topP = h('input', { type: 'number', min: 0, max: 1, step: 0.05, value: 1, 'aria-label': 'Top p' });
      const settings = () => ({
        system: system.value.trim(),
        temperature: Number(temperature.value),
        max_tokens: Math.round(Number(maxTokens.value)),
        top_p: Number(topP.value),
      });
      const prompt = h('textarea', { rows: 3, placeholder: 'Ask something… (Ctrl+Enter sends)', 'aria-label': 'Message' });
      const send = h('button', { class: 'primary', type: 'submit' }, 'Send');
      const stop = h('button', { type: 'button', disabled: true, onclick: () => panes.forEach((p) => p.stop()) }, 'Stop');
      const clear = h('button', { type: 'button', onclick: () => panes.forEach((p) => p.clear()) }, 'Clear');
      const code = h('button', {
        type: 'button',
        onclick: () => showCode(panes[0].request(settings(), prompt.value || 'Hello!')),
      }, 'View as code');
      const compare = h('input', { type: 'checkbox', 'aria-label': 'Compare two models' });
      const grid = h('div', { class: 'chat-panes' });
      const error = h('div', { class: 'alert', role: 'alert' });
      // The first pane keeps its conversation when the second comes or goes.
      const layout = () => {
        if (!panes.length) panes = [chatPane(0, models, params.get('model'), routeNames)];
        if (panes[1]) panes[1].stop();
        const first = panes[0].model();
        panes = compare.checked
          ? [panes[0], chatPane(1, models, models.find((m) => m !== first) || first, routeNames)]
          : [panes[0]];
        grid.classList.toggle('two', compare.checked);
        grid.replaceChildren(...panes.map((p) => p.element));
      };
      compare.addEventListener('change', layout);
      const form = h('form', {
        class: 'panel composer',
        onsubmit: async (event) => {
          event.preventDefault();
          error.textContent = '';
          const text = prompt.value.trim();
          if (!text) return;
          const chosen = settings();
          if (!(chosen.temperature >= 0 && chosen.temperature <= 2)) { error.textContent = 'Temperature must be between 0 and 2.'; return; }
          if (!(chosen.top_p > 0 && chosen.top_p <= 1)) { error.textContent = 'Top p must be above 0 and at most 1.'; return; }
          if (!(chosen.max_tokens >= 1)) { error.textContent = 'Max tokens must be at least 1.'; return; }
          prompt.value = '';
          send.disabled = true;
          stop.disabled = false;
          try {
            await Promise.all(panes.map((p) => p.send(chosen, text)));
          } finally {
            send.disabled = false;
            stop.disabled = true;
            prompt.focus();
          }
        },
      },
      prompt,
      error,
      h('div', { class: 'form-actions' }, code, clear, stop, send));
      prompt.addEventListener('keydown', (event) => {
        if (event.key === 'Enter' && (event.ctrlKey || event.metaKey)) form.requestSubmit();
      });
      body.replaceChildren(
        h('div', { class: 'panel' }, h('div', { class: 'form-grid' },
          h('label', { class: 'field wide' }, h('span', null, 'System prompt'), system),
          h('label', { class: 'field' }, h('span', null, 'Temperature'), temperature),
          h('label', { class: 'field' }, h('span', null, 'Max tokens'), maxTokens),
          h('label', { class: 'field' }, h('span', null, 'Top p'), topP),
          h('label', { class: 'field check' }, compare, h('span', null, 'Compare two models side by side')))),
        grid,
        form);
      layout();
      prompt.focus();
    })();
    return () => {
      closed = true;
      panes.forEach((p) => p.stop());
    };
  }

  // ---------------------------------------------------------------- usage

  const SVG_NS = 'http://www.w3.org/2000/svg';
  /** Builds an SVG element: svg('rect', {x: 1}, child...). */
  function svg(tag, attrs, ...children) {
    const el = document.createElementNS(SVG_NS, tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value != null) el.setAttribute(key, String(value));
    }
    append(el, children);
    return el;
  }

  /** Colours of a chart's series, in order; the last is "other". */
  const SERIES_COLOURS = ['#3b6fe0', '#18a078', '#e08a1e', '#b04fd1', '#d9434a', '#2aa3c4', '#8a93a3'];
  const USAGE_WINDOWS = {
    '24h': { label: 'Last 24 h', hours: 24, bucket: 'hour' },
    '7d': { label: 'Last 7 days', hours: 24 * 7, bucket: 'hour' },
    '30d': { label: 'Last 30 days', hours: 24 * 30, bucket: 'day' },
  };
  const BUCKET_MS = { hour: 3600000, day: 86400000 };

  function fmtCount(n) {
    return Number(n || 0).toLocaleString('en-US');
  }

  /**
   * The value axis of a chart from 0 to `top`: a grid line and a label at 0, half and the
   * top, from `left` to `right`; `yOf` places a value, `format` writes it.
   */
  function valueAxis(chart, left, right, top, yOf, format) {
    for (const fraction of [0, 0.5, 1]) {
      const value = top * fraction;
      const y = yOf(value);
      chart.append(
        svg('line', { x1: left, x2: right, y1: y, y2: y, class: 'grid' }),
        svg('text', { x: left - 6, y: y + 4, 'text-anchor': 'end', class: 'axis' }, format(value)));
    }
  }

  /** A chart's legend: one swatch of its colour and the name per series. */
  function chartLegend(series) {
    return h('div', { class: 'legend' }, series.map((s) => {
      const swatch = h('span', { class: 'swatch' });
      // Set through the CSSOM: the page's CSP allows no inline style attribute.
      swatch.style.background = s.colour;
      return h('span', { class: 'legend-item' }, swatch, s.name);
    }));
  }

  /**
   * A stacked bar chart: one bar per bucket from `start` (`count` buckets of `step` ms),
   * one segment per series. `series`: [{name, colour, values: Map(bucketIndex → value)}].
   */
  function stackedBars(series, start, step, count, unit) {
    const width = 960;
    const height = 240;
    const left = 56;
    const bottom = 24;
    const plotW = width - left - 8;
    const plotH = height - bottom - 8;
    const totals = new Array(count).fill(0);
    for (const s of series) for (const [i, v] of s.values) totals[i] += v;
    const max = Math.max(1, ...totals);
    // A round top for the axis: 1, 2 or 5 times a power of ten.
    const magnitude = Math.pow(10, Math.floor(Math.log10(max)));
    const top = [1, 2, 5, 10].map((m) => m * magnitude).find((t) => t >= max);
    const barW = plotW / count;
    const chart = svg('svg', { viewBox: '0 0 ' + width + ' ' + height, class: 'chart', role: 'img', 'aria-label': unit + ' over time', 'data-chart': '' });
    valueAxis(chart, left, width - 8, top, (v) => 8 + plotH * (1 - v / top),
      (v) => (Number.isInteger(v) ? fmtCount(v) : v.toFixed(1)));
    const labelEvery = Math.max(1, Math.ceil(count / 8));
    for (let i = 0; i < count; i++) {
      const at = new Date(start + i * step);
      let y = 8 + plotH;
      for (const s of series) {
        const value = s.values.get(i) || 0;
        if (!value) continue;
        const barH = (value / top) * plotH;
        y -= barH;
        chart.append(svg('rect', {
          x: (left + i * barW + barW * 0.12).toFixed(1),
          y: y.toFixed(1),
          width: Math.max(1, barW * 0.76).toFixed(1),
          height: Math.max(0.5, barH).toFixed(1),
          fill: s.colour,
          'data-series': s.name,
        }, svg('title', null, s.name + ' · ' + at.toLocaleString() + ': ' + fmtCount(value) + ' ' + unit)));
      }
      if (i % labelEvery === 0) {
        const text = step >= 86400000
          ? at.toLocaleDateString(undefined, { month: 'short', day: 'numeric' })
          : at.toLocaleString(undefined, count > 48 ? { month: 'short', day: 'numeric', hour: '2-digit' } : { hour: '2-digit', minute: '2-digit' });
        chart.append(svg('text', { x: left + i * barW + barW / 2, y: height - 6, 'text-anchor': 'middle', class: 'axis' }, text));
      }
    }
    return chart;
  }

  function renderUsage(main, parts, params) {
    let windowKey = USAGE_WINDOWS[params.get('window')] ? params.get('window') : '24h';
    let groupBy = params.get('by') || 'model';
    let metric = params.get('metric') === 'requests' ? 'requests' : 'tokens';
    if (groupBy === 'user' && !isAdmin()) groupBy = 'model';
    const body = h('div', null, h('div', { class: 'panel empty' }, 'Loading usage…'));
    const choice = (name, options, current, set) => h('div', { class: 'segmented', role: 'group', 'aria-label': name },
      options.map(([value, label]) => h('button', {
        type: 'button',
        class: 'small' + (value === current ? ' primary' : ''),
        'aria-pressed': value === current ? 'true' : 'false',
        onclick: () => { set(value); controls(); load(); },
      }, label)));
    const controlBox = h('div', { class: 'usage-controls' });
    const controls = () => {
      const groups = [['model', 'Model'], ['key', 'API key']];
      if (isAdmin()) groups.push(['user', 'User']);
      controlBox.replaceChildren(
        choice('Window', Object.entries(USAGE_WINDOWS).map(([k, w]) => [k, w.label]), windowKey, (v) => (windowKey = v)),
        choice('Group by', groups, groupBy, (v) => (groupBy = v)),
        choice('Show', [['tokens', 'Tokens'], ['requests', 'Requests']], metric, (v) => (metric = v)));
      history.replaceState(null, '', '#/usage?window=' + windowKey + '&by=' + groupBy + '&metric=' + metric);
    };
    main.append(pageHead('Usage', controlBox), body);
    controls();

    let names = { keys: new Map(), users: new Map() };
    const loadNames = async () => {
      const [keys, users] = await Promise.all([
        listAll('/api/v1/api-keys').catch(() => []),
        isAdmin() ? listAll('/api/v1/users').catch(() => []) : Promise.resolve([session.user]),
      ]);
      names = { keys: new Map(keys.map((k) => [k.id, k.name])), users: new Map(users.map((u) => [u.id, u.username])) };
    };
    const groupOf = (point) => {
      if (groupBy === 'key') {
        if (point.api_key_id == null) return 'console session' + (isAdmin() ? ' (' + (names.users.get(point.user_id) || 'user ' + point.user_id) + ')' : '');
        return names.keys.get(point.api_key_id) || 'deleted key ' + point.api_key_id;
      }
      if (groupBy === 'user') return names.users.get(point.user_id) || 'user ' + point.user_id;
      return point.model;
    };

    let loading = false;
    const load = async () => {
      if (loading) return;
      loading = true;
      try {
        const w = USAGE_WINDOWS[windowKey];
        const step = BUCKET_MS[w.bucket];
        // Whole buckets: the first starts on a bucket boundary (UTC), the last holds now.
        const now = Date.now();
        const start = Math.floor((now - w.hours * 3600000) / step) * step + step;
        const count = Math.round((Math.floor(now / step) * step - start) / step) + 1;
        const report = await api('GET', '/api/v1/usage?bucket=' + w.bucket + '&from=' + encodeURIComponent(new Date(start).toISOString()));
        draw(report, start, step, count);
      } catch (e) {
        body.replaceChildren(h('div', { class: 'panel' }, h('div', { class: 'alert' }, e.message)));
      } finally {
        loading = false;
      }
    };

    const draw = (report, start, step, count) => {
      const value = (p) => (metric === 'tokens' ? p.total_tokens : p.requests);
      const groups = new Map();
      for (const p of report.series) {
        const name = groupOf(p);
        const g = groups.get(name) || { name, requests: 0, prompt_tokens: 0, completion_tokens: 0, total_tokens: 0, values: new Map() };
        g.requests += p.requests;
        g.prompt_tokens += p.prompt_tokens;
        g.completion_tokens += p.completion_tokens;
        g.total_tokens += p.total_tokens;
        const i = Math.round((Date.parse(p.start) - start) / step);
        if (i >= 0 && i < count) g.values.set(i, (g.values.get(i) || 0) + value(p));
        groups.set(name, g);
      }
      const ranked = [...groups.values()].sort((a, b) => value(b) - value(a) || a.name.localeCompare(b.name));
      // The biggest series by name, the rest as one "other".
      const shown = ranked.slice(0, SERIES_COLOURS.length - 1).map((g, i) => ({ name: g.name, colour: SERIES_COLOURS[i], values: g.values }));
      const rest = ranked.slice(SERIES_COLOURS.length - 1);
      if (rest.length) {
        const values = new Map();
        for (const g of rest) for (const [i, v] of g.values) values.set(i, (values.get(i) || 0) + v);
        shown.push({ name: rest.length + ' others', colour: SERIES_COLOURS[SERIES_COLOURS.length - 1], values });
      }
      const t = report.total;
      const cards = h('div', { class: 'cards' },
        h('div', { class: 'card' }, h('h2', null, 'Requests'), h('div', { class: 'big', 'data-total': 'requests' }, fmtCount(t.requests))),
        h('div', { class: 'card' }, h('h2', null, 'Prompt tokens'), h('div', { class: 'big', 'data-total': 'prompt_tokens' }, fmtCount(t.prompt_tokens))),
        h('div', { class: 'card' }, h('h2', null, 'Completion tokens'), h('div', { class: 'big', 'data-total': 'completion_tokens' }, fmtCount(t.completion_tokens))));
      const unit = metric === 'tokens' ? 'tokens' : 'requests';
      const legend = chartLegend(shown);
      const chartPanel = h('div', { class: 'panel' },
        h('h2', null, (metric === 'tokens' ? 'Tokens' : 'Requests') + ' per ' + (step >= 86400000 ? 'day' : 'hour') + ', by ' + ({ model: 'model', key: 'API key', user: 'user' })[groupBy]),
        ranked.length ? [stackedBars(shown, start, step, count, unit), legend]
          : h('div', { class: 'empty muted' }, 'Nothing served in this window yet.'));
      const rows = ranked.map((g) => h('tr', null,
        h('td', null, g.name),
        h('td', { class: 'num' }, fmtCount(g.requests)),
        h('td', { class: 'num' }, fmtCount(g.prompt_tokens)),
        h('td', { class: 'num' }, fmtCount(g.completion_tokens)),
        h('td', { class: 'num' }, fmtCount(g.total_tokens))));
      const table = ranked.length ? h('div', { class: 'panel flush' }, h('table', { 'data-usage-table': '' },
        h('thead', null, h('tr', null,
          h('th', null, ({ model: 'Model', key: 'API key', user: 'User' })[groupBy]),
          h('th', { class: 'num' }, 'Requests'), h('th', { class: 'num' }, 'Prompt tokens'),
          h('th', { class: 'num' }, 'Completion tokens'), h('th', { class: 'num' }, 'Total tokens'))),
        h('tbody', null, rows))) : null;
      body.replaceChildren(cards, chartPanel, table,
        h('p', { class: 'muted small' }, 'Times are in your browser\'s time zone; buckets start on the hour or at midnight UTC. Usage older than the server\'s usage_retention is kept per day.'));
    };

    loadNames().finally(load);
    // Usage arrives about once a second; every 10 s is enough to watch it move.
    const timer = setInterval(load, 10000);
    return () => clearInterval(timer);
  }

  // ---------------------------------------------------------------- instances

  function renderInstances(main, parts, params) {
    if (parts[0] && parts[1] === 'logs') return renderLogs(main, Number(parts[0]), params);
    const modelFilter = h('select', { 'aria-label': 'Model' }, h('option', { value: '' }, 'all models'));
    const stateFilter = h('select', { 'aria-label': 'State' }, h('option', { value: '' }, 'all states'),
      INSTANCE_STATES.map((s) => h('option', { value: s }, s)));
    const wanted = { model: params.get('model') || '', state: params.get('state') || '', worker: params.get('worker') || '' };
    const workerFilter = h('span', { class: 'filter-chip' });
    stateFilter.value = wanted.state;
    const setQuery = () => {
      const q = new URLSearchParams();
      if (modelFilter.value) q.set('model', modelFilter.value);
      if (stateFilter.value) q.set('state', stateFilter.value);
      if (wanted.worker) q.set('worker', wanted.worker);
      const hash = '#/instances' + (q.toString() ? '?' + q : '');
      history.replaceState(null, '', hash);
      wanted.model = modelFilter.value;
      wanted.state = stateFilter.value;
      draw();
    };
    modelFilter.addEventListener('change', setQuery);
    stateFilter.addEventListener('change', setQuery);
    const tableBox = h('div');
    main.append(pageHead('Instances', h('div', { class: 'filters' },
      workerFilter, h('label', null, 'Model', modelFilter), h('label', null, 'State', stateFilter))), tableBox);

    const draw = () => {
      // Keep the model choices current without losing the selection.
      const models = live.models.values();
      const options = [h('option', { value: '' }, 'all models')].concat(models.map((m) => h('option', { value: String(m.id) }, m.name)));
      if (modelFilter.options.length !== options.length || models.some((m, i) => modelFilter.options[i + 1].value !== String(m.id))) {
        modelFilter.replaceChildren(...options);
      }
      modelFilter.value = wanted.model;
      workerFilter.replaceChildren();
      if (wanted.worker) {
        const sample = live.instances.values().find((i) => String(i.worker_id) === wanted.worker);
        workerFilter.append(h('span', { class: 'chip' }, 'worker ' + (sample ? sample.worker_name : wanted.worker)),
          h('button', { class: 'small', title: 'Show every worker', onclick: () => { wanted.worker = ''; setQuery(); } }, '×'));
      }

      const status = listStatus([live.instances]);
      if (status) {
        tableBox.replaceChildren(status);
        return;
      }
      const instances = live.instances.values().filter((i) =>
        (!wanted.model || String(i.model_id) === wanted.model) && (!wanted.state || i.state === wanted.state)
        && (!wanted.worker || String(i.worker_id) === wanted.worker));
      if (!instances.length) {
        tableBox.replaceChildren(h('div', { class: 'panel empty' },
          live.instances.items.size ? 'No instance matches the filter.' : 'No instances: they appear when a model has replicas.'));
        return;
      }
      const columns = isAdmin() ? 9 : 8;
      const rows = [];
      for (const i of instances) {
        const isError = i.state === 'error' && i.state_message;
        // A download shows as a bar; its state message says the same in words (its title).
        const progress = instanceProgress(i);
        rows.push(h('tr', { class: isError ? 'has-detail' : null, 'data-instance': i.id },
          h('td', null, h('strong', null, i.name)),
          h('td', null, h('a', { href: '#/instances?model=' + i.model_id }, i.model_name)),
          h('td', null, stateBadge(i.state, INSTANCE_STATE_CLASS),
            progress || (!isError && i.state_message ? h('div', { class: 'state-message' }, i.state_message) : null)),
          h('td', null, i.worker_name || h('span', { class: 'muted' }, '—')),
          h('td', null, i.worker_id == null ? h('span', { class: 'muted' }, '—')
            : h('span', { class: 'mono small' }, i.gpu_indexes.length ? i.gpu_indexes.join(', ') : 'CPU')),
          h('td', null, i.address ? h('span', { class: 'mono small' }, i.address) : h('span', { class: 'muted' }, '—')),
          h('td', { class: 'num' }, i.restart_count),
          h('td', null, timeCell(i.updated_at)),
          h('td', { class: 'actions' },
            i.worker_id == null
              ? h('button', { class: 'small', disabled: true, title: 'Not placed on a worker yet: no logs' }, 'Logs')
              : h('a', { class: 'button small', href: '#/instances/' + i.id + '/logs' }, 'Logs'),
            isAdmin() ? h('button', { class: 'small danger', title: 'Delete this instance; a new one replaces it', onclick: () => restartInstance(i) }, 'Restart') : null)));
        if (isError) {
          rows.push(h('tr', { class: 'detail' }, h('td', { colspan: columns },
            h('pre', { class: 'stderr' }, i.state_message))));
        }
      }
      tableBox.replaceChildren(h('div', { class: 'panel flush' }, h('table', null,
        h('thead', null, h('tr', null,
          h('th', null, 'Instance'), h('th', null, 'Model'), h('th', null, 'State'), h('th', null, 'Worker'),
          h('th', null, 'GPUs'), h('th', null, 'Address'), h('th', { class: 'num' }, 'Restarts'),
          h('th', null, 'Updated'), h('th', null))),
        h('tbody', null, rows))));
    };
    return combine(follow([live.instances, live.models], draw), ticker(draw, 10000));
  }

  function restartInstance(instance) {
    confirmDialog('Restart ' + instance.name + '?',
      'The instance is deleted and its backend stopped; the model keeps its replica count, so a new instance replaces it and is scheduled again.',
      'Delete and replace',
      async () => {
        await api('DELETE', '/api/v1/model-instances/' + instance.id);
        toast('Instance ' + instance.name + ' deleted; a replacement is on its way.');
      });
  }

  function renderLogs(main, id, params) {
    const tail = h('select', { 'aria-label': 'Lines' }, [100, 200, 1000, 5000].map((n) => h('option', { value: String(n) }, 'last ' + n + ' lines')));
    tail.value = params.get('tail') || '200';
    const followBox = h('input', { type: 'checkbox', checked: params.get('follow') !== 'false' });
    const refresh = h('button', { class: 'small' }, 'Refresh');
    const header = h('span', { class: 'muted' }, 'instance ' + id);
    const error = h('div', { class: 'alert', role: 'alert' });
    const output = h('pre', { class: 'logs', tabindex: 0 }, 'Loading…');
    const outputPanel = h('div', { class: 'panel' }, output);
    const updated = h('span', { class: 'muted small' });
    main.append(
      h('div', { class: 'page-head' },
        h('a', { href: '#/instances' }, '← Instances'),
        h('h1', null, 'Logs'), header, h('span', { class: 'spacer' }),
        h('div', { class: 'log-controls' }, tail, h('label', null, followBox, 'Follow'), refresh, updated)),
      error,
      outputPanel);

    let busy = false;
    let timer = null;
    let stopped = false;
    const load = async () => {
      if (busy || stopped) return;
      busy = true;
      const atBottom = output.scrollTop + output.clientHeight >= output.scrollHeight - 24;
      try {
        const text = await api('GET', '/api/v1/model-instances/' + id + '/logs?tail=' + tail.value);
        if (stopped) return;
        error.textContent = '';
        outputPanel.classList.remove('hidden');
        const content = text === '' ? '(no output yet)' : String(text);
        if (output.textContent !== content) {
          output.textContent = content;
          if (atBottom || output.dataset.first !== 'no') output.scrollTop = output.scrollHeight;
        }
        output.dataset.first = 'no';
        updated.textContent = 'updated ' + new Date().toLocaleTimeString();
      } catch (e) {
        if (stopped) return;
        error.textContent = e.message;
        if (output.textContent === 'Loading…') output.textContent = '';
        // Keep the last good output visible; hide an empty box.
        outputPanel.classList.toggle('hidden', output.textContent === '');
      } finally {
        busy = false;
      }
    };
    const schedule = () => {
      clearInterval(timer);
      timer = followBox.checked ? setInterval(load, 2000) : null;
    };
    tail.addEventListener('change', load);
    followBox.addEventListener('change', () => {
      schedule();
      if (followBox.checked) load();
    });
    refresh.addEventListener('click', load);
    load();
    schedule();

    const drawHeader = () => {
      const instance = live.instances.items.get(id);
      if (!instance) {
        header.replaceChildren(live.instances.loaded ? h('span', { class: 'muted' }, 'instance ' + id + ' (gone)') : 'instance ' + id);
        return;
      }
      header.replaceChildren(h('strong', null, instance.name), ' ', stateBadge(instance.state, INSTANCE_STATE_CLASS),
        instance.worker_name ? h('span', { class: 'muted' }, ' on ' + instance.worker_name) : null);
    };
    return combine(follow([live.instances], drawHeader), () => {
      stopped = true;
      clearInterval(timer);
    });
  }

  // ---------------------------------------------------------------- workers

  function gpuList(gpus) {
    if (!gpus || !gpus.length) return h('span', { class: 'muted' }, 'no GPUs (CPU only)');
    return h('div', { class: 'gpus' }, gpus.map((g) => {
      const share = g.memory_total ? g.memory_used / g.memory_total : 0;
      const bar = h('div');
      bar.style.width = Math.min(100, Math.round(share * 100)) + '%';
      const meta = [fmtBytes(g.memory_used) + ' / ' + fmtBytes(g.memory_total)];
      if (g.utilization != null) meta.push(g.utilization + '% util');
      if (g.temperature != null) meta.push(g.temperature + ' °C');
      return h('div', { class: 'gpu', title: g.uuid },
        h('div', { class: 'gpu-head' },
          h('span', { class: 'idx' }, '#' + g.index),
          h('span', null, g.name),
          g.simulated ? h('span', { class: 'badge sim', title: 'Declared with --simulate-gpus: not real hardware' }, 'simulated') : null),
        h('div', { class: 'meter' + (share > 0.9 ? ' high' : '') }, bar),
        h('div', { class: 'gpu-meta' }, meta.join(' · ')));
    }));
  }

  function systemCell(system) {
    if (!system || !system.cpu_count) return h('span', { class: 'muted' }, '—');
    const used = system.memory_total - system.memory_available;
    return h('div', { class: 'small host' },
      h('div', null, system.cpu_count + ' CPUs · load ' + Number(system.load_average).toFixed(2)),
      h('div', null, fmtBytes(used) + ' / ' + fmtBytes(system.memory_total) + ' RAM'),
      h('div', { class: 'muted' }, fmtBytes(system.disk_free) + ' disk free'));
  }

  function renderWorkers(main, parts) {
    if (parts[0]) return renderWorker(main, Number(parts[0]));
    const tableBox = h('div');
    main.append(pageHead('Workers', h('span', { class: 'muted small' },
      'Workers join with the registration token: gantry worker --server-url … --token …')), tableBox);
    const draw = () => {
      const status = listStatus([live.workers]);
      if (status) {
        tableBox.replaceChildren(status);
        return;
      }
      const workers = live.workers.values();
      if (!workers.length) {
        tableBox.replaceChildren(h('div', { class: 'panel empty' },
          'No workers yet. Start one on a GPU machine with the registration token from the server’s data directory.'));
        return;
      }
      const instancesOn = countBy(live.instances.values().filter((i) => i.worker_id != null), 'worker_id');
      const rows = workers.map((w) => h('tr', null,
        h('td', null, h('a', { href: '#/workers/' + w.id, title: 'The last hour of ' + w.name }, h('strong', null, w.name)), h('div', { class: 'muted small mono' }, w.address),
          w.status && w.status.backends && w.status.backends.length
            ? h('div', { class: 'small muted' }, 'backends: ' + w.status.backends.join(', ')) : null),
        h('td', null, stateBadge(w.state, WORKER_STATE_CLASS),
          w.state_message ? h('div', { class: 'state-message' }, w.state_message) : null),
        h('td', null, labelChips(w.labels)),
        h('td', null, gpuList(w.status && w.status.gpus)),
        h('td', null, systemCell(w.status && w.status.system)),
        h('td', { class: 'num' }, h('a', { href: '#/instances?worker=' + w.id }, instancesOn[w.id] || 0)),
        h('td', null, timeCell(w.last_heartbeat_at)),
        h('td', { class: 'actions' },
          h('button', { class: 'small', onclick: () => editLabels(w) }, 'Labels'),
          h('button', { class: 'small danger', onclick: () => deleteWorker(w) }, 'Delete'))));
      tableBox.replaceChildren(h('div', { class: 'panel flush' }, h('table', null,
        h('thead', null, h('tr', null,
          h('th', null, 'Worker'), h('th', null, 'State'), h('th', null, 'Labels'), h('th', null, 'GPUs'),
          h('th', null, 'Host'), h('th', { class: 'num' }, 'Instances'), h('th', null, 'Last heartbeat'), h('th', null))),
        h('tbody', null, rows))));
    };
    return combine(follow([live.workers, live.instances], draw), ticker(draw, 5000));
  }

  /**
   * A small line chart of the last hour: `lines` [{name, colour, points: [[ms, value]]}]
   * on one scale from 0 to `max` (the largest value when null), `format` for its labels.
   */
  function hourChart(title, lines, max, format, empty) {
    const width = 460;
    const height = 130;
    const left = 52;
    const top = 8;
    const plotW = width - left - 8;
    const plotH = height - top - 22;
    const now = Date.now();
    const from = now - 3600000;
    const values = lines.flatMap((l) => l.points.map((p) => p[1]));
    const ceiling = max || Math.max(1, ...values);
    const x = (ms) => left + ((ms - from) / 3600000) * plotW;
    const y = (v) => top + plotH * (1 - Math.min(1, v / ceiling));
    const chart = svg('svg', { viewBox: '0 0 ' + width + ' ' + height, class: 'chart', role: 'img', 'aria-label': title, 'data-history-chart': title });
    valueAxis(chart, left, width - 8, ceiling, y, format);
    for (const [ms, label] of [[from, '60 min ago'], [from + 1800000, '30 min'], [now, 'now']]) {
      chart.append(svg('text', { x: x(ms), y: height - 4, 'text-anchor': ms === from ? 'start' : ms === now ? 'end' : 'middle', class: 'axis' }, label));
    }
    if (!lines.some((l) => l.points.some((p) => p[0] >= from))) {
      chart.append(svg('text', { x: left + plotW / 2, y: top + plotH / 2, 'text-anchor': 'middle', class: 'axis' },
        empty || 'nothing reported yet'));
    }
    for (const line of lines) {
      const points = line.points.filter((p) => p[0] >= from);
      if (!points.length) continue;
      chart.append(svg('polyline', {
        points: points.map((p) => x(p[0]).toFixed(1) + ',' + y(p[1]).toFixed(1)).join(' '),
        fill: 'none',
        stroke: line.colour,
        'stroke-width': 1.8,
        'data-line': line.name,
      }, svg('title', null, line.name + ': ' + format(points[points.length - 1][1]) + ' now')));
      // The newest point as a dot, so a line of one sample shows too.
      const [lastMs, lastValue] = points[points.length - 1];
      chart.append(svg('circle', { cx: x(lastMs).toFixed(1), cy: y(lastValue).toFixed(1), r: 2.5, fill: line.colour }));
    }
    const legend = lines.length > 1 ? chartLegend(lines) : null;
    return h('div', { class: 'history-chart' }, h('h3', null, title), chart, legend);
  }

  const pct = (v) => Math.round(v) + '%';

  /** One worker: its facts, the last hour of how busy it was, its installed backends. */
  function renderWorker(main, id) {
    const head = h('div');
    const facts = h('div');
    const charts = h('div', { class: 'panel' }, h('div', { class: 'empty muted' }, 'Loading the last hour…'));
    const backends = h('div');
    main.append(head, facts, charts, backends);
    const drawFacts = () => {
      const w = live.workers.items.get(id);
      head.replaceChildren(pageHead('Worker ' + (w ? w.name : id), h('a', { href: '#/workers' }, '← Workers')));
      if (!w) return;
      facts.replaceChildren(h('div', { class: 'panel' }, h('div', { class: 'facts' },
        h('div', { class: 'fact' }, h('span', null, 'State'), stateBadge(w.state, WORKER_STATE_CLASS)),
        h('div', { class: 'fact' }, h('span', null, 'Address'), h('code', null, w.address)),
        h('div', { class: 'fact' }, h('span', null, 'Last heartbeat'), timeCell(w.last_heartbeat_at)),
        h('div', { class: 'fact' }, h('span', null, 'Labels'), labelChips(w.labels)),
        h('div', { class: 'fact' }, h('span', null, 'Host'), systemCell(w.status && w.status.system))),
      h('div', null, gpuList(w.status && w.status.gpus))));
    };
    const load = async () => {
      try {
        const history = await api('GET', '/api/v1/workers/' + id + '/history');
        const samples = history.samples.map((s) => Object.assign({ ms: Date.parse(s.at) }, s));
        const boxes = [];
        if (!samples.length) {
          charts.replaceChildren(h('div', { class: 'empty muted' }, 'No samples yet: the worker sends one with its heartbeats (one kept per 10 s).'));
        } else {
          boxes.push(hourChart('CPU busy', [{ name: 'CPU', colour: SERIES_COLOURS[0], points: samples.filter((s) => s.cpu_percent != null).map((s) => [s.ms, s.cpu_percent]) }], 100, pct,
            'measured from the second sample on'));
          const ramTotal = samples[samples.length - 1].memory_total;
          boxes.push(hourChart('RAM used of ' + fmtBytes(ramTotal), [{ name: 'RAM', colour: SERIES_COLOURS[1], points: samples.map((s) => [s.ms, s.memory_used]) }], ramTotal, fmtBytes));
          const indexes = [...new Set(samples.flatMap((s) => s.gpus.map((g) => g.index)))].sort((a, b) => a - b);
          const gpuLine = (value) => indexes.map((index, i) => ({
            name: 'GPU ' + index,
            colour: SERIES_COLOURS[i % (SERIES_COLOURS.length - 1)],
            points: samples.flatMap((s) => s.gpus.filter((g) => g.index === index).map((g) => [s.ms, value(g)]).filter((p) => p[1] != null)),
          }));
          if (indexes.length) {
            boxes.push(hourChart('GPU memory used', gpuLine((g) => (g.memory_total ? (g.memory_used / g.memory_total) * 100 : null)), 100, pct));
            boxes.push(hourChart('GPU utilisation', gpuLine((g) => g.utilization), 100, pct,
              'not reported (simulated GPUs have none)'));
          }
          const missing = history.servers_missing || [];
          charts.replaceChildren(h('h2', null, 'Last hour'),
            ...(missing.length ? [h('div', { class: 'alert' }, 'Missing the part heard by ' + missing.join(', ') + ' (did not answer).')] : []),
            h('div', { class: 'history-charts' }, boxes));
        }
      } catch (e) {
        charts.replaceChildren(h('div', { class: 'alert' }, e.message));
      }
      try {
        const installed = await api('GET', '/api/v1/workers/' + id + '/backends');
        backends.replaceChildren(h('h2', null, 'Installed backends'), installed.length
          ? h('div', { class: 'panel flush' }, h('table', { 'data-installed-backends': '' },
            h('thead', null, h('tr', null, h('th', null, 'Backend'), h('th', null, 'Version'), h('th', null, 'State'), h('th', null, 'Used by'))),
            h('tbody', null, installed.map((b) => h('tr', null,
              h('td', null, b.name), h('td', null, h('code', null, b.version)),
              h('td', null, h('span', { class: 'badge ' + ({ installed: 'ok', installing: 'info', failed: 'danger' })[b.state] }, b.state),
                b.state !== 'installed' ? h('div', { class: 'state-message' }, b.message) : h('span', { class: 'muted small' }, ' ' + b.message)),
              h('td', null, b.used_by && b.used_by.length ? b.used_by.join(', ') : h('span', { class: 'muted' }, '—')))))))
          : h('div', { class: 'panel empty' }, 'Nothing installed by gantry on this worker yet.'));
      } catch (e) {
        backends.replaceChildren(h('h2', null, 'Installed backends'), h('div', { class: 'panel' }, h('div', { class: 'alert' }, e.message)));
      }
    };
    load();
    const timer = setInterval(load, 10000);
    return combine(follow([live.workers], drawFacts), () => clearInterval(timer));
  }

  function editLabels(worker) {
    const text = h('textarea', { rows: 5, placeholder: 'gpu=a100\nzone=eu-1' }, formatLabels(worker.labels, '\n'));
    openDialog('Labels of ' + worker.name, [
      field('Labels', text, 'One key=value per line. Model worker selectors match these. Replaces every label.'),
    ], {
      submitLabel: 'Save labels',
      onSubmit: async () => {
        await api('PUT', '/api/v1/workers/' + worker.id + '/labels', { labels: parseLabels(text.value) });
        toast('Labels of ' + worker.name + ' saved.');
      },
    });
  }

  function deleteWorker(worker) {
    confirmDialog('Delete worker ' + worker.name + '?',
      'Its instances go back to pending to be placed elsewhere. A worker that is still running will fail to authenticate and must be registered again.',
      'Delete worker',
      async () => {
        await api('DELETE', '/api/v1/workers/' + worker.id);
        toast('Worker ' + worker.name + ' deleted.');
      });
  }

  // ---------------------------------------------------------------- model files

  /** How often the model files screen re-reads the list: it has no watch stream. */
  const MODEL_FILES_POLL_MS = 4000;

  const FILE_STATE_CLASS = { ready: 'ok', downloading: 'info', partial: 'warn', error: 'danger' };

  /** The last component of a path: what the file is called. */
  function baseName(path) {
    const parts = String(path).split('/');
    return parts[parts.length - 1] || String(path);
  }

  function renderModelFiles(main, parts, params) {
    const wanted = { worker: params.get('worker') || '' };
    const workerFilter = h('select', { 'aria-label': 'Worker' }, h('option', { value: '' }, 'all workers'));
    const updated = h('span', { class: 'muted small', 'data-updated': '' });
    const notice = h('div', { class: 'notices' });
    const tableBox = h('div', { 'data-cache': '' }, h('div', { class: 'panel empty' }, 'Loading…'));
    const uploads = uploadsSection();
    main.append(pageHead('Model files', h('div', { class: 'filters' }, updated, h('label', null, 'Worker', workerFilter))),
      h('p', { class: 'page-note muted small' },
        'What the workers’ model caches hold. A file that no instance uses can be deleted; it is downloaded again when a model needs it.'),
      notice, tableBox, uploads.element);

    let list = null;
    let error = null;
    let loadedAt = null;
    const draw = () => {
      // Keep the worker choices current without losing the selection.
      const workers = live.workers.values();
      const choices = workers.map((w) => [String(w.id), w.name]);
      if (wanted.worker && !choices.some(([id]) => id === wanted.worker)) choices.push([wanted.worker, 'worker ' + wanted.worker]);
      if (workerFilter.options.length !== choices.length + 1 || choices.some(([id], i) => workerFilter.options[i + 1].value !== id)) {
        workerFilter.replaceChildren(h('option', { value: '' }, 'all workers'), ...choices.map(([id, name]) => h('option', { value: id }, name)));
      }
      workerFilter.value = wanted.worker;

      if (!list) {
        notice.replaceChildren();
        tableBox.replaceChildren(error
          ? h('div', { class: 'panel' }, h('div', { class: 'alert' }, error.message))
          : h('div', { class: 'panel empty' }, 'Loading…'));
        return;
      }
      const files = list.items;
      const bytes = files.reduce((sum, f) => sum + f.bytes_done, 0);
      updated.textContent = files.length + (files.length === 1 ? ' file, ' : ' files, ') + fmtBytes(bytes) + ' on disk'
        + (loadedAt ? ' · updated ' + loadedAt.toLocaleTimeString() : '');

      // Keep the last answer on screen when a refresh fails, and say that it is stale.
      const notices = [];
      if (error) notices.push(h('div', { class: 'alert' }, 'Cannot refresh: ' + error.message));
      if (list.unreachable.length) {
        notices.push(h('div', { class: 'alert warn', 'data-unreachable': '' },
          h('strong', null, list.unreachable.length === 1
            ? 'A worker did not answer: its files are not listed.'
            : list.unreachable.length + ' workers did not answer: their files are not listed.'),
          h('ul', null, list.unreachable.map((u) =>
            h('li', { 'data-worker': u.worker_id }, h('strong', null, u.worker_name), ': ', u.error)))));
      }
      // The server asks only the workers it can reach; say which ones it left out.
      const lost = live.workers.values().filter((w) => w.state === 'unreachable' && (!wanted.worker || String(w.id) === wanted.worker));
      if (lost.length) {
        notices.push(h('div', { class: 'alert warn' }, 'Not asked, because they are unreachable: ',
          lost.map((w, i) => [i ? ', ' : '', h('strong', null, w.name)]), '.'));
      }
      notice.replaceChildren(...notices);

      if (!files.length) {
        let empty = 'No model files: a worker downloads a model’s files into its cache when an instance of the model starts there.';
        if (wanted.worker) {
          empty = list.unreachable.length ? 'The worker did not answer: its files cannot be listed now.' : 'No files in this worker’s cache.';
        } else if (list.unreachable.length) {
          empty = 'No files on the workers that answered.';
        }
        tableBox.replaceChildren(h('div', { class: 'panel empty' }, empty));
        return;
      }
      const rows = files.map((f) => {
        const names = f.names || [];
        const name = names.length ? baseName(names[0]) : f.blob;
        // The model directory the name is in, shown under it; every name on hover.
        const where = names.length ? names[0].slice(0, names[0].length - name.length).replace(/\/$/, '') : '';
        const title = names.concat(['blob ' + f.blob]).join('\n');
        // Of a download whose size the worker does not know, `size` is only what is on disk.
        const total = f.size > f.bytes_done ? f.size : null;
        const progress = f.state === 'downloading' || f.state === 'partial'
          ? progressBar(f.bytes_done, total, { paused: f.state === 'partial', label: 'Download of ' + name })
          : null;
        return h('tr', { 'data-file': f.id },
          h('td', { class: 'file-name' },
            h('strong', { class: 'mono', title, 'data-part': 'name' }, name),
            where ? h('div', { class: 'muted small mono', title }, where) : null,
            names.length > 1 ? h('div', { class: 'muted small', title }, '+ ' + (names.length - 1) + ' more name' + (names.length > 2 ? 's' : '')) : null),
          h('td', null, h('a', { href: '#/model-files?worker=' + f.worker_id }, f.worker_name)),
          h('td', { class: 'num' }, fmtBytes(f.size)),
          h('td', null, stateBadge(f.state, FILE_STATE_CLASS), progress,
            f.error ? h('div', { class: 'state-message' }, f.error) : null),
          h('td', null, f.models.length ? f.models.map((m) => h('span', { class: 'chip' }, m)) : h('span', { class: 'muted' }, '—')),
          h('td', null, f.last_used_at ? timeCell(f.last_used_at) : h('span', { class: 'muted' }, 'never')),
          h('td', { class: 'actions' }, h('button', {
            class: 'small danger',
            title: f.models.length ? 'Used by ' + f.models.join(', ') + ': the worker keeps it while they run' : null,
            onclick: () => deleteModelFile(f, name, load),
          }, 'Delete')));
      });
      tableBox.replaceChildren(h('div', { class: 'panel flush' }, h('table', null,
        h('thead', null, h('tr', null,
          h('th', null, 'File'), h('th', null, 'Worker'), h('th', { class: 'num' }, 'Size'), h('th', null, 'State'),
          h('th', null, 'Used by'), h('th', null, 'Last used'), h('th', null))),
        h('tbody', null, rows))));
    };

    let stopped = false;
    let timer = null;
    // Only the latest read draws and schedules the next: a delete reloads at once.
    let latest = 0;
    const load = async () => {
      clearTimeout(timer);
      const mine = ++latest;
      const query = wanted.worker ? '?worker_id=' + encodeURIComponent(wanted.worker) : '';
      try {
        const answer = await api('GET', '/api/v1/model-files' + query);
        if (stopped || mine !== latest) return;
        list = answer;
        error = null;
        loadedAt = new Date();
      } catch (e) {
        if (stopped || mine !== latest) return;
        error = e;
      }
      draw();
      timer = setTimeout(load, MODEL_FILES_POLL_MS);
    };
    workerFilter.addEventListener('change', () => {
      wanted.worker = workerFilter.value;
      history.replaceState(null, '', '#/model-files' + (wanted.worker ? '?worker=' + encodeURIComponent(wanted.worker) : ''));
      list = null;
      error = null;
      draw();
      load();
    });
    load();
    return combine(follow([live.workers], draw), uploads.cleanup, () => {
      stopped = true;
      clearTimeout(timer);
    });
  }

  function deleteModelFile(file, name, reload) {
    confirmDialog('Delete ' + name + ' from ' + file.worker_name + '?',
      'The file and its names go from the worker’s cache. A model that needs it again downloads it again. The worker refuses while an instance uses the file.',
      'Delete file',
      async () => {
        await api('DELETE', '/api/v1/model-files/' + file.worker_id + '/' + encodeURIComponent(file.blob));
        toast(name + ' deleted from ' + file.worker_name + '.');
        reload();
      });
  }

  // ---------------------------------------------------------------- uploads

  /**
   * Bytes sent per PATCH of an upload. A chunk that fails is sent again from the offset
   * the server reports, so a dropped connection costs at most this much twice; the
   * progress moves once per chunk.
   */
  const UPLOAD_CHUNK_BYTES = 8 << 20;

  /** Tries at one chunk before the transfer gives up and the upload waits for “Resume”. */
  const UPLOAD_CHUNK_TRIES = 4;

  const UPLOAD_STATE_CLASS = { uploading: 'info', ready: 'ok' };

  /**
   * The uploads this page is sending now, by upload id: `{upload, from, startedAt, speed,
   * controller}`, where `upload` is the server's latest answer. Leaving the model files
   * screen does not stop a transfer, so they live here and the screen listens to them.
   */
  const transfers = new Map();
  const transferListeners = new Set();

  function transfersChanged() {
    for (const listener of Array.from(transferListeners)) listener();
  }

  function stopTransfers() {
    for (const transfer of transfers.values()) transfer.controller.abort();
  }

  /** Refusals that may pass: the network, a conflict over the offset, a busy server. */
  function worthRetrying(error) {
    return error.status === 0 || error.status === 408 || error.status === 409 || error.status === 429 || error.status >= 500;
  }

  function sleep(ms) {
    return new Promise((resolve) => setTimeout(resolve, ms));
  }

  /**
   * Sends `file` into `upload` from its `bytes_received` on, a chunk per PATCH, until the
   * server answers that it is ready. Answers the ready upload, or null when the transfer
   * was stopped. A chunk that fails for a reason that may pass is sent again from the
   * offset GET reports; any other refusal (a wrong SHA-256, a deleted upload) is thrown,
   * and the upload waits for “Resume”.
   */
  async function sendUpload(upload, file) {
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

  /**
   * Runs a transfer and says how it ended: a toast when it is done or stopped, the error in
   * `alert` (or a toast, when its screen is gone).
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
   */
  function uploadsSection() {
    const tableBox = h('div', null, h('div', { class: 'panel empty' }, 'Loading…'));
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
        const file = chooser.files[0];
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

    let list = null;
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
          h('td', { class: 'num', 'data-part': 'size' }, fmtBytes(u.size)),
          h('td', null, stateBadge(u.state, UPLOAD_STATE_CLASS),
            u.state === 'uploading'
              ? progressBar(u.bytes_received, u.size, { paused: waiting, label: 'Upload of ' + u.name })
              : null,
            waiting ? h('div', { class: 'state-message' }, 'Not being sent from this page: “Resume” continues it.') : null),
          h('td', { 'data-part': 'sha256' }, u.sha256
            ? h('code', { class: 'small', title: u.sha256 + (u.state === 'ready' ? '' : '\nDeclared: checked when the last byte arrives') }, u.sha256.slice(0, 12) + '…')
            : h('span', { class: 'muted', title: 'Computed when the last byte arrives' }, '—')),
          h('td', null, timeCell(u.created_at)),
          h('td', { class: 'actions' },
            waiting ? h('button', { class: 'small', onclick: () => resumeUpload(u, error, load) }, 'Resume') : null,
            h('button', { class: 'small danger', onclick: () => deleteUpload(u, load) }, 'Delete')));
      });
      tableBox.replaceChildren(...notices, h('div', { class: 'panel flush' }, h('table', null,
        h('thead', null, h('tr', null,
          h('th', null, 'File'), h('th', { class: 'num' }, 'Size'), h('th', null, 'State'),
          h('th', null, 'SHA-256'), h('th', null, 'Created'), h('th', null))),
        h('tbody', null, rows))));
    };

    let stopped = false;
    let timer = null;
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
      timer = setTimeout(load, MODEL_FILES_POLL_MS);
    };
    load();
    transferListeners.add(draw);

    const element = h('section', { 'data-uploads': '' },
      h('h2', { class: 'section-head' }, 'Uploads'),
      h('p', { class: 'section-note muted small' },
        'Files uploaded to the servers, to deploy as a model’s source (“Uploaded file” in a new model). The workers download them from the servers.'),
      form, tableBox);
    return {
      element,
      cleanup: () => {
        stopped = true;
        clearTimeout(timer);
        transferListeners.delete(draw);
      },
    };
  }

  /** Asks for the file of an interrupted upload again, and continues it from where it stopped. */
  function resumeUpload(upload, alert, reload) {
    const chooser = h('input', { type: 'file', 'aria-label': 'File to upload', required: true });
    openDialog('Resume ' + upload.name, [
      h('p', null, 'Pick ', h('strong', { class: 'mono' }, upload.name), ' (' + fmtBytes(upload.size) + ') again: the upload continues from '
        + fmtBytes(upload.bytes_received) + ' of ' + fmtBytes(upload.size) + '.'),
      field('File', chooser),
    ], {
      submitLabel: 'Resume',
      onSubmit: async () => {
        const file = chooser.files[0];
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

  // ---------------------------------------------------------------- servers

  /** How often the servers screen re-reads the cluster: it has no watch stream. */
  const CLUSTER_POLL_MS = 5000;

  /** The leader first, then active servers, each group by id. */
  function serverOrder(a, b) {
    return (b.role === 'leader') - (a.role === 'leader')
      || Number(b.active) - Number(a.active)
      || a.server_id.localeCompare(b.server_id);
  }

  function fact(label, ...value) {
    return h('div', { class: 'fact' }, h('span', null, label), h('div', null, value));
  }

  /** Scheduling mode, leader, fencing token and totals, above the table. */
  function clusterFacts(cluster) {
    const leader = cluster.leader;
    // A local server holds no lease: its times are the epoch (or absent), so they are left out.
    const known = (iso) => Date.parse(iso) > 0;
    const since = leader.server_id && known(leader.acquired_at) ? fact('Leader since', timeCell(leader.acquired_at)) : null;
    const lease = cluster.scheduling_mode === 'distributed' && known(leader.expires_at)
      ? fact('Lease expires', timeCell(leader.expires_at))
      : null;
    return h('div', { class: 'panel facts', 'data-cluster': '' },
      fact('Scheduling mode', h('strong', { 'data-fact': 'scheduling-mode',
        title: 'local: one server schedules alone; distributed: servers sharing a PostgreSQL database elect a leader through a lease' }, cluster.scheduling_mode)),
      fact('Leader', leader.server_id
        ? h('strong', { class: 'mono', 'data-fact': 'leader' }, leader.server_id)
        : h('span', { class: 'badge warn', 'data-fact': 'leader', title: 'The lease is free: a server takes it over within a few seconds' }, 'none')),
      fact('Fencing token', h('strong', { class: 'mono', 'data-fact': 'fencing-token',
        title: 'Grows by one each time leadership changes hands; writes with an older token are refused' }, leader.fencing_token)),
      since,
      lease,
      fact('Active servers', h('strong', null, cluster.active_servers), h('span', { class: 'muted' }, ' of ' + cluster.servers.length)),
      fact('Registered workers', h('strong', null, cluster.total_workers)),
      fact('In-flight requests', h('strong', null, cluster.total_load)));
  }

  function renderServers(main) {
    const notice = h('div');
    const summaryBox = h('div');
    const tableBox = h('div', null, h('div', { class: 'panel empty' }, 'Loading…'));
    main.append(pageHead('Servers', h('span', { class: 'muted small' },
      'The leader runs the controllers; the others serve the API and the gateway and take over when it goes.')),
    notice, summaryBox, tableBox);

    let cluster = null;
    let error = null;
    const draw = () => {
      if (!cluster) {
        tableBox.replaceChildren(error
          ? h('div', { class: 'panel' }, h('div', { class: 'alert' }, error.message))
          : h('div', { class: 'panel empty' }, 'Loading…'));
        return;
      }
      // Keep the last answer on screen when a refresh fails, and say that it is stale.
      notice.replaceChildren(...(error ? [h('div', { class: 'alert' }, 'Cannot refresh: ' + error.message)] : []));
      summaryBox.replaceChildren(clusterFacts(cluster));
      if (!cluster.servers.length) {
        tableBox.replaceChildren(h('div', { class: 'panel empty' }, 'No server has registered yet.'));
        return;
      }
      const rows = cluster.servers.slice().sort(serverOrder).map((s) => {
        const leads = s.role === 'leader';
        return h('tr', { class: leads ? 'leader' : null, 'data-server': s.server_id },
          h('td', null, h('strong', { class: 'mono' }, s.server_id),
            s.version ? h('div', { class: 'muted small' }, 'gantry ' + s.version) : null),
          h('td', null, h('span', { class: 'mono small' }, s.url)),
          h('td', null, h('span', { class: 'badge ' + (leads ? 'leader' : 'idle'), 'data-role': s.role }, s.role)),
          h('td', null, s.active
            ? h('span', { class: 'badge ok' }, 'active')
            : h('span', { class: 'badge danger', title: 'Silent for longer than the server timeout: workers are not sent here' }, 'inactive')),
          h('td', null, timeCell(s.last_heartbeat_at)),
          h('td', null, timeCell(s.started_at)),
          h('td', { class: 'num' }, s.load.inflight_requests),
          h('td', { class: 'num' }, s.load.connected_workers),
          h('td', { class: 'num', title: 'Worker share × 0.4 + request share × 0.6 among the active servers; a connecting worker prefers the lowest' },
            Number(s.load_score).toFixed(2)));
      });
      tableBox.replaceChildren(h('div', { class: 'panel flush' }, h('table', null,
        h('thead', null, h('tr', null,
          h('th', null, 'Server'), h('th', null, 'URL'), h('th', null, 'Role'), h('th', null, 'State'),
          h('th', null, 'Last heartbeat'), h('th', null, 'Started'), h('th', { class: 'num' }, 'In-flight requests'),
          h('th', { class: 'num' }, 'Connected workers'), h('th', { class: 'num' }, 'Load score'))),
        h('tbody', null, rows))));
    };

    let stopped = false;
    let timer = null;
    const load = async () => {
      try {
        cluster = await api('GET', '/api/v1/coordinator/cluster');
        error = null;
      } catch (e) {
        error = e;
      }
      if (stopped) return;
      draw();
      timer = setTimeout(load, CLUSTER_POLL_MS);
    };
    load();
    return () => {
      stopped = true;
      clearTimeout(timer);
    };
  }

  // ---------------------------------------------------------------- API keys

  function renderApiKeys(main) {
    const tableBox = h('div', null, h('div', { class: 'panel empty' }, 'Loading…'));
    const created = h('div');
    let usernames = new Map();
    const load = async () => {
      try {
        const [keys, users] = await Promise.all([
          listAll('/api/v1/api-keys'),
          isAdmin() ? listAll('/api/v1/users').catch(() => []) : Promise.resolve([session.user]),
        ]);
        usernames = new Map(users.map((u) => [u.id, u.username]));
        drawKeys(keys);
      } catch (e) {
        tableBox.replaceChildren(h('div', { class: 'panel' }, h('div', { class: 'alert' }, e.message)));
      }
    };
    const drawKeys = (keys) => {
      if (!keys.length) {
        tableBox.replaceChildren(h('div', { class: 'panel empty' }, 'No API keys yet.'));
        return;
      }
      const rows = keys.map((k) => {
        const expired = k.expires_at && Date.parse(k.expires_at) < Date.now();
        return h('tr', null,
          h('td', null, h('strong', null, k.name), k.description ? h('div', { class: 'muted small' }, k.description) : null),
          h('td', null, h('code', null, 'gantry_' + k.access_key + '_…')),
          isAdmin() ? h('td', null, usernames.get(k.user_id) || 'user ' + k.user_id) : null,
          h('td', null, k.expires_at ? (expired ? h('span', { class: 'badge danger' }, 'expired') : timeCell(k.expires_at)) : h('span', { class: 'muted' }, 'never')),
          h('td', { 'data-part': 'limits' }, keyLimits(k)),
          h('td', null, k.last_used_at ? timeCell(k.last_used_at) : h('span', { class: 'muted' }, 'never')),
          h('td', null, timeCell(k.created_at)),
          h('td', { class: 'actions' },
            h('button', { class: 'small', onclick: () => editKey(k, served, load) }, 'Edit'),
            h('button', { class: 'small danger', onclick: () => deleteKey(k, load) }, 'Delete')));
      });
      tableBox.replaceChildren(h('div', { class: 'panel flush' }, h('table', { 'data-api-keys': '' },
        h('thead', null, h('tr', null, h('th', null, 'Name'), h('th', null, 'Key'), isAdmin() ? h('th', null, 'Owner') : null,
          h('th', null, 'Expires'), h('th', null, 'Limits'), h('th', null, 'Last used'), h('th', null, 'Created'), h('th', null))),
        h('tbody', null, rows))));
    };

    const name = h('input', { required: true, placeholder: 'laptop', maxlength: 63 });
    const description = h('input', { placeholder: 'optional' });
    const expires = h('input', { type: 'number', min: 1, max: 3650, placeholder: 'never' });
    // The names the gateway serves now, offered in the allowed-routes hints.
    const served = api('GET', '/v1/models').then((list) => list.data.map((m) => m.id).sort()).catch(() => []);
    const limits = keyLimitFields(null, served);
    const error = h('div', { class: 'alert', role: 'alert' });
    const submit = h('button', { class: 'primary', type: 'submit' }, 'Create key');
    const form = h('form', {
      class: 'panel',
      onsubmit: async (event) => {
        event.preventDefault();
        error.textContent = '';
        submit.disabled = true;
        const body = { name: name.value.trim(), description: description.value.trim() };
        if (expires.value) body.expires_in_days = Number(expires.value);
        for (const [key, value] of Object.entries(limits.value())) {
          if (value != null) body[key] = value;
        }
        try {
          const key = await api('POST', '/api/v1/api-keys', body);
          form.reset();
          showNewKey(created, key);
          load();
        } catch (e) {
          error.textContent = e.message;
        } finally {
          submit.disabled = false;
        }
      },
    },
    h('h2', null, 'New API key'),
    h('div', { class: 'form-grid' },
      field('Name', name, 'Unique among your keys.'),
      field('Description', description),
      field('Expires after (days)', expires, 'Empty: never expires.')),
    h('h3', { class: 'form-subhead' }, 'Limits at the gateway'),
    h('div', { class: 'form-grid' }, limits.fields),
    error,
    h('div', { class: 'form-actions' }, submit));

    main.append(pageHead('API keys', h('span', { class: 'muted small' },
      isAdmin() ? 'Every user’s keys. Use a key as Authorization: Bearer <key>.' : 'Your keys. Use one as Authorization: Bearer <key>.')),
    created, form, tableBox);
    load();
    return () => {};
  }

  function showNewKey(box, key) {
    const input = h('input', { readonly: true, value: key.key, 'aria-label': 'The new API key' });
    const copy = h('button', {
      class: 'primary',
      type: 'button',
      onclick: async () => {
        input.select();
        try {
          await navigator.clipboard.writeText(key.key);
        } catch (_) {
          // No clipboard API on plain http to another host: the selected text copies.
          document.execCommand('copy');
        }
        copy.textContent = 'Copied';
        setTimeout(() => (copy.textContent = 'Copy'), 2000);
      },
    }, 'Copy');
    box.replaceChildren(h('div', { class: 'panel' },
      h('h2', null, 'Key ' + key.name + ' created'),
      h('div', { class: 'alert info' }, 'Copy the key now: it is shown only this once and cannot be recovered.'),
      h('div', { class: 'secret' }, input, copy,
        h('button', { type: 'button', onclick: () => box.replaceChildren() }, 'Done'))));
    input.focus();
    input.select();
  }

  /** A key's gateway limits as chips; "none" when it has none. */
  function keyLimits(key) {
    const chips = [];
    if (key.allowed_routes != null) {
      const names = key.allowed_routes.join(', ');
      chips.push(h('span', { class: 'chip', title: 'May call only: ' + (names || 'nothing') },
        key.allowed_routes.length ? 'only ' + truncate(names, 40) : 'no routes'));
    }
    if (key.requests_per_minute != null) chips.push(h('span', { class: 'chip' }, fmtCount(key.requests_per_minute) + ' req/min'));
    if (key.tokens_per_minute != null) chips.push(h('span', { class: 'chip' }, fmtCount(key.tokens_per_minute) + ' tokens/min'));
    return chips.length ? chips : h('span', { class: 'muted' }, 'none');
  }

  /**
   * The limit fields of the new-key form and of the edit dialog, filled from `key` when
   * there is one. `value()` answers the three limits, null for "no limit".
   */
  function keyLimitFields(key, served) {
    const k = key || {};
    const routes = h('input', { placeholder: 'any', value: k.allowed_routes ? k.allowed_routes.join(', ') : '' });
    const requests = h('input', { type: 'number', min: 1, max: 1000000, step: 1, placeholder: 'no limit',
      value: k.requests_per_minute != null ? String(k.requests_per_minute) : '' });
    const tokens = h('input', { type: 'number', min: 1, max: 1000000000000, step: 1, placeholder: 'no limit',
      value: k.tokens_per_minute != null ? String(k.tokens_per_minute) : '' });
    const known = h('span');
    served.then((names) => {
      if (names.length) known.textContent = ' Served now: ' + truncate(names.join(', '), 80) + '.';
    });
    return {
      fields: [
        field('Allowed routes', routes, ['Route or model names, comma-separated; empty: any.', known]),
        field('Requests per minute', requests, 'Past it the gateway answers 429. Empty: no limit.'),
        field('Tokens per minute', tokens, 'Prompt and completion tokens. Empty: no limit.'),
      ],
      value: () => ({
        allowed_routes: routes.value.trim() ? parseList(routes.value) : null,
        requests_per_minute: requests.value ? Number(requests.value) : null,
        tokens_per_minute: tokens.value ? Number(tokens.value) : null,
      }),
    };
  }

  function editKey(key, served, reload) {
    const description = h('input', { placeholder: 'optional', value: key.description || '' });
    // Only admins change a key's limits: others set them when they create the key.
    const limits = isAdmin() ? keyLimitFields(key, served) : null;
    openDialog('Edit key ' + key.name, [
      field('Description', description),
      limits ? limits.fields : h('p', { class: 'muted small' }, 'Limits: ', keyLimits(key),
        h('br'), 'Only an admin can change them; a new key can have its own.'),
    ], {
      submitLabel: 'Save',
      onSubmit: async () => {
        const update = {};
        if (description.value.trim() !== (key.description || '')) update.description = description.value.trim();
        for (const [name, value] of Object.entries(limits ? limits.value() : {})) {
          if (!sameJson(value, key[name] == null ? null : key[name])) update[name] = value;
        }
        if (!Object.keys(update).length) return;
        await api('PATCH', '/api/v1/api-keys/' + key.id, update);
        toast('Key ' + key.name + ' updated.');
        reload();
      },
    });
  }

  function deleteKey(key, reload) {
    confirmDialog('Delete key ' + key.name + '?', 'Anything using this key is refused at once.', 'Delete key', async () => {
      await api('DELETE', '/api/v1/api-keys/' + key.id);
      toast('Key ' + key.name + ' deleted.');
      reload();
    });
  }

  // ---------------------------------------------------------------- users

  function renderUsers(main) {
    const tableBox = h('div', null, h('div', { class: 'panel empty' }, 'Loading…'));
    const load = async () => {
      try {
        drawUsers(await listAll('/api/v1/users'));
      } catch (e) {
        tableBox.replaceChildren(h('div', { class: 'panel' }, h('div', { class: 'alert' }, e.message)));
      }
    };
    const drawUsers = (users) => {
      const rows = users.map((u) => {
        const role = h('select', { 'aria-label': 'Role of ' + u.username, value: u.role },
          h('option', { value: 'user' }, 'user'), h('option', { value: 'admin' }, 'admin'));
        role.addEventListener('change', () => act(role, async () => {
          try {
            await api('PATCH', '/api/v1/users/' + u.id, { role: role.value });
          } catch (e) {
            role.value = u.role;
            throw e;
          }
          u.role = role.value;
        }, u.username + ' is now ' + role.value + '.'));
        const self = u.id === session.user.id;
        return h('tr', null,
          h('td', null, h('strong', null, u.username), self ? h('span', { class: 'muted' }, ' (you)') : null),
          h('td', null, u.full_name || h('span', { class: 'muted' }, '—')),
          h('td', null, role),
          h('td', null, u.require_password_change ? h('span', { class: 'badge warn' }, 'must change password') : h('span', { class: 'muted' }, '—')),
          h('td', null, timeCell(u.created_at)),
          h('td', { class: 'actions' },
            h('button', { class: 'small', onclick: () => resetPassword(u, load) }, 'Reset password'),
            h('button', { class: 'small danger', disabled: self, title: self ? 'You cannot delete yourself' : null, onclick: () => deleteUser(u, load) }, 'Delete')));
      });
      tableBox.replaceChildren(h('div', { class: 'panel flush' }, h('table', null,
        h('thead', null, h('tr', null, h('th', null, 'Username'), h('th', null, 'Full name'), h('th', null, 'Role'),
          h('th', null, 'Password'), h('th', null, 'Created'), h('th', null))),
        h('tbody', null, rows))));
    };

    const username = h('input', { required: true, placeholder: 'alice', maxlength: 63, autocomplete: 'off' });
    const fullName = h('input', { placeholder: 'optional' });
    const password = h('input', { type: 'password', required: true, minlength: 8, autocomplete: 'new-password' });
    const role = h('select', null, h('option', { value: 'user' }, 'user'), h('option', { value: 'admin' }, 'admin'));
    const mustChange = h('input', { type: 'checkbox', checked: true });
    const error = h('div', { class: 'alert', role: 'alert' });
    const submit = h('button', { class: 'primary', type: 'submit' }, 'Create user');
    const form = h('form', {
      class: 'panel hidden',
      onsubmit: async (event) => {
        event.preventDefault();
        error.textContent = '';
        submit.disabled = true;
        try {
          const user = await api('POST', '/api/v1/users', {
            username: username.value.trim(),
            password: password.value,
            full_name: fullName.value.trim(),
            role: role.value,
            require_password_change: mustChange.checked,
          });
          toast('User ' + user.username + ' created.');
          form.reset();
          form.classList.add('hidden');
          load();
        } catch (e) {
          error.textContent = e.message;
        } finally {
          submit.disabled = false;
        }
      },
    },
    h('h2', null, 'New user'),
    h('div', { class: 'form-grid' },
      field('Username', username, 'Lowercase letters, digits, “-”, “_”, “.”'),
      field('Full name', fullName),
      field('Password', password, 'At least 8 characters.'),
      field('Role', role),
      checkField('Must choose a new password at first login', mustChange)),
    error,
    h('div', { class: 'form-actions' }, submit,
      h('button', { type: 'button', onclick: () => { form.reset(); form.classList.add('hidden'); } }, 'Cancel')));

    main.append(pageHead('Users', h('button', {
      class: 'primary',
      onclick: () => {
        form.classList.toggle('hidden');
        username.focus();
      },
    }, 'New user')), form, tableBox);
    load();
    return () => {};
  }

  function resetPassword(user, reload) {
    const password = h('input', { type: 'password', required: true, minlength: 8, autocomplete: 'new-password' });
    const mustChange = h('input', { type: 'checkbox', checked: true });
    openDialog('Reset the password of ' + user.username, [
      field('New password', password, 'Their sessions end at once.'),
      checkField('Must choose a new password at next login', mustChange),
    ], {
      submitLabel: 'Reset password',
      onSubmit: async () => {
        await api('PATCH', '/api/v1/users/' + user.id, { password: password.value, require_password_change: mustChange.checked });
        toast('Password of ' + user.username + ' reset.');
        reload();
      },
    });
  }

  function deleteUser(user, reload) {
    confirmDialog('Delete user ' + user.username + '?', 'Their API keys are deleted too and stop working at once.', 'Delete user', async () => {
      await api('DELETE', '/api/v1/users/' + user.id);
      toast('User ' + user.username + ' deleted.');
      reload();
    });
  }

  // ---------------------------------------------------------------- account

  function renderAccount(main) {
    const { form } = passwordForm(false, null, () => {
      toast('Password changed. Your other sessions have ended.');
      form.reset();
    });
    form.className = 'panel';
    form.prepend(h('h2', null, 'Change password'));
    main.append(pageHead('Account'),
      h('div', { class: 'panel' },
        h('h2', null, session.user.username),
        h('div', null, 'Role: ', h('strong', null, session.user.role)),
        session.user.full_name ? h('div', null, 'Name: ', session.user.full_name) : null,
        h('div', { class: 'muted small' }, 'Account created ', fmtAgo(session.user.created_at), '.')),
      form,
      h('div', { class: 'panel muted small' }, 'The API is described at ', h('a', { href: '/docs' }, '/docs'),
        ' (OpenAPI: ', h('a', { href: '/api/openapi.json' }, '/api/openapi.json'), ').'));
    return () => {};
  }

  boot();
})();
