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
//! supervisor.apply(spec.clone())?;  // never waits: the instance's own task converges
//! supervisor.remove(id);             // never waits either
//! supervisor.ensure(spec).await?;    // waits until the spec is taken up (tests, tools)
//! supervisor.stop(id).await;         // waits until the process group is gone, ports free
//! supervisor.shutdown().await;       // stops everything, awaits every task
//! # Ok(()) }
//! ```
//!
//! **One task per instance converges on its own.** Each instance id has a desired spec (or
//! none) in a watch channel and one task ([`instance`]) that runs it: spawns the backend
//! process(es) ([`process`]), polls readiness ([`readiness`]) and health ([`health`]),
//! restarts crashes with backoff and gives up on crash loops ([`restart`]), drains before
//! a stop ([`drain`]). Everything the task does to the machine goes through one [`host`]
//! seam, so its rules are tested in paused time against scripted processes (`tests.rs`)
//! as well as against real ones (`tests/supervisor`). When the desired spec changes, that task stops
//! the old process and starts the new one; when it becomes none, the task stops and leaves.
//! [`Supervisor::apply`] and [`Supervisor::remove`] only write the desired state, so one
//! backend that takes its whole stop grace period never holds up another instance. Tasks and
//! output pumps are tracked by one [`TaskTracker`] and cancelled through child tokens of one
//! [`CancellationToken`], so [`Supervisor::shutdown`] is explicit and awaited.
//!
//! **Events.** Every state change is one event, sent with back-pressure (the channel is
//! bounded): drain the receiver on a task that never waits on the supervisor itself, or drop
//! it, or instance tasks may wait for room in the channel. Every run of a spec ends with
//! `Stopped`. Events are hints for a level-triggered agent; [`Supervisor::status`] is the
//! current truth.
//!
//! **Logs.** See [`crate::logs`] for the file layout. [`Supervisor::log_files`] lists an
//! instance's files, [`Supervisor::read_log`] returns the tail of the current one, and
//! [`Supervisor::current_log_file`] gives the path to follow: a caller that streams logs
//! tails that file and, when a restart makes [`Supervisor::current_log_file`] return a new
//! path, moves on to it. Files are written line by line, so a tailer never sees half a line
//! from two processes mixed.

mod drain;
mod health;
mod host;
mod instance;
mod process;
mod readiness;
pub mod restart;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::ops::RangeInclusive;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use gantry_backends::{BackendSettings, LaunchSpec};
use gantry_source::cache::ModelCache;
use gantry_types::{DownloadProgress, InstallProgress, InstanceState, ModelSource};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::backends::{BackendPlan, InstalledBackends};
use crate::logs::{read_tail_lines, LogConfig, LogDir, LogFile};
use crate::ports::{PortAllocator, PortError};
pub use health::HealthPolicy;
use host::system::SystemHost;
use host::Host;
pub use restart::RestartPolicy;

/// What the supervisor needs to run one model instance. Two specs are "the same" for
/// [`Supervisor::apply`] when they are equal field by field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceSpec {
    /// The model instance's id; the supervisor runs at most one task per id.
    pub instance_id: i64,
    /// `model#replica`: names the instance in log lines and its log directory (made safe
    /// for a file name by [`crate::logs::sanitize_key`]).
    pub key: String,
    /// What to run: backend, model path, arguments, environment, GPUs, data parallelism.
    pub launch: LaunchSpec,
    /// A model whose files must be downloaded first (Hugging Face, URL): fetched into the
    /// worker's model cache before the start, which then sets `launch.model_path`.
    pub remote: Option<ModelSource>,
    /// How long the backend may take to answer its health path with 200 before it is
    /// stopped and reported as `Error`; the supervisor's setting, else the backend's
    /// default, when `None`.
    pub ready_deadline: Option<Duration>,
    /// A backend version to install (if missing) before the first start, and to run from;
    /// `None` runs the program the worker's configuration names (or finds on `PATH`).
    pub install: Option<BackendPlan>,
    /// The version to report when nothing is installed (a defined backend without
    /// requirements).
    pub backend_version: Option<String>,
}

impl InstanceSpec {
    /// Instance `instance_id`, named `key`, running `launch` from a model already on local
    /// disk, with the program the worker's configuration names and the default ready
    /// deadline.
    pub fn new(instance_id: i64, key: impl Into<String>, launch: LaunchSpec) -> Self {
        Self {
            instance_id,
            key: key.into(),
            launch,
            remote: None,
            ready_deadline: None,
            install: None,
            backend_version: None,
        }
    }
}

/// Ports for backend processes unless configured otherwise.
pub const DEFAULT_PORT_RANGE: RangeInclusive<u16> = 40000..=40999;
/// How long a backend has to stop by default (see [`SupervisorConfig::stop_grace_period`]).
pub const DEFAULT_STOP_GRACE_PERIOD: Duration = Duration::from_secs(30);

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
    /// How long a backend has to stop (default [`DEFAULT_STOP_GRACE_PERIOD`]): a serving
    /// backend that tells its load first drains for up to half of it, then the processes
    /// get SIGTERM and the rest of it before SIGKILL.
    pub stop_grace_period: Duration,
    /// How long any backend may take to become ready; each backend's own default
    /// (`gantry_backends::Backend::readiness_deadline`, 10 min) when `None`.
    pub readiness_deadline: Option<Duration>,
    pub restart: RestartPolicy,
    /// Executables of the built-in backends, the custom command template and its health
    /// path.
    pub backends: BackendSettings,
    pub logs: LogConfig,
    /// Where remote models are downloaded; `None` refuses them.
    pub model_cache: Option<Arc<ModelCache>>,
    /// Installed backends and the installer; `None` refuses instances that need one.
    pub installed_backends: Option<Arc<InstalledBackends>>,
    /// How running instances are probed after they were ready.
    pub health: HealthPolicy,
    /// How long a failed backend install waits before the next try (doubling up to 10
    /// minutes).
    pub install_retry: Duration,
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
            readiness_deadline: None,
            restart: RestartPolicy::default(),
            backends: BackendSettings::default(),
            logs: LogConfig::default(),
            model_cache: None,
            installed_backends: None,
            health: HealthPolicy::default(),
            install_retry: Duration::from_secs(30),
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
    /// The backend version is being installed on the worker.
    Installing { progress: InstallProgress },
    /// The model's files are being downloaded into the worker's cache.
    Downloading { progress: DownloadProgress },
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
    /// It was ready, then failed its health probe past the threshold; its processes are
    /// stopped and it is restarted (as after a crash).
    Unhealthy { reason: String },
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
            BackendState::Installing { .. } => "installing",
            BackendState::Downloading { .. } => "downloading",
            BackendState::Starting { .. } => "starting",
            BackendState::Running { .. } => "running",
            BackendState::Unhealthy { .. } => "unhealthy",
            BackendState::Restarting { .. } => "restarting",
            BackendState::Error { .. } => "error",
            BackendState::Stopped => "stopped",
        }
    }

    /// The API's instance state this maps to; `None` for `Stopped` (the instance no longer
    /// runs here, the server decides what it is).
    pub fn instance_state(&self) -> Option<InstanceState> {
        match self {
            BackendState::Installing { .. } => Some(InstanceState::Installing),
            BackendState::Downloading { .. } => Some(InstanceState::Downloading),
            BackendState::Unhealthy { .. } => Some(InstanceState::Unhealthy),
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
    /// Restarts since the instance was ensured with this spec: after crashes, and those an
    /// admin asked for.
    pub restart_count: u32,
    /// The processes of the current start, by rank; empty when none runs.
    pub pids: Vec<u32>,
    /// The ports held, by rank; empty when none is held.
    pub ports: Vec<u16>,
    /// The log file of the current (or last) start.
    pub log_file: Option<PathBuf>,
    /// The backend version it runs with, once known.
    pub backend_version: Option<String>,
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
            backend_version: spec.backend_version.clone(),
        }
    }
}

/// What [`Supervisor::apply`] and [`Supervisor::ensure`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnsureOutcome {
    /// The instance was not supervised; it is starting now.
    Started,
    /// The same spec is already wanted (in whatever state, `Error` included); nothing
    /// changed.
    Unchanged,
    /// A different spec was wanted under this id; the instance's task stops it and starts
    /// the new one.
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
    /// Where processes start and probes go: the machine, or a test double.
    pub(crate) host: Arc<dyn Host>,
    /// Tracks instance tasks and output pumps.
    pub(crate) tracker: TaskTracker,
    /// The parent of every instance's token; cancelled by shutdown.
    pub(crate) cancel: CancellationToken,
}

/// The desired state of one instance id: a spec to run, or none (stop and leave). Every
/// change gets a new generation; the instance's task restarts on a new generation even when
/// the spec is equal (a fresh start asked with [`Supervisor::restart`]).
#[derive(Debug, Clone)]
struct Desired {
    generation: u64,
    spec: Option<InstanceSpec>,
    /// The restart count the run of this generation starts from: 0 for a spec set anew,
    /// the count so far plus one for a restart an admin asked for
    /// ([`Supervisor::restart_in_place`]).
    restart_count: u32,
}

/// One instance id's place in the supervisor.
struct Slot {
    desired: watch::Sender<Desired>,
    /// The generation the task has taken up: the previous run is stopped and this one
    /// started (or, for none, everything is stopped).
    applied: watch::Receiver<u64>,
    status: Arc<Mutex<Option<InstanceStatus>>>,
}

/// The backend supervisor. Cheap to clone; clones share the same instances.
#[derive(Clone)]
pub struct Supervisor {
    shared: Arc<Shared>,
    slots: Arc<Mutex<HashMap<i64, Slot>>>,
    /// Log directories of every instance ever run, so logs stay readable after a stop.
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
    /// A supervisor that reports to `events`. Starts nothing until [`Supervisor::apply`].
    pub fn new(
        config: SupervisorConfig,
        events: mpsc::Sender<InstanceEvent>,
    ) -> Result<Self, SupervisorError> {
        let host = SystemHost::new(readiness::probe_client()?);
        Self::with_host(config, events, Arc::new(host))
    }

    /// A supervisor whose processes and probes go to `host`.
    fn with_host(
        config: SupervisorConfig,
        events: mpsc::Sender<InstanceEvent>,
        host: Arc<dyn Host>,
    ) -> Result<Self, SupervisorError> {
        let ports = PortAllocator::new(config.port_range.clone(), config.bind_host)?;
        Ok(Self {
            shared: Arc::new(Shared {
                config,
                ports,
                events,
                host,
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

    /// Makes `spec` the instance's desired state and returns at once: the instance's own
    /// task starts it, or stops a different spec it runs and starts this one. The same spec
    /// changes nothing (whatever its state: an instance in `Error` stays there until
    /// [`Supervisor::restart`] or a different spec).
    pub fn apply(&self, spec: InstanceSpec) -> Result<EnsureOutcome, SupervisorError> {
        self.set(spec, false).map(|(outcome, _)| outcome)
    }

    /// Like [`Supervisor::apply`], but starts the instance afresh even when the spec is the
    /// one it runs (after the server placed it here again, say).
    pub fn restart(&self, spec: InstanceSpec) -> Result<EnsureOutcome, SupervisorError> {
        self.set(spec, true).map(|(outcome, _)| outcome)
    }

    /// Stops the instance's process(es) and starts the spec it runs again, as an admin's
    /// restart asks; unlike [`Supervisor::restart`] (a placement made anew, which starts
    /// counting from zero) it counts as a restart. `false` when no spec of that id runs
    /// here.
    pub fn restart_in_place(&self, instance_id: i64) -> bool {
        let slots = lock(&self.slots);
        let Some(slot) = slots.get(&instance_id) else {
            return false;
        };
        let current = slot.desired.borrow().clone();
        let Some(spec) = current.spec else {
            return false;
        };
        let restarts = lock(&slot.status)
            .as_ref()
            .map_or(0, |status| status.restart_count);
        slot.desired.send_replace(Desired {
            generation: current.generation + 1,
            spec: Some(spec),
            restart_count: restarts.saturating_add(1),
        });
        true
    }

    /// Like [`Supervisor::apply`], then waits until the instance's task has taken the spec
    /// up: a different spec it ran is stopped and this one started (not ready).
    pub async fn ensure(&self, spec: InstanceSpec) -> Result<EnsureOutcome, SupervisorError> {
        let (outcome, wait) = self.set(spec, false)?;
        wait.taken_up().await;
        Ok(outcome)
    }

    fn set(
        &self,
        spec: InstanceSpec,
        afresh: bool,
    ) -> Result<(EnsureOutcome, TakenUp), SupervisorError> {
        if self.shared.cancel.is_cancelled() {
            return Err(SupervisorError::ShuttingDown);
        }
        let id = spec.instance_id;
        let mut slots = lock(&self.slots);
        if let Some(slot) = slots.get(&id) {
            let current = slot.desired.borrow().clone();
            let outcome = match &current.spec {
                Some(wanted) if *wanted == spec && !afresh => {
                    return Ok((
                        EnsureOutcome::Unchanged,
                        TakenUp::new(slot.applied.clone(), current.generation),
                    ));
                }
                Some(_) => EnsureOutcome::Restarted,
                None => EnsureOutcome::Started,
            };
            let generation = current.generation + 1;
            lock(&self.log_dirs).insert(id, LogDir::new(&self.shared.config.data_dir, &spec.key));
            slot.desired.send_replace(Desired {
                generation,
                spec: Some(spec),
                restart_count: 0,
            });
            return Ok((outcome, TakenUp::new(slot.applied.clone(), generation)));
        }
        let log_dir = LogDir::new(&self.shared.config.data_dir, &spec.key);
        lock(&self.log_dirs).insert(id, log_dir);
        let (desired, desired_rx) = watch::channel(Desired {
            generation: 1,
            spec: Some(spec.clone()),
            restart_count: 0,
        });
        let (applied_tx, applied) = watch::channel(0);
        let status = Arc::new(Mutex::new(Some(InstanceStatus::new(&spec))));
        let task = instance::Supervision {
            instance_id: id,
            desired: desired_rx,
            applied: applied_tx,
            status: Arc::clone(&status),
            shared: Arc::clone(&self.shared),
            slots: Arc::clone(&self.slots),
            log_dirs: Arc::clone(&self.log_dirs),
        };
        // Spawned as an async task on the runtime: backends are forked from its worker
        // threads, which is what PR_SET_PDEATHSIG needs (see `process`).
        self.shared.tracker.spawn(task.run());
        let wait = TakenUp::new(applied.clone(), 1);
        slots.insert(
            id,
            Slot {
                desired,
                applied,
                status,
            },
        );
        Ok((EnsureOutcome::Started, wait))
    }

    /// Makes "not running here" the instance's desired state and returns at once: its task
    /// stops the process group(s) (SIGTERM, the grace period, SIGKILL), releases the ports,
    /// sends `Stopped` and leaves. `false` if the id was not supervised.
    pub fn remove(&self, instance_id: i64) -> bool {
        self.unset(instance_id).is_some()
    }

    /// [`Supervisor::remove`], then waits until everything is stopped and the ports are
    /// free; `false` if the id was not supervised.
    pub async fn stop(&self, instance_id: i64) -> bool {
        match self.unset(instance_id) {
            Some(wait) => {
                wait.taken_up().await;
                true
            }
            None => false,
        }
    }

    fn unset(&self, instance_id: i64) -> Option<TakenUp> {
        let slots = lock(&self.slots);
        let slot = slots.get(&instance_id)?;
        let current = slot.desired.borrow().clone();
        if current.spec.is_none() {
            return Some(TakenUp::new(slot.applied.clone(), current.generation));
        }
        let generation = current.generation + 1;
        slot.desired.send_replace(Desired {
            generation,
            spec: None,
            restart_count: 0,
        });
        Some(TakenUp::new(slot.applied.clone(), generation))
    }

    /// Stops every instance (concurrently, each with its grace period) and waits for every
    /// task. Later calls to [`Supervisor::apply`] fail with
    /// [`SupervisorError::ShuttingDown`].
    pub async fn shutdown(&self) {
        self.shared.cancel.cancel();
        self.shared.tracker.close();
        self.shared.tracker.wait().await;
        lock(&self.slots).clear();
    }

    /// The current status of an instance, `None` if it is not supervised (never applied,
    /// or removed and stopped).
    pub fn status(&self, instance_id: i64) -> Option<InstanceStatus> {
        let slots = lock(&self.slots);
        let slot = slots.get(&instance_id)?;
        let status = lock(&slot.status).clone();
        status
    }

    /// The status of every supervised instance, by id.
    pub fn statuses(&self) -> Vec<InstanceStatus> {
        let slots = lock(&self.slots);
        let mut statuses: Vec<InstanceStatus> = slots
            .values()
            .filter_map(|slot| lock(&slot.status).clone())
            .collect();
        statuses.sort_by_key(|s| s.instance_id);
        statuses
    }

    /// The ids whose desired state is a spec (not being removed).
    pub fn wanted(&self) -> Vec<i64> {
        let slots = lock(&self.slots);
        let mut ids: Vec<i64> = slots
            .iter()
            .filter(|(_, slot)| slot.desired.borrow().spec.is_some())
            .map(|(id, _)| *id)
            .collect();
        ids.sort_unstable();
        ids
    }

    /// Keys of the instances that run `name` at `version` from its installation, or are
    /// about to (their spec installs it, or installs `name` without a pin and has not
    /// chosen a version yet), by key.
    pub fn users_of_backend(&self, name: &str, version: &str) -> Vec<String> {
        let slots = lock(&self.slots);
        let mut keys: Vec<String> = slots
            .values()
            .filter_map(|slot| {
                let desired = slot.desired.borrow();
                let spec = desired.spec.as_ref()?;
                let plan = spec.install.as_ref().filter(|plan| plan.name == name)?;
                let chosen = lock(&slot.status)
                    .as_ref()
                    .and_then(|status| status.backend_version.clone());
                let uses = match (plan.version.as_deref(), chosen.as_deref()) {
                    (_, Some(chosen)) => chosen == version,
                    (Some(pinned), None) => pinned == version,
                    (None, None) => true,
                };
                uses.then(|| spec.key.clone())
            })
            .collect();
        keys.sort();
        keys
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

/// Waits until an instance's task has taken up a generation of its desired state.
struct TakenUp {
    applied: watch::Receiver<u64>,
    generation: u64,
}

impl TakenUp {
    fn new(applied: watch::Receiver<u64>, generation: u64) -> Self {
        Self {
            applied,
            generation,
        }
    }

    /// Returns once the generation (or a later one) is taken up, or the task is gone.
    async fn taken_up(mut self) {
        let generation = self.generation;
        // An error means the task ended (shutdown): nothing runs any more either way.
        let _ = self
            .applied
            .wait_for(|applied| *applied >= generation)
            .await;
    }
}
