//! The `worker_pools`, `pool_machines` and `pool_events` tables. The provider's
//! credentials are stored sealed (the caller seals and opens them). Every write the
//! provisioning leader makes carries its fence.

use std::collections::BTreeMap;

use gantry_types::{
    MachineState, PoolEvent, PoolMachine, PoolProvider, Timestamp, WorkerPool, WorkerState,
};
use serde::{Deserialize, Serialize};
use sqlx::any::AnyRow;
use sqlx::Row;

use crate::fence::Fence;
use crate::rows::{int, json, opt_int, opt_text, parse_enum, text, to_json, u32_of};
use crate::{Store, StoreError};

/// How many events a pool keeps; older ones are dropped as new ones come.
const EVENTS_KEPT: i64 = 200;

/// What a pool's machines are: the fields kept as one JSON column.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolSpec {
    pub instance_type: String,
    pub image: String,
    pub region: String,
    pub gpus: String,
    pub memory: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub scale_down_after: String,
    pub command: Option<String>,
    pub api_url: Option<String>,
}

/// A pool as stored: what the API shows (without machines), plus its sealed credentials.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredPool {
    pub pool: WorkerPool,
    pub credentials_sealed: Option<String>,
}

/// A machine as stored: what the API shows, plus when it is to be tried again.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredMachine {
    pub machine: PoolMachine,
    /// Failed attempts in a row at the provider.
    pub attempts: u32,
    /// Not before this time (ms) is the provider asked again.
    pub next_attempt_at: i64,
}

/// A pool to insert.
#[derive(Debug, Clone)]
pub struct NewPool<'a> {
    pub cluster_id: i64,
    pub name: &'a str,
    pub provider: PoolProvider,
    pub spec: &'a PoolSpec,
    pub min: u32,
    pub max: u32,
    pub credentials_sealed: Option<&'a str>,
}

const POOL_COLUMNS: &str = "id, cluster_id, name, provider, spec, min_machines, max_machines, \
     credentials_sealed, deleting, created_at, updated_at";
const MACHINE_COLUMNS: &str = "m.id, m.pool_id, m.name, m.state, m.state_message, m.external_id, \
     m.address, m.worker_id, w.state AS worker_state, m.idle_since, m.attempts, \
     m.next_attempt_at, m.created_at, m.updated_at";
const MACHINES_FROM: &str = "pool_machines m LEFT JOIN workers w ON w.id = m.worker_id";

fn decode_pool(row: &AnyRow) -> Result<StoredPool, StoreError> {
    const T: &str = "worker_pools";
    let spec: PoolSpec = json(row, T, "spec")?;
    let credentials_sealed = opt_text(row, T, "credentials_sealed")?;
    Ok(StoredPool {
        pool: WorkerPool {
            id: int(row, T, "id")?,
            cluster_id: int(row, T, "cluster_id")?,
            name: text(row, T, "name")?,
            provider: parse_enum(
                &text(row, T, "provider")?,
                PoolProvider::parse,
                T,
                "provider",
            )?,
            instance_type: spec.instance_type,
            image: spec.image,
            region: spec.region,
            gpus: spec.gpus,
            memory: spec.memory,
            labels: spec.labels,
            min: u32_of(int(row, T, "min_machines")?, T, "min_machines")?,
            max: u32_of(int(row, T, "max_machines")?, T, "max_machines")?,
            scale_down_after: spec.scale_down_after,
            command: spec.command,
            api_url: spec.api_url,
            has_credentials: credentials_sealed.is_some(),
            deleting: int(row, T, "deleting")? != 0,
            machines: Vec::new(),
            created_at: Timestamp::from_millis(int(row, T, "created_at")?),
            updated_at: Timestamp::from_millis(int(row, T, "updated_at")?),
        },
        credentials_sealed,
    })
}

fn decode_machine(row: &AnyRow) -> Result<StoredMachine, StoreError> {
    const T: &str = "pool_machines";
    let worker_state = match opt_text(row, T, "worker_state")? {
        Some(state) => Some(parse_enum(&state, WorkerState::parse, T, "worker_state")?),
        None => None,
    };
    Ok(StoredMachine {
        machine: PoolMachine {
            id: int(row, T, "id")?,
            pool_id: int(row, T, "pool_id")?,
            name: text(row, T, "name")?,
            state: parse_enum(&text(row, T, "state")?, MachineState::parse, T, "state")?,
            state_message: text(row, T, "state_message")?,
            external_id: opt_text(row, T, "external_id")?,
            address: opt_text(row, T, "address")?,
            worker_id: opt_int(row, T, "worker_id")?,
            worker_state,
            idle_since: opt_int(row, T, "idle_since")?.map(Timestamp::from_millis),
            created_at: Timestamp::from_millis(int(row, T, "created_at")?),
            updated_at: Timestamp::from_millis(int(row, T, "updated_at")?),
        },
        attempts: u32_of(int(row, T, "attempts")?, T, "attempts")?,
        next_attempt_at: int(row, T, "next_attempt_at")?,
    })
}

impl Store {
    /// Adds a pool to a cluster: `Conflict` when the name is taken, `NotFound` when the
    /// cluster is not there.
    pub async fn create_pool(&self, new: &NewPool<'_>) -> Result<StoredPool, StoreError> {
        let now = Timestamp::now().as_millis();
        let row = sqlx::query(&format!(
            "INSERT INTO worker_pools (cluster_id, name, provider, spec, min_machines, \
             max_machines, credentials_sealed, next_machine, deleting, created_at, updated_at) \
             SELECT $1, $2, $3, $4, $5, $6, $7, 1, 0, $8, $8 \
             WHERE EXISTS (SELECT 1 FROM clusters WHERE id = $1) RETURNING {POOL_COLUMNS}"
        ))
        .bind(new.cluster_id)
        .bind(new.name)
        .bind(new.provider.as_str())
        .bind(to_json(new.spec))
        .bind(i64::from(new.min))
        .bind(i64::from(new.max))
        .bind(new.credentials_sealed)
        .bind(now)
        .fetch_optional(&self.writes)
        .await
        .map_err(|e| StoreError::conflict_on_unique(e, "worker pool", new.name))?
        .ok_or_else(|| StoreError::not_found("cluster", new.cluster_id))?;
        decode_pool(&row)
    }

    pub async fn get_pool(&self, id: i64) -> Result<StoredPool, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {POOL_COLUMNS} FROM worker_pools WHERE id = $1"
        ))
        .bind(id)
        .fetch_optional(&self.reads)
        .await?
        .ok_or_else(|| StoreError::not_found("worker pool", id))?;
        decode_pool(&row)
    }

    /// The pools of a cluster, or of every cluster, by id.
    pub async fn list_pools(&self, cluster_id: Option<i64>) -> Result<Vec<StoredPool>, StoreError> {
        let rows = match cluster_id {
            Some(id) => {
                sqlx::query(&format!(
                    "SELECT {POOL_COLUMNS} FROM worker_pools WHERE cluster_id = $1 ORDER BY id"
                ))
                .bind(id)
                .fetch_all(&self.reads)
                .await?
            }
            None => {
                sqlx::query(&format!(
                    "SELECT {POOL_COLUMNS} FROM worker_pools ORDER BY id"
                ))
                .fetch_all(&self.reads)
                .await?
            }
        };
        rows.iter().map(decode_pool).collect()
    }

    /// Writes a pool's bounds, spec and credentials, if it is still as read at
    /// `read_at`: `Conflict` otherwise.
    pub async fn update_pool(
        &self,
        id: i64,
        read_at: Timestamp,
        spec: &PoolSpec,
        (min, max): (u32, u32),
        credentials_sealed: Option<&str>,
    ) -> Result<StoredPool, StoreError> {
        let now = Timestamp::now().as_millis().max(read_at.as_millis() + 1);
        let row = sqlx::query(&format!(
            "UPDATE worker_pools SET spec = $2, min_machines = $3, max_machines = $4, \
             credentials_sealed = $5, updated_at = $6 WHERE id = $1 AND updated_at = $7 \
             AND deleting = 0 RETURNING {POOL_COLUMNS}"
        ))
        .bind(id)
        .bind(to_json(spec))
        .bind(i64::from(min))
        .bind(i64::from(max))
        .bind(credentials_sealed)
        .bind(now)
        .bind(read_at.as_millis())
        .fetch_optional(&self.writes)
        .await?;
        match row {
            Some(row) => decode_pool(&row),
            None => {
                self.get_pool(id).await?;
                Err(StoreError::Conflict {
                    resource: "worker pool",
                    key: format!(
                        "{id} (changed or deleted by another request meanwhile; read it again)"
                    ),
                })
            }
        }
    }

    /// Marks a pool deleted: the leader deletes its machines, then the pool.
    pub async fn mark_pool_deleting(&self, id: i64) -> Result<StoredPool, StoreError> {
        let row = sqlx::query(&format!(
            "UPDATE worker_pools SET deleting = 1, updated_at = $2 WHERE id = $1 \
             RETURNING {POOL_COLUMNS}"
        ))
        .bind(id)
        .bind(Timestamp::now().as_millis())
        .fetch_optional(&self.writes)
        .await?
        .ok_or_else(|| StoreError::not_found("worker pool", id))?;
        decode_pool(&row)
    }

    /// Removes a deleted pool once it has no machines left; false while it has.
    pub async fn remove_pool(&self, id: i64, fence: &Fence) -> Result<bool, StoreError> {
        let mut tx = self.writes.begin().await?;
        self.check_fence_in(&mut tx, fence).await?;
        let result = sqlx::query(
            "DELETE FROM worker_pools WHERE id = $1 AND deleting = 1 \
             AND NOT EXISTS (SELECT 1 FROM pool_machines WHERE pool_id = $1)",
        )
        .bind(id)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(result.rows_affected() == 1)
    }

    /// The machines of a pool (every pool's with `None`), by id.
    pub async fn pool_machines(
        &self,
        pool_id: Option<i64>,
    ) -> Result<Vec<StoredMachine>, StoreError> {
        let rows = match pool_id {
            Some(id) => {
                sqlx::query(&format!(
                "SELECT {MACHINE_COLUMNS} FROM {MACHINES_FROM} WHERE m.pool_id = $1 ORDER BY m.id"
            ))
                .bind(id)
                .fetch_all(&self.reads)
                .await?
            }
            None => {
                sqlx::query(&format!(
                    "SELECT {MACHINE_COLUMNS} FROM {MACHINES_FROM} ORDER BY m.id"
                ))
                .fetch_all(&self.reads)
                .await?
            }
        };
        rows.iter().map(decode_machine).collect()
    }

    /// Adds a machine to a pool in state `provisioning`, named `<pool>-<n>` with the
    /// pool's next number, which moves on in the same transaction.
    pub async fn add_pool_machine(
        &self,
        pool_id: i64,
        message: &str,
        fence: &Fence,
    ) -> Result<StoredMachine, StoreError> {
        let now = Timestamp::now().as_millis();
        let mut tx = self.writes.begin().await?;
        self.check_fence_in(&mut tx, fence).await?;
        let row = sqlx::query(
            "UPDATE worker_pools SET next_machine = next_machine + 1 \
             WHERE id = $1 AND deleting = 0 RETURNING name, next_machine",
        )
        .bind(pool_id)
        .fetch_optional(&mut *tx)
        .await?
        .ok_or_else(|| StoreError::not_found("worker pool", pool_id))?;
        let name = format!(
            "{}-{}",
            text(&row, "worker_pools", "name")?,
            int(&row, "worker_pools", "next_machine")? - 1
        );
        let id: i64 = sqlx::query(
            "INSERT INTO pool_machines (pool_id, name, state, state_message, attempts, \
             next_attempt_at, created_at, updated_at) \
             VALUES ($1, $2, 'provisioning', $3, 0, 0, $4, $4) RETURNING id",
        )
        .bind(pool_id)
        .bind(&name)
        .bind(message)
        .bind(now)
        .fetch_one(&mut *tx)
        .await
        .map_err(|e| StoreError::conflict_on_unique(e, "pool machine", &name))?
        .try_get("id")?;
        let row = sqlx::query(&format!(
            "SELECT {MACHINE_COLUMNS} FROM {MACHINES_FROM} WHERE m.id = $1"
        ))
        .bind(id)
        .fetch_one(&mut *tx)
        .await?;
        let machine = decode_machine(&row)?;
        tx.commit().await?;
        Ok(machine)
    }

    /// Writes a machine's state and what is known of it.
    pub async fn write_pool_machine(
        &self,
        machine: &StoredMachine,
        fence: &Fence,
    ) -> Result<(), StoreError> {
        let m = &machine.machine;
        let mut tx = self.writes.begin().await?;
        self.check_fence_in(&mut tx, fence).await?;
        sqlx::query(
            "UPDATE pool_machines SET state = $2, state_message = $3, external_id = $4, \
             address = $5, worker_id = $6, idle_since = $7, attempts = $8, \
             next_attempt_at = $9, updated_at = $10 WHERE id = $1",
        )
        .bind(m.id)
        .bind(m.state.as_str())
        .bind(&m.state_message)
        .bind(m.external_id.as_deref())
        .bind(m.address.as_deref())
        .bind(m.worker_id)
        .bind(m.idle_since.map(Timestamp::as_millis))
        .bind(i64::from(machine.attempts))
        .bind(machine.next_attempt_at)
        .bind(Timestamp::now().as_millis())
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Forgets a machine the provider has deleted.
    pub async fn remove_pool_machine(&self, id: i64, fence: &Fence) -> Result<(), StoreError> {
        let mut tx = self.writes.begin().await?;
        self.check_fence_in(&mut tx, fence).await?;
        sqlx::query("DELETE FROM pool_machines WHERE id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Records a decision of a pool, keeping its latest [`EVENTS_KEPT`].
    pub async fn add_pool_event(
        &self,
        pool_id: i64,
        kind: &str,
        message: &str,
    ) -> Result<(), StoreError> {
        let mut tx = self.writes.begin().await?;
        sqlx::query("INSERT INTO pool_events (pool_id, at, kind, message) VALUES ($1, $2, $3, $4)")
            .bind(pool_id)
            .bind(Timestamp::now().as_millis())
            .bind(kind)
            .bind(message)
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "DELETE FROM pool_events WHERE pool_id = $1 AND id <= \
             (SELECT id FROM pool_events WHERE pool_id = $1 ORDER BY id DESC \
             LIMIT 1 OFFSET $2)",
        )
        .bind(pool_id)
        .bind(EVENTS_KEPT)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// A pool's latest events, newest first.
    pub async fn pool_events(
        &self,
        pool_id: i64,
        limit: u32,
    ) -> Result<Vec<PoolEvent>, StoreError> {
        const T: &str = "pool_events";
        let rows = sqlx::query(
            "SELECT id, pool_id, at, kind, message FROM pool_events WHERE pool_id = $1 \
             ORDER BY id DESC LIMIT $2",
        )
        .bind(pool_id)
        .bind(i64::from(limit))
        .fetch_all(&self.reads)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(PoolEvent {
                    id: int(row, T, "id")?,
                    pool_id: int(row, T, "pool_id")?,
                    at: Timestamp::from_millis(int(row, T, "at")?),
                    kind: text(row, T, "kind")?,
                    message: text(row, T, "message")?,
                })
            })
            .collect()
    }
}
