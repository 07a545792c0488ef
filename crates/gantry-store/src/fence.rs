//! Fencing: a write that only the current holder of a lease or lock may make carries the
//! token it held when it decided, and the database applies the write only while that
//! token is still the current one.
//!
//! The check is part of the write's own statement (`AND EXISTS (SELECT 1 FROM
//! leader_lease WHERE id = 1 AND fencing_token = $t FOR SHARE)`), or the first statement
//! of its transaction. `FOR SHARE` makes it linearisable against a take-over: a take-over
//! that updates the lease row waits for a write that already holds the share lock, and a
//! write that comes second re-reads the row after the take-over commits and finds the
//! token changed. So once a new token is issued, no write carrying an older one lands.
//!
//! A write that changes nothing because its fence is stale fails with
//! [`StoreError::Fenced`] (the caller steps down), not with the "row moved on" `None` of
//! an ordinary conditional write.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use gantry_types::Timestamp;

use sqlx::any::AnyArguments;
use sqlx::query::Query;
use sqlx::Any;

use crate::{Engine, Store, StoreError};

/// What entitles a write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fence {
    /// Nothing to fence off: one server (SQLite, `gantry start`, `scheduling_mode: local`).
    Unfenced,
    /// The leader lease of term `token`.
    Leader(u64),
    /// The distributed lock `name`, as acquired with `token`.
    Lock { name: String, token: u64 },
}

impl std::fmt::Display for Fence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fence::Unfenced => f.write_str("unfenced"),
            Fence::Leader(token) => write!(f, "leader lease, token {token}"),
            Fence::Lock { name, token } => write!(f, "lock {name:?}, token {token}"),
        }
    }
}

/// Leader-fenced writes this process made, and those the database refused as stale.
/// Exported on `/metrics`. (Writes fenced by a lock are not counted: any server may hold
/// a lock, so they say nothing about leadership.)
static APPLIED: AtomicU64 = AtomicU64::new(0);
static REJECTED: AtomicU64 = AtomicU64::new(0);
static LAST_APPLIED_START: AtomicI64 = AtomicI64::new(0);

/// Leader-fenced writes (those carrying the leader's token) this process made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FencedWrites {
    /// Writes that changed a row.
    pub applied: u64,
    /// Writes refused because their token was stale.
    pub rejected: u64,
    /// When the latest-starting applied write was sent (ms since the epoch; 0: none). A
    /// write that lands was sent before any later holder's token was issued, so this is
    /// earlier than the current holder's `acquired_at` on every server that lost the
    /// lease.
    pub last_applied_started_at: i64,
}

/// The fenced writes of this process so far.
pub fn fenced_writes() -> FencedWrites {
    FencedWrites {
        applied: APPLIED.load(Ordering::Relaxed),
        rejected: REJECTED.load(Ordering::Relaxed),
        last_applied_started_at: LAST_APPLIED_START.load(Ordering::Relaxed),
    }
}

fn count_applied(fence: &Fence, started: Timestamp) {
    if !matches!(fence, Fence::Leader(_)) {
        return;
    }
    APPLIED.fetch_add(1, Ordering::Relaxed);
    LAST_APPLIED_START.fetch_max(started.as_millis(), Ordering::Relaxed);
}

fn count_rejected(fence: &Fence) {
    if matches!(fence, Fence::Leader(_)) {
        REJECTED.fetch_add(1, Ordering::Relaxed);
    }
}

impl Fence {
    /// The condition to append to a statement's `WHERE` (with a leading ` AND `), whose
    /// parameters start at `$first`; empty when unfenced. Bind the values with [`bind`].
    ///
    /// [`bind`]: Fence::bind
    /// On PostgreSQL the row is share-locked for the rest of the transaction; SQLite
    /// serialises every write anyway.
    pub(crate) fn clause(&self, engine: Engine, first: usize) -> String {
        self.condition(engine == Engine::Postgres, first)
    }

    /// The condition, with the row share-locked or read plainly.
    fn condition(&self, lock_row: bool, first: usize) -> String {
        let share = if lock_row { " FOR SHARE" } else { "" };
        match self {
            Fence::Unfenced => String::new(),
            Fence::Leader(_) => format!(
                " AND EXISTS (SELECT 1 FROM leader_lease WHERE id = 1 AND fencing_token = ${first}{share})"
            ),
            Fence::Lock { .. } => format!(
                " AND EXISTS (SELECT 1 FROM coordination_locks WHERE name = ${first} AND token = ${}{share})",
                first + 1
            ),
        }
    }

    /// Binds the values of [`clause`](Fence::clause).
    pub(crate) fn bind<'q>(
        &'q self,
        query: Query<'q, Any, AnyArguments<'q>>,
    ) -> Query<'q, Any, AnyArguments<'q>> {
        match self {
            Fence::Unfenced => query,
            Fence::Leader(token) => query.bind(token_param(*token)),
            Fence::Lock { name, token } => query.bind(name.as_str()).bind(token_param(*token)),
        }
    }

    pub fn is_fenced(&self) -> bool {
        !matches!(self, Fence::Unfenced)
    }
}

fn token_param(token: u64) -> i64 {
    i64::try_from(token).unwrap_or(i64::MAX)
}

impl Store {
    /// Whether `fence` still entitles writes (always, when unfenced).
    pub async fn fence_is_current(&self, fence: &Fence) -> Result<bool, StoreError> {
        if !fence.is_fenced() {
            return Ok(true);
        }
        // leader_lease always has row 1, so this reads as "the fence holds".
        let sql = format!(
            "SELECT 1 AS ok FROM leader_lease WHERE id = 1{}",
            fence.condition(false, 1)
        );
        let row = fence
            .bind(sqlx::query(&sql))
            .fetch_optional(&self.reads)
            .await?;
        Ok(row.is_some())
    }

    /// After a fenced write: counts it, and turns "nothing changed" into
    /// [`StoreError::Fenced`] when the fence is what stopped it.
    /// `started` is when the write was sent.
    pub(crate) async fn settle_fenced(
        &self,
        fence: &Fence,
        started: Timestamp,
        rows_affected: u64,
    ) -> Result<u64, StoreError> {
        if !fence.is_fenced() {
            return Ok(rows_affected);
        }
        if rows_affected > 0 {
            count_applied(fence, started);
            return Ok(rows_affected);
        }
        if self.fence_is_current(fence).await? {
            return Ok(0);
        }
        count_rejected(fence);
        Err(StoreError::Fenced {
            fence: fence.to_string(),
        })
    }

    /// Inside a transaction: fails with [`StoreError::Fenced`] unless `fence` is current,
    /// and holds it (share lock on PostgreSQL) until the transaction ends.
    pub(crate) async fn check_fence_in(
        &self,
        tx: &mut sqlx::Transaction<'_, Any>,
        fence: &Fence,
    ) -> Result<(), StoreError> {
        if !fence.is_fenced() {
            return Ok(());
        }
        let started = Timestamp::now();
        let sql = format!(
            "SELECT 1 AS ok FROM leader_lease WHERE id = 1{}",
            fence.clause(self.engine, 1)
        );
        if fence
            .bind(sqlx::query(&sql))
            .fetch_optional(&mut **tx)
            .await?
            .is_none()
        {
            count_rejected(fence);
            return Err(StoreError::Fenced {
                fence: fence.to_string(),
            });
        }
        count_applied(fence, started);
        Ok(())
    }
}
