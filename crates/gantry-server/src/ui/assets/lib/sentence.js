// @ts-check
// An API refusal as a sentence about what the person did. The API names the field it
// refuses by its JSON path (`source.path: must be an absolute path`), which is right for a
// program and wrong for a person filling in a form: sentence() puts the form's own words
// for the field in its place, makes one sentence of the rest, and says what a failure to
// reach the server means. The API's code and message stay as they are on the error.

/**
 * The words a form uses for the fields it sends, by JSON path: a noun phrase that can
 * start a sentence ("The path").
 * @typedef {Record<string, string>} FieldWords
 */

/** Words that follow a field's name to make a sentence of it ("The path must be …"). */
const CONTINUES = /^(must|is|are|was|does|do|has|have|contains|names|cannot|can|may|needs|lies|holds|matches|should|would|exists)\b/;

/**
 * A field's JSON path in words when the form gave none: its last part, spaced
 * (`source.repo_id` → "The repo id").
 * @param {string} path
 * @returns {string}
 */
function fieldWords(path) {
  const last = path.split('.').pop() || path;
  return 'The ' + last.replace(/_/g, ' ');
}

/**
 * `text` as a sentence: a capital first letter and a full stop.
 * @param {string} text
 * @returns {string}
 */
function asSentence(text) {
  const trimmed = text.trim();
  if (!trimmed) return trimmed;
  const capital = trimmed[0].toUpperCase() + trimmed.slice(1);
  return /[.!?]$/.test(capital) ? capital : capital + '.';
}

/**
 * What to show a person for a failed call: the message with the field's JSON path
 * replaced by the form's words for it, as a sentence; a server that cannot be reached as
 * such.
 * @param {unknown} error an ApiError, or any Error
 * @param {FieldWords} [fields]
 * @returns {string}
 */
export function sentence(error, fields) {
  const e = /** @type {{code?: string, message?: string}} */ (error || {});
  if (e.code === 'network') {
    return 'The console cannot reach the gantry server: check that it is running and your connection, then try again.';
  }
  const message = String(e.message || error || 'Something went wrong.');
  const named = /^([a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*|\[\d+\])*): (.*)$/s.exec(message);
  if (!named) return asSentence(message);
  const [, path, rest] = named;
  const words = (fields && fields[path]) || fieldWords(path);
  // "The path /m/x.gguf does not exist", "The name must be …"; anything else after a colon.
  const joined = CONTINUES.test(rest) || rest.startsWith('/') ? words + ' ' + rest : words + ': ' + rest;
  return asSentence(joined);
}

/** What the model forms call the fields of a model. */
export const MODEL_FIELDS = {
  name: 'The name',
  description: 'The description',
  'source.path': 'The path',
  'source.repo_id': 'The repository',
  'source.file': 'The file',
  'source.revision': 'The revision',
  'source.url': 'The URL',
  'source.id': 'The uploaded file',
  'source.sha256': 'The SHA-256',
  backend: 'The backend',
  replicas: 'The number of replicas',
  backend_args: 'The backend arguments',
  worker_selector: 'The worker selector',
  custom_command: 'The command template',
  placement_strategy: 'The placement strategy',
  cluster_id: 'The cluster',
};

/** What the cluster forms call the fields of a cluster. */
export const CLUSTER_FIELDS = {
  name: 'The name',
  description: 'The description',
  provider: 'The provider',
  image: 'The image',
};

/** What the worker pool forms call the fields of a pool. */
export const POOL_FIELDS = {
  name: 'The name',
  provider: 'The provider',
  instance_type: 'The size or instance type',
  image: 'The image',
  region: 'The region',
  gpus: 'The GPUs per machine',
  memory: 'The memory per machine',
  labels: 'The labels',
  min: 'The minimum',
  max: 'The maximum',
  scale_down_after: 'The idle time',
  command: 'The command',
  api_url: 'The API URL',
  credentials: 'The credentials',
};
