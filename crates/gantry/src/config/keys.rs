//! The table of configuration keys: the one place a key is declared. Each entry gives
//! the key's doc (shown in `--help` and the docs), its name (the YAML key, the flag
//! `--key-name`, the variable `GANTRY_KEY_NAME` and the field of [`Config`]), its kind
//! (how its value is read and written, `kinds.rs`), its default, and optionally how the
//! default is described when it depends on the machine or the command (`shown`) and
//! other spellings of its flag (`also`). Keys are grouped by the commands that read them:
//! `global` (every command), `server` (`gantry server`, `gantry start`) and `worker`
//! (`gantry worker`, `gantry start`).
//!
//! Defaults that a library crate also uses are that crate's constants, never a second
//! literal.

use std::net::Ipv4Addr;
use std::path::PathBuf;

use gantry_backends::{llama_cpp, sglang, vllm};
use gantry_server::config as server;
use gantry_worker::supervisor;

use super::kinds::{
    BodyLimit, Bool, Count, DatabaseUrl, Dir, Dirs, Duration, IpAddr, Kind, Labels, LogFilter,
    LogFormat, Optional, Port, PortRange, Scheduling, SchedulingMode, ServerId, SimulatedGpus,
    Size, Text, Urls, WorkerName,
};
use super::{DefaultText, Key, Layers, Scope};

config_table! {
    global {
        /// Where gantry keeps its database, secrets and bootstrap files.
        data_dir: Dir = default_data_dir(),
            shown format!("`~/{USER_DATA_DIR}` (`{ROOT_DATA_DIR}` as root)");
        /// Log filter: a level, or target=level pairs such as `gantry_server=debug,info`.
        log_level: LogFilter = "info".to_owned();
        /// Log line format: `text` or `json`.
        log_format: LogFormat = LogFormat::Text;
        /// Interval of worker heartbeats; servers expect it too.
        heartbeat_interval: Duration = server::DEFAULT_HEARTBEAT_INTERVAL;
        /// Every server's URL, comma-separated or repeated; a worker joins them and fails
        /// over between them.
        server_urls: Urls = Vec::new(), also "server-url";
        /// How long a stop may take. A worker's serving backend first finishes its requests in progress (a custom command: until no connection is open to it) for up to half of it, then gets SIGTERM, then SIGKILL when the time is up; a server finishes its gateway requests in flight for up to all of it.
        stop_grace_period: Duration = supervisor::DEFAULT_STOP_GRACE_PERIOD;
        /// The Hugging Face Hub (or a mirror speaking its API) that `huggingface` model
        /// sources come from.
        hf_endpoint: Text = default_hf_endpoint(),
            shown format!("`$HF_ENDPOINT`, else `{}`", gantry_source::DEFAULT_HF_ENDPOINT);
        /// Token for gated and private Hugging Face repositories; a secret, never logged.
        hf_token: Optional<Text> = std::env::var("HF_TOKEN").ok().filter(|t| !t.is_empty()),
            shown "`$HF_TOKEN`, else none";
        /// The ModelScope hub that `modelscope` model sources come from.
        modelscope_endpoint: Text = gantry_source::DEFAULT_MODELSCOPE_ENDPOINT.to_owned();
        /// Endpoint of the S3-compatible store that `s3` model sources come from
        /// (path-style addressing).
        s3_endpoint: Optional<Text> = None, shown "AWS S3 of `s3_region`";
        /// Region of the S3 store.
        s3_region: Text = gantry_source::DEFAULT_S3_REGION.to_owned();
        /// Access key of the S3 store.
        s3_access_key: Optional<Text> = None, shown "none (anonymous requests)";
        /// Secret key of the S3 store; a secret, never logged.
        s3_secret_key: Optional<Text> = None;
        /// PEM certificate chain (the certificate first) to serve HTTPS with: a server on
        /// `port`, a worker on its own API (`worker_port`; `gantry start`'s worker listens
        /// on loopback only and stays plain); needs `tls_key_file`.
        tls_cert_file: Optional<Text> = None, shown "none (plain HTTP)";
        /// PEM private key of `tls_cert_file`.
        tls_key_file: Optional<Text> = None;
    }
    server {
        /// Address the server listens on.
        host: Text = server::DEFAULT_HOST.to_owned();
        /// Port of the management API, the web console and the OpenAI-compatible gateway.
        port: Port = server::DEFAULT_PORT;
        /// `postgres://…` to share state between several servers, or `sqlite:…`.
        database_url: Optional<DatabaseUrl> = None, shown "SQLite file in `data_dir`";
        /// Signs session tokens; required with PostgreSQL (every server needs the same).
        jwt_secret: Optional<Text> = None, shown "generated into `data_dir`";
        /// Password of the first admin.
        bootstrap_password: Optional<Text> = None,
            shown "generated into `<data_dir>/initial_admin_password`";
        /// This server's name in logs and the server registry; unique among the servers
        /// sharing a database.
        server_id: ServerId = default_server_id(), shown "the hostname";
        /// The URL other servers, workers and the console use to reach this server.
        advertise_url: Optional<Text> = None,
            shown "`http://<host>:<port>` (the hostname when `host` is `0.0.0.0`)";
        /// PEM certificates to trust for workers whose own API serves HTTPS, besides the
        /// system's roots: a private CA's, or a worker's self-signed certificate.
        worker_ca_file: Optional<Text> = None;
        /// How scheduling is shared between servers: `local` (this server alone; refused
        /// on PostgreSQL while another server is active), `distributed` (a leader elected
        /// through PostgreSQL runs the controllers) or `auto` (distributed on PostgreSQL,
        /// local on SQLite).
        scheduling_mode: Scheduling = SchedulingMode::Auto;
        /// Silence after which a server or worker counts as gone.
        server_timeout: Duration = server::DEFAULT_SERVER_TIMEOUT;
        /// How long the leader lease holds without renewal; a leader that cannot renew
        /// within it steps down, and a standby takes over.
        lease_ttl: Duration = server::DEFAULT_LEASE_TTL;
        /// How often the leader renews its lease (at most half of `lease_ttl`).
        lease_renew_interval: Duration = server::DEFAULT_LEASE_RENEW_INTERVAL;
        /// Default timeout of distributed locks (`/api/v1/coordinator/locks`).
        lock_timeout: Duration = server::DEFAULT_LOCK_TIMEOUT;
        /// In distributed mode, let every server place pending instances under the
        /// scheduling lock (`false`: only the leader places).
        distributed_scheduling: Bool = server::DEFAULT_DISTRIBUTED_SCHEDULING;
        /// Timeout of the scheduling lock a server holds while it places.
        schedule_lock_timeout: Duration = server::DEFAULT_SCHEDULE_LOCK_TIMEOUT;
        /// Largest management-API request body.
        max_request_body: BodyLimit = server::DEFAULT_MAX_REQUEST_BODY;
        /// Largest request body of the OpenAI-compatible gateway (`/v1/*`).
        gateway_max_request_body: BodyLimit = server::DEFAULT_GATEWAY_MAX_REQUEST_BODY;
        /// Failures in a row (connection errors, 5xx answers, first-byte timeouts) after
        /// which the gateway stops routing to an instance while its model has another.
        gateway_eject_after: Count = server::DEFAULT_GATEWAY_EJECT_AFTER;
        /// How long an instance ejected by the gateway stays out of routing; each
        /// further ejection without a success between doubles it, up to 5 minutes.
        gateway_eject_cooldown: Duration = server::DEFAULT_GATEWAY_EJECT_COOLDOWN;
        /// How long the gateway waits for an instance's response head before it counts
        /// the try as failed and sends the request to another instance (504 when none
        /// is left); long prompts take long to answer, so only set it above them.
        gateway_first_byte_timeout: Optional<Duration> = None, shown "none (no limit)";
        /// How long an API key the server verified is used without reading the database
        /// again (a key deleted through another server stops working here within this
        /// long, should the change notification be lost). While the database cannot be
        /// reached, keys verified before keep working regardless.
        api_key_cache_ttl: Duration = server::DEFAULT_API_KEY_CACHE_TTL;
        /// How long the gateway's usage is kept per minute; whole days older than this
        /// are rolled up into one row per day, user, API key and model (charts over
        /// them show days).
        usage_retention: Duration = server::DEFAULT_USAGE_RETENTION;
        /// A YAML file of model catalog entries served at `GET /api/v1/model-catalog`
        /// (and in the console's catalog) instead of the built-in one.
        model_catalog_file: Optional<Text> = None, shown "the built-in catalog";
        /// Largest file `POST /api/v1/model-files/uploads` accepts.
        upload_max_size: Size = server::DEFAULT_UPLOAD_MAX_SIZE;
        /// Bucket of the `s3_*` store that complete uploads are moved to, so that every
        /// server (and worker) reaches them; unset keeps them on the disk of the server
        /// they reached.
        s3_upload_bucket: Optional<Text> = None, shown "none (`<data_dir>/uploads`)";
        /// How often the leader looks at the worker pools: machines to create, to see
        /// registered or to delete, and what pending replicas need.
        pool_interval: Duration = server::DEFAULT_POOL_INTERVAL;
        /// Ports the machines of `local` worker pools give their backends, ten each.
        local_pool_port_range: PortRange = 42000..=42999;
        /// Where the programs of `exec` worker pools are: a pool's command names one of
        /// them, so the API cannot run arbitrary commands on a server. Put the same
        /// programs on every server.
        pool_commands_dir: Optional<Text> = None, shown "`<data_dir>/pool-commands`";
    }
    worker {
        /// Registration token, from the server's `<data_dir>/registration_token`; needed
        /// for the first registration only.
        token: Optional<Text> = None,
            shown "none (`gantry start` reads its server's token file)";
        /// PEM certificates a worker trusts for `https://` servers besides the system's
        /// roots: a private CA's, or a self-signed server certificate.
        server_ca_file: Optional<Text> = None,
            shown "none (`gantry start`: its `tls_cert_file`)";
        /// This worker's name, unique in the cluster.
        worker_name: WorkerName = default_worker_name(), shown "the hostname", also "name";
        /// Labels `k=v`, comma-separated or repeated.
        labels: Labels = Default::default(), also "label";
        /// Declare simulated GPUs instead of detecting real ones, such as `4x80GiB`.
        simulate_gpus: Optional<SimulatedGpus> = None,
            shown "none: real GPUs, found through NVML";
        /// Address of the worker's own API (`gantry start` keeps it on loopback).
        worker_host: Text = Ipv4Addr::UNSPECIFIED.to_string();
        /// Port of the worker's own API (`gantry start` picks a free one).
        worker_port: Port = 10150;
        /// Host name or IP through which servers reach this worker and its backends.
        advertise_host: Optional<Text> = None,
            shown format!("the hostname (`{}` for `gantry start`)", Ipv4Addr::LOCALHOST);
        /// Address backends listen on.
        backend_host: Optional<IpAddr> = None, shown format!(
            "`{}` (`{}` for `gantry start`)",
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::LOCALHOST
        );
        /// Ports for backend processes.
        port_range: PortRange = supervisor::DEFAULT_PORT_RANGE;
        /// The llama.cpp server: a path, or a name looked up on `PATH`.
        llama_server_path: Text = llama_cpp::PROGRAM.to_owned();
        /// The vLLM program: a path, or a name looked up on `PATH`.
        vllm_path: Text = vllm::PROGRAM.to_owned();
        /// The Python that has SGLang installed: a path, or a name looked up on `PATH`.
        sglang_python: Text = sglang::PYTHON.to_owned();
        /// The only directories whose files `local_path` models may name (symlinks are
        /// resolved before the check), comma-separated or repeated.
        model_dirs: Dirs = Vec::new(), shown "`<data_dir>/models`";
        /// Largest size of the model cache (`<data_dir>/worker/model-cache`): before a
        /// download, the least recently used files no instance uses are evicted to stay
        /// under it.
        model_cache_max: Optional<Size> = None, shown "no limit (free space is checked)";
        /// Connections one model file is downloaded over, each fetching a range of it
        /// (files of 64 MiB and more; servers that ignore ranges get one); 1 turns it off.
        download_connections: Count = gantry_source::parallel::DEFAULT_CONNECTIONS;
        /// How long a backend may take to become healthy.
        backend_ready_timeout: Duration = gantry_backends::DEFAULT_READINESS_DEADLINE;
        /// Install missing backends on demand (llama.cpp built from source, vLLM and
        /// SGLang in virtual environments) under `<data_dir>/worker/backends`; off runs
        /// only the programs configured or found on `PATH`.
        install_backends: Bool = true;
        /// Machine-wide cache of backend downloads and builds (llama.cpp sources and
        /// binaries, pip's cache), shared by every worker on the machine.
        backend_cache_dir: Optional<Text> = None,
            shown "`$GANTRY_CACHE_DIR`, else `~/.cache/gantry`";
        /// Time between health probes of a running backend.
        health_interval: Duration = gantry_worker::supervisor::HealthPolicy::default().interval;
        /// How long one health probe may take.
        health_timeout: Duration = gantry_worker::supervisor::HealthPolicy::default().timeout;
        /// Failed health probes in a row after which a running backend is reported
        /// unhealthy, taken out of routing and restarted.
        health_failure_threshold: Count =
            gantry_worker::supervisor::HealthPolicy::default().failure_threshold as usize;
    }
}

/// `HF_ENDPOINT`, as the hub's own client reads it, else the public hub.
fn default_hf_endpoint() -> String {
    std::env::var("HF_ENDPOINT")
        .ok()
        .filter(|e| !e.is_empty())
        .unwrap_or_else(|| gantry_source::DEFAULT_HF_ENDPOINT.to_owned())
}

/// Where root keeps gantry's state.
const ROOT_DATA_DIR: &str = "/var/lib/gantry";
/// Where everyone else keeps it, under their home directory.
const USER_DATA_DIR: &str = ".local/share/gantry";

/// [`ROOT_DATA_DIR`] for root, [`USER_DATA_DIR`] in the home directory for everyone
/// else (`.gantry` in the working directory without a home).
fn default_data_dir() -> PathBuf {
    if nix::unistd::geteuid().is_root() {
        return PathBuf::from(ROOT_DATA_DIR);
    }
    match std::env::var_os("HOME") {
        Some(home) => PathBuf::from(home).join(USER_DATA_DIR),
        None => PathBuf::from(".gantry"),
    }
}

/// The hostname, or the server crate's name for hosts without one.
fn default_server_id() -> String {
    std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| server::DEFAULT_SERVER_ID.to_owned())
}

/// The hostname made into a valid worker name.
fn default_worker_name() -> String {
    let host = default_server_id().to_lowercase();
    let cleaned: String = host
        .chars()
        .map(|c| {
            if c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '-'
            }
        })
        .take(63)
        .collect();
    let cleaned = cleaned.trim_start_matches(['-', '_', '.']).to_owned();
    if cleaned.is_empty() {
        "worker".to_owned()
    } else {
        cleaned
    }
}
