//! The `gantry` command: `server`, `start` (server and worker in one process) and
//! `version`. This file only parses arguments, loads configuration, sets up logging
//! and wires the crates together; behaviour lives in the library crates.

mod config;

use std::path::PathBuf;
use std::process::ExitCode;

use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use config::{Config, Layers, LogFormat};
use gantry_types::BackendKind;
use gantry_worker::agent::WorkerConfig;
use gantry_worker::gpu::SimulatedGpus;
use gantry_worker::supervisor::SupervisorConfig;

/// Cluster manager for serving AI models on GPUs.
#[derive(Debug, Parser)]
#[command(name = "gantry", version, about, propagate_version = true)]
struct Cli {
    /// Where gantry keeps its database and secrets [default: ~/.local/share/gantry, or
    /// /var/lib/gantry as root] [env: GANTRY_DATA_DIR]
    #[arg(long, global = true, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// YAML configuration file [env: GANTRY_CONFIG]
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Log line format: text or json [env: GANTRY_LOG_FORMAT]
    #[arg(long, global = true, value_name = "FORMAT")]
    log_format: Option<String>,
    /// Log filter, such as info or gantry_server=debug,info [env: GANTRY_LOG_LEVEL]
    #[arg(long, global = true, value_name = "FILTER")]
    log_level: Option<String>,
    /// Interval of worker heartbeats; servers expect it too [default: 15s] [env:
    /// GANTRY_HEARTBEAT_INTERVAL]
    #[arg(long, global = true, value_name = "DURATION")]
    heartbeat_interval: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
// Parsed once at start-up; the size of the argument structs does not matter.
#[allow(clippy::large_enum_variant)]
enum Command {
    /// Run a server: management API, scheduler and gateway.
    Server(ServerArgs),
    /// Run a worker: join the servers, report this machine's GPUs, run model instances.
    Worker(WorkerArgs),
    /// Run a server and a worker in one process, for a one-machine cluster (embedded
    /// SQLite by default).
    Start {
        #[command(flatten)]
        server: ServerArgs,
        #[command(flatten)]
        worker: WorkerArgs,
    },
    /// Print the version.
    Version,
}

/// Worker settings; each also reads `GANTRY_<NAME>` and the config file.
#[derive(Debug, Args)]
struct WorkerArgs {
    /// Server URL(s) to join, comma-separated; the worker fails over between them
    /// [key: server_urls]
    #[arg(long = "server-url", value_name = "URL[,URL…]")]
    server_url: Option<String>,
    /// Registration token (from the server's <data_dir>/registration_token) [key: token]
    #[arg(long)]
    token: Option<String>,
    /// This worker's name [default: the hostname] [key: worker_name]
    #[arg(long = "name")]
    worker_name: Option<String>,
    /// A label key=value; repeat for several [key: labels, comma-separated]
    #[arg(long = "label", value_name = "KEY=VALUE")]
    label: Vec<String>,
    /// Declare simulated GPUs instead of detecting real ones, e.g. 4x80GiB
    #[arg(long)]
    simulate_gpus: Option<String>,
    /// Address of the worker's own API [default: 0.0.0.0]
    #[arg(long)]
    worker_host: Option<String>,
    /// Port of the worker's own API [default: 10150]
    #[arg(long)]
    worker_port: Option<String>,
    /// Host name or IP through which servers reach this machine [default: the
    /// hostname; 127.0.0.1 for gantry start]
    #[arg(long)]
    advertise_host: Option<String>,
    /// Address backends listen on [default: 0.0.0.0; 127.0.0.1 for gantry start]
    #[arg(long)]
    backend_host: Option<String>,
    /// Ports for backend processes [default: 40000-40999]
    #[arg(long)]
    port_range: Option<String>,
    /// The llama-server executable [default: llama-server on PATH]
    #[arg(long)]
    llama_server_path: Option<String>,
    /// The vllm executable [default: vllm on PATH]
    #[arg(long)]
    vllm_path: Option<String>,
    /// The Python that has sglang installed [default: python3]
    #[arg(long)]
    sglang_python: Option<String>,
    /// Time between SIGTERM and SIGKILL when stopping a backend [default: 30s]
    #[arg(long)]
    stop_grace_period: Option<String>,
    /// How long a backend may take to become healthy [default: 10m]
    #[arg(long)]
    backend_ready_timeout: Option<String>,
}

impl WorkerArgs {
    fn into_flags(self, layers: &mut Layers) {
        let labels = (!self.label.is_empty()).then(|| self.label.join(","));
        let pairs = [
            ("server_urls", self.server_url),
            ("token", self.token),
            ("worker_name", self.worker_name),
            ("labels", labels),
            ("simulate_gpus", self.simulate_gpus),
            ("worker_host", self.worker_host),
            ("worker_port", self.worker_port),
            ("advertise_host", self.advertise_host),
            ("backend_host", self.backend_host),
            ("port_range", self.port_range),
            ("llama_server_path", self.llama_server_path),
            ("vllm_path", self.vllm_path),
            ("sglang_python", self.sglang_python),
            ("stop_grace_period", self.stop_grace_period),
            ("backend_ready_timeout", self.backend_ready_timeout),
        ];
        for (key, value) in pairs {
            if let Some(value) = value {
                layers.flags.insert(key, value);
            }
        }
    }
}

/// Which parts run in this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Server,
    Worker,
    Both,
}

/// Server settings; each also reads `GANTRY_<NAME>` and the config file.
#[derive(Debug, Args)]
struct ServerArgs {
    /// Address to listen on [default: 0.0.0.0]
    #[arg(long)]
    host: Option<String>,
    /// Port for the API, the web UI and the gateway [default: 8080]
    #[arg(long)]
    port: Option<String>,
    /// postgres://… to share state between several servers [default: SQLite in the data dir]
    #[arg(long)]
    database_url: Option<String>,
    /// Secret that signs session tokens (required with PostgreSQL)
    #[arg(long)]
    jwt_secret: Option<String>,
    /// Password of the first admin [default: generated into <data_dir>/initial_admin_password]
    #[arg(long)]
    bootstrap_password: Option<String>,
    /// This server's name [default: the hostname]
    #[arg(long)]
    server_id: Option<String>,
    /// Every server's URL, comma-separated
    #[arg(long)]
    server_urls: Option<String>,
    /// local, distributed or auto [default: auto]
    #[arg(long)]
    scheduling_mode: Option<String>,
    /// Silence after which a server or worker counts as gone [default: 60s]
    #[arg(long)]
    server_timeout: Option<String>,
    /// Default timeout of distributed locks [default: 30s]
    #[arg(long)]
    lock_timeout: Option<String>,
    /// Let several servers share scheduling under locks [default: true]
    #[arg(long)]
    distributed_scheduling: Option<String>,
    /// Timeout of the per-instance scheduling lock [default: 60s]
    #[arg(long)]
    schedule_lock_timeout: Option<String>,
    /// Largest management-API request body [default: 1MiB]
    #[arg(long)]
    max_request_body: Option<String>,
    /// Largest request body of the OpenAI-compatible gateway [default: 32MiB]
    #[arg(long)]
    gateway_max_request_body: Option<String>,
}

impl ServerArgs {
    fn into_flags(self, layers: &mut Layers) {
        let pairs = [
            ("host", self.host),
            ("port", self.port),
            ("database_url", self.database_url),
            ("jwt_secret", self.jwt_secret),
            ("bootstrap_password", self.bootstrap_password),
            ("server_id", self.server_id),
            ("server_urls", self.server_urls),
            ("scheduling_mode", self.scheduling_mode),
            ("server_timeout", self.server_timeout),
            ("lock_timeout", self.lock_timeout),
            ("distributed_scheduling", self.distributed_scheduling),
            ("schedule_lock_timeout", self.schedule_lock_timeout),
            ("max_request_body", self.max_request_body),
            ("gateway_max_request_body", self.gateway_max_request_body),
        ];
        for (key, value) in pairs {
            if let Some(value) = value {
                layers.flags.insert(key, value);
            }
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Logging may not be set up yet; say it plainly on stderr as well.
            tracing::error!("{e:#}");
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let mut layers = Layers {
        env: std::env::vars()
            .filter(|(k, _)| k.starts_with("GANTRY_"))
            .collect(),
        ..Default::default()
    };
    let config_file = cli
        .config
        .clone()
        .or_else(|| std::env::var_os("GANTRY_CONFIG").map(PathBuf::from));
    if let Some(path) = &config_file {
        layers.load_file(path)?;
    }
    if let Some(dir) = &cli.data_dir {
        layers.flags.insert("data_dir", dir.display().to_string());
    }
    if let Some(format) = cli.log_format {
        layers.flags.insert("log_format", format);
    }
    if let Some(level) = cli.log_level {
        layers.flags.insert("log_level", level);
    }
    if let Some(interval) = cli.heartbeat_interval {
        layers.flags.insert("heartbeat_interval", interval);
    }
    let role = match cli.command {
        Command::Version => {
            println!("gantry {}", env!("CARGO_PKG_VERSION"));
            return Ok(());
        }
        Command::Server(args) => {
            args.into_flags(&mut layers);
            Role::Server
        }
        Command::Worker(args) => {
            args.into_flags(&mut layers);
            Role::Worker
        }
        Command::Start { server, worker } => {
            server.into_flags(&mut layers);
            worker.into_flags(&mut layers);
            Role::Both
        }
    };
    let config = layers.resolve()?;
    init_logging(&config)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("start the async runtime")?;
    runtime.block_on(run_role(config, role))
}

fn init_logging(config: &Config) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_new(&config.log_level)
        .with_context(|| format!("invalid log_level {:?}", config.log_level))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match config.log_format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    }
    .map_err(|e| anyhow::anyhow!("set up logging: {e}"))
}

fn server_config(config: &Config) -> gantry_server::ServerConfig {
    let mut server = gantry_server::ServerConfig::new(config.data_dir.clone());
    server.host = config.host.clone();
    server.port = config.port;
    server.database_url = config.database_url.clone();
    server.jwt_secret = config.jwt_secret.clone();
    server.bootstrap_password = config.bootstrap_password.clone();
    server.server_id = config.server_id.clone();
    server.max_request_body = config.max_request_body;
    server.gateway_max_request_body = config.gateway_max_request_body;
    server.heartbeat_interval = config.heartbeat_interval;
    server.server_timeout = config.server_timeout;
    server.server_urls = config.server_urls.clone();
    server.lock_timeout = config.lock_timeout;
    server.distributed_scheduling = config.distributed_scheduling;
    server.schedule_lock_timeout = config.schedule_lock_timeout;
    server
}

fn worker_config(
    config: &Config,
    role: Role,
    server_port: Option<u16>,
) -> anyhow::Result<WorkerConfig> {
    let settings = &config.worker;
    let local = role == Role::Both;
    let mut supervisor = SupervisorConfig::new(config.data_dir.join("worker"));
    supervisor.port_range = settings.port_range.0..=settings.port_range.1;
    supervisor.bind_host = settings.backend_host.unwrap_or(if local {
        std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)
    } else {
        std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED)
    });
    let advertise_host = settings.advertise_host.clone().unwrap_or_else(|| {
        if local {
            "127.0.0.1".to_string()
        } else {
            gantry_worker::system::hostname()
        }
    });
    supervisor.advertise_host = advertise_host.clone();
    supervisor.stop_grace_period = settings.stop_grace_period;
    supervisor.readiness_deadline = settings.backend_ready_timeout;
    let executables = &mut supervisor.backends.executables;
    if let Some(path) = &settings.llama_server_path {
        executables.insert(BackendKind::LlamaCpp, vec![path.clone()]);
    }
    if let Some(path) = &settings.vllm_path {
        executables.insert(BackendKind::Vllm, vec![path.clone()]);
    }
    if let Some(python) = &settings.sglang_python {
        executables.insert(
            BackendKind::Sglang,
            vec![python.clone(), "-m".into(), "sglang.launch_server".into()],
        );
    }
    let (server_urls, registration_token) = match (role, server_port) {
        (Role::Both, Some(port)) => {
            let token_file = config
                .data_dir
                .join(gantry_server::bootstrap::REGISTRATION_TOKEN_FILE);
            let token = std::fs::read_to_string(&token_file)
                .map(|t| t.trim().to_string())
                .ok()
                .or_else(|| settings.token.clone());
            (vec![format!("http://127.0.0.1:{port}")], token)
        }
        _ => (config.server_urls.clone(), settings.token.clone()),
    };
    let simulate_gpus = settings
        .simulate_gpus
        .as_deref()
        .map(SimulatedGpus::parse)
        .transpose()
        .map_err(|e| anyhow::anyhow!("invalid value for simulate_gpus: {e}"))?;
    Ok(WorkerConfig {
        name: settings.name.clone(),
        server_urls,
        registration_token,
        data_dir: config.data_dir.join("worker"),
        labels: settings.labels.clone(),
        simulate_gpus,
        heartbeat_interval: config.heartbeat_interval,
        status_interval: Duration::from_secs(60).max(config.heartbeat_interval),
        api_host: if local {
            "127.0.0.1".to_string()
        } else {
            settings.host.clone()
        },
        api_port: if local { 0 } else { settings.port },
        advertise_host,
        supervisor,
    })
}

async fn run_role(config: Config, role: Role) -> anyhow::Result<()> {
    let mut signals = Signals::listen()?;
    let server = match role {
        Role::Server | Role::Both => {
            let running = gantry_server::start(server_config(&config)).await?;
            if let Some(path) = &running.registration_token_file {
                tracing::info!(path = %path.display(), "workers join with the registration token in this file");
            }
            let admin_password = config
                .data_dir
                .join(gantry_server::bootstrap::INITIAL_ADMIN_PASSWORD_FILE);
            if admin_password.exists() {
                tracing::info!(path = %admin_password.display(), "the initial admin password is in this file (user admin)");
            }
            Some(running)
        }
        Role::Worker => None,
    };
    let worker = match role {
        Role::Worker | Role::Both => {
            let worker_config =
                worker_config(&config, role, server.as_ref().map(|s| s.addr.port()))?;
            let start = gantry_worker::agent::start(worker_config);
            tokio::pin!(start);
            // Registration retries until a server answers; a signal meanwhile ends it.
            tokio::select! {
                worker = &mut start => Some(worker?),
                () = signals.recv() => {
                    if let Some(server) = server {
                        server.shutdown().await;
                    }
                    return Ok(());
                }
            }
        }
        Role::Server => None,
    };
    signals.recv().await;
    tracing::info!("shutting down");
    // The worker first: it stops its backends and says goodbye while the server is up.
    if let Some(worker) = worker {
        worker.shutdown().await;
    }
    if let Some(server) = server {
        server.shutdown().await;
    }
    tracing::info!("stopped");
    Ok(())
}

/// SIGTERM and SIGINT, listened to from start-up on: a signal that arrives while the
/// process is still starting is kept until it is awaited, never lost.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn listen() -> anyhow::Result<Self> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Self {
            term: signal(SignalKind::terminate()).context("listen for SIGTERM")?,
            int: signal(SignalKind::interrupt()).context("listen for SIGINT")?,
        })
    }

    async fn recv(&mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }
}
