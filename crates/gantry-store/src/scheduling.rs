//! The statements of the scheduler and the instance controller: reading what is placed,
//! and moving instances between `pending`, `analyzing` and `scheduled`.
//!
//! Every write here is *conditional* on the state the caller decided from: an instance
//! that was deleted, placed by hand or reported on by its worker in the meantime is left
//! as it is, and the call returns `None`. The scheduler therefore never resurrects a
//! deleted instance nor overwrites a newer decision; the next pass sees the new state.
//!
//! These are the leader-only writes: each carries a [`Fence`] (the leader's token, or the
//! scheduling lock's) and applies only while it is current; a write stopped by a stale
//! fence fails with `StoreError::Fenced` (see `fence.rs`). A write that changes nothing publishes nothing, so a scheduler
//! pass that finds nothing to do does not wake anyone, itself included.

use gantry_types::{InstanceState, ModelInstance, PlacementRecord, Timestamp};

use crate::changes::{Change, ChangeKind};
use crate::fence::Fence;
use crate::placement_record::StoredPlacement;
use crate::rows::{int, json, opt_text, parse_enum, text, to_json};
use crate::{Store, StoreError};

/// An instance that holds a worker and a stored placement record: what the scheduler
/// subtracts from the worker's memory.
#[derive(Debug, Clone, PartialEq)]
pub struct PlacedInstanceClaim {
    pub instance_id: i64,
    pub worker_id: i64,
    pub state: InstanceState,
    pub gpu_indexes: Vec<u32>,
    /// The record written with the placement, or why it cannot be read.
    pub placement: StoredPlacement,
}

/// A placement to record: see [`Store::record_placement`].
#[derive(Debug, Clone)]
pub struct NewPlacement<'a> {
    pub instance_id: i64,
    /// The model version the claim was computed from; the write is refused when the
    /// model changed since (its `updated_at` moved), because the claim may be stale.
    pub model_updated_at: Timestamp,
    pub worker_id: i64,
    pub gpu_indexes: &'a [u32],
    pub state_message: &'a str,
    /// What the worker runs and what the scheduler reserved.
    pub record: &'a PlacementRecord,
    /// What entitles the scheduler to place.
    pub fence: &'a Fence,
}

impl Store {
    /// Every instance that holds a worker and a stored placement record, whatever its
    /// state.
    pub async fn placed_instance_claims(&self) -> Result<Vec<PlacedInstanceClaim>, StoreError> {
        const T: &str = "model_instances";
        let rows = sqlx::query(
            "SELECT id, worker_id, state, gpu_indexes, placement FROM model_instances \
             WHERE worker_id IS NOT NULL AND placement IS NOT NULL ORDER BY id",
        )
        .fetch_all(&self.pool)
        .await?;
        let mut claims = Vec::with_capacity(rows.len());
        for row in &rows {
            let instance_id = int(row, T, "id")?;
            claims.push(PlacedInstanceClaim {
                instance_id,
                worker_id: int(row, T, "worker_id")?,
                state: parse_enum(&text(row, T, "state")?, InstanceState::parse, T, "state")?,
                gpu_indexes: json(row, T, "gpu_indexes")?,
                placement: crate::placement_record::decode(
                    instance_id,
                    opt_text(row, T, "placement")?.as_deref(),
                ),
            });
        }
        Ok(claims)
    }

    /// Moves the model's `pending` instances that hold no worker to `analyzing`, with
    /// `message`; returns them as they are now.
    pub async fn mark_instances_analyzing(
        &self,
        model_id: i64,
        message: &str,
        fence: &Fence,
    ) -> Result<Vec<ModelInstance>, StoreError> {
        let sql = format!(
            "UPDATE model_instances SET state = 'analyzing', state_message = $2, updated_at = $3 \
             WHERE model_id = $1 AND state = 'pending' AND worker_id IS NULL{} RETURNING id",
            fence.clause(self.engine, 4)
        );
        let query = sqlx::query(&sql)
            .bind(model_id)
            .bind(message)
            .bind(Timestamp::now().as_millis());
        let started = Timestamp::now();
        let rows = fence.bind(query).fetch_all(&self.pool).await?;
        self.settle_fenced(
            fence,
            started,
            u64::try_from(rows.len()).unwrap_or(u64::MAX),
        )
        .await?;
        let mut changed = Vec::with_capacity(rows.len());
        for row in &rows {
            let id = int(row, "model_instances", "id")?;
            if let Some(instance) = self.publish_instance_update(id).await? {
                changed.push(instance);
            }
        }
        Ok(changed)
    }

    /// Leaves an unplaced instance `pending` with `message` (why it is not placed). Only
    /// from `pending` or `analyzing` with no worker, and only when something changes:
    /// `None` when the instance is gone, placed meanwhile, or already says `message`.
    pub async fn set_pending_reason(
        &self,
        id: i64,
        message: &str,
        fence: &Fence,
    ) -> Result<Option<ModelInstance>, StoreError> {
        let sql = format!(
            "UPDATE model_instances SET state = 'pending', state_message = $2, updated_at = $3 \
             WHERE id = $1 AND worker_id IS NULL AND state IN ('pending', 'analyzing') \
             AND NOT (state = 'pending' AND state_message = $2){}",
            fence.clause(self.engine, 4)
        );
        let statement = sqlx::query(&sql)
            .bind(id)
            .bind(message)
            .bind(Timestamp::now().as_millis());
        self.conditional_instance_write(id, fence, fence.bind(statement))
            .await
    }

    /// Records the scheduler's placement in one statement: worker, GPUs, state
    /// `scheduled`, message and claim. Applies only while the instance is still unplaced
    /// (`pending` or `analyzing`, no worker), its model is still the version the claim was
    /// computed for, and the worker still exists and is `ready`; `None` otherwise.
    pub async fn record_placement(
        &self,
        placement: &NewPlacement<'_>,
    ) -> Result<Option<ModelInstance>, StoreError> {
        let fence = placement.fence;
        let sql = format!(
            "UPDATE model_instances SET worker_id = $2, gpu_indexes = $3, port = NULL, \
             address = NULL, state = 'scheduled', state_message = $4, placement = $5, \
             restart_count = 0, updated_at = $6 \
             WHERE id = $1 AND worker_id IS NULL AND state IN ('pending', 'analyzing') \
             AND EXISTS (SELECT 1 FROM models m WHERE m.id = model_instances.model_id \
                         AND m.updated_at = $7) \
             AND EXISTS (SELECT 1 FROM workers w WHERE w.id = $2 AND w.state = 'ready'){}",
            fence.clause(self.engine, 8)
        );
        let statement = sqlx::query(&sql)
            .bind(placement.instance_id)
            .bind(placement.worker_id)
            .bind(to_json(&placement.gpu_indexes))
            .bind(placement.state_message)
            .bind(to_json(placement.record))
            .bind(Timestamp::now().as_millis())
            .bind(placement.model_updated_at.as_millis());
        self.conditional_instance_write(placement.instance_id, fence, fence.bind(statement))
            .await
    }

    /// Takes an instance off its worker for rescheduling: back to `pending` with no
    /// worker, GPUs, port, address or claim, restart count 0, and `message`. Applies only
    /// while the instance is still in `from_state` on `worker_id`; `None` otherwise.
    pub async fn unplace_instance(
        &self,
        id: i64,
        from_state: InstanceState,
        worker_id: i64,
        message: &str,
        fence: &Fence,
    ) -> Result<Option<ModelInstance>, StoreError> {
        let sql = format!(
            "UPDATE model_instances SET worker_id = NULL, gpu_indexes = '[]', port = NULL, \
             address = NULL, state = 'pending', state_message = $4, placement = NULL, \
             restart_count = 0, updated_at = $5 WHERE id = $1 AND state = $2 AND worker_id = $3{}",
            fence.clause(self.engine, 6)
        );
        let statement = sqlx::query(&sql)
            .bind(id)
            .bind(from_state.as_str())
            .bind(worker_id)
            .bind(message)
            .bind(Timestamp::now().as_millis());
        self.conditional_instance_write(id, fence, fence.bind(statement))
            .await
    }

    /// Starts an instance placed by hand anew on the same worker and GPUs with `record`
    /// (state `scheduled`): how a model change reaches an instance the scheduler did not
    /// place. Applies only while the instance is as `seen` (same `updated_at` and worker);
    /// `None` otherwise.
    pub async fn relaunch_instance(
        &self,
        seen: &ModelInstance,
        record: &PlacementRecord,
        message: &str,
        fence: &Fence,
    ) -> Result<Option<ModelInstance>, StoreError> {
        let sql = format!(
            "UPDATE model_instances SET placement = $2, state = 'scheduled', state_message = $3, \
             port = NULL, address = NULL, restart_count = 0, updated_at = $4 \
             WHERE id = $1 AND updated_at = $5 AND worker_id = $6{}",
            fence.clause(self.engine, 7)
        );
        let statement = sqlx::query(&sql)
            .bind(seen.id)
            .bind(to_json(record))
            .bind(message)
            .bind(Timestamp::now().as_millis())
            .bind(seen.updated_at.as_millis())
            .bind(seen.worker_id);
        self.conditional_instance_write(seen.id, fence, fence.bind(statement))
            .await
    }

    /// Runs a conditional write of one instance: `None` when it changed nothing (the
    /// row moved on, or is gone), else the instance as it is now, published.
    async fn conditional_instance_write<'q>(
        &self,
        id: i64,
        fence: &Fence,
        statement: sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>>,
    ) -> Result<Option<ModelInstance>, StoreError> {
        let started = Timestamp::now();
        let affected = statement.execute(&self.pool).await?.rows_affected();
        if self.settle_fenced(fence, started, affected).await? == 0 {
            return Ok(None);
        }
        self.publish_instance_update(id).await
    }

    /// Re-reads an instance after a write and publishes it; `None` when it was deleted in
    /// between (its deletion was published by whoever deleted it).
    async fn publish_instance_update(&self, id: i64) -> Result<Option<ModelInstance>, StoreError> {
        match self.get_instance(id).await {
            Ok(instance) => {
                self.publish(Change::Instance(ChangeKind::Updated, instance.clone()));
                Ok(Some(instance))
            }
            Err(StoreError::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }
}
