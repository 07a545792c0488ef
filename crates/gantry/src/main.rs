//! The `gantry` command: `server`, `worker`, `start` (server and worker in one process)
//! and `version`, and the client commands of `cli/` (`login`, `models`, `chat`, …). This
//! file only reads the command line and the configuration, sets up logging and wires the
//! crates together; the keys and their parsing live in `config/`, behaviour in the
//! library crates.

mod backup;
mod cli;
mod config;
#[cfg(test)]
mod docs_paths;

/// mimalloc instead of glibc's malloc: the gateway allocates per request, and glibc's
/// malloc and free are a visible share of its CPU under load.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use config::cli::{Invocation, Role};
use config::{Config, Layers, LogFormat};
use gantry_backends::BackendSettings;
use gantry_server::ServerConfig;
use gantry_types::BackendKind;
use gantry_worker::agent::WorkerConfig;
use gantry_worker::supervisor::SupervisorConfig;

fn main() -> ExitCode {
    let invocation = match config::cli::parse_from(std::env::args_os()) {
        Ok(invocation) => invocation,
        Err(e) => e.exit(),
    };
    match run(invocation) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Logging may not be set up yet; say it plainly on stderr as well.
            tracing::error!("{e:#}");
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(invocation: Invocation) -> anyhow::Result<()> {
    match invocation {
        Invocation::Version => {
            println!("gantry {}", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
        Invocation::Client(command) => cli::run(command),
        Invocation::Backup {
            out,
            config_file,
            flags,
        } => {
            let (config, runtime) = configured(config_file, flags)?;
            runtime.block_on(backup::backup(&server_config(&config), &out))
        }
        Invocation::Restore {
            from,
            config_file,
            flags,
        } => {
            let (config, runtime) = configured(config_file, flags)?;
            runtime.block_on(backup::restore(&server_config(&config), &from))
        }
        Invocation::BackendInstall {
            target,
            config_file,
            flags,
        } => {
            let (config, runtime) = configured(config_file, flags)?;
            runtime.block_on(install_backend(&config, &target))
        }
        Invocation::Run {
            role,
            config_file,
            flags,
        } => {
            let (config, runtime) = configured(config_file, flags)?;
            if cfg!(debug_assertions) {
                tracing::info!(
                    "this is an unoptimised build (the dev profile of `cargo run`): fine for \
                     trying gantry out; for serving, build it with `cargo build --profile dist`"
                );
            }
            raise_open_file_limit();
            runtime.block_on(run_role(config, role))
        }
    }
}

/// Resolves the configuration of a command, starts its logging and its async runtime.
fn configured(
    config_file: Option<std::path::PathBuf>,
    flags: std::collections::BTreeMap<&'static str, String>,
) -> anyhow::Result<(Config, tokio::runtime::Runtime)> {
    let config = Layers::gather(config_file, flags)?.resolve()?;
    init_logging(&config)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("start the async runtime")?;
    Ok((config, runtime))
}

/// Raises the soft limit of open files to the hard limit: every client connection,
/// every watch stream and every upstream connection of the gateway is a descriptor, and
/// the usual soft limit (1,024) is reached by a few hundred concurrent streams.
fn raise_open_file_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => tracing::debug!(from = soft, to = hard, "raised the open-file limit"),
            Err(e) => {
                tracing::warn!(soft, hard, error = %e, "cannot raise the open-file limit; many connections may fail")
            }
        },
        Ok(_) => {}
        Err(e) => tracing::debug!(error = %e, "cannot read the open-file limit"),
    }
}

/// The backend installer the worker's keys describe (`backend_cache_dir`).
fn installer(config: &Config) -> Result<gantry_install::Installer, gantry_install::InstallError> {
    gantry_install::Installer::new(gantry_install::InstallerConfig {
        cache_dir: config
            .backend_cache_dir
            .as_ref()
            .map(std::path::PathBuf::from)
            .unwrap_or_else(gantry_install::InstallerConfig::default_cache_dir),
        ..Default::default()
    })
}

/// `gantry backend install NAME[@VERSION]`: installs into the worker data directory this
/// configuration names, where the worker finds (and reports) it; prints the directory.
async fn install_backend(config: &Config, target: &str) -> anyhow::Result<()> {
    let (name, version) = match target.split_once('@') {
        Some((name, version)) => (name, Some(version.to_owned())),
        None => (target, None),
    };
    let kind = BackendKind::parse(name)
        .filter(|kind| *kind != BackendKind::Custom)
        .with_context(|| {
            format!(
                "cannot install {name:?}: give llama.cpp, vllm or sglang (a custom backend's \
                 requirements are installed by the worker for the models that use it)"
            )
        })?;
    if let Some(version) = &version {
        gantry_types::backend::check_version("version", version)
            .map_err(|e| anyhow::anyhow!("{}: {}", e.field, e.message))?;
    }
    let installer = installer(config).map_err(|e| anyhow::anyhow!("{e}"))?;
    let backends =
        gantry_worker::backends::InstalledBackends::new(&config.data_dir.join("worker"), installer);
    let plan = gantry_worker::backends::BackendPlan {
        name: kind.as_str().to_owned(),
        kind,
        version,
        requirements: Vec::new(),
        pip_args: Vec::new(),
    };
    let version = backends
        .resolve_version(&plan)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let (progress, mut updates) =
        tokio::sync::watch::channel(gantry_types::InstallProgress::default());
    let cancel = tokio_util::sync::CancellationToken::new();
    let printer = tokio::spawn(async move {
        let mut last = (String::new(), None::<u8>);
        while updates.changed().await.is_ok() {
            let now: gantry_types::InstallProgress = updates.borrow_and_update().clone();
            let step = now.percent.map(|p| p / 10);
            if (now.phase.as_str(), step) != (last.0.as_str(), last.1) {
                match now.percent {
                    Some(percent) => eprintln!("{}: {percent} %", now.phase),
                    None => eprintln!("{}", now.phase),
                }
                last = (now.phase.clone(), step);
            }
        }
    });
    let installed = tokio::select! {
        installed = backends.ensure(&plan, &version, &progress, &cancel) => installed,
        _ = tokio::signal::ctrl_c() => {
            cancel.cancel();
            anyhow::bail!("interrupted; nothing was installed");
        }
    };
    drop(progress);
    let _ = printer.await;
    let installation = installed.map_err(|e| anyhow::anyhow!("{e}"))?;
    eprintln!(
        "installed {} {version} ({}) in {}",
        kind.as_str(),
        installation.variant,
        installation.dest.display()
    );
    println!("{}", installation.dest.display());
    Ok(())
}

fn init_logging(config: &Config) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_new(&config.log_level)
        .with_context(|| format!("invalid log_level {:?}", config.log_level))?;
    // Colours only on a terminal: a log file or journal gets plain lines.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match config.log_format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    }
    .map_err(|e| anyhow::anyhow!("set up logging: {e}"))
}

fn server_config(config: &Config) -> ServerConfig {
    ServerConfig {
        host: config.host.clone(),
        port: config.port,
        database_url: config.database_url.clone(),
        jwt_secret: config.jwt_secret.clone(),
        bootstrap_password: config.bootstrap_password.clone(),
        server_id: config.server_id.clone(),
        advertise_url: config.advertise_url.clone(),
        tls: match (&config.tls_cert_file, &config.tls_key_file) {
            (Some(cert), Some(key)) => Some(gantry_tls::TlsFiles {
                cert: std::path::PathBuf::from(cert),
                key: std::path::PathBuf::from(key),
            }),
            _ => None,
        },
        worker_ca_file: config.worker_ca_file.clone().map(std::path::PathBuf::from),
        scheduling_mode: config.scheduling_mode,
        lease_ttl: config.lease_ttl,
        lease_renew_interval: config.lease_renew_interval,
        max_request_body: config.max_request_body,
        gateway_max_request_body: config.gateway_max_request_body,
        gateway_eject_after: config.gateway_eject_after,
        gateway_eject_cooldown: config.gateway_eject_cooldown,
        gateway_first_byte_timeout: config.gateway_first_byte_timeout,
        api_key_cache_ttl: config.api_key_cache_ttl,
        usage_retention: config.usage_retention,
        model_catalog_file: config
            .model_catalog_file
            .as_ref()
            .map(std::path::PathBuf::from),
        heartbeat_interval: config.heartbeat_interval,
        server_timeout: config.server_timeout,
        server_urls: config.server_urls.clone(),
        lock_timeout: config.lock_timeout,
        distributed_scheduling: config.distributed_scheduling,
        schedule_lock_timeout: config.schedule_lock_timeout,
        shutdown_grace: config.stop_grace_period,
        sources: source_config(config),
        upload_max_size: config.upload_max_size,
        upload_bucket: config.s3_upload_bucket.clone(),
        pool_interval: config.pool_interval,
        local_pool_ports: config.local_pool_port_range.clone(),
        pool_commands_dir: config
            .pool_commands_dir
            .as_ref()
            .map(std::path::PathBuf::from),
        ..ServerConfig::new(config.data_dir.clone())
    }
}

/// Where remote models come from (server: to read their headers; worker: to download).
fn source_config(config: &Config) -> gantry_source::SourceConfig {
    gantry_source::SourceConfig {
        hf_endpoint: config.hf_endpoint.clone(),
        hf_token: config.hf_token.clone(),
        modelscope_endpoint: config.modelscope_endpoint.clone(),
        s3: gantry_source::S3Config {
            endpoint: config.s3_endpoint.clone(),
            region: config.s3_region.clone(),
            access_key: config.s3_access_key.clone(),
            secret_key: config.s3_secret_key.clone(),
        },
    }
}

/// `gantry start` keeps the worker on loopback and joins it to its own server (on
/// `server_port`) with the registration token that server wrote.
fn worker_config(config: &Config, role: Role, server_port: Option<u16>) -> WorkerConfig {
    let local = role == Role::Both;
    let data_dir = config.data_dir.join("worker");
    let advertise_host = config.advertise_host.clone().unwrap_or_else(|| {
        if local {
            Ipv4Addr::LOCALHOST.to_string()
        } else {
            gantry_worker::system::hostname()
        }
    });
    let supervisor = SupervisorConfig {
        port_range: config.port_range.clone(),
        bind_host: config.backend_host.unwrap_or(IpAddr::V4(if local {
            Ipv4Addr::LOCALHOST
        } else {
            Ipv4Addr::UNSPECIFIED
        })),
        advertise_host: advertise_host.clone(),
        stop_grace_period: config.stop_grace_period,
        readiness_deadline: Some(config.backend_ready_timeout),
        backends: BackendSettings {
            executables: HashMap::from([
                (
                    BackendKind::LlamaCpp,
                    vec![config.llama_server_path.clone()],
                ),
                (BackendKind::Vllm, vec![config.vllm_path.clone()]),
                (
                    BackendKind::Sglang,
                    gantry_backends::sglang::program_with(&config.sglang_python),
                ),
            ]),
            ..BackendSettings::default()
        },
        model_cache: Some(std::sync::Arc::new(
            gantry_source::cache::ModelCache::new(
                data_dir.join("model-cache"),
                gantry_source::Sources::new(source_config(config)),
            )
            .with_max_bytes(config.model_cache_max)
            .with_parallel(gantry_source::parallel::Parallel {
                connections: config.download_connections,
                ..Default::default()
            }),
        )),
        installed_backends: config.install_backends.then(|| {
            match installer(config) {
                Ok(installer) => Some(std::sync::Arc::new(
                    gantry_worker::backends::InstalledBackends::new(&data_dir, installer),
                )),
                Err(e) => {
                    tracing::error!(error = %e, "cannot set up the backend installer; backends will not be installed on demand");
                    None
                }
            }
        }).flatten(),
        health: gantry_worker::supervisor::HealthPolicy {
            interval: config.health_interval,
            timeout: config.health_timeout,
            failure_threshold: u32::try_from(config.health_failure_threshold).unwrap_or(u32::MAX),
        },
        ..SupervisorConfig::new(data_dir.clone())
    };
    let (server_urls, registration_token) = match (role, server_port) {
        (Role::Both, Some(port)) => {
            let token_file = config
                .data_dir
                .join(gantry_server::bootstrap::REGISTRATION_TOKEN_FILE);
            let token = std::fs::read_to_string(&token_file)
                .map(|t| t.trim().to_string())
                .ok()
                .or_else(|| config.token.clone());
            // With TLS, the advertised name (which the certificate covers) when there
            // is one, else loopback (a certificate made for 127.0.0.1).
            let url = match (&config.tls_cert_file, &config.advertise_url) {
                (None, _) => format!("http://127.0.0.1:{port}"),
                (Some(_), Some(advertised)) => advertised.trim_end_matches('/').to_string(),
                (Some(_), None) => format!("https://127.0.0.1:{port}"),
            };
            (vec![url], token)
        }
        _ => (config.server_urls.clone(), config.token.clone()),
    };
    // `gantry start` trusts its own server's certificate (it may be self-signed).
    let server_ca_file = config.server_ca_file.clone().or_else(|| {
        (role == Role::Both)
            .then(|| config.tls_cert_file.clone())
            .flatten()
    });
    WorkerConfig {
        name: config.worker_name.clone(),
        server_urls,
        server_ca_file: server_ca_file.map(std::path::PathBuf::from),
        registration_token,
        data_dir,
        labels: config.labels.clone(),
        simulate_gpus: config.simulate_gpus,
        heartbeat_interval: config.heartbeat_interval,
        status_interval: Duration::from_secs(60).max(config.heartbeat_interval),
        api_host: if local {
            Ipv4Addr::LOCALHOST.to_string()
        } else {
            config.worker_host.clone()
        },
        api_port: if local { 0 } else { config.worker_port },
        // On loopback inside `gantry start`, the worker's API stays plain.
        api_tls: match (&config.tls_cert_file, &config.tls_key_file) {
            (Some(cert), Some(key)) if !local => Some(gantry_tls::TlsFiles {
                cert: std::path::PathBuf::from(cert),
                key: std::path::PathBuf::from(key),
            }),
            _ => None,
        },
        advertise_host,
        model_dirs: if config.model_dirs.is_empty() {
            let dir = config.data_dir.join(MODELS_DIR);
            // The default is made, so a newcomer has a place to put models.
            if let Err(e) = std::fs::create_dir_all(&dir) {
                tracing::warn!(dir = %dir.display(), error = %e, "cannot create the default model directory");
            }
            vec![dir]
        } else {
            config.model_dirs.clone()
        },
        supervisor,
    }
}

/// The default model directory, under the data directory.
const MODELS_DIR: &str = "models";

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
                worker_config(&config, role, server.as_ref().map(|s| s.addr.port()));
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
