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
//! A failure before the instance was *ever* ready is final (`Error`): a model that cannot
//! load will not load on a retry either, and the server decides what to do next. Once the
//! instance has been ready, any later failure, a failed restart included, goes through the
//! backoff and the crash-loop rule. After `Error` the task holds no process and no port and
//! waits for cancellation, so `ensure` with the same spec leaves it in `Error`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gantry_backends::{backend, backend_command, join_gpu_indexes, rank_gpu_indexes, LaunchTarget};
use gantry_source::files::Hold;
use gantry_types::DownloadProgress;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::drain::{drain, Drained, LoadSource};
use super::health;
use super::process::{describe_exit, lock_sink, OutputSink, ProcessSet, SharedSink};
use super::readiness::{backend_url, wait_until_healthy};
use super::restart::{CrashTracker, CrashVerdict};
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
            let Desired { generation, spec } = self.desired.borrow_and_update().clone();
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
            *lock(&self.status) = Some(InstanceStatus::new(&spec));
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
    Failed {
        /// One line: what happened.
        reason: String,
        /// The last stderr lines of the start.
        stderr_tail: String,
        /// Whether the instance had become ready in this start.
        was_ready: bool,
        /// How long it ran after becoming ready.
        ran_for: Duration,
    },
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
        // The backend first: installed when missing (retried with backoff on failure).
        if !self.prepare_backend().await {
            self.emit(BackendState::Stopped).await;
            return;
        }
        // A remote model is downloaded first; a failure there is final like a failed
        // first start.
        // The model's files stay held (safe from eviction and deletion) while this task
        // runs.
        let _files = match self.fetch_model().await {
            Ok(files) => files,
            Err(None) => {
                self.emit(BackendState::Stopped).await;
                return;
            }
            Err(Some(message)) => {
                self.emit(BackendState::Error { message }).await;
                self.cancel.cancelled().await;
                self.emit(BackendState::Stopped).await;
                return;
            }
        };
        let mut crashes = CrashTracker::new(self.shared.config.restart.clone());
        let mut lease: Option<PortLease> = None;
        let mut ever_ready = false;
        loop {
            let end = self.attempt(&mut lease, &mut ever_ready).await;
            let AttemptEnd::Failed {
                reason,
                stderr_tail,
                was_ready,
                ran_for,
            } = end
            else {
                break;
            };
            if !ever_ready {
                lease = None;
                self.emit(BackendState::Error {
                    message: error_message(&reason, &stderr_tail),
                })
                .await;
                self.cancel.cancelled().await;
                break;
            }
            let ran_for = if was_ready { ran_for } else { Duration::ZERO };
            match crashes.record_crash(Instant::now(), ran_for) {
                CrashVerdict::Restart { attempt, backoff } => {
                    self.update_status(|status| status.restart_count += 1);
                    self.emit(BackendState::Restarting {
                        attempt,
                        backoff,
                        reason: reason.clone(),
                    })
                    .await;
                    tokio::select! {
                        () = self.cancel.cancelled() => break,
                        () = tokio::time::sleep(backoff) => {}
                    }
                }
                CrashVerdict::GiveUp { crashes } => {
                    lease = None;
                    let policy = &self.shared.config.restart;
                    let reason = format!(
                        "crash loop: {crashes} crashes within {:?} (more than {} allowed); \
                         not restarting again. Last crash: {reason}",
                        policy.crash_loop_window, policy.crash_loop_max_crashes
                    );
                    self.emit(BackendState::Error {
                        message: error_message(&reason, &stderr_tail),
                    })
                    .await;
                    self.cancel.cancelled().await;
                    break;
                }
            }
        }
        // The processes are gone (every attempt stops its own before returning); give the
        // ports back before saying so.
        drop(lease);
        self.update_status(|status| {
            status.pids.clear();
            status.ports.clear();
        });
        self.emit(BackendState::Stopped).await;
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

    /// One start: spawn, wait for readiness, watch until a crash or cancellation.
    async fn attempt(&self, lease: &mut Option<PortLease>, ever_ready: &mut bool) -> AttemptEnd {
        let config = &self.shared.config;
        let spec = &self.spec;
        let fail_early = |reason: String| AttemptEnd::Failed {
            reason,
            stderr_tail: String::new(),
            was_ready: false,
            ran_for: Duration::ZERO,
        };
        if self.cancel.is_cancelled() {
            return AttemptEnd::Cancelled;
        }
        let ranks = match rank_gpu_indexes(&spec.launch) {
            Ok(ranks) => ranks,
            Err(e) => return fail_early(format!("invalid instance spec: {e}")),
        };
        // Keep the ports of the previous start, so the address stays the same across
        // restarts, unless someone took one of them while the backend was down.
        if let Some(held) = lease.as_ref() {
            if held.ports().len() != ranks.len() || !self.shared.ports.lease_is_bindable(held) {
                *lease = None;
            }
        }
        if lease.is_none() {
            match self.shared.ports.allocate(ranks.len()) {
                Ok(new) => *lease = Some(new),
                Err(e) => return fail_early(format!("cannot allocate ports: {e}")),
            }
        }
        let ports = lease
            .as_ref()
            .expect("a lease was allocated above")
            .ports()
            .to_vec();
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
        let mut commands = Vec::with_capacity(ranks.len());
        for (rank, gpus) in ranks.iter().enumerate() {
            let target = LaunchTarget {
                bind_host: config.bind_host,
                port: ports[rank],
                gpu_indexes: gpus,
            };
            match backend_command(&spec.launch, &settings, &target) {
                Ok(command) => commands.push(command),
                Err(e) => return fail_early(format!("cannot build the backend command: {e}")),
            }
        }
        let log = match self.log_dir.create_next(&config.logs) {
            Ok(log) => log,
            Err(e) => {
                return fail_early(format!(
                    "cannot create a log file in {}: {e}",
                    self.log_dir.path().display()
                ))
            }
        };
        let log_path = log.path().to_path_buf();
        let sink = OutputSink::new(Some(log), config.logs.stderr_tail_lines);
        self.update_status(|status| {
            status.ports = ports.clone();
            status.log_file = Some(log_path.clone());
        });
        self.emit(BackendState::Starting { port: ports[0] }).await;

        let data_parallel = commands.len() > 1;
        let mut processes = ProcessSet::new();
        for (rank, command) in commands.iter().enumerate() {
            let prefix = if data_parallel {
                format!("[rank {rank}] ")
            } else {
                String::new()
            };
            lock_sink(&sink).note(&format!(
                "start {}: rank {rank}: CUDA_VISIBLE_DEVICES={} {}",
                log_path.display(),
                join_gpu_indexes(&ranks[rank]),
                command.display()
            ));
            match processes.spawn(command, rank, prefix, &sink, &self.shared.tracker) {
                Ok(pid) => {
                    tracing::debug!(
                        instance_id = spec.instance_id,
                        key = %spec.key,
                        pid,
                        port = ports[rank],
                        rank,
                        "spawned backend: {}",
                        command.display()
                    );
                }
                Err(e) => {
                    let hint = if e.kind() == std::io::ErrorKind::NotFound {
                        "; is the backend installed and on PATH, or its executable configured?"
                    } else {
                        ""
                    };
                    let reason = format!("cannot start `{}`: {e}{hint}", command.program);
                    lock_sink(&sink).note(&reason);
                    processes.terminate(config.stop_grace_period).await;
                    return self.failed(reason, &sink, false, Duration::ZERO);
                }
            }
        }
        let pids = processes.pids();
        self.update_status(|status| status.pids = pids.clone());

        // Readiness.
        let deadline = spec
            .ready_deadline
            .or(config.readiness_deadline)
            .unwrap_or_else(|| backend(spec.launch.backend).readiness_deadline());
        let urls: Vec<String> = commands
            .iter()
            .zip(&ports)
            .map(|(command, port)| backend_url(config.bind_host, *port, &command.health_path))
            .collect();
        let last_probe = Mutex::new(String::from("no probe answered yet"));
        let became_ready = {
            let probe = wait_until_healthy(&self.shared.http, &urls, &last_probe);
            tokio::select! {
                biased;
                () = self.cancel.cancelled() => Err(None),
                (rank, pid, exit) = processes.wait_any_exit() => Err(Some(format!(
                    "{} (rank {rank}, pid {pid}) {} before it became ready",
                    commands[rank].program,
                    describe_exit(&exit)
                ))),
                () = tokio::time::sleep(deadline) => Err(Some(format!(
                    "not ready within the readiness deadline of {deadline:?} (last probe: {})",
                    last_probe.lock().unwrap_or_else(|p| p.into_inner())
                ))),
                () = probe => Ok(()),
            }
        };
        // A probe can succeed against another program on the port if ours died in the
        // meantime: make sure every process still runs before calling it ready.
        let became_ready = match became_ready {
            Ok(()) => match tokio::time::timeout(Duration::ZERO, processes.wait_any_exit()).await {
                Ok((rank, pid, exit)) => Err(Some(format!(
                    "{} (rank {rank}, pid {pid}) {} before it became ready (its health path \
                     answered, so another program holds the port)",
                    commands[rank].program,
                    describe_exit(&exit)
                ))),
                Err(_) => Ok(()),
            },
            other => other,
        };
        match became_ready {
            Ok(()) => {}
            Err(None) => {
                lock_sink(&sink).note("stopping: the instance is being stopped");
                processes.terminate(config.stop_grace_period).await;
                return AttemptEnd::Cancelled;
            }
            Err(Some(reason)) => {
                lock_sink(&sink).note(&reason);
                processes.terminate(config.stop_grace_period).await;
                return self.failed(reason, &sink, false, Duration::ZERO);
            }
        }

        *ever_ready = true;
        let ready_at = Instant::now();
        self.emit(BackendState::Running {
            address: format!("{}:{}", config.advertise_host, ports[0]),
            ports: ports.clone(),
            pid: pids[0],
            pids: pids.clone(),
        })
        .await;

        // Watch.
        tokio::select! {
            () = self.cancel.cancelled() => {
                let grace = self.drain(&sink, &ports).await;
                lock_sink(&sink).note("stopping: the instance is being stopped");
                processes.terminate(grace).await;
                AttemptEnd::Cancelled
            }
            reason = health::watch(&self.shared.http, &urls, config.health) => {
                let ran_for = ready_at.elapsed();
                let mut reason = format!("unhealthy after running for {ran_for:.1?}: {reason}");
                if data_parallel {
                    reason.push_str("; restarting the whole data-parallel group");
                }
                lock_sink(&sink).note(&reason);
                self.emit(BackendState::Unhealthy { reason: reason.clone() }).await;
                // A frozen process does not act on SIGTERM: a short grace, then SIGKILL.
                processes
                    .terminate(config.stop_grace_period.min(UNHEALTHY_STOP_GRACE))
                    .await;
                self.failed(reason, &sink, true, ran_for)
            }
            (rank, pid, exit) = processes.wait_any_exit() => {
                let ran_for = ready_at.elapsed();
                let mut reason = format!(
                    "{} (rank {rank}, pid {pid}) {} after running for {ran_for:.1?}",
                    commands[rank].program,
                    describe_exit(&exit)
                );
                if data_parallel {
                    reason.push_str("; restarting the whole data-parallel group");
                }
                lock_sink(&sink).note(&reason);
                processes.terminate(config.stop_grace_period).await;
                self.failed(reason, &sink, true, ran_for)
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
        let drained = drain(&self.shared.http, source, grace / 2).await;
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

    fn failed(
        &self,
        reason: String,
        sink: &SharedSink,
        was_ready: bool,
        ran_for: Duration,
    ) -> AttemptEnd {
        AttemptEnd::Failed {
            reason,
            stderr_tail: lock_sink(sink).stderr_tail().joined(),
            was_ready,
            ran_for,
        }
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
