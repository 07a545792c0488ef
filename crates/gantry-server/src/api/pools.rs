//! `/api/v1/clusters/{id}/worker-pools`: machines a cluster creates and deletes through a
//! provider, between `min` and `max`, following demand. Admins change them (they cost
//! money); the cluster's administrators see them.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use gantry_types::{PoolEvent, WorkerPool, WorkerPoolCreate, WorkerPoolUpdate};

use crate::auth::{AdminAuth, Auth};
use crate::error::ApiResult;
use crate::extract::{ApiJson, ApiPath};
use crate::service;
use crate::state::AppState;

/// Lists a cluster's pools with their machines.
#[utoipa::path(get, path = "/api/v1/clusters/{id}/worker-pools", tag = "clusters", security(("bearer" = [])),
    params(("id" = i64, Path, description = "cluster id")),
    responses((status = 200, body = Vec<WorkerPool>), (status = 403, body = gantry_types::ErrorBody),
        (status = 404, body = gantry_types::ErrorBody)))]
pub async fn list(
    State(state): State<AppState>,
    Auth(principal): Auth,
    ApiPath(cluster_id): ApiPath<i64>,
) -> ApiResult<Json<Vec<WorkerPool>>> {
    state.store.get_cluster(cluster_id).await?;
    principal.require_cluster_admin(cluster_id)?;
    let mut pools = Vec::new();
    for stored in state.store.list_pools(Some(cluster_id)).await? {
        pools.push(service::pools::shown(&state.store, stored).await?);
    }
    Ok(Json(pools))
}

/// Adds a pool: `digitalocean` (droplets, with an API token as `credentials`), `exec` (a
/// command of yours, run as `<command> create|find|delete` with JSON on stdin and
/// stdout) or `local` (`gantry worker` processes with simulated GPUs on the server's
/// machine). `gpus` says what each machine has, which the scheduler's estimate checks
/// pending replicas against to decide whether a new machine would serve them.
#[utoipa::path(post, path = "/api/v1/clusters/{id}/worker-pools", tag = "clusters", security(("bearer" = [])),
    params(("id" = i64, Path, description = "cluster id")), request_body = WorkerPoolCreate,
    responses((status = 201, body = WorkerPool), (status = 403, body = gantry_types::ErrorBody),
        (status = 404, body = gantry_types::ErrorBody), (status = 409, body = gantry_types::ErrorBody),
        (status = 422, body = gantry_types::ErrorBody)))]
pub async fn create(
    State(state): State<AppState>,
    AdminAuth(principal): AdminAuth,
    ApiPath(cluster_id): ApiPath<i64>,
    ApiJson(request): ApiJson<WorkerPoolCreate>,
) -> ApiResult<Response> {
    let admin = principal.require_admin()?;
    let pool = service::pools::create(
        &state.store,
        (&state.pool_credentials, &state.config.pool_commands_dir()),
        cluster_id,
        request,
    )
    .await?;
    tracing::info!(by = %admin.username, cluster_id, pool_id = pool.id, pool = %pool.name,
        provider = pool.provider.as_str(), min = pool.min, max = pool.max, "created worker pool");
    Ok((StatusCode::CREATED, Json(pool)).into_response())
}

/// Shows a pool with its machines.
#[utoipa::path(get, path = "/api/v1/clusters/{id}/worker-pools/{pool}", tag = "clusters", security(("bearer" = [])),
    params(("id" = i64, Path, description = "cluster id"), ("pool" = i64, Path, description = "pool id")),
    responses((status = 200, body = WorkerPool), (status = 403, body = gantry_types::ErrorBody),
        (status = 404, body = gantry_types::ErrorBody)))]
pub async fn get(
    State(state): State<AppState>,
    Auth(principal): Auth,
    ApiPath((cluster_id, id)): ApiPath<(i64, i64)>,
) -> ApiResult<Json<WorkerPool>> {
    principal.require_cluster_admin(cluster_id)?;
    let stored = service::pools::get(&state.store, cluster_id, id).await?;
    Ok(Json(service::pools::shown(&state.store, stored).await?))
}

/// Changes a pool's `min`, `max`, labels, idle time or credentials; absent fields stay.
/// The leader acts on a new bound within a pass.
#[utoipa::path(patch, path = "/api/v1/clusters/{id}/worker-pools/{pool}", tag = "clusters", security(("bearer" = [])),
    params(("id" = i64, Path, description = "cluster id"), ("pool" = i64, Path, description = "pool id")),
    request_body = WorkerPoolUpdate,
    responses((status = 200, body = WorkerPool), (status = 404, body = gantry_types::ErrorBody),
        (status = 409, body = gantry_types::ErrorBody), (status = 422, body = gantry_types::ErrorBody)))]
pub async fn update(
    State(state): State<AppState>,
    AdminAuth(principal): AdminAuth,
    ApiPath((cluster_id, id)): ApiPath<(i64, i64)>,
    ApiJson(request): ApiJson<WorkerPoolUpdate>,
) -> ApiResult<Json<WorkerPool>> {
    let admin = principal.require_admin()?;
    let credentials_changed = request.credentials.is_some();
    let pool = service::pools::update(
        &state.store,
        &state.pool_credentials,
        cluster_id,
        id,
        request,
    )
    .await?;
    tracing::info!(by = %admin.username, pool_id = id, pool = %pool.name, min = pool.min,
        max = pool.max, credentials_changed, "changed worker pool");
    Ok(Json(pool))
}

/// Deletes a pool: its machines are deleted at the provider, then the pool goes. Answers
/// 202 with the pool as it is now (`deleting`).
#[utoipa::path(delete, path = "/api/v1/clusters/{id}/worker-pools/{pool}", tag = "clusters", security(("bearer" = [])),
    params(("id" = i64, Path, description = "cluster id"), ("pool" = i64, Path, description = "pool id")),
    responses((status = 202, body = WorkerPool), (status = 404, body = gantry_types::ErrorBody)))]
pub async fn delete(
    State(state): State<AppState>,
    AdminAuth(principal): AdminAuth,
    ApiPath((cluster_id, id)): ApiPath<(i64, i64)>,
) -> ApiResult<Response> {
    let admin = principal.require_admin()?;
    let pool = service::pools::delete(&state.store, cluster_id, id).await?;
    tracing::info!(by = %admin.username, pool_id = id, pool = %pool.name,
        machines = pool.machines.len(), "deleted worker pool");
    Ok((StatusCode::ACCEPTED, Json(pool)).into_response())
}

/// A pool's latest decisions with their reasons, newest first: machines asked for and
/// why, created, registered, failed (with the provider's words), drained and deleted.
#[utoipa::path(get, path = "/api/v1/clusters/{id}/worker-pools/{pool}/events", tag = "clusters", security(("bearer" = [])),
    params(("id" = i64, Path, description = "cluster id"), ("pool" = i64, Path, description = "pool id")),
    responses((status = 200, body = Vec<PoolEvent>), (status = 403, body = gantry_types::ErrorBody),
        (status = 404, body = gantry_types::ErrorBody)))]
pub async fn events(
    State(state): State<AppState>,
    Auth(principal): Auth,
    ApiPath((cluster_id, id)): ApiPath<(i64, i64)>,
) -> ApiResult<Json<Vec<PoolEvent>>> {
    principal.require_cluster_admin(cluster_id)?;
    Ok(Json(
        service::pools::events(&state.store, cluster_id, id).await?,
    ))
}
