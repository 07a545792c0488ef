//! Persistence for gantry: every SQL statement in the project lives in this crate.
//!
//! What is persisted and why:
//! - `users`, `api_keys`: who may call the API and the gateway (hashes only, never
//!   secrets);
//! - `settings`: cluster-wide values created once (the registration token's hash);
//! - `workers`: registered GPU nodes, their labels, last reported hardware and heartbeat;
//! - `models`: the desired state an admin declared;
//! - `model_instances`: one row per replica, the observed state the scheduler and the
//!   workers move forward;
//! - `usage_records`: requests and tokens the gateway served, per minute, caller and
//!   model;
//! - `leader_lease`, `coordination_locks`, `servers`: coordination between servers
//!   sharing the database (the leader lease and its fencing token, distributed locks,
//!   the server registry; see `lease.rs`, `locks.rs`, `servers.rs` and `fence.rs`).
//!
//! Two engines sit behind one [`Store`]: an SQLite file (WAL) for single-server
//! deployments and PostgreSQL for several servers sharing state. Both run the same SQL
//! through sqlx's `Any` driver; the schema differs only in how ids are generated (see
//! `migrations.rs`). Timestamps are `BIGINT` milliseconds, flags `BIGINT` 0/1 and
//! structured fields JSON `TEXT`, so the two engines store identical values.
//!
//! Every committed write publishes a [`Change`] on an in-process broadcast channel; the
//! API's `?watch=true` streams and the controllers listen to it.

mod api_keys;
mod backends;
mod changes;
mod checkpoint;
mod clusters;
mod error;
mod fence;
mod instances;
mod key_load;
mod lease;
mod locks;
mod migrations;
mod models;
mod notify;
mod placement_record;
mod pools;
mod providers;
mod query;
mod reachability;
mod reports;
mod routes;
mod rows;
mod scheduling;
mod servers;
mod settings;
pub mod testing;
mod uploads;
mod usage;
mod users;
mod vacuum;
mod workers;
mod write_priority;

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::any::{AnyConnectOptions, AnyPoolOptions};
use sqlx::{AnyPool, ConnectOptions, Connection};
use tokio::sync::broadcast;

pub use api_keys::{ApiKeyRecord, NewApiKey};
pub use backends::StoredBackend;
pub use changes::{Change, ChangeKind};
pub use clusters::{ClusterToken, StoredCluster};
pub use error::StoreError;
pub use fence::{fenced_writes, Fence, FencedWrites};
pub use instances::ManualPlacement;
pub use key_load::KeyLoad;
pub use lease::{LeaderSession, LEADER_LOCK_KEY};
pub use locks::LockRelease;
pub use placement_record::{undecodable_placement_records, StoredPlacement};
pub use pools::{NewPool, PoolSpec, StoredMachine, StoredPool};
pub use providers::{ProviderFields, StoredProvider};
pub use query::{Listed, Page};
// The list filters are the API's own: the store reads them as SQL, a watch as a predicate.
pub use gantry_types::{ApiKeyFilter, InstanceFilter, ModelFilter, UserFilter, WorkerFilter};
pub use scheduling::{NewPlacement, PendingReason, PlacedInstanceClaim};
pub use servers::{RegistryConflict, ServerRecord, ServerRegistration};
pub use settings::REGISTRATION_TOKEN_DIGEST;
pub use uploads::UploadDone;
pub use usage::{
    usage_minute_of, UsageByApiKey, UsageByModel, UsageByTarget, UsageFilter, UsageIncrement,
    UsagePoint, UsageSums, USAGE_BUCKET_MILLIS, USAGE_DAY_MILLIS,
};
pub use users::{NewUser, UserChanges, UserRecord};
pub use workers::WorkerRegistration;

/// Which database engine backs the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    Sqlite,
    Postgres,
}

/// How to reach the database.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// `sqlite:///path/to/gantry.db` or `postgres://user:pass@host:port/db`.
    pub url: String,
    /// Connection pool size.
    pub max_connections: u32,
}

/// The handle every part of the server uses to read and write state. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    /// Where reads go: on SQLite, `max_connections` connections reading side by side.
    reads: AnyPool,
    /// Where writes go (every `INSERT`, `UPDATE`, `DELETE` and transaction). On SQLite
    /// one connection, so writers queue in the pool, first come first served, instead of
    /// meeting on the file lock, where the loser sleeps in SQLite's busy handler (1, 2,
    /// 5, 10, … ms), which under a fleet's heartbeats adds up to much of every write's
    /// time. On PostgreSQL the same pool as `reads`.
    writes: AnyPool,
    /// Where the leader's batched instance writes go (placements, pending reasons): on
    /// PostgreSQL [`LEADER_WRITE_CONNECTIONS`] connections of their own, so that a
    /// placement never waits for a connection behind the fleet's heartbeats and reports,
    /// which on a shared pool can hold it up for as long as a batch takes to write. On
    /// SQLite the one writing connection.
    leader_writes: AnyPool,
    engine: Engine,
    /// The URL it was opened with (the PostgreSQL listener opens its own connection).
    url: String,
    changes: broadcast::Sender<Arc<Change>>,
    /// Called inline with every change published here; see [`Store::on_change`].
    listeners: Arc<std::sync::RwLock<Vec<ChangeListener>>>,
    /// On PostgreSQL: sends this server's changes to the others.
    notifier: Option<Arc<notify::Notifier>>,
    /// Stops the cross-server listener when the last handle goes away.
    lifetime: Option<Arc<tokio_util::sync::DropGuard>>,
    shutdown: tokio_util::sync::CancellationToken,
    /// Whether the database answers, without asking it (see [`Store::unreachable`]).
    reachability: Arc<reachability::Reachability>,
    /// Workers as last read, for heartbeats' answers (see `workers::WorkerRows`).
    worker_rows: Arc<workers::WorkerRows>,
    /// Instance reports waiting to be written together (see `reports.rs`).
    reports: Arc<reports::ReportQueue>,
    /// Leader writes under way, which reports and heartbeats let go first (see
    /// `write_priority.rs`).
    write_priority: Arc<write_priority::WritePriority>,
    /// Bumped with every worker change published here and whenever changes may have
    /// been missed (see [`Store::workers_generation`]).
    workers_generation: Arc<std::sync::atomic::AtomicU64>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("engine", &self.engine)
            .finish()
    }
}

/// A function called inline with every change a store publishes.
pub type ChangeListener = Arc<dyn Fn(&Arc<Change>) + Send + Sync>;

/// The leader's own connections on PostgreSQL: as many as the scheduler writes batches
/// at once (`BATCHES_IN_FLIGHT` in the server's placement).
pub const LEADER_WRITE_CONNECTIONS: u32 = 3;

/// How many unread changes a slow watcher may fall behind before it is cut off. A
/// placement publishes its batches of 500 at once, up to three together, while the
/// fleet's reports go on, so the channel must hold a few such bursts: a watcher cut off
/// (the gateway's routing, say) reads the store again, which is what a burst can least
/// afford. The slots hold pointers; a change is freed once every subscriber has read it.
const CHANGE_CHANNEL_CAPACITY: usize = 16_384;

/// How much of a SQLite database file each connection maps into memory (256 MiB; the
/// rest, if the file is larger, is read as usual).
const SQLITE_MMAP_SIZE: u64 = 256 * 1024 * 1024;

/// How long a PostgreSQL connection may have been idle in the pool before it is pinged
/// as it is handed out (see `connect`).
const PING_AFTER_IDLE: Duration = Duration::from_secs(1);

/// How long a PostgreSQL transaction may wait on its client between statements. Every
/// transaction of the store runs its statements back to back, so only a frozen or hung
/// process reaches this. A take-over waits at most this long for a frozen leader's open
/// transaction (with the default 15 s `lease_ttl`, not at all: it has ended long before).
const IDLE_IN_TRANSACTION_TIMEOUT: Duration = Duration::from_secs(2);

impl Store {
    /// Connects and runs the embedded migrations. For SQLite the file is created if
    /// missing and switched to WAL.
    pub async fn open(config: &StoreConfig) -> Result<Self, StoreError> {
        Self::open_with_schema(config, migrations::latest_version()).await
    }

    /// [`Store::open`] with the schema migrated up to `version` only.
    pub(crate) async fn open_with_schema(
        config: &StoreConfig,
        version: i64,
    ) -> Result<Self, StoreError> {
        sqlx::any::install_default_drivers();
        let engine = if config.url.starts_with("sqlite:") {
            Engine::Sqlite
        } else if config.url.starts_with("postgres://") || config.url.starts_with("postgresql://") {
            Engine::Postgres
        } else {
            return Err(StoreError::Config(format!(
                "database_url must start with sqlite: or postgres:// (got {:?})",
                redact_url(&config.url)
            )));
        };
        let url = match engine {
            Engine::Sqlite if !config.url.contains('?') => format!("{}?mode=rwc", config.url),
            _ => config.url.clone(),
        };
        let options = AnyConnectOptions::from_str(&url)
            .map_err(|e| StoreError::Config(format!("invalid database_url: {e}")))?
            .log_statements(tracing::log::LevelFilter::Trace)
            .log_slow_statements(tracing::log::LevelFilter::Warn, Duration::from_secs(1));
        let cannot_connect = |e: sqlx::Error| {
            StoreError::Config(format!(
                "cannot connect to {}: {e}",
                redact_url(&config.url)
            ))
        };
        let notifier_options = options.clone();
        let (reads, writes, leader_writes) = match engine {
            Engine::Sqlite => {
                let writes = connect(engine, Role::Writes, options.clone(), 1)
                    .await
                    .map_err(cannot_connect)?;
                let reads = connect(engine, Role::Reads, options, config.max_connections)
                    .await
                    .map_err(cannot_connect)?;
                (reads, writes.clone(), writes)
            }
            Engine::Postgres => {
                let pool = connect(engine, Role::Both, options.clone(), config.max_connections)
                    .await
                    .map_err(cannot_connect)?;
                let leader_writes = connect(engine, Role::Both, options, LEADER_WRITE_CONNECTIONS)
                    .await
                    .map_err(cannot_connect)?;
                (pool.clone(), pool, leader_writes)
            }
        };
        let (changes, _) = broadcast::channel(CHANGE_CHANNEL_CAPACITY);
        let shutdown = tokio_util::sync::CancellationToken::new();
        let mut store = Self {
            reads,
            writes,
            leader_writes,
            engine,
            url: config.url.clone(),
            changes,
            listeners: Arc::default(),
            notifier: None,
            lifetime: None,
            shutdown: shutdown.clone(),
            reachability: Arc::default(),
            worker_rows: Arc::default(),
            reports: Arc::default(),
            write_priority: Arc::default(),
            workers_generation: Arc::default(),
        };
        migrations::run(&store, version).await?;
        match engine {
            Engine::Postgres => {
                // The notifier sends on a connection of its own: from the shared pool,
                // each statement would wait behind the fleet's heartbeats, and its queue
                // would overflow while a burst of instances is placed.
                let connection = connect(engine, Role::Both, notifier_options, 1)
                    .await
                    .map_err(cannot_connect)?;
                store.notifier = Some(notify::start(&store, connection, shutdown.clone()).await?);
                reachability::start_probe(&store, &config.url, shutdown.clone());
                vacuum::start(store.reads.clone(), shutdown.clone());
            }
            Engine::Sqlite => checkpoint::start(store.reads.clone(), shutdown.clone()),
        }
        store.lifetime = Some(Arc::new(shutdown.drop_guard()));
        Ok(store)
    }

    pub fn engine(&self) -> Engine {
        self.engine
    }

    /// Answers once the database responds to a trivial query.
    pub async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.reads).await?;
        Ok(())
    }

    /// Every committed write from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Change>> {
        self.changes.subscribe()
    }

    /// Publishes a committed change on this server and, on PostgreSQL, to the others.
    fn publish(&self, change: Change) {
        if let Some(notifier) = &self.notifier {
            notifier.forward(&change);
        }
        self.publish_local(change);
    }

    /// Calls `listener` with every change published from now on (this server's writes and
    /// the other servers' it hears of), inline, before the write that caused it returns
    /// to its caller. For caches that must never serve what a write just revoked (a
    /// deleted API key): the broadcast channel of [`Store::subscribe`] is read later, by
    /// another task. A listener must be quick and must not write to the store.
    pub fn on_change(&self, listener: ChangeListener) {
        self.listeners
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(listener);
    }

    /// A number that moves whenever a worker may have changed: with every worker change
    /// published on this server (its own writes and those it hears of from others), and
    /// when the changes of other servers may have been missed (the listener
    /// reconnected). A list of workers read after taking the number is still whole and
    /// current while the number stays the same.
    pub fn workers_generation(&self) -> u64 {
        self.workers_generation
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// A worker changed, or changes of other servers may have been missed: whatever
    /// was kept of workers is to be read again.
    pub(crate) fn workers_may_have_changed(&self) {
        self.workers_generation
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// Publishes a change on this server only.
    fn publish_local(&self, change: Change) {
        if let Change::Worker(_, worker) = &change {
            self.workers_may_have_changed();
            self.worker_rows.forget(worker.id);
        }
        let change = Arc::new(change);
        for listener in self
            .listeners
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .iter()
        {
            listener(&change);
        }
        // No receiver is fine: nobody is watching.
        let _ = self.changes.send(change);
    }

    /// Stops listening to other servers and closes the pool, waiting for connections
    /// to be returned.
    pub async fn close(&self) {
        self.shutdown.cancel();
        self.leader_writes.close().await;
        self.writes.close().await;
        self.reads.close().await;
    }
}

/// What a pool's connections are for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Reads,
    Writes,
    Both,
}

/// A pool of at most `max_connections` connections, each set up for the store's use.
async fn connect(
    engine: Engine,
    role: Role,
    options: AnyConnectOptions,
    max_connections: u32,
) -> Result<AnyPool, sqlx::Error> {
    AnyPoolOptions::new()
        .max_connections(max_connections.max(1))
        .acquire_timeout(Duration::from_secs(10))
        // sqlx pings every connection it hands out, and again when it takes one back:
        // three round trips for one statement. The ping on return stays (it cannot be
        // turned off, and it finds a connection broken during use); the one on acquire
        // is kept only for a PostgreSQL connection idle for a while, which a database
        // restart or a dropped TCP session may have ended meanwhile. A connection
        // returned healthy a moment ago is handed out as it is.
        .test_before_acquire(false)
        .before_acquire(move |conn, meta| {
            Box::pin(async move {
                if engine == Engine::Postgres && meta.idle_for >= PING_AFTER_IDLE {
                    conn.ping().await?;
                }
                Ok(true)
            })
        })
        .after_connect(move |conn, _meta| {
            Box::pin(async move {
                if engine == Engine::Sqlite {
                    // WAL persists in the file; the rest is per connection. This
                    // process writes through one connection; a busy timeout turns
                    // contention with another process (`gantry backup`) into short
                    // waits, not errors.
                    let mut pragmas = vec![
                        "journal_mode = WAL".to_owned(),
                        "synchronous = NORMAL".to_owned(),
                        "foreign_keys = ON".to_owned(),
                        "busy_timeout = 5000".to_owned(),
                        // Reads through a memory map instead of `pread` into the page
                        // cache: in WAL mode a connection drops its page cache whenever
                        // another one has written (every heartbeat), so without it each
                        // list would copy its pages from the OS again.
                        format!("mmap_size = {SQLITE_MMAP_SIZE}"),
                    ];
                    if role == Role::Writes {
                        // See the checkpoint module.
                        pragmas.push("wal_autocheckpoint = 0".to_owned());
                    }
                    for pragma in pragmas {
                        sqlx::query(&format!("PRAGMA {pragma}"))
                            .execute(&mut *conn)
                            .await?;
                    }
                }
                if engine == Engine::Postgres {
                    // A fenced write share-locks the lease row for its transaction.
                    // A leader frozen (SIGSTOP, a VM pause) inside one would keep
                    // every standby from taking the lease until it thaws; PostgreSQL
                    // ends such a session instead, well inside any lease's lifetime.
                    sqlx::query(&format!(
                        "SET idle_in_transaction_session_timeout = {}",
                        IDLE_IN_TRANSACTION_TIMEOUT.as_millis()
                    ))
                    .execute(&mut *conn)
                    .await?;
                }
                Ok(())
            })
        })
        .connect_with(options)
        .await
}

/// The URL without its password, for messages and logs.
pub fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            let credentials = &url[scheme_end + 3..at];
            match credentials.find(':') {
                Some(colon) => format!(
                    "{}{}:***{}",
                    &url[..scheme_end + 3],
                    &credentials[..colon],
                    &url[at..]
                ),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

impl Store {
    /// Writes a consistent copy of an SQLite database to `out` while it is in use
    /// (`VACUUM INTO`: one read transaction, so the copy is a single point in time, and
    /// writers go on meanwhile). `out` must not exist. PostgreSQL has `pg_dump` for this.
    pub async fn backup_to(&self, out: &std::path::Path) -> Result<(), StoreError> {
        if self.engine != Engine::Sqlite {
            return Err(StoreError::Config(
                "gantry backup copies the embedded SQLite database; back up PostgreSQL with \
                 pg_dump (see the README)"
                    .into(),
            ));
        }
        if out.exists() {
            return Err(StoreError::Config(format!(
                "{} exists already; give a new file (a backup never overwrites)",
                out.display()
            )));
        }
        let target = out
            .to_str()
            .ok_or_else(|| StoreError::Config(format!("{} is not a UTF-8 path", out.display())))?;
        sqlx::query("VACUUM INTO $1")
            .bind(target)
            .execute(&self.reads)
            .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn redact_url_hides_only_the_password() {
        assert_eq!(
            redact_url("postgres://gantry:s3cret@db:5432/gantry"),
            "postgres://gantry:***@db:5432/gantry"
        );
        assert_eq!(redact_url("sqlite:///tmp/x.db"), "sqlite:///tmp/x.db");
    }
}
