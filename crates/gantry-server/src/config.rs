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
/// How often workers say they are alive.
pub const DEFAULT_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(15);
/// Four missed heartbeats at the default interval.
pub const DEFAULT_SERVER_TIMEOUT: Duration = Duration::from_secs(60);
/// Distributed locks (not used yet).
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(30);
/// Scheduling shared between servers (not used yet).
pub const DEFAULT_DISTRIBUTED_SCHEDULING: bool = true;
/// The per-instance scheduling lock (not used yet).
pub const DEFAULT_SCHEDULE_LOCK_TIMEOUT: Duration = Duration::from_secs(60);

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
    /// This server's name in logs and, later, the server registry.
    pub server_id: String,
    /// Largest request body the management API accepts.
    pub max_request_body: usize,
    /// Largest request body the OpenAI-compatible gateway (`/v1/*`) accepts: prompts
    /// and embedding inputs are far larger than management requests.
    pub gateway_max_request_body: usize,
    /// How often the gateway writes the usage it summed in memory to the store.
    pub usage_flush_interval: Duration,
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
    /// Default timeout of distributed locks. Not used yet: every server schedules alone
    /// until the high-availability work lands.
    pub lock_timeout: Duration,
    /// Whether several servers share scheduling under per-instance locks. Not used yet.
    pub distributed_scheduling: bool,
    /// Timeout of the per-instance scheduling lock. Not used yet.
    pub schedule_lock_timeout: Duration,
}

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
            max_request_body: DEFAULT_MAX_REQUEST_BODY,
            gateway_max_request_body: DEFAULT_GATEWAY_MAX_REQUEST_BODY,
            usage_flush_interval: gantry_gateway::usage::FLUSH_INTERVAL,
            session_ttl: Duration::from_secs(24 * 3600),
            watch_heartbeat: Duration::from_secs(15),
            heartbeat_interval: DEFAULT_HEARTBEAT_INTERVAL,
            server_timeout: DEFAULT_SERVER_TIMEOUT,
            server_urls: Vec::new(),
            lock_timeout: DEFAULT_LOCK_TIMEOUT,
            distributed_scheduling: DEFAULT_DISTRIBUTED_SCHEDULING,
            schedule_lock_timeout: DEFAULT_SCHEDULE_LOCK_TIMEOUT,
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
}
