//! Worker pools, leader only and fenced: every `pool_interval` the leader moves each
//! pool's machines along and decides how many it should have.
//!
//! * **Machines.** A machine is written (`provisioning`, named `<pool>-<n>`) before the
//!   provider is asked for it, and the provider is asked to *find* it by that name before
//!   it is asked to *create* it: a leader that dies in between leaves a row the next
//!   leader finds the machine for, never a second machine. A failure waits 5 s, 10 s, …
//!   up to 5 minutes before the next try, with the provider's words in the message. Once
//!   created a machine is `initializing` until a worker of its name registers in the
//!   pool's cluster (`registered`, then the worker's own state shows). A registered
//!   machine whose worker is gone quiet, and that the provider no longer has, is made
//!   again.
//! * **Demand.** Replicas of the cluster's models that stay `pending` with the
//!   scheduler's reason are placed on a copy of the cluster's snapshot, with the machines
//!   still on their way counted as empty workers of their pool's shape; those that fit
//!   nowhere but would fit a new machine of this pool grow it, by as many machines as the
//!   scheduler's own placement needs for them, up to `max`.
//! * **Idle machines.** A machine whose worker has hosted nothing for `scale_down_after`
//!   is drained (its worker set to `maintenance`, so nothing new lands there) and
//!   deleted, down to `min`; its worker is removed once the provider has deleted it.
//! * **Deleted pools** delete their machines, then go.
//!
//! Every decision is written to the pool's events with its reason.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use gantry_provision::local::{Local, LocalProcesses};
use gantry_provision::{MachineRequest, Provider};
use gantry_sched::{ClusterSnapshot, GpuView, SnapshotState, SystemReserve, WorkerView};
use gantry_store::{
    Fence, InstanceFilter, ModelFilter, PlacedInstanceClaim, StoreError, StoredMachine, StoredPool,
    WorkerFilter,
};
use gantry_types::pool::MAX_LOCAL_MACHINES;
use gantry_types::{
    BackendKind, InstanceState, MachineShape, MachineState, Model, PoolProvider, Timestamp, Worker,
    WorkerPool, WorkerState,
};

use super::analyze::{analyze_model, Analysis, AnalysisInput};
use super::pass::EVERYTHING;
use super::placement::placement_request;
use super::snapshot::build_cluster_snapshots;
use crate::state::AppState;

/// The label every pool machine's worker carries, naming its pool.
pub const POOL_LABEL: &str = "gantry.dev/pool";
/// The first wait after a failure at the provider; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_secs(5);
const MAX_BACKOFF: Duration = Duration::from_secs(300);
/// How long a created machine may take to register before its message says so.
const SLOW_REGISTRATION: Duration = Duration::from_secs(900);
/// How often machines whose workers are silent are looked for at the provider.
const VANISHED_CHECK: Duration = Duration::from_secs(60);

/// Runs the pools until shutdown, acting only while this server leads.
pub fn spawn(state: &AppState) {
    let state = state.clone();
    let tasks = state.tasks.clone();
    tasks.spawn(async move {
        let program = state
            .config
            .gantry_program()
            .unwrap_or_else(|_| "gantry".into());
        let local = LocalProcesses::new(
            program,
            state.config.data_dir.join("pools"),
            state.config.local_pool_ports.clone(),
        );
        let mut pools = Pools::new(local);
        let mut tick = tokio::time::interval(state.config.pool_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = state.shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            if state.store.unreachable().is_some() {
                continue;
            }
            let Some(fence) = state.cluster.leader_fence() else {
                continue;
            };
            match pools.pass(&state, &fence).await {
                Ok(()) => {}
                Err(e @ StoreError::Fenced { .. }) => state.cluster.on_write_error(&e),
                Err(e) => {
                    tracing::warn!(error = %e, "worker pools: pass failed; trying again next pass")
                }
            }
        }
    });
}

/// What the pool loop keeps between passes.
struct Pools {
    /// Each pool's provider, as its settings were at `updated_at`.
    providers: HashMap<i64, (Timestamp, Arc<Provider>)>,
    local: Arc<LocalProcesses>,
    /// Each model's analysis, as its settings were at `updated_at`.
    analyses: HashMap<i64, (Timestamp, Option<Arc<Analysis>>)>,
    /// The last "cannot grow" reason written per pool, so it is written once.
    said: HashMap<i64, String>,
    last_vanished_check: Option<tokio::time::Instant>,
}

/// A machine and what happened to it in this pass.
enum Outcome {
    Keep,
    Write(StoredMachine, Option<(&'static str, String)>),
    Remove(String),
}

fn backoff(attempts: u32) -> Duration {
    FIRST_BACKOFF
        .saturating_mul(1 << attempts.saturating_sub(1).min(10))
        .min(MAX_BACKOFF)
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl Pools {
    fn new(local: Arc<LocalProcesses>) -> Self {
        Self {
            providers: HashMap::new(),
            local,
            analyses: HashMap::new(),
            said: HashMap::new(),
            last_vanished_check: None,
        }
    }

    /// The pool's provider, built again when its settings changed.
    fn provider(&mut self, state: &AppState, stored: &StoredPool) -> Result<Arc<Provider>, String> {
        let pool = &stored.pool;
        if let Some((at, provider)) = self.providers.get(&pool.id) {
            if *at == pool.updated_at {
                return Ok(Arc::clone(provider));
            }
        }
        let credentials = match &stored.credentials_sealed {
            Some(sealed) => Some(
                state
                    .pool_credentials
                    .open(sealed)
                    .map_err(|e| format!("the pool's credentials: {e}"))?,
            ),
            None => None,
        };
        let provider = Arc::new(match pool.provider {
            PoolProvider::Digitalocean => {
                Provider::DigitalOcean(gantry_provision::digitalocean::DigitalOcean::new(
                    pool.api_url.as_deref(),
                    credentials.as_deref().unwrap_or_default(),
                    &pool.name,
                ))
            }
            PoolProvider::Exec => Provider::Exec(
                gantry_provision::exec::Exec::new(
                    &state.config.pool_commands_dir(),
                    pool.command.as_deref().unwrap_or_default(),
                    credentials.as_deref(),
                )
                .map_err(|e| e.0)?,
            ),
            PoolProvider::Local => Provider::Local(Local::new(Arc::clone(&self.local))),
        });
        self.providers
            .insert(pool.id, (pool.updated_at, Arc::clone(&provider)));
        Ok(provider)
    }

    async fn pass(&mut self, state: &AppState, fence: &Fence) -> Result<(), StoreError> {
        let store = &state.store;
        let pools = store.list_pools(None).await?;
        let live: HashSet<i64> = pools.iter().map(|p| p.pool.id).collect();
        self.providers.retain(|id, _| live.contains(id));
        self.said.retain(|id, _| live.contains(id));
        if pools.is_empty() {
            return Ok(());
        }
        let machines = store.pool_machines(None).await?;
        let (workers, _) = store
            .list_workers(&WorkerFilter::default(), EVERYTHING)
            .await?;
        let placed = store.placed_instance_claims().await?;
        let busy: HashSet<i64> = placed.iter().map(|p| p.worker_id).collect();
        let check_vanished = self
            .last_vanished_check
            .is_none_or(|at| at.elapsed() >= VANISHED_CHECK);
        if check_vanished {
            self.last_vanished_check = Some(tokio::time::Instant::now());
        }
        let local_pools: HashSet<i64> = pools
            .iter()
            .filter(|p| p.pool.provider == PoolProvider::Local)
            .map(|p| p.pool.id)
            .collect();
        let local_machines = u32::try_from(
            machines
                .iter()
                .filter(|m| local_pools.contains(&m.machine.pool_id))
                .count(),
        )
        .unwrap_or(u32::MAX);
        let context = Context {
            state,
            pools: &pools,
            local_machines,
            fence,
            workers: &workers,
            busy: &busy,
            check_vanished,
        };
        for stored in &pools {
            let own: Vec<StoredMachine> = machines
                .iter()
                .filter(|m| m.machine.pool_id == stored.pool.id)
                .cloned()
                .collect();
            let provider = match self.provider(state, stored) {
                Ok(provider) => provider,
                Err(why) => {
                    self.say_once(state, &stored.pool, "failed", why).await?;
                    continue;
                }
            };
            let own = context.move_machines(stored, &provider, own).await?;
            if stored.pool.deleting {
                if own.is_empty() && store.remove_pool(stored.pool.id, fence).await? {
                    tracing::info!(pool_id = stored.pool.id, pool = %stored.pool.name, "worker pool deleted with its machines");
                }
                continue;
            }
            self.scale(&context, &stored.pool, &own, &machines, &placed)
                .await?;
        }
        Ok(())
    }

    /// Writes a "cannot act" event unless it was the last one written for the pool.
    async fn say_once(
        &mut self,
        state: &AppState,
        pool: &WorkerPool,
        kind: &'static str,
        message: String,
    ) -> Result<(), StoreError> {
        if self.said.get(&pool.id) == Some(&message) {
            return Ok(());
        }
        tracing::warn!(pool_id = pool.id, pool = %pool.name, reason = %message, "worker pool cannot act");
        state.store.add_pool_event(pool.id, kind, &message).await?;
        self.said.insert(pool.id, message);
        Ok(())
    }

    /// Grows the pool to `min` and to what pending replicas need, and takes idle
    /// machines away down to `min`.
    async fn scale(
        &mut self,
        context: &Context<'_>,
        pool: &WorkerPool,
        own: &[StoredMachine],
        every_machine: &[StoredMachine],
        placed: &[PlacedInstanceClaim],
    ) -> Result<(), StoreError> {
        let store = &context.state.store;
        let count = u32::try_from(
            own.iter()
                .filter(|m| m.machine.state != MachineState::Deleting)
                .count(),
        )
        .unwrap_or(u32::MAX);
        let Ok(shape) = MachineShape::parse(&pool.gpus, pool.memory.as_deref()) else {
            return Ok(());
        };
        if count < pool.min {
            let reason = format!(
                "the pool keeps at least {} machine(s) and has {count}",
                pool.min
            );
            self.add(context, pool, pool.min - count, &reason).await?;
            return Ok(());
        }
        let (needed, unmet) = self
            .demand(context, pool, shape, every_machine, placed)
            .await?;
        if let Some((wanted, replicas, models)) = needed {
            let mut room = pool.max.saturating_sub(count);
            if pool.provider == PoolProvider::Local {
                room = room.min(MAX_LOCAL_MACHINES.saturating_sub(context.local_machines));
            }
            let adding = wanted.min(room);
            if adding > 0 {
                let reason = format!(
                    "{replicas} pending replica(s) of {models} fit no worker of the cluster \
                     but fit a new {} machine: adding {adding} (the pool had {count}, max {})",
                    pool.gpus, pool.max
                );
                self.said.remove(&pool.id);
                self.add(context, pool, adding, &reason).await?;
            }
            if adding < wanted {
                let message = format!(
                    "{replicas} pending replica(s) of {models} need {wanted} more machine(s), \
                     but the pool is at its max of {}: raise max to serve them",
                    pool.max
                );
                self.say_once(context.state, pool, "waiting", message)
                    .await?;
            }
        } else if let Some(message) = unmet {
            self.say_once(context.state, pool, "waiting", message)
                .await?;
        }

        // Idle machines, oldest idle first, down to `min`.
        let idle_for = gantry_types::units::parse_duration(&pool.scale_down_after)
            .unwrap_or(gantry_types::pool::DEFAULT_SCALE_DOWN_AFTER);
        let now = Timestamp::now().as_millis();
        let mut idle: Vec<&StoredMachine> = own
            .iter()
            .filter(|m| m.machine.state == MachineState::Registered)
            .filter(|m| {
                m.machine
                    .idle_since
                    .is_some_and(|at| now - at.as_millis() >= millis(idle_for))
            })
            .collect();
        idle.sort_by_key(|m| m.machine.idle_since.map(Timestamp::as_millis));
        let mut remaining = count;
        for machine in idle {
            if remaining <= pool.min {
                break;
            }
            let mut draining = machine.clone();
            draining.machine.state = MachineState::Deleting;
            draining.machine.state_message = format!(
                "hosted nothing for {}; draining and deleting it",
                pool.scale_down_after
            );
            draining.attempts = 0;
            draining.next_attempt_at = 0;
            if let Some(worker_id) = draining.machine.worker_id {
                match store
                    .set_worker_state(
                        worker_id,
                        WorkerState::Maintenance,
                        "its pool machine is being deleted: it hosted nothing",
                    )
                    .await
                {
                    Ok(_) | Err(StoreError::NotFound { .. }) => {}
                    Err(e) => return Err(e),
                }
            }
            store.write_pool_machine(&draining, context.fence).await?;
            let reason = format!(
                "machine {} hosted nothing for {} (the pool had {remaining}, min {}): \
                 draining and deleting it",
                draining.machine.name, pool.scale_down_after, pool.min
            );
            tracing::info!(pool = %pool.name, machine = %draining.machine.name, reason = %reason, "worker pool scales down");
            store.add_pool_event(pool.id, "scale_down", &reason).await?;
            remaining -= 1;
        }
        Ok(())
    }

    /// Adds `n` machines to the pool.
    async fn add(
        &mut self,
        context: &Context<'_>,
        pool: &WorkerPool,
        n: u32,
        reason: &str,
    ) -> Result<(), StoreError> {
        let store = &context.state.store;
        tracing::info!(pool_id = pool.id, pool = %pool.name, machines = n, reason = %reason, "worker pool scales up");
        store.add_pool_event(pool.id, "scale_up", reason).await?;
        for _ in 0..n {
            let machine = store
                .add_pool_machine(pool.id, "waiting for the provider", context.fence)
                .await?;
            tracing::info!(pool = %pool.name, machine = %machine.machine.name, "pool machine asked for");
        }
        Ok(())
    }

    /// How many new machines of this pool the cluster's pending replicas need, with how
    /// many replicas and of which models (`None` when none); else why the pool does not
    /// grow for replicas that are pending, if any are.
    async fn demand(
        &mut self,
        context: &Context<'_>,
        pool: &WorkerPool,
        shape: MachineShape,
        every_machine: &[StoredMachine],
        placed: &[PlacedInstanceClaim],
    ) -> Result<(Option<(u32, usize, String)>, Option<String>), StoreError> {
        let store = &context.state.store;
        let pending_filter = InstanceFilter {
            state: Some(InstanceState::Pending),
            cluster_id: Some(pool.cluster_id),
            ..InstanceFilter::default()
        };
        let (pending, _) = store.list_instances(&pending_filter, EVERYTHING).await?;
        // Only those the scheduler has tried: it writes its reason when nothing fits.
        let pending: Vec<_> = pending
            .into_iter()
            .filter(|i| i.worker_id.is_none() && !i.state_message.is_empty())
            .collect();
        if pending.is_empty() {
            return Ok((None, None));
        }
        let model_filter = ModelFilter {
            cluster_id: Some(pool.cluster_id),
            ..ModelFilter::default()
        };
        let (models, _) = store.list_models(&model_filter, EVERYTHING).await?;
        let models: HashMap<i64, Model> = models.into_iter().map(|m| (m.id, m)).collect();
        let mut requests = Vec::new();
        for instance in &pending {
            let Some(model) = models.get(&instance.model_id) else {
                continue;
            };
            let Some(analysis) = self.analysis(context.state, model).await else {
                continue;
            };
            let mut request = placement_request(instance.id, model, &analysis);
            // A new machine installs what it runs on demand.
            request.prefer_installed = None;
            requests.push((request, model.name.clone()));
        }
        let cluster_workers: Vec<Worker> = context
            .workers
            .iter()
            .filter(|w| w.cluster_id == pool.cluster_id)
            .cloned()
            .collect();
        let mut snapshot = build_cluster_snapshots(&cluster_workers, placed, [pool.cluster_id])
            .remove(&pool.cluster_id)
            .unwrap_or(ClusterSnapshot {
                workers: Vec::new(),
                placed: Vec::new(),
            });
        // Machines on their way, of every pool of the cluster, count as empty workers.
        let registered: HashSet<&str> = cluster_workers.iter().map(|w| w.name.as_str()).collect();
        let mut next_id = -1;
        for machine in every_machine {
            let m = &machine.machine;
            if m.state == MachineState::Deleting || registered.contains(m.name.as_str()) {
                continue;
            }
            let Some(of) = context.pools_shape(m.pool_id, pool.cluster_id) else {
                continue;
            };
            snapshot
                .workers
                .push(fresh_view(next_id, &m.name, &of.0, of.1));
            next_id -= 1;
        }
        let fits_new: Vec<bool> = requests
            .iter()
            .map(|(request, _)| {
                let alone = ClusterSnapshot {
                    workers: vec![fresh_view(next_id, "new", &pool_labels(pool), shape)],
                    placed: Vec::new(),
                };
                SnapshotState::new(&alone).find(request).is_ok()
            })
            .collect();
        let unserved = |extra: u32| -> Vec<usize> {
            let mut trial = snapshot.clone();
            for n in 0..extra {
                let id = next_id - 1 - i64::from(n);
                trial.workers.push(fresh_view(
                    id,
                    &format!("new-{n}"),
                    &pool_labels(pool),
                    shape,
                ));
            }
            let mut ledger = SnapshotState::new(&trial);
            requests
                .iter()
                .enumerate()
                .filter(|(_, (request, _))| ledger.place(request).is_err())
                .map(|(i, _)| i)
                .collect()
        };
        let now = unserved(0);
        let helped: Vec<usize> = now.iter().copied().filter(|i| fits_new[*i]).collect();
        if helped.is_empty() {
            let message = (!now.is_empty()).then(|| {
                let names = model_names(now.iter().map(|i| requests[*i].1.as_str()));
                format!(
                    "{} pending replica(s) of {names} would not fit a new {} machine either; \
                     the pool does not grow for them",
                    now.len(),
                    pool.gpus
                )
            });
            return Ok((None, message));
        }
        // The fewest machines that serve every replica a new machine could serve, whatever
        // `max` allows: the caller adds what fits under it and says what is missing.
        let limit = u32::try_from(helped.len()).unwrap_or(u32::MAX);
        let mut wanted = limit;
        for extra in 1..=limit {
            let left = unserved(extra);
            if left.iter().all(|i| !fits_new[*i]) {
                wanted = extra;
                break;
            }
        }
        let names = model_names(helped.iter().map(|i| requests[*i].1.as_str()));
        Ok((Some((wanted, helped.len(), names)), None))
    }

    /// The model's analysis, from the cache while the model is unchanged; `None` when its
    /// files cannot be analysed (the scheduler's message says why).
    async fn analysis(&mut self, state: &AppState, model: &Model) -> Option<Arc<Analysis>> {
        if let Some((at, analysis)) = self.analyses.get(&model.id) {
            if *at == model.updated_at {
                return analysis.clone();
            }
        }
        let analysis = analyze_model(&state.sources, AnalysisInput::of(model))
            .await
            .ok()
            .map(Arc::new);
        self.analyses
            .insert(model.id, (model.updated_at, analysis.clone()));
        analysis
    }
}

/// The names of models, each once, in order.
fn model_names<'a>(names: impl Iterator<Item = &'a str>) -> String {
    let mut seen = Vec::new();
    for name in names {
        if !seen.contains(&name) {
            seen.push(name);
        }
    }
    seen.join(", ")
}

/// The labels a pool's workers carry.
fn pool_labels(pool: &WorkerPool) -> BTreeMap<String, String> {
    let mut labels = pool.labels.clone();
    labels.insert(POOL_LABEL.to_owned(), pool.name.clone());
    labels
}

/// An empty worker of `shape`, as a machine of the pool will be once it registers.
fn fresh_view(
    id: i64,
    name: &str,
    labels: &BTreeMap<String, String>,
    shape: MachineShape,
) -> WorkerView {
    WorkerView {
        id,
        name: name.to_owned(),
        ready: true,
        labels: labels.clone(),
        backends: [
            BackendKind::LlamaCpp,
            BackendKind::Vllm,
            BackendKind::Sglang,
            BackendKind::Custom,
        ]
        .iter()
        .map(|b| b.as_str().to_owned())
        .collect(),
        installed: Default::default(),
        gpus: (0..shape.gpu_count)
            .map(|index| GpuView {
                index,
                total_memory_bytes: shape.gpu_memory_bytes,
                simulated: false,
            })
            .collect(),
        system_memory_bytes: if shape.memory_bytes == 0 {
            u64::MAX
        } else {
            shape.memory_bytes
        },
        cpu_count: 1,
        reserve: SystemReserve::default(),
    }
}

/// What one pass works with.
struct Context<'a> {
    state: &'a AppState,
    /// Every pool, as this pass read them.
    pools: &'a [StoredPool],
    /// Machines of `local` pools, all pools together.
    local_machines: u32,
    fence: &'a Fence,
    workers: &'a [Worker],
    /// Workers that host at least one instance.
    busy: &'a HashSet<i64>,
    /// Whether to ask the provider about machines whose workers are silent.
    check_vanished: bool,
}

impl Context<'_> {
    /// The labels and shape of pool `pool_id` when it is in cluster `cluster_id` (and not
    /// being deleted).
    fn pools_shape(
        &self,
        pool_id: i64,
        cluster_id: i64,
    ) -> Option<(BTreeMap<String, String>, MachineShape)> {
        let pool = &self
            .pools
            .iter()
            .find(|p| p.pool.id == pool_id && p.pool.cluster_id == cluster_id)?
            .pool;
        if pool.deleting {
            return None;
        }
        MachineShape::parse(&pool.gpus, pool.memory.as_deref())
            .ok()
            .map(|shape| (pool_labels(pool), shape))
    }

    /// Moves each of the pool's machines along (concurrently: a provider may take a
    /// while) and writes what changed; answers the machines left.
    async fn move_machines(
        &self,
        stored: &StoredPool,
        provider: &Arc<Provider>,
        machines: Vec<StoredMachine>,
    ) -> Result<Vec<StoredMachine>, StoreError> {
        let pool = &stored.pool;
        let request = if machines
            .iter()
            .any(|m| m.machine.state == MachineState::Provisioning)
        {
            Some(self.join_request(pool).await)
        } else {
            None
        };
        let outcomes = futures_util::future::join_all(
            machines
                .iter()
                .map(|machine| self.move_machine(pool, provider, machine, request.as_ref())),
        )
        .await;
        let mut left = Vec::new();
        for (machine, outcome) in machines.into_iter().zip(outcomes) {
            match outcome {
                Outcome::Keep => left.push(machine),
                Outcome::Write(written, event) => {
                    self.state
                        .store
                        .write_pool_machine(&written, self.fence)
                        .await?;
                    if let Some((kind, message)) = event {
                        tracing::info!(pool = %pool.name, machine = %written.machine.name, event = kind, "{message}");
                        self.state
                            .store
                            .add_pool_event(pool.id, kind, &message)
                            .await?;
                    }
                    left.push(written);
                }
                Outcome::Remove(message) => {
                    self.state
                        .store
                        .remove_pool_machine(machine.machine.id, self.fence)
                        .await?;
                    if let Some(worker_id) = machine.machine.worker_id {
                        match self.state.store.delete_worker(worker_id).await {
                            Ok(_) | Err(StoreError::NotFound { .. }) => {}
                            Err(e) => return Err(e),
                        }
                    }
                    tracing::info!(pool = %pool.name, machine = %machine.machine.name, "{message}");
                    self.state
                        .store
                        .add_pool_event(pool.id, "deleted", &message)
                        .await?;
                }
            }
        }
        Ok(left)
    }

    /// What a new machine of the pool is told: the cluster's token and the servers.
    async fn join_request(&self, pool: &WorkerPool) -> Result<MachineRequest, String> {
        let joining = crate::api::workers::joining(self.state, String::new())
            .await
            .map_err(|e| e.message)?;
        let registration =
            crate::service::clusters::registration(&self.state.store, &joining, pool.cluster_id)
                .await
                .map_err(|e| format!("the cluster's registration token: {}", e.message))?;
        Ok(MachineRequest {
            name: String::new(),
            cluster_token: registration.token,
            server_urls: registration.server_urls,
            instance_type: pool.instance_type.clone(),
            image: pool.image.clone(),
            region: pool.region.clone(),
            gpus: pool.gpus.clone(),
            labels: pool_labels(pool),
        })
    }

    async fn move_machine(
        &self,
        pool: &WorkerPool,
        provider: &Provider,
        stored: &StoredMachine,
        request: Option<&Result<MachineRequest, String>>,
    ) -> Outcome {
        let m = &stored.machine;
        let now = Timestamp::now().as_millis();
        let mut next = stored.clone();
        let failed = |next: &mut StoredMachine, what: &str, why: String| {
            next.attempts += 1;
            let wait = backoff(next.attempts);
            next.next_attempt_at = now + millis(wait);
            next.machine.state_message = format!(
                "{what} failed ({} time(s)): {why}; trying again in {} s",
                next.attempts,
                wait.as_secs()
            );
            let event = format!("{what} {} failed: {why}", m.name);
            Outcome::Write(next.clone(), Some(("failed", event)))
        };
        match m.state {
            MachineState::Deleting if now >= stored.next_attempt_at => {
                match provider.delete(&m.name, m.external_id.as_deref()).await {
                    Ok(()) => {
                        Outcome::Remove(format!("machine {} deleted at the provider", m.name))
                    }
                    Err(e) => failed(&mut next, "deleting machine", e.0),
                }
            }
            MachineState::Provisioning if pool.deleting => Outcome::Remove(format!(
                "machine {} was not created: its pool was deleted",
                m.name
            )),
            MachineState::Provisioning if now >= stored.next_attempt_at => {
                let request = match request {
                    Some(Ok(request)) => MachineRequest {
                        name: m.name.clone(),
                        ..request.clone()
                    },
                    Some(Err(why)) => return failed(&mut next, "creating machine", why.clone()),
                    None => return Outcome::Keep,
                };
                let found = match provider.find(&m.name).await {
                    Ok(found) => found,
                    Err(e) => return failed(&mut next, "looking up machine", e.0),
                };
                let (machine, how) = match found {
                    Some(machine) => (
                        machine,
                        "found at the provider (made before this leader took over)",
                    ),
                    None => match provider.create(&request).await {
                        Ok(machine) => (machine, "created"),
                        Err(e) => return failed(&mut next, "creating machine", e.0),
                    },
                };
                next.machine.state = MachineState::Initializing;
                next.machine.external_id = Some(machine.external_id.clone());
                next.machine.address = machine.address;
                next.machine.state_message =
                    "created; waiting for its worker to register".to_owned();
                next.attempts = 0;
                next.next_attempt_at = 0;
                let event = format!("machine {} {how} as {}", m.name, machine.external_id);
                Outcome::Write(next, Some(("created", event)))
            }
            _ if pool.deleting && m.state != MachineState::Deleting => {
                next.machine.state = MachineState::Deleting;
                next.machine.state_message = "its pool was deleted; deleting it".to_owned();
                next.attempts = 0;
                next.next_attempt_at = 0;
                Outcome::Write(next, None)
            }
            MachineState::Initializing | MachineState::Registered => {
                self.watch_registered(pool, provider, stored, next, now)
                    .await
            }
            _ => Outcome::Keep,
        }
    }

    /// A created machine: its worker registering, hosting or not, and whether the
    /// provider still has it when its worker is silent.
    async fn watch_registered(
        &self,
        pool: &WorkerPool,
        provider: &Provider,
        stored: &StoredMachine,
        mut next: StoredMachine,
        now: i64,
    ) -> Outcome {
        let m = &stored.machine;
        let worker = self
            .workers
            .iter()
            .find(|w| w.name == m.name && w.cluster_id == pool.cluster_id);
        let silent = worker
            .is_none_or(|w| matches!(w.state, WorkerState::NotReady | WorkerState::Unreachable));
        if self.check_vanished && silent && now - stored.machine.updated_at.as_millis() > 60_000 {
            if let Ok(None) = provider.find(&m.name).await {
                next.machine.state = MachineState::Provisioning;
                next.machine.external_id = None;
                next.machine.state_message =
                    "the provider no longer has it; making it again".to_owned();
                let event = format!(
                    "machine {} is gone at the provider and its worker is silent: making it again",
                    m.name
                );
                if let Some(worker) = worker {
                    // The new machine registers afresh, under the same name.
                    let _ = self.state.store.delete_worker(worker.id).await;
                }
                next.machine.worker_id = None;
                return Outcome::Write(next, Some(("failed", event)));
            }
        }
        let Some(worker) = worker else {
            if m.state == MachineState::Initializing
                && now - m.updated_at.as_millis() > millis(SLOW_REGISTRATION)
                && !m.state_message.starts_with("no worker")
            {
                next.machine.state_message = format!(
                    "no worker named {} has registered in {} min: see the machine's console \
                     or its cloud-init log (/var/log/cloud-init-output.log)",
                    m.name,
                    SLOW_REGISTRATION.as_secs() / 60
                );
                return Outcome::Write(next, None);
            }
            return Outcome::Keep;
        };
        let mut event = None;
        if m.state == MachineState::Initializing || m.worker_id != Some(worker.id) {
            next.machine.state = MachineState::Registered;
            next.machine.worker_id = Some(worker.id);
            next.machine.state_message = String::new();
            event = Some((
                "registered",
                format!(
                    "machine {}'s worker registered (worker {})",
                    m.name, worker.id
                ),
            ));
        }
        let idle_since = if self.busy.contains(&worker.id) {
            None
        } else {
            Some(m.idle_since.unwrap_or(Timestamp::from_millis(now)))
        };
        next.machine.idle_since = idle_since;
        if event.is_none() && next.machine.idle_since == m.idle_since {
            return Outcome::Keep;
        }
        Outcome::Write(next, event)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_after_failures_double_up_to_five_minutes() {
        assert_eq!(backoff(1), Duration::from_secs(5));
        assert_eq!(backoff(2), Duration::from_secs(10));
        assert_eq!(backoff(4), Duration::from_secs(40));
        assert_eq!(backoff(9), MAX_BACKOFF);
        assert_eq!(backoff(60), MAX_BACKOFF);
    }

    #[test]
    fn model_names_are_listed_once_in_order() {
        assert_eq!(model_names(["b", "a", "b"].into_iter()), "b, a");
    }
}
