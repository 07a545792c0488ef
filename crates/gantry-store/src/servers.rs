//! The server registry: one row per running gantry server, refreshed by its heartbeat.
//!
//! A row carries the process's `incarnation` (random per start) so a server can tell its
//! own row from another process's with the same `server_id`, and on PostgreSQL the
//! backend pid of the server's leader session, so a server killed with `kill -9` does not
//! block its own restart until `server_timeout` passes: its session is gone at once.

use gantry_types::{ServerLoad, ServerRole, Timestamp};

use crate::rows::{int, opt_int, parse_enum, text};
use crate::{Engine, Store, StoreError};

/// A registry row as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerRecord {
    pub server_id: String,
    pub url: String,
    pub version: String,
    pub role: ServerRole,
    pub started_at: Timestamp,
    pub last_heartbeat_at: Timestamp,
    pub load: ServerLoad,
    pub incarnation: String,
}

/// A server announcing itself.
#[derive(Debug, Clone)]
pub struct ServerRegistration<'a> {
    pub server_id: &'a str,
    pub url: &'a str,
    pub version: &'a str,
    pub incarnation: &'a str,
    /// The backend pid of the server's leader session (PostgreSQL), if it has one.
    pub session_pid: Option<i64>,
}

const COLUMNS: &str = "server_id, url, version, role, started_at, last_heartbeat_at, \
                       inflight_requests, connected_workers, incarnation";

fn decode(row: &sqlx::any::AnyRow) -> Result<ServerRecord, StoreError> {
    const T: &str = "servers";
    let count = |column| int(row, T, column).map(|v| u64::try_from(v).unwrap_or(0));
    Ok(ServerRecord {
        server_id: text(row, T, "server_id")?,
        url: text(row, T, "url")?,
        version: text(row, T, "version")?,
        role: parse_enum(&text(row, T, "role")?, ServerRole::parse, T, "role")?,
        started_at: Timestamp::from_millis(int(row, T, "started_at")?),
        last_heartbeat_at: Timestamp::from_millis(int(row, T, "last_heartbeat_at")?),
        load: ServerLoad {
            inflight_requests: count("inflight_requests")?,
            connected_workers: count("connected_workers")?,
        },
        incarnation: text(row, T, "incarnation")?,
    })
}

/// Why a registration was refused.
#[derive(Debug, Clone, PartialEq)]
pub enum RegistryConflict {
    /// Another live process runs with this `server_id`.
    Duplicate(ServerRecord),
}

/// The first key of the advisory lock taken per server id while registering (the two-key
/// form, so it never meets the leader's one-key lock).
const REGISTER_LOCK_CLASS: i32 = 7_251_002;

impl Store {
    /// Adds or replaces this server's row, unless another live process holds the id: a
    /// row of another incarnation whose heartbeat is newer than `live_after` and (on
    /// PostgreSQL) whose session is still connected.
    pub async fn register_server(
        &self,
        registration: &ServerRegistration<'_>,
        now: Timestamp,
        live_after: Timestamp,
    ) -> Result<Result<ServerRecord, RegistryConflict>, StoreError> {
        let mut tx = self.writes.begin().await?;
        if self.engine == Engine::Postgres {
            // Two processes registering one id at once take turns: the second reads the
            // first one's row and is refused, instead of both reading "free".
            sqlx::query("SELECT pg_advisory_xact_lock($1, hashtext($2))")
                .bind(REGISTER_LOCK_CLASS)
                .bind(registration.server_id)
                .execute(&mut *tx)
                .await?;
        }
        let existing = sqlx::query(&format!(
            "SELECT {COLUMNS}, session_pid FROM servers WHERE server_id = $1"
        ))
        .bind(registration.server_id)
        .fetch_optional(&mut *tx)
        .await?;
        if let Some(row) = existing {
            let record = decode(&row)?;
            let session_pid = opt_int(&row, "servers", "session_pid")?;
            let mut live = record.incarnation != registration.incarnation
                && record.last_heartbeat_at > live_after;
            if live {
                if let Some(pid) = session_pid {
                    live = self.session_alive(pid).await?;
                }
            }
            if live {
                return Ok(Err(RegistryConflict::Duplicate(record)));
            }
        }
        let row = sqlx::query(&format!(
            "INSERT INTO servers (server_id, url, version, role, started_at, last_heartbeat_at, \
                 inflight_requests, connected_workers, incarnation, session_pid) \
             VALUES ($1, $2, $3, 'standby', $4, $4, 0, 0, $5, $6) \
             ON CONFLICT (server_id) DO UPDATE SET url = excluded.url, \
                 version = excluded.version, role = excluded.role, \
                 started_at = excluded.started_at, last_heartbeat_at = excluded.last_heartbeat_at, \
                 inflight_requests = 0, connected_workers = 0, \
                 incarnation = excluded.incarnation, session_pid = excluded.session_pid \
             RETURNING {COLUMNS}"
        ))
        .bind(registration.server_id)
        .bind(registration.url)
        .bind(registration.version)
        .bind(now.as_millis())
        .bind(registration.incarnation)
        .bind(registration.session_pid)
        .fetch_one(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Ok(decode(&row)?))
    }

    /// Refreshes a server's heartbeat, role, load and (when given) session pid; `None`
    /// when its row is gone (unregistered) or belongs to another incarnation
    /// (`incarnation` given).
    pub async fn server_heartbeat(
        &self,
        server_id: &str,
        incarnation: Option<&str>,
        role: Option<ServerRole>,
        load: ServerLoad,
        session_pid: Option<i64>,
        now: Timestamp,
    ) -> Result<Option<ServerRecord>, StoreError> {
        let count = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        let row = sqlx::query(&format!(
            "UPDATE servers SET last_heartbeat_at = $2, role = COALESCE($3, role), \
                 inflight_requests = $4, connected_workers = $5, \
                 session_pid = COALESCE($7, session_pid) \
             WHERE server_id = $1 AND ($6 IS NULL OR incarnation = $6) RETURNING {COLUMNS}"
        ))
        .bind(server_id)
        .bind(now.as_millis())
        .bind(role.map(ServerRole::as_str))
        .bind(count(load.inflight_requests))
        .bind(count(load.connected_workers))
        .bind(incarnation)
        .bind(session_pid)
        .fetch_optional(&self.writes)
        .await?;
        row.as_ref().map(decode).transpose()
    }

    /// Whether the server `server_id` is certainly gone: not registered, or (PostgreSQL)
    /// its registered session has ended — a `kill -9` shows at once, without waiting for
    /// its heartbeat to age.
    pub async fn server_is_gone(&self, server_id: &str) -> Result<bool, StoreError> {
        let row = sqlx::query("SELECT session_pid FROM servers WHERE server_id = $1")
            .bind(server_id)
            .fetch_optional(&self.reads)
            .await?;
        let Some(row) = row else {
            return Ok(true);
        };
        let Some(pid) = opt_int(&row, "servers", "session_pid")? else {
            return Ok(false);
        };
        Ok(!self.session_alive(pid).await?)
    }

    /// Whether the database session with backend pid `pid` is still connected (always
    /// true on SQLite, which has no sessions to tell apart).
    async fn session_alive(&self, pid: i64) -> Result<bool, StoreError> {
        if self.engine != Engine::Postgres {
            return Ok(true);
        }
        let row =
            sqlx::query("SELECT 1 AS alive FROM pg_stat_activity WHERE pid = CAST($1 AS INTEGER)")
                .bind(pid)
                .fetch_optional(&self.reads)
                .await?;
        Ok(row.is_some())
    }

    /// Removes a server from the registry; false when it was not there. With
    /// `incarnation`, only that process's row.
    pub async fn unregister_server(
        &self,
        server_id: &str,
        incarnation: Option<&str>,
    ) -> Result<bool, StoreError> {
        let result = sqlx::query(
            "DELETE FROM servers WHERE server_id = $1 AND ($2 IS NULL OR incarnation = $2)",
        )
        .bind(server_id)
        .bind(incarnation)
        .execute(&self.writes)
        .await?;
        Ok(result.rows_affected() == 1)
    }

    /// Every registered server, by id.
    pub async fn list_servers(&self) -> Result<Vec<ServerRecord>, StoreError> {
        let rows = sqlx::query(&format!("SELECT {COLUMNS} FROM servers ORDER BY server_id"))
            .fetch_all(&self.reads)
            .await?;
        rows.iter().map(decode).collect()
    }

    /// Removes the rows of servers silent since before `before` (long gone: a restart
    /// with the same id would replace its row anyway); returns how many.
    pub async fn forget_servers_silent_since(&self, before: Timestamp) -> Result<u64, StoreError> {
        let result = sqlx::query("DELETE FROM servers WHERE last_heartbeat_at < $1")
            .bind(before.as_millis())
            .execute(&self.writes)
            .await?;
        Ok(result.rows_affected())
    }
}
