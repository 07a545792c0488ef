//! The `models` table, and keeping each model's instance count equal to its replicas.

use std::collections::{BTreeMap, BTreeSet};

use gantry_types::{
    BackendKind, GpuSelector, InstanceState, Model, ModelCreate, ModelInstance, ModelSource,
    PlacementStrategy, Timestamp,
};
use serde::{Deserialize, Serialize};
use sqlx::any::AnyRow;
use sqlx::{Any, Transaction};

use crate::changes::{Change, ChangeKind};
use crate::query::{Arg, Filter, Page};
use crate::rows::{int, json, parse_enum, text, to_json, u32_of};
use crate::{Store, StoreError};

/// List filters for models.
#[derive(Debug, Clone, Default)]
pub struct ModelFilter {
    pub name: Option<String>,
    pub backend: Option<BackendKind>,
    /// Substring of the name.
    pub search: Option<String>,
}

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

const COLUMNS: &str = "id, name, backend, replicas, spec, created_at, updated_at";

fn decode(row: &AnyRow) -> Result<Model, StoreError> {
    const T: &str = "models";
    let spec: ModelSpec = json(row, T, "spec")?;
    Ok(Model {
        id: int(row, T, "id")?,
        name: text(row, T, "name")?,
        backend: parse_enum(&text(row, T, "backend")?, BackendKind::parse, T, "backend")?,
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

/// Instance ids created and instances removed by a replica reconciliation.
#[derive(Debug, Default)]
struct ReplicaDiff {
    created: Vec<i64>,
    deleted: Vec<ModelInstance>,
}

impl Store {
    /// Inserts a model and its `replicas` instances in state `pending`, in one
    /// transaction. `Conflict` if the name is taken.
    pub async fn create_model(&self, create: &ModelCreate) -> Result<Model, StoreError> {
        let now = Timestamp::now();
        let model = Model {
            id: 0,
            name: create.name.clone(),
            description: create.description.clone(),
            source: create.source.clone(),
            backend: create.backend,
            backend_version: create.backend_version.clone(),
            backend_args: create.backend_args.clone(),
            env: create.env.clone(),
            replicas: create.replicas,
            worker_selector: create.worker_selector.clone(),
            gpu_selector: create.gpu_selector.clone(),
            placement_strategy: create.placement_strategy,
            data_parallel_size: create.data_parallel_size,
            cpu_offload: create.cpu_offload,
            custom_command: create.custom_command.clone(),
            labels: create.labels.clone(),
            created_at: now,
            updated_at: now,
        };
        let mut tx = self.pool.begin().await?;
        let row = sqlx::query(&format!(
            "INSERT INTO models (name, backend, replicas, spec, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $5) RETURNING {COLUMNS}"
        ))
        .bind(&model.name)
        .bind(model.backend.as_str())
        .bind(i64::from(model.replicas))
        .bind(to_json(&ModelSpec::of(&model)))
        .bind(now.as_millis())
        .fetch_one(&mut *tx)
        .await
        .map_err(|e| StoreError::conflict_on_unique(e, "model", &model.name))?;
        let model = decode(&row)?;
        let diff = reconcile_replicas(&mut tx, &model).await?;
        tx.commit().await?;
        self.publish(Change::Model(ChangeKind::Created, model.clone()));
        self.publish_replica_diff(diff).await;
        Ok(model)
    }

    pub async fn get_model(&self, id: i64) -> Result<Model, StoreError> {
        let row = sqlx::query(&format!("SELECT {COLUMNS} FROM models WHERE id = $1"))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?
            .ok_or_else(|| StoreError::not_found("model", id))?;
        decode(&row)
    }

    pub async fn get_model_by_name(&self, name: &str) -> Result<Model, StoreError> {
        let row = sqlx::query(&format!("SELECT {COLUMNS} FROM models WHERE name = $1"))
            .bind(name)
            .fetch_optional(&self.pool)
            .await?
            .ok_or_else(|| StoreError::not_found("model", name))?;
        decode(&row)
    }

    pub async fn list_models(
        &self,
        filter: &ModelFilter,
        page: Page,
    ) -> Result<(Vec<Model>, u64), StoreError> {
        let mut f = Filter::default();
        if let Some(name) = &filter.name {
            f.eq("name", Arg::Text(name.clone()));
        }
        if let Some(backend) = filter.backend {
            f.eq("backend", Arg::Text(backend.as_str().to_string()));
        }
        if let Some(search) = &filter.search {
            f.contains("name", &search.to_lowercase());
        }
        let total = self.count("models", &f).await?;
        let rows = sqlx::query_with(
            &format!(
                "SELECT {COLUMNS} FROM models{} ORDER BY id{}",
                f.where_sql(),
                f.limit_sql()
            ),
            f.arguments_with_page(page),
        )
        .fetch_all(&self.pool)
        .await?;
        let models = rows.iter().map(decode).collect::<Result<_, _>>()?;
        Ok((models, total))
    }

    /// Writes an updated model (name, id and creation time are kept) and brings its
    /// instance count to the new replica count in the same transaction.
    pub async fn update_model(&self, model: &Model) -> Result<Model, StoreError> {
        let mut tx = self.pool.begin().await?;
        let row = sqlx::query(&format!(
            "UPDATE models SET replicas = $2, spec = $3, updated_at = $4 WHERE id = $1 \
             RETURNING {COLUMNS}"
        ))
        .bind(model.id)
        .bind(i64::from(model.replicas))
        .bind(to_json(&ModelSpec::of(model)))
        .bind(Timestamp::now().as_millis())
        .fetch_optional(&mut *tx)
        .await?
        .ok_or_else(|| StoreError::not_found("model", model.id))?;
        let updated = decode(&row)?;
        let diff = reconcile_replicas(&mut tx, &updated).await?;
        tx.commit().await?;
        self.publish(Change::Model(ChangeKind::Updated, updated.clone()));
        self.publish_replica_diff(diff).await;
        Ok(updated)
    }

    /// Deletes a model and all its instances.
    pub async fn delete_model(&self, id: i64) -> Result<Model, StoreError> {
        let model = self.get_model(id).await?;
        let instances = crate::instances::of_model(&self.pool, id).await?;
        let result = sqlx::query("DELETE FROM models WHERE id = $1")
            .bind(id)
            .execute(&self.pool)
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

    /// Brings a model's instance count back to its replica count (after an instance
    /// was deleted, say). A model that no longer exists is left alone.
    pub async fn reconcile_model_replicas(&self, model_id: i64) -> Result<(), StoreError> {
        let model = match self.get_model(model_id).await {
            Ok(model) => model,
            Err(StoreError::NotFound { .. }) => return Ok(()),
            Err(e) => return Err(e),
        };
        let mut tx = self.pool.begin().await?;
        let diff = reconcile_replicas(&mut tx, &model).await?;
        tx.commit().await?;
        self.publish_replica_diff(diff).await;
        Ok(())
    }

    async fn publish_replica_diff(&self, diff: ReplicaDiff) {
        for instance in diff.deleted {
            self.publish(Change::Instance(ChangeKind::Deleted, instance));
        }
        for id in diff.created {
            if let Ok(instance) = self.get_instance(id).await {
                self.publish(Change::Instance(ChangeKind::Created, instance));
            }
        }
    }
}

/// How keepable an instance is when scaling down: lower goes first. Errored ones go
/// first, then any that is not running, then running ones, newest first.
fn keep_rank(state: InstanceState) -> u8 {
    match state {
        InstanceState::Error => 0,
        InstanceState::Running => 2,
        _ => 1,
    }
}

/// Creates or deletes instances inside `tx` until the model has exactly `replicas`.
async fn reconcile_replicas(
    tx: &mut Transaction<'static, Any>,
    model: &Model,
) -> Result<ReplicaDiff, StoreError> {
    let existing = crate::instances::of_model(&mut **tx, model.id).await?;
    let wanted = model.replicas as usize;
    let mut diff = ReplicaDiff::default();
    if existing.len() < wanted {
        let taken: BTreeSet<u32> = existing.iter().map(|i| i.replica).collect();
        let free = (0u32..).filter(|r| !taken.contains(r));
        let now = Timestamp::now().as_millis();
        for replica in free.take(wanted - existing.len()) {
            let row = sqlx::query(
                "INSERT INTO model_instances (name, model_id, replica, worker_id, gpu_indexes, \
                 port, address, state, state_message, resource_claim, restart_count, created_at, \
                 updated_at) VALUES ($1, $2, $3, NULL, '[]', NULL, NULL, 'pending', '', NULL, 0, \
                 $4, $4) RETURNING id",
            )
            .bind(format!("{}-{replica}", model.name))
            .bind(model.id)
            .bind(i64::from(replica))
            .bind(now)
            .fetch_one(&mut **tx)
            .await
            .map_err(|e| {
                StoreError::conflict_on_unique(
                    e,
                    "model instance",
                    format!("{}-{replica}", model.name),
                )
            })?;
            diff.created.push(int(&row, "model_instances", "id")?);
        }
    } else if existing.len() > wanted {
        let mut victims = existing;
        // Least useful first: by rank, then newest first.
        victims.sort_by(|a, b| {
            keep_rank(a.state)
                .cmp(&keep_rank(b.state))
                .then(b.created_at.cmp(&a.created_at))
                .then(b.id.cmp(&a.id))
        });
        victims.truncate(victims.len() - wanted);
        for victim in victims {
            sqlx::query("DELETE FROM model_instances WHERE id = $1")
                .bind(victim.id)
                .execute(&mut **tx)
                .await?;
            diff.deleted.push(victim);
        }
    }
    Ok(diff)
}
