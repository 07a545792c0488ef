//! The leader lease (PostgreSQL only): one row of `leader_lease` naming the holder, its
//! fencing token and when the lease lapses, plus a session-level advisory lock that lets
//! the others notice a dead leader before the lease lapses.
//!
//! Every statement runs on the caller's [`LeaderSession`], one dedicated connection:
//!
//! * The leader takes the advisory lock [`LEADER_LOCK_KEY`] on that connection and says
//!   so in the row (`holder_locked`). PostgreSQL drops the lock the moment the
//!   connection dies (a `kill -9`, a crash), so a standby whose `pg_try_advisory_lock`
//!   succeeds while the row says "the holder holds it" knows the holder is gone and
//!   takes over at once, without waiting for the lease to lapse.
//! * A leader that is alive but not running (stopped, partitioned) keeps its connection
//!   and its lock: the others wait for the lease to lapse (by the database's clock) and
//!   take over then.
//! * A renewal runs on the same connection, so a renewal that succeeds also proves the
//!   advisory lock is still held.
//!
//! Taking the lease bumps `fencing_token`; releasing it leaves the token as it is (the
//! next holder bumps it).

use sqlx::AnyConnection;
use sqlx::{Connection, Row};

use gantry_types::{LeaderInfo, Timestamp};

use crate::rows::{int, opt_text};
use crate::{Engine, Store, StoreError};

/// The advisory lock the leader holds; any constant works as long as every gantry server
/// uses the same one (the migration lock is 7251001).
pub const LEADER_LOCK_KEY: i64 = 7_251_002;

/// The database's clock, in milliseconds since the epoch.
const DB_NOW: &str = "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)";

/// One dedicated connection for leadership.
pub struct LeaderSession {
    connection: AnyConnection,
}

impl std::fmt::Debug for LeaderSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderSession").finish_non_exhaustive()
    }
}

impl Store {
    /// Opens a dedicated connection for the leader lease. PostgreSQL only.
    pub async fn leader_session(&self) -> Result<LeaderSession, StoreError> {
        if self.engine != Engine::Postgres {
            return Err(StoreError::Config(
                "the leader lease needs PostgreSQL; with SQLite one server schedules alone".into(),
            ));
        }
        let connection = AnyConnection::connect(&self.url).await?;
        Ok(LeaderSession { connection })
    }

    /// The lease as it stands.
    pub async fn leader_lease(&self) -> Result<LeaderInfo, StoreError> {
        let row = sqlx::query(
            "SELECT holder, fencing_token, acquired_at, expires_at FROM leader_lease WHERE id = 1",
        )
        .fetch_one(&self.reads)
        .await?;
        lease_of(&row)
    }
}

fn lease_of(row: &sqlx::any::AnyRow) -> Result<LeaderInfo, StoreError> {
    const T: &str = "leader_lease";
    Ok(LeaderInfo {
        server_id: opt_text(row, T, "holder")?,
        fencing_token: u64::try_from(int(row, T, "fencing_token")?).unwrap_or(0),
        acquired_at: Timestamp::from_millis(int(row, T, "acquired_at")?),
        expires_at: Timestamp::from_millis(int(row, T, "expires_at")?),
    })
}

fn millis(duration: std::time::Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

impl LeaderSession {
    /// This connection's backend process id (how the registry tells a live server's
    /// session from a dead one's).
    pub async fn backend_pid(&mut self) -> Result<i64, StoreError> {
        let row = sqlx::query("SELECT CAST(pg_backend_pid() AS BIGINT) AS pid")
            .fetch_one(&mut self.connection)
            .await?;
        Ok(row.try_get("pid")?)
    }

    /// Tries the leader's advisory lock without waiting; true when this session holds it
    /// now (also when it already did).
    pub async fn try_lock(&mut self) -> Result<bool, StoreError> {
        let row = sqlx::query("SELECT pg_try_advisory_lock($1) AS locked")
            .bind(LEADER_LOCK_KEY)
            .fetch_one(&mut self.connection)
            .await?;
        Ok(row.try_get("locked")?)
    }

    /// Lets the advisory lock go (every hold this session has of it).
    pub async fn unlock(&mut self) -> Result<(), StoreError> {
        while sqlx::query("SELECT pg_advisory_unlock($1) AS released")
            .bind(LEADER_LOCK_KEY)
            .fetch_one(&mut self.connection)
            .await?
            .try_get::<bool, _>("released")?
        {}
        Ok(())
    }

    /// Takes the lease for `server_id` when it is free, lapsed, or its holder's session
    /// is gone (the row says the holder held the advisory lock and `holding_lock` says
    /// this session has it now). Bumps the fencing token; returns it, or `None` when
    /// someone else holds the lease.
    pub async fn acquire(
        &mut self,
        server_id: &str,
        ttl: std::time::Duration,
        holding_lock: bool,
    ) -> Result<Option<u64>, StoreError> {
        let sql = format!(
            "UPDATE leader_lease SET holder = $1, fencing_token = fencing_token + 1, \
             acquired_at = {DB_NOW}, expires_at = {DB_NOW} + $2, holder_locked = $3 \
             WHERE id = 1 AND (holder IS NULL OR expires_at < {DB_NOW} \
                               OR ($3 = 1 AND holder_locked = 1)) \
             RETURNING fencing_token"
        );
        let row = sqlx::query(&sql)
            .bind(server_id)
            .bind(millis(ttl))
            .bind(i64::from(holding_lock))
            .fetch_optional(&mut self.connection)
            .await?;
        Ok(row
            .map(|r| int(&r, "leader_lease", "fencing_token"))
            .transpose()?
            .map(|t| u64::try_from(t).unwrap_or(0)))
    }

    /// Extends the lease of term `token` by `ttl` from now; false when this server no
    /// longer holds it (another took over).
    pub async fn renew(
        &mut self,
        server_id: &str,
        token: u64,
        ttl: std::time::Duration,
        holding_lock: bool,
    ) -> Result<bool, StoreError> {
        let sql = format!(
            "UPDATE leader_lease SET expires_at = {DB_NOW} + $3, holder_locked = $4 \
             WHERE id = 1 AND holder = $1 AND fencing_token = $2"
        );
        let result = sqlx::query(&sql)
            .bind(server_id)
            .bind(i64::try_from(token).unwrap_or(i64::MAX))
            .bind(millis(ttl))
            .bind(i64::from(holding_lock))
            .execute(&mut self.connection)
            .await?;
        Ok(result.rows_affected() == 1)
    }

    /// Gives the lease of term `token` up, so another server takes over at once.
    pub async fn release(&mut self, server_id: &str, token: u64) -> Result<bool, StoreError> {
        let result = sqlx::query(
            "UPDATE leader_lease SET holder = NULL, expires_at = 0, holder_locked = 0 \
             WHERE id = 1 AND holder = $1 AND fencing_token = $2",
        )
        .bind(server_id)
        .bind(i64::try_from(token).unwrap_or(i64::MAX))
        .execute(&mut self.connection)
        .await?;
        Ok(result.rows_affected() == 1)
    }

    /// Closes the connection (dropping the advisory lock with it).
    pub async fn close(self) {
        let _ = self.connection.close().await;
    }
}
