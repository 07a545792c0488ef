//! The `workers` table.

use std::collections::BTreeMap;

use gantry_types::{InstanceState, Timestamp, Worker, WorkerState, WorkerStatus};
use sqlx::any::AnyRow;

use crate::changes::{Change, ChangeKind};
use crate::query::{Arg, Filter, Page};
use crate::rows::{int, json, opt_int, parse_enum, text, to_json};
use crate::{Store, StoreError};

/// List filters for workers.
#[derive(Debug, Clone, Default)]
pub struct WorkerFilter {
    pub state: Option<WorkerState>,
    pub name: Option<String>,
}

const COLUMNS: &str =
    "id, name, state, state_message, labels, address, status, last_heartbeat_at, created_at, updated_at";

fn decode(row: &AnyRow) -> Result<Worker, StoreError> {
    const T: &str = "workers";
    Ok(Worker {
        id: int(row, T, "id")?,
        name: text(row, T, "name")?,
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

impl Store {
    /// Inserts a worker in state `ready`; `Conflict` if the name is taken.
    pub async fn create_worker(
        &self,
        name: &str,
        labels: &BTreeMap<String, String>,
        address: &str,
        status: &WorkerStatus,
        credential_digest: &str,
    ) -> Result<Worker, StoreError> {
        let now = Timestamp::now().as_millis();
        let row = sqlx::query(&format!(
            "INSERT INTO workers (name, state, state_message, labels, address, status, \
             credential_digest, last_heartbeat_at, created_at, updated_at) \
             VALUES ($1, 'ready', '', $2, $3, $4, $5, $6, $6, $6) RETURNING {COLUMNS}"
        ))
        .bind(name)
        .bind(to_json(labels))
        .bind(address)
        .bind(to_json(status))
        .bind(credential_digest)
        .bind(now)
        .fetch_one(&self.pool)
        .await
        .map_err(|e| StoreError::conflict_on_unique(e, "worker", name))?;
        let worker = decode(&row)?;
        self.publish(Change::Worker(ChangeKind::Created, worker.clone()));
        Ok(worker)
    }

    pub async fn get_worker(&self, id: i64) -> Result<Worker, StoreError> {
        let row = sqlx::query(&format!("SELECT {COLUMNS} FROM workers WHERE id = $1"))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?
            .ok_or_else(|| StoreError::not_found("worker", id))?;
        decode(&row)
    }

    pub async fn get_worker_by_name(&self, name: &str) -> Result<Worker, StoreError> {
        let row = sqlx::query(&format!("SELECT {COLUMNS} FROM workers WHERE name = $1"))
            .bind(name)
            .fetch_optional(&self.pool)
            .await?
            .ok_or_else(|| StoreError::not_found("worker", name))?;
        decode(&row)
    }

    /// The worker whose credential has this digest.
    pub async fn worker_by_credential(&self, digest: &str) -> Result<Worker, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {COLUMNS} FROM workers WHERE credential_digest = $1"
        ))
        .bind(digest)
        .fetch_optional(&self.pool)
        .await?
        .ok_or_else(|| StoreError::not_found("worker", "with that credential"))?;
        decode(&row)
    }

    pub async fn list_workers(
        &self,
        filter: &WorkerFilter,
        page: Page,
    ) -> Result<(Vec<Worker>, u64), StoreError> {
        let mut f = Filter::default();
        if let Some(state) = filter.state {
            f.eq("state", Arg::Text(state.as_str().to_string()));
        }
        if let Some(name) = &filter.name {
            f.eq("name", Arg::Text(name.clone()));
        }
        let total = self.count("workers", &f).await?;
        let rows = sqlx::query_with(
            &format!(
                "SELECT {COLUMNS} FROM workers{} ORDER BY id{}",
                f.where_sql(),
                f.limit_sql()
            ),
            f.arguments_with_page(page),
        )
        .fetch_all(&self.pool)
        .await?;
        let workers = rows.iter().map(decode).collect::<Result<_, _>>()?;
        Ok((workers, total))
    }

    /// Replaces a worker's labels.
    pub async fn set_worker_labels(
        &self,
        id: i64,
        labels: &BTreeMap<String, String>,
    ) -> Result<Worker, StoreError> {
        let row = sqlx::query(&format!(
            "UPDATE workers SET labels = $2, updated_at = $3 WHERE id = $1 RETURNING {COLUMNS}"
        ))
        .bind(id)
        .bind(to_json(labels))
        .bind(Timestamp::now().as_millis())
        .fetch_optional(&self.pool)
        .await?
        .ok_or_else(|| StoreError::not_found("worker", id))?;
        let worker = decode(&row)?;
        self.publish(Change::Worker(ChangeKind::Updated, worker.clone()));
        Ok(worker)
    }

    /// Deletes a worker. Instances placed on it lose their placement and go back to
    /// `pending`, so the scheduler places them elsewhere.
    pub async fn delete_worker(&self, id: i64) -> Result<Worker, StoreError> {
        let worker = self.get_worker(id).await?;
        let mut tx = self.pool.begin().await?;
        let placed: Vec<i64> = sqlx::query("SELECT id FROM model_instances WHERE worker_id = $1")
            .bind(id)
            .fetch_all(&mut *tx)
            .await?
            .iter()
            .map(|r| int(r, "model_instances", "id"))
            .collect::<Result<_, _>>()?;
        sqlx::query(
            "UPDATE model_instances SET worker_id = NULL, gpu_indexes = '[]', port = NULL, \
             address = NULL, state = $2, state_message = $3, updated_at = $4 WHERE worker_id = $1",
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
