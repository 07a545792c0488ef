//! The scheduler loop: places `pending` instances on workers and GPUs, and runs the model
//! and instance controllers before each placement pass. Leader only.
//!
//! One pass, level-triggered (it reads the store as it is and never asks why it woke):
//!
//! 1. [`model`](super::model): every model gets exactly `replicas` instances;
//! 2. [`instance`](super::instance): instances lost with their worker (`unreachable`) or
//!    given up by it (`error`) go back to `pending`, after a per-instance backoff;
//! 3. placement: the `pending` (and leftover `analyzing`) instances, oldest first, get the
//!    claim of their model version ([`analyze`](super::analyze), read once per version and
//!    cached), and are placed one after another on a ledger built from the store
//!    ([`snapshot`](super::snapshot)) — the same booking as `gantry_sched::place_many`,
//!    one request at a time so that an instance rescheduled after an `error` first tries
//!    the workers other than the one that gave up on it. Each placement is written in one
//!    conditional statement ([`Store::record_placement`]); an instance that cannot be
//!    placed stays `pending` with the scheduler's reason as its message.
//!
//! Passes run on store changes that can make a difference (workers, models, instances
//! created, deleted, unplaced or lost), debounced by [`SchedulerConfig::debounce`], and
//! at least every [`SchedulerConfig::period`], and when a backoff or an analysis retry
//! falls due. A pass that finds nothing to change writes nothing, so the changes it
//! causes itself settle after one more pass.
//!
//! The placement stored in `resource_claim` is what the worker needs to start the
//! backend (see [`resource_claim_record`] and [`extra_backend_args`]).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use gantry_coord::Coordinator;
use gantry_sched::args::flag_value;
use gantry_sched::units::format_gib;
use gantry_sched::{
    ClusterSnapshot, GpuShare, ManualGpuSelection, ModelMemory, PlacedClaim, Placement,
    PlacementKind, PlacementRequest, ResourceClaim, SnapshotState, Strategy, Unschedulable,
};
use gantry_store::{
    Change, ChangeKind, InstanceFilter, ModelFilter, NewPlacement, Page, Store, StoreError,
    WorkerFilter,
};
use gantry_types::{BackendKind, InstanceState, Model, ModelInstance, PlacementStrategy};
use tokio::sync::broadcast;
use tokio::time::Instant;

use super::analyze::{analyze, Analysis, AnalysisCache, AnalysisError, AnalysisInput, Cached};
use super::instance::{with_reschedule_note, LostInstance, RescheduleBackoff};
use super::snapshot::build_snapshot;
use crate::config::ServerConfig;
use crate::state::AppState;

/// Timing of the scheduler loop.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// A pass runs at least this often, changes or not.
    pub period: Duration,
    /// How long to gather further changes after the first one before a pass.
    pub debounce: Duration,
    /// The wait before the first reschedule of a lost instance; doubled per reschedule.
    pub reschedule_base: Duration,
    /// The longest wait before a reschedule.
    pub reschedule_cap: Duration,
    /// How soon a failed analysis (a missing file, say) is tried again.
    pub analysis_retry: Duration,
    /// An analysis that takes longer than this shows its instances as `analyzing`; faster
    /// ones go from `pending` straight to their outcome without two extra writes each.
    pub show_analyzing_after: Duration,
    /// Back-off after a pass failed on the store.
    pub error_retry: Duration,
}

impl SchedulerConfig {
    /// The timing for a server: a 10 s period, 100 ms debounce, and a reschedule delay of
    /// a third of `server_timeout` (a lost worker has already been silent that long), at
    /// most 10 s, doubling up to 5 minutes.
    pub fn from_server_config(config: &ServerConfig) -> Self {
        SchedulerConfig {
            period: Duration::from_secs(10),
            debounce: Duration::from_millis(100),
            reschedule_base: (config.server_timeout / 3)
                .clamp(Duration::from_millis(100), Duration::from_secs(10)),
            reschedule_cap: Duration::from_secs(300),
            analysis_retry: Duration::from_secs(10),
            show_analyzing_after: Duration::from_millis(200),
            error_retry: Duration::from_secs(1),
        }
    }
}

/// Starts the loop on the server's task tracker. It runs passes only while `coordinator`
/// says this server leads, and ends at shutdown.
pub fn spawn(state: &AppState, coordinator: Arc<dyn Coordinator>) {
    let config = SchedulerConfig::from_server_config(&state.config);
    let scheduler = Scheduler {
        analyses: AnalysisCache::new(config.analysis_retry),
        backoff: RescheduleBackoff::new(config.reschedule_base, config.reschedule_cap),
        avoid_worker: HashMap::new(),
        state: state.clone(),
        coordinator,
        config,
    };
    state.tasks.spawn(scheduler.run());
}

/// Whether a committed change may let a pass do something new. Instances the scheduler
/// itself moves to `analyzing` or `scheduled`, and worker reports of `starting` and
/// `running`, do not; users and API keys never do. Worker changes are left to
/// [`TriggerFilter`], which knows what the scheduler saw of the worker before.
pub fn triggers_pass(change: &Change) -> bool {
    match change {
        Change::Worker(..) | Change::Model(..) => true,
        Change::Instance(ChangeKind::Created | ChangeKind::Deleted, _) => true,
        Change::Instance(ChangeKind::Updated, instance) => matches!(
            instance.state,
            InstanceState::Pending | InstanceState::Error | InstanceState::Unreachable
        ),
        _ => false,
    }
}

/// [`triggers_pass`], except that a worker update triggers only when something placement
/// looks at changed (state, labels, backends, GPUs, memory totals): workers report their
/// utilisation often, and those reports alone cannot make a placement possible.
#[derive(Debug, Default)]
pub struct TriggerFilter {
    workers: HashMap<i64, gantry_sched::WorkerView>,
}

impl TriggerFilter {
    pub fn triggers(&mut self, change: &Change) -> bool {
        match change {
            Change::Worker(ChangeKind::Deleted, worker) => {
                self.workers.remove(&worker.id);
                true
            }
            Change::Worker(_, worker) => {
                let view = super::snapshot::worker_view(worker);
                self.workers.insert(worker.id, view.clone()) != Some(view)
            }
            other => triggers_pass(other),
        }
    }

    /// Forgets what it saw: after missed changes, the next worker update triggers.
    pub fn clear(&mut self) {
        self.workers.clear();
    }
}

/// Every row of a list, in one page.
const EVERYTHING: Page = Page {
    page: 1,
    per_page: u32::MAX,
};

struct Scheduler {
    state: AppState,
    coordinator: Arc<dyn Coordinator>,
    config: SchedulerConfig,
    analyses: AnalysisCache,
    backoff: RescheduleBackoff,
    /// Instances taken off a worker that gave up on them (`error`), with that worker: their
    /// next placement prefers any other.
    avoid_worker: HashMap<i64, i64>,
}

impl Scheduler {
    async fn run(mut self) {
        let shutdown = self.state.shutdown.clone();
        let mut changes = self.state.store.subscribe();
        let mut leadership = self.coordinator.watch();
        let mut filter = TriggerFilter::default();
        let mut was_leader = false;
        loop {
            if !self.coordinator.is_leader() {
                if was_leader {
                    tracing::info!(
                        server_id = self.coordinator.server_id(),
                        "lost leadership; scheduler and controllers pause"
                    );
                }
                was_leader = false;
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    _ = leadership.until_leader() => {}
                }
                continue;
            }
            if !was_leader {
                was_leader = true;
                // A new term starts from the store alone: what this server remembered may
                // have been changed by another leader meanwhile.
                self.analyses.clear();
                self.backoff.clear();
                self.avoid_worker.clear();
                changes = changes.resubscribe();
                filter.clear();
                tracing::info!(
                    server_id = self.coordinator.server_id(),
                    fencing_token = ?self.coordinator.fencing_token(),
                    "leading: scheduler and controllers run"
                );
            }
            let now = Instant::now();
            let mut wake = now + self.config.period;
            // Shutdown does not wait for a pass (an analysis may be stuck on a slow file
            // system); every write of a pass is a statement of its own, so stopping
            // between two is safe.
            let outcome = tokio::select! {
                () = shutdown.cancelled() => return,
                outcome = self.pass() => outcome,
            };
            match outcome {
                Ok(Some(due)) => wake = wake.min(due),
                Ok(None) => {}
                Err(e) => {
                    tracing::error!(error = %e, "scheduler pass failed; retrying");
                    wake = wake.min(now + self.config.error_retry);
                }
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep_until(wake) => {}
                _ = leadership.changed() => {}
                () = next_trigger(&mut changes, &mut filter) => {
                    tokio::select! {
                        () = shutdown.cancelled() => return,
                        () = tokio::time::sleep(self.config.debounce) => {}
                    }
                    drain(&mut changes, &mut filter);
                }
            }
        }
    }

    /// One pass of the three controllers; returns when the next one is due at the latest.
    async fn pass(&mut self) -> Result<Option<Instant>, StoreError> {
        let store = self.state.store.clone();
        let (models, _) = store
            .list_models(&ModelFilter::default(), EVERYTHING)
            .await?;
        super::model::reconcile_replicas(&store, &models).await;
        if !self.coordinator.is_leader() {
            return Ok(None);
        }
        let reschedule_due = self.reschedule_lost(&store).await?;
        if !self.coordinator.is_leader() {
            return Ok(None);
        }
        let retry_due = self.schedule(&store, &models).await?;
        Ok(earliest(reschedule_due, retry_due))
    }

    /// The instance controller: unplaces lost instances whose backoff has passed.
    async fn reschedule_lost(&mut self, store: &Store) -> Result<Option<Instant>, StoreError> {
        let mut lost = Vec::new();
        for state in [InstanceState::Unreachable, InstanceState::Error] {
            lost.extend(
                instances_in(store, state)
                    .await?
                    .iter()
                    .filter_map(LostInstance::of),
            );
        }
        let now = Instant::now();
        let (due, next) = self.backoff.due(&lost, now);
        for instance in due {
            let message = instance.reschedule_message();
            let unplaced = store
                .unplace_instance(instance.id, instance.state, instance.worker_id, &message)
                .await?;
            if unplaced.is_some() {
                self.backoff.rescheduled(instance.id, now);
                if instance.state == InstanceState::Error {
                    self.avoid_worker.insert(instance.id, instance.worker_id);
                }
                tracing::warn!(instance = %instance.name, instance_id = instance.id,
                    worker = %instance.worker_name, state = instance.state.as_str(),
                    reason = %instance.state_message, "rescheduling instance");
            }
        }
        Ok(next)
    }

    /// The placement pass proper.
    async fn schedule(
        &mut self,
        store: &Store,
        models: &[Model],
    ) -> Result<Option<Instant>, StoreError> {
        let model_ids: HashSet<i64> = models.iter().map(|m| m.id).collect();
        self.analyses.retain_models(&model_ids);
        let mut candidates = instances_in(store, InstanceState::Pending).await?;
        candidates.extend(instances_in(store, InstanceState::Analyzing).await?);
        candidates.retain(|instance| instance.worker_id.is_none());
        candidates.sort_by_key(|instance| (instance.created_at, instance.id));
        let candidate_ids: HashSet<i64> = candidates.iter().map(|i| i.id).collect();
        self.avoid_worker.retain(|id, _| candidate_ids.contains(id));
        if candidates.is_empty() {
            // Cached failures matter only to instances waiting for placement.
            return Ok(None);
        }

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
            let result = self.analysis_of(store, model).await?;
            analyses.insert(model.id, result);
        }

        let (workers, _) = store
            .list_workers(&WorkerFilter::default(), EVERYTHING)
            .await?;
        let placed = store.placed_instance_claims().await?;
        let snapshot = build_snapshot(&workers, &placed);
        let mut ledger = SnapshotState::new(&snapshot);

        for instance in &candidates {
            if !self.coordinator.is_leader() {
                break;
            }
            let (Some(model), Some(analysis)) = (
                by_id.get(&instance.model_id),
                analyses.get(&instance.model_id),
            ) else {
                continue;
            };
            let analysis = match analysis {
                Ok(analysis) => analysis,
                Err(e) => {
                    let message = with_reschedule_note(&e.0, &instance.state_message);
                    store.set_pending_reason(instance.id, &message).await?;
                    continue;
                }
            };
            let request = placement_request(instance.id, model, analysis);
            let avoid = self.avoid_worker.get(&instance.id).copied();
            match place_preferring_elsewhere(&mut ledger, &snapshot, &request, avoid) {
                Ok(placement) => {
                    let written = self
                        .record(store, instance, model, analysis, &placement, &snapshot)
                        .await?;
                    if written {
                        self.avoid_worker.remove(&instance.id);
                    } else {
                        // Deleted, placed by hand, or the model or worker changed since the
                        // snapshot: give the bytes back; the next pass decides again.
                        ledger.release(&placement.to_placed_claim());
                    }
                }
                Err(unschedulable) => {
                    let reason = unschedulable_message(&unschedulable);
                    let message = with_reschedule_note(&reason, &instance.state_message);
                    if store
                        .set_pending_reason(instance.id, &message)
                        .await?
                        .is_some()
                    {
                        tracing::info!(instance = %instance.name, instance_id = instance.id,
                            reason = %reason, "instance not schedulable");
                    }
                }
            }
        }
        // A retry time already past belongs to a model that had no instance to place
        // this pass; waking for it would spin. The periodic pass picks it up.
        Ok(self
            .analyses
            .next_retry()
            .filter(|at| *at > tokio::time::Instant::now()))
    }

    /// The model's analysis, from the cache or from its files. Reading happens on a
    /// blocking thread; if it takes longer than `show_analyzing_after`, the model's
    /// `pending` instances are shown as `analyzing` meanwhile.
    async fn analysis_of(
        &mut self,
        store: &Store,
        model: &Model,
    ) -> Result<Result<Arc<Analysis>, AnalysisError>, StoreError> {
        let now = Instant::now();
        let retry = match self.analyses.get(model.id, model.updated_at, now) {
            Cached::Hit(result) => return Ok(result),
            Cached::Miss { retry } => retry,
        };
        let input = AnalysisInput::of(model);
        let mut task = tokio::task::spawn_blocking(move || analyze(&input));
        let joined = match tokio::time::timeout(self.config.show_analyzing_after, &mut task).await {
            Ok(joined) => joined,
            Err(_) => {
                // A retry keeps the instances `pending` with their reason: flipping them
                // every retry would only add writes.
                if !retry {
                    store
                        .mark_instances_analyzing(
                            model.id,
                            "reading the model's file headers to estimate its memory",
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

    /// Writes one placement; `false` when the conditional write found the instance, the
    /// model or the worker changed.
    async fn record(
        &self,
        store: &Store,
        instance: &ModelInstance,
        model: &Model,
        analysis: &Analysis,
        placement: &Placement,
        snapshot: &ClusterSnapshot,
    ) -> Result<bool, StoreError> {
        let extra_args =
            extra_backend_args(model.backend, &model.backend_args, analysis, placement);
        let record = resource_claim_record(&analysis.claim, placement, &extra_args);
        let simulated = uses_simulated_gpus(snapshot, placement);
        let description = describe_placement(placement, simulated);
        let message = with_reschedule_note(&description, &instance.state_message);
        let gpu_indexes = placement.gpu_indexes();
        let written = store
            .record_placement(&NewPlacement {
                instance_id: instance.id,
                model_updated_at: model.updated_at,
                worker_id: placement.worker_id,
                gpu_indexes: &gpu_indexes,
                state_message: &message,
                resource_claim: &record,
            })
            .await?;
        if written.is_some() {
            tracing::info!(
                instance = %instance.name,
                instance_id = instance.id,
                model = %model.name,
                worker = %placement.worker_name,
                gpus = ?gpu_indexes,
                simulated_gpus = simulated,
                placement = %description,
                claim = %describe_claim(&analysis.claim),
                extra_backend_args = ?extra_args,
                "placed instance"
            );
        }
        Ok(written.is_some())
    }
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
            ledger.apply(&placement.to_placed_claim());
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
        model.backend.as_str(),
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

/// Flags the worker appends to the model's `backend_args` so the backend runs as placed.
/// Appended last, they win over earlier occurrences, so they are only added when the user
/// did not give the flag (except `-ngl`, see below).
///
/// llama.cpp:
/// * `--ctx-size N` when the arguments give none: the context the estimate assumed;
/// * `-ngl N` (`N` = layers on GPUs, `blocks + 1` for full offload, `0` for CPU only)
///   unless the user fixed a number with `-ngl`/`--n-gpu-layers`/`--gpu-layers` (`auto`,
///   `all` or a negative value are replaced, since the claim assumed the scheduler's
///   choice);
/// * with several GPUs: `--tensor-split a,b,…` (layers per GPU, in the order of the
///   placement's GPUs, i.e. of `CUDA_VISIBLE_DEVICES`) unless `--tensor-split`/`-ts` is
///   given, and `--split-mode layer` unless `--split-mode`/`-sm` is given.
///
/// vLLM: `--tensor-parallel-size N` unless `--tensor-parallel-size`/`-tp` is given.
///
/// SGLang: `--tp-size N` unless `--tp-size`/`--tensor-parallel-size`/`--tp` is given.
///
/// custom: nothing (the command template gets the GPUs through `{gpu_ids}`).
pub fn extra_backend_args(
    backend: BackendKind,
    user_args: &[String],
    analysis: &Analysis,
    placement: &Placement,
) -> Vec<String> {
    let given = |names: &[&str]| flag_value(user_args, names).is_some();
    let mut extra = Vec::new();
    match backend {
        BackendKind::LlamaCpp => {
            if let Some(context) = analysis.default_context_size {
                if !given(&["--ctx-size", "-c"]) {
                    extra.extend(["--ctx-size".to_owned(), context.to_string()]);
                }
            }
            let fixed_layers = match &analysis.claim.memory {
                ModelMemory::Layers(layers) => layers.fixed_gpu_layers,
                _ => None,
            };
            if let Some(layout) = &placement.llama {
                if fixed_layers.is_none() {
                    extra.extend(["-ngl".to_owned(), layout.n_gpu_layers.to_string()]);
                }
                if layout.tensor_split.len() > 1 {
                    if !given(&["--tensor-split", "-ts"]) {
                        let split: Vec<String> =
                            layout.tensor_split.iter().map(u32::to_string).collect();
                        extra.extend(["--tensor-split".to_owned(), split.join(",")]);
                    }
                    if !given(&["--split-mode", "-sm"]) {
                        extra.extend(["--split-mode".to_owned(), "layer".to_owned()]);
                    }
                }
            }
        }
        BackendKind::Vllm => {
            if !given(&["--tensor-parallel-size", "-tp"]) {
                extra.extend([
                    "--tensor-parallel-size".to_owned(),
                    placement.tensor_parallel_size.to_string(),
                ]);
            }
        }
        BackendKind::Sglang => {
            if !given(&["--tp-size", "--tensor-parallel-size", "--tp"]) {
                extra.extend([
                    "--tp-size".to_owned(),
                    placement.tensor_parallel_size.to_string(),
                ]);
            }
        }
        BackendKind::Custom => {}
    }
    extra
}

/// The `resource_claim` JSON stored with a placement:
/// `{"claim": ResourceClaim, "placement": Placement, "extra_backend_args": [String]}`.
pub fn resource_claim_record(
    claim: &ResourceClaim,
    placement: &Placement,
    extra_backend_args: &[String],
) -> serde_json::Value {
    serde_json::json!({
        "claim": claim,
        "placement": placement,
        "extra_backend_args": extra_backend_args,
    })
}

/// The reason an instance is not placed, for its `state_message`.
fn unschedulable_message(unschedulable: &Unschedulable) -> String {
    if unschedulable.may_succeed_later() {
        unschedulable.to_string()
    } else {
        format!("{unschedulable}; change the model for it to be placed")
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

fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Waits for a change the filter lets through; a lagged receiver counts as one (changes
/// were missed, so anything may have happened). Never returns once the store is gone.
async fn next_trigger(changes: &mut broadcast::Receiver<Arc<Change>>, filter: &mut TriggerFilter) {
    loop {
        match changes.recv().await {
            Ok(change) if filter.triggers(&change) => return,
            Ok(_) => {}
            Err(broadcast::error::RecvError::Lagged(_)) => {
                filter.clear();
                return;
            }
            Err(broadcast::error::RecvError::Closed) => std::future::pending::<()>().await,
        }
    }
}

/// Discards the changes already queued (the pass about to run reads the store anew),
/// letting the filter see the worker updates among them.
fn drain(changes: &mut broadcast::Receiver<Arc<Change>>, filter: &mut TriggerFilter) {
    loop {
        match changes.try_recv() {
            Ok(change) => {
                filter.triggers(&change);
            }
            Err(broadcast::error::TryRecvError::Lagged(_)) => filter.clear(),
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use gantry_sched::{FixedMemory, LayerBreakdown, LlamaLayout};

    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    fn llama_analysis(fixed_gpu_layers: Option<u32>, context: Option<u32>) -> Analysis {
        Analysis {
            claim: ResourceClaim {
                per_gpu_overhead_bytes: 1,
                base_ram_bytes: 1,
                memory: ModelMemory::Layers(LayerBreakdown {
                    block_bytes: vec![10; 4],
                    output_bytes: 1,
                    host_compute_bytes: 1,
                    fixed_gpu_layers,
                }),
            },
            default_context_size: context,
            args_data_parallel_size: None,
        }
    }

    fn placement(kind: PlacementKind, gpus: &[u32], llama: Option<LlamaLayout>) -> Placement {
        Placement {
            instance_id: 1,
            worker_id: 1,
            worker_name: "w1".to_owned(),
            gpus: gpus
                .iter()
                .map(|&index| GpuShare {
                    index,
                    bytes: 1 << 30,
                })
                .collect(),
            ram_bytes: 1 << 29,
            kind,
            tensor_parallel_size: u32::try_from(gpus.len().max(1)).expect("few GPUs"),
            data_parallel_size: 1,
            llama,
        }
    }

    fn layout(split: &[u32]) -> Option<LlamaLayout> {
        Some(LlamaLayout {
            n_gpu_layers: split.iter().sum(),
            tensor_split: split.to_vec(),
        })
    }

    #[test]
    fn llama_single_gpu_gets_context_and_full_offload() {
        let extra = extra_backend_args(
            BackendKind::LlamaCpp,
            &[],
            &llama_analysis(None, Some(4096)),
            &placement(PlacementKind::SingleGpu, &[0], layout(&[5])),
        );
        assert_eq!(extra, args(&["--ctx-size", "4096", "-ngl", "5"]));
    }

    #[test]
    fn llama_split_gets_tensor_split_and_split_mode_unless_given() {
        let split = placement(PlacementKind::MultiGpu, &[1, 3], layout(&[2, 3]));
        let extra = extra_backend_args(
            BackendKind::LlamaCpp,
            &args(&["-c", "2048"]),
            &llama_analysis(None, None),
            &split,
        );
        assert_eq!(
            extra,
            args(&[
                "-ngl",
                "5",
                "--tensor-split",
                "2,3",
                "--split-mode",
                "layer"
            ])
        );
        let extra = extra_backend_args(
            BackendKind::LlamaCpp,
            &args(&["-ts", "1,1", "-sm=row", "-ngl", "4"]),
            &llama_analysis(Some(4), None),
            &split,
        );
        assert!(extra.is_empty(), "the user's own choices stay: {extra:?}");
    }

    #[test]
    fn llama_partial_offload_and_cpu_only_set_gpu_layers() {
        let partial = placement(PlacementKind::PartialOffload, &[0], layout(&[3]));
        let extra = extra_backend_args(
            BackendKind::LlamaCpp,
            &args(&["-ngl", "auto"]),
            &llama_analysis(None, None),
            &partial,
        );
        assert_eq!(extra, args(&["-ngl", "3"]), "auto is replaced by the plan");
        let cpu = placement(
            PlacementKind::CpuOnly,
            &[],
            Some(LlamaLayout {
                n_gpu_layers: 0,
                tensor_split: Vec::new(),
            }),
        );
        let extra = extra_backend_args(
            BackendKind::LlamaCpp,
            &[],
            &llama_analysis(None, None),
            &cpu,
        );
        assert_eq!(extra, args(&["-ngl", "0"]));
    }

    #[test]
    fn engines_get_their_tensor_parallel_flag_unless_given() {
        let analysis = Analysis {
            claim: ResourceClaim {
                per_gpu_overhead_bytes: 0,
                base_ram_bytes: 0,
                memory: ModelMemory::Fixed(FixedMemory {
                    gpu_count: 2,
                    bytes_per_gpu: 0,
                }),
            },
            default_context_size: None,
            args_data_parallel_size: None,
        };
        let two = placement(PlacementKind::MultiGpu, &[0, 1], None);
        assert_eq!(
            extra_backend_args(BackendKind::Vllm, &[], &analysis, &two),
            args(&["--tensor-parallel-size", "2"])
        );
        assert!(
            extra_backend_args(BackendKind::Vllm, &args(&["-tp", "2"]), &analysis, &two).is_empty()
        );
        assert_eq!(
            extra_backend_args(BackendKind::Sglang, &[], &analysis, &two),
            args(&["--tp-size", "2"])
        );
        assert!(
            extra_backend_args(BackendKind::Sglang, &args(&["--tp", "2"]), &analysis, &two)
                .is_empty()
        );
        assert!(extra_backend_args(BackendKind::Custom, &[], &analysis, &two).is_empty());
    }

    #[test]
    fn record_has_claim_placement_and_extra_args() {
        let analysis = llama_analysis(None, Some(256));
        let placed = placement(PlacementKind::SingleGpu, &[0], layout(&[5]));
        let record = resource_claim_record(&analysis.claim, &placed, &args(&["-ngl", "5"]));
        let back: Placement =
            serde_json::from_value(record["placement"].clone()).expect("a placement");
        assert_eq!(back, placed);
        let claim: ResourceClaim =
            serde_json::from_value(record["claim"].clone()).expect("a claim");
        assert_eq!(claim, analysis.claim);
        assert_eq!(
            record["extra_backend_args"],
            serde_json::json!(["-ngl", "5"])
        );
    }

    #[test]
    fn placement_messages_say_where_and_how() {
        let placed = placement(PlacementKind::SingleGpu, &[0], layout(&[5]));
        assert_eq!(
            describe_placement(&placed, true),
            "scheduled on w1: simulated GPU 0 (1.0 GiB), 0.5 GiB RAM; whole model on one GPU"
        );
        let split = placement(PlacementKind::MultiGpu, &[0, 1], layout(&[2, 3]));
        assert!(describe_placement(&split, false).ends_with("split over 2 GPUs"));
    }

    #[test]
    fn only_changes_that_matter_trigger_a_pass() {
        use gantry_types::Timestamp;
        let instance = |state| ModelInstance {
            id: 1,
            name: "m-0".into(),
            model_id: 1,
            model_name: "m".into(),
            replica: 0,
            worker_id: None,
            worker_name: None,
            gpu_indexes: vec![],
            port: None,
            address: None,
            state,
            state_message: String::new(),
            computed_resource_claim: None,
            restart_count: 0,
            created_at: Timestamp::from_millis(0),
            updated_at: Timestamp::from_millis(0),
        };
        let updated = |state| Change::Instance(ChangeKind::Updated, instance(state));
        assert!(triggers_pass(&Change::Instance(
            ChangeKind::Created,
            instance(InstanceState::Pending)
        )));
        assert!(triggers_pass(&Change::Instance(
            ChangeKind::Deleted,
            instance(InstanceState::Running)
        )));
        assert!(triggers_pass(&updated(InstanceState::Unreachable)));
        assert!(triggers_pass(&updated(InstanceState::Error)));
        assert!(triggers_pass(&updated(InstanceState::Pending)));
        assert!(!triggers_pass(&updated(InstanceState::Scheduled)));
        assert!(!triggers_pass(&updated(InstanceState::Analyzing)));
        assert!(!triggers_pass(&updated(InstanceState::Running)));
    }

    #[test]
    fn worker_updates_trigger_only_when_placement_inputs_change() {
        use gantry_types::{Timestamp, Worker, WorkerState, WorkerStatus};
        let mut worker = Worker {
            id: 1,
            name: "w1".into(),
            state: WorkerState::Ready,
            state_message: String::new(),
            labels: Default::default(),
            address: "127.0.0.1:1".into(),
            status: WorkerStatus::default(),
            last_heartbeat_at: None,
            created_at: Timestamp::from_millis(0),
            updated_at: Timestamp::from_millis(0),
        };
        let mut filter = TriggerFilter::default();
        let updated = |w: &Worker| Change::Worker(ChangeKind::Updated, w.clone());
        assert!(filter.triggers(&updated(&worker)), "first sight");
        assert!(!filter.triggers(&updated(&worker)), "nothing changed");
        worker.status.system.load_average = 3.0;
        worker.last_heartbeat_at = Some(Timestamp::from_millis(5));
        assert!(
            !filter.triggers(&updated(&worker)),
            "load is not a placement input"
        );
        worker.state = WorkerState::NotReady;
        assert!(filter.triggers(&updated(&worker)));
        worker.labels.insert("zone".into(), "a".into());
        assert!(filter.triggers(&updated(&worker)));
        assert!(filter.triggers(&Change::Worker(ChangeKind::Deleted, worker.clone())));
        assert!(
            filter.triggers(&updated(&worker)),
            "seen anew after deletion"
        );
    }

    #[test]
    fn reschedule_delay_scales_with_server_timeout() {
        let mut config = ServerConfig::new("/tmp/x".into());
        assert_eq!(
            SchedulerConfig::from_server_config(&config).reschedule_base,
            Duration::from_secs(10)
        );
        config.server_timeout = Duration::from_millis(1500);
        assert_eq!(
            SchedulerConfig::from_server_config(&config).reschedule_base,
            Duration::from_millis(500)
        );
    }
}
