//! `/api/v1/inference-backends`: everyone signed in reads; admins define, change and delete
//! custom backends. Built-in backends are listed but not changed.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use axum::Json;
use gantry_types::{InferenceBackend, InferenceBackendCreate, InferenceBackendUpdate};

use super::created;
use crate::auth::AdminAuth;
use crate::auth::Auth;
use crate::error::ApiResult;
use crate::extract::{ApiJson, ApiPath};
use crate::service;
use crate::state::AppState;

/// Lists the backends: built-ins (llama.cpp, vLLM, SGLang) and custom ones, each with its
/// versions, how it installs, the workers that have it installed and the models using it.
#[utoipa::path(get, path = "/api/v1/inference-backends", tag = "inference-backends", security(("bearer" = [])),
    responses((status = 200, body = Vec<InferenceBackend>), (status = 401, body = gantry_types::ErrorBody)))]
pub async fn list(
    State(state): State<AppState>,
    Auth(principal): Auth,
) -> ApiResult<Json<Vec<InferenceBackend>>> {
    principal.require_user()?;
    Ok(Json(service::backends::list(&state.store).await?))
}

/// Defines a custom backend: a command template, its health path, environment, readiness
/// deadline and versions (each may bring its own command, environment and Python
/// requirements, installed on demand). Models use it with `"backend": "<name>"`.
#[utoipa::path(post, path = "/api/v1/inference-backends", tag = "inference-backends", security(("bearer" = [])),
    request_body = InferenceBackendCreate,
    responses((status = 201, body = InferenceBackend), (status = 409, body = gantry_types::ErrorBody),
        (status = 422, body = gantry_types::ErrorBody)))]
pub async fn create(
    State(state): State<AppState>,
    AdminAuth(principal): AdminAuth,
    ApiJson(request): ApiJson<InferenceBackendCreate>,
) -> ApiResult<Response> {
    let admin = principal.require_admin()?;
    let backend = service::backends::create(&state.store, request).await?;
    tracing::info!(by = %admin.username, backend = %backend.name, versions = backend.versions.len(), "defined inference backend");
    Ok(created(backend))
}

/// Shows a backend.
#[utoipa::path(get, path = "/api/v1/inference-backends/{name}", tag = "inference-backends", security(("bearer" = [])),
    params(("name" = String, Path, description = "backend name")),
    responses((status = 200, body = InferenceBackend), (status = 404, body = gantry_types::ErrorBody)))]
pub async fn get(
    State(state): State<AppState>,
    Auth(principal): Auth,
    ApiPath(name): ApiPath<String>,
) -> ApiResult<Json<InferenceBackend>> {
    principal.require_user()?;
    Ok(Json(service::backends::get(&state.store, &name).await?))
}

/// Changes a custom backend. Instances already placed keep the definition they were placed
/// with; pin a new version on a model to roll its instances onto it. 409 for built-ins and
/// for removing a version a model pins.
#[utoipa::path(patch, path = "/api/v1/inference-backends/{name}", tag = "inference-backends", security(("bearer" = [])),
    params(("name" = String, Path, description = "backend name")),
    request_body = InferenceBackendUpdate,
    responses((status = 200, body = InferenceBackend), (status = 404, body = gantry_types::ErrorBody),
        (status = 409, body = gantry_types::ErrorBody), (status = 422, body = gantry_types::ErrorBody)))]
pub async fn update(
    State(state): State<AppState>,
    AdminAuth(principal): AdminAuth,
    ApiPath(name): ApiPath<String>,
    ApiJson(request): ApiJson<InferenceBackendUpdate>,
) -> ApiResult<Json<InferenceBackend>> {
    let admin = principal.require_admin()?;
    let backend = service::backends::update(&state.store, &name, request).await?;
    tracing::info!(by = %admin.username, backend = %backend.name, "changed inference backend");
    Ok(Json(backend))
}

/// Deletes a custom backend. 409 while a model uses it (the message names them) and for
/// built-ins.
#[utoipa::path(delete, path = "/api/v1/inference-backends/{name}", tag = "inference-backends", security(("bearer" = [])),
    params(("name" = String, Path, description = "backend name")),
    responses((status = 204), (status = 404, body = gantry_types::ErrorBody),
        (status = 409, body = gantry_types::ErrorBody)))]
pub async fn delete(
    State(state): State<AppState>,
    Auth(principal): Auth,
    ApiPath(name): ApiPath<String>,
) -> ApiResult<StatusCode> {
    let admin = principal.require_admin()?;
    service::backends::delete(&state.store, &name).await?;
    tracing::info!(by = %admin.username, backend = %name, "deleted inference backend");
    Ok(StatusCode::NO_CONTENT)
}
