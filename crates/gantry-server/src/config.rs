//! The server's resolved configuration. The CLI reads flags, `GANTRY_*` variables and
//! the YAML file and hands the result here; nothing in this crate reads the
//! environment.

use std::path::PathBuf;
use std::time::Duration;

/// Every interface.
pub const DEFAULT_HOST: &str = "0.0.0.0";
/// The API, the web console and the gateway share this port.
pub const DEFAULT_PORT: u16 = 8080;
/// The server's name when the host has none to lend it.
pub const DEFAULT_SERVER_ID: &str = "gantry-server";
/// Management requests are small; 1 MiB leaves room for long model arguments.
pub const DEFAULT_MAX_REQUEST_BODY: usize = 1024 * 1024;
/// Prompts and embedding inputs are far larger than management requests.
pub const DEFAULT_GATEWAY_MAX_REQUEST_BODY: usize = 32 * 1024 * 1024;
/// Failures in a row that take an instance out of the gateway's routing.
pub const DEFAULT_GATEWAY_EJECT_AFTER: usize = gantry_gateway::DEFAULT_EJECT_AFTER;
/// How long a first ejection lasts (each further one in a row doubles it).
pub const DEFAULT_API_KEY_CACHE_TTL: Duration = gantry_auth::cache::CacheConfig::DEFAULT_FRESH_FOR;
pub const DEFAULT_GATEWAY_EJECT_COOLDOWN: Duration = gantry_gateway::DEFAULT_EJECT_COOLDOWN;
/// How often workers say they are alive.
pub const DEFAULT_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(15);
/// Four missed heartbeats at the default interval.
pub const DEFAULT_SERVER_TIMEOUT: Duration = Duration::from_secs(60);
/// Distributed locks taken through the coordinator API.
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(30);
/// In distributed mode every server may place, under the scheduling lock.
pub const DEFAULT_DISTRIBUTED_SCHEDULING: bool = true;
/// The scheduling lock: long enough for a batch of placements, short enough that a
/// crashed holder does not stall placement for long (a standby's takeover of the lease
/// does not wait for it: see `controllers::placement`).
pub const DEFAULT_SCHEDULE_LOCK_TIMEOUT: Duration = Duration::from_secs(60);
/// The leader lease's TTL.
pub const DEFAULT_LEASE_TTL: Duration = gantry_coord::DEFAULT_LEASE_TTL;
/// How often the leader renews.
pub const DEFAULT_LEASE_RENEW_INTERVAL: Duration = gantry_coord::DEFAULT_LEASE_RENEW_INTERVAL;

/// How scheduling is shared between servers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchedulingMode {
    /// This server schedules alone: SQLite, `gantry start`, or one server on PostgreSQL
    /// (refused while another server is active).
    Local,
    /// Several servers on PostgreSQL: a leader elected through the lease runs the
    /// controllers; with `distributed_scheduling`, every server places under the
    /// scheduling lock.
    Distributed,
    /// Distributed on PostgreSQL, local on SQLite.
    Auto,
}

/// How the server runs.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Holds the SQLite database, the generated secrets and the bootstrap files.
    pub data_dir: PathBuf,
    pub host: String,
    /// 0 picks a free port (tests).
    pub port: u16,
    /// `postgres://…` for multi-server deployments; `None` means the SQLite file in
    /// `data_dir`.
    pub database_url: Option<String>,
    /// Signs session tokens; generated into `data_dir` when absent (SQLite only).
    pub jwt_secret: Option<String>,
    /// The first admin's password; generated and written to
    /// `data_dir/initial_admin_password` when absent.
    pub bootstrap_password: Option<String>,
    /// This server's name in logs and the server registry.
    pub server_id: String,
    /// How other servers, workers and the console reach this server; `None` derives it
    /// from the bound address (see [`ServerConfig::advertised_url`]).
    pub advertise_url: Option<String>,
    /// Serve HTTPS with this certificate and key (`tls_cert_file`, `tls_key_file`).
    pub tls: Option<gantry_tls::TlsFiles>,
    /// PEM certificates to trust for workers whose own API serves HTTPS, besides the
    /// system's roots (`worker_ca_file`).
    pub worker_ca_file: Option<PathBuf>,
    /// How scheduling is shared between servers.
    pub scheduling_mode: SchedulingMode,
    /// The leader lease's TTL and renewal interval (distributed mode).
    pub lease_ttl: Duration,
    pub lease_renew_interval: Duration,
    /// Largest request body the management API accepts.
    pub max_request_body: usize,
    /// Largest request body the OpenAI-compatible gateway (`/v1/*`) accepts: prompts
    /// and embedding inputs are far larger than management requests.
    pub gateway_max_request_body: usize,
    /// How often the gateway writes the usage it summed in memory to the store.
    pub usage_flush_interval: Duration,
    /// Failures in a row (connection errors, 5xx answers, first-byte timeouts) after
    /// which the gateway takes an instance out of routing.
    pub gateway_eject_after: usize,
    /// How long a first ejection lasts; each further one without a success between
    /// doubles it, up to 5 minutes.
    pub gateway_eject_cooldown: Duration,
    /// How long the gateway waits for an instance's response head before trying
    /// another; `None`: no limit.
    pub gateway_first_byte_timeout: Option<Duration>,
    /// How long an API key the server verified is used without asking the store again
    /// (see `gantry_auth::cache::CacheConfig::fresh_for`).
    pub api_key_cache_ttl: Duration,
    /// How long a login lasts.
    pub session_ttl: Duration,
    /// Interval between heartbeat lines on idle watch streams.
    pub watch_heartbeat: Duration,
    /// Expected interval between worker heartbeats.
    pub heartbeat_interval: Duration,
    /// Silence after which a server or worker counts as gone.
    pub server_timeout: Duration,
    /// Every server's URL, as workers should be told (multi-server deployments).
    pub server_urls: Vec<String>,
    /// Default timeout of distributed locks taken through the coordinator API.
    pub lock_timeout: Duration,
    /// In distributed mode, whether every server places (under the scheduling lock) or
    /// only the leader.
    pub distributed_scheduling: bool,
    /// Timeout of the scheduling lock.
    pub schedule_lock_timeout: Duration,
    /// How long a shutdown waits for requests in flight.
    pub shutdown_grace: Duration,
    /// Where remote models (Hugging Face, URLs) are read from, to estimate them from
    /// their headers.
    pub sources: gantry_source::SourceConfig,
    /// The largest file accepted by `POST /api/v1/model-files/uploads`.
    pub upload_max_size: u64,
    /// How long usage is kept per minute before whole days are rolled up.
    pub usage_retention: Duration,
    /// The model catalog's file; `None` serves the built-in catalog.
    pub model_catalog_file: Option<PathBuf>,
    /// The bucket (of the `s3_*` store) complete uploads are moved to, so every server
    /// reaches them; `None` keeps them on the disk of the server they reached.
    pub upload_bucket: Option<String>,
    /// How often the leader looks at its worker pools: machines to create, to watch
    /// registering, to delete, and demand.
    pub pool_interval: Duration,
    /// Ports the machines of `local` pools give their backends, ten each.
    pub local_pool_ports: std::ops::RangeInclusive<u16>,
    /// The gantry executable `local` pools run as `gantry worker`, and that servers hand
    /// out at `/downloads/gantry`; `None`: this process's own.
    pub gantry_program: Option<PathBuf>,
    /// Where the programs of `exec` pools are; `None`: `<data_dir>/pool-commands`. Only
    /// programs there run, so the API cannot run arbitrary commands on a server.
    pub pool_commands_dir: Option<PathBuf>,
}

/// How often pools are looked at when `pool_interval` is not set.
pub const DEFAULT_POOL_INTERVAL: Duration = Duration::from_secs(5);

/// How long usage is kept per minute when `usage_retention` is not set: a week, so the
/// console's 7-day chart has its hours.
pub const DEFAULT_USAGE_RETENTION: Duration = Duration::from_secs(8 * 24 * 3600);

/// The largest upload when `upload_max_size` is not set.
pub const DEFAULT_UPLOAD_MAX_SIZE: u64 = 200 << 30;

impl ServerConfig {
    /// Defaults for everything but the data directory.
    pub fn new(data_dir: PathBuf) -> Self {
        Self {
            data_dir,
            host: DEFAULT_HOST.to_string(),
            port: DEFAULT_PORT,
            database_url: None,
            jwt_secret: None,
            bootstrap_password: None,
            server_id: DEFAULT_SERVER_ID.to_string(),
            advertise_url: None,
            tls: None,
            worker_ca_file: None,
            scheduling_mode: SchedulingMode::Auto,
            lease_ttl: DEFAULT_LEASE_TTL,
            lease_renew_interval: DEFAULT_LEASE_RENEW_INTERVAL,
            max_request_body: DEFAULT_MAX_REQUEST_BODY,
            gateway_max_request_body: DEFAULT_GATEWAY_MAX_REQUEST_BODY,
            usage_flush_interval: gantry_gateway::USAGE_FLUSH_INTERVAL,
            gateway_eject_after: DEFAULT_GATEWAY_EJECT_AFTER,
            gateway_eject_cooldown: DEFAULT_GATEWAY_EJECT_COOLDOWN,
            gateway_first_byte_timeout: None,
            api_key_cache_ttl: DEFAULT_API_KEY_CACHE_TTL,
            session_ttl: Duration::from_secs(24 * 3600),
            watch_heartbeat: Duration::from_secs(15),
            heartbeat_interval: DEFAULT_HEARTBEAT_INTERVAL,
            server_timeout: DEFAULT_SERVER_TIMEOUT,
            server_urls: Vec::new(),
            lock_timeout: DEFAULT_LOCK_TIMEOUT,
            distributed_scheduling: DEFAULT_DISTRIBUTED_SCHEDULING,
            schedule_lock_timeout: DEFAULT_SCHEDULE_LOCK_TIMEOUT,
            shutdown_grace: Duration::from_secs(30),
            sources: gantry_source::SourceConfig::default(),
            upload_max_size: DEFAULT_UPLOAD_MAX_SIZE,
            upload_bucket: None,
            usage_retention: DEFAULT_USAGE_RETENTION,
            model_catalog_file: None,
            pool_interval: DEFAULT_POOL_INTERVAL,
            local_pool_ports: 42000..=42999,
            gantry_program: None,
            pool_commands_dir: None,
        }
    }

    /// Where the programs of `exec` pools are.
    pub fn pool_commands_dir(&self) -> PathBuf {
        self.pool_commands_dir
            .clone()
            .unwrap_or_else(|| self.data_dir.join("pool-commands"))
    }

    /// The gantry executable to hand out and to run for `local` pools.
    pub fn gantry_program(&self) -> std::io::Result<PathBuf> {
        match &self.gantry_program {
            Some(path) => Ok(path.clone()),
            None => std::env::current_exe(),
        }
    }

    /// The database URL actually used.
    pub fn effective_database_url(&self) -> String {
        match &self.database_url {
            Some(url) => url.clone(),
            None => format!("sqlite://{}", self.data_dir.join("gantry.db").display()),
        }
    }

    /// True when several servers may share the database.
    pub fn is_multi_server(&self) -> bool {
        self.database_url
            .as_deref()
            .is_some_and(|u| u.starts_with("postgres://") || u.starts_with("postgresql://"))
    }

    /// The mode in effect: `auto` resolved by the database (never `Auto`).
    pub fn effective_scheduling_mode(&self) -> SchedulingMode {
        match self.scheduling_mode {
            SchedulingMode::Auto if self.is_multi_server() => SchedulingMode::Distributed,
            SchedulingMode::Auto => SchedulingMode::Local,
            mode => mode,
        }
    }

    /// The URL this server is reached at: `advertise_url`, else `http://host:port` (or
    /// `https://` with TLS) of the bound address, with the machine's hostname for a
    /// wildcard host.
    pub fn advertised_url(&self, bound: std::net::SocketAddr) -> String {
        if let Some(url) = &self.advertise_url {
            return url.trim_end_matches('/').to_string();
        }
        let host = if bound.ip().is_unspecified() {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|h| h.trim().to_string())
                .filter(|h| !h.is_empty())
                .unwrap_or_else(|| "localhost".to_string())
        } else {
            match bound.ip() {
                std::net::IpAddr::V6(ip) => format!("[{ip}]"),
                ip => ip.to_string(),
            }
        };
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{host}:{}", bound.port())
    }
}
