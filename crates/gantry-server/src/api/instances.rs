//! `/api/v1/model-instances`: everyone signed in reads; admins restart a backend in
//! place, delete (a replacement is created) and place by hand.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::StreamExt;
use gantry_store::Change;
use gantry_types::{
    ErrorCode, InstancePatch, InstanceQuery, ListResponse, LogQuery, ModelInstance,
};

use crate::auth::{Auth, ClusterAdminAuth};
use crate::error::{ApiError, ApiResult};
use crate::extract::{ApiJson, ApiPath, ApiQuery};
use crate::service;
use crate::state::AppState;

/// Lists model instances.
#[utoipa::path(get, path = "/api/v1/model-instances", tag = "model-instances", security(("bearer" = [])),
    params(InstanceQuery), responses((status = 200, body = ListResponse<ModelInstance>)))]
pub async fn list(
    State(state): State<AppState>,
    Auth(principal): Auth,
    ApiQuery(query): ApiQuery<InstanceQuery>,
) -> ApiResult<Response> {
    principal.require_user()?;
    super::list_or_watch(&state, &query, Change::instance).await
}

/// Shows an instance.
#[utoipa::path(get, path = "/api/v1/model-instances/{id}", tag = "model-instances", security(("bearer" = [])),
    params(("id" = i64, Path, description = "instance id")),
    responses((status = 200, body = ModelInstance), (status = 404, body = gantry_types::ErrorBody)))]
pub async fn get(
    State(state): State<AppState>,
    Auth(principal): Auth,
    ApiPath(id): ApiPath<i64>,
) -> ApiResult<Json<ModelInstance>> {
    principal.require_user()?;
    Ok(Json(state.store.get_instance(id).await?))
}

/// Places an instance by hand, or unplaces it (`worker_id: null`).
#[utoipa::path(patch, path = "/api/v1/model-instances/{id}", tag = "model-instances", security(("bearer" = [])),
    params(("id" = i64, Path, description = "instance id")), request_body = InstancePatch,
    responses((status = 200, body = ModelInstance), (status = 404, body = gantry_types::ErrorBody),
        (status = 422, body = gantry_types::ErrorBody)))]
pub async fn update(
    State(state): State<AppState>,
    ClusterAdminAuth(principal): ClusterAdminAuth,
    ApiPath(id): ApiPath<i64>,
    ApiJson(request): ApiJson<InstancePatch>,
) -> ApiResult<Json<ModelInstance>> {
    let cluster_id = state.store.get_instance(id).await?.cluster_id;
    let admin = principal.require_cluster_admin(cluster_id)?;
    let instance = service::instances::place_by_hand(&state.store, id, request).await?;
    tracing::info!(by = %admin.username, instance_id = id, instance = %instance.name, worker_id = ?instance.worker_id, gpus = ?instance.gpu_indexes, "placed instance by hand");
    Ok(Json(instance))
}

/// Deletes an instance; the model's replica count stays, so the model controller creates
/// a replacement (a new instance, placed afresh). To restart a backend where it runs, see
/// `POST /api/v1/model-instances/{id}/restart`.
#[utoipa::path(delete, path = "/api/v1/model-instances/{id}", tag = "model-instances", security(("bearer" = [])),
    params(("id" = i64, Path, description = "instance id")),
    responses((status = 204), (status = 404, body = gantry_types::ErrorBody)))]
pub async fn delete(
    State(state): State<AppState>,
    ClusterAdminAuth(principal): ClusterAdminAuth,
    ApiPath(id): ApiPath<i64>,
) -> ApiResult<StatusCode> {
    let cluster_id = state.store.get_instance(id).await?.cluster_id;
    let admin = principal.require_cluster_admin(cluster_id)?;
    let instance = state.store.delete_instance(id).await?;
    tracing::info!(by = %admin.username, instance_id = id, instance = %instance.name, "deleted instance");
    Ok(StatusCode::NO_CONTENT)
}

/// Restarts an instance's backend where it runs: its worker stops the process and starts
/// it again with the same placement, and the instance's `restart_count` goes up by one.
/// 409 while the instance is not placed; 404 from the worker when it does not run the
/// instance (yet, or any more); 502 when the worker cannot be reached.
#[utoipa::path(post, path = "/api/v1/model-instances/{id}/restart", tag = "model-instances", security(("bearer" = [])),
    params(("id" = i64, Path, description = "instance id")),
    responses((status = 204), (status = 403, body = gantry_types::ErrorBody),
        (status = 404, body = gantry_types::ErrorBody), (status = 409, body = gantry_types::ErrorBody),
        (status = 502, body = gantry_types::ErrorBody)))]
pub async fn restart(
    State(state): State<AppState>,
    ClusterAdminAuth(principal): ClusterAdminAuth,
    ApiPath(id): ApiPath<i64>,
) -> ApiResult<StatusCode> {
    let cluster_id = state.store.get_instance(id).await?.cluster_id;
    let admin = principal.require_cluster_admin(cluster_id)?;
    let instance = service::instances::restart(&state.store, &state.worker_http, id).await?;
    tracing::info!(by = %admin.username, instance_id = id, instance = %instance.name, worker_id = ?instance.worker_id, "restarted instance");
    Ok(StatusCode::NO_CONTENT)
}

/// The backend's output (stdout and stderr) of an instance, fetched from its worker.
#[utoipa::path(get, path = "/api/v1/model-instances/{id}/logs", tag = "model-instances", security(("bearer" = [])),
    params(("id" = i64, Path, description = "instance id"), LogQuery),
    responses((status = 200, content_type = "text/plain", body = String), (status = 404, body = gantry_types::ErrorBody),
        (status = 409, body = gantry_types::ErrorBody), (status = 502, body = gantry_types::ErrorBody)))]
pub async fn logs(
    State(state): State<AppState>,
    Auth(principal): Auth,
    ApiPath(id): ApiPath<i64>,
    ApiQuery(query): ApiQuery<LogQuery>,
) -> ApiResult<Response> {
    principal.require_user()?;
    let source = service::instances::log_source(&state.store, id).await?;
    let worker = &source.worker;
    let url = gantry_types::worker::worker_api_url(
        &worker.address,
        &format!(
            "/v1/instances/{id}/logs?tail={}&follow={}",
            query.tail.unwrap_or(100),
            query.follow.unwrap_or(false)
        ),
    );
    let upstream = state
        .worker_http
        .get(&url)
        .bearer_auth(&source.token)
        .send()
        .await
        .map_err(|e| {
            ApiError::new(
                ErrorCode::WorkerUnreachable,
                format!(
                    "cannot reach worker {} at {}: {e}; is the worker running and its \
                     address reachable from this server?",
                    worker.name, worker.address
                ),
            )
        })?;
    if !upstream.status().is_success() {
        let status = upstream.status();
        let text = upstream.text().await.unwrap_or_default();
        let code = if status == reqwest::StatusCode::NOT_FOUND {
            ErrorCode::NotFound
        } else {
            ErrorCode::WorkerError
        };
        return Err(ApiError::new(
            code,
            format!("worker {} answered {status}: {}", worker.name, text.trim()),
        ));
    }
    // A followed log ends with the server, or after the client's `timeout_seconds`.
    let shutdown = state.shutdown.clone();
    let timeout = query.timeout_seconds;
    let ends = async move {
        match timeout {
            Some(seconds) => {
                tokio::select! {
                    () = shutdown.cancelled() => {}
                    () = tokio::time::sleep(std::time::Duration::from_secs(u64::from(seconds))) => {}
                }
            }
            None => shutdown.cancelled().await,
        }
    };
    let body = upstream.bytes_stream().take_until(Box::pin(ends));
    Ok((
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; charset=utf-8",
        )],
        axum::body::Body::from_stream(body),
    )
        .into_response())
}
