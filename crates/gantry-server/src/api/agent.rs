//! Endpoints the worker agent calls: registration, heartbeat, hardware status, the
//! instances placed on it (optionally as a watch stream), state reports and its
//! goodbye. Everything but registration is scoped to the calling worker by its
//! credential: a worker can neither read nor touch another worker's instances.

use std::collections::BTreeSet;

use axum::extract::State;
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use gantry_store::{Change, ChangeKind};
use gantry_types::{
    FieldError, InstanceStateReport, ModelInstance, Validate, Worker, WorkerRegister,
    WorkerRegistered, WorkerStatus,
};
use serde::Deserialize;
use utoipa::IntoParams;

use super::watch;
use crate::auth::principal::credential_of;
use crate::auth::{Auth, Principal};
use crate::error::{ApiError, ApiResult};
use crate::extract::{ApiJson, ApiPath, ApiQuery, OptionalApiJson};
use crate::service;
use crate::state::AppState;

/// The calling worker: 403 for anyone else.
fn calling_worker(principal: &Principal) -> ApiResult<(i64, &str)> {
    match principal {
        Principal::Worker {
            worker_id,
            worker_name,
        } => Ok((*worker_id, worker_name.as_str())),
        Principal::User { .. } | Principal::Server { .. } => Err(ApiError::forbidden(
            "this endpoint is for worker agents (worker credential required)",
        )),
    }
}

/// Registers a worker (with the registration token) or refreshes an existing
/// registration (with the worker's credential; idempotent).
#[utoipa::path(post, path = "/api/v1/workers/register", tag = "worker-agent", security(("bearer" = [])),
    request_body = WorkerRegister,
    responses((status = 201, body = WorkerRegistered), (status = 200, body = WorkerRegistered),
        (status = 401, body = gantry_types::ErrorBody), (status = 409, body = gantry_types::ErrorBody)))]
pub async fn register(
    State(state): State<AppState>,
    RegistrationCredential(token): RegistrationCredential,
    ApiJson(request): ApiJson<WorkerRegister>,
) -> ApiResult<Response> {
    let registration = service::workers::register(&state.store, &token, &request).await?;
    let worker = &registration.registered.worker;
    if registration.created {
        tracing::info!(worker_id = worker.id, worker = %worker.name, address = %worker.address, gpus = worker.status.gpus.len(), "worker registered");
        Ok((StatusCode::CREATED, Json(registration.registered)).into_response())
    } else {
        tracing::info!(worker_id = worker.id, worker = %worker.name, address = %worker.address, gpus = worker.status.gpus.len(), "worker registered again");
        Ok(Json(registration.registered).into_response())
    }
}

/// Records a heartbeat of the calling worker, with how busy it is when the body carries a
/// sample (kept an hour in this server's memory: `GET /api/v1/workers/{id}/history`).
#[utoipa::path(post, path = "/api/v1/worker/heartbeat", tag = "worker-agent", security(("bearer" = [])),
    request_body(content = Option<gantry_types::WorkerHeartbeat>, description = "Optional."),
    responses((status = 200, body = Worker, headers(("x-gantry-sample-interval" = u64,
            description = "Seconds to let pass before the next sample: the server keeps no more."))),
        (status = 403, body = gantry_types::ErrorBody), (status = 422, body = gantry_types::ErrorBody)))]
pub async fn heartbeat(
    State(state): State<AppState>,
    Auth(principal): Auth,
    OptionalApiJson(body): OptionalApiJson<gantry_types::WorkerHeartbeat>,
) -> ApiResult<Response> {
    let (worker_id, _) = calling_worker(&principal)?;
    state.cluster.worker_seen(worker_id);
    let (worker, before) = service::workers::heartbeat(&state.store, worker_id).await?;
    if let Some(sample) = body.and_then(|body| body.sample) {
        state
            .histories
            .record(worker_id, sample, gantry_types::Timestamp::now());
    }
    if before != worker.state {
        tracing::info!(worker_id, worker = %worker.name, from = before.as_str(), to = worker.state.as_str(), "worker state changed on heartbeat");
    }
    // How often this server wants samples: no more often than it keeps them.
    let every = state.histories.spacing().as_secs().to_string();
    Ok((
        [(gantry_types::worker::SAMPLE_INTERVAL_HEADER, every)],
        Json(worker),
    )
        .into_response())
}

/// The active servers a worker may call, lowest load score first: a worker keeps its list
/// of servers fresh from this and (re)connects to the least loaded. Read at most every
/// [`crate::cluster::DIRECTORY_FRESH_FOR`] per server.
#[utoipa::path(get, path = "/api/v1/worker/servers", tag = "worker-agent", security(("bearer" = [])),
    responses((status = 200, body = gantry_types::ServerDirectory), (status = 401, body = gantry_types::ErrorBody)))]
pub async fn servers(
    State(state): State<AppState>,
    Auth(principal): Auth,
) -> ApiResult<Json<gantry_types::ServerDirectory>> {
    calling_worker(&principal)?;
    if let Some(servers) = state.cluster.fresh_directory() {
        return Ok(Json(gantry_types::ServerDirectory { servers }));
    }
    let mut servers: Vec<gantry_types::ServerInfo> = super::coordinator::servers_of(&state)
        .await?
        .into_iter()
        .filter(|s| s.active)
        .collect();
    servers.sort_by(|a, b| {
        a.load_score
            .total_cmp(&b.load_score)
            .then_with(|| a.server_id.cmp(&b.server_id))
    });
    state.cluster.keep_directory(&servers);
    Ok(Json(gantry_types::ServerDirectory { servers }))
}

/// Stores the calling worker's hardware report.
#[utoipa::path(put, path = "/api/v1/worker/status", tag = "worker-agent", security(("bearer" = [])),
    request_body = WorkerStatus, responses((status = 200, body = Worker)))]
pub async fn status(
    State(state): State<AppState>,
    WorkerAuth(principal): WorkerAuth,
    ApiJson(status): ApiJson<WorkerStatus>,
) -> ApiResult<Json<Worker>> {
    let (worker_id, _) = calling_worker(&principal)?;
    Ok(Json(
        service::workers::report_status(&state.store, worker_id, &status).await?,
    ))
}

/// Query of the assignment list.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct AssignmentQuery {
    /// Stream changes as NDJSON.
    pub watch: Option<bool>,
    /// With `watch=true`: end the stream after this many seconds (1 to 86400).
    #[param(minimum = 1, maximum = 86400)]
    pub timeout_seconds: Option<u32>,
}

impl Validate for AssignmentQuery {
    fn validate(&self) -> Result<(), FieldError> {
        gantry_types::query::check_stream_timeout(self.timeout_seconds)
    }
}

/// The instances placed on the calling worker, each with its placement record (what to
/// run). With `watch=true`: a stream that also sends `DELETED` when an instance is
/// removed or moved to another worker. A watch that asks for `Connection: upgrade` and
/// `Upgrade: gantry-watch` is answered `101 Switching Protocols` and gets the same lines
/// on the bare connection, which then costs the server only its socket (the worker
/// agent asks for it).
#[utoipa::path(get, path = "/api/v1/worker/assignments", tag = "worker-agent", security(("bearer" = [])),
    params(AssignmentQuery), responses((status = 200, body = [ModelInstance]),
        (status = 101, description = "With watch=true, Connection: upgrade and Upgrade: gantry-watch: the NDJSON watch events follow on the bare connection until it closes")))]
pub async fn assignments(
    State(state): State<AppState>,
    Auth(principal): Auth,
    ApiQuery(query): ApiQuery<AssignmentQuery>,
    watch::WatchUpgrade(upgrade): watch::WatchUpgrade,
) -> ApiResult<Response> {
    let (worker_id, _) = calling_worker(&principal)?;
    if query.watch != Some(true) {
        return Ok(Json(state.store.worker_assignments(worker_id).await?).into_response());
    }
    // Subscribed before the list is read, so no change between the two is lost.
    let feed = state.assignment_feeds.subscribe(worker_id);
    let initial = state.store.worker_assignments(worker_id).await?;
    // Instances sent on this stream: lets it say DELETED when one moves away.
    let mut sent: BTreeSet<i64> = initial.iter().map(|instance| instance.id).collect();
    feed.settle(sent.iter().copied());
    Ok(watch::respond(
        &state,
        watch::Changes::Routed(feed),
        initial,
        query
            .timeout_seconds
            .map(|s| std::time::Duration::from_secs(u64::from(s))),
        move |change| {
            let Change::Instance(kind, instance) = change else {
                return None;
            };
            let here = instance.worker_id == Some(worker_id) && *kind != ChangeKind::Deleted;
            if here {
                let kind = if sent.insert(instance.id) {
                    ChangeKind::Created
                } else {
                    ChangeKind::Updated
                };
                Some((kind, instance.clone()))
            } else if sent.remove(&instance.id) {
                Some((ChangeKind::Deleted, instance.clone()))
            } else {
                None
            }
        },
        upgrade,
    ))
}

/// The calling worker reports an instance's state.
#[utoipa::path(post, path = "/api/v1/worker/instances/{id}/state", tag = "worker-agent", security(("bearer" = [])),
    params(("id" = i64, Path, description = "instance id")), request_body = InstanceStateReport,
    responses((status = 200, body = ModelInstance), (status = 404, body = gantry_types::ErrorBody)))]
pub async fn report_state(
    State(state): State<AppState>,
    WorkerAuth(principal): WorkerAuth,
    ApiPath(id): ApiPath<i64>,
    ApiJson(report): ApiJson<InstanceStateReport>,
) -> ApiResult<Json<ModelInstance>> {
    let (worker_id, worker_name) = calling_worker(&principal)?;
    let instance = service::workers::report_state(&state.store, worker_id, id, &report).await?;
    tracing::info!(instance_id = id, instance = %instance.name, worker = %worker_name, state = instance.state.as_str(), address = ?instance.address, "instance state reported");
    Ok(Json(instance))
}

/// The calling worker is shutting down: it is marked `not_ready` until it returns.
#[utoipa::path(post, path = "/api/v1/worker/goodbye", tag = "worker-agent", security(("bearer" = [])),
    responses((status = 204)))]
pub async fn goodbye(
    State(state): State<AppState>,
    Auth(principal): Auth,
) -> ApiResult<StatusCode> {
    let (worker_id, worker_name) = calling_worker(&principal)?;
    service::workers::goodbye(&state.store, worker_id).await?;
    tracing::info!(worker_id, worker = %worker_name, "worker said goodbye");
    Ok(StatusCode::NO_CONTENT)
}

/// The registration token or worker credential a registration carries: 401 when there
/// is none, before the body is read.
pub struct RegistrationCredential(String);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for RegistrationCredential {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        credential_of(parts).map(Self).ok_or_else(|| {
            ApiError::unauthorized(
                "send the registration token (or this worker's credential) as Authorization: Bearer",
            )
        })
    }
}

/// The caller when it is a worker agent: refused with 403 before the body is read.
pub struct WorkerAuth(Principal);

impl axum::extract::FromRequestParts<AppState> for WorkerAuth {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let Auth(principal) = Auth::from_request_parts(parts, state).await?;
        calling_worker(&principal)?;
        Ok(Self(principal))
    }
}
