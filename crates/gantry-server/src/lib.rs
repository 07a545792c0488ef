//! The gantry server: the management API (`api/`, thin handlers over the operations of
//! `service/`), the authentication extractors, the web console, and the leader's control
//! loops (`controllers/`: replica counts, rescheduling, rolls, placement). The port itself
//! belongs to the OpenAI-compatible gateway (`gantry_gateway::serve`), which answers its
//! own routes and hands every other request to this crate's router.
//!
//! Architecture invariant: this crate never spawns backend processes (that is the
//! worker's job) and contains no SQL (that is `gantry-store`'s).

pub mod api;
pub mod auth;
pub mod bootstrap;
pub mod catalog;
pub mod cluster;
pub mod config;
pub mod controllers;
pub mod error;
pub mod extract;
pub mod feeds;
pub mod history;
pub mod login_limit;
pub mod service;
pub mod staging;
pub mod state;
pub mod ui;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use gantry_auth::jwt::JwtKeys;
use gantry_auth::{AuthConfig, Authenticator};
use gantry_gateway::{EjectionPolicy, Gateway, GatewayConfig, GatewayContext, ServeConfig};
use gantry_store::{Store, StoreConfig};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use config::ServerConfig;
pub use state::AppState;

use crate::state::Shared;

/// A server that is up and serving.
#[derive(Debug)]
pub struct RunningServer {
    /// The address it listens on (the real port when 0 was asked for).
    pub addr: SocketAddr,
    pub state: AppState,
    /// Where the worker registration token was written, when this server made it.
    pub registration_token_file: Option<PathBuf>,
    /// The OpenAI-compatible gateway (routing table, counters).
    pub gateway: Gateway,
}

/// How long a server that shuts down keeps serving while it tells clients to go
/// elsewhere (`/readyz` answers 503 and every response closes its connection), so no
/// client is left holding an idle connection to it when it stops accepting: a request
/// sent on such a connection just as the server closes it fails on the client's side
/// without having been read, even when the server is restarted at once.
pub const DRAIN_NOTICE: std::time::Duration = std::time::Duration::from_secs(1);

impl RunningServer {
    /// Leaves the cluster cleanly: stops heartbeats and unregisters (workers move
    /// elsewhere), gives up the leader lease and its locks (a standby takes over at once),
    /// tells clients to move for [`DRAIN_NOTICE`], then stops accepting and waits for the requests in flight — at most
    /// `shutdown_grace` — and for every background task.
    pub async fn shutdown(self) {
        let state = &self.state;
        state.draining.cancel();
        tracing::info!(server_id = %state.config.server_id, "shutting down: leaving the cluster");
        cluster::registry::unregister(state).await;
        state.cluster.coordinator.step_down().await;
        match state.store.release_locks_of(&state.config.server_id).await {
            Ok(0) => {}
            Ok(n) => {
                tracing::info!(server_id = %state.config.server_id, locks = n, "released this server's locks")
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not release this server's locks; they lapse on their own")
            }
        }
        tracing::info!(notice = ?DRAIN_NOTICE, "shutting down: telling clients to move to another server (or to reconnect) before this one stops accepting");
        tokio::time::sleep(DRAIN_NOTICE).await;
        state.shutdown.cancel();
        state.tasks.close();
        let wait = async {
            // Say what the exit waits for while it waits, so a slow stop explains itself.
            let mut every = tokio::time::interval(std::time::Duration::from_secs(5));
            every.tick().await;
            let wait = state.tasks.wait();
            tokio::pin!(wait);
            loop {
                tokio::select! {
                    () = &mut wait => break,
                    _ = every.tick() => tracing::info!(
                        in_flight = self.gateway.in_flight(),
                        tasks = state.tasks.len(),
                        "shutting down: still waiting for requests in flight and background tasks"
                    ),
                }
            }
        };
        if tokio::time::timeout(state.config.shutdown_grace, wait)
            .await
            .is_err()
        {
            tracing::warn!(grace = ?state.config.shutdown_grace, in_flight = self.gateway.in_flight(),
                tasks = state.tasks.len(),
                "requests still in flight after the shutdown grace; stopping anyway");
        }
        tracing::info!("shutting down: closing the database connections");
        state.store.close().await;
    }
}

/// Opens the store, bootstraps first-start state and starts serving. Returns once the
/// listener is bound.
pub async fn start(config: ServerConfig) -> anyhow::Result<RunningServer> {
    bootstrap::ensure_data_dir(&config.data_dir)?;
    let catalog = catalog::load(config.model_catalog_file.as_deref())?;
    let jwt_secret = bootstrap::jwt_secret(&config)?;
    let url = config.effective_database_url();
    let store = Store::open(&StoreConfig {
        url: url.clone(),
        max_connections: 16,
    })
    .await
    .with_context(|| format!("open the database at {}", gantry_store::redact_url(&url)))?;
    bootstrap::ensure_admin(&store, &config).await?;
    let registration_tokens = Arc::new(gantry_auth::sealed::Sealer::registration_tokens(
        &jwt_secret,
    ));
    let registration_token_file =
        bootstrap::ensure_registration_token(&store, &config.data_dir, &registration_tokens)
            .await?;

    let mode = config.effective_scheduling_mode();
    if mode == config::SchedulingMode::Distributed && !config.is_multi_server() {
        anyhow::bail!(
            "scheduling_mode distributed needs database_url to be a PostgreSQL URL; set \
             database_url or use scheduling_mode auto"
        );
    }
    let tls = config.tls.as_ref().map(gantry_tls::acceptor).transpose()?;
    let bind = format!("{}:{}", config.host, config.port);
    let listener = TcpListener::bind(&bind)
        .await
        .with_context(|| format!("listen on {bind}; is another process using the port?"))?;
    let addr = listener.local_addr().context("read the bound address")?;

    let authenticator = Arc::new(Authenticator::new(
        store.clone(),
        JwtKeys::new(&jwt_secret, config.session_ttl),
        AuthConfig {
            api_keys: gantry_auth::cache::CacheConfig::fresh_for(config.api_key_cache_ttl),
            ..AuthConfig::default()
        },
    ));
    bootstrap::write_server_credential(authenticator.jwt(), &config)?;
    let shutdown = CancellationToken::new();
    let tasks = TaskTracker::new();
    let coordinator: Arc<dyn gantry_coord::Coordinator> = match mode {
        config::SchedulingMode::Distributed => {
            let lease =
                gantry_coord::LeaseConfig::new(config.lease_ttl, config.lease_renew_interval);
            lease.validate().map_err(anyhow::Error::msg)?;
            gantry_coord::LeaseCoordinator::start(
                config.server_id.clone(),
                store.clone(),
                lease,
                &shutdown,
                &tasks,
            )
            .await
            .context("open the leader session on PostgreSQL")?
        }
        _ => Arc::new(gantry_coord::LocalCoordinator::new(
            config.server_id.clone(),
        )),
    };
    let cluster = Arc::new(cluster::Cluster::new(
        mode,
        coordinator,
        config.distributed_scheduling,
        config.advertised_url(addr),
    ));
    if let Err(e) = cluster::registry::register(&store, &cluster, config.server_timeout).await {
        shutdown.cancel();
        tasks.close();
        tasks.wait().await;
        return Err(e);
    }
    let staging = Arc::new(staging::Staging::new(
        config.data_dir.join("uploads"),
        config.server_id.clone(),
        addr,
        &jwt_secret,
        config.sources.s3.clone(),
        config.upload_bucket.clone(),
        config.upload_max_size,
    ));
    let sources = state::model_sources(&config, &store, &staging);
    let assignment_feeds = feeds::AssignmentFeeds::attach(&store);
    let worker_http = match &config.worker_ca_file {
        None => state::worker_http_client(),
        Some(ca_file) => state::worker_http_client_trusting(ca_file)?,
    };
    let state = AppState::new(Shared {
        store,
        config,
        authenticator,
        shutdown,
        draining: CancellationToken::new(),
        tasks,
        worker_http,
        cluster,
        staging,
        sources,
        assignment_feeds,
        logins: login_limit::LoginLimiter::default(),
        histories: history::WorkerHistories::default(),
        catalog,
        provider_keys: Arc::new(gantry_auth::sealed::Sealer::provider_keys(&jwt_secret)),
        registration_tokens,
        pool_credentials: Arc::new(service::pools::credentials_sealer(&jwt_secret)),
    });
    state.authenticator.spawn(&state.shutdown, &state.tasks);
    controllers::worker_health::spawn(&state);
    controllers::usage_archive::spawn(&state);
    controllers::pools::spawn(&state);
    controllers::spawn(&state);
    cluster::registry::spawn_heartbeat(&state);

    let gateway = gantry_gateway::start(
        GatewayConfig {
            max_request_body: state.config.gateway_max_request_body,
            usage_flush_interval: state.config.usage_flush_interval,
            ejection: EjectionPolicy {
                eject_after: state.config.gateway_eject_after,
                cooldown: state.config.gateway_eject_cooldown,
            },
            first_byte_timeout: state.config.gateway_first_byte_timeout,
        },
        GatewayContext {
            store: Arc::new(state.store.clone()),
            authenticator: Arc::clone(&state.authenticator),
            shutdown: state.shutdown.clone(),
            tasks: state.tasks.clone(),
            server_id: state.config.server_id.clone(),
            provider_keys: Arc::clone(&state.provider_keys),
        },
    )
    .await
    .context("load the gateway's routing table")?;
    let in_flight = gateway.clone();
    state
        .cluster
        .set_inflight_source(move || u64::try_from(in_flight.in_flight()).unwrap_or(0));
    let tls_on = tls.is_some();
    state.tasks.spawn(gantry_gateway::serve(
        listener,
        gateway.clone(),
        ServeConfig {
            fallback: api::router(state.clone()),
            tls,
            draining: state.draining.clone(),
            shutdown: state.shutdown.clone(),
            tasks: state.tasks.clone(),
        },
    ));
    tracing::info!(
        server_id = %state.config.server_id,
        %addr,
        url = %state.cluster.url,
        database = %gantry_store::redact_url(&url),
        scheduling_mode = state.cluster.mode_name(),
        tls = tls_on,
        "server listening"
    );
    Ok(RunningServer {
        addr,
        state,
        registration_token_file,
        gateway,
    })
}
