//! `/api/v1/workers` (admin only): list, show, delete, label.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use axum::Json;
use gantry_store::Change;
use gantry_types::{ListResponse, Worker, WorkerLabelsUpdate, WorkerQuery};

use crate::auth::AdminAuth;
use crate::auth::Auth;
use crate::error::ApiResult;
use crate::extract::{ApiJson, ApiPath, ApiQuery};
use crate::state::AppState;

/// Lists workers.
#[utoipa::path(get, path = "/api/v1/workers", tag = "workers", security(("bearer" = [])), params(WorkerQuery),
    responses((status = 200, body = ListResponse<Worker>), (status = 403, body = gantry_types::ErrorBody)))]
pub async fn list(
    State(state): State<AppState>,
    Auth(principal): Auth,
    ApiQuery(query): ApiQuery<WorkerQuery>,
) -> ApiResult<Response> {
    principal.require_admin()?;
    super::list_or_watch(&state, &query, Change::worker).await
}

/// Shows a worker with its last reported hardware.
#[utoipa::path(get, path = "/api/v1/workers/{id}", tag = "workers", security(("bearer" = [])),
    params(("id" = i64, Path, description = "worker id")),
    responses((status = 200, body = Worker), (status = 404, body = gantry_types::ErrorBody)))]
pub async fn get(
    State(state): State<AppState>,
    Auth(principal): Auth,
    ApiPath(id): ApiPath<i64>,
) -> ApiResult<Json<Worker>> {
    principal.require_admin()?;
    Ok(Json(state.store.get_worker(id).await?))
}

/// Removes a worker; its instances go back to `pending` to be placed elsewhere.
#[utoipa::path(delete, path = "/api/v1/workers/{id}", tag = "workers", security(("bearer" = [])),
    params(("id" = i64, Path, description = "worker id")),
    responses((status = 204), (status = 404, body = gantry_types::ErrorBody)))]
pub async fn delete(
    State(state): State<AppState>,
    Auth(principal): Auth,
    ApiPath(id): ApiPath<i64>,
) -> ApiResult<StatusCode> {
    let admin = principal.require_admin()?;
    let worker = state.store.delete_worker(id).await?;
    tracing::info!(by = %admin.username, worker_id = id, worker = %worker.name, "deleted worker");
    Ok(StatusCode::NO_CONTENT)
}

/// Replaces a worker's labels (used by model worker selectors).
#[utoipa::path(put, path = "/api/v1/workers/{id}/labels", tag = "workers", security(("bearer" = [])),
    params(("id" = i64, Path, description = "worker id")), request_body = WorkerLabelsUpdate,
    responses((status = 200, body = Worker), (status = 404, body = gantry_types::ErrorBody),
        (status = 422, body = gantry_types::ErrorBody)))]
pub async fn set_labels(
    State(state): State<AppState>,
    AdminAuth(principal): AdminAuth,
    ApiPath(id): ApiPath<i64>,
    ApiJson(request): ApiJson<WorkerLabelsUpdate>,
) -> ApiResult<Json<Worker>> {
    let admin = principal.require_admin()?;
    let worker = state.store.set_worker_labels(id, &request.labels).await?;
    tracing::info!(by = %admin.username, worker_id = id, "set worker labels");
    Ok(Json(worker))
}
