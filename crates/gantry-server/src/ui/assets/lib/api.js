// @ts-check
// The API client: api() makes every call of the management API and answers its JSON or
// throws an ApiError; listAll() reads a paged list whole. It knows the session only as the
// cookie the browser sends: a call refused because the session ended (401) or must change
// its password (403 password_change_required) is reported to the handler app.js installs
// with onAuthFailure(), which shows the screen that resolves it.

/**
 * @typedef {object} CallOptions
 * @property {boolean} [auth] false: the caller handles a refused session itself
 * @property {AbortSignal} [signal] aborts the call
 * @property {Record<string, string>} [headers] added to the request's
 */

/** @type {(error: ApiError) => void} */
let authFailureHandler = () => {};

/**
 * Installs what a refused session leads to (app.js: the login or password screen).
 * @param {(error: ApiError) => void} handler
 */
export function onAuthFailure(handler) {
  authFailureHandler = handler;
}

/**
 * Routes an error to the auth-failure handler, which acts on 401 and on 403
 * password_change_required and ignores anything else.
 * @param {ApiError} error
 */
export function reportAuthFailure(error) {
  authFailureHandler(error);
}

/** A refusal of the API (its `error.code` and `error.message`), or a failure to reach it. */
export class ApiError extends Error {
  /**
   * @param {number} status the HTTP status; 0 when the server could not be reached
   * @param {string} code the API's error code (`not_found`), else `http_<status>` or `network`
   * @param {string} message
   */
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

/**
 * The ApiError a failed response stands for: the API's JSON error, or its status line.
 * @param {Response} response
 * @returns {Promise<ApiError>}
 */
export async function errorFrom(response) {
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
 * @param {'GET' | 'POST' | 'PUT' | 'PATCH' | 'DELETE'} method
 * @param {string} path
 * @param {unknown} [body]
 * @param {CallOptions} [options]
 * @returns {Promise<any>}
 */
export async function api(method, path, body, options) {
  const opts = options || {};
  /** @type {RequestInit & {headers: Record<string, string>}} */
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
    if (opts.auth !== false) reportAuthFailure(error);
    throw error;
  }
  if (response.status === 204) return null;
  const type = response.headers.get('content-type') || '';
  return type.includes('json') ? response.json() : response.text();
}

/**
 * Every item of a list, page by page.
 * @param {string} path
 * @returns {Promise<any[]>}
 */
export async function listAll(path) {
  /** @type {any[]} */
  const items = [];
  const sep = path.includes('?') ? '&' : '?';
  for (let page = 1; ; page++) {
    const body = await api('GET', path + sep + 'per_page=1000&page=' + page);
    items.push(...body.items);
    if (body.items.length < 1000 || items.length >= body.pagination.total) return items;
  }
}

/**
 * The items of a list answer: a plain array, or a page's `items`.
 * @param {any} body
 * @returns {any[]}
 */
export function itemsOf(body) {
  return Array.isArray(body) ? body : (body && body.items) || [];
}
