//! `/api/v1/model-instances`: everyone signed in reads; admins delete (a replacement
//! is created, which restarts the replica) and place by hand.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use axum::Json;
use gantry_store::{Change, InstanceFilter};
use gantry_types::{
    FieldError, InstancePatch, InstanceState, ListResponse, ModelInstance, Validate,
};
use serde::Deserialize;
use utoipa::IntoParams;

use super::{check_page, page_of, watch};
use crate::auth::Auth;
use crate::error::ApiResult;
use crate::extract::{ApiJson, ApiPath, ApiQuery};
use crate::state::AppState;

/// Filters and paging for the instance list.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct InstanceListQuery {
    pub model_id: Option<i64>,
    pub worker_id: Option<i64>,
    pub state: Option<InstanceState>,
    pub page: Option<u32>,
    pub per_page: Option<u32>,
    pub watch: Option<bool>,
}

impl Validate for InstanceListQuery {
    fn validate(&self) -> Result<(), FieldError> {
        check_page(self.page, self.per_page)
    }
}

/// Lists model instances.
#[utoipa::path(get, path = "/api/v1/model-instances", tag = "model-instances", security(("bearer" = [])),
    params(InstanceListQuery), responses((status = 200, body = ListResponse<ModelInstance>)))]
pub async fn list(
    State(state): State<AppState>,
    Auth(principal): Auth,
    ApiQuery(query): ApiQuery<InstanceListQuery>,
) -> ApiResult<Response> {
    principal.require_user()?;
    let filter = InstanceFilter {
        model_id: query.model_id,
        worker_id: query.worker_id,
        state: query.state,
    };
    if query.watch == Some(true) {
        let changes = state.store.subscribe();
        let initial = super::watch_all(|page| state.store.list_instances(&filter, page)).await?;
        return Ok(watch::respond(
            &state,
            changes,
            initial,
            move |change| match change {
                Change::Instance(kind, instance)
                    if filter.model_id.is_none_or(|m| m == instance.model_id)
                        && filter
                            .worker_id
                            .is_none_or(|w| Some(w) == instance.worker_id)
                        && filter.state.is_none_or(|s| s == instance.state) =>
                {
                    Some((*kind, instance.clone()))
                }
                _ => None,
            },
        ));
    }
    let page = page_of(query.page, query.per_page);
    let (items, total) = state.store.list_instances(&filter, page).await?;
    Ok(super::list_response(items, page, total))
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
    Auth(principal): Auth,
    ApiPath(id): ApiPath<i64>,
    ApiJson(request): ApiJson<InstancePatch>,
) -> ApiResult<Json<ModelInstance>> {
    let admin = principal.require_admin()?;
    let current = state.store.get_instance(id).await?;
    let worker_id = request.worker_id.unwrap_or(current.worker_id);
    let gpus = request.gpu_indexes.unwrap_or(current.gpu_indexes);
    let instance = state
        .store
        .place_instance_manually(id, worker_id, &gpus)
        .await?;
    tracing::info!(by = %admin.username, instance_id = id, instance = %instance.name, worker_id = ?instance.worker_id, gpus = ?instance.gpu_indexes, "placed instance by hand");
    Ok(Json(instance))
}

/// Deletes an instance; the model's replica count stays, so a new one replaces it.
#[utoipa::path(delete, path = "/api/v1/model-instances/{id}", tag = "model-instances", security(("bearer" = [])),
    params(("id" = i64, Path, description = "instance id")),
    responses((status = 204), (status = 404, body = gantry_types::ErrorBody)))]
pub async fn delete(
    State(state): State<AppState>,
    Auth(principal): Auth,
    ApiPath(id): ApiPath<i64>,
) -> ApiResult<StatusCode> {
    let admin = principal.require_admin()?;
    let instance = state.store.delete_instance(id).await?;
    state
        .store
        .reconcile_model_replicas(instance.model_id)
        .await?;
    tracing::info!(by = %admin.username, instance_id = id, instance = %instance.name, "deleted instance");
    Ok(StatusCode::NO_CONTENT)
}
