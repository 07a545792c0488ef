//! The server's resolved configuration. The CLI reads flags, `GANTRY_*` variables and
//! the YAML file and hands the result here; nothing in this crate reads the
//! environment.

use std::path::PathBuf;
use std::time::Duration;

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
    /// Default timeout of distributed locks.
    pub lock_timeout: Duration,
    /// Whether several servers share scheduling under per-instance locks.
    pub distributed_scheduling: bool,
    /// Timeout of the per-instance scheduling lock.
    pub schedule_lock_timeout: Duration,
}

impl ServerConfig {
    /// Defaults for everything but the data directory.
    pub fn new(data_dir: PathBuf) -> Self {
        Self {
            data_dir,
            host: "0.0.0.0".to_string(),
            port: 8080,
            database_url: None,
            jwt_secret: None,
            bootstrap_password: None,
            server_id: "gantry-server".to_string(),
            max_request_body: 1024 * 1024,
            gateway_max_request_body: 32 * 1024 * 1024,
            session_ttl: Duration::from_secs(24 * 3600),
            watch_heartbeat: Duration::from_secs(15),
            heartbeat_interval: Duration::from_secs(15),
            server_timeout: Duration::from_secs(60),
            server_urls: Vec::new(),
            lock_timeout: Duration::from_secs(30),
            distributed_scheduling: true,
            schedule_lock_timeout: Duration::from_secs(60),
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
