//! `/api/v1/models`: everyone signed in reads; admins create, update, delete and ask for
//! estimates (`/api/v1/models/estimate`).

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use axum::Json;
use gantry_store::Change;
use gantry_types::{ListResponse, Model, ModelCreate, ModelEstimate, ModelQuery, ModelUpdate};

use super::created;
use crate::auth::{Auth, ClusterAdminAuth};
use crate::error::ApiResult;
use crate::extract::{ApiJson, ApiPath, ApiQuery};
use crate::service;
use crate::state::AppState;

/// Lists models.
#[utoipa::path(get, path = "/api/v1/models", tag = "models", security(("bearer" = [])), params(ModelQuery),
    responses((status = 200, body = ListResponse<Model>)))]
pub async fn list(
    State(state): State<AppState>,
    Auth(principal): Auth,
    ApiQuery(query): ApiQuery<ModelQuery>,
) -> ApiResult<Response> {
    principal.require_user()?;
    super::list_or_watch(&state, &query, Change::model).await
}

/// Declares a model; its `replicas` instances appear in state `pending` a moment later. A
/// `local_path` source that does not exist on the server is refused (422 naming
/// `source.path`): the server reads the model's header to estimate its memory.
#[utoipa::path(post, path = "/api/v1/models", tag = "models", security(("bearer" = [])), request_body = ModelCreate,
    responses((status = 201, body = Model), (status = 409, body = gantry_types::ErrorBody),
        (status = 422, body = gantry_types::ErrorBody)))]
pub async fn create(
    State(state): State<AppState>,
    ClusterAdminAuth(principal): ClusterAdminAuth,
    ApiJson(request): ApiJson<ModelCreate>,
) -> ApiResult<Response> {
    let cluster_id = service::models::cluster_of(&state.store, &request).await?;
    let admin = principal.require_cluster_admin(cluster_id)?;
    let model = service::models::create(&state.store, &request).await?;
    tracing::info!(by = %admin.username, model_id = model.id, model = %model.name, replicas = model.replicas, backend = model.backend.as_str(), "created model");
    Ok(created(model))
}

/// Estimates a model before it is created: takes the body `POST /api/v1/models` takes,
/// reads the model's file headers as the scheduler would (local paths and remote sources
/// alike), and answers with the estimate (context, parts, the claim), where the scheduler
/// would place its replicas now, and every worker's verdict on one instance: on which GPUs
/// with which parts, or why not, in the words a pending instance would show. Stores
/// nothing. A body creation would refuse is refused alike; a model file that cannot be
/// read is a 422 naming it.
#[utoipa::path(post, path = "/api/v1/models/estimate", tag = "models", security(("bearer" = [])), request_body = ModelCreate,
    responses((status = 200, body = ModelEstimate), (status = 400, body = gantry_types::ErrorBody),
        (status = 403, body = gantry_types::ErrorBody), (status = 422, body = gantry_types::ErrorBody)))]
pub async fn estimate(
    State(state): State<AppState>,
    ClusterAdminAuth(principal): ClusterAdminAuth,
    ApiJson(request): ApiJson<ModelCreate>,
) -> ApiResult<Json<ModelEstimate>> {
    let cluster_id = service::models::cluster_of(&state.store, &request).await?;
    let admin = principal.require_cluster_admin(cluster_id)?;
    let estimate = service::models::estimate(&state.store, &state.sources, &request).await?;
    let fitting = estimate.workers.iter().filter(|w| w.fits).count();
    tracing::info!(by = %admin.username, model = %request.name, backend = request.backend.as_str(),
        fitting_workers = fitting, workers = estimate.workers.len(), "estimated model");
    Ok(Json(estimate))
}

/// Shows a model.
#[utoipa::path(get, path = "/api/v1/models/{id}", tag = "models", security(("bearer" = [])),
    params(("id" = i64, Path, description = "model id")),
    responses((status = 200, body = Model), (status = 404, body = gantry_types::ErrorBody)))]
pub async fn get(
    State(state): State<AppState>,
    Auth(principal): Auth,
    ApiPath(id): ApiPath<i64>,
) -> ApiResult<Json<Model>> {
    principal.require_user()?;
    Ok(Json(state.store.get_model(id).await?))
}

/// Changes a model. Changing `replicas` adds or removes instances; changing what the
/// instances run (`source`, backend version, arguments, environment, command) rolls them
/// onto the new settings one at a time, keeping the others serving. A new `source` is
/// checked as on creation (422 for a local path missing on the server).
#[utoipa::path(patch, path = "/api/v1/models/{id}", tag = "models", security(("bearer" = [])),
    params(("id" = i64, Path, description = "model id")), request_body = ModelUpdate,
    responses((status = 200, body = Model), (status = 404, body = gantry_types::ErrorBody),
        (status = 422, body = gantry_types::ErrorBody)))]
pub async fn update(
    State(state): State<AppState>,
    ClusterAdminAuth(principal): ClusterAdminAuth,
    ApiPath(id): ApiPath<i64>,
    ApiJson(request): ApiJson<ModelUpdate>,
) -> ApiResult<Json<Model>> {
    let cluster_id = state.store.get_model(id).await?.cluster_id;
    let admin = principal.require_cluster_admin(cluster_id)?;
    let (model, rolls) = service::models::update(&state.store, id, request).await?;
    tracing::info!(by = %admin.username, model_id = id, model = %model.name, replicas = model.replicas, rolls_instances = rolls, "updated model");
    Ok(Json(model))
}

/// Deletes a model and all its instances.
#[utoipa::path(delete, path = "/api/v1/models/{id}", tag = "models", security(("bearer" = [])),
    params(("id" = i64, Path, description = "model id")),
    responses((status = 204), (status = 404, body = gantry_types::ErrorBody)))]
pub async fn delete(
    State(state): State<AppState>,
    ClusterAdminAuth(principal): ClusterAdminAuth,
    ApiPath(id): ApiPath<i64>,
) -> ApiResult<StatusCode> {
    let cluster_id = state.store.get_model(id).await?.cluster_id;
    let admin = principal.require_cluster_admin(cluster_id)?;
    let model = service::models::delete(&state.store, id).await?;
    tracing::info!(by = %admin.username, model_id = id, model = %model.name, "deleted model");
    Ok(StatusCode::NO_CONTENT)
}
