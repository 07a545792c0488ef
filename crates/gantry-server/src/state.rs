//! State shared by every request handler and background task of one server.

use std::ops::Deref;
use std::sync::Arc;

use gantry_auth::Authenticator;
use gantry_store::Store;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::cluster::Cluster;
use crate::config::ServerConfig;

/// Cheap to clone; everything lives behind one `Arc`.
#[derive(Clone)]
pub struct AppState(Arc<Shared>);

/// What [`AppState`] holds.
pub struct Shared {
    pub store: Store,
    pub config: ServerConfig,
    /// Resolves credentials (and signs session tokens); shared with the gateway.
    pub authenticator: Arc<Authenticator>,
    /// Cancelled when the server shuts down; long-lived responses (watch streams) and
    /// background loops end on it.
    pub shutdown: CancellationToken,
    /// Cancelled when the server starts leaving the cluster, before `shutdown`: its
    /// registry heartbeat stops, `/readyz` answers 503 and every response closes its
    /// connection.
    pub draining: CancellationToken,
    /// Every task the server spawns, awaited at shutdown.
    pub tasks: TaskTracker,
    /// Calls the workers' own API (logs): one pooled client with a connect timeout.
    pub worker_http: reqwest::Client,
    /// Who leads, this server's mode and registry identity, its load.
    pub cluster: Arc<Cluster>,
    /// Files uploaded to deploy as models (`staging.rs`).
    pub staging: Arc<crate::staging::Staging>,
    /// Reads the headers of remote models: for the scheduler's analysis and for estimates
    /// asked through the API (see [`model_sources`]).
    pub sources: gantry_source::Sources,
    /// Instance changes routed to the assignment streams of the workers they concern.
    pub assignment_feeds: Arc<crate::feeds::AssignmentFeeds>,
    /// Failed logins per (username, address) and per address.
    pub logins: crate::login_limit::LoginLimiter,
    /// How busy each worker was over the last hour, from the heartbeats this server heard.
    pub histories: crate::history::WorkerHistories,
    /// The model catalog, read at start-up.
    pub catalog: gantry_types::ModelCatalog,
    /// Seals and opens model providers' API keys (a key derived from the server secret).
    pub provider_keys: Arc<gantry_auth::sealed::Sealer>,
    /// Seals and opens clusters' registration tokens.
    pub registration_tokens: Arc<gantry_auth::sealed::Sealer>,
    /// Seals and opens worker pools' credentials.
    pub pool_credentials: Arc<gantry_auth::sealed::Sealer>,
}

/// The client of model sources a server analyses models with: the configured hubs, and
/// uploads read from this cluster's own staging area.
pub fn model_sources(
    config: &ServerConfig,
    store: &Store,
    staging: &Arc<crate::staging::Staging>,
) -> gantry_source::Sources {
    let sources = gantry_source::Sources::new(config.sources.clone());
    sources.set_staged(Arc::new(crate::staging::ServerStaged {
        store: store.clone(),
        staging: Arc::clone(staging),
    }));
    sources
}

/// The client for the workers' own API.
pub fn worker_http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .connect_timeout(std::time::Duration::from_secs(5))
        .build()
        .expect("a reqwest client without TLS settings builds")
}

/// [`worker_http_client`] that also trusts the PEM certificates of `worker_ca_file` for
/// workers whose API serves HTTPS (besides the system's roots).
pub fn worker_http_client_trusting(ca_file: &std::path::Path) -> anyhow::Result<reqwest::Client> {
    use anyhow::Context;

    let pem = std::fs::read(ca_file)
        .with_context(|| format!("read worker_ca_file {}", ca_file.display()))?;
    let certificates = reqwest::Certificate::from_pem_bundle(&pem)
        .ok()
        .filter(|certificates| !certificates.is_empty())
        .with_context(|| {
            format!(
                "worker_ca_file {}: no usable PEM certificate (-----BEGIN CERTIFICATE-----)",
                ca_file.display()
            )
        })?;
    let mut builder = reqwest::Client::builder().connect_timeout(std::time::Duration::from_secs(5));
    for certificate in certificates {
        builder = builder.add_root_certificate(certificate);
    }
    builder
        .build()
        .context("build the client for the workers' API")
}

impl AppState {
    pub fn new(shared: Shared) -> Self {
        Self(Arc::new(shared))
    }
}

impl Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState")
            .field("server_id", &self.config.server_id)
            .finish_non_exhaustive()
    }
}
