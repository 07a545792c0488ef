//! The `models` table, and creating the instances of a model.

use std::collections::BTreeMap;

use gantry_types::{
    BackendName, GpuSelector, Model, ModelCreate, ModelFilter, ModelInstance, ModelSource,
    PlacementStrategy, Timestamp,
};
use serde::{Deserialize, Serialize};
use sqlx::any::AnyRow;

use crate::changes::{Change, ChangeKind};
use crate::fence::Fence;
use crate::query::{Listing, Page};
use crate::rows::{int, json, text, to_json, u32_of};
use crate::{Store, StoreError};

/// The model fields kept as one JSON column: nothing filters on them in SQL.
#[derive(Debug, Serialize, Deserialize)]
struct ModelSpec {
    description: String,
    source: ModelSource,
    backend_version: Option<String>,
    backend_args: Vec<String>,
    env: BTreeMap<String, String>,
    worker_selector: BTreeMap<String, String>,
    gpu_selector: Option<GpuSelector>,
    placement_strategy: PlacementStrategy,
    data_parallel_size: Option<u32>,
    cpu_offload: bool,
    #[serde(default)]
    custom_command: Option<String>,
    labels: BTreeMap<String, String>,
}

impl ModelSpec {
    fn of(model: &Model) -> Self {
        Self {
            description: model.description.clone(),
            source: model.source.clone(),
            backend_version: model.backend_version.clone(),
            backend_args: model.backend_args.clone(),
            env: model.env.clone(),
            worker_selector: model.worker_selector.clone(),
            gpu_selector: model.gpu_selector.clone(),
            placement_strategy: model.placement_strategy,
            data_parallel_size: model.data_parallel_size,
            cpu_offload: model.cpu_offload,
            custom_command: model.custom_command.clone(),
            labels: model.labels.clone(),
        }
    }
}

const COLUMNS: &str = "id, name, cluster_id, backend, replicas, spec, created_at, updated_at";

fn decode(row: &AnyRow) -> Result<Model, StoreError> {
    const T: &str = "models";
    let spec: ModelSpec = json(row, T, "spec")?;
    Ok(Model {
        id: int(row, T, "id")?,
        name: text(row, T, "name")?,
        cluster_id: int(row, T, "cluster_id")?,
        backend: BackendName::new(text(row, T, "backend")?),
        replicas: u32_of(int(row, T, "replicas")?, T, "replicas")?,
        description: spec.description,
        source: spec.source,
        backend_version: spec.backend_version,
        backend_args: spec.backend_args,
        env: spec.env,
        worker_selector: spec.worker_selector,
        gpu_selector: spec.gpu_selector,
        placement_strategy: spec.placement_strategy,
        data_parallel_size: spec.data_parallel_size,
        cpu_offload: spec.cpu_offload,
        custom_command: spec.custom_command,
        labels: spec.labels,
        created_at: Timestamp::from_millis(int(row, T, "created_at")?),
        updated_at: Timestamp::from_millis(int(row, T, "updated_at")?),
    })
}

/// How the `models` list reads.
const LISTING: Listing<Model> = Listing {
    columns: COLUMNS,
    from: "models",
    count_from: "models",
    alias: None,
    order_by: "id",
    decode,
    id_of: |item| item.id,
};

impl Store {
    /// Inserts a model into its cluster. `Conflict` if the name is taken, `NotFound` when
    /// the cluster is not there (the insert is conditional on it, so a cluster deleted
    /// meanwhile is never left with a model). Its instances are created by the model
    /// controller (see the server's `service::replicas`).
    pub async fn create_model(&self, create: &ModelCreate) -> Result<Model, StoreError> {
        let now = Timestamp::now();
        let model = create.to_model(0, now);
        let mut tx = self.writes.begin().await?;
        let row = sqlx::query(&format!(
            "INSERT INTO models (name, cluster_id, backend, replicas, spec, created_at, \
             updated_at) SELECT $1, $6, $2, $3, $4, $5, $5 \
             WHERE EXISTS (SELECT 1 FROM clusters WHERE id = $6) RETURNING {COLUMNS}"
        ))
        .bind(&model.name)
        .bind(model.backend.as_str())
        .bind(i64::from(model.replicas))
        .bind(to_json(&ModelSpec::of(&model)))
        .bind(now.as_millis())
        .bind(model.cluster_id)
        .fetch_optional(&mut *tx)
        .await
        .map_err(|e| StoreError::conflict_on_unique(e, "model", &model.name))?
        .ok_or_else(|| StoreError::not_found("cluster", model.cluster_id))?;
        let model = decode(&row)?;
        tx.commit().await?;
        self.publish(Change::Model(ChangeKind::Created, model.clone()));
        Ok(model)
    }

    pub async fn get_model(&self, id: i64) -> Result<Model, StoreError> {
        let row = sqlx::query(&format!("SELECT {COLUMNS} FROM models WHERE id = $1"))
            .bind(id)
            .fetch_optional(&self.reads)
            .await?
            .ok_or_else(|| StoreError::not_found("model", id))?;
        decode(&row)
    }

    pub async fn get_model_by_name(&self, name: &str) -> Result<Model, StoreError> {
        let row = sqlx::query(&format!("SELECT {COLUMNS} FROM models WHERE name = $1"))
            .bind(name)
            .fetch_optional(&self.reads)
            .await?
            .ok_or_else(|| StoreError::not_found("model", name))?;
        decode(&row)
    }

    pub async fn list_models(
        &self,
        filter: &ModelFilter,
        page: Page,
    ) -> Result<(Vec<Model>, u64), StoreError> {
        self.list_page(&LISTING, filter, page).await
    }

    /// Writes an updated model (name, id and creation time are kept).
    pub async fn update_model(&self, model: &Model) -> Result<Model, StoreError> {
        let row = sqlx::query(&format!(
            "UPDATE models SET replicas = $2, spec = $3, updated_at = $4 WHERE id = $1 \
             RETURNING {COLUMNS}"
        ))
        .bind(model.id)
        .bind(i64::from(model.replicas))
        .bind(to_json(&ModelSpec::of(model)))
        .bind(Timestamp::now().as_millis())
        .fetch_optional(&self.writes)
        .await?
        .ok_or_else(|| StoreError::not_found("model", model.id))?;
        let updated = decode(&row)?;
        self.publish(Change::Model(ChangeKind::Updated, updated.clone()));
        Ok(updated)
    }

    /// Deletes a model and all its instances.
    pub async fn delete_model(&self, id: i64) -> Result<Model, StoreError> {
        let model = self.get_model(id).await?;
        let instances = crate::instances::of_model(&self.reads, id).await?;
        let result = sqlx::query("DELETE FROM models WHERE id = $1")
            .bind(id)
            .execute(&self.writes)
            .await?;
        if result.rows_affected() == 0 {
            return Err(StoreError::not_found("model", id));
        }
        for instance in instances {
            self.publish(Change::Instance(ChangeKind::Deleted, instance));
        }
        self.publish(Change::Model(ChangeKind::Deleted, model.clone()));
        Ok(model)
    }

    /// Creates instances of `model` with the given replica numbers, in state `pending`.
    /// A replica number already taken (another writer was first) is skipped; returns the
    /// instances created.
    pub async fn create_instances(
        &self,
        model: &Model,
        replicas: &[u32],
        fence: &Fence,
    ) -> Result<Vec<ModelInstance>, StoreError> {
        let now = Timestamp::now().as_millis();
        let mut created = Vec::with_capacity(replicas.len());
        let sql = format!(
            "INSERT INTO model_instances (name, model_id, cluster_id, replica, worker_id, \
             gpu_indexes, port, address, state, state_message, placement, restart_count, \
             created_at, updated_at) SELECT $1, $2, m.cluster_id, $3, NULL, '[]', NULL, NULL, \
             'pending', '', NULL, 0, $4, $4 FROM models m WHERE m.id = $2{} \
             ON CONFLICT DO NOTHING RETURNING id",
            fence.clause(self.engine, 5)
        );
        for &replica in replicas {
            let name = format!("{}-{replica}", model.name);
            let query = sqlx::query(&sql)
                .bind(&name)
                .bind(model.id)
                .bind(i64::from(replica))
                .bind(now);
            let started = Timestamp::now();
            let row = fence.bind(query).fetch_optional(&self.writes).await?;
            let Some(row) = row else {
                // A replica number already taken, or a stale fence.
                self.settle_fenced(fence, started, 0).await?;
                continue;
            };
            self.settle_fenced(fence, started, 1).await?;
            let id = int(&row, "model_instances", "id")?;
            if let Ok(instance) = self.get_instance(id).await {
                self.publish(Change::Instance(ChangeKind::Created, instance.clone()));
                created.push(instance);
            }
        }
        Ok(created)
    }
}
