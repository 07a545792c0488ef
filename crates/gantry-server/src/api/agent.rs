//! Endpoints the worker agent calls: registration, heartbeat, hardware status, the
//! instances placed on it (optionally as a watch stream), state reports and its
//! goodbye. Everything but registration is scoped to the calling worker by its
//! credential: a worker can neither read nor touch another worker's instances.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use axum::extract::State;
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use gantry_store::{Change, ChangeKind, StoreError, REGISTRATION_TOKEN_DIGEST};
use gantry_types::{
    FieldError, InstanceStateReport, ModelInstance, Validate, Worker, WorkerAssignment,
    WorkerRegister, WorkerRegistered, WorkerState, WorkerStatus,
};
use serde::Deserialize;
use utoipa::IntoParams;

use super::watch;
use crate::auth::principal::credential_of;
use crate::auth::secrets::{
    digest, generate_worker_credential, random_alphanumeric, REGISTRATION_TOKEN_PREFIX,
    WORKER_CREDENTIAL_PREFIX,
};
use crate::auth::{Auth, Principal};
use crate::error::{ApiError, ApiResult};
use crate::extract::{ApiJson, ApiPath, ApiQuery};
use crate::state::AppState;

/// The calling worker: 403 for anyone else.
fn calling_worker(principal: &Principal) -> ApiResult<(i64, &str)> {
    match principal {
        Principal::Worker {
            worker_id,
            worker_name,
        } => Ok((*worker_id, worker_name.as_str())),
        Principal::User { .. } => Err(ApiError::forbidden(
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
    parts: Parts,
    ApiJson(request): ApiJson<WorkerRegister>,
) -> ApiResult<Response> {
    let token = credential_of(&parts).ok_or_else(|| {
        ApiError::unauthorized(
            "send the registration token (or this worker's credential) as Authorization: Bearer",
        )
    })?;
    if token.starts_with(WORKER_CREDENTIAL_PREFIX) {
        let worker = match state.store.worker_by_credential(&digest(&token)).await {
            Ok(worker) => worker,
            Err(StoreError::NotFound { .. }) => {
                return Err(ApiError::unauthorized(
                    "unknown worker credential: the worker was deleted; remove its credential file and register again with the registration token",
                ))
            }
            Err(e) => return Err(e.into()),
        };
        if worker.name != request.name {
            return Err(ApiError::conflict(format!(
                "this credential belongs to worker {}, not {}",
                worker.name, request.name
            )));
        }
        let worker = state
            .store
            .update_worker_registration(
                worker.id,
                &request.labels,
                &request.address,
                &request.status,
            )
            .await?;
        tracing::info!(worker_id = worker.id, worker = %worker.name, address = %worker.address, gpus = worker.status.gpus.len(), "worker registered again");
        return Ok(Json(WorkerRegistered {
            worker,
            credential: None,
            api_token: None,
        })
        .into_response());
    }
    if !token.starts_with(REGISTRATION_TOKEN_PREFIX) {
        return Err(ApiError::unauthorized("invalid registration token"));
    }
    let expected = state.store.get_setting(REGISTRATION_TOKEN_DIGEST).await?;
    if expected.as_deref() != Some(digest(&token).as_str()) {
        return Err(ApiError::unauthorized(
            "invalid registration token: use the one in the server's data directory (registration_token)",
        ));
    }
    if state.store.get_worker_by_name(&request.name).await.is_ok() {
        return Err(ApiError::conflict(format!(
            "a worker named {} is already registered: start it with its saved credential, pick another --name, or delete the old worker (DELETE /api/v1/workers/{{id}})",
            request.name
        )));
    }
    let credential = generate_worker_credential();
    let api_token = random_alphanumeric(48);
    let worker = state
        .store
        .register_worker(
            &request.name,
            &request.labels,
            &request.address,
            &request.status,
            &digest(&credential),
            &api_token,
        )
        .await?;
    tracing::info!(worker_id = worker.id, worker = %worker.name, address = %worker.address, gpus = worker.status.gpus.len(), "worker registered");
    Ok((
        StatusCode::CREATED,
        Json(WorkerRegistered {
            worker,
            credential: Some(credential),
            api_token: Some(api_token),
        }),
    )
        .into_response())
}

/// Records a heartbeat of the calling worker.
#[utoipa::path(post, path = "/api/v1/worker/heartbeat", tag = "worker-agent", security(("bearer" = [])),
    responses((status = 200, body = Worker), (status = 403, body = gantry_types::ErrorBody)))]
pub async fn heartbeat(
    State(state): State<AppState>,
    Auth(principal): Auth,
) -> ApiResult<Json<Worker>> {
    let (worker_id, _) = calling_worker(&principal)?;
    let before = state.store.get_worker(worker_id).await?.state;
    let worker = state.store.worker_heartbeat(worker_id).await?;
    if before != worker.state {
        tracing::info!(worker_id, worker = %worker.name, from = before.as_str(), to = worker.state.as_str(), "worker state changed on heartbeat");
    }
    Ok(Json(worker))
}

/// Stores the calling worker's hardware report.
#[utoipa::path(put, path = "/api/v1/worker/status", tag = "worker-agent", security(("bearer" = [])),
    request_body = WorkerStatus, responses((status = 200, body = Worker)))]
pub async fn status(
    State(state): State<AppState>,
    Auth(principal): Auth,
    ApiJson(status): ApiJson<WorkerStatus>,
) -> ApiResult<Json<Worker>> {
    let (worker_id, _) = calling_worker(&principal)?;
    Ok(Json(
        state.store.set_worker_status(worker_id, &status).await?,
    ))
}

/// Query of the assignment list.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct AssignmentQuery {
    /// Stream changes as NDJSON.
    pub watch: Option<bool>,
}

impl Validate for AssignmentQuery {
    fn validate(&self) -> Result<(), FieldError> {
        Ok(())
    }
}

/// The instances placed on the calling worker, each with its model. With
/// `watch=true`: a stream that also sends `DELETED` when an instance is removed or
/// moved to another worker, and `UPDATED` when its model changes.
#[utoipa::path(get, path = "/api/v1/worker/assignments", tag = "worker-agent", security(("bearer" = [])),
    params(AssignmentQuery), responses((status = 200, body = [WorkerAssignment])))]
pub async fn assignments(
    State(state): State<AppState>,
    Auth(principal): Auth,
    ApiQuery(query): ApiQuery<AssignmentQuery>,
) -> ApiResult<Response> {
    let (worker_id, _) = calling_worker(&principal)?;
    if query.watch != Some(true) {
        return Ok(Json(state.store.worker_assignments(worker_id).await?).into_response());
    }
    let changes = state.store.subscribe();
    let initial = state.store.worker_assignments(worker_id).await?;
    // Instances sent on this stream, by id, with their model: lets the stream say
    // DELETED when one moves away and re-send them when their model changes.
    let mut sent: BTreeMap<i64, i64> = initial
        .iter()
        .map(|a| (a.instance.id, a.instance.model_id))
        .collect();
    let store = state.store.clone();
    Ok(watch::respond_with(
        &state,
        changes,
        initial,
        move |change: Arc<Change>| {
            let mut deleted: Vec<ModelInstance> = Vec::new();
            let mut refresh: BTreeSet<i64> = BTreeSet::new();
            match &*change {
                Change::Instance(kind, instance) => {
                    let here =
                        instance.worker_id == Some(worker_id) && *kind != ChangeKind::Deleted;
                    if here {
                        sent.insert(instance.id, instance.model_id);
                        refresh.insert(instance.id);
                    } else if sent.remove(&instance.id).is_some() {
                        deleted.push(instance.clone());
                    }
                }
                Change::Model(ChangeKind::Updated, model) => {
                    refresh.extend(
                        sent.iter()
                            .filter(|(_, m)| **m == model.id)
                            .map(|(i, _)| *i),
                    );
                }
                _ => {}
            }
            let store = store.clone();
            async move {
                let mut events = Vec::new();
                for instance in deleted {
                    // The model may be gone with it; the worker needs only the instance.
                    let model = store.get_model(instance.model_id).await.ok();
                    events.push((ChangeKind::Deleted, WorkerAssignment { instance, model }));
                }
                for id in refresh {
                    if let Ok(instance) = store.get_instance(id).await {
                        if instance.worker_id != Some(worker_id) {
                            continue;
                        }
                        if let Ok(model) = store.get_model(instance.model_id).await {
                            events.push((
                                ChangeKind::Updated,
                                WorkerAssignment {
                                    instance,
                                    model: Some(model),
                                },
                            ));
                        }
                    }
                }
                events
            }
        },
    ))
}

/// The calling worker reports an instance's state.
#[utoipa::path(post, path = "/api/v1/worker/instances/{id}/state", tag = "worker-agent", security(("bearer" = [])),
    params(("id" = i64, Path, description = "instance id")), request_body = InstanceStateReport,
    responses((status = 200, body = ModelInstance), (status = 404, body = gantry_types::ErrorBody)))]
pub async fn report_state(
    State(state): State<AppState>,
    Auth(principal): Auth,
    ApiPath(id): ApiPath<i64>,
    ApiJson(report): ApiJson<InstanceStateReport>,
) -> ApiResult<Json<ModelInstance>> {
    let (worker_id, worker_name) = calling_worker(&principal)?;
    let instance = state
        .store
        .report_instance_state(id, worker_id, &report)
        .await?;
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
    state
        .store
        .set_worker_state(worker_id, WorkerState::NotReady, "worker shut down")
        .await?;
    tracing::info!(worker_id, worker = %worker_name, "worker said goodbye");
    Ok(StatusCode::NO_CONTENT)
}
