//! The task that owns one instance id ([`Supervision`]): it runs the instance's desired
//! spec until the desired state changes, then stops it and runs the next one, and leaves
//! when the desired state is "not here". One run of a spec ([`InstanceTask`]): start its
//! process(es), wait for readiness, watch for crashes, restart with backoff, give up on a
//! crash loop, and stop on cancellation.
//!
//! ```text
//!   [Installing: the backend version, retried with backoff] → [Downloading: the model]
//!            ┌────────────── backoff ◀── Restarting ◀──┐ (crash after ready, or a failed
//!            ▼                                         │  restart of a once-ready instance)
//!   ──▶ Starting ──ready──▶ Running ──child exits──────┤
//!                              └──health probe fails──▶ Unhealthy (processes stopped) ─┘
//!            │                                         └─▶ Error (crash loop) ──┐
//!            └──exit / deadline / bad spec (never ready yet)──▶ Error ──────────┤
//!   cancellation at any point ─▶ stop the group(s), release the ports ─▶ Stopped ◀┘
//! ```
//!
//! The states are [`Step`]s: [`InstanceTask::run`] is a loop that handles one and moves to
//! the next; what a run remembers between starts (the crash history, the ports, whether it
//! was ever ready) is [`Starts`], and a start is four phases: prepare, spawn, await
//! readiness, watch.
//!
//! A failure before the instance was *ever* ready is final (`Error`): a model that cannot
//! load will not load on a retry either, and the server decides what to do next. Once the
//! instance has been ready, any later failure, a failed restart included, goes through the
//! backoff and the crash-loop rule. After `Error` the task holds no process and no port and
//! waits for cancellation, so `ensure` with the same spec leaves it in `Error`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gantry_backends::{
    backend, backend_command, join_gpu_indexes, rank_gpu_indexes, BackendCommand, LaunchTarget,
};
use gantry_source::files::Hold;
use gantry_types::DownloadProgress;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::drain::{drain, Drained, LoadSource};
use super::health;
use super::process::{describe_exit, lock_sink, OutputSink, ProcessSet, SharedSink};
use super::readiness::{backend_url, wait_until_healthy};
use super::restart::{CrashTracker, CrashVerdict, RestartPolicy};
use super::{
    lock, BackendState, Desired, InstanceEvent, InstanceSpec, InstanceStatus, Shared, Slot,
};
use crate::logs::LogDir;
use crate::ports::PortLease;

/// The task of one instance id: converges on its desired state, one spec at a time.
pub(crate) struct Supervision {
    pub(crate) instance_id: i64,
    pub(crate) desired: watch::Receiver<Desired>,
    pub(crate) applied: watch::Sender<u64>,
    pub(crate) status: Arc<Mutex<Option<InstanceStatus>>>,
    pub(crate) shared: Arc<Shared>,
    pub(crate) slots: Arc<Mutex<HashMap<i64, Slot>>>,
    pub(crate) log_dirs: Arc<Mutex<HashMap<i64, LogDir>>>,
}

impl Supervision {
    pub(crate) async fn run(mut self) {
        loop {
            let Desired {
                generation,
                spec,
                restart_count,
            } = self.desired.borrow_and_update().clone();
            let Some(spec) = spec else {
                // Not wanted here: everything is stopped (the last run ended before this
                // iteration). Leave, unless a new spec came in the meantime; `apply` writes
                // under the same lock, so nothing slips between the check and the removal.
                let mut slots = lock(&self.slots);
                if self.desired.borrow().spec.is_some() {
                    continue;
                }
                slots.remove(&self.instance_id);
                drop(slots);
                self.applied.send_replace(generation);
                return;
            };
            if self.shared.cancel.is_cancelled() {
                return;
            }
            let cancel = self.shared.cancel.child_token();
            let mut status = InstanceStatus::new(&spec);
            status.restart_count = restart_count;
            *lock(&self.status) = Some(status);
            let log_dir = lock(&self.log_dirs)
                .get(&self.instance_id)
                .cloned()
                .unwrap_or_else(|| LogDir::new(&self.shared.config.data_dir, &spec.key));
            let run = InstanceTask {
                spec,
                shared: Arc::clone(&self.shared),
                cancel: cancel.clone(),
                status: Arc::clone(&self.status),
                log_dir,
                program: None,
            }
            .run();
            tokio::pin!(run);
            self.applied.send_replace(generation);
            tokio::select! {
                // Ends only when cancelled: the supervisor is shutting down.
                () = &mut run => return,
                changed = self.desired.changed() => {
                    cancel.cancel();
                    run.await;
                    if changed.is_err() {
                        return;
                    }
                }
            }
        }
    }
}

/// How one start of the instance ended.
enum AttemptEnd {
    /// Cancelled: the processes are stopped.
    Cancelled,
    /// The start failed or the running instance crashed; the processes are stopped.
    Failed(Failure),
}

/// Why a start ended without being asked to.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Failure {
    /// One line: what happened.
    reason: String,
    /// The last stderr lines of the start.
    stderr_tail: String,
    /// How long it ran after becoming ready; `None` when it never became ready.
    ran_for: Option<Duration>,
}

impl Failure {
    /// A start that failed before anything was spawned.
    fn early(reason: String) -> Self {
        Self {
            reason,
            stderr_tail: String::new(),
            ran_for: None,
        }
    }
}

/// The states of one run of a spec (the diagram above); each step of
/// [`InstanceTask::run`] handles one and says which comes next.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Step {
    /// Install the backend version when missing (retried with backoff).
    Install,
    /// Download the model's files when they are remote.
    Fetch,
    /// Start the process(es), wait until they are ready, watch them.
    Start,
    /// A once-ready instance failed: wait `backoff`, then start again.
    Backoff {
        attempt: u32,
        backoff: Duration,
        reason: String,
    },
    /// Final until cancelled: say why, hold no process and no port.
    Failed { message: String },
    /// Cancelled, or done: every process is stopped; release the rest and say so.
    Stop,
}

/// What a run of a spec remembers from one start to the next.
#[derive(Debug)]
struct Starts {
    crashes: CrashTracker,
    /// The ports of the previous start, kept so the address stays the same.
    lease: Option<PortLease>,
    /// Whether a start ever became ready: a failure before that is final.
    ever_ready: bool,
}

impl Starts {
    fn new(policy: RestartPolicy) -> Self {
        Self {
            crashes: CrashTracker::new(policy),
            lease: None,
            ever_ready: false,
        }
    }

    /// What follows a failed start at `now`: the crash-loop rule for an instance that was
    /// ready once, `Failed` for one that never was.
    fn after_failure(&mut self, failure: Failure, now: Instant) -> Step {
        self.ever_ready |= failure.ran_for.is_some();
        if !self.ever_ready {
            return Step::Failed {
                message: error_message(&failure.reason, &failure.stderr_tail),
            };
        }
        let ran_for = failure.ran_for.unwrap_or(Duration::ZERO);
        match self.crashes.record_crash(now, ran_for) {
            CrashVerdict::Restart { attempt, backoff } => Step::Backoff {
                attempt,
                backoff,
                reason: failure.reason,
            },
            CrashVerdict::GiveUp { crashes } => {
                let policy = self.crashes.policy();
                let reason = format!(
                    "crash loop: {crashes} crashes within {:?} (more than {} allowed); \
                     not restarting again. Last crash: {}",
                    policy.crash_loop_window, policy.crash_loop_max_crashes, failure.reason
                );
                Step::Failed {
                    message: error_message(&reason, &failure.stderr_tail),
                }
            }
        }
    }
}

/// Everything one start needs, prepared before anything is spawned.
struct Launch {
    /// The GPUs of each rank.
    ranks: Vec<Vec<u32>>,
    /// One port per rank.
    ports: Vec<u16>,
    /// One command per rank.
    commands: Vec<BackendCommand>,
    /// The health URL of each rank.
    health_urls: Vec<String>,
    /// Where this start's output goes.
    sink: SharedSink,
    log_path: PathBuf,
}

impl Launch {
    fn data_parallel(&self) -> bool {
        self.commands.len() > 1
    }
}

pub(crate) struct InstanceTask {
    pub(crate) spec: InstanceSpec,
    pub(crate) shared: Arc<Shared>,
    pub(crate) cancel: CancellationToken,
    pub(crate) status: Arc<Mutex<Option<InstanceStatus>>>,
    pub(crate) log_dir: LogDir,
    /// The command prefix of an installed backend, instead of the configured one.
    pub(crate) program: Option<Vec<String>>,
}

impl InstanceTask {
    pub(crate) async fn run(mut self) {
        let mut starts = Starts::new(self.shared.config.restart.clone());
        // The model's files stay held (safe from eviction and deletion) while this task
        // runs.
        let mut files: Option<Hold> = None;
        let mut step = Step::Install;
        loop {
            step = match step {
                Step::Install => {
                    if self.prepare_backend().await {
                        Step::Fetch
                    } else {
                        Step::Stop
                    }
                }
                // A failed download is final, like a failed first start.
                Step::Fetch => match self.fetch_model().await {
                    Ok(hold) => {
                        files = hold;
                        Step::Start
                    }
                    Err(None) => Step::Stop,
                    Err(Some(message)) => Step::Failed { message },
                },
                Step::Start => match self.attempt(&mut starts.lease).await {
                    AttemptEnd::Cancelled => Step::Stop,
                    AttemptEnd::Failed(failure) => starts.after_failure(failure, Instant::now()),
                },
                Step::Backoff {
                    attempt,
                    backoff,
                    reason,
                } => {
                    self.update_status(|status| status.restart_count += 1);
                    self.emit(BackendState::Restarting {
                        attempt,
                        backoff,
                        reason,
                    })
                    .await;
                    tokio::select! {
                        () = self.cancel.cancelled() => Step::Stop,
                        () = tokio::time::sleep(backoff) => Step::Start,
                    }
                }
                Step::Failed { message } => {
                    starts.lease = None;
                    self.emit(BackendState::Error { message }).await;
                    self.cancel.cancelled().await;
                    Step::Stop
                }
                Step::Stop => break,
            };
        }
        // The processes are gone (every attempt stops its own before returning); give the
        // ports back before saying so.
        drop(starts);
        self.update_status(|status| {
            status.pids.clear();
            status.ports.clear();
        });
        self.emit(BackendState::Stopped).await;
        drop(files);
    }

    /// Installs the spec's backend version when missing (state `Installing`, with the
    /// installer's progress), and points the launch at it. A failed install is reported as
    /// `Error` with the installer's output and tried again after a backoff that doubles up
    /// to ten minutes. `false` when cancelled.
    async fn prepare_backend(&mut self) -> bool {
        let Some(plan) = self.spec.install.clone() else {
            return true;
        };
        let Some(backends) = self.shared.config.installed_backends.clone() else {
            self.emit(BackendState::Error {
                message: format!(
                    "{} needs installing, and this worker has no backend installer configured",
                    plan.name
                ),
            })
            .await;
            self.cancel.cancelled().await;
            return false;
        };
        let mut backoff = self.shared.config.install_retry;
        loop {
            let failure = match self.install_once(&backends, &plan).await {
                Ok(true) => return true,
                Ok(false) => return false,
                Err(failure) => failure,
            };
            let message = format!(
                "{failure}
the install is tried again in {}",
                gantry_types::units::format_duration(backoff)
            );
            self.emit(BackendState::Error { message }).await;
            tokio::select! {
                () = self.cancel.cancelled() => return false,
                () = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(Duration::from_secs(600));
        }
    }

    /// One try: `Ok(true)` ready to start, `Ok(false)` cancelled, `Err` why it failed.
    async fn install_once(
        &mut self,
        backends: &crate::backends::InstalledBackends,
        plan: &crate::backends::BackendPlan,
    ) -> Result<bool, String> {
        let version = tokio::select! {
            () = self.cancel.cancelled() => return Ok(false),
            version = backends.resolve_version(plan) => version,
        }
        .map_err(|e| format!("cannot choose a version of {} to install: {e}", plan.name))?;
        self.update_status(|status| status.backend_version = Some(version.clone()));
        let installation = match backends.find(&plan.name, &version) {
            Some(installation) => installation,
            None => {
                let (progress, mut updates) = watch::channel(gantry_types::InstallProgress {
                    backend: plan.name.clone(),
                    version: version.clone(),
                    phase: "starting".to_owned(),
                    ..Default::default()
                });
                let first = progress.borrow().clone();
                self.emit(BackendState::Installing { progress: first })
                    .await;
                let installed = {
                    let install = backends.ensure(plan, &version, &progress, &self.cancel);
                    tokio::pin!(install);
                    // Progress at most twice a second: a build prints thousands of lines.
                    let mut sent_at = Instant::now();
                    loop {
                        tokio::select! {
                            installed = &mut install => break installed,
                            Ok(()) = updates.changed() => {
                                if sent_at.elapsed() < Duration::from_millis(500) {
                                    continue;
                                }
                                sent_at = Instant::now();
                                let now = updates.borrow_and_update().clone();
                                self.emit(BackendState::Installing { progress: now }).await;
                            }
                        }
                    }
                };
                if self.cancel.is_cancelled() {
                    return Ok(false);
                }
                installed.map_err(|e| {
                    format!(
                        "installing {} {version} failed: {}
last installer lines:
{}",
                        plan.name,
                        e.message,
                        e.log_tail.join("\n")
                    )
                })?
            }
        };
        match crate::backends::program(plan.kind, &installation) {
            Some(program) => self.program = Some(program),
            None => {
                // A defined backend: its virtual environment comes first on PATH.
                let path = std::env::var("PATH").unwrap_or_default();
                let bin = installation.bin_dir.to_string_lossy().into_owned();
                let env = &mut self.spec.launch.env;
                env.insert("PATH".to_owned(), format!("{bin}:{path}"));
                if let Some(venv) = installation.bin_dir.parent() {
                    env.insert(
                        "VIRTUAL_ENV".to_owned(),
                        venv.to_string_lossy().into_owned(),
                    );
                }
            }
        }
        Ok(true)
    }

    /// Downloads the files of a remote model into the worker's cache (state
    /// `Downloading`, with progress every half second) and points the launch at them.
    /// Returns the hold on its files (none for a local model); `Err(None)` when
    /// cancelled, `Err(Some(message))` when it failed.
    async fn fetch_model(&mut self) -> Result<Option<Hold>, Option<String>> {
        let Some(source) = self.spec.remote.clone() else {
            return Ok(None);
        };
        let Some(cache) = self.shared.config.model_cache.clone() else {
            return Err(Some(
                "this worker has no model cache configured, so it cannot download models"
                    .to_owned(),
            ));
        };
        let backend = self.spec.launch.backend;
        self.emit(BackendState::Downloading {
            progress: DownloadProgress::default(),
        })
        .await;
        let resolved = tokio::select! {
            () = self.cancel.cancelled() => return Err(None),
            resolved = cache.sources().resolve(&source, backend) => resolved,
        }
        .map_err(|e| Some(format!("cannot find the model's files: {e}")))?;
        let (progress, mut updates) = watch::channel(gantry_source::cache::Progress::default());
        let fetched = {
            let fetch = cache.fetch_held(&self.spec.key, &resolved, &progress, &self.cancel);
            tokio::pin!(fetch);
            loop {
                tokio::select! {
                    fetched = &mut fetch => break fetched,
                    Ok(()) = updates.changed() => {
                        let now = *updates.borrow_and_update();
                        self.emit(BackendState::Downloading {
                            progress: DownloadProgress {
                                bytes_done: now.bytes_done,
                                bytes_total: now.bytes_total,
                                bytes_per_second: now.bytes_per_second,
                            },
                        })
                        .await;
                    }
                }
            }
        };
        let (fetched, hold) = match fetched {
            Ok(fetched) => fetched,
            Err(gantry_source::SourceError::Cancelled) => return Err(None),
            Err(e) => return Err(Some(format!("downloading the model failed: {e}"))),
        };
        // llama.cpp loads the (first) GGUF file, finding split parts beside it; the
        // engines load the directory.
        self.spec.launch.model_path = match backend {
            gantry_types::BackendKind::LlamaCpp => resolved
                .first_gguf_index()
                .and_then(|i| fetched.files.get(i).cloned())
                .ok_or_else(|| Some("the downloaded files hold no .gguf file".to_owned()))?,
            _ => fetched.dir,
        };
        Ok(Some(hold))
    }

    /// One start: spawn, wait for readiness, watch until a crash or cancellation. Every
    /// way out stops the processes it started.
    async fn attempt(&self, lease: &mut Option<PortLease>) -> AttemptEnd {
        if self.cancel.is_cancelled() {
            return AttemptEnd::Cancelled;
        }
        let launch = match self.prepare(lease) {
            Ok(launch) => launch,
            Err(reason) => return AttemptEnd::Failed(Failure::early(reason)),
        };
        self.update_status(|status| {
            status.ports = launch.ports.clone();
            status.log_file = Some(launch.log_path.clone());
        });
        self.emit(BackendState::Starting {
            port: launch.ports[0],
        })
        .await;
        let mut processes = ProcessSet::new();
        if let Err(reason) = self.spawn_all(&launch, &mut processes) {
            lock_sink(&launch.sink).note(&reason);
            processes
                .terminate(self.shared.config.stop_grace_period)
                .await;
            return self.failed(reason, &launch.sink, None);
        }
        let pids = processes.pids();
        self.update_status(|status| status.pids = pids.clone());
        match self.await_ready(&launch, &mut processes).await {
            Ok(()) => {}
            Err(None) => {
                lock_sink(&launch.sink).note("stopping: the instance is being stopped");
                processes
                    .terminate(self.shared.config.stop_grace_period)
                    .await;
                return AttemptEnd::Cancelled;
            }
            Err(Some(reason)) => {
                lock_sink(&launch.sink).note(&reason);
                processes
                    .terminate(self.shared.config.stop_grace_period)
                    .await;
                return self.failed(reason, &launch.sink, None);
            }
        }
        let ready_at = Instant::now();
        self.emit(BackendState::Running {
            address: format!("{}:{}", self.shared.config.advertise_host, launch.ports[0]),
            ports: launch.ports.clone(),
            pid: pids[0],
            pids,
        })
        .await;
        self.watch_running(&launch, &mut processes, ready_at).await
    }

    /// The GPUs, ports, commands and log file of the next start. The ports of the previous
    /// start are kept, so the address stays the same across restarts, unless someone took
    /// one of them while the backend was down.
    fn prepare(&self, lease: &mut Option<PortLease>) -> Result<Launch, String> {
        let config = &self.shared.config;
        let spec = &self.spec;
        let ranks =
            rank_gpu_indexes(&spec.launch).map_err(|e| format!("invalid instance spec: {e}"))?;
        if let Some(held) = lease.as_ref() {
            if held.ports().len() != ranks.len() || !self.shared.ports.lease_is_bindable(held) {
                *lease = None;
            }
        }
        let ports = match lease {
            Some(held) => held.ports().to_vec(),
            None => {
                let new = self
                    .shared
                    .ports
                    .allocate(ranks.len())
                    .map_err(|e| format!("cannot allocate ports: {e}"))?;
                lease.insert(new).ports().to_vec()
            }
        };
        let settings = match &self.program {
            Some(program) => {
                let mut settings = config.backends.clone();
                settings
                    .executables
                    .insert(spec.launch.backend, program.clone());
                std::borrow::Cow::Owned(settings)
            }
            None => std::borrow::Cow::Borrowed(&config.backends),
        };
        let commands = ranks
            .iter()
            .zip(&ports)
            .map(|(gpus, port)| {
                let target = LaunchTarget {
                    bind_host: config.bind_host,
                    port: *port,
                    gpu_indexes: gpus,
                };
                backend_command(&spec.launch, &settings, &target)
                    .map_err(|e| format!("cannot build the backend command: {e}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let log = self.log_dir.create_next(&config.logs).map_err(|e| {
            format!(
                "cannot create a log file in {}: {e}",
                self.log_dir.path().display()
            )
        })?;
        let log_path = log.path().to_path_buf();
        let health_urls = commands
            .iter()
            .zip(&ports)
            .map(|(command, port)| backend_url(config.bind_host, *port, &command.health_path))
            .collect();
        Ok(Launch {
            ranks,
            ports,
            commands,
            health_urls,
            sink: OutputSink::new(Some(log), config.logs.stderr_tail_lines),
            log_path,
        })
    }

    /// Spawns one process per rank into `processes`; on an error, the ones already
    /// spawned are left for the caller to stop.
    fn spawn_all(&self, launch: &Launch, processes: &mut ProcessSet) -> Result<(), String> {
        let spec = &self.spec;
        for (rank, command) in launch.commands.iter().enumerate() {
            let prefix = if launch.data_parallel() {
                format!("[rank {rank}] ")
            } else {
                String::new()
            };
            lock_sink(&launch.sink).note(&format!(
                "start {}: rank {rank}: CUDA_VISIBLE_DEVICES={} {}",
                launch.log_path.display(),
                join_gpu_indexes(&launch.ranks[rank]),
                command.display()
            ));
            let spawned = processes.spawn(
                self.shared.host.as_ref(),
                command,
                rank,
                prefix,
                &launch.sink,
                &self.shared.tracker,
            );
            match spawned {
                Ok(pid) => tracing::debug!(
                    instance_id = spec.instance_id,
                    key = %spec.key,
                    pid,
                    port = launch.ports[rank],
                    rank,
                    "spawned backend: {}",
                    command.display()
                ),
                Err(e) => {
                    let hint = if e.kind() == std::io::ErrorKind::NotFound {
                        "; is the backend installed and on PATH, or its executable configured?"
                    } else {
                        ""
                    };
                    return Err(format!("cannot start `{}`: {e}{hint}", command.program));
                }
            }
        }
        Ok(())
    }

    /// Waits until every rank answers its health path, racing the readiness deadline, the
    /// processes' exit and cancellation: `Err(None)` when cancelled, `Err(Some(reason))`
    /// when the start failed. The processes are left for the caller to stop.
    async fn await_ready(
        &self,
        launch: &Launch,
        processes: &mut ProcessSet,
    ) -> Result<(), Option<String>> {
        let config = &self.shared.config;
        let deadline = self
            .spec
            .ready_deadline
            .or(config.readiness_deadline)
            .unwrap_or_else(|| backend(self.spec.launch.backend).readiness_deadline());
        let last_probe = Mutex::new(String::from("no probe answered yet"));
        let program = |rank: usize| &launch.commands[rank].program;
        {
            let probe =
                wait_until_healthy(self.shared.host.as_ref(), &launch.health_urls, &last_probe);
            tokio::select! {
                biased;
                () = self.cancel.cancelled() => return Err(None),
                (rank, pid, exit) = processes.wait_any_exit() => return Err(Some(format!(
                    "{} (rank {rank}, pid {pid}) {} before it became ready",
                    program(rank),
                    describe_exit(&exit)
                ))),
                () = tokio::time::sleep(deadline) => return Err(Some(format!(
                    "not ready within the readiness deadline of {deadline:?} (last probe: {})",
                    last_probe.lock().unwrap_or_else(|p| p.into_inner())
                ))),
                () = probe => {}
            }
        }
        // A probe can succeed against another program on the port if ours died in the
        // meantime: make sure every process still runs before calling it ready.
        match tokio::time::timeout(Duration::ZERO, processes.wait_any_exit()).await {
            Ok((rank, pid, exit)) => Err(Some(format!(
                "{} (rank {rank}, pid {pid}) {} before it became ready (its health path \
                 answered, so another program holds the port)",
                program(rank),
                describe_exit(&exit)
            ))),
            Err(_) => Ok(()),
        }
    }

    /// Watches a ready instance until cancellation (drain, then stop), a failed health
    /// threshold or a process's exit; stops the processes either way.
    async fn watch_running(
        &self,
        launch: &Launch,
        processes: &mut ProcessSet,
        ready_at: Instant,
    ) -> AttemptEnd {
        let config = &self.shared.config;
        let group = if launch.data_parallel() {
            "; restarting the whole data-parallel group"
        } else {
            ""
        };
        let host = self.shared.host.as_ref();
        tokio::select! {
            () = self.cancel.cancelled() => {
                let grace = self.drain(&launch.sink, &launch.ports).await;
                lock_sink(&launch.sink).note("stopping: the instance is being stopped");
                processes.terminate(grace).await;
                AttemptEnd::Cancelled
            }
            reason = health::watch(host, &launch.health_urls, config.health) => {
                let ran_for = ready_at.elapsed();
                let reason = format!("unhealthy after running for {ran_for:.1?}: {reason}{group}");
                lock_sink(&launch.sink).note(&reason);
                self.emit(BackendState::Unhealthy { reason: reason.clone() }).await;
                // A frozen process does not act on SIGTERM: a short grace, then SIGKILL.
                processes
                    .terminate(config.stop_grace_period.min(UNHEALTHY_STOP_GRACE))
                    .await;
                self.failed(reason, &launch.sink, Some(ran_for))
            }
            (rank, pid, exit) = processes.wait_any_exit() => {
                let ran_for = ready_at.elapsed();
                let reason = format!(
                    "{} (rank {rank}, pid {pid}) {} after running for {ran_for:.1?}{group}",
                    launch.commands[rank].program,
                    describe_exit(&exit)
                );
                lock_sink(&launch.sink).note(&reason);
                processes.terminate(config.stop_grace_period).await;
                self.failed(reason, &launch.sink, Some(ran_for))
            }
        }
    }

    /// Lets the requests the backend is answering finish before it is stopped, for at most
    /// half the stop grace period (see [`drain`](super::drain)); returns the grace left for
    /// the processes to exit after SIGTERM.
    async fn drain(&self, sink: &SharedSink, ports: &[u16]) -> Duration {
        let grace = self.shared.config.stop_grace_period;
        let probe = backend(self.spec.launch.backend).load_probe();
        let urls: Vec<String> = probe.map_or_else(Vec::new, |probe| {
            ports
                .iter()
                .map(|port| backend_url(self.shared.config.bind_host, *port, probe.path))
                .collect()
        });
        let source = match probe {
            Some(probe) => LoadSource::Probe { probe, urls: &urls },
            None => LoadSource::Connections { ports },
        };
        let started = Instant::now();
        let drained = drain(self.shared.host.as_ref(), source, grace / 2).await;
        let waited = started.elapsed();
        let (instance_id, key) = (self.spec.instance_id, &self.spec.key);
        let note = match &drained {
            Drained::Idle => {
                let nothing = source.nothing();
                tracing::debug!(instance_id, %key, ?waited, "drained: {nothing}");
                format!("draining: {nothing} after {waited:.1?}")
            }
            Drained::Unknown(reason) => {
                tracing::debug!(instance_id, %key, %reason, "not drained: the backend's load cannot be read");
                format!("draining: skipped, the backend's load cannot be read ({reason})")
            }
            Drained::Busy(n) => {
                let some = source.some(*n);
                tracing::warn!(instance_id, %key, ?waited,
                    "stopping a backend with {some} after draining for half the stop grace period");
                format!("draining: {some} after {waited:.1?}; stopping anyway")
            }
        };
        lock_sink(sink).note(&note);
        grace.saturating_sub(waited)
    }

    fn failed(&self, reason: String, sink: &SharedSink, ran_for: Option<Duration>) -> AttemptEnd {
        AttemptEnd::Failed(Failure {
            reason,
            stderr_tail: lock_sink(sink).stderr_tail().joined(),
            ran_for,
        })
    }

    fn update_status(&self, change: impl FnOnce(&mut InstanceStatus)) {
        let mut guard = self.status.lock().unwrap_or_else(|p| p.into_inner());
        let status = guard.get_or_insert_with(|| InstanceStatus::new(&self.spec));
        change(status);
    }

    /// Records the new state, logs one line, and sends the event. Waits for room in the
    /// channel; a dropped receiver is fine.
    async fn emit(&self, state: BackendState) {
        let spec = &self.spec;
        let (pid, port) = match &state {
            BackendState::Starting { port } => (None, Some(*port)),
            BackendState::Running { pid, ports, .. } => (Some(*pid), ports.first().copied()),
            _ => {
                let status = self.status.lock().unwrap_or_else(|p| p.into_inner());
                let status = status.as_ref();
                (
                    status.and_then(|s| s.pids.first().copied()),
                    status.and_then(|s| s.ports.first().copied()),
                )
            }
        };
        match &state {
            BackendState::Error { message } => tracing::warn!(
                instance_id = spec.instance_id,
                key = %spec.key,
                pid,
                port,
                state = state.name(),
                "backend failed: {message}"
            ),
            BackendState::Restarting {
                attempt,
                backoff,
                reason,
            } => tracing::warn!(
                instance_id = spec.instance_id,
                key = %spec.key,
                pid,
                port,
                state = state.name(),
                attempt,
                "backend crashed, restarting in {backoff:?}: {reason}"
            ),
            BackendState::Running { address, .. } => tracing::info!(
                instance_id = spec.instance_id,
                key = %spec.key,
                pid,
                port,
                state = state.name(),
                "backend ready at {address}"
            ),
            // One line when the download starts; progress goes to the server only.
            BackendState::Downloading { progress } if progress.bytes_done == 0 => tracing::info!(
                instance_id = spec.instance_id,
                key = %spec.key,
                state = state.name(),
                "downloading the model's files"
            ),
            BackendState::Downloading { .. } => {}
            BackendState::Installing { progress } => {
                if progress.phase == "starting" {
                    tracing::info!(
                        instance_id = spec.instance_id,
                        key = %spec.key,
                        state = state.name(),
                        backend = %progress.backend,
                        version = %progress.version,
                        "installing the backend"
                    )
                }
            }
            BackendState::Unhealthy { reason } => tracing::warn!(
                instance_id = spec.instance_id,
                key = %spec.key,
                pid,
                port,
                state = state.name(),
                "backend unhealthy, restarting it: {reason}"
            ),
            BackendState::Starting { .. } | BackendState::Stopped => tracing::info!(
                instance_id = spec.instance_id,
                key = %spec.key,
                pid,
                port,
                state = state.name(),
                "backend {}",
                state.name()
            ),
        }
        self.update_status(|status| status.state = state.clone());
        let event = InstanceEvent {
            instance_id: spec.instance_id,
            state,
        };
        // An error only means nobody listens any more (the agent is shutting down).
        let _ = self.shared.events.send(event).await;
    }
}

/// How long an unhealthy instance's processes get after SIGTERM before SIGKILL.
const UNHEALTHY_STOP_GRACE: Duration = Duration::from_secs(5);

/// The reason, then the stderr tail under a header.
fn error_message(reason: &str, stderr_tail: &str) -> String {
    if stderr_tail.is_empty() {
        format!("{reason}\n(no stderr output)")
    } else {
        format!("{reason}\nlast stderr lines:\n{stderr_tail}")
    }
}
