//! The worker agent: joins the cluster, reports hardware and heartbeats, follows the
//! instances placed on this worker, runs them through the supervisor, and reports
//! their states back. It writes nothing to the store: everything goes through the
//! servers' HTTP API, to whichever server answers.

pub mod assignments;
pub mod identity;
pub mod model_dirs;
pub mod register;
pub mod report;
mod uploads;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use gantry_client::Client;
use gantry_types::{ErrorCode, WorkerRegister, WorkerStatus};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::gpu::{GpuProbe, SimulatedGpus};
use crate::supervisor::{Supervisor, SupervisorConfig};
use identity::Identity;

/// How the worker runs.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Unique in the cluster; defaults to the hostname.
    pub name: String,
    /// Every server's base URL; the worker uses one and moves on when it fails.
    pub server_urls: Vec<String>,
    /// PEM certificates to trust for `https://` servers besides the system's roots
    /// (`server_ca_file`).
    pub server_ca_file: Option<PathBuf>,
    /// Needed for the first registration; later the saved credential is used.
    pub registration_token: Option<String>,
    /// Holds the credential, backend logs and other worker state.
    pub data_dir: PathBuf,
    pub labels: BTreeMap<String, String>,
    /// Declared devices instead of NVML (tests and demos).
    pub simulate_gpus: Option<SimulatedGpus>,
    pub heartbeat_interval: Duration,
    /// Interval of the full hardware report (also sent when it changes).
    pub status_interval: Duration,
    /// Where the worker's own HTTP API listens (0 picks a free port).
    pub api_host: String,
    pub api_port: u16,
    /// Serve the worker's own API over HTTPS with this certificate and key
    /// (`tls_cert_file`, `tls_key_file`); the address it registers then says `https://`.
    pub api_tls: Option<gantry_tls::TlsFiles>,
    /// Host name or IP through which servers reach this machine (its API and the
    /// backends); defaults to 127.0.0.1 for single-machine set-ups.
    pub advertise_host: String,
    /// The only directories `local_path` models are read from.
    pub model_dirs: Vec<PathBuf>,
    pub supervisor: SupervisorConfig,
}

/// A worker that is registered and running.
#[derive(Debug)]
pub struct RunningWorker {
    pub identity: Identity,
    /// Where the worker's API listens.
    pub api_addr: SocketAddr,
    shared: Arc<Shared>,
}

/// What the worker's tasks share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub config: WorkerConfig,
    pub client: Client,
    pub supervisor: Supervisor,
    /// Backends this worker can run: found, installed or installable (reported).
    pub backends: Vec<String>,
    /// Backends whose programs this worker found at start (configured or on `PATH`), with
    /// the executable found (empty for `custom`, whose command comes with each model).
    pub found_backends: std::collections::BTreeMap<gantry_types::BackendKind, String>,
    pub gpus: GpuProbe,
    pub shutdown: CancellationToken,
    pub tasks: TaskTracker,
    pub api_token: String,
    /// Backend installs the servers asked for through the worker's API.
    pub preinstalls: Arc<crate::preinstall::PreInstalls>,
}

impl Shared {
    /// The hardware report as it is now.
    pub(crate) fn status(&self) -> WorkerStatus {
        WorkerStatus {
            gpus: self.gpus(),
            system: crate::system::system_info(&self.config.data_dir),
            backends: self.backends.clone(),
            installed_backends: self
                .config
                .supervisor
                .installed_backends
                .as_ref()
                .map(|installed| installed.list())
                .unwrap_or_default(),
            found_backends: self
                .found_backends
                .iter()
                .map(|(kind, program)| gantry_types::FoundBackend {
                    name: kind.as_str().to_owned(),
                    program: program.clone(),
                })
                .collect(),
        }
    }

    /// The GPUs as they are now: simulated, or from NVML.
    fn gpus(&self) -> Vec<gantry_types::GpuDevice> {
        match self.config.simulate_gpus {
            Some(simulated) => simulated.devices(&self.config.name),
            None => self.gpus.devices(),
        }
    }

    /// How busy this machine is now, for a heartbeat.
    pub(crate) fn sample(&self, cpu: &mut crate::system::CpuMeter) -> gantry_types::WorkerSample {
        let system = crate::system::system_info(&self.config.data_dir);
        gantry_types::WorkerSample {
            at: None,
            cpu_percent: cpu.percent(),
            memory_used: system.memory_total.saturating_sub(system.memory_available),
            memory_total: system.memory_total,
            gpus: self
                .gpus()
                .iter()
                .map(|gpu| gantry_types::GpuSample {
                    index: gpu.index,
                    memory_used: gpu.memory_used,
                    memory_total: gpu.memory_total,
                    utilization: gpu.utilization,
                })
                .collect(),
        }
    }
}

/// Registers and starts every loop of the worker. Returns once registered.
pub async fn start(config: WorkerConfig) -> anyhow::Result<RunningWorker> {
    std::fs::create_dir_all(&config.data_dir)
        .with_context(|| format!("create worker data directory {}", config.data_dir.display()))?;
    for dir in &config.model_dirs {
        if dir.is_dir() {
            tracing::info!(dir = %dir.display(), "local_path models may be read from this directory");
        } else {
            tracing::warn!(dir = %dir.display(), "model directory does not exist (yet): local_path models under it are refused until it does");
        }
    }
    if config.server_urls.is_empty() {
        anyhow::bail!("no server URL: pass --server-url http://SERVER:8080 (several, comma-separated, for failover)");
    }
    let gpus = if config.simulate_gpus.is_some() {
        tracing::info!(gpus = ?config.simulate_gpus, "using simulated GPUs: they exist for scheduling only");
        GpuProbe::disabled()
    } else {
        GpuProbe::load()
    };
    let listener = TcpListener::bind((config.api_host.as_str(), config.api_port))
        .await
        .with_context(|| {
            format!(
                "listen on {}:{} for the worker API",
                config.api_host, config.api_port
            )
        })?;
    let api_addr = listener
        .local_addr()
        .context("read the worker API address")?;
    // Checked before registering, so a bad file stops the worker with its name.
    let api_tls = config
        .api_tls
        .as_ref()
        .map(gantry_tls::acceptor)
        .transpose()
        .context("serve the worker API over HTTPS")?;

    let shutdown = CancellationToken::new();
    let (events_tx, events_rx) = tokio::sync::mpsc::channel(256);
    let supervisor = Supervisor::new(config.supervisor.clone(), events_tx)
        .context("start the backend supervisor")?;
    let found_backends = available_backends(&config.supervisor);
    let has_gpus = config.simulate_gpus.is_some() || !gpus.devices().is_empty();
    let backends = runnable_backends(&found_backends, &config, has_gpus);
    let client = match &config.server_ca_file {
        None => Client::with_servers(config.server_urls.clone()),
        Some(path) => {
            let pem = std::fs::read(path)
                .with_context(|| format!("read server_ca_file {}", path.display()))?;
            Client::with_servers_trusting(config.server_urls.clone(), &pem).with_context(|| {
                format!(
                    "server_ca_file {}: no usable PEM certificate (-----BEGIN CERTIFICATE-----)",
                    path.display()
                )
            })?
        }
    };
    if let Some(cache) = &config.supervisor.model_cache {
        cache
            .sources()
            .set_staged(std::sync::Arc::new(uploads::ServerUploads {
                client: client.clone(),
            }));
    }
    let mut shared = Shared {
        config,
        client,
        supervisor,
        backends,
        found_backends,
        gpus,
        shutdown: shutdown.clone(),
        tasks: TaskTracker::new(),
        api_token: String::new(),
        preinstalls: Arc::default(),
    };
    let request = WorkerRegister {
        name: shared.config.name.clone(),
        labels: shared.config.labels.clone(),
        address: format!(
            "{}{}:{}",
            if api_tls.is_some() { "https://" } else { "" },
            shared.config.advertise_host,
            api_addr.port()
        ),
        status: shared.status(),
    };
    let identity = register::register(
        &shared.client,
        &shared.config.data_dir,
        shared.config.registration_token.as_deref(),
        &request,
        &shutdown,
    )
    .await?;
    shared.client.set_token(identity.credential.clone());
    shared.api_token = identity.api_token.clone();
    let shared = Arc::new(shared);

    crate::http::serve(shared.clone(), listener, api_tls);
    spawn_heartbeat(shared.clone());
    spawn_server_refresh(shared.clone());
    spawn_status(shared.clone());
    let reporter = report::spawn(shared.clone(), events_rx);
    assignments::spawn(shared.clone(), reporter);
    tracing::info!(worker_id = identity.worker_id, worker = %identity.name, api = %api_addr, server = %shared.client.current_url(), "worker running");
    Ok(RunningWorker {
        identity,
        api_addr,
        shared,
    })
}

impl RunningWorker {
    /// Stops every backend (SIGTERM, grace, SIGKILL), tells the server the worker is
    /// going away, and waits for every task.
    pub async fn shutdown(self) {
        tracing::info!(worker = %self.identity.name, "worker shutting down: stopping backends");
        // The supervisor first, while the reporter still drains its events; then the
        // loops.
        self.shared.supervisor.shutdown().await;
        self.shared.shutdown.cancel();
        let goodbye = tokio::time::timeout(Duration::from_secs(5), self.shared.client.goodbye());
        match goodbye.await.unwrap_or_else(|_| {
            Err(gantry_client::ClientError::Unreachable {
                tried: 1,
                last: "no answer within 5 s".to_owned(),
            })
        }) {
            Ok(_) => tracing::info!("told the server this worker is going away"),
            Err(e) => {
                tracing::warn!(error = %e, "could not tell the server this worker is going away")
            }
        }
        self.shared.tasks.close();
        self.shared.tasks.wait().await;
        tracing::info!(worker = %self.identity.name, "worker stopped");
    }
}

/// Keeps the client's list of servers fresh from the registry, every heartbeat interval:
/// the active servers, lowest load score first, then the configured URLs not among them
/// (a way back in when the registry's servers are all gone). A failing call changes
/// nothing: the heartbeat's own failover handles it.
fn spawn_server_refresh(shared: Arc<Shared>) {
    let tasks = shared.tasks.clone();
    tasks.spawn(async move {
        let configured = shared.config.server_urls.clone();
        let mut tick = tokio::time::interval(shared.config.heartbeat_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut known = shared.client.server_urls();
        loop {
            tokio::select! {
                () = shared.shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            let Ok(directory) = shared.client.worker_servers().await else {
                continue;
            };
            let mut urls: Vec<String> = directory.servers.into_iter().map(|s| s.url).collect();
            for url in &configured {
                let url = url.trim_end_matches('/').to_owned();
                if !urls.contains(&url) {
                    urls.push(url);
                }
            }
            if urls != known {
                tracing::info!(servers = ?urls, "servers of the cluster, best first");
                shared.client.set_servers(urls.clone());
                known = urls;
            }
        }
    });
}

/// How long one server has to answer a heartbeat before the next server is tried: the
/// heartbeat interval, and at least this much (a busy server is not a dead one).
const MIN_HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(2);

/// How often a sample goes with the heartbeats when the server does not say.
const DEFAULT_SAMPLE_INTERVAL: Duration = Duration::from_secs(10);

fn spawn_heartbeat(shared: Arc<Shared>) {
    let tasks = shared.tasks.clone();
    tasks.spawn(async move {
        let timeout = shared.config.heartbeat_interval.max(MIN_HEARTBEAT_TIMEOUT);
        let mut tick = tokio::time::interval(shared.config.heartbeat_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing = false;
        let mut cpu = crate::system::CpuMeter::default();
        // A sample goes with a heartbeat as often as the server asks (it keeps no more).
        let mut sample_due = tokio::time::Instant::now();
        loop {
            tokio::select! {
                () = shared.shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            let result = if tokio::time::Instant::now() >= sample_due {
                let sample = shared.sample(&mut cpu);
                shared
                    .client
                    .heartbeat_with_sample(timeout, &sample)
                    .await
                    .map(|(worker, every)| {
                        sample_due = tokio::time::Instant::now()
                            + every.unwrap_or(DEFAULT_SAMPLE_INTERVAL);
                        worker
                    })
            } else {
                shared.client.heartbeat_within(timeout, None).await
            };
            match result {
                Ok(_) if failing => {
                    failing = false;
                    tracing::info!(server = %shared.client.current_url(), "heartbeats reach a server again");
                }
                Ok(_) => {}
                Err(e) if e.code() == Some(ErrorCode::Unauthorized) => {
                    tracing::error!(error = %e, "the servers no longer accept this worker's credential (was it deleted?); restart the worker to register it again");
                }
                Err(e) => {
                    if !failing {
                        tracing::warn!(error = %e, "heartbeat failed");
                    }
                    failing = true;
                }
            }
        }
    });
}

fn spawn_status(shared: Arc<Shared>) {
    let tasks = shared.tasks.clone();
    tasks.spawn(async move {
        let mut tick = tokio::time::interval(shared.config.status_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_sent: Option<WorkerStatus> = None;
        // Re-checked every heartbeat interval, sent when the devices or backends
        // changed or when the full interval passed.
        let mut check = tokio::time::interval(shared.config.heartbeat_interval);
        // An install or removal is reported at once.
        let mut installs = shared
            .config
            .supervisor
            .installed_backends
            .as_ref()
            .map(|installed| installed.subscribe());
        loop {
            let force = tokio::select! {
                () = shared.shutdown.cancelled() => return,
                _ = tick.tick() => true,
                _ = check.tick() => false,
                Some(Ok(())) = async {
                    match installs.as_mut() {
                        Some(installs) => Some(installs.changed().await),
                        None => std::future::pending().await,
                    }
                } => false,
            };
            let status = shared.status();
            let changed = last_sent.as_ref().is_none_or(|last| {
                last.backends != status.backends
                    || last.installed_backends != status.installed_backends
                    || last.gpus.len() != status.gpus.len()
                    || last
                        .gpus
                        .iter()
                        .zip(&status.gpus)
                        .any(|(a, b)| a.uuid != b.uuid)
            });
            if !force && !changed {
                continue;
            }
            match shared.client.report_status(&status).await {
                Ok(_) => last_sent = Some(status),
                Err(e) => tracing::warn!(error = %e, "status report failed"),
            }
        }
    });
}

/// What the worker reports it can run: the backends found, plus those it installs on
/// demand — llama.cpp everywhere (built from source, CPU or CUDA), vLLM and SGLang where
/// there are GPUs (their PyPI packages need CUDA) — and the ones already installed.
fn runnable_backends(
    found: &std::collections::BTreeMap<gantry_types::BackendKind, String>,
    config: &WorkerConfig,
    has_gpus: bool,
) -> Vec<String> {
    use gantry_types::BackendKind;
    let mut kinds: std::collections::BTreeSet<BackendKind> = found.keys().copied().collect();
    if let Some(installed) = &config.supervisor.installed_backends {
        kinds.insert(BackendKind::LlamaCpp);
        if has_gpus {
            kinds.insert(BackendKind::Vllm);
            kinds.insert(BackendKind::Sglang);
        }
        for backend in installed.list() {
            if let Some(kind) = BackendKind::parse(&backend.name) {
                kinds.insert(kind);
            }
        }
    }
    kinds.insert(BackendKind::Custom);
    let backends: Vec<String> = kinds.iter().map(|k| k.as_str().to_owned()).collect();
    tracing::info!(
        ?backends,
        "backends this worker runs (found, installed or installable)"
    );
    backends
}

/// The backends whose program this worker finds (on `PATH` or as configured), each with
/// the executable found. A program run as a Python module (`python3 -m
/// sglang.launch_server`) counts only when the interpreter can import the module. `custom`
/// is always listed, with no executable: its command comes with the model.
fn available_backends(
    config: &SupervisorConfig,
) -> std::collections::BTreeMap<gantry_types::BackendKind, String> {
    let mut found = std::collections::BTreeMap::new();
    for backend in gantry_backends::all() {
        let program = config.backends.program(backend.kind());
        let executable = match program.as_slice() {
            [] => Some(String::new()),
            [python, flag, module, ..] if flag == "-m" => {
                let package = module.split('.').next().unwrap_or(module);
                locate_program(python).filter(|_| {
                    std::process::Command::new(python)
                        .args(["-c", &format!("import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('{package}') else 1)")])
                        .stdout(std::process::Stdio::null())
                        .stderr(std::process::Stdio::null())
                        .status()
                        .is_ok_and(|s| s.success())
                })
            }
            [first, ..] => locate_program(first),
        };
        if let Some(executable) = executable {
            found.insert(backend.kind(), executable);
        }
    }
    tracing::info!(backends = ?found, "backend programs found on this worker");
    found
}

/// The executable `program` names: itself when it is a path to a file, else the first file
/// of that name on `PATH`.
fn locate_program(program: &str) -> Option<String> {
    if program.contains('/') {
        return std::path::Path::new(program)
            .is_file()
            .then(|| program.to_owned());
    }
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths)
        .map(|dir| dir.join(program))
        .find(|path| path.is_file())
        .map(|path| path.display().to_string())
}
