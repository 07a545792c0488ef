//! The `model_instances` table.

use gantry_types::{InstanceFilter, InstanceState, ModelInstance, Timestamp};
use sqlx::any::AnyRow;
use sqlx::Any;

use crate::changes::{Change, ChangeKind};
use crate::fence::Fence;
use crate::query::{Listing, Page};
use crate::rows::{int, json, opt_int, opt_text, parse_enum, text, to_json, u32_of};
use crate::{Store, StoreError};

/// An instance with the names of its model and worker.
const COLUMNS: &str = "i.id, i.name, i.model_id, m.name AS model_name, i.cluster_id, i.replica, \
     i.worker_id, w.name AS worker_name, i.gpu_indexes, i.port, i.address, i.state, \
     i.state_message, i.placement, i.download, i.install, i.backend_version, i.restart_count, i.created_at, i.updated_at";
const FROM: &str = "model_instances i JOIN models m ON m.id = i.model_id \
     LEFT JOIN workers w ON w.id = i.worker_id";

/// The same columns as [`COLUMNS`], for an `UPDATE model_instances … RETURNING`: the
/// written row comes back with the statement instead of being read again (a second round
/// trip and index lookup for every report of every instance). The model's and worker's
/// names are subqueries, since SQLite lets `RETURNING` name only the table written.
pub(crate) const RETURNING: &str = "model_instances.id AS id, model_instances.name AS name, \
     model_instances.model_id AS model_id, \
     (SELECT m.name FROM models m WHERE m.id = model_instances.model_id) AS model_name, \
     model_instances.cluster_id AS cluster_id, \
     model_instances.replica AS replica, model_instances.worker_id AS worker_id, \
     (SELECT w.name FROM workers w WHERE w.id = model_instances.worker_id) AS worker_name, \
     model_instances.gpu_indexes AS gpu_indexes, model_instances.port AS port, \
     model_instances.address AS address, model_instances.state AS state, \
     model_instances.state_message AS state_message, model_instances.placement AS placement, \
     model_instances.download AS download, model_instances.install AS install, \
     model_instances.backend_version AS backend_version, \
     model_instances.restart_count AS restart_count, model_instances.created_at AS created_at, \
     model_instances.updated_at AS updated_at";

pub(crate) fn decode(row: &AnyRow) -> Result<ModelInstance, StoreError> {
    const T: &str = "model_instances";
    let port = opt_int(row, T, "port")?
        .map(|p| u16::try_from(p).map_err(|_| StoreError::corrupt(T, format!("port {p}"))))
        .transpose()?;
    let id = int(row, T, "id")?;
    let placement = crate::placement_record::decode(id, opt_text(row, T, "placement")?.as_deref());
    let state = parse_enum(&text(row, T, "state")?, InstanceState::parse, T, "state")?;
    // Progress is shown while downloading only; a later state leaves the column behind.
    let download = match opt_text(row, T, "download")? {
        Some(text) if state == InstanceState::Downloading => Some(
            serde_json::from_str(&text)
                .map_err(|e| StoreError::corrupt(T, format!("download {text:?}: {e}")))?,
        ),
        _ => None,
    };
    let install = match opt_text(row, T, "install")? {
        Some(text) if state == InstanceState::Installing => Some(
            serde_json::from_str(&text)
                .map_err(|e| StoreError::corrupt(T, format!("install {text:?}: {e}")))?,
        ),
        _ => None,
    };
    Ok(ModelInstance {
        id,
        name: text(row, T, "name")?,
        model_id: int(row, T, "model_id")?,
        model_name: text(row, T, "model_name")?,
        cluster_id: int(row, T, "cluster_id")?,
        replica: u32_of(int(row, T, "replica")?, T, "replica")?,
        worker_id: opt_int(row, T, "worker_id")?,
        worker_name: opt_text(row, T, "worker_name")?,
        gpu_indexes: json(row, T, "gpu_indexes")?,
        port,
        address: opt_text(row, T, "address")?,
        state,
        state_message: text(row, T, "state_message")?,
        placement: placement.into_record(),
        download,
        install,
        backend_version: opt_text(row, T, "backend_version")?,
        restart_count: u32_of(int(row, T, "restart_count")?, T, "restart_count")?,
        created_at: Timestamp::from_millis(int(row, T, "created_at")?),
        updated_at: Timestamp::from_millis(int(row, T, "updated_at")?),
    })
}

/// Instances of a model, read through the pool or inside a transaction.
pub(crate) async fn of_model<'e, E>(
    executor: E,
    model_id: i64,
) -> Result<Vec<ModelInstance>, StoreError>
where
    E: sqlx::Executor<'e, Database = Any>,
{
    let rows = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM {FROM} WHERE i.model_id = $1 ORDER BY i.id"
    ))
    .bind(model_id)
    .fetch_all(executor)
    .await?;
    rows.iter().map(decode).collect()
}

/// How the `model_instances` list reads.
pub(crate) const LISTING: Listing<ModelInstance> = Listing {
    columns: COLUMNS,
    from: FROM,
    count_from: "model_instances i",
    alias: Some("i"),
    order_by: "i.id",
    decode,
    id_of: |item| item.id,
};

impl Store {
    pub async fn get_instance(&self, id: i64) -> Result<ModelInstance, StoreError> {
        let row = sqlx::query(&format!("SELECT {COLUMNS} FROM {FROM} WHERE i.id = $1"))
            .bind(id)
            .fetch_optional(&self.reads)
            .await?
            .ok_or_else(|| StoreError::not_found("model instance", id))?;
        decode(&row)
    }

    pub async fn list_instances(
        &self,
        filter: &InstanceFilter,
        page: Page,
    ) -> Result<(Vec<ModelInstance>, u64), StoreError> {
        self.list_page(&LISTING, filter, page).await
    }

    /// Deletes one instance. The model's replica count is not changed, so the model
    /// controller creates a replacement: this is how an admin restarts a replica.
    pub async fn delete_instance(&self, id: i64) -> Result<ModelInstance, StoreError> {
        let instance = self.get_instance(id).await?;
        let result = sqlx::query("DELETE FROM model_instances WHERE id = $1")
            .bind(id)
            .execute(&self.writes)
            .await?;
        if result.rows_affected() == 0 {
            return Err(StoreError::not_found("model instance", id));
        }
        self.publish(Change::Instance(ChangeKind::Deleted, instance.clone()));
        Ok(instance)
    }

    /// Deletes an instance only if it has not changed since `seen` was read (same
    /// `updated_at`); `None` otherwise. For decisions taken from a read, such as which
    /// replica goes when a model shrinks.
    pub async fn delete_instance_if_unchanged(
        &self,
        seen: &ModelInstance,
        fence: &Fence,
    ) -> Result<Option<ModelInstance>, StoreError> {
        let sql = format!(
            "DELETE FROM model_instances WHERE id = $1 AND updated_at = $2{}",
            fence.clause(self.engine, 3)
        );
        let query = sqlx::query(&sql)
            .bind(seen.id)
            .bind(seen.updated_at.as_millis());
        let started = Timestamp::now();
        let affected = fence
            .bind(query)
            .execute(&self.writes)
            .await?
            .rows_affected();
        if self.settle_fenced(fence, started, affected).await? == 0 {
            return Ok(None);
        }
        self.publish(Change::Instance(ChangeKind::Deleted, seen.clone()));
        Ok(Some(seen.clone()))
    }

    /// Places an instance by hand on a worker and GPUs (state `scheduled`, with `record`),
    /// or takes its placement away (`worker_id = None`, state `pending`, no record). The
    /// caller has checked the worker and the GPUs (see the server's service layer).
    pub async fn place_instance_manually(
        &self,
        id: i64,
        placement: Option<ManualPlacement<'_>>,
    ) -> Result<ModelInstance, StoreError> {
        let (worker_id, gpu_indexes, state, message, record) = match &placement {
            Some(p) => (
                Some(p.worker_id),
                p.gpu_indexes,
                InstanceState::Scheduled,
                p.state_message,
                Some(to_json(p.record)),
            ),
            None => (None, &[][..], InstanceState::Pending, "", None),
        };
        let result = sqlx::query(
            "UPDATE model_instances SET worker_id = $2, gpu_indexes = $3, port = NULL, \
             address = NULL, state = $4, state_message = $5, placement = $6, \
             restart_count = 0, updated_at = $7 WHERE id = $1",
        )
        .bind(id)
        .bind(worker_id)
        .bind(to_json(&gpu_indexes))
        .bind(state.as_str())
        .bind(message)
        .bind(record)
        .bind(Timestamp::now().as_millis())
        .execute(&self.writes)
        .await?;
        if result.rows_affected() == 0 {
            return Err(StoreError::not_found("model instance", id));
        }
        let instance = self.get_instance(id).await?;
        self.publish(Change::Instance(ChangeKind::Updated, instance.clone()));
        Ok(instance)
    }
}

/// A placement made by hand: see [`Store::place_instance_manually`].
#[derive(Debug, Clone, Copy)]
pub struct ManualPlacement<'a> {
    pub worker_id: i64,
    pub gpu_indexes: &'a [u32],
    pub state_message: &'a str,
    pub record: &'a gantry_types::PlacementRecord,
}

impl Store {
    /// Every instance placed on a worker: what it must run.
    pub async fn worker_assignments(
        &self,
        worker_id: i64,
    ) -> Result<Vec<ModelInstance>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {COLUMNS} FROM {FROM} WHERE i.worker_id = $1 ORDER BY i.id"
        ))
        .bind(worker_id)
        .fetch_all(&self.reads)
        .await?;
        rows.iter().map(decode).collect()
    }
}
