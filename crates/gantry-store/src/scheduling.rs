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
//! fence fails with `StoreError::Fenced` (see `fence.rs`). A write that changes nothing
//! publishes nothing, so a scheduler pass that finds nothing to do does not wake anyone,
//! itself included.
//!
//! A pass's placements and pending reasons are written in batches
//! ([`Store::record_placements`], [`Store::set_pending_reasons`]): conditional `UPDATE …
//! FROM (VALUES …)` statements of many rows, whose conditions judge each row on its own.
//! A batch of one statement (up to 500 rows) checks the fence in its own `WHERE` and
//! commits alone, one round trip; a longer one is a transaction that checks the fence
//! first and holds it to the commit. Changes are published after the commit. These
//! writes run on the leader's own connections (`Store::leader_writes`), so that they
//! never queue for a connection behind the fleet's heartbeats and reports.

use std::collections::{HashMap, HashSet};

use gantry_types::{InstanceState, ModelInstance, PlacementRecord, Timestamp};

use crate::changes::{Change, ChangeKind};
use crate::fence::Fence;
use crate::instances::RETURNING;
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

/// How many instances one multi-row `UPDATE` writes; its parameters (six per placement)
/// stay far below both engines' limits (SQLite 32,766, PostgreSQL 65,535).
const ROWS_PER_STATEMENT: usize = 500;

/// One conditional statement of a batch of instance writes.
type InstanceWrite<'q> = sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>>;

/// A placement to record: see [`Store::record_placements`].
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
}

/// Why an unplaced instance stays `pending`: see [`Store::set_pending_reasons`].
#[derive(Debug, Clone, Copy)]
pub struct PendingReason<'a> {
    pub instance_id: i64,
    /// The scheduler's reason, shown as the instance's `state_message`.
    pub message: &'a str,
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
        .fetch_all(&self.reads)
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
        let rows = fence.bind(query).fetch_all(&self.writes).await?;
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

    /// Leaves unplaced instances `pending` with the scheduler's reason each is not
    /// placed, atomically under `fence`. Each applies only from `pending` or
    /// `analyzing` with no worker, and only when something changes. Returns, per input in
    /// order, the instance as written and published, or `None` when it is gone, was placed
    /// meanwhile, or already says its message. A stale fence writes nothing and fails with
    /// `StoreError::Fenced`.
    pub async fn set_pending_reasons(
        &self,
        reasons: &[PendingReason<'_>],
        fence: &Fence,
    ) -> Result<Vec<Option<ModelInstance>>, StoreError> {
        let unique = first_of_each(reasons, |reason| reason.instance_id);
        let chunks: Vec<&[&PendingReason<'_>]> = unique.chunks(ROWS_PER_STATEMENT).collect();
        let fence_in = FenceIn::statements(chunks.len());
        let sqls: Vec<String> = chunks
            .iter()
            .map(|chunk| {
                format!(
                    "UPDATE model_instances SET state = 'pending', state_message = v.column2, \
                     updated_at = $1 FROM (VALUES {}) AS v \
                     WHERE model_instances.id = v.column1 AND model_instances.worker_id IS NULL \
                     AND model_instances.state IN ('pending', 'analyzing') \
                     AND NOT (model_instances.state = 'pending' \
                              AND model_instances.state_message = v.column2){} \
                     RETURNING {RETURNING}",
                    values_rows(chunk.len(), &["BIGINT", "TEXT"], 2),
                    fence_in.clause(fence, self.engine, 2 + chunk.len() * 2),
                )
            })
            .collect();
        let now = Timestamp::now().as_millis();
        let statements = chunks.iter().zip(&sqls).map(|(chunk, sql)| {
            let query = chunk
                .iter()
                .fold(sqlx::query(sql).bind(now), |query, reason| {
                    query.bind(reason.instance_id).bind(reason.message)
                });
            fence_in.bind(fence, query)
        });
        let ids: Vec<i64> = reasons.iter().map(|reason| reason.instance_id).collect();
        self.instance_writes(fence, fence_in, &ids, statements)
            .await
    }

    /// Records the scheduler's placements atomically under `fence`: for each,
    /// worker, GPUs, state `scheduled`, message and claim. Each applies only while its
    /// instance is still unplaced (`pending` or `analyzing`, no worker), its model is
    /// still the version the claim was computed for, and the worker still exists and is
    /// `ready`. Returns, per input in order, the instance as written and published, or
    /// `None` when that placement did not apply (a second placement of one instance in a
    /// call never does). A stale fence writes nothing and fails with `StoreError::Fenced`.
    ///
    /// The whole input is written at once, whatever its length (the caller picks the
    /// batch size), by one `UPDATE … FROM (VALUES …)` per `ROWS_PER_STATEMENT`
    /// placements: up to that many, one round trip, where each placement on its own
    /// cost two round trips and a commit.
    pub async fn record_placements(
        &self,
        placements: &[NewPlacement<'_>],
        fence: &Fence,
    ) -> Result<Vec<Option<ModelInstance>>, StoreError> {
        let unique = first_of_each(placements, |placement| placement.instance_id);
        let chunks: Vec<&[&NewPlacement<'_>]> = unique.chunks(ROWS_PER_STATEMENT).collect();
        let fence_in = FenceIn::statements(chunks.len());
        // Each row: instance, worker, GPUs, message, record, model version.
        let sqls: Vec<String> = chunks
            .iter()
            .map(|chunk| {
                format!(
                    "UPDATE model_instances SET worker_id = v.column2, gpu_indexes = v.column3, \
                     port = NULL, address = NULL, state = 'scheduled', \
                     state_message = v.column4, placement = v.column5, restart_count = 0, \
                     updated_at = $1 FROM (VALUES {}) AS v \
                     WHERE model_instances.id = v.column1 AND model_instances.worker_id IS NULL \
                     AND model_instances.state IN ('pending', 'analyzing') \
                     AND EXISTS (SELECT 1 FROM models m WHERE m.id = model_instances.model_id \
                                 AND m.updated_at = v.column6) \
                     AND EXISTS (SELECT 1 FROM workers w WHERE w.id = v.column2 \
                                 AND w.state = 'ready'){} \
                     RETURNING {RETURNING}",
                    values_rows(
                        chunk.len(),
                        &["BIGINT", "BIGINT", "TEXT", "TEXT", "TEXT", "BIGINT"],
                        2
                    ),
                    fence_in.clause(fence, self.engine, 2 + chunk.len() * 6),
                )
            })
            .collect();
        let now = Timestamp::now().as_millis();
        let statements = chunks.iter().zip(&sqls).map(|(chunk, sql)| {
            let query = chunk
                .iter()
                .fold(sqlx::query(sql).bind(now), |query, placement| {
                    query
                        .bind(placement.instance_id)
                        .bind(placement.worker_id)
                        .bind(to_json(&placement.gpu_indexes))
                        .bind(placement.state_message)
                        .bind(to_json(placement.record))
                        .bind(placement.model_updated_at.as_millis())
                });
            fence_in.bind(fence, query)
        });
        let ids: Vec<i64> = placements
            .iter()
            .map(|placement| placement.instance_id)
            .collect();
        self.instance_writes(fence, fence_in, &ids, statements)
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
        statement: InstanceWrite<'q>,
    ) -> Result<Option<ModelInstance>, StoreError> {
        let started = Timestamp::now();
        let affected = statement.execute(&self.writes).await?.rows_affected();
        if self.settle_fenced(fence, started, affected).await? == 0 {
            return Ok(None);
        }
        self.publish_instance_update(id).await
    }

    /// Runs conditional `UPDATE … RETURNING` statements of instances (returning
    /// [`RETURNING`], the instance as written) under `fence`, on the leader's own
    /// connections, and only after they are committed publishes what they wrote. One
    /// statement runs on its own, the fence checked in its `WHERE` (`fence_in` says so);
    /// several run in one transaction that first checks `fence` (on PostgreSQL holding
    /// it until commit). Either way a leader that lost its lease meanwhile writes
    /// nothing. `ids` are the instances the caller asked to write, in its order; returns,
    /// for each, the instance as written, or `None` when no statement wrote it (and for
    /// every occurrence after its first).
    async fn instance_writes<'q>(
        &self,
        fence: &Fence,
        fence_in: FenceIn,
        ids: &[i64],
        statements: impl Iterator<Item = InstanceWrite<'q>>,
    ) -> Result<Vec<Option<ModelInstance>>, StoreError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        // Reports and heartbeats wait for this write (see `write_priority.rs`).
        let _leader_write = self.write_priority.leader_write();
        let began = std::time::Instant::now();
        let mut written = HashMap::new();
        let mut keep = |rows: Vec<sqlx::any::AnyRow>| -> Result<(), StoreError> {
            for row in &rows {
                let instance = crate::instances::decode(row)?;
                written.insert(instance.id, instance);
            }
            Ok(())
        };
        let (connected, fenced, updated);
        match fence_in {
            FenceIn::Statement => {
                let started = Timestamp::now();
                let mut conn = self.leader_writes.acquire().await?;
                connected = began.elapsed();
                fenced = connected;
                for statement in statements {
                    keep(statement.fetch_all(&mut *conn).await?)?;
                }
                updated = began.elapsed();
                let count = u64::try_from(written.len()).unwrap_or(u64::MAX);
                self.settle_fenced(fence, started, count).await?;
            }
            FenceIn::Transaction => {
                let mut tx = self.leader_writes.begin().await?;
                connected = began.elapsed();
                self.check_fence_in(&mut tx, fence).await?;
                fenced = began.elapsed();
                for statement in statements {
                    keep(statement.fetch_all(&mut *tx).await?)?;
                }
                updated = began.elapsed();
                tx.commit().await?;
            }
        }
        let committed = began.elapsed();
        let count = written.len();

        let outcomes: Vec<Option<ModelInstance>> =
            ids.iter().map(|id| written.remove(id)).collect();
        for instance in outcomes.iter().flatten() {
            self.publish(Change::Instance(ChangeKind::Updated, instance.clone()));
        }
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
        tracing::debug!(
            asked = ids.len(),
            written = count,
            connect_ms = ms(connected),
            fence_ms = ms(fenced - connected),
            update_ms = ms(updated - fenced),
            commit_ms = ms(committed - updated),
            publish_ms = ms(began.elapsed() - committed),
            "instance batch written"
        );
        Ok(outcomes)
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

/// Where a batch of instance writes checks its fence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FenceIn {
    /// One statement: the fence is a condition of its `WHERE` (share-locking the lease
    /// row on PostgreSQL for as long as the statement runs), and the statement commits
    /// on its own. One round trip, where a transaction takes four.
    Statement,
    /// Several statements: one transaction, whose first statement checks the fence.
    Transaction,
}

impl FenceIn {
    fn statements(count: usize) -> Self {
        if count == 1 {
            FenceIn::Statement
        } else {
            FenceIn::Transaction
        }
    }

    /// The fence's condition for a statement whose parameters before it end at
    /// `$(first - 1)`: empty in a transaction, which checks the fence itself.
    fn clause(self, fence: &Fence, engine: crate::Engine, first: usize) -> String {
        match self {
            FenceIn::Statement => fence.clause(engine, first),
            FenceIn::Transaction => String::new(),
        }
    }

    fn bind<'q>(self, fence: &'q Fence, query: InstanceWrite<'q>) -> InstanceWrite<'q> {
        match self {
            FenceIn::Statement => fence.bind(query),
            FenceIn::Transaction => query,
        }
    }
}

/// The rows of a `VALUES` list: `rows` tuples of `types.len()` parameters each, numbered
/// from `$first`, each cast to its column's SQL type (both engines name the columns
/// `column1`, `column2`, …; the casts give PostgreSQL their types).
pub(crate) fn values_rows(rows: usize, types: &[&str], first: usize) -> String {
    (0..rows)
        .map(|row| {
            let columns = types
                .iter()
                .enumerate()
                .map(|(column, ty)| {
                    format!("CAST(${} AS {ty})", first + row * types.len() + column)
                })
                .collect::<Vec<_>>()
                .join(", ");
            format!("({columns})")
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The first occurrence of each instance among `items`, in order: one write per instance
/// per call (a later duplicate reads as not written).
fn first_of_each<T>(items: &[T], id: impl Fn(&T) -> i64) -> Vec<&T> {
    let mut seen = HashSet::new();
    items.iter().filter(|item| seen.insert(id(item))).collect()
}
