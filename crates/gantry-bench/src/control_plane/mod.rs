//! The control-plane load benchmark (`control-plane-load`): one real `gantry server`
//! against N simulated workers (a **test double** of the worker agent, see [`fleet`]),
//! measured in phases, each printing its figures as it ends:
//!
//! * **a. fleet**: N workers register at a bounded rate, then heartbeat every interval
//!   (spread over it) and hold their assignment watches; over a window (`BENCH_WINDOW`)
//!   the heartbeat latency p50/p99 and the server's CPU (percent of one core) and RSS,
//!   read from `/proc/<pid>/stat` and `/proc/<pid>/status`;
//! * **b. deploy**: M instances of `custom` models (`BENCH_REPLICAS` replicas each, one
//!   simulated GPU and `BENCH_INSTANCE_GPU_MEMORY` each) are created held back by a
//!   worker selector that no worker matches, so they wait `pending`; then every model's
//!   selector is cleared at once and the time is taken until the server counts no
//!   instance pending (polled), until the fleet has seen all M placed (on its assignment
//!   streams: `scheduled`) and until the server has accepted all M `running` reports.
//!   Then one more model with 100 replicas is created on the loaded cluster and timed
//!   from its creation to all 100 placed;
//! * **c. lists**: p50/p99 of `GET /api/v1/workers?page=…&per_page=100` and of
//!   `GET /api/v1/model-instances?page=…&per_page=100`, cycling over every page;
//! * **e. churn**: `BENCH_CYCLES` create → placed → delete cycles of a 1-replica model
//!   (`BENCH_CHURN_CONCURRENCY` at a time); the server's median RSS over the first 1,000
//!   cycles (a tenth of them when there are fewer than 10,000) against its median over
//!   the last as many;
//! * **d. flips** (over the whole run, so printed last): workers that went from `ready`
//!   to `not_ready` or `unreachable`, as an admin's worker watch saw them, split by
//!   whether every heartbeat of theirs was answered on time.
//!
//! The fleet keeps heartbeating through every phase, so each phase also prints the
//! heartbeat latency it saw. The load process runs on the same machine as the server (and
//! its database): its own CPU is printed next to the server's.
//!
//! Configuration is read from the environment ([`Config::from_env`]);
//! `scripts/bench-control-plane.sh` starts the server and runs this.

pub mod fleet;
pub mod measure;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context};
use futures_util::stream::{self, StreamExt};
use gantry_backends::custom;
use gantry_client::Client;
use gantry_types::query::MAX_PER_PAGE;
use gantry_types::{
    BackendKind, BackendName, InstanceQuery, InstanceState, ModelCreate, ModelSource, ModelUpdate,
    PlacementStrategy, WatchEvent, WorkerQuery, WorkerState,
};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use fleet::{Fleet, FleetConfig, FleetStats};
use measure::{mib, Latencies, ProcessSampler};

/// The label of the models held back until the deploy phase releases them.
const HOLD_LABEL: &str = "gantry-bench-hold";
/// Replicas of the model timed on the loaded cluster.
const PROBE_REPLICAS: u32 = 100;
/// How often a server's CPU and RSS are sampled.
const SAMPLE_PERIOD: Duration = Duration::from_millis(500);
/// How often the deploy phase counts the pending instances.
const PENDING_POLL: Duration = Duration::from_millis(100);
/// Registrations in flight at once.
const REGISTER_CONCURRENCY: usize = 32;
/// Calls of the setup (creating and releasing models) in flight at once.
const SETUP_CONCURRENCY: usize = 8;

/// What the benchmark is run with, from `BENCH_*` variables.
#[derive(Debug, Clone)]
pub struct Config {
    /// `BENCH_URL`: the server, `http://127.0.0.1:PORT`.
    pub url: String,
    /// `BENCH_ADMIN_PASSWORD`: the password of the user `admin`.
    pub admin_password: String,
    /// `BENCH_REGISTRATION_TOKEN`: the cluster's registration token.
    pub registration_token: String,
    /// `BENCH_SERVER_PID`: the server process whose CPU and RSS are sampled.
    pub server_pid: u32,
    /// `BENCH_DATABASE`: a label for the summary (`sqlite`, `postgres`).
    pub database: String,
    /// `BENCH_WORKERS` (N, default 1000).
    pub workers: usize,
    /// `BENCH_CLUSTERS` (default 1): the fleet and the models split evenly over the
    /// default cluster and `bench-2` … `bench-K`, made by the run.
    pub clusters: usize,
    /// `BENCH_INSTANCES` (M, default 10000).
    pub instances: usize,
    /// `BENCH_REPLICAS`: replicas of each deployed model (default 100).
    pub replicas_per_model: u32,
    /// `BENCH_WINDOW`: seconds of the steady-state window (default 30).
    pub window: Duration,
    /// `BENCH_HEARTBEAT_INTERVAL`: seconds; the server must be started with the same
    /// `heartbeat_interval` (default 15).
    pub heartbeat_interval: Duration,
    /// `BENCH_REGISTER_RATE`: registrations started per second (default 250).
    pub register_rate: f64,
    /// `BENCH_REPORT_CONCURRENCY`: state reports in flight (default 32).
    pub report_concurrency: usize,
    /// `BENCH_SERVER_LIST`: `1` (default) to refresh each worker's server list every
    /// interval like the real agent, `0` to send heartbeats only.
    pub refresh_servers: bool,
    /// `BENCH_GPU_MEMORY_GIB`: memory of each simulated GPU (default 80).
    pub gpu_memory: u64,
    /// `BENCH_INSTANCE_GPU_MEMORY`: `GANTRY_GPU_MEMORY` of every model (default `1GiB`).
    pub instance_gpu_memory: String,
    /// `BENCH_LIST_REQUESTS`: requests per list endpoint (default 1000).
    pub list_requests: usize,
    /// `BENCH_CYCLES`: create/delete cycles of the churn phase (default 10000; 0 skips).
    pub cycles: usize,
    /// `BENCH_CHURN_CONCURRENCY`: cycles in flight (default 16).
    pub churn_concurrency: usize,
    /// `BENCH_PHASE_TIMEOUT`: seconds a wait of a phase may take (default 300).
    pub phase_timeout: Duration,
    /// `BENCH_CLK_TCK`: clock ticks per second of `/proc/<pid>/stat` (default 100).
    pub clock_ticks_per_second: u64,
    /// `BENCH_MODEL_PATH`: the `local_path` of the models (never read: a custom model's
    /// claim is declared in its environment and no backend runs; default `/bench/model`).
    pub model_path: String,
}

fn required(name: &str) -> anyhow::Result<String> {
    std::env::var(name).with_context(|| format!("set {name} (see the module documentation)"))
}

fn optional<T: std::str::FromStr>(name: &str, default: T) -> anyhow::Result<T>
where
    T::Err: std::fmt::Display,
{
    match std::env::var(name) {
        Ok(text) if !text.trim().is_empty() => text
            .trim()
            .parse()
            .map_err(|e| anyhow::anyhow!("{name}={text:?}: {e}")),
        _ => Ok(default),
    }
}

impl Config {
    pub fn from_env() -> anyhow::Result<Config> {
        let config = Config {
            url: required("BENCH_URL")?,
            admin_password: required("BENCH_ADMIN_PASSWORD")?,
            registration_token: required("BENCH_REGISTRATION_TOKEN")?,
            server_pid: required("BENCH_SERVER_PID")?
                .trim()
                .parse()
                .context("BENCH_SERVER_PID is a process id")?,
            database: optional("BENCH_DATABASE", "unknown".to_owned())?,
            workers: optional("BENCH_WORKERS", 1000)?,
            clusters: optional("BENCH_CLUSTERS", 1)?,
            instances: optional("BENCH_INSTANCES", 10_000)?,
            replicas_per_model: optional("BENCH_REPLICAS", 100)?,
            window: Duration::from_secs(optional("BENCH_WINDOW", 30)?),
            heartbeat_interval: Duration::from_secs(optional("BENCH_HEARTBEAT_INTERVAL", 15)?),
            register_rate: optional("BENCH_REGISTER_RATE", 250.0)?,
            report_concurrency: optional("BENCH_REPORT_CONCURRENCY", 32)?,
            refresh_servers: optional("BENCH_SERVER_LIST", 1u8)? != 0,
            gpu_memory: optional("BENCH_GPU_MEMORY_GIB", 80u64)? << 30,
            instance_gpu_memory: optional("BENCH_INSTANCE_GPU_MEMORY", "1GiB".to_owned())?,
            list_requests: optional("BENCH_LIST_REQUESTS", 1000)?,
            cycles: optional("BENCH_CYCLES", 10_000)?,
            churn_concurrency: optional("BENCH_CHURN_CONCURRENCY", 16)?,
            phase_timeout: Duration::from_secs(optional("BENCH_PHASE_TIMEOUT", 300)?),
            clock_ticks_per_second: optional("BENCH_CLK_TCK", 100)?,
            model_path: optional("BENCH_MODEL_PATH", "/bench/model".to_owned())?,
        };
        if config.workers == 0 || config.replicas_per_model == 0 {
            bail!("BENCH_WORKERS and BENCH_REPLICAS must be at least 1");
        }
        if config.clusters == 0 || config.clusters > config.workers {
            bail!("BENCH_CLUSTERS must be between 1 and BENCH_WORKERS");
        }
        Ok(config)
    }
}

/// The figures of a run, printed together at the end as one block.
#[derive(Debug, Default)]
struct Summary {
    lines: Vec<String>,
}

impl Summary {
    /// Prints a figure now and keeps it for the summary block.
    fn figure(&mut self, phase: &str, text: String) {
        println!("[{phase}] {text}");
        self.lines.push(format!("{phase:<7} {text}"));
    }
}

/// A target: `met` or `MISSED`, for the summary.
/// Times `requests` reads of the pages of a list of `total` items, `per_page` a page,
/// cycling over the pages; `read` reads one page. Returns the page count and the times.
async fn time_pages<F, Fut>(
    total: u64,
    per_page: u32,
    requests: usize,
    mut read: F,
) -> anyhow::Result<(u64, Latencies)>
where
    F: FnMut(u32) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let pages = total.div_ceil(u64::from(per_page)).max(1);
    let mut latencies = Latencies::default();
    for i in 0..requests {
        let page = u32::try_from(i as u64 % pages + 1).expect("pages fit u32");
        let started = Instant::now();
        read(page).await?;
        latencies.push(started.elapsed());
    }
    Ok((pages, latencies))
}

/// The figure of one list endpoint's page reads, against the 20 ms p99 target.
fn list_figure(
    summary: &mut Summary,
    resource: &str,
    pages: u64,
    per_page: u32,
    total: u64,
    latencies: &Latencies,
) {
    let met = latencies
        .percentile(99.0)
        .is_some_and(|p| p <= Duration::from_millis(20));
    summary.figure(
        "c",
        format!(
            "GET /api/v1/{resource}?page=1..{pages}&per_page={per_page} ({total} {}): {}; \
             target p99 ≤ 20 ms {}",
            resource.trim_start_matches("model-"),
            latencies.summary(),
            verdict(met)
        ),
    );
}

fn verdict(met: bool) -> &'static str {
    if met {
        "met"
    } else {
        "MISSED"
    }
}

/// The clusters the run spreads over, the default one first (with the configured
/// token), then `bench-2` … `bench-K`, made by the run; their ids and tokens.
async fn clusters_of(admin: &Client, config: &Config) -> anyhow::Result<(Vec<i64>, Vec<String>)> {
    let mut ids = vec![gantry_types::DEFAULT_CLUSTER_ID];
    let mut tokens = vec![config.registration_token.clone()];
    for k in 2..=config.clusters {
        let name = format!("bench-{k}");
        let cluster = admin
            .create_cluster(&gantry_types::ClusterCreate::named(&name))
            .await
            .with_context(|| format!("create cluster {name}"))?;
        let registration = admin
            .cluster_registration(cluster.id, None)
            .await
            .with_context(|| format!("read cluster {name}'s registration token"))?;
        ids.push(cluster.id);
        tokens.push(registration.token);
    }
    Ok((ids, tokens))
}

/// The body of a deployed model: a `custom` command that never runs (the workers are
/// simulated), declaring one GPU and `memory` of it per instance.
fn model_body(
    config: &Config,
    cluster: i64,
    name: String,
    replicas: u32,
    held: bool,
) -> ModelCreate {
    let mut env = BTreeMap::new();
    env.insert(custom::GPU_COUNT_ENV.to_owned(), "1".to_owned());
    env.insert(
        custom::GPU_MEMORY_ENV.to_owned(),
        config.instance_gpu_memory.clone(),
    );
    let mut worker_selector = BTreeMap::new();
    if held {
        worker_selector.insert(HOLD_LABEL.to_owned(), "held".to_owned());
    }
    ModelCreate {
        cluster_id: Some(cluster),
        name,
        description: "gantry-bench control-plane load (simulated workers)".to_owned(),
        source: ModelSource::LocalPath {
            path: config.model_path.clone(),
        },
        backend: BackendName::from(BackendKind::Custom),
        backend_version: None,
        backend_args: Vec::new(),
        env,
        replicas,
        worker_selector,
        gpu_selector: None,
        placement_strategy: PlacementStrategy::default(),
        data_parallel_size: None,
        cpu_offload: false,
        custom_command: Some("sleep 600".to_owned()),
        labels: BTreeMap::new(),
    }
}

/// Transitions of workers out of `ready`, as an admin's worker watch sees them.
#[derive(Debug, Default)]
struct Flips {
    /// (worker, the state it went to, when).
    seen: Vec<(i64, WorkerState, Instant)>,
    watch_restarts: usize,
}

/// Watches every worker until `shutdown`, recording each move out of `ready`. The watch
/// is level-triggered: after a restart, the re-listed states are compared with the last
/// known ones, so a move while the watch was down still counts.
fn watch_flips(
    admin: Client,
    tasks: &TaskTracker,
    shutdown: CancellationToken,
) -> Arc<Mutex<Flips>> {
    let flips = Arc::new(Mutex::new(Flips::default()));
    let recorded = Arc::clone(&flips);
    tasks.spawn(async move {
        let mut states: HashMap<i64, WorkerState> = HashMap::new();
        let every_worker = WorkerQuery::default();
        loop {
            let opened = tokio::select! {
                () = shutdown.cancelled() => return,
                opened = admin.watch_workers(&every_worker) => opened,
            };
            match opened {
                Ok(mut stream) => loop {
                    let event = tokio::select! {
                        () = shutdown.cancelled() => return,
                        event = stream.next() => event,
                    };
                    let worker = match event {
                        Some(Ok(WatchEvent::Created { object } | WatchEvent::Updated { object })) => object,
                        Some(Ok(WatchEvent::Deleted { object })) => {
                            states.remove(&object.id);
                            continue;
                        }
                        Some(Ok(WatchEvent::Heartbeat)) => continue,
                        Some(Ok(WatchEvent::Error { error })) => {
                            tracing::warn!(code = %error.code, message = %error.message, "worker watch ended by the server");
                            break;
                        }
                        Some(Err(e)) => {
                            tracing::warn!(error = %e, "worker watch broke");
                            break;
                        }
                        None => break,
                    };
                    let before = states.insert(worker.id, worker.state);
                    let left_ready = matches!(
                        worker.state,
                        WorkerState::NotReady | WorkerState::Unreachable
                    );
                    if before == Some(WorkerState::Ready) && left_ready {
                        recorded
                            .lock()
                            .expect("the flip lock is never poisoned")
                            .seen
                            .push((worker.id, worker.state, Instant::now()));
                    }
                },
                Err(e) => tracing::warn!(error = %e, "worker watch did not open"),
            }
            recorded
                .lock()
                .expect("the flip lock is never poisoned")
                .watch_restarts += 1;
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(Duration::from_millis(500)) => {}
            }
        }
    });
    flips
}

/// The number of instances in `state`, as the server counts them.
async fn count_instances(admin: &Client, state: InstanceState) -> anyhow::Result<u64> {
    let query = InstanceQuery {
        state: Some(state),
        per_page: Some(1),
        ..InstanceQuery::default()
    };
    Ok(admin
        .list_instances(&query)
        .await
        .with_context(|| format!("count {} instances", state.as_str()))?
        .pagination
        .total)
}

/// Samples both processes now and returns the instant: a phase boundary, so that the
/// phase's CPU and memory are read over exactly its stretch.
fn mark(server: &ProcessSampler, load: &ProcessSampler) -> Instant {
    server.sample_now().ok();
    load.sample_now().ok();
    Instant::now()
}

/// The heartbeat latencies and server usage of a phase, as one line.
fn phase_load(
    stats: &FleetStats,
    server: &ProcessSampler,
    load: &ProcessSampler,
    from: Instant,
    to: Instant,
) -> String {
    let heartbeats = stats.heartbeat_latencies(from, to);
    let server_usage = server.usage(from, to).map_or_else(
        || "server: no samples".to_owned(),
        |u| format!("server {u}"),
    );
    let load_cpu = load.usage(from, to).map_or_else(String::new, |u| {
        format!("; load process CPU {:.1} %", u.cpu_percent)
    });
    format!(
        "over {:.1} s: heartbeats {}; {server_usage}{load_cpu}",
        to.saturating_duration_since(from).as_secs_f64(),
        heartbeats.summary()
    )
}

/// Runs every phase and prints the figures.
pub async fn run(config: Config) -> anyhow::Result<()> {
    let shutdown = CancellationToken::new();
    let tasks = TaskTracker::new();
    let result = run_phases(&config, &shutdown, &tasks).await;
    shutdown.cancel();
    tasks.close();
    tasks.wait().await;
    result
}

async fn run_phases(
    config: &Config,
    shutdown: &CancellationToken,
    tasks: &TaskTracker,
) -> anyhow::Result<()> {
    let mut summary = Summary::default();
    let base = Client::new(config.url.clone());
    let login = base
        .login("admin", &config.admin_password)
        .await
        .context("log in as admin")?;
    let admin = base.for_token(login.token);
    let (clusters, tokens) = clusters_of(&admin, config).await?;
    let server = ProcessSampler::start(
        config.server_pid,
        config.clock_ticks_per_second,
        SAMPLE_PERIOD,
        tasks,
        shutdown.clone(),
    )
    .context("sample the server process")?;
    let load = ProcessSampler::start(
        std::process::id(),
        config.clock_ticks_per_second,
        SAMPLE_PERIOD,
        tasks,
        shutdown.clone(),
    )
    .context("sample the load process")?;
    let flips = watch_flips(admin.clone(), tasks, shutdown.clone());
    let run_started = mark(&server, &load);
    println!(
        "control-plane-load: N={} workers × 8 simulated GPUs in {} cluster(s), M={} instances, {} cycles, database {}, heartbeat every {:?}, server {} (pid {}), server-list refresh {}",
        config.workers,
        config.clusters,
        config.instances,
        config.cycles,
        config.database,
        config.heartbeat_interval,
        config.url,
        config.server_pid,
        if config.refresh_servers { "on" } else { "off" }
    );

    // a. The fleet, then its steady state.
    let fleet_shutdown = shutdown.child_token();
    let fleet_tasks = TaskTracker::new();
    let fleet = Fleet::start(
        &base,
        &tokens,
        FleetConfig {
            workers: config.workers,
            heartbeat_interval: config.heartbeat_interval,
            register_rate: config.register_rate,
            register_concurrency: REGISTER_CONCURRENCY,
            report_concurrency: config.report_concurrency,
            refresh_servers: config.refresh_servers,
            gpus_per_worker: 8,
            gpu_memory: config.gpu_memory,
        },
        fleet_shutdown,
        fleet_tasks,
    )
    .await;
    let registered_at = mark(&server, &load);
    let failures = fleet.stats.registration_failures.load(Ordering::Relaxed);
    summary.figure(
        "a",
        format!(
            "registered {} of {} workers in {:.1} s ({:.0}/s asked), {failures} failed; {}",
            fleet.workers.len(),
            config.workers,
            fleet.registration_time.as_secs_f64(),
            config.register_rate,
            phase_load(&fleet.stats, &server, &load, run_started, registered_at)
        ),
    );
    if fleet.workers.is_empty() {
        bail!("no worker registered");
    }
    // The fleet's tasks end whatever the phases come to.
    let bench = Bench {
        config,
        clusters: &clusters,
        admin: &admin,
        fleet: &fleet,
        server: &server,
        load: &load,
    };
    let measured = measure_with_fleet(bench, &flips, run_started, &mut summary).await;
    fleet.shutdown().await;
    measured?;

    println!();
    println!(
        "=== summary: N={} workers, database {}, M={} instances, {} churn cycles ===",
        config.workers, config.database, config.instances, config.cycles
    );
    for line in &summary.lines {
        println!("{line}");
    }
    println!("=== end of summary ===");
    Ok(())
}

/// What every phase works with.
#[derive(Debug, Clone, Copy)]
struct Bench<'a> {
    config: &'a Config,
    /// The clusters' ids, the default cluster first.
    clusters: &'a [i64],
    admin: &'a Client,
    fleet: &'a Fleet,
    /// The `gantry server` under test.
    server: &'a ProcessSampler,
    /// This process.
    load: &'a ProcessSampler,
}

/// The phases that run with the fleet registered: its steady state, then b, c, e and d.
async fn measure_with_fleet(
    bench: Bench<'_>,
    flips: &Arc<Mutex<Flips>>,
    run_started: Instant,
    summary: &mut Summary,
) -> anyhow::Result<()> {
    let Bench {
        config,
        clusters: _,
        admin,
        fleet,
        server,
        load,
    } = bench;
    // Every worker's first heartbeat comes within one interval of its registration; the
    // window starts once the last one has had its chance.
    tokio::time::sleep(config.heartbeat_interval.min(Duration::from_secs(5))).await;
    let window_from = mark(server, load);
    tokio::time::sleep(config.window).await;
    let window_to = mark(server, load);
    let heartbeats = fleet.stats.heartbeat_latencies(window_from, window_to);
    let steady = server.usage(window_from, window_to);
    summary.figure(
        "a",
        format!(
            "steady state, {} s window: heartbeat latency {}",
            config.window.as_secs(),
            heartbeats.summary()
        ),
    );
    if let Some(usage) = steady {
        summary.figure("a", format!("steady state server {usage}"));
        let load_cpu = load.usage(window_from, window_to).map(|u| u.cpu_percent);
        summary.figure(
            "a",
            format!(
                "steady state load process CPU {:.1} % of a core (it shares the machine's {} CPUs)",
                load_cpu.unwrap_or(0.0),
                std::thread::available_parallelism().map_or(0, |n| n.get())
            ),
        );
        let p99 = heartbeats.percentile(99.0).unwrap_or(Duration::MAX);
        summary.figure(
            "a",
            format!(
                "targets at 10,000 workers: heartbeat p99 ≤ 10 ms {}; CPU ≤ 25 % {}; RSS ≤ 200 MB {}",
                verdict(p99 <= Duration::from_millis(10)),
                verdict(usage.cpu_percent <= 25.0),
                verdict(usage.rss_max <= 200_000_000)
            ),
        );
    }

    // b. Deploy M instances, held pending, then released at once.
    if config.instances > 0 {
        deploy(bench, summary).await?;
    }

    // c. List endpoints.
    lists(bench, summary).await?;

    // e. Create/delete churn.
    if config.cycles > 0 {
        churn(bench, summary).await?;
    }

    // d. Flips over the whole run.
    let run_ended = mark(server, load);
    flip_figures(admin, fleet, flips, summary).await?;
    let stats = &fleet.stats;
    summary.figure(
        "run",
        format!(
            "whole run {:.0} s: heartbeats {}, {} failed, {} late (> interval + {:?}), longest gap {} ms; server list failures {}",
            run_ended.saturating_duration_since(run_started).as_secs_f64(),
            stats.heartbeat_latencies(run_started, run_ended).summary(),
            stats.heartbeat_failures.load(Ordering::Relaxed),
            stats.late_heartbeats.load(Ordering::Relaxed),
            fleet::ON_TIME_SLACK,
            stats.max_heartbeat_gap_ms.load(Ordering::Relaxed),
            stats.server_list_failures.load(Ordering::Relaxed),
        ),
    );
    summary.figure(
        "run",
        format!(
            "assignment watches: {} opened, {} failed to open, {} ended early ({} by a server ERROR such as watch_lagged); reports {} ({} on deleted instances, {} given up)",
            stats.watch_opens.load(Ordering::Relaxed),
            stats.watch_open_failures.load(Ordering::Relaxed),
            stats.watch_ends.load(Ordering::Relaxed),
            stats.watch_errors.load(Ordering::Relaxed),
            stats.reports.load(Ordering::Relaxed),
            stats.reports_gone.load(Ordering::Relaxed),
            stats.report_failures.load(Ordering::Relaxed),
        ),
    );
    if let Some(usage) = server.usage(run_started, run_ended) {
        summary.figure("run", format!("whole run server {usage}"));
    }
    Ok(())
}

/// Phase b: M instances created held, released at once, timed to placed and running;
/// then a 100-replica model on the loaded cluster.
async fn deploy(bench: Bench<'_>, summary: &mut Summary) -> anyhow::Result<()> {
    let Bench {
        config,
        clusters,
        admin,
        fleet,
        server,
        load,
    } = bench;
    let replicas = config.replicas_per_model as usize;
    // Model i goes to cluster i mod K: the instances split evenly over the clusters.
    let models: Vec<(String, u32, i64)> = (0..config.instances.div_ceil(replicas))
        .map(|i| {
            let count = (config.instances - i * replicas).min(replicas);
            (
                format!("bench-{i:04}"),
                u32::try_from(count).expect("at most MAX_REPLICAS"),
                clusters[i % clusters.len()],
            )
        })
        .collect();
    let created_from = mark(server, load);
    let created: Vec<anyhow::Result<(i64, usize)>> = stream::iter(models)
        .map(|(name, count, cluster)| async move {
            let body = model_body(config, cluster, name.clone(), count, true);
            let model = admin
                .create_model(&body)
                .await
                .with_context(|| format!("create model {name}"))?;
            Ok((model.id, count as usize))
        })
        .buffer_unordered(SETUP_CONCURRENCY)
        .collect()
        .await;
    // Each model's id and replicas.
    let deployed: Vec<(i64, usize)> = created.into_iter().collect::<anyhow::Result<_>>()?;
    let model_ids: Vec<i64> = deployed.iter().map(|(id, _)| *id).collect();
    // The model controller creates the instances; they wait, unplaceable, for the
    // release.
    let deadline = Instant::now() + config.phase_timeout;
    let wanted = config.instances as u64;
    loop {
        let pending = count_instances(admin, InstanceState::Pending).await?;
        if pending >= wanted {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "only {pending} of {wanted} instances pending after {:?}",
                config.phase_timeout
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let created_to = mark(server, load);
    summary.figure(
        "b",
        format!(
            "created {} models ({} replicas each) and their {} pending instances (held by a worker selector) in {:.2} s; {}",
            model_ids.len(),
            config.replicas_per_model,
            config.instances,
            created_to.saturating_duration_since(created_from).as_secs_f64(),
            phase_load(&fleet.stats, server, load, created_from, created_to)
        ),
    );
    // Let the passes the creations triggered end, so the release is timed alone.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let released_from = mark(server, load);
    let released: Vec<anyhow::Result<()>> = stream::iter(model_ids.iter().copied())
        .map(|id| async move {
            let update = ModelUpdate {
                worker_selector: Some(BTreeMap::new()),
                ..ModelUpdate::default()
            };
            admin
                .update_model(id, &update)
                .await
                .with_context(|| format!("release model {id}"))?;
            Ok(())
        })
        .buffer_unordered(SETUP_CONCURRENCY)
        .collect()
        .await;
    released.into_iter().collect::<anyhow::Result<Vec<()>>>()?;
    let released_to = Instant::now();
    let deadline = released_to + config.phase_timeout;
    let all = |stats: &FleetStats, running: bool| {
        deployed.iter().all(|(id, want)| {
            stats.model_progress(*id).is_some_and(|p| {
                if running {
                    p.running >= *want
                } else {
                    p.placed >= *want
                }
            })
        })
    };
    // The server's own view, polled: when no instance is pending any more, the scheduler
    // has written every placement; the fleet sees them once the assignment streams have
    // carried them.
    let server_placed = async {
        loop {
            if count_instances(admin, InstanceState::Pending).await? == 0 {
                return Ok::<_, anyhow::Error>(Some(Instant::now()));
            }
            if Instant::now() > deadline {
                return Ok(None);
            }
            tokio::time::sleep(PENDING_POLL).await;
        }
    };
    let fleet_placed = async {
        let placed = fleet.wait_until(deadline, |s| all(s, false)).await;
        let placed_at = last_of(&fleet.stats, &model_ids, false);
        let running = fleet.wait_until(deadline, |s| all(s, true)).await;
        let running_at = last_of(&fleet.stats, &model_ids, true);
        (placed, placed_at, running, running_at)
    };
    let (server_placed_at, (placed, placed_at, running, running_at)) =
        tokio::join!(server_placed, fleet_placed);
    let server_placed_at = server_placed_at?;
    let deploy_to = mark(server, load);
    let (seen_placed, seen_running) = fleet.stats.totals();
    let since = |at: Option<Instant>| {
        at.map_or_else(
            || "never".to_owned(),
            |at| {
                format!(
                    "{:.3} s",
                    at.saturating_duration_since(released_from).as_secs_f64()
                )
            },
        )
    };
    summary.figure(
        "b",
        format!(
            "released {} models' selectors in {:.3} s; all {} instances placed (seen on the assignment streams) {}{} after the first release, all running {}{}",
            model_ids.len(),
            released_to.saturating_duration_since(released_from).as_secs_f64(),
            config.instances,
            since(placed_at),
            if placed { "" } else { " — NOT ALL (timed out)" },
            since(running_at),
            if running { "" } else { " — NOT ALL (timed out)" },
        ),
    );
    summary.figure(
        "b",
        format!(
            "server: no instance pending any more {} after the first release (polled every {} ms)",
            since(server_placed_at),
            PENDING_POLL.as_millis()
        ),
    );
    if let Some(server_at) = server_placed_at {
        let took = server_at.saturating_duration_since(released_from);
        summary.figure(
            "b",
            format!(
                "target: {} pending instances placed ≤ 2 s {} ({:.3} s by the server's count; {} until the workers had them all)",
                config.instances,
                verdict(took <= Duration::from_secs(2)),
                took.as_secs_f64(),
                since(placed_at)
            ),
        );
    }
    summary.figure(
        "b",
        format!(
            "fleet saw {seen_placed} placed and {seen_running} running in all; deploy {}",
            phase_load(&fleet.stats, server, load, released_from, deploy_to)
        ),
    );
    let server_running = count_instances(admin, InstanceState::Running).await?;
    summary.figure(
        "b",
        format!("server counts {server_running} instances running"),
    );

    // One 100-replica model on the loaded cluster.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let probe_from = Instant::now();
    let probe = admin
        .create_model(&model_body(
            config,
            clusters[0],
            "probe-100".to_owned(),
            PROBE_REPLICAS,
            false,
        ))
        .await
        .context("create the 100-replica model")?;
    let want = PROBE_REPLICAS as usize;
    let deadline = Instant::now() + config.phase_timeout;
    let placed = fleet
        .wait_until(deadline, |s| {
            s.model_progress(probe.id).is_some_and(|p| p.placed >= want)
        })
        .await;
    let running = fleet
        .wait_until(deadline, |s| {
            s.model_progress(probe.id)
                .is_some_and(|p| p.running >= want)
        })
        .await;
    let progress = fleet.stats.model_progress(probe.id);
    let took = |at: Option<Instant>, done: bool| match (at, done) {
        (Some(at), true) => format!(
            "{:.3} s",
            at.saturating_duration_since(probe_from).as_secs_f64()
        ),
        _ => "NOT ALL (timed out)".to_owned(),
    };
    summary.figure(
        "b",
        format!(
            "a {PROBE_REPLICAS}-replica model on the loaded cluster: create → all placed {}, → all running {}",
            took(progress.and_then(|p| p.last_placed_at), placed),
            took(progress.and_then(|p| p.last_running_at), running)
        ),
    );
    Ok(())
}

/// When the last of the models' instances was seen placed (or running).
fn last_of(stats: &FleetStats, model_ids: &[i64], running: bool) -> Option<Instant> {
    let mut last = None;
    for id in model_ids {
        let progress = stats.model_progress(*id)?;
        let at = if running {
            progress.last_running_at
        } else {
            progress.last_placed_at
        }?;
        last = last.max(Some(at));
    }
    last
}

/// Phase c: pages of the worker and instance lists.
async fn lists(bench: Bench<'_>, summary: &mut Summary) -> anyhow::Result<()> {
    let Bench {
        config,
        clusters: _,
        admin,
        fleet,
        server,
        load,
    } = bench;
    const PER_PAGE: u32 = 100;
    let from = mark(server, load);
    let worker_total = admin
        .list_workers(&WorkerQuery {
            per_page: Some(1),
            ..WorkerQuery::default()
        })
        .await
        .context("count workers")?
        .pagination
        .total;
    let (worker_pages, workers) = time_pages(
        worker_total,
        PER_PAGE,
        config.list_requests,
        |page| async move {
            let query = WorkerQuery {
                page: Some(page),
                per_page: Some(PER_PAGE),
                ..WorkerQuery::default()
            };
            let listed = admin.list_workers(&query).await.context("list workers")?;
            if listed.items.is_empty() {
                bail!("page {page} of the workers is empty");
            }
            Ok(())
        },
    )
    .await?;
    list_figure(
        summary,
        "workers",
        worker_pages,
        PER_PAGE,
        worker_total,
        &workers,
    );
    let instance_total = admin
        .list_instances(&InstanceQuery {
            per_page: Some(1),
            ..InstanceQuery::default()
        })
        .await
        .context("count instances")?
        .pagination
        .total;
    let (instance_pages, instances) = time_pages(
        instance_total,
        PER_PAGE,
        config.list_requests,
        |page| async move {
            let query = InstanceQuery {
                page: Some(page),
                per_page: Some(PER_PAGE),
                ..InstanceQuery::default()
            };
            admin
                .list_instances(&query)
                .await
                .context("list instances")?;
            Ok(())
        },
    )
    .await?;
    let to = mark(server, load);
    list_figure(
        summary,
        "model-instances",
        instance_pages,
        PER_PAGE,
        instance_total,
        &instances,
    );
    summary.figure(
        "c",
        format!("lists {}", phase_load(&fleet.stats, server, load, from, to)),
    );
    Ok(())
}

/// How long the server is left alone before its RSS is read after churn, for the
/// readings "settled" (next to the medians while cycling, which the target is judged on).
const CHURN_SETTLE: Duration = Duration::from_secs(3);

/// Create → placed → delete cycles `cycles` (numbered), `churn_concurrency` at a time.
async fn churn_cycles(
    bench: Bench<'_>,
    cycles: std::ops::Range<usize>,
    latencies: &Mutex<Latencies>,
    not_placed: &AtomicUsize,
) -> anyhow::Result<()> {
    let Bench {
        config,
        clusters,
        admin,
        fleet,
        server,
        ..
    } = bench;
    let next = AtomicUsize::new(cycles.start);
    let lanes = (0..config.churn_concurrency.max(1)).map(|_| async {
        loop {
            let cycle = next.fetch_add(1, Ordering::Relaxed);
            if cycle >= cycles.end {
                return Ok::<(), anyhow::Error>(());
            }
            let started = Instant::now();
            let model = admin
                .create_model(&model_body(
                    config,
                    clusters[cycle % clusters.len()],
                    format!("churn-{cycle:05}"),
                    1,
                    false,
                ))
                .await
                .with_context(|| format!("create churn model {cycle}"))?;
            let deadline = Instant::now() + Duration::from_secs(30);
            let placed = fleet
                .wait_until(deadline, |s| {
                    s.model_progress(model.id).is_some_and(|p| p.placed >= 1)
                })
                .await;
            if !placed {
                not_placed.fetch_add(1, Ordering::Relaxed);
            }
            admin
                .delete_model(model.id)
                .await
                .with_context(|| format!("delete churn model {cycle}"))?;
            latencies
                .lock()
                .expect("the latency lock is never poisoned")
                .push(started.elapsed());
            if (cycle + 1) % 1000 == 0 {
                eprintln!(
                    "control-plane-load: churn cycle {}/{}, server RSS {}",
                    cycle + 1,
                    config.cycles,
                    mib(server.rss_now())
                );
            }
        }
    });
    let results = futures_util::future::join_all(lanes).await;
    results.into_iter().collect::<anyhow::Result<Vec<()>>>()?;
    Ok(())
}

/// Phase e: create → placed → delete cycles of a 1-replica model. The server's RSS is
/// judged while it cycles: the median of its samples over the first tenth of the cycles
/// (at most 1,000) against the median over the last as many. (A single reading swings by
/// tens of MiB with the allocations of the pass in flight and with when the allocator
/// returns pages, so single readings — also printed, after [`CHURN_SETTLE`] of rest — do
/// not compare well.)
async fn churn(bench: Bench<'_>, summary: &mut Summary) -> anyhow::Result<()> {
    let Bench {
        config,
        fleet,
        server,
        load,
        ..
    } = bench;
    let reference = if config.cycles >= 10_000 {
        1000
    } else {
        (config.cycles / 10).max(1)
    };
    let last_from_cycle = config.cycles.saturating_sub(reference).max(reference);
    let latencies = Mutex::new(Latencies::default());
    let not_placed = AtomicUsize::new(0);
    let rss_before = server.rss_now();
    let from = mark(server, load);
    churn_cycles(bench, 0..reference, &latencies, &not_placed).await?;
    let first_to = mark(server, load);
    tokio::time::sleep(CHURN_SETTLE).await;
    let rss_first_settled = server.rss_now();
    let middle_from = mark(server, load);
    churn_cycles(bench, reference..last_from_cycle, &latencies, &not_placed).await?;
    let last_from = mark(server, load);
    churn_cycles(
        bench,
        last_from_cycle..config.cycles,
        &latencies,
        &not_placed,
    )
    .await?;
    let to = mark(server, load);
    tokio::time::sleep(CHURN_SETTLE).await;
    let rss_end_settled = server.rss_now();
    let latencies = latencies
        .into_inner()
        .expect("the latency lock is never poisoned");
    let cycling = (first_to.saturating_duration_since(from)
        + to.saturating_duration_since(middle_from))
    .as_secs_f64();
    summary.figure(
        "e",
        format!(
            "{} create → placed → delete cycles ({} at a time) in {cycling:.1} s, {} not placed within 30 s; cycle {}",
            config.cycles,
            config.churn_concurrency,
            not_placed.load(Ordering::Relaxed),
            latencies.summary()
        ),
    );
    let first = server.rss_median(from, first_to);
    let last = server.rss_median(last_from, to);
    let max = |from, to| server.usage(from, to).map_or(0, |u| u.rss_max);
    let growth = match (first, last) {
        (Some(first), Some(last)) => Some((last as f64 / first.max(1) as f64 - 1.0) * 100.0),
        _ => None,
    };
    let shown = |rss: Option<u64>| rss.map_or_else(|| "no samples".to_owned(), mib);
    summary.figure(
        "e",
        format!(
            "server RSS before churn {}; over cycles 1–{reference}: median {}, max {}, {} settled; over cycles {}–{}: median {}, max {}, {} settled; median growth {}; target within 20 % {}",
            mib(rss_before),
            shown(first),
            mib(max(from, first_to)),
            mib(rss_first_settled),
            last_from_cycle + 1,
            config.cycles,
            shown(last),
            mib(max(last_from, to)),
            mib(rss_end_settled),
            growth.map_or_else(|| "?".to_owned(), |g| format!("{g:+.1} %")),
            verdict(growth.is_some_and(|g| g <= 20.0))
        ),
    );
    summary.figure(
        "e",
        format!("churn {}", phase_load(&fleet.stats, server, load, from, to)),
    );
    Ok(())
}

/// Phase d: workers that left `ready`, and the states at the end.
async fn flip_figures(
    admin: &Client,
    fleet: &Fleet,
    flips: &Arc<Mutex<Flips>>,
    summary: &mut Summary,
) -> anyhow::Result<()> {
    let (seen, restarts) = {
        let flips = flips.lock().expect("the flip lock is never poisoned");
        (flips.seen.clone(), flips.watch_restarts)
    };
    let on_time = seen
        .iter()
        .filter(|(worker, _, _)| fleet.stats.on_time(*worker))
        .count();
    let mut by_state: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut page = 1;
    loop {
        let listed = admin
            .list_workers(&WorkerQuery {
                page: Some(page),
                per_page: Some(MAX_PER_PAGE),
                ..WorkerQuery::default()
            })
            .await
            .context("list workers")?;
        for worker in &listed.items {
            *by_state.entry(worker.state.as_str()).or_default() += 1;
        }
        if listed.items.is_empty()
            || u64::from(page) * u64::from(MAX_PER_PAGE) >= listed.pagination.total
        {
            break;
        }
        page += 1;
    }
    summary.figure(
        "d",
        format!(
            "workers leaving ready during the run: {} ({} of them with every heartbeat on time; {} workers had a failed or late heartbeat); worker watch restarts {restarts}; states at the end {by_state:?}; target 0 flips of on-time workers {}",
            seen.len(),
            on_time,
            fleet.stats.late_worker_count(),
            verdict(on_time == 0)
        ),
    );
    Ok(())
}
