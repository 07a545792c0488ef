//! The backend supervisor: runs model instances as backend processes on this worker.
//!
//! The agent tells it the desired state, instance by instance, and hears back through a
//! channel of [`InstanceEvent`]s:
//!
//! ```no_run
//! # use gantry_worker::supervisor::*;
//! # async fn example(spec: InstanceSpec) -> Result<(), SupervisorError> {
//! let (events_tx, mut events_rx) = tokio::sync::mpsc::channel(256);
//! let supervisor = Supervisor::new(SupervisorConfig::new("/var/lib/gantry"), events_tx)?;
//! // Drain events on a task of their own (see "Events" below).
//! tokio::spawn(async move { while let Some(event) = events_rx.recv().await { /* report */ } });
//! let id = spec.instance_id;
//! supervisor.ensure(spec).await?; // start, or nothing if this spec already runs
//! supervisor.stop(id).await;      // returns when the process group is gone, ports free
//! supervisor.shutdown().await;    // stops everything, awaits every task
//! # Ok(()) }
//! ```
//!
//! Each instance is owned by one task ([`instance`]), which spawns the backend process(es)
//! ([`process`]), polls readiness ([`readiness`]), restarts crashes with backoff and gives up
//! on crash loops ([`restart`]). Tasks and output pumps are tracked by one [`TaskTracker`] and
//! cancelled through child tokens of one [`CancellationToken`], so [`Supervisor::shutdown`]
//! is explicit and awaited.
//!
//! **Events.** Every state change is one event, sent with back-pressure (the channel is
//! bounded): drain the receiver on a task that never waits on the supervisor itself, or drop
//! it, or `stop`/`shutdown` may wait for room in the channel. Every task ends with
//! `Stopped`. Events are hints for a level-triggered agent; [`Supervisor::status`] is the
//! current truth.
//!
//! **Logs.** See [`crate::logs`] for the file layout. [`Supervisor::log_files`] lists an
//! instance's files, [`Supervisor::read_log`] returns the tail of the current one, and
//! [`Supervisor::current_log_file`] gives the path to follow: a caller that streams logs
//! tails that file and, when a restart makes [`Supervisor::current_log_file`] return a new
//! path, moves on to it. Files are written line by line, so a tailer never sees half a line
//! from two processes mixed.

mod instance;
mod process;
mod readiness;
pub mod restart;

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr};
use std::ops::RangeInclusive;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use gantry_types::{BackendKind, InstanceState};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::backend::BackendSettings;
use crate::logs::{read_tail_lines, LogConfig, LogDir, LogFile};
use crate::ports::{PortAllocator, PortError};
pub use restart::RestartPolicy;

/// What the supervisor needs to run one model instance. Two specs are "the same" for
/// [`Supervisor::ensure`] when they are equal field by field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceSpec {
    /// The model instance's id; the supervisor runs at most one task per id.
    pub instance_id: i64,
    /// `model#replica`: names the instance in log lines and its log directory (made safe
    /// for a file name by [`crate::logs::sanitize_key`]).
    pub key: String,
    pub backend: BackendKind,
    /// The model on local disk: the GGUF file for llama.cpp, a file or directory for the
    /// others.
    pub model_path: PathBuf,
    /// Appended to the backend's command line as given (no shell).
    pub backend_args: Vec<String>,
    /// Extra environment for the backend, on top of the worker's own.
    /// `CUDA_VISIBLE_DEVICES` is always set from `gpu_indexes` and wins over this.
    pub env: BTreeMap<String, String>,
    /// The GPUs the scheduler placed the instance on; empty for CPU-only (the backend then
    /// sees `CUDA_VISIBLE_DEVICES=""`, no GPU at all).
    pub gpu_indexes: Vec<u32>,
    /// vLLM-style data parallelism: N backend processes on N consecutive ports, the GPUs
    /// split evenly between them (one GPU each in the common case). `None` or `Some(1)`:
    /// one process.
    pub data_parallel_size: Option<u32>,
    pub overrides: InstanceOverrides,
}

/// Per-instance settings that override the supervisor's configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InstanceOverrides {
    /// How long the backend may take to answer its health path with 200 before it is
    /// stopped and reported as `Error`.
    pub ready_deadline: Option<Duration>,
    /// The command template of a `custom` backend (see [`crate::backend::custom_command`]).
    pub custom_command: Option<String>,
    /// The health path to poll, starting with `/`.
    pub health_path: Option<String>,
}

/// Ports for backend processes unless configured otherwise.
pub const DEFAULT_PORT_RANGE: RangeInclusive<u16> = 40000..=40999;
/// Time between SIGTERM and SIGKILL when a backend is stopped.
pub const DEFAULT_STOP_GRACE_PERIOD: Duration = Duration::from_secs(30);
/// How long any backend may take to become ready: large models load for minutes.
pub const DEFAULT_READINESS_DEADLINE: Duration = Duration::from_secs(10 * 60);

/// How long each backend may take to become ready. Default
/// [`DEFAULT_READINESS_DEADLINE`] each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadinessDeadlines {
    pub llama_cpp: Duration,
    pub vllm: Duration,
    pub sglang: Duration,
    pub custom: Duration,
}

impl Default for ReadinessDeadlines {
    fn default() -> Self {
        Self::uniform(DEFAULT_READINESS_DEADLINE)
    }
}

impl ReadinessDeadlines {
    /// The same deadline for every backend.
    pub fn uniform(deadline: Duration) -> Self {
        Self {
            llama_cpp: deadline,
            vllm: deadline,
            sglang: deadline,
            custom: deadline,
        }
    }

    pub fn get(&self, backend: BackendKind) -> Duration {
        match backend {
            BackendKind::LlamaCpp => self.llama_cpp,
            BackendKind::Vllm => self.vllm,
            BackendKind::Sglang => self.sglang,
            BackendKind::Custom => self.custom,
        }
    }
}

/// The supervisor's configuration. [`SupervisorConfig::new`] fills in the defaults.
#[derive(Debug, Clone)]
pub struct SupervisorConfig {
    /// Ports for backends (default [`DEFAULT_PORT_RANGE`]).
    pub port_range: RangeInclusive<u16>,
    /// Logs go to `<data_dir>/logs/<key>/<start-n>.log`.
    pub data_dir: PathBuf,
    /// The address backends listen on (default `127.0.0.1`); readiness probes go there
    /// (to loopback for `0.0.0.0`/`::`).
    pub bind_host: IpAddr,
    /// The host put in `Running.address` for the gateway to reach (default `127.0.0.1`).
    /// With a loopback `bind_host`, only a gateway on this machine can reach backends.
    pub advertise_host: String,
    /// How long a backend gets between SIGTERM and SIGKILL (default
    /// [`DEFAULT_STOP_GRACE_PERIOD`]).
    pub stop_grace_period: Duration,
    pub readiness_deadlines: ReadinessDeadlines,
    pub restart: RestartPolicy,
    /// Executables of the built-in backends, the custom command template and its health
    /// path.
    pub backends: BackendSettings,
    pub logs: LogConfig,
}

impl SupervisorConfig {
    /// The defaults, with logs under `data_dir`.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        Self {
            port_range: DEFAULT_PORT_RANGE,
            data_dir: data_dir.into(),
            bind_host: IpAddr::V4(Ipv4Addr::LOCALHOST),
            advertise_host: Ipv4Addr::LOCALHOST.to_string(),
            stop_grace_period: DEFAULT_STOP_GRACE_PERIOD,
            readiness_deadlines: ReadinessDeadlines::default(),
            restart: RestartPolicy::default(),
            backends: BackendSettings::default(),
            logs: LogConfig::default(),
        }
    }
}

/// One state change of one instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceEvent {
    pub instance_id: i64,
    pub state: BackendState,
}

/// What an instance's backend is doing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendState {
    /// The process(es) are being spawned and probed; `port` is the first (advertised) port.
    Starting { port: u16 },
    /// Every process answered its health path with 200.
    Running {
        /// `advertise_host:first port`, where the gateway sends requests.
        address: String,
        /// One port per process, consecutive; `ports[r]` belongs to rank `r`.
        ports: Vec<u16>,
        /// The pid (and process group) of the first process.
        pid: u32,
        /// The pids of all processes, by rank.
        pids: Vec<u32>,
    },
    /// A process crashed after readiness; the instance starts again after `backoff`.
    /// `attempt` counts crashes in a row, from 1.
    Restarting {
        attempt: u32,
        backoff: Duration,
        reason: String,
    },
    /// Final until the instance is stopped: a start failed before the instance was ever
    /// ready, or it crash-looped. `message` names the cause (exit status, deadline, …) and
    /// ends with the last stderr lines. No process runs and no port is held.
    Error { message: String },
    /// Every process is gone and the ports are released; the last event of a task.
    Stopped,
}

impl BackendState {
    /// A short name for logs: `starting`, `running`, `restarting`, `error`, `stopped`.
    pub fn name(&self) -> &'static str {
        match self {
            BackendState::Starting { .. } => "starting",
            BackendState::Running { .. } => "running",
            BackendState::Restarting { .. } => "restarting",
            BackendState::Error { .. } => "error",
            BackendState::Stopped => "stopped",
        }
    }

    /// The API's instance state this maps to; `None` for `Stopped` (the instance no longer
    /// runs here, the server decides what it is).
    pub fn instance_state(&self) -> Option<InstanceState> {
        match self {
            BackendState::Starting { .. } | BackendState::Restarting { .. } => {
                Some(InstanceState::Starting)
            }
            BackendState::Running { .. } => Some(InstanceState::Running),
            BackendState::Error { .. } => Some(InstanceState::Error),
            BackendState::Stopped => None,
        }
    }
}

/// A snapshot of one supervised instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceStatus {
    pub instance_id: i64,
    pub key: String,
    /// The latest state (the one last sent as an event).
    pub state: BackendState,
    /// Restarts after crashes since the instance was ensured with this spec.
    pub restart_count: u32,
    /// The processes of the current start, by rank; empty when none runs.
    pub pids: Vec<u32>,
    /// The ports held, by rank; empty when none is held.
    pub ports: Vec<u16>,
    /// The log file of the current (or last) start.
    pub log_file: Option<PathBuf>,
}

impl InstanceStatus {
    fn new(spec: &InstanceSpec) -> Self {
        Self {
            instance_id: spec.instance_id,
            key: spec.key.clone(),
            state: BackendState::Stopped,
            restart_count: 0,
            pids: Vec::new(),
            ports: Vec::new(),
            log_file: None,
        }
    }
}

/// What [`Supervisor::ensure`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnsureOutcome {
    /// The instance was not supervised; it is starting now.
    Started,
    /// The same spec is already supervised (in whatever state, `Error` included);
    /// nothing changed.
    Unchanged,
    /// A different spec ran under this id; it was stopped and the new one is starting.
    Restarted,
}

#[derive(Debug, thiserror::Error)]
pub enum SupervisorError {
    #[error("the supervisor is shutting down")]
    ShuttingDown,
    #[error("invalid port range: {0}")]
    PortRange(#[from] PortError),
    #[error("cannot build the health-probe HTTP client: {0}")]
    HttpClient(#[from] reqwest::Error),
}

/// What every instance task shares.
pub(crate) struct Shared {
    pub(crate) config: SupervisorConfig,
    pub(crate) ports: PortAllocator,
    pub(crate) events: mpsc::Sender<InstanceEvent>,
    pub(crate) http: reqwest::Client,
    /// Tracks instance tasks and output pumps.
    pub(crate) tracker: TaskTracker,
    /// The parent of every instance's token; cancelled by shutdown.
    pub(crate) cancel: CancellationToken,
}

/// One instance id's place in the supervisor. `control` serialises ensure/stop for the id;
/// `status` is readable without waiting for them.
struct Slot {
    control: tokio::sync::Mutex<SlotControl>,
    status: Arc<Mutex<Option<InstanceStatus>>>,
}

struct SlotControl {
    task: Option<RunningTask>,
    /// Set when stop removed the slot from the map; an ensure that raced with the stop
    /// then takes a fresh slot.
    removed: bool,
}

struct RunningTask {
    spec: InstanceSpec,
    cancel: CancellationToken,
    handle: JoinHandle<()>,
}

impl RunningTask {
    /// Cancels the task and waits until it has stopped its processes and sent `Stopped`.
    async fn stop(self) {
        self.cancel.cancel();
        if let Err(e) = self.handle.await {
            tracing::error!(
                instance_id = self.spec.instance_id,
                key = %self.spec.key,
                "instance task failed: {e}"
            );
        }
    }
}

/// The backend supervisor. Cheap to clone; clones share the same instances.
#[derive(Clone)]
pub struct Supervisor {
    shared: Arc<Shared>,
    slots: Arc<Mutex<HashMap<i64, Arc<Slot>>>>,
    /// Log directories of every instance ever ensured, so logs stay readable after a stop.
    log_dirs: Arc<Mutex<HashMap<i64, LogDir>>>,
}

impl std::fmt::Debug for Supervisor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Supervisor")
            .field("config", &self.shared.config)
            .field("instances", &lock(&self.slots).keys().collect::<Vec<_>>())
            .finish()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Maps and snapshots stay consistent between statements; a panic elsewhere does not
    // make them unusable.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Supervisor {
    /// A supervisor that reports to `events`. Starts nothing until [`Supervisor::ensure`].
    pub fn new(
        config: SupervisorConfig,
        events: mpsc::Sender<InstanceEvent>,
    ) -> Result<Self, SupervisorError> {
        let ports = PortAllocator::new(config.port_range.clone(), config.bind_host)?;
        let http = readiness::probe_client()?;
        Ok(Self {
            shared: Arc::new(Shared {
                config,
                ports,
                events,
                http,
                tracker: TaskTracker::new(),
                cancel: CancellationToken::new(),
            }),
            slots: Arc::default(),
            log_dirs: Arc::default(),
        })
    }

    pub fn config(&self) -> &SupervisorConfig {
        &self.shared.config
    }

    /// Makes `spec` run: starts it if its id is not supervised, does nothing if the same
    /// spec is (whatever its state: an instance in `Error` stays there until stopped), and
    /// stops the old spec (`Stopped` event) and starts the new one if the spec changed.
    /// Returns once the task is started, not when the backend is ready.
    pub async fn ensure(&self, spec: InstanceSpec) -> Result<EnsureOutcome, SupervisorError> {
        loop {
            if self.shared.cancel.is_cancelled() {
                return Err(SupervisorError::ShuttingDown);
            }
            let slot = Arc::clone(
                lock(&self.slots)
                    .entry(spec.instance_id)
                    .or_insert_with(|| {
                        Arc::new(Slot {
                            control: tokio::sync::Mutex::new(SlotControl {
                                task: None,
                                removed: false,
                            }),
                            status: Arc::default(),
                        })
                    }),
            );
            let mut control = slot.control.lock().await;
            if control.removed {
                continue;
            }
            if self.shared.cancel.is_cancelled() {
                return Err(SupervisorError::ShuttingDown);
            }
            let outcome = match control.task.take() {
                Some(task) if task.spec == spec => {
                    control.task = Some(task);
                    return Ok(EnsureOutcome::Unchanged);
                }
                Some(old) => {
                    old.stop().await;
                    EnsureOutcome::Restarted
                }
                None => EnsureOutcome::Started,
            };
            control.task = Some(self.start_task(spec, &slot));
            return Ok(outcome);
        }
    }

    fn start_task(&self, spec: InstanceSpec, slot: &Slot) -> RunningTask {
        let log_dir = LogDir::new(&self.shared.config.data_dir, &spec.key);
        lock(&self.log_dirs).insert(spec.instance_id, log_dir.clone());
        *lock(&slot.status) = Some(InstanceStatus::new(&spec));
        let cancel = self.shared.cancel.child_token();
        let task = instance::InstanceTask {
            spec: spec.clone(),
            shared: Arc::clone(&self.shared),
            cancel: cancel.clone(),
            status: Arc::clone(&slot.status),
            log_dir,
        };
        // Spawned as an async task on the runtime: backends are forked from its worker
        // threads, which is what PR_SET_PDEATHSIG needs (see `process`).
        let handle = self.shared.tracker.spawn(task.run());
        RunningTask {
            spec,
            cancel,
            handle,
        }
    }

    /// Stops the instance: SIGTERM to its process group(s), the grace period, SIGKILL,
    /// reaping; releases its ports and sends `Stopped`. Returns when all of that is done;
    /// `false` if the id was not supervised.
    pub async fn stop(&self, instance_id: i64) -> bool {
        let Some(slot) = lock(&self.slots).get(&instance_id).cloned() else {
            return false;
        };
        let mut control = slot.control.lock().await;
        if control.removed {
            return false;
        }
        let task = control.task.take();
        let was_running = task.is_some();
        if let Some(task) = task {
            task.stop().await;
        }
        control.removed = true;
        let mut slots = lock(&self.slots);
        if slots
            .get(&instance_id)
            .is_some_and(|current| Arc::ptr_eq(current, &slot))
        {
            slots.remove(&instance_id);
        }
        was_running
    }

    /// Stops every instance (concurrently, each with its grace period) and waits for every
    /// task. Later calls to [`Supervisor::ensure`] fail with
    /// [`SupervisorError::ShuttingDown`].
    pub async fn shutdown(&self) {
        self.shared.cancel.cancel();
        self.shared.tracker.close();
        self.shared.tracker.wait().await;
        lock(&self.slots).clear();
    }

    /// The current status of an instance, `None` if it is not supervised (never ensured, or
    /// stopped).
    pub fn status(&self, instance_id: i64) -> Option<InstanceStatus> {
        let slot = lock(&self.slots).get(&instance_id).cloned()?;
        let status = lock(&slot.status).clone();
        status
    }

    /// The status of every supervised instance, by id.
    pub fn statuses(&self) -> Vec<InstanceStatus> {
        let slots: Vec<Arc<Slot>> = lock(&self.slots).values().cloned().collect();
        let mut statuses: Vec<InstanceStatus> = slots
            .iter()
            .filter_map(|slot| lock(&slot.status).clone())
            .collect();
        statuses.sort_by_key(|s| s.instance_id);
        statuses
    }

    /// The ports handed out to backends right now.
    pub fn leased_ports(&self) -> Vec<u16> {
        self.shared.ports.leased()
    }

    /// The log files of an instance ensured since this supervisor started (stopped ones
    /// included), oldest first; empty if unknown.
    pub fn log_files(&self, instance_id: i64) -> std::io::Result<Vec<LogFile>> {
        match lock(&self.log_dirs).get(&instance_id) {
            Some(dir) => dir.files(),
            None => Ok(Vec::new()),
        }
    }

    /// The newest log file of an instance: the one its current process(es) write to. Follow
    /// it by tailing this path and re-asking after a restart.
    pub fn current_log_file(&self, instance_id: i64) -> std::io::Result<Option<PathBuf>> {
        let dir = lock(&self.log_dirs).get(&instance_id).cloned();
        match dir {
            Some(dir) => Ok(dir.latest()?.map(|f| f.path)),
            None => Ok(None),
        }
    }

    /// The last `tail_lines` lines of the instance's newest log file; empty if it has none.
    pub async fn read_log(&self, instance_id: i64, tail_lines: usize) -> std::io::Result<String> {
        let Some(path) = self.current_log_file(instance_id)? else {
            return Ok(String::new());
        };
        tokio::task::spawn_blocking(move || read_tail_lines(&path, tail_lines))
            .await
            .map_err(std::io::Error::other)?
    }
}
