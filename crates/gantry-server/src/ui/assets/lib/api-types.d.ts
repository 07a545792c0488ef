// The shapes of the API's answers that the console reads through its typed state (the
// session's user and the lists it follows live), as gantry-types serialises them. Only the
// type checker reads this file (scripts/check-console.sh); the server does not serve it.
// A field the console reads must be declared here, so a misspelt one fails the check;
// answers read once by a screen stay untyped (`any`).

/** An RFC 3339 time, as every `*_at` field is sent. */
export type Timestamp = string;

/** `GET /auth/me`, and the `user` of a login. */
export interface User {
  id: number;
  username: string;
  role: 'admin' | 'user';
  full_name: string;
  require_password_change: boolean;
  /** The clusters the user administers without being an admin. */
  cluster_admin_of: number[];
  created_at: Timestamp;
  updated_at: Timestamp;
}

/** Where a model's files come from (`type` tells which). */
export type ModelSource =
  | { type: 'local_path'; path: string }
  | { type: 'huggingface' | 'modelscope'; repo_id: string; file?: string; revision?: string }
  | { type: 's3'; bucket: string; key: string }
  | { type: 'url'; url: string | string[]; sha256?: string | string[] }
  | { type: 'upload'; id: number };

/** `GET /api/v1/models`. */
export interface Model {
  id: number;
  name: string;
  /** The cluster it is deployed into; its instances run on that cluster's workers. */
  cluster_id: number;
  description: string;
  source: ModelSource;
  backend: string;
  backend_version: string | null;
  backend_args: string[];
  replicas: number;
  worker_selector: Record<string, string>;
  placement_strategy: 'spread' | 'binpack';
  cpu_offload: boolean;
  custom_command: string | null;
  labels: Record<string, string>;
  created_at: Timestamp;
  updated_at: Timestamp;
}

/** How far a worker is with downloading an instance's model files. */
export interface DownloadProgress {
  bytes_done: number;
  /** null while a size is unknown. */
  bytes_total: number | null;
  bytes_per_second: number;
}

/** What the scheduler booked for an instance: the bytes on each GPU. */
export interface PlacementRecord {
  reservation: {
    placement: { gpus: { index: number; bytes: number }[]; ram_bytes: number };
  } | null;
}

/** An instance's lifecycle (`InstanceState` in gantry-types). */
export type InstanceState =
  | 'pending' | 'analyzing' | 'scheduled' | 'installing' | 'downloading'
  | 'starting' | 'running' | 'unhealthy' | 'error' | 'unreachable';

/** `GET /api/v1/model-instances`. */
export interface Instance {
  id: number;
  name: string;
  model_id: number;
  model_name: string;
  /** Its model's cluster. */
  cluster_id: number;
  worker_id: number | null;
  worker_name: string | null;
  gpu_indexes: number[];
  address: string | null;
  state: InstanceState;
  state_message: string;
  placement: PlacementRecord | null;
  download: DownloadProgress | null;
  restart_count: number;
  created_at: Timestamp;
  updated_at: Timestamp;
}

/** One GPU as its worker reports it. */
export interface GpuDevice {
  index: number;
  name: string;
  uuid: string;
  memory_total: number;
  memory_used: number;
  utilization: number | null;
  temperature: number | null;
  simulated: boolean;
}

/** Host facts reported by a worker. */
export interface SystemInfo {
  cpu_count: number;
  load_average: number;
  memory_total: number;
  memory_available: number;
  disk_free: number;
}

/** What a worker reports about itself. */
export interface WorkerStatus {
  gpus: GpuDevice[];
  system: SystemInfo;
  /** Every backend it runs: found, installed, or installed on first use. */
  backends: string[];
  installed_backends?: { name: string; version: string; variant: string }[];
  /** Those whose programs it found (configured or on PATH); absent from older workers. */
  found_backends?: { name: string; program: string }[];
}

/** `GET /api/v1/workers/join`: how a machine joins as a worker. */
export interface WorkerJoin {
  server_urls: string[];
  /** null when the server that answered does not hold the token. */
  token: string | null;
  command: string | null;
}

/** `GET /api/v1/workers`. */
export interface Worker {
  id: number;
  name: string;
  /** The cluster whose registration token it joined with. */
  cluster_id: number;
  state: 'ready' | 'not_ready' | 'unreachable' | 'maintenance';
  state_message: string;
  labels: Record<string, string>;
  address: string;
  status: WorkerStatus;
  last_heartbeat_at: Timestamp | null;
  created_at: Timestamp;
  updated_at: Timestamp;
}

/** `GET /api/v1/clusters`: a set of workers with its own registration token. */
export interface Cluster {
  id: number;
  name: string;
  description: string;
  provider: 'custom' | 'kubernetes';
  /** Models that name no cluster go there; it cannot be deleted. */
  is_default: boolean;
  state: 'pending' | 'provisioning' | 'ready';
  state_message: string;
  counts: { workers: number; ready_workers: number; gpus: number; models: number; machines_on_the_way: number };
  created_at: Timestamp;
  updated_at: Timestamp;
}

/** Where a worker pool's machines come from. */
export type PoolProvider = 'digitalocean' | 'exec' | 'local';

/** One machine of a worker pool, before and after its worker registers. */
export interface PoolMachine {
  id: number;
  pool_id: number;
  /** `<pool>-<n>`: its name at the provider and its worker's. */
  name: string;
  state: 'provisioning' | 'initializing' | 'registered' | 'deleting';
  /** What the provider or the leader last said of it (a failure, with its words). */
  state_message: string;
  external_id: string | null;
  address: string | null;
  worker_id: number | null;
  worker_state: Worker['state'] | null;
  /** Since when its worker has hosted no instance; null while it hosts some. */
  idle_since: Timestamp | null;
  created_at: Timestamp;
  updated_at: Timestamp;
}

/** `GET /api/v1/clusters/{id}/worker-pools`: machines a cluster makes and deletes. */
export interface WorkerPool {
  id: number;
  cluster_id: number;
  name: string;
  provider: PoolProvider;
  instance_type: string;
  image: string;
  region: string;
  /** What each machine has, `8x80GiB` style. */
  gpus: string;
  memory: string | null;
  labels: Record<string, string>;
  min: number;
  max: number;
  /** How long a machine may host nothing before it is deleted, such as `10m`. */
  scale_down_after: string;
  command: string | null;
  api_url: string | null;
  /** The credentials themselves are write-only. */
  has_credentials: boolean;
  /** Deleted: its machines are being deleted, then the pool goes. */
  deleting: boolean;
  machines: PoolMachine[];
  created_at: Timestamp;
  updated_at: Timestamp;
}

/** `GET /api/v1/clusters/{id}/worker-pools/{pool}/events`: one decision, with its reason. */
export interface PoolEvent {
  id: number;
  pool_id: number;
  at: Timestamp;
  kind: string;
  message: string;
}

/** `GET /api/v1/clusters/{id}/registration-token`: how a machine joins a cluster. */
export interface ClusterRegistration {
  cluster_id: number;
  cluster_name: string;
  token: string;
  server_urls: string[];
  command: string;
  /** For a `kubernetes` cluster: the YAML that joins its GPU nodes. */
  kubernetes_manifests?: string;
}

/** `GET /api/v1/model-files/uploads`: a file uploaded to the servers in chunks. */
export interface Upload {
  id: number;
  name: string;
  size: number;
  /** Where the next PATCH starts. */
  bytes_received: number;
  state: 'uploading' | 'ready';
  /** Absent until declared or computed. */
  sha256?: string;
  location: string;
  created_at: Timestamp;
}

/** A page of a list: `GET /api/v1/<things>?page=&per_page=`. */
export interface Page<T> {
  items: T[];
  pagination: { total: number };
}

/** `POST /api/v1/models/estimate`: what one instance needs, and where it would fit. */
export interface Estimate {
  context_size: number | null;
  parts: {
    weights_bytes: number;
    kv_cache_bytes: number;
    per_gpu_compute_buffer_bytes: number;
    per_gpu_overhead_bytes: number;
    host_compute_buffer_bytes: number;
    base_ram_bytes: number;
    declared_gpu_count: number | null;
  };
  /** The model's replicas, placed one after another on the cluster as it is now. */
  replicas: {
    fits: boolean;
    placement: { worker_name: string; gpus: { index: number; bytes: number }[]; ram_bytes: number } | null;
    reason: string | null;
  }[];
  workers: {
    worker_name: string;
    simulated_gpus: boolean;
    fits: boolean;
    placement: { gpus: { index: number; bytes: number }[]; ram_bytes: number } | null;
    reason: string | null;
  }[];
}

/** `GET /api/v1/model-catalog`: a well-known model, ready to deploy. */
export interface CatalogEntry {
  name: string;
  title: string;
  description: string;
  tags: string[];
  parameters: string;
  size: string;
  source: ModelSource;
  backend: string;
  backend_args: string[];
}

/** `GET /api/v1/model-providers`: an external OpenAI-compatible endpoint. */
export interface Provider {
  name: string;
  description: string;
  base_url: string;
  has_api_key: boolean;
  headers: Record<string, string>;
  timeout_seconds: number;
  models: string[];
  updated_at: Timestamp;
}

/** One target of a route: a deployed model (no `provider`) or a provider's model. */
export interface RouteTarget {
  model: string;
  provider?: string | null;
  weight: number;
  priority: number;
}

/** `GET /api/v1/model-routes`: a name clients call, served by its targets. */
export interface Route {
  name: string;
  description: string;
  targets: RouteTarget[];
  updated_at: Timestamp;
}

/** Requests and tokens, as every usage figure counts them. */
export interface UsageTotals {
  requests: number;
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
}

/** `GET /api/v1/usage`: the totals of a window, and its buckets when asked for. */
export interface UsageReport {
  total: UsageTotals;
  /** What each route's targets served (`target`: the model, or provider/model). */
  targets: (UsageTotals & { model: string; target: string })[];
  series: (UsageTotals & { start: Timestamp; user_id: number; api_key_id: number | null; model: string })[] | null;
}

/** `GET /api/v1/api-keys`: a key (never its secret) with its gateway limits. */
export interface ApiKey {
  id: number;
  name: string;
  user_id: number;
  access_key: string;
  description: string;
  expires_at: Timestamp | null;
  last_used_at: Timestamp | null;
  created_at: Timestamp;
  allowed_routes: string[] | null;
  requests_per_minute: number | null;
  tokens_per_minute: number | null;
}

/** `POST /api/v1/api-keys`: the new key, with its secret shown this once. */
export interface ApiKeyCreated extends ApiKey {
  key: string;
}

/** A server of the cluster, as `GET /api/v1/coordinator/cluster` lists it. */
export interface ServerInfo {
  server_id: string;
  url: string;
  version: string;
  role: 'leader' | 'standby';
  started_at: Timestamp;
  last_heartbeat_at: Timestamp;
  active: boolean;
  load: { inflight_requests: number; connected_workers: number };
  load_score: number;
}

/** `GET /api/v1/coordinator/cluster`. */
export interface ClusterStatus {
  scheduling_mode: string;
  servers: ServerInfo[];
  active_servers: number;
  leader: { server_id: string | null; fencing_token: number; acquired_at: Timestamp; expires_at: Timestamp };
  total_workers: number;
  total_load: number;
}

/** `GET /api/v1/workers/{id}/history`: the last hour of how busy a worker was. */
export interface WorkerHistory {
  samples: {
    at: Timestamp;
    cpu_percent?: number;
    memory_used: number;
    memory_total: number;
    gpus: { index: number; memory_used: number; memory_total: number; utilization?: number }[];
  }[];
  servers_missing?: string[];
}

/** `GET /api/v1/workers/{id}/backends`: a backend version gantry installed on a worker. */
export interface InstalledBackendStatus {
  name: string;
  version: string;
  state: 'installed' | 'installing' | 'failed';
  message: string;
  used_by?: string[];
}

/** A file of a worker's model cache (`GET /api/v1/model-files`). */
export interface ModelFile {
  /** `<worker id>/<blob>`. */
  id: string;
  worker_id: number;
  worker_name: string;
  blob: string;
  names: string[];
  state: 'ready' | 'downloading' | 'partial' | 'error';
  size: number;
  bytes_done: number;
  error: string | null;
  models: string[];
  last_used_at: Timestamp | null;
}

/** `GET /api/v1/model-files`: the files, and the workers that did not answer. */
export interface ModelFileList {
  items: ModelFile[];
  unreachable: { worker_id: number; worker_name: string; error: string }[];
}
