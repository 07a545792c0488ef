//! Placement: the `pending` (and leftover `analyzing`) instances, oldest first, get the
//! claim of their model version ([`analyze`](super::analyze), read once per version and
//! cached), and are placed one after another on a ledger built from the store
//! ([`snapshot`](super::snapshot)) — the same booking as `gantry_sched::place_many`, one
//! request at a time so that an instance rescheduled after an `error` first tries the
//! workers other than the one that gave up on it.
//!
//! Each placement is a conditional write of the instance with its [`PlacementRecord`]:
//! the model's launch settings, the flags the placement adds (derived by
//! `gantry-backends`) and the reservation. An instance that cannot be placed stays
//! `pending` with the scheduler's reason as its message. The writes of a pass go out in
//! batches of [`WRITES_PER_BATCH`] ([`Store::record_placements`],
//! [`Store::set_pending_reasons`]: one transaction each), so a large backlog costs a
//! commit per batch instead of per instance, and its first instances still reach their
//! workers while the rest are being placed. Up to [`BATCHES_IN_FLIGHT`] batches are
//! written at once while the pass decides the next.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use futures_util::FutureExt;
use gantry_sched::units::format_gib;
use gantry_sched::{
    reservation_parts, ClusterSnapshot, GpuShare, ManualGpuSelection, ModelMemory, PlacedClaim,
    Placement, PlacementKind, PlacementRequest, ResourceClaim, SnapshotState, Strategy,
    Unschedulable,
};
use gantry_store::{
    Fence, InstanceFilter, NewPlacement, PendingReason, Store, StoreError, WorkerFilter,
};
use gantry_types::{
    BackendKind, DefinedBackend, InstanceState, Model, ModelInstance, PlacementRecord,
    PlacementStrategy, Reservation, ReservationParts,
};
use tokio::time::Instant;

use super::analyze::{
    analyze_model, Analysis, AnalysisCache, AnalysisError, AnalysisInput, Cached,
};
use super::instance::with_reschedule_note;
use super::pass::EVERYTHING;
use super::run_loop::Action;
use super::snapshot::build_cluster_snapshots;
use gantry_source::Sources;

/// How many decisions (placements and pending reasons) a pass writes at a time, one
/// transaction for each kind. Larger batches save little once the commit and the round
/// trips are shared (`cargo bench -p gantry-store --bench record_placements`: 10,000
/// placements in batches of 500 take 0.5–0.8 s on either engine, one at a time 3–7 s),
/// and smaller ones let the first placements of a large backlog reach their workers
/// sooner. A placement that does not apply gives its bytes back to the ledger only once
/// its batch is written, so until then the pass plans around them.
const WRITES_PER_BATCH: usize = 500;

/// How many batches a pass may have being written at once. The pass goes on deciding
/// while its batches are written (they touch disjoint rows), and on a busy database
/// several transactions get more of its time than one: on PostgreSQL, with 10,000
/// workers reporting on the instances already placed, one batch after another spent
/// most of a 10,000-instance pass waiting for its own round trips. The store keeps as
/// many connections for them.
const BATCHES_IN_FLIGHT: usize = gantry_store::LEADER_WRITE_CONNECTIONS as usize;

/// The scheduler's memory between passes: analyses per model version, and the workers that
/// gave up on instances being placed again.
#[derive(Debug)]
pub struct Placer {
    analyses: AnalysisCache,
    /// Instances taken off a worker that gave up on them (`error`), with that worker: their
    /// next placement prefers any other.
    avoid_worker: HashMap<i64, i64>,
    /// An analysis that takes longer than this shows its instances as `analyzing`; faster
    /// ones go from `pending` straight to their outcome without two extra writes each.
    show_analyzing_after: Duration,
    /// Reads the headers of remote models.
    sources: Sources,
    /// The workers as a pass last read them, for the next pass while no worker changed.
    workers: Option<KeptWorkers>,
}

/// Workers read for a pass, kept for the passes after it (see [`Placer::workers`]).
#[derive(Debug)]
struct KeptWorkers {
    /// The store's [`Store::workers_generation`] taken before they were read.
    generation: u64,
    read_at: Instant,
    workers: Arc<Vec<gantry_types::Worker>>,
}

/// The longest a pass uses workers read by an earlier one, even when no change of them
/// was heard of (a bound on what a change lost between servers could cost).
const KEEP_WORKERS_FOR: Duration = Duration::from_secs(10);

impl Placer {
    /// A placer that retries failed analyses after `analysis_retry`.
    pub fn new(analysis_retry: Duration, show_analyzing_after: Duration, sources: Sources) -> Self {
        Placer {
            analyses: AnalysisCache::new(analysis_retry),
            avoid_worker: HashMap::new(),
            show_analyzing_after,
            sources,
            workers: None,
        }
    }

    /// Forgets everything (a new term of leadership).
    pub fn clear(&mut self) {
        self.analyses.clear();
        self.avoid_worker.clear();
        self.workers = None;
    }

    /// Every worker: as the last pass read them while no worker has changed since (and
    /// for at most [`KEEP_WORKERS_FOR`]), else read now. Reading 10,000 workers, the
    /// GPUs of each decoded, took 100–300 ms of every pass on a loaded server, and during
    /// a large deployment the workers do not change from one pass to the next.
    async fn workers(
        &mut self,
        store: &Store,
    ) -> Result<Arc<Vec<gantry_types::Worker>>, StoreError> {
        let generation = store.workers_generation();
        if let Some(kept) = &self.workers {
            if kept.generation == generation && kept.read_at.elapsed() < KEEP_WORKERS_FOR {
                return Ok(Arc::clone(&kept.workers));
            }
        }
        let read_at = Instant::now();
        let workers = Arc::new(
            store
                .list_workers(&WorkerFilter::default(), EVERYTHING)
                .await?
                .0,
        );
        self.workers = Some(KeptWorkers {
            generation,
            read_at,
            workers: Arc::clone(&workers),
        });
        Ok(workers)
    }

    /// The next placement of `instance_id` prefers any worker but `worker_id`.
    pub fn avoid(&mut self, instance_id: i64, worker_id: i64) {
        self.avoid_worker.insert(instance_id, worker_id);
    }

    /// Places the `pending` (and leftover `analyzing`) instances of `models`, oldest
    /// first; returns when an analysis retry falls due. `known`: every instance, as read
    /// with `models` and unchanged since; else the candidates are read from the store.
    pub async fn place_pending(
        &mut self,
        store: &Store,
        models: &[Model],
        known: Option<Vec<ModelInstance>>,
        leading: impl Fn() -> bool,
        fence: &Fence,
    ) -> Result<Action, StoreError> {
        let began = Instant::now();
        let model_ids: HashSet<i64> = models.iter().map(|m| m.id).collect();
        self.analyses.retain_models(&model_ids);
        let unplaced = |instance: &ModelInstance| {
            matches!(
                instance.state,
                InstanceState::Pending | InstanceState::Analyzing
            ) && instance.worker_id.is_none()
        };
        // The candidates: handed over, or read (both states at once, on two connections).
        let mut candidates = match known {
            Some(mut instances) => {
                instances.retain(unplaced);
                instances
            }
            None => {
                let (pending, analyzing) = tokio::try_join!(
                    instances_in(store, InstanceState::Pending),
                    instances_in(store, InstanceState::Analyzing),
                )?;
                let mut read = pending;
                read.extend(analyzing);
                read.retain(unplaced);
                read
            }
        };
        candidates.sort_by_key(|instance| (instance.created_at, instance.id));
        let candidate_ids: HashSet<i64> = candidates.iter().map(|i| i.id).collect();
        self.avoid_worker.retain(|id, _| candidate_ids.contains(id));
        if candidates.is_empty() {
            // Cached failures matter only to instances waiting for placement. Nothing
            // else is read: on PostgreSQL this runs after every change, under the
            // scheduling lock, and reading every worker each time costs a fleet of
            // 10,000 registering workers a fifth more server CPU.
            return Ok(Action::AwaitChange);
        }
        let read = began.elapsed();

        // Analysis, once per model version.
        let by_id: HashMap<i64, &Model> = models.iter().map(|m| (m.id, m)).collect();
        let mut analyses: HashMap<i64, Result<Arc<Analysis>, AnalysisError>> = HashMap::new();
        for instance in &candidates {
            if analyses.contains_key(&instance.model_id) {
                continue;
            }
            let Some(model) = by_id.get(&instance.model_id) else {
                continue; // created after the model list was read; the next pass has it
            };
            let result = self.analysis_of(store, model, fence).await?;
            analyses.insert(model.id, result);
        }
        // Defined backends, read afresh every pass: a new instance runs the definition as
        // it is now (the ones already placed keep theirs).
        let mut defined: HashMap<i64, Result<Option<DefinedBackend>, String>> = HashMap::new();
        for model in analyses.keys().filter_map(|id| by_id.get(id)) {
            defined.insert(model.id, defined_backend(store, model).await?);
        }

        let analysed = began.elapsed();
        // The workers and their claims, read after the analyses (which may take a while):
        // what the ledger starts from should be as fresh as can be.
        let (workers, placed) =
            tokio::try_join!(self.workers(store), store.placed_instance_claims())?;
        let snapshots =
            build_cluster_snapshots(&workers, &placed, models.iter().map(|m| m.cluster_id));
        let mut ledgers: HashMap<i64, SnapshotState> = snapshots
            .iter()
            .map(|(cluster, snapshot)| (*cluster, SnapshotState::new(snapshot)))
            .collect();
        let snapshot_built = began.elapsed();
        let mut waiting = Duration::ZERO;

        let mut batch = Batch::default();
        // Batches being written, at most BATCHES_IN_FLIGHT; a write that fails stops the
        // deciding, and the writes under way are awaited before the pass returns it (a
        // write dropped after its commit was sent would leave changes unpublished).
        let mut writes = FuturesUnordered::new();
        let mut failed: Option<StoreError> = None;
        // Why each model's last instance found no place in this pass. The ledger only
        // fills up as the pass books placements, so the model's next instance (the same
        // request but for its id) cannot fit either: it gets the same reason without a
        // search. A search that finds nothing visits every worker and explains why
        // (about 0.1 ms at 10,000 workers), so a pass with a model that fits nowhere
        // used to repeat that for every replica. A write that fails gives its booking
        // back, so the memory starts afresh after each batch written.
        let mut unplaceable: HashMap<i64, String> = HashMap::new();
        for instance in &candidates {
            if !leading() || failed.is_some() {
                break;
            }
            if batch.len() >= WRITES_PER_BATCH {
                writes.push(write_batch(store, fence, std::mem::take(&mut batch)));
                let wait_began = Instant::now();
                while let Some(written) = next_written(&mut writes).await {
                    if let Err(e) = self.settle(written, &mut ledgers) {
                        failed.get_or_insert(e);
                    }
                    unplaceable.clear();
                }
                waiting += wait_began.elapsed();
            }
            if let Some(reason) = unplaceable.get(&instance.model_id) {
                batch.stay_pending(Unplaced {
                    message: with_reschedule_note(reason, &instance.state_message),
                    instance,
                    unschedulable: Some(reason.clone()),
                });
                continue;
            }
            let (Some(model), Some(analysis)) = (
                by_id.get(&instance.model_id),
                analyses.get(&instance.model_id),
            ) else {
                continue;
            };
            let resolved = defined.get(&instance.model_id).cloned().unwrap_or(Ok(None));
            let failed = match (analysis, &resolved) {
                // Said here, not by the analysis: an estimate reads the same files for a
                // model that does not exist yet, where nothing is retried.
                (Err(AnalysisError(reason)), _) => Some(format!(
                    "{reason} (the instance is tried again automatically)"
                )),
                (Ok(_), Err(reason)) => Some(reason.clone()),
                _ => None,
            };
            let (analysis, defined_backend) = match (analysis, resolved) {
                (Ok(analysis), Ok(defined_backend)) => (analysis, defined_backend),
                _ => {
                    let reason = failed.unwrap_or_default();
                    batch.stay_pending(Unplaced {
                        message: with_reschedule_note(&reason, &instance.state_message),
                        instance,
                        unschedulable: None,
                    });
                    continue;
                }
            };
            let mut request = placement_request(instance.id, model, analysis);
            request.prefer_installed = preferred_install(model, defined_backend.as_ref());
            let avoid = self.avoid_worker.get(&instance.id).copied();
            // Both exist: the snapshots were built for every model's cluster.
            let (Some(snapshot), Some(ledger)) = (
                snapshots.get(&model.cluster_id),
                ledgers.get_mut(&model.cluster_id),
            ) else {
                continue;
            };
            match place_preferring_elsewhere(ledger, snapshot, &request, avoid) {
                Ok(placement) => batch.placements.push(Decided::new(
                    instance,
                    model,
                    (analysis.as_ref(), defined_backend),
                    placement,
                    snapshot,
                )),
                Err(unschedulable) => {
                    let reason = unschedulable_message(&unschedulable);
                    unplaceable.insert(instance.model_id, reason.clone());
                    batch.stay_pending(Unplaced {
                        message: with_reschedule_note(&reason, &instance.state_message),
                        instance,
                        unschedulable: Some(reason),
                    });
                }
            }
        }
        // What was decided after the lead was lost is dropped: the next leader decides
        // again from what is stored.
        if leading() && failed.is_none() {
            writes.push(write_batch(store, fence, batch));
        }
        let wait_began = Instant::now();
        while let Some(written) = writes.next().await {
            if let Err(e) = self.settle(written, &mut ledgers) {
                failed.get_or_insert(e);
            }
        }
        waiting += wait_began.elapsed();
        if let Some(e) = failed {
            return Err(e);
        }
        let total = began.elapsed();
        tracing::debug!(
            candidates = candidates.len(),
            workers = workers.len(),
            read_ms = read.as_secs_f64() * 1e3,
            analyse_ms = (analysed - read).as_secs_f64() * 1e3,
            read_workers_and_snapshot_ms = (snapshot_built - analysed).as_secs_f64() * 1e3,
            decide_ms = (total - snapshot_built - waiting).as_secs_f64() * 1e3,
            wait_for_writes_ms = waiting.as_secs_f64() * 1e3,
            total_ms = total.as_secs_f64() * 1e3,
            "placement pass"
        );
        // A retry time already past belongs to a model that had no instance to place
        // this pass; waking for it would spin. The periodic pass picks it up.
        Ok(self
            .analyses
            .next_retry()
            .filter(|at| *at > tokio::time::Instant::now())
            .map_or(Action::AwaitChange, Action::RequeueAt))
    }

    /// The model's analysis, from the cache or from its files. Reading happens on a
    /// blocking thread; if it takes longer than `show_analyzing_after`, the model's
    /// `pending` instances are shown as `analyzing` meanwhile.
    async fn analysis_of(
        &mut self,
        store: &Store,
        model: &Model,
        fence: &Fence,
    ) -> Result<Result<Arc<Analysis>, AnalysisError>, StoreError> {
        let now = Instant::now();
        let retry = match self.analyses.get(model.id, model.updated_at, now) {
            Cached::Hit(result) => return Ok(result),
            Cached::Miss { retry } => retry,
        };
        let input = AnalysisInput::of(model);
        let sources = self.sources.clone();
        let mut task = tokio::spawn(async move { analyze_model(&sources, input).await });
        let joined = match tokio::time::timeout(self.show_analyzing_after, &mut task).await {
            Ok(joined) => joined,
            Err(_) => {
                // A retry keeps the instances `pending` with their reason: flipping them
                // every retry would only add writes.
                if !retry {
                    store
                        .mark_instances_analyzing(
                            model.id,
                            if model.source.is_remote() {
                                "reading the model's file headers over the network to estimate its memory"
                            } else {
                                "reading the model's file headers to estimate its memory"
                            },
                            fence,
                        )
                        .await?;
                }
                task.await
            }
        };
        let result = match joined {
            Ok(result) => result.map(Arc::new),
            Err(e) => Err(AnalysisError(format!("model analysis failed: {e}"))),
        };
        match &result {
            Ok(analysis) => {
                tracing::info!(model = %model.name, model_id = model.id,
                    claim = %describe_claim(&analysis.claim), "analysed model")
            }
            Err(e) => {
                tracing::warn!(model = %model.name, model_id = model.id, reason = %e,
                    "cannot analyse model")
            }
        }
        self.analyses
            .insert(model.id, model.updated_at, result.clone(), Instant::now());
        Ok(result)
    }

    /// Takes in a written batch: a placement that did not apply (the instance was deleted
    /// or placed by hand, or its model or worker changed since the snapshot) gives its
    /// bytes back to the ledger for the rest of the pass and keeps the instance's worker
    /// to avoid; the next pass decides again.
    fn settle(
        &mut self,
        written: Written<'_>,
        ledgers: &mut HashMap<i64, SnapshotState>,
    ) -> Result<(), StoreError> {
        let Written { batch, outcome } = written;
        let Rows { placed, reasons } = outcome?;
        for (decided, written) in batch.placements.iter().zip(placed) {
            if written.is_none() {
                if let Some(ledger) = ledgers.get_mut(&decided.model.cluster_id) {
                    ledger.release(&PlacedClaim::from(&decided.placement));
                }
                continue;
            }
            self.avoid_worker.remove(&decided.instance.id);
            decided.log_placed();
        }
        for (unplaced, written) in batch.reasons.iter().zip(reasons) {
            if let (Some(reason), Some(_)) = (&unplaced.unschedulable, written) {
                tracing::info!(instance = %unplaced.instance.name,
                    instance_id = unplaced.instance.id, reason = %reason,
                    "instance not schedulable");
            }
        }
        Ok(())
    }
}

/// A batch and how its writes went.
struct Written<'p> {
    batch: Batch<'p>,
    outcome: Result<Rows, StoreError>,
}

/// For each placement and each pending reason of a batch, in order, the instance as
/// written, or `None` where the write did not apply.
struct Rows {
    placed: Vec<Option<ModelInstance>>,
    reasons: Vec<Option<ModelInstance>>,
}

/// The next batch written, waited for while [`BATCHES_IN_FLIGHT`] are being written;
/// else one only if it has finished already. Either way the writes are polled, which is
/// what sends a new one's statements on their way.
async fn next_written<F: Future>(writes: &mut FuturesUnordered<F>) -> Option<F::Output> {
    if writes.len() >= BATCHES_IN_FLIGHT {
        writes.next().await
    } else {
        writes.next().now_or_never().flatten()
    }
}

/// Writes a batch's placements, then its pending reasons: a transaction each.
async fn write_batch<'p>(store: &Store, fence: &Fence, batch: Batch<'p>) -> Written<'p> {
    let placements: Vec<NewPlacement<'_>> = batch
        .placements
        .iter()
        .map(|decided| NewPlacement {
            instance_id: decided.instance.id,
            model_updated_at: decided.model.updated_at,
            worker_id: decided.placement.worker_id,
            gpu_indexes: &decided.gpu_indexes,
            state_message: &decided.message,
            record: &decided.record,
        })
        .collect();
    let reasons: Vec<PendingReason<'_>> = batch
        .reasons
        .iter()
        .map(|unplaced| PendingReason {
            instance_id: unplaced.instance.id,
            message: &unplaced.message,
        })
        .collect();
    let outcome = async {
        let placed = store.record_placements(&placements, fence).await?;
        let reasons = store.set_pending_reasons(&reasons, fence).await?;
        Ok(Rows { placed, reasons })
    }
    .await;
    Written { batch, outcome }
}

/// What a pass has decided and not yet written.
#[derive(Default)]
struct Batch<'p> {
    /// Placements booked on the ledger.
    placements: Vec<Decided<'p>>,
    /// Instances that stay `pending`, with why.
    reasons: Vec<Unplaced<'p>>,
}

impl<'p> Batch<'p> {
    fn len(&self) -> usize {
        self.placements.len() + self.reasons.len()
    }

    /// Keeps an instance `pending` with its message, unless it already shows that
    /// message: its row would not change (the store would skip it too, but only after
    /// the row was sent and matched — 9,500 held instances cost a pass 0.3 s that way).
    /// A row changed since the pass read it was changed by a write that triggers
    /// another pass, which reads it afresh.
    fn stay_pending(&mut self, unplaced: Unplaced<'p>) {
        let shown = unplaced.instance.state == InstanceState::Pending
            && unplaced.instance.state_message == unplaced.message;
        if !shown {
            self.reasons.push(unplaced);
        }
    }
}

/// A placement the scheduler chose and booked, with the record and message to write.
struct Decided<'p> {
    instance: &'p ModelInstance,
    model: &'p Model,
    analysis: &'p Analysis,
    placement: Placement,
    record: PlacementRecord,
    gpu_indexes: Vec<u32>,
    /// Where and how, for the instance's `state_message` and the log.
    description: String,
    message: String,
    simulated: bool,
}

impl<'p> Decided<'p> {
    fn new(
        instance: &'p ModelInstance,
        model: &'p Model,
        (analysis, defined_backend): (&'p Analysis, Option<DefinedBackend>),
        placement: Placement,
        snapshot: &ClusterSnapshot,
    ) -> Self {
        let placement_args = gantry_backends::backend(model.backend.kind()).placement_args(
            &model.backend_args,
            &placement,
            analysis.default_context_size,
        );
        let record = PlacementRecord {
            launch: model.launch_template(),
            placement_args,
            reservation: Some(Reservation {
                claim: analysis.claim.clone(),
                placement: placement.clone(),
                parts: placement_parts(&analysis.claim, &placement),
            }),
            defined_backend,
        };
        let simulated = uses_simulated_gpus(snapshot, &placement);
        let description = describe_placement(&placement, simulated);
        let message = with_reschedule_note(&description, &instance.state_message);
        Decided {
            instance,
            model,
            analysis,
            gpu_indexes: placement.gpu_indexes(),
            placement,
            record,
            description,
            message,
            simulated,
        }
    }

    /// The one line per placed instance.
    fn log_placed(&self) {
        tracing::info!(
            instance = %self.instance.name,
            instance_id = self.instance.id,
            model = %self.model.name,
            worker = %self.placement.worker_name,
            gpus = ?self.gpu_indexes,
            simulated_gpus = self.simulated,
            placement = %self.description,
            claim = %describe_claim(&self.analysis.claim),
            placement_args = ?self.record.placement_args,
            "placed instance"
        );
    }
}

/// An instance left `pending`, with the message to write.
struct Unplaced<'p> {
    instance: &'p ModelInstance,
    message: String,
    /// The scheduler's reason, when no worker fits (logged once written); `None` when the
    /// model's analysis or backend is what is missing.
    unschedulable: Option<String>,
}

/// Places `request`, first on a copy of the ledger where worker `avoid` has nothing left
/// (so any other worker that fits wins), then, if none does, anywhere. Books the result.
fn place_preferring_elsewhere(
    ledger: &mut SnapshotState,
    snapshot: &ClusterSnapshot,
    request: &PlacementRequest,
    avoid: Option<i64>,
) -> Result<Placement, Unschedulable> {
    if let Some(view) = avoid.and_then(|id| snapshot.workers.iter().find(|w| w.id == id)) {
        let mut elsewhere = ledger.clone();
        elsewhere.apply(&PlacedClaim {
            instance_id: request.instance_id,
            worker_id: view.id,
            gpus: view
                .gpus
                .iter()
                .map(|gpu| GpuShare {
                    index: gpu.index,
                    bytes: u64::MAX,
                })
                .collect(),
            ram_bytes: u64::MAX,
        });
        if let Ok(placement) = elsewhere.find(request) {
            ledger.apply(&PlacedClaim::from(&placement));
            return Ok(placement);
        }
    }
    ledger.place(request)
}

/// The placement request of one instance of `model`.
pub fn placement_request(instance_id: i64, model: &Model, analysis: &Analysis) -> PlacementRequest {
    let mut request = PlacementRequest::new(
        instance_id,
        model.name.clone(),
        model.backend.kind().as_str(),
        analysis.claim.clone(),
    );
    request.selector = model.worker_selector.clone();
    request.manual = model
        .gpu_selector
        .as_ref()
        .map(|selector| ManualGpuSelection {
            worker_name: selector.worker_name.clone(),
            gpu_indexes: selector.gpu_indexes.clone(),
        });
    request.strategy = match model.placement_strategy {
        PlacementStrategy::Spread => Strategy::Spread,
        PlacementStrategy::Binpack => Strategy::Binpack,
    };
    request.allow_tensor_parallel = true;
    request.allow_cpu_offload = model.cpu_offload && model.backend == BackendKind::LlamaCpp;
    request.data_parallel_size = model
        .data_parallel_size
        .or(analysis.args_data_parallel_size);
    request
}

/// The definition a model's defined backend (if it names one) has now, at the model's
/// pinned version or the backend's default; `Err` with the reason its instances wait when
/// the backend or the version is not defined.
pub(crate) async fn defined_backend(
    store: &Store,
    model: &Model,
) -> Result<Result<Option<DefinedBackend>, String>, StoreError> {
    let Some(name) = model.backend.defined() else {
        return Ok(Ok(None));
    };
    let stored = match store.get_backend(name).await {
        Ok(stored) => stored,
        Err(StoreError::NotFound { .. }) => {
            return Ok(Err(format!(
                "backend {name} is not defined; define it with POST /api/v1/inference-backends \
                 or change the model's backend"
            )))
        }
        Err(e) => return Err(e),
    };
    Ok(stored
        .spec
        .runtime(name, model.backend_version.as_deref())
        .map(Some)
        .ok_or_else(|| {
            format!(
                "backend {name} has no version {}; its versions: {}",
                model.backend_version.as_deref().unwrap_or("(default)"),
                stored.spec.version_names()
            )
        }))
}

/// What the scheduler should prefer a worker to have installed for `model`: the pinned
/// version (any version without a pin) of a built-in backend, a defined backend's version
/// when it installs something.
pub(crate) fn preferred_install(model: &Model, defined: Option<&DefinedBackend>) -> Option<String> {
    match (defined, model.backend.kind()) {
        (Some(defined), _) if !defined.requirements.is_empty() => {
            Some(format!("{}@{}", defined.name, defined.version))
        }
        (Some(_), _) | (None, BackendKind::Custom) => None,
        (None, kind) => Some(match &model.backend_version {
            Some(version) => format!("{}@{version}", kind.as_str()),
            None => kind.as_str().to_owned(),
        }),
    }
}

/// The reason an instance is not placed, for its `state_message`.
pub(crate) fn unschedulable_message(unschedulable: &Unschedulable) -> String {
    if unschedulable.may_succeed_later() {
        unschedulable.to_string()
    } else {
        format!("{unschedulable}; change the model for it to be placed")
    }
}

/// What the bytes of `placement` are for; `None` (logged) for a claim that does not record
/// its parts or a placement that does not follow from it, which never happens to a claim
/// estimated now and placed by the scheduler.
pub(crate) fn placement_parts(
    claim: &ResourceClaim,
    placement: &Placement,
) -> Option<ReservationParts> {
    match reservation_parts(claim, placement) {
        Ok(parts) => Some(parts),
        Err(e) => {
            tracing::warn!(instance_id = placement.instance_id, worker = %placement.worker_name,
                error = %e, "cannot split the reservation into parts");
            None
        }
    }
}

fn uses_simulated_gpus(snapshot: &ClusterSnapshot, placement: &Placement) -> bool {
    snapshot
        .workers
        .iter()
        .find(|worker| worker.id == placement.worker_id)
        .is_some_and(|worker| {
            worker
                .gpus
                .iter()
                .any(|gpu| gpu.simulated && placement.gpus.iter().any(|s| s.index == gpu.index))
        })
}

/// `scheduled on w1: GPU 0 (0.6 GiB), 0.3 GiB RAM; whole model on one GPU`.
fn describe_placement(placement: &Placement, simulated: bool) -> String {
    let kind = if simulated { "simulated GPU" } else { "GPU" };
    let gpus = if placement.gpus.is_empty() {
        "no GPU".to_owned()
    } else {
        placement
            .gpus
            .iter()
            .map(|gpu| format!("{kind} {} ({})", gpu.index, format_gib(gpu.bytes)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let layout = match placement.kind {
        PlacementKind::SingleGpu => "whole model on one GPU".to_owned(),
        PlacementKind::MultiGpu if placement.data_parallel_size > 1 => format!(
            "{} replicas of {} GPUs each",
            placement.data_parallel_size, placement.tensor_parallel_size
        ),
        PlacementKind::MultiGpu => format!("split over {} GPUs", placement.gpus.len()),
        PlacementKind::PartialOffload => format!(
            "{} layers on the GPU, the rest on the CPU",
            placement.llama.as_ref().map_or(0, |l| l.n_gpu_layers)
        ),
        PlacementKind::CpuOnly => "CPU only".to_owned(),
    };
    format!(
        "scheduled on {}: {gpus}, {} RAM; {layout}",
        placement.worker_name,
        format_gib(placement.ram_bytes)
    )
}

/// A claim in a few words, for logs.
fn describe_claim(claim: &ResourceClaim) -> String {
    match &claim.memory {
        ModelMemory::Layers(layers) => format!(
            "llama.cpp {} blocks, {} on one GPU, {} RAM",
            layers.block_count(),
            format_gib(claim.single_gpu_bytes().unwrap_or(0)),
            format_gib(claim.base_ram_bytes)
        ),
        ModelMemory::Engine(engine) => format!(
            "{} weights, {:.0}% of each GPU, {} RAM",
            format_gib(engine.weight_bytes),
            engine.memory_fraction.at_tensor_parallel(1) * 100.0,
            format_gib(claim.base_ram_bytes)
        ),
        ModelMemory::Fixed(fixed) => format!(
            "{} GPU(s) with {} each, {} RAM",
            fixed.gpu_count,
            format_gib(
                fixed
                    .bytes_per_gpu
                    .saturating_add(claim.per_gpu_overhead_bytes)
            ),
            format_gib(claim.base_ram_bytes)
        ),
    }
}

/// Every worker and every placed instance's claim: what the pass's ledger starts from.
async fn instances_in(
    store: &Store,
    state: InstanceState,
) -> Result<Vec<ModelInstance>, StoreError> {
    let filter = InstanceFilter {
        state: Some(state),
        ..InstanceFilter::default()
    };
    Ok(store.list_instances(&filter, EVERYTHING).await?.0)
}

#[cfg(test)]
mod tests {
    use gantry_types::fixtures::placement;

    use super::*;

    #[test]
    fn placement_messages_say_where_and_how() {
        let placed = placement(PlacementKind::SingleGpu, &[0], Some(&[5]));
        assert_eq!(
            describe_placement(&placed, true),
            "scheduled on w1: simulated GPU 0 (1.0 GiB), 0.5 GiB RAM; whole model on one GPU"
        );
        let split = placement(PlacementKind::MultiGpu, &[0, 1], Some(&[2, 3]));
        assert!(describe_placement(&split, false).ends_with("split over 2 GPUs"));
    }
}
