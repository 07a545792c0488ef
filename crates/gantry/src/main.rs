//! The `gantry` command: `server`, `start` (server and worker in one process) and
//! `version`. This file only parses arguments, loads configuration, sets up logging
//! and wires the crates together; behaviour lives in the library crates.

mod config;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use config::{Config, Layers, LogFormat};

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
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a server: management API, scheduler and gateway.
    Server(ServerArgs),
    /// Run a server with an embedded SQLite database, for a one-machine cluster.
    Start(ServerArgs),
    /// Print the version.
    Version,
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
    /// Interval of worker and server heartbeats [default: 15s]
    #[arg(long)]
    heartbeat_interval: Option<String>,
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
            ("heartbeat_interval", self.heartbeat_interval),
            ("server_timeout", self.server_timeout),
            ("lock_timeout", self.lock_timeout),
            ("distributed_scheduling", self.distributed_scheduling),
            ("schedule_lock_timeout", self.schedule_lock_timeout),
            ("max_request_body", self.max_request_body),
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
    let (args, embedded_worker) = match cli.command {
        Command::Version => {
            println!("gantry {}", env!("CARGO_PKG_VERSION"));
            return Ok(());
        }
        Command::Server(args) => (args, false),
        Command::Start(args) => (args, true),
    };
    args.into_flags(&mut layers);
    let config = layers.resolve()?;
    init_logging(&config)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("start the async runtime")?;
    runtime.block_on(serve(config, embedded_worker))
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
    server.heartbeat_interval = config.heartbeat_interval;
    server.server_timeout = config.server_timeout;
    server.server_urls = config.server_urls.clone();
    server.lock_timeout = config.lock_timeout;
    server.distributed_scheduling = config.distributed_scheduling;
    server.schedule_lock_timeout = config.schedule_lock_timeout;
    server
}

async fn serve(config: Config, embedded_worker: bool) -> anyhow::Result<()> {
    if embedded_worker
        && config
            .database_url
            .as_deref()
            .is_some_and(|u| u.starts_with("postgres"))
    {
        tracing::info!(
            "gantry start with a PostgreSQL database_url: the server shares that database"
        );
    }
    let running = gantry_server::start(server_config(&config)).await?;
    if embedded_worker {
        tracing::warn!(
            "gantry start runs the server only for now: the embedded worker is not built yet, \
             so no model instance will run on this machine"
        );
    }
    if let Some(path) = &running.registration_token_file {
        tracing::info!(path = %path.display(), "workers join with the registration token in this file");
    }
    let admin_password = config
        .data_dir
        .join(gantry_server::bootstrap::INITIAL_ADMIN_PASSWORD_FILE);
    if admin_password.exists() {
        tracing::info!(path = %admin_password.display(), "the initial admin password is in this file (user admin)");
    }
    wait_for_signal().await?;
    tracing::info!("shutting down");
    running.shutdown().await;
    tracing::info!("stopped");
    Ok(())
}

async fn wait_for_signal() -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("listen for SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("listen for SIGINT")?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    Ok(())
}
