//! `/api/v1/model-routes`: public model names with weighted, prioritised targets —
//! deployed models and providers' models. Admins only; clients see routes in the
//! gateway's `GET /v1/models`.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use axum::Json;
use gantry_types::{ModelRoute, ModelRouteCreate, ModelRouteUpdate};

use super::created;
use crate::auth::{AdminAuth, Auth};
use crate::error::ApiResult;
use crate::extract::{ApiJson, ApiPath};
use crate::service;
use crate::state::AppState;

/// Lists the routes, by name.
#[utoipa::path(get, path = "/api/v1/model-routes", tag = "model-routes", security(("bearer" = [])),
    responses((status = 200, body = Vec<ModelRoute>), (status = 401, body = gantry_types::ErrorBody),
        (status = 403, body = gantry_types::ErrorBody)))]
pub async fn list(
    State(state): State<AppState>,
    Auth(principal): Auth,
) -> ApiResult<Json<Vec<ModelRoute>>> {
    principal.require_admin()?;
    Ok(Json(state.store.list_routes().await?))
}

/// Adds a route. Requests naming it go to the available targets of the lowest
/// `priority`, split by `weight`; a target with no running instance, or that fails
/// before its first byte (connection error, 429, 5xx), falls through to the next. A
/// route may take a deployed model's name: it then replaces that model's own route.
#[utoipa::path(post, path = "/api/v1/model-routes", tag = "model-routes", security(("bearer" = [])),
    request_body = ModelRouteCreate,
    responses((status = 201, body = ModelRoute), (status = 409, body = gantry_types::ErrorBody),
        (status = 422, body = gantry_types::ErrorBody)))]
pub async fn create(
    State(state): State<AppState>,
    AdminAuth(principal): AdminAuth,
    ApiJson(request): ApiJson<ModelRouteCreate>,
) -> ApiResult<Response> {
    let admin = principal.require_admin()?;
    let route = service::routes::create(&state.store, request).await?;
    tracing::info!(by = %admin.username, route = %route.name, targets = route.targets.len(), "added model route");
    Ok(created(route))
}

/// Shows a route.
#[utoipa::path(get, path = "/api/v1/model-routes/{name}", tag = "model-routes", security(("bearer" = [])),
    params(("name" = String, Path, description = "route name")),
    responses((status = 200, body = ModelRoute), (status = 404, body = gantry_types::ErrorBody)))]
pub async fn get(
    State(state): State<AppState>,
    Auth(principal): Auth,
    ApiPath(name): ApiPath<String>,
) -> ApiResult<Json<ModelRoute>> {
    principal.require_admin()?;
    Ok(Json(state.store.get_route(&name).await?))
}

/// Changes a route's description, or replaces its targets (weights, priorities).
#[utoipa::path(patch, path = "/api/v1/model-routes/{name}", tag = "model-routes", security(("bearer" = [])),
    params(("name" = String, Path, description = "route name")),
    request_body = ModelRouteUpdate,
    responses((status = 200, body = ModelRoute), (status = 404, body = gantry_types::ErrorBody),
        (status = 409, body = gantry_types::ErrorBody), (status = 422, body = gantry_types::ErrorBody)))]
pub async fn update(
    State(state): State<AppState>,
    AdminAuth(principal): AdminAuth,
    ApiPath(name): ApiPath<String>,
    ApiJson(request): ApiJson<ModelRouteUpdate>,
) -> ApiResult<Json<ModelRoute>> {
    let admin = principal.require_admin()?;
    let route = service::routes::update(&state.store, &name, request).await?;
    tracing::info!(by = %admin.username, route = %route.name, targets = route.targets.len(), "changed model route");
    Ok(Json(route))
}

/// Deletes a route. A deployed model of the same name is then its own route again.
#[utoipa::path(delete, path = "/api/v1/model-routes/{name}", tag = "model-routes", security(("bearer" = [])),
    params(("name" = String, Path, description = "route name")),
    responses((status = 204), (status = 404, body = gantry_types::ErrorBody)))]
pub async fn delete(
    State(state): State<AppState>,
    AdminAuth(principal): AdminAuth,
    ApiPath(name): ApiPath<String>,
) -> ApiResult<StatusCode> {
    let admin = principal.require_admin()?;
    state.store.delete_route(&name).await?;
    tracing::info!(by = %admin.username, route = %name, "deleted model route");
    Ok(StatusCode::NO_CONTENT)
}
