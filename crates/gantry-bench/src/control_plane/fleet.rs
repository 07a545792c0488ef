//! The simulated fleet: N **test doubles** of the gantry worker agent, each a pair of
//! light tasks on the load process's one tokio runtime. Nothing here runs a backend or
//! touches a GPU; a simulated worker only speaks the agent's side of the protocol, through
//! `gantry-client` like the real agent:
//!
//! * it registers with a registration token (worker i with cluster i mod K's) and a status of `gpus_per_worker`
//!   simulated GPUs (flagged `simulated`, as every API response shows them);
//! * it heartbeats every `heartbeat_interval` (fixed-rate ticks like the real agent's),
//!   its first heartbeat offset within the interval so that the fleet's heartbeats are
//!   spread evenly over it instead of arriving together; optionally it also refreshes its
//!   server list every interval, as the real agent does;
//! * it holds one assignment watch (`GET /api/v1/worker/assignments?watch=true`) and
//!   re-opens it when the server ends it (a lagged watch gets an `ERROR` line);
//! * each instance placed on it (`scheduled`) it reports `starting`, then `running` with
//!   an address (a port nobody listens on: nothing routes requests here).
//!
//! All workers share one `gantry_client::Client`'s connection pool ([`Client::for_token`]
//! gives each its own credential over the same pool): each assignment watch holds one
//! HTTP/1.1 connection for its life, and the short calls (heartbeats, reports) reuse the
//! idle ones, so the load process opens about N + (calls in flight) sockets. Reports and
//! registrations are bounded by semaphores; heartbeats are bounded by their schedule.
//!
//! The fleet records what the phases measure: every heartbeat's latency with the time it
//! was answered, heartbeats that failed or came later than the interval allows, and when
//! each instance was first seen placed and when its `running` report was accepted.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use gantry_client::{Client, ClientError};
use gantry_types::{
    GpuDevice, InstanceState, InstanceStateReport, ModelInstance, SystemInfo, WatchEvent,
    WorkerRegister, WorkerStatus,
};
use tokio::sync::{watch, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::measure::Latencies;

/// How much later than the interval a heartbeat may be answered and still count as on
/// time (the gap between two answered heartbeats of one worker).
pub const ON_TIME_SLACK: Duration = Duration::from_secs(2);
/// How many times a report or a registration is tried before it counts as failed.
const ATTEMPTS: u32 = 5;
/// The wait between two tries, and before an assignment watch is opened again.
const RETRY_AFTER: Duration = Duration::from_millis(500);

/// How the fleet is made and how it behaves.
#[derive(Debug, Clone)]
pub struct FleetConfig {
    pub workers: usize,
    pub heartbeat_interval: Duration,
    /// Registrations started per second.
    pub register_rate: f64,
    /// Registrations in flight at most.
    pub register_concurrency: usize,
    /// State reports in flight at most, over the whole fleet.
    pub report_concurrency: usize,
    /// Also call `GET /api/v1/worker/servers` every interval, as the real agent does.
    pub refresh_servers: bool,
    pub gpus_per_worker: u32,
    /// Memory of each simulated GPU.
    pub gpu_memory: u64,
}

/// How far the instances of one model have come, as the fleet saw them.
#[derive(Debug, Clone, Copy)]
pub struct ModelProgress {
    /// Instances seen placed on some worker (arrived on its assignment stream).
    pub placed: usize,
    /// Instances whose `running` report the server accepted.
    pub running: usize,
    pub last_placed_at: Option<Instant>,
    pub last_running_at: Option<Instant>,
}

/// Everything the fleet counts, shared by its tasks.
#[derive(Debug, Default)]
pub struct FleetStats {
    /// (answered at, latency) of every successful heartbeat.
    heartbeats: Mutex<Vec<(Instant, Duration)>>,
    pub heartbeat_failures: AtomicU64,
    /// Heartbeats answered more than the interval plus [`ON_TIME_SLACK`] after the
    /// worker's previous answered one (or after its registration).
    pub late_heartbeats: AtomicU64,
    /// Workers with at least one failed or late heartbeat.
    late_workers: Mutex<HashSet<i64>>,
    /// Longest gap between two answered heartbeats of one worker, in milliseconds.
    pub max_heartbeat_gap_ms: AtomicU64,
    pub server_list_failures: AtomicU64,
    pub watch_opens: AtomicU64,
    pub watch_open_failures: AtomicU64,
    /// Assignment streams that ended other than at shutdown (broken, closed, `ERROR`).
    pub watch_ends: AtomicU64,
    /// Streams the server ended with `ERROR` (a watcher that fell behind).
    pub watch_errors: AtomicU64,
    pub reports: AtomicU64,
    /// Reports given up after [`ATTEMPTS`] tries.
    pub report_failures: AtomicU64,
    /// Reports answered 404: the instance was deleted or moved meanwhile (churn).
    pub reports_gone: AtomicU64,
    pub registration_failures: AtomicU64,
    placements: Mutex<Placements>,
}

#[derive(Debug, Default)]
struct Placements {
    /// Instances seen placed, with their model.
    seen: HashMap<i64, i64>,
    running: HashSet<i64>,
    models: HashMap<i64, ModelProgress>,
}

fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .expect("fleet locks are never poisoned: no code panics holding one")
}

impl FleetStats {
    /// The latencies of heartbeats answered between `from` and `to`.
    pub fn heartbeat_latencies(&self, from: Instant, to: Instant) -> Latencies {
        let mut latencies = Latencies::default();
        for (at, latency) in locked(&self.heartbeats).iter() {
            if *at >= from && *at <= to {
                latencies.push(*latency);
            }
        }
        latencies
    }

    /// Whether every heartbeat of `worker_id` so far was answered, and on time.
    pub fn on_time(&self, worker_id: i64) -> bool {
        !locked(&self.late_workers).contains(&worker_id)
    }

    pub fn late_worker_count(&self) -> usize {
        locked(&self.late_workers).len()
    }

    /// How far the instances of `model_id` have come.
    pub fn model_progress(&self, model_id: i64) -> Option<ModelProgress> {
        locked(&self.placements).models.get(&model_id).copied()
    }

    /// Instances seen placed and seen running, over every model.
    pub fn totals(&self) -> (usize, usize) {
        let placements = locked(&self.placements);
        (placements.seen.len(), placements.running.len())
    }

    fn record_heartbeat(&self, worker_id: i64, latency: Duration, gap: Duration, limit: Duration) {
        locked(&self.heartbeats).push((Instant::now(), latency));
        let gap_ms = u64::try_from(gap.as_millis()).unwrap_or(u64::MAX);
        self.max_heartbeat_gap_ms
            .fetch_max(gap_ms, Ordering::Relaxed);
        if gap > limit {
            self.late_heartbeats.fetch_add(1, Ordering::Relaxed);
            locked(&self.late_workers).insert(worker_id);
        }
    }

    fn record_heartbeat_failure(&self, worker_id: i64) {
        self.heartbeat_failures.fetch_add(1, Ordering::Relaxed);
        locked(&self.late_workers).insert(worker_id);
    }

    /// Counts an instance seen placed (once per instance); `true` when it is new.
    fn record_placed(&self, instance: &ModelInstance) -> bool {
        let mut placements = locked(&self.placements);
        if placements
            .seen
            .insert(instance.id, instance.model_id)
            .is_some()
        {
            return false;
        }
        let progress = placements
            .models
            .entry(instance.model_id)
            .or_insert(ModelProgress {
                placed: 0,
                running: 0,
                last_placed_at: None,
                last_running_at: None,
            });
        progress.placed += 1;
        progress.last_placed_at = Some(Instant::now());
        true
    }

    fn record_running(&self, instance_id: i64, model_id: i64) {
        let mut placements = locked(&self.placements);
        if !placements.running.insert(instance_id) {
            return;
        }
        if let Some(progress) = placements.models.get_mut(&model_id) {
            progress.running += 1;
            progress.last_running_at = Some(Instant::now());
        }
    }
}

/// What every task of the fleet shares.
#[derive(Debug)]
struct Shared {
    config: FleetConfig,
    stats: Arc<FleetStats>,
    reports: Semaphore,
    /// Bumped whenever an instance is seen placed or running, so that waiters re-check.
    progress: watch::Sender<u64>,
    shutdown: CancellationToken,
    tasks: TaskTracker,
}

impl Shared {
    fn bump(&self) {
        self.progress.send_modify(|n| *n += 1);
    }
}

/// One registered simulated worker.
#[derive(Debug, Clone)]
pub struct SimulatedWorker {
    pub id: i64,
    pub name: String,
}

/// The running fleet. Its tasks end when the fleet's token is cancelled (see
/// [`Fleet::shutdown`]).
#[derive(Debug)]
pub struct Fleet {
    pub workers: Vec<SimulatedWorker>,
    pub stats: Arc<FleetStats>,
    /// How long the ramp of registrations took.
    pub registration_time: Duration,
    shared: Arc<Shared>,
}

/// The status a simulated worker registers with: `gpus` simulated GPUs of `memory` each.
pub fn simulated_status(name: &str, gpus: u32, memory: u64) -> WorkerStatus {
    WorkerStatus {
        gpus: (0..gpus)
            .map(|index| GpuDevice {
                index,
                name: "Simulated GPU (gantry-bench)".to_owned(),
                uuid: format!("SIM-{name}-{index}"),
                memory_total: memory,
                memory_used: 0,
                utilization: None,
                temperature: None,
                simulated: true,
            })
            .collect(),
        system: SystemInfo {
            cpu_count: 64,
            load_average: 0.0,
            memory_total: 512 << 30,
            memory_available: 512 << 30,
            disk_free: 1 << 40,
            os: "linux".to_owned(),
            hostname: name.to_owned(),
        },
        backends: vec!["custom".to_owned()],
        installed_backends: Vec::new(),
        found_backends: Vec::new(),
    }
}

/// Where in the interval worker `index` heartbeats: the fractional parts of multiples of
/// the golden ratio, which spread any number of workers evenly over the interval.
pub fn heartbeat_offset(index: usize, interval: Duration) -> Duration {
    const GOLDEN: f64 = 0.618_033_988_749_894_9;
    interval.mul_f64((index as f64 * GOLDEN).fract())
}

impl Fleet {
    /// Registers `config.workers` simulated workers at the configured rate and starts
    /// each one's heartbeats and assignment watch as soon as it is registered. Returns
    /// once every registration has been answered (or given up).
    pub async fn start(
        base: &Client,
        registration_tokens: &[String],
        config: FleetConfig,
        shutdown: CancellationToken,
        tasks: TaskTracker,
    ) -> Fleet {
        let stats = Arc::new(FleetStats::default());
        let (progress, _) = watch::channel(0);
        let shared = Arc::new(Shared {
            reports: Semaphore::new(config.report_concurrency.max(1)),
            config: config.clone(),
            stats: Arc::clone(&stats),
            progress,
            shutdown,
            tasks,
        });
        let started = Instant::now();
        let registering = Arc::new(Semaphore::new(config.register_concurrency.max(1)));
        let registered = Arc::new(Mutex::new(Vec::with_capacity(config.workers)));
        let mut ramp =
            tokio::time::interval(Duration::from_secs_f64(1.0 / config.register_rate.max(1.0)));
        ramp.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        let ramp_tasks = TaskTracker::new();
        for index in 0..config.workers {
            ramp.tick().await;
            let permit = Arc::clone(&registering)
                .acquire_owned()
                .await
                .expect("the registration semaphore is never closed");
            let base = base.clone();
            // Worker i joins cluster i mod K.
            let token = registration_tokens[index % registration_tokens.len()].clone();
            let shared = Arc::clone(&shared);
            let registered = Arc::clone(&registered);
            ramp_tasks.spawn(async move {
                let _permit = permit;
                if let Some(worker) = register(&base, &token, index, &shared).await {
                    locked(&registered).push(worker);
                }
            });
        }
        ramp_tasks.close();
        ramp_tasks.wait().await;
        let mut workers = std::mem::take(&mut *locked(&registered));
        workers.sort_by_key(|w| w.id);
        Fleet {
            workers,
            stats,
            registration_time: started.elapsed(),
            shared,
        }
    }

    /// Waits until `done` holds for the fleet's counts (checked at every placement and
    /// running report), or `deadline` passes; `false` then.
    pub async fn wait_until(&self, deadline: Instant, done: impl Fn(&FleetStats) -> bool) -> bool {
        let mut progress = self.shared.progress.subscribe();
        loop {
            progress.borrow_and_update();
            if done(&self.stats) {
                return true;
            }
            match tokio::time::timeout_at(deadline, progress.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => return done(&self.stats),
            }
        }
    }

    /// Stops every task of the fleet (heartbeats, watches, reports) and waits for them.
    pub async fn shutdown(self) {
        self.shared.shutdown.cancel();
        self.shared.tasks.close();
        self.shared.tasks.wait().await;
    }
}

/// Registers worker `index` (a few tries) and starts its tasks.
async fn register(
    base: &Client,
    token: &str,
    index: usize,
    shared: &Arc<Shared>,
) -> Option<SimulatedWorker> {
    let config = &shared.config;
    let name = format!("sim-{index:05}");
    let request = WorkerRegister {
        name: name.clone(),
        labels: Default::default(),
        // The worker's own API (logs): nothing listens there; the benchmark never asks.
        address: "127.0.0.1:9".to_owned(),
        status: simulated_status(&name, config.gpus_per_worker, config.gpu_memory),
    };
    let mut attempt = 0;
    let registered = loop {
        attempt += 1;
        match base.register_worker(token, &request).await {
            Ok((registered, _)) => break registered,
            Err(e) if attempt < ATTEMPTS => {
                tracing::warn!(worker = %name, error = %e, "registration failed; trying again");
                tokio::time::sleep(RETRY_AFTER).await;
            }
            Err(e) => {
                tracing::error!(worker = %name, error = %e, "registration failed; giving up");
                shared
                    .stats
                    .registration_failures
                    .fetch_add(1, Ordering::Relaxed);
                return None;
            }
        }
    };
    let Some(credential) = registered.credential else {
        tracing::error!(worker = %name, "a first registration answered without a credential");
        shared
            .stats
            .registration_failures
            .fetch_add(1, Ordering::Relaxed);
        return None;
    };
    let worker = SimulatedWorker {
        id: registered.worker.id,
        name,
    };
    let client = base.for_token(credential);
    let offset = heartbeat_offset(index, config.heartbeat_interval);
    shared.tasks.spawn(heartbeats(
        worker.id,
        client.clone(),
        offset,
        Arc::clone(shared),
    ));
    shared
        .tasks
        .spawn(assignments(worker.id, client, Arc::clone(shared)));
    Some(worker)
}

/// How long a heartbeat may take before it counts as failed (the client's default).
const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(30);

/// A sample as a worker with `gpus` GPUs of `memory` each sends it with its heartbeats.
pub fn busy_sample(gpus: u32, memory: u64) -> gantry_types::WorkerSample {
    gantry_types::WorkerSample {
        at: None,
        cpu_percent: Some(37.5),
        memory_used: 96 << 30,
        memory_total: 512 << 30,
        gpus: (0..gpus)
            .map(|index| gantry_types::GpuSample {
                index,
                memory_used: memory / 2,
                memory_total: memory,
                utilization: Some(60),
            })
            .collect(),
    }
}

/// Heartbeats every interval from `offset` on, recording each one, with a sample.
async fn heartbeats(worker_id: i64, client: Client, offset: Duration, shared: Arc<Shared>) {
    let interval = shared.config.heartbeat_interval;
    let limit = interval + ON_TIME_SLACK;
    let mut last_answered = Instant::now();
    let mut tick = tokio::time::interval_at(Instant::now() + offset, interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // What a real worker sends with each heartbeat: how busy its host and GPUs are.
    // Sent as often as the server asks, as a worker does.
    let sample = busy_sample(shared.config.gpus_per_worker, shared.config.gpu_memory);
    let mut sample_due = Instant::now();
    loop {
        tokio::select! {
            () = shared.shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let sent = Instant::now();
        let with_sample = sent >= sample_due;
        let call = async {
            if with_sample {
                let (worker, every) = client
                    .heartbeat_with_sample(HEARTBEAT_TIMEOUT, &sample)
                    .await?;
                sample_due = Instant::now() + every.unwrap_or(Duration::from_secs(10));
                Ok(worker)
            } else {
                client.heartbeat_within(HEARTBEAT_TIMEOUT, None).await
            }
        };
        let result = tokio::select! {
            () = shared.shutdown.cancelled() => return,
            result = call => result,
        };
        match result {
            Ok(_) => {
                let now = Instant::now();
                shared
                    .stats
                    .record_heartbeat(worker_id, now - sent, now - last_answered, limit);
                last_answered = now;
            }
            Err(e) => {
                tracing::warn!(worker_id, error = %e, "heartbeat failed");
                shared.stats.record_heartbeat_failure(worker_id);
            }
        }
        if shared.config.refresh_servers {
            let listed = tokio::select! {
                () = shared.shutdown.cancelled() => return,
                listed = client.worker_servers() => listed,
            };
            if let Err(e) = listed {
                tracing::warn!(worker_id, error = %e, "server list failed");
                shared
                    .stats
                    .server_list_failures
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Holds the worker's assignment watch, opening it again whenever it ends, and reports
/// each instance placed here `starting` then `running`.
async fn assignments(worker_id: i64, client: Client, shared: Arc<Shared>) {
    // Instances whose reports were started: a repeated or late `scheduled` event of one
    // (a watch may send a change twice) must not send it back to `starting`.
    let mut handled: HashSet<i64> = HashSet::new();
    let stats = &shared.stats;
    loop {
        let opened = tokio::select! {
            () = shared.shutdown.cancelled() => return,
            opened = client.watch_assignments() => opened,
        };
        match opened {
            Ok(mut stream) => {
                stats.watch_opens.fetch_add(1, Ordering::Relaxed);
                loop {
                    let event = tokio::select! {
                        () = shared.shutdown.cancelled() => return,
                        event = stream.next() => event,
                    };
                    match event {
                        None => break,
                        Some(Err(e)) => {
                            tracing::warn!(worker_id, error = %e, "assignment stream broke");
                            break;
                        }
                        Some(Ok(WatchEvent::Error { error })) => {
                            tracing::warn!(worker_id, code = %error.code, message = %error.message, "assignment stream ended by the server");
                            stats.watch_errors.fetch_add(1, Ordering::Relaxed);
                            break;
                        }
                        Some(Ok(WatchEvent::Heartbeat)) => {}
                        Some(Ok(WatchEvent::Deleted { object })) => {
                            handled.remove(&object.id);
                        }
                        Some(Ok(
                            WatchEvent::Created { object } | WatchEvent::Updated { object },
                        )) => {
                            if object.worker_id != Some(worker_id) {
                                continue;
                            }
                            if stats.record_placed(&object) {
                                shared.bump();
                            }
                            if object.state == InstanceState::Scheduled && handled.insert(object.id)
                            {
                                shared.tasks.spawn(report_running(
                                    client.clone(),
                                    object,
                                    Arc::clone(&shared),
                                ));
                            }
                        }
                    }
                }
                stats.watch_ends.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                tracing::warn!(worker_id, error = %e, "assignment watch did not open");
                stats.watch_open_failures.fetch_add(1, Ordering::Relaxed);
            }
        }
        tokio::select! {
            () = shared.shutdown.cancelled() => return,
            () = tokio::time::sleep(RETRY_AFTER) => {}
        }
    }
}

/// What a simulated instance listens on: a port derived from its id (nobody listens).
fn simulated_port(instance_id: i64) -> u16 {
    20_000 + u16::try_from(instance_id.rem_euclid(40_000)).expect("below 40,000")
}

/// Reports an instance `starting`, then `running`.
async fn report_running(client: Client, instance: ModelInstance, shared: Arc<Shared>) {
    let port = simulated_port(instance.id);
    for state in [InstanceState::Starting, InstanceState::Running] {
        let report = InstanceStateReport {
            state,
            state_message: String::new(),
            port: Some(port),
            address: (state == InstanceState::Running).then(|| format!("127.0.0.1:{port}")),
            restart_count: 0,
            download: None,
            install: None,
            backend_version: None,
        };
        if !send_report(&client, instance.id, &report, &shared).await {
            return;
        }
    }
    shared.stats.record_running(instance.id, instance.model_id);
    shared.bump();
}

/// Sends one report, a few tries; `false` when it did not land (or the instance is gone).
async fn send_report(
    client: &Client,
    instance_id: i64,
    report: &InstanceStateReport,
    shared: &Shared,
) -> bool {
    let stats = &shared.stats;
    for attempt in 1..=ATTEMPTS {
        let result = {
            let Ok(_permit) = shared.reports.acquire().await else {
                return false;
            };
            tokio::select! {
                () = shared.shutdown.cancelled() => return false,
                result = client.report_state(instance_id, report) => result,
            }
        };
        stats.reports.fetch_add(1, Ordering::Relaxed);
        match result {
            Ok(_) => return true,
            Err(ClientError::Api { status: 404, .. }) => {
                stats.reports_gone.fetch_add(1, Ordering::Relaxed);
                return false;
            }
            Err(e) if attempt < ATTEMPTS => {
                tracing::warn!(instance_id, error = %e, "state report failed; trying again");
                tokio::select! {
                    () = shared.shutdown.cancelled() => return false,
                    () = tokio::time::sleep(RETRY_AFTER) => {}
                }
            }
            Err(e) => {
                tracing::error!(instance_id, error = %e, "state report failed; giving up");
                stats.report_failures.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heartbeat_offsets_spread_over_the_interval() {
        let interval = Duration::from_secs(15);
        let mut per_second = [0usize; 15];
        for index in 0..1500 {
            let offset = heartbeat_offset(index, interval);
            assert!(offset < interval);
            per_second[offset.as_secs() as usize] += 1;
        }
        // 100 a second on average; the golden-ratio sequence stays close to it.
        assert!(
            per_second.iter().all(|n| (90..=110).contains(n)),
            "{per_second:?}"
        );
    }

    #[test]
    fn simulated_gpus_say_they_are_simulated() {
        let status = simulated_status("sim-00001", 8, 80 << 30);
        assert_eq!(status.gpus.len(), 8);
        assert!(status.gpus.iter().all(|gpu| gpu.simulated));
        assert_eq!(status.gpus[7].uuid, "SIM-sim-00001-7");
    }

    #[test]
    fn simulated_ports_stay_in_range() {
        for id in [0, 1, 39_999, 40_000, 1_000_000] {
            assert!(simulated_port(id) >= 20_000);
        }
    }
}
