//! The gantry server: the management API (`api/`, thin handlers over the operations of
//! `service/`), the authentication extractors, the web console, and the leader's control
//! loops (`controllers/`: replica counts, rescheduling, rolls, placement); it hosts the
//! OpenAI-compatible gateway (`gantry-gateway`) on the same port.
//!
//! Architecture invariant: this crate never spawns backend processes (that is the
//! worker's job) and contains no SQL (that is `gantry-store`'s).

pub mod api;
pub mod auth;
pub mod bootstrap;
pub mod config;
pub mod controllers;
pub mod error;
pub mod extract;
pub mod service;
pub mod state;
pub mod ui;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use axum::serve::ListenerExt;
use gantry_auth::jwt::JwtKeys;
use gantry_auth::{AuthConfig, Authenticator};
use gantry_gateway::{Gateway, GatewayConfig, GatewayContext};
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

impl RunningServer {
    /// Stops accepting requests, ends watch streams and background tasks, and waits
    /// for them.
    pub async fn shutdown(self) {
        self.state.shutdown.cancel();
        self.state.tasks.close();
        self.state.tasks.wait().await;
        self.state.store.close().await;
    }
}

/// Opens the store, bootstraps first-start state and starts serving. Returns once the
/// listener is bound.
pub async fn start(config: ServerConfig) -> anyhow::Result<RunningServer> {
    bootstrap::ensure_data_dir(&config.data_dir)?;
    let jwt_secret = bootstrap::jwt_secret(&config)?;
    let url = config.effective_database_url();
    let store = Store::open(&StoreConfig {
        url: url.clone(),
        max_connections: 16,
    })
    .await
    .with_context(|| format!("open the database at {}", gantry_store::redact_url(&url)))?;
    bootstrap::ensure_admin(&store, &config).await?;
    let registration_token_file =
        bootstrap::ensure_registration_token(&store, &config.data_dir).await?;

    let bind = format!("{}:{}", config.host, config.port);
    let listener = TcpListener::bind(&bind)
        .await
        .with_context(|| format!("listen on {bind}; is another process using the port?"))?;
    let addr = listener.local_addr().context("read the bound address")?;

    let authenticator = Arc::new(Authenticator::new(
        store.clone(),
        JwtKeys::new(&jwt_secret, config.session_ttl),
        AuthConfig::default(),
    ));
    let state = AppState::new(Shared {
        store,
        config,
        authenticator,
        shutdown: CancellationToken::new(),
        tasks: TaskTracker::new(),
        worker_http: state::worker_http_client(),
    });
    state.authenticator.spawn(&state.shutdown, &state.tasks);
    controllers::worker_health::spawn(&state);
    // One server: always the leader. The PostgreSQL coordinator replaces this for
    // several servers sharing a database.
    if state.config.is_multi_server() {
        tracing::warn!(
            "this server schedules alone: until the high-availability work lands, every \
             server sharing this PostgreSQL database acts as the scheduling leader \
             (scheduling_mode, distributed_scheduling, lock_timeout and \
             schedule_lock_timeout are not used yet)"
        );
    }
    let coordinator: std::sync::Arc<dyn gantry_coord::Coordinator> = std::sync::Arc::new(
        gantry_coord::LocalCoordinator::new(state.config.server_id.clone()),
    );
    controllers::spawn(&state, coordinator);

    let gateway = gantry_gateway::start(
        GatewayConfig {
            max_request_body: state.config.gateway_max_request_body,
            usage_flush_interval: state.config.usage_flush_interval,
        },
        GatewayContext {
            store: state.store.clone(),
            authenticator: Arc::clone(&state.authenticator),
            shutdown: state.shutdown.clone(),
            tasks: state.tasks.clone(),
        },
    )
    .await
    .context("load the gateway's routing table")?;
    let app = api::router(state.clone()).merge(gantry_gateway::router(&gateway));
    let shutdown = state.shutdown.clone();
    // Small writes (gateway SSE chunks, watch-stream lines) must leave at once: with
    // Nagle's algorithm on, each waits for the client's delayed ACK (about 40 ms).
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "could not set TCP_NODELAY on an accepted connection");
        }
    });
    state.tasks.spawn(async move {
        let serve = axum::serve(listener, app).with_graceful_shutdown(shutdown.cancelled_owned());
        if let Err(e) = serve.await {
            tracing::error!(error = %e, "HTTP server stopped with an error");
        }
    });
    tracing::info!(
        server_id = %state.config.server_id,
        %addr,
        database = %gantry_store::redact_url(&url),
        "server listening"
    );
    Ok(RunningServer {
        addr,
        state,
        registration_token_file,
        gateway,
    })
}
