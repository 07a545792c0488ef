//! `/api/v1/workers/{id}/backends` (admin only): the backend versions installed on one
//! worker, installing one ahead of need, and removing one no instance uses. The worker does
//! the work through its own API; this server resolves what to install and checks the
//! cluster's instances before a removal.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use gantry_types::{BackendInstallRequest, BackendInstallStatus};

use crate::auth::{AdminAuth, Auth};
use crate::error::{ApiError, ApiResult};
use crate::extract::{ApiJson, ApiPath};
use crate::service;
use crate::service::worker_api::WorkerApi;
use crate::state::AppState;

/// Lists the backend versions on a worker: `installed` (the message names the variant:
/// `cpu`, `cuda`, `python`), `installing` (with progress) and `failed` (with the
/// installer's last lines), each with the instances there that use it.
#[utoipa::path(get, path = "/api/v1/workers/{id}/backends", tag = "workers", security(("bearer" = [])),
    params(("id" = i64, Path, description = "worker id")),
    responses((status = 200, body = Vec<BackendInstallStatus>), (status = 403, body = gantry_types::ErrorBody),
        (status = 404, body = gantry_types::ErrorBody), (status = 502, body = gantry_types::ErrorBody)))]
pub async fn list(
    State(state): State<AppState>,
    Auth(principal): Auth,
    ApiPath(id): ApiPath<i64>,
) -> ApiResult<Json<Vec<BackendInstallStatus>>> {
    principal.require_admin()?;
    let api = WorkerApi::of(&state.store, &state.worker_http, id).await?;
    let response = api
        .send(api.request(reqwest::Method::GET, "/v1/backends"))
        .await?;
    Ok(Json(api.json(response, "a backend list").await?))
}

/// Installs a backend version on a worker ahead of need, so the first instance that needs
/// it starts at once: 200 when it is installed already, 202 while the install runs (follow
/// it with `GET /api/v1/workers/{id}/backends`). Without `version`: llama.cpp's default,
/// the newest vLLM or SGLang release, a defined backend's default version.
#[utoipa::path(post, path = "/api/v1/workers/{id}/backends", tag = "workers", security(("bearer" = [])),
    params(("id" = i64, Path, description = "worker id")), request_body = BackendInstallRequest,
    responses((status = 200, body = BackendInstallStatus), (status = 202, body = BackendInstallStatus),
        (status = 404, body = gantry_types::ErrorBody), (status = 409, body = gantry_types::ErrorBody),
        (status = 422, body = gantry_types::ErrorBody), (status = 502, body = gantry_types::ErrorBody)))]
pub async fn install(
    State(state): State<AppState>,
    AdminAuth(principal): AdminAuth,
    ApiPath(id): ApiPath<i64>,
    ApiJson(request): ApiJson<BackendInstallRequest>,
) -> ApiResult<Response> {
    let admin = principal.require_admin()?;
    let api = WorkerApi::of(&state.store, &state.worker_http, id).await?;
    let order = service::backends::install_order(&state.store, &request).await?;
    let response = api
        .send(
            api.request(reqwest::Method::POST, "/v1/backends")
                .json(&order),
        )
        .await?;
    let code = StatusCode::from_u16(response.status().as_u16()).unwrap_or(StatusCode::OK);
    let status: BackendInstallStatus = api.json(response, "an install status").await?;
    tracing::info!(by = %admin.username, worker_id = id, worker = %api.worker.name,
        backend = %status.name, version = %status.version, state = %status.state,
        "asked a worker to install a backend");
    Ok((code, Json(status)).into_response())
}

/// Removes a backend version from a worker. 409 while an instance uses it (the message
/// names them) or an install of it runs; 404 when it is not installed there.
#[utoipa::path(delete, path = "/api/v1/workers/{id}/backends/{name}/{version}", tag = "workers", security(("bearer" = [])),
    params(("id" = i64, Path, description = "worker id"),
        ("name" = String, Path, description = "backend name", min_length = 1, max_length = 63,
            pattern = r"^[a-z0-9][a-z0-9._-]*$"),
        ("version" = String, Path, description = "backend version", min_length = 1, max_length = 100,
            pattern = r"^[A-Za-z0-9._+-]+$")),
    responses((status = 204), (status = 404, body = gantry_types::ErrorBody), (status = 422, body = gantry_types::ErrorBody),
        (status = 409, body = gantry_types::ErrorBody), (status = 502, body = gantry_types::ErrorBody)))]
pub async fn remove(
    State(state): State<AppState>,
    Auth(principal): Auth,
    ApiPath((id, name, version)): ApiPath<(i64, String, String)>,
) -> ApiResult<StatusCode> {
    let admin = principal.require_admin()?;
    gantry_types::BackendName::new(name.clone())
        .check("name")
        .and_then(|()| gantry_types::backend::check_version("version", &version))
        .map_err(ApiError::from)?;
    let api = WorkerApi::of(&state.store, &state.worker_http, id).await?;
    let users = service::backends::instances_using(&state.store, id, &name, &version).await?;
    if !users.is_empty() {
        return Err(ApiError::conflict(format!(
            "{name} {version} on worker {} is used by {}; delete or move those instances first",
            api.worker.name,
            users.join(", ")
        )));
    }
    // Both are checked above: nothing in them needs escaping in a path.
    let path = format!("/v1/backends/{name}/{version}");
    api.send(api.request(reqwest::Method::DELETE, &path))
        .await?;
    tracing::info!(by = %admin.username, worker_id = id, worker = %api.worker.name,
        backend = %name, %version, "removed a backend from a worker");
    Ok(StatusCode::NO_CONTENT)
}
