//! The OpenAI-compatible gateway, the data plane, and the server's port it stands in
//! front of: `POST /v1/chat/completions`, `/v1/completions`, `/v1/embeddings` (the hot
//! routes, served by the gateway's own HTTP/1.1), `GET /v1/models` and the Prometheus
//! `/metrics`. The hosting server (`gantry-server`) calls [`start`] for a [`Gateway`]
//! and then [`serve`] with its listener and a fallback router (the management API and
//! the console), which answers every request that is not the gateway's.
//!
//! The gateway knows nothing of the server: it is given a [`GatewayConfig`], the store
//! (as a [`GatewayStore`]: what the gateway reads and writes in it), the shared
//! authenticator (`gantry-auth`), and the server's cancellation token and task tracker,
//! which own every task it spawns. Its request path writes nothing to the database:
//! usage is summed in memory and flushed by a task, and API-key last-used times are
//! batched by the authenticator.
//!
//! - `listener.rs`: the accept loop, TLS, and the hand-over from the front to hyper
//!   and the routers; `core_loops.rs`: a connection loop per CPU for plain TCP;
//! - `front.rs`: the hot routes served straight off the connection; `h1.rs`: HTTP/1.1
//!   heads and bodies parsed in place;
//! - `store.rs`: [`GatewayStore`], the part of the store the gateway uses, implemented by
//!   `gantry_store::Store`; `testing.rs` (feature `testing`): `MemoryStore`, the
//!   in-memory double the gateway's tests run on;
//! - `routing/`: model name → running instances (`backend.rs` one instance, `table.rs`
//!   the table and the pick, `tracker.rs` kept current from the store's change feed and
//!   a periodic re-read);
//! - `model_routes.rs`: route name → weighted, prioritised targets (deployed models,
//!   providers' models), rebuilt when a provider or route changes;
//! - `providers.rs`: an external OpenAI-compatible endpoint as a backend (TLS, base
//!   path, its key in a sensitive header), and asking one for its models;
//! - `limits.rs`: per-key allowed routes, requests and tokens per minute, shared across
//!   the cluster's servers through the store;
//! - `balance.rs`: the least-requests-in-flight pick, ties round-robin;
//! - `eject.rs`: passive ejection of an instance that keeps failing requests;
//! - `proxy/`: one request, phase by phase: authenticate (`auth.rs`), admit, resolve and
//!   rewrite the body (`admit.rs`), the tries and what each outcome means
//!   (`attempts.rs`), the answer (`mod.rs`);
//! - `upstream.rs`: keep-alive HTTP/1.1 connections to instances, pooled per instance
//!   and driven by the request's own task;
//! - `body.rs`: the response body on its way out: usage read as it passes, the
//!   usage-only SSE chunk removed when the gateway asked for it, accounting on drop;
//! - `shard.rs`: per-thread copies of what every request would otherwise write to
//!   shared memory;
//! - `usage.rs`: usage summed in memory and flushed to the store every second;
//! - `metrics.rs`: counters and the text exposition;
//! - `openapi.rs`: the OpenAPI description of the gateway's endpoints;
//! - `error.rs`: the OpenAI error shape.
//!
//! Architecture invariant: the crate's public face is what the server uses — [`start`],
//! [`serve`], their configuration, [`GatewayStore`], [`providers`] (asking a provider for
//! its models) and [`openapi`]; everything else is `pub(crate)` (but `testing`, for
//! tests only).

mod answer_name;
mod balance;
mod body;
mod core_loops;
mod eject;
mod error;
mod front;
mod h1;
mod limits;
mod listener;
mod metrics;
mod model_routes;
pub mod openapi;
pub mod providers;
mod proxy;
mod routing;
mod shard;
mod store;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
mod upstream;
mod usage;

pub use eject::{EjectionPolicy, DEFAULT_EJECT_AFTER, DEFAULT_EJECT_COOLDOWN};
pub use listener::{serve, ServeConfig};
pub use store::{GatewayStore, StoreFuture};
pub use usage::FLUSH_INTERVAL as USAGE_FLUSH_INTERVAL;

use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use axum::{Json, Router};
use gantry_auth::sealed::Sealer;
use gantry_auth::Authenticator;
use gantry_store::StoreError;
use serde::Serialize;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use utoipa::ToSchema;

use self::error::OpenAiError;
use self::limits::KeyLimiter;
use self::metrics::{ClusterCounts, Metrics};
use self::model_routes::RouteTable;
use self::routing::RoutingTable;
use self::usage::UsageAggregator;

/// How the gateway serves.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    /// Largest request body accepted on `/v1/*`: prompts and embedding inputs are far
    /// larger than management requests.
    pub max_request_body: usize,
    /// How often the usage summed in memory is written to the store (default
    /// [`usage::FLUSH_INTERVAL`]).
    pub usage_flush_interval: Duration,
    /// When an instance that keeps failing is taken out of routing, and for how long
    /// (`gateway_eject_after`, `gateway_eject_cooldown`).
    pub ejection: EjectionPolicy,
    /// How long a try may wait for an instance's response head before it counts as a
    /// failure and the request goes to another instance (`gateway_first_byte_timeout`).
    /// `None` (the default): no limit, since a long prompt takes long to answer.
    pub first_byte_timeout: Option<Duration>,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        Self {
            max_request_body: 32 * 1024 * 1024,
            usage_flush_interval: usage::FLUSH_INTERVAL,
            ejection: EjectionPolicy::default(),
            first_byte_timeout: None,
        }
    }
}

/// What the hosting server lends the gateway.
#[derive(Debug, Clone)]
pub struct GatewayContext {
    /// What the gateway reads and writes: the server's `gantry_store::Store`, or a test
    /// double.
    pub store: Arc<dyn GatewayStore>,
    /// Resolves callers; shared with the management API, so both see one cache.
    pub authenticator: Arc<Authenticator>,
    /// Cancelled at shutdown; the gateway's tasks end on it (usage is flushed once
    /// more first).
    pub shutdown: CancellationToken,
    /// Owns every task the gateway spawns; the server awaits it at shutdown.
    pub tasks: TaskTracker,
    /// This server's id in the cluster: its share of each limited key's counts is
    /// stored under it.
    pub server_id: String,
    /// Opens the providers' API keys.
    pub provider_keys: Arc<Sealer>,
}

/// The gateway of one server. Cheap to clone.
#[derive(Clone)]
pub struct Gateway(Arc<GatewayInner>);

/// What [`Gateway`] holds.
pub struct GatewayInner {
    pub(crate) config: GatewayConfig,
    pub(crate) store: Arc<dyn GatewayStore>,
    pub(crate) authenticator: Arc<Authenticator>,
    pub(crate) routes: Arc<RoutingTable>,
    /// Defined model routes and the providers they use.
    pub(crate) model_routes: Arc<RouteTable>,
    pub(crate) limiter: Arc<KeyLimiter>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) usage: Arc<UsageAggregator>,
}

impl Deref for Gateway {
    type Target = GatewayInner;

    fn deref(&self) -> &GatewayInner {
        &self.0
    }
}

impl Gateway {
    /// Requests under way through this server's gateway (what a draining server waits
    /// for, and what the server registry reports).
    pub fn in_flight(&self) -> i64 {
        self.metrics.in_flight()
    }
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field("in_flight", &self.metrics.in_flight())
            .finish_non_exhaustive()
    }
}

/// Loads the routing table from the store and starts the tasks that keep it current
/// and flush usage; both are owned by `context.tasks`.
pub async fn start(config: GatewayConfig, context: GatewayContext) -> Result<Gateway, StoreError> {
    let routes = Arc::new(RoutingTable::default());
    routing::start(&context, Arc::clone(&routes)).await?;
    let metrics = Arc::new(Metrics::default());
    let model_routes = Arc::new(RouteTable::new(
        Arc::clone(&context.provider_keys),
        Arc::clone(&metrics),
    ));
    model_routes::start(&context, Arc::clone(&model_routes)).await?;
    let limiter = Arc::new(KeyLimiter::default());
    limits::start(&context, Arc::clone(&limiter)).await?;
    let usage = Arc::new(UsageAggregator::default());
    usage::spawn_flusher(&context, Arc::clone(&usage), config.usage_flush_interval);
    Ok(Gateway(Arc::new(GatewayInner {
        config,
        store: context.store,
        authenticator: context.authenticator,
        routes,
        model_routes,
        limiter,
        metrics,
        usage,
    })))
}

/// The gateway's routes that go through the router: the hot routes never reach it
/// (`listener.rs` sends them to the front or the proxy first), so their paths here
/// answer only methods other than POST, with 405.
pub(crate) fn router(gateway: &Gateway) -> Router {
    Router::new()
        .route("/v1/models", get(list_models))
        .route("/v1/chat/completions", any(post_only))
        .route("/v1/completions", any(post_only))
        .route("/v1/embeddings", any(post_only))
        .route("/v1/{*rest}", any(unknown_endpoint))
        .route("/metrics", get(prometheus_metrics))
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(gateway.clone())
}

/// One entry of `GET /v1/models`.
#[derive(Debug, Serialize, ToSchema)]
pub struct OpenAiModel {
    pub id: String,
    /// Always `model`.
    pub object: &'static str,
    /// Unix seconds.
    pub created: i64,
    /// Always `gantry`.
    pub owned_by: &'static str,
}

/// `GET /v1/models`.
#[derive(Debug, Serialize, ToSchema)]
pub struct OpenAiModelList {
    /// Always `list`.
    pub object: &'static str,
    pub data: Vec<OpenAiModel>,
}

/// The model routes, and the deployed models with at least one running instance that
/// no route of the same name replaces (OpenAI's list shape); for a key held to some
/// routes, only those.
#[utoipa::path(get, path = "/v1/models", tag = "gateway", security(("bearer" = [])),
    responses((status = 200, body = OpenAiModelList), (status = 401, body = error::OpenAiErrorBody)))]
pub async fn list_models(State(gateway): State<Gateway>, headers: HeaderMap) -> Response {
    let caller = match proxy::authenticate(&gateway, &headers).await {
        Ok(caller) => caller,
        Err(e) => return e.into_response(),
    };
    let defined = gateway.model_routes.all();
    let deployed = gateway.routes.all();
    let mut data: Vec<OpenAiModel> = deployed
        .iter()
        .filter(|route| !defined.iter().any(|d| d.name == route.name))
        .map(|route| (&route.name, route.created))
        .chain(defined.iter().map(|route| (&route.name, route.created)))
        // A key held to some routes sees only those.
        .filter(|(name, _)| gateway.limiter.allows(caller.api_key_id, name))
        .map(|(name, created)| OpenAiModel {
            id: name.to_string(),
            object: "model",
            created,
            owned_by: "gantry",
        })
        .collect();
    data.sort_by(|a, b| a.id.cmp(&b.id));
    Json(OpenAiModelList {
        object: "list",
        data,
    })
    .into_response()
}

async fn unknown_endpoint(request: Request) -> OpenAiError {
    OpenAiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        "unknown_url",
        format!(
            "the gateway has no endpoint {} {}; it serves /v1/models, /v1/chat/completions, /v1/completions and /v1/embeddings",
            request.method(),
            request.uri().path()
        ),
    )
}

async fn method_not_allowed(request: Request) -> OpenAiError {
    OpenAiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "invalid_request_error",
        "method_not_allowed",
        format!(
            "{} is not allowed on {}",
            request.method(),
            request.uri().path()
        ),
    )
}

/// Another method than POST on a hot route's path: 405, with the `Allow` header RFC 9110
/// asks for.
async fn post_only(request: Request) -> Response {
    let mut response = method_not_allowed(request).await.into_response();
    response
        .headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static("POST"));
    response
}

/// Prometheus metrics of the gateway and the cluster (text format, no
/// authentication).
#[utoipa::path(get, path = "/metrics", tag = "gateway",
    responses((status = 200, content_type = "text/plain", body = String)))]
pub async fn prometheus_metrics(State(gateway): State<Gateway>) -> Response {
    let store = &gateway.store;
    let (instances, workers) = tokio::join!(
        store.count_instances_by_state(),
        store.count_workers_by_state()
    );
    let cluster = ClusterCounts {
        instances: instances
            .map_err(|e| tracing::error!(error = %e, "count instances for /metrics"))
            .ok(),
        workers: workers
            .map_err(|e| tracing::error!(error = %e, "count workers for /metrics"))
            .ok(),
        undecodable_placement_records: gantry_store::undecodable_placement_records(),
        fenced_writes: Some(gantry_store::fenced_writes()),
    };
    let text = metrics::render(
        &gateway.metrics,
        &gateway.routes,
        gateway.usage.dropped(),
        &cluster,
    );
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        )],
        text,
    )
        .into_response()
}
