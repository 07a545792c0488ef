//! This server's place among the servers sharing a database: its scheduling mode, the
//! coordinator that says whether it leads (and with which fencing token), the registry
//! row it keeps fresh (`registry.rs`), the workers whose heartbeats reach it, and the
//! server directory it gives them.
//!
//! The rules of who may write what:
//!
//! * **local** mode (SQLite, `gantry start`, or `scheduling_mode: local`): this server is
//!   the only one; its controllers write unfenced.
//! * **distributed** mode (PostgreSQL): the server holding the leader lease runs the
//!   controllers and worker health, every write of theirs fenced by its token
//!   ([`Cluster::leader_fence`]). Placement is fenced by the scheduling lock when
//!   `distributed_scheduling` lets every server place (`controllers::scheduling`), by the
//!   leader's token otherwise.

pub mod registry;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use gantry_coord::Coordinator;
use gantry_store::{Fence, StoreError};
use gantry_types::{ServerInfo, ServerLoad, ServerRole};

use crate::config::SchedulingMode;

/// How long the server directory given to workers is reused: every worker asks for it
/// every heartbeat interval (thousands a second in a large cluster), and it changes
/// only when a server comes, goes or reports its load.
pub const DIRECTORY_FRESH_FOR: Duration = Duration::from_millis(250);

/// The name of the lock a server holds while it places (distributed scheduling).
pub const SCHEDULING_LOCK: &str = "scheduler:placement";

/// See the module documentation.
pub struct Cluster {
    /// `Local` or `Distributed` (never `Auto`).
    pub mode: SchedulingMode,
    pub coordinator: Arc<dyn Coordinator>,
    /// Whether every server places under [`SCHEDULING_LOCK`] (distributed mode only).
    pub distributed_scheduling: bool,
    /// Random per process: tells this process's registry row from another's with the
    /// same `server_id`.
    pub incarnation: String,
    /// The URL this server is reached at.
    pub url: String,
    /// Workers whose heartbeats reach this server, with the last one's time.
    connected: Mutex<HashMap<i64, Instant>>,
    /// Gateway requests in flight here (set once the gateway runs).
    inflight: OnceLock<Box<dyn Fn() -> u64 + Send + Sync>>,
    /// The active servers as last given to a worker, with when they were read.
    directory: Mutex<Option<(Instant, Vec<ServerInfo>)>>,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("mode", &self.mode)
            .field("server_id", &self.coordinator.server_id())
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl Cluster {
    pub fn new(
        mode: SchedulingMode,
        coordinator: Arc<dyn Coordinator>,
        distributed_scheduling: bool,
        url: String,
    ) -> Self {
        Cluster {
            mode,
            coordinator,
            distributed_scheduling,
            incarnation: gantry_auth::secrets::random_alphanumeric(16),
            url,
            connected: Mutex::default(),
            inflight: OnceLock::new(),
            directory: Mutex::default(),
        }
    }

    pub fn server_id(&self) -> &str {
        self.coordinator.server_id()
    }

    /// The server directory read less than [`DIRECTORY_FRESH_FOR`] ago, if any.
    pub fn fresh_directory(&self) -> Option<Vec<ServerInfo>> {
        let directory = self.directory.lock().unwrap_or_else(|e| e.into_inner());
        directory
            .as_ref()
            .filter(|(read_at, _)| read_at.elapsed() < DIRECTORY_FRESH_FOR)
            .map(|(_, servers)| servers.clone())
    }

    /// Keeps a directory just read for [`Cluster::fresh_directory`].
    pub fn keep_directory(&self, servers: &[ServerInfo]) {
        *self.directory.lock().unwrap_or_else(|e| e.into_inner()) =
            Some((Instant::now(), servers.to_vec()));
    }

    /// The fence of a leader-only write now: `None` when this server does not lead.
    pub fn leader_fence(&self) -> Option<Fence> {
        match self.mode {
            SchedulingMode::Distributed => self.coordinator.fencing_token().map(Fence::Leader),
            _ => self.coordinator.is_leader().then_some(Fence::Unfenced),
        }
    }

    /// Whether placement runs on every server under [`SCHEDULING_LOCK`] rather than in
    /// the leader's pass.
    pub fn places_under_lock(&self) -> bool {
        self.mode == SchedulingMode::Distributed && self.distributed_scheduling
    }

    pub fn role(&self) -> ServerRole {
        if self.coordinator.is_leader() {
            ServerRole::Leader
        } else {
            ServerRole::Standby
        }
    }

    /// The mode's word, as the API shows it.
    pub fn mode_name(&self) -> &'static str {
        match self.mode {
            SchedulingMode::Distributed => "distributed",
            _ => "local",
        }
    }

    /// Called with every error of a fenced write: a refused one means another server
    /// leads now, so this one steps down at once.
    pub fn on_write_error(&self, error: &StoreError) {
        if let StoreError::Fenced { fence } = error {
            tracing::warn!(server_id = %self.server_id(), %fence,
                "a leader-only write was refused: another server took over; stepping down");
            self.coordinator.fenced();
        }
    }

    /// A worker's heartbeat reached this server.
    pub fn worker_seen(&self, worker_id: i64) {
        self.connected
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(worker_id, Instant::now());
    }

    /// Hands the registry a way to read the gateway's requests in flight.
    pub fn set_inflight_source(&self, source: impl Fn() -> u64 + Send + Sync + 'static) {
        let _ = self.inflight.set(Box::new(source));
    }

    /// This server's load now: workers heard from within `window`, gateway requests in
    /// flight.
    pub fn load(&self, window: Duration) -> ServerLoad {
        let mut connected = self.connected.lock().unwrap_or_else(|e| e.into_inner());
        connected.retain(|_, seen| seen.elapsed() <= window);
        ServerLoad {
            inflight_requests: self.inflight.get().map_or(0, |f| f()),
            connected_workers: u64::try_from(connected.len()).unwrap_or(u64::MAX),
        }
    }
}
