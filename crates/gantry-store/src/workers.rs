//! The `workers` table, and `worker_heartbeats` beside it.
//!
//! A heartbeat writes only the narrow `worker_heartbeats` row (worker id and time), never
//! the worker's own row with its GPU report: on PostgreSQL every update leaves a dead
//! copy of the row behind, and with thousands of workers heartbeating the wide rows' dead
//! copies would make every read of `workers` walk them. Reads join the two.

use std::collections::BTreeMap;

use gantry_types::{InstanceState, Timestamp, Worker, WorkerFilter, WorkerState, WorkerStatus};
use sqlx::any::AnyRow;

use crate::changes::{Change, ChangeKind};
use crate::fence::Fence;
use crate::query::{Listing, Page};
use crate::rows::{int, json, opt_int, parse_enum, text, to_json};
use crate::{Store, StoreError};

/// What a worker reports about itself when it registers.
#[derive(Debug, Clone, Copy)]
pub struct WorkerRegistration<'a> {
    pub labels: &'a BTreeMap<String, String>,
    /// `host:port` of the worker's own API.
    pub address: &'a str,
    pub status: &'a WorkerStatus,
}

/// A worker's columns, with its last heartbeat's time.
const COLUMNS: &str = "w.id, w.name, w.cluster_id, w.state, w.state_message, w.labels, w.address, \
     w.status, h.at AS last_heartbeat_at, w.created_at, w.updated_at";
/// `workers` with its heartbeat row.
const FROM: &str = "workers w LEFT JOIN worker_heartbeats h ON h.worker_id = w.id";
/// Records a heartbeat of worker `$1` at `$2`.
const UPSERT_HEARTBEAT: &str = "INSERT INTO worker_heartbeats (worker_id, at) VALUES ($1, $2) \
     ON CONFLICT (worker_id) DO UPDATE SET at = excluded.at";

fn decode(row: &AnyRow) -> Result<Worker, StoreError> {
    const T: &str = "workers";
    Ok(Worker {
        id: int(row, T, "id")?,
        name: text(row, T, "name")?,
        cluster_id: int(row, T, "cluster_id")?,
        state: parse_enum(&text(row, T, "state")?, WorkerState::parse, T, "state")?,
        state_message: text(row, T, "state_message")?,
        labels: json(row, T, "labels")?,
        address: text(row, T, "address")?,
        status: json(row, T, "status")?,
        last_heartbeat_at: opt_int(row, T, "last_heartbeat_at")?.map(Timestamp::from_millis),
        created_at: Timestamp::from_millis(int(row, T, "created_at")?),
        updated_at: Timestamp::from_millis(int(row, T, "updated_at")?),
    })
}

/// How the `workers` list reads.
pub(crate) const LISTING: Listing<Worker> = Listing {
    columns: COLUMNS,
    from: FROM,
    count_from: "workers w",
    alias: Some("w"),
    order_by: "w.id",
    decode,
    id_of: |item| item.id,
};

/// Workers as last read, by id, so that a heartbeat (a write of the heartbeat row only)
/// can answer with its worker without reading it back: a read per heartbeat would be a
/// large share of the server's work with a large fleet. A worker is forgotten whenever a
/// change of it is published, on this server or (on PostgreSQL) heard from another; a
/// read that began before such a change is not kept.
#[derive(Debug, Default)]
pub(crate) struct WorkerRows {
    inner: std::sync::Mutex<WorkerRowsInner>,
}

#[derive(Debug, Default)]
struct WorkerRowsInner {
    rows: std::collections::HashMap<i64, Worker>,
    /// How many times each worker was forgotten.
    epochs: std::collections::HashMap<i64, u64>,
}

impl WorkerRows {
    fn lock(&self) -> std::sync::MutexGuard<'_, WorkerRowsInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn get(&self, id: i64) -> Option<Worker> {
        self.lock().rows.get(&id).cloned()
    }

    /// Call before reading the worker; pass the result to [`Self::keep`].
    fn epoch(&self, id: i64) -> u64 {
        self.lock().epochs.get(&id).copied().unwrap_or(0)
    }

    /// Keeps what was read, unless the worker changed since `epoch`.
    fn keep(&self, epoch: u64, worker: Worker) {
        let mut inner = self.lock();
        if inner.epochs.get(&worker.id).copied().unwrap_or(0) == epoch {
            inner.rows.insert(worker.id, worker);
        }
    }

    pub(crate) fn forget(&self, id: i64) {
        let mut inner = self.lock();
        inner.rows.remove(&id);
        *inner.epochs.entry(id).or_default() += 1;
    }
}

/// The workers of `ids` that exist, in no particular order, read on `connection` (inside
/// a transaction, to see its own writes).
async fn by_ids(
    connection: &mut sqlx::AnyConnection,
    ids: &[i64],
) -> Result<Vec<Worker>, StoreError> {
    let select = format!("SELECT {COLUMNS} FROM {FROM} WHERE w.id IN");
    crate::query::by_ids(connection, &select, ids, decode).await
}

impl Store {
    /// Inserts a worker of the default cluster in state `ready`; `Conflict` if the name is
    /// taken. `credential_digest` identifies the worker's calls.
    pub async fn create_worker(
        &self,
        name: &str,
        labels: &BTreeMap<String, String>,
        address: &str,
        status: &WorkerStatus,
        credential_digest: &str,
    ) -> Result<Worker, StoreError> {
        let registration = WorkerRegistration {
            labels,
            address,
            status,
        };
        self.register_worker(
            gantry_types::DEFAULT_CLUSTER_ID,
            name,
            &registration,
            credential_digest,
            "",
        )
        .await
    }

    /// Inserts a worker of cluster `cluster_id` in state `ready`: `Conflict` if the name is
    /// taken, `NotFound` when the cluster is not there. `api_token` is what servers present
    /// when they call the worker's own HTTP API (its logs).
    pub async fn register_worker(
        &self,
        cluster_id: i64,
        name: &str,
        registration: &WorkerRegistration<'_>,
        credential_digest: &str,
        api_token: &str,
    ) -> Result<Worker, StoreError> {
        let now = Timestamp::now().as_millis();
        let mut tx = self.writes.begin().await?;
        let row = sqlx::query(
            "INSERT INTO workers (name, cluster_id, state, state_message, labels, address, \
             status, credential_digest, api_token, created_at, updated_at) \
             SELECT $1, $8, 'ready', '', $2, $3, $4, $5, $6, $7, $7 \
             WHERE EXISTS (SELECT 1 FROM clusters WHERE id = $8) RETURNING id",
        )
        .bind(name)
        .bind(to_json(registration.labels))
        .bind(registration.address)
        .bind(to_json(registration.status))
        .bind(credential_digest)
        .bind(api_token)
        .bind(now)
        .bind(cluster_id)
        .fetch_optional(&mut *tx)
        .await
        .map_err(|e| StoreError::conflict_on_unique(e, "worker", name))?
        .ok_or_else(|| StoreError::not_found("cluster", cluster_id))?;
        let id = int(&row, "workers", "id")?;
        sqlx::query(UPSERT_HEARTBEAT)
            .bind(id)
            .bind(now)
            .execute(&mut *tx)
            .await?;
        let worker = by_ids(&mut tx, &[id])
            .await?
            .pop()
            .ok_or_else(|| StoreError::not_found("worker", id))?;
        tx.commit().await?;
        self.publish(Change::Worker(ChangeKind::Created, worker.clone()));
        Ok(worker)
    }

    pub async fn get_worker(&self, id: i64) -> Result<Worker, StoreError> {
        let row = sqlx::query(&format!("SELECT {COLUMNS} FROM {FROM} WHERE w.id = $1"))
            .bind(id)
            .fetch_optional(&self.reads)
            .await?
            .ok_or_else(|| StoreError::not_found("worker", id))?;
        decode(&row)
    }

    pub async fn get_worker_by_name(&self, name: &str) -> Result<Worker, StoreError> {
        let row = sqlx::query(&format!("SELECT {COLUMNS} FROM {FROM} WHERE w.name = $1"))
            .bind(name)
            .fetch_optional(&self.reads)
            .await?
            .ok_or_else(|| StoreError::not_found("worker", name))?;
        decode(&row)
    }

    /// The worker whose credential has this digest.
    pub async fn worker_by_credential(&self, digest: &str) -> Result<Worker, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {COLUMNS} FROM {FROM} WHERE w.credential_digest = $1"
        ))
        .bind(digest)
        .fetch_optional(&self.reads)
        .await?
        .ok_or_else(|| StoreError::not_found("worker", "with that credential"))?;
        decode(&row)
    }

    pub async fn list_workers(
        &self,
        filter: &WorkerFilter,
        page: Page,
    ) -> Result<(Vec<Worker>, u64), StoreError> {
        self.list_page(&LISTING, filter, page).await
    }

    /// Replaces a worker's labels.
    pub async fn set_worker_labels(
        &self,
        id: i64,
        labels: &BTreeMap<String, String>,
    ) -> Result<Worker, StoreError> {
        self.set_worker_json(id, "labels", to_json(labels)).await
    }

    /// Sets one JSON column of a worker (a trusted column name) and its `updated_at`.
    async fn set_worker_json(
        &self,
        id: i64,
        column: &'static str,
        value: String,
    ) -> Result<Worker, StoreError> {
        let sql =
            format!("UPDATE workers SET {column} = $2, updated_at = $3 WHERE id = $1 RETURNING id");
        let statement = sqlx::query(&sql)
            .bind(id)
            .bind(value)
            .bind(Timestamp::now().as_millis());
        self.write_worker(statement, None, true)
            .await?
            .ok_or_else(|| StoreError::not_found("worker", id))
    }

    /// Updates what a registering worker reports about itself (a re-registration) and
    /// counts it as a heartbeat. The state moves to `state` only while it is still
    /// `expected` (the caller decided from it); `None` when it moved meanwhile.
    pub async fn update_worker_registration(
        &self,
        id: i64,
        registration: &WorkerRegistration<'_>,
        expected: WorkerState,
        state: (WorkerState, &str),
    ) -> Result<Option<Worker>, StoreError> {
        let now = Timestamp::now().as_millis();
        let sql = "UPDATE workers SET labels = $2, address = $3, status = $4, updated_at = $5, \
             state = $6, state_message = $7 WHERE id = $1 AND state = $8 RETURNING id";
        let statement = sqlx::query(sql)
            .bind(id)
            .bind(to_json(registration.labels))
            .bind(registration.address)
            .bind(to_json(registration.status))
            .bind(now)
            .bind(state.0.as_str())
            .bind(state.1)
            .bind(expected.as_str());
        self.write_worker(statement, Some(now), true).await
    }

    /// The token servers present to the worker's own API.
    pub async fn worker_api_token(&self, id: i64) -> Result<String, StoreError> {
        let row = sqlx::query("SELECT api_token FROM workers WHERE id = $1")
            .bind(id)
            .fetch_optional(&self.reads)
            .await?
            .ok_or_else(|| StoreError::not_found("worker", id))?;
        text(&row, "workers", "api_token")
    }

    /// Records a heartbeat, and sets the worker's state and message to `state` while its
    /// state is still `expected` (the caller decided from it); `None` when the state moved
    /// meanwhile. A caller keeping the state passes the current message. Publishes a
    /// change only when the state moved, so watchers are not woken every heartbeat.
    pub async fn record_heartbeat(
        &self,
        id: i64,
        expected: WorkerState,
        state: (WorkerState, &str),
    ) -> Result<Option<Worker>, StoreError> {
        let now = Timestamp::now().as_millis();
        let moves = state.0 != expected;
        let statement = sqlx::query(
            "UPDATE workers SET state = $2, state_message = $3 WHERE id = $1 AND state = $4 \
             RETURNING id",
        )
        .bind(id)
        .bind(state.0.as_str())
        .bind(state.1)
        .bind(expected.as_str());
        self.write_worker(statement, Some(now), moves).await
    }

    /// Records a heartbeat of a worker that is `ready` and stays so: one statement, no
    /// change published. `None` when the worker is not `ready` (or does not exist); the
    /// caller then decides its state with [`Store::record_heartbeat`].
    ///
    /// On PostgreSQL the worker's row is share-locked (`FOR KEY SHARE`) while the
    /// heartbeat is written, against [`Store::mark_silent_workers`]: that locks the rows
    /// of the workers it is about to mark before it reads their heartbeats again, so a
    /// heartbeat either commits before that read (and the worker is not marked) or waits
    /// for the marking to commit and then finds the worker no longer `ready`. Without
    /// the lock a worker could be marked `not_ready` by a pass that read its heartbeat
    /// time just before a heartbeat landed, and stay so for an interval although it
    /// had just been heard from.
    pub async fn record_heartbeat_of_ready(&self, id: i64) -> Result<Option<Worker>, StoreError> {
        let now = Timestamp::now().as_millis();
        let lock = if self.engine == crate::Engine::Postgres {
            " FOR KEY SHARE"
        } else {
            ""
        };
        self.write_priority.yield_to_leader().await;
        let written = sqlx::query(&format!(
            "UPDATE worker_heartbeats SET at = $2 WHERE worker_id = $1 \
             AND EXISTS (SELECT 1 FROM workers WHERE id = $1 AND state = 'ready'{lock})"
        ))
        .bind(id)
        .bind(now)
        .execute(&self.writes)
        .await?
        .rows_affected();
        if written == 0 {
            return Ok(None);
        }
        // The answer: the worker as last read, unless it changed since (every change
        // of a worker is published, and forgets it here).
        let epoch = self.worker_rows.epoch(id);
        if let Some(mut worker) = self.worker_rows.get(id) {
            worker.last_heartbeat_at = Some(Timestamp::from_millis(now));
            return Ok(Some(worker));
        }
        let worker = self.find_worker(id).await?;
        if let Some(worker) = &worker {
            self.worker_rows.keep(epoch, worker.clone());
        }
        Ok(worker)
    }

    /// The worker, `None` when there is none with that id.
    async fn find_worker(&self, id: i64) -> Result<Option<Worker>, StoreError> {
        match self.get_worker(id).await {
            Ok(worker) => Ok(Some(worker)),
            Err(StoreError::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Stores a worker's hardware report.
    pub async fn set_worker_status(
        &self,
        id: i64,
        status: &WorkerStatus,
    ) -> Result<Worker, StoreError> {
        self.set_worker_json(id, "status", to_json(status)).await
    }

    /// Sets a worker's state by hand or on its way out (a worker shutting down).
    pub async fn set_worker_state(
        &self,
        id: i64,
        state: WorkerState,
        message: &str,
    ) -> Result<Worker, StoreError> {
        let statement = sqlx::query(
            "UPDATE workers SET state = $2, state_message = $3, updated_at = $4 WHERE id = $1 \
             RETURNING id",
        )
        .bind(id)
        .bind(state.as_str())
        .bind(message)
        .bind(Timestamp::now().as_millis());
        self.write_worker(statement, None, true)
            .await?
            .ok_or_else(|| StoreError::not_found("worker", id))
    }

    /// Runs an `UPDATE workers … RETURNING id` of one worker and, with `heard_at`, records
    /// a heartbeat at that time in the same transaction: `None` when the update matched
    /// no row, else the worker as written, published when `publish`.
    async fn write_worker<'q>(
        &self,
        statement: sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>>,
        heard_at: Option<i64>,
        publish: bool,
    ) -> Result<Option<Worker>, StoreError> {
        let mut tx = self.writes.begin().await?;
        let Some(row) = statement.fetch_optional(&mut *tx).await? else {
            return Ok(None);
        };
        let id = int(&row, "workers", "id")?;
        if let Some(at) = heard_at {
            sqlx::query(UPSERT_HEARTBEAT)
                .bind(id)
                .bind(at)
                .execute(&mut *tx)
                .await?;
        }
        let Some(worker) = by_ids(&mut tx, &[id]).await?.pop() else {
            return Ok(None);
        };
        tx.commit().await?;
        if publish {
            self.publish(Change::Worker(ChangeKind::Updated, worker.clone()));
        }
        Ok(Some(worker))
    }

    /// Moves workers whose last heartbeat is older than `not_ready_before` to
    /// `not_ready`, and older than `unreachable_before` to `unreachable`; instances on
    /// an unreachable worker that were scheduled, starting or running become
    /// `unreachable` too. Workers in maintenance are left alone. Returns the workers
    /// whose state changed.
    pub async fn mark_silent_workers(
        &self,
        not_ready_before: Timestamp,
        unreachable_before: Timestamp,
        fence: &Fence,
    ) -> Result<Vec<Worker>, StoreError> {
        let now = Timestamp::now().as_millis();
        let mut tx = self.writes.begin().await?;
        self.check_fence_in(&mut tx, fence).await?;
        if self.engine == crate::Engine::Postgres {
            // The rows of the workers that look silent are locked first; the statements
            // below then read the heartbeats afresh (each statement has its snapshot).
            // A heartbeat that has not committed by then waits for this transaction
            // (see `record_heartbeat_of_ready`), so none lands unseen between the read
            // of its time and the marking. (SQLite writes one statement at a time.)
            sqlx::query(
                "SELECT id FROM workers WHERE state IN ('ready', 'not_ready') \
                 AND id IN (SELECT worker_id FROM worker_heartbeats WHERE at < $1) \
                 ORDER BY id FOR UPDATE",
            )
            .bind(not_ready_before.as_millis())
            .fetch_all(&mut *tx)
            .await?;
        }
        let unreachable = sqlx::query(
            "UPDATE workers SET state = 'unreachable', state_message = $2, updated_at = $3 \
             WHERE state IN ('ready', 'not_ready') \
             AND id IN (SELECT worker_id FROM worker_heartbeats WHERE at < $1) RETURNING id",
        )
        .bind(unreachable_before.as_millis())
        .bind("no heartbeat for longer than server_timeout")
        .bind(now)
        .fetch_all(&mut *tx)
        .await?;
        let not_ready = sqlx::query(
            "UPDATE workers SET state = 'not_ready', state_message = $2, updated_at = $3 \
             WHERE state = 'ready' \
             AND id IN (SELECT worker_id FROM worker_heartbeats WHERE at < $1) RETURNING id",
        )
        .bind(not_ready_before.as_millis())
        .bind("missed 3 heartbeats")
        .bind(now)
        .fetch_all(&mut *tx)
        .await?;
        let ids: Vec<i64> = unreachable
            .iter()
            .chain(not_ready.iter())
            .map(|row| int(row, "workers", "id"))
            .collect::<Result<_, _>>()?;
        let mut changed = by_ids(&mut tx, &ids).await?;
        let mut lost_instances = Vec::new();
        for worker in changed
            .iter()
            .filter(|w| w.state == WorkerState::Unreachable)
        {
            let rows = sqlx::query(
                "UPDATE model_instances SET state = 'unreachable', state_message = $2, updated_at = $3 \
                 WHERE worker_id = $1 AND state IN ('scheduled', 'downloading', 'starting', 'running') RETURNING id",
            )
            .bind(worker.id)
            .bind(format!("worker {} is unreachable", worker.name))
            .bind(now)
            .fetch_all(&mut *tx)
            .await?;
            for row in rows {
                lost_instances.push(int(&row, "model_instances", "id")?);
            }
        }
        tx.commit().await?;
        changed.sort_by_key(|w| w.id);
        for worker in &changed {
            self.publish(Change::Worker(ChangeKind::Updated, worker.clone()));
        }
        for id in lost_instances {
            if let Ok(instance) = self.get_instance(id).await {
                self.publish(Change::Instance(ChangeKind::Updated, instance));
            }
        }
        Ok(changed)
    }

    /// Deletes a worker. Instances placed on it lose their placement and go back to
    /// `pending`, so the scheduler places them elsewhere.
    pub async fn delete_worker(&self, id: i64) -> Result<Worker, StoreError> {
        let worker = self.get_worker(id).await?;
        let mut tx = self.writes.begin().await?;
        let placed: Vec<i64> = sqlx::query("SELECT id FROM model_instances WHERE worker_id = $1")
            .bind(id)
            .fetch_all(&mut *tx)
            .await?
            .iter()
            .map(|r| int(r, "model_instances", "id"))
            .collect::<Result<_, _>>()?;
        sqlx::query(
            "UPDATE model_instances SET worker_id = NULL, gpu_indexes = '[]', port = NULL, \
             address = NULL, state = $2, state_message = $3, placement = NULL, \
             restart_count = 0, updated_at = $4 WHERE worker_id = $1",
        )
        .bind(id)
        .bind(InstanceState::Pending.as_str())
        .bind(format!("worker {} was deleted", worker.name))
        .bind(Timestamp::now().as_millis())
        .execute(&mut *tx)
        .await?;
        let result = sqlx::query("DELETE FROM workers WHERE id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        if result.rows_affected() == 0 {
            return Err(StoreError::not_found("worker", id));
        }
        tx.commit().await?;
        for instance_id in placed {
            if let Ok(instance) = self.get_instance(instance_id).await {
                self.publish(Change::Instance(ChangeKind::Updated, instance));
            }
        }
        self.publish(Change::Worker(ChangeKind::Deleted, worker.clone()));
        Ok(worker)
    }
}

#[cfg(test)]
mod tests {
    use gantry_types::fixtures;

    use super::*;

    #[test]
    fn a_worker_read_before_a_change_is_not_kept() {
        let rows = WorkerRows::default();
        let epoch = rows.epoch(1);
        rows.keep(epoch, fixtures::worker(1, 2));
        assert_eq!(rows.get(1).map(|w| w.id), Some(1));

        // A change forgets it; a read that began before the change is not kept.
        let before = rows.epoch(1);
        rows.forget(1);
        assert!(rows.get(1).is_none());
        rows.keep(before, fixtures::worker(1, 2));
        assert!(
            rows.get(1).is_none(),
            "kept a worker read before it changed"
        );

        // A read after the change is.
        let after = rows.epoch(1);
        rows.keep(after, fixtures::worker(1, 4));
        assert_eq!(rows.get(1).map(|w| w.status.gpus.len()), Some(4));
    }
}
