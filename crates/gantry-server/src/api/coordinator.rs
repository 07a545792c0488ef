//! `/api/v1/coordinator/*` (an admin, or a server of the cluster with its server
//! credential): the server registry, the leader and its fencing token, distributed locks.
//! Servers register, heartbeat and lead on their own; these endpoints show that state and
//! let tools take part (a tool can hold a lock, register an external component as a
//! server). A server credential registers, heartbeats and unregisters only its own id.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use gantry_store::LockRelease as Released;
use gantry_types::{
    ClusterStatus, CoordinatorHealth, LeaderInfo, LockAcquire, LockInfo, LockRelease,
    ServerDirectory, ServerHeartbeat, ServerInfo, ServerRegister, Timestamp,
};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::auth::AdminOrServerAuth;
use crate::auth::{Auth, Principal};
use crate::cluster::registry;
use crate::error::{ApiError, ApiResult};
use crate::extract::{ApiJson, ApiPath};
use crate::state::AppState;

/// `GET /api/v1/coordinator/locks`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct LockList {
    pub locks: Vec<LockInfo>,
}

/// Who calls, for log lines: an admin or a server; anyone else is refused.
fn coordinator_caller(principal: &Principal) -> ApiResult<String> {
    Ok(principal.require_admin_or_server()?)
}

/// Like [`coordinator_caller`], and a server credential must be `server_id`'s own.
fn caller_for_server(principal: &Principal, server_id: &str) -> ApiResult<String> {
    if let Principal::Server { server_id: own } = principal {
        if own != server_id {
            return Err(ApiError::forbidden(format!(
                "the credential of server {own:?} cannot act for server {server_id:?}"
            )));
        }
    }
    coordinator_caller(principal)
}

/// The registry with activity and load scores.
pub async fn servers_of(state: &AppState) -> ApiResult<Vec<ServerInfo>> {
    let leader = leader_of(state).await?;
    let records = state.store.list_servers().await?;
    Ok(registry::describe(
        records,
        Timestamp::now(),
        state.config.server_timeout,
        leader.server_id.as_deref(),
    ))
}

/// The lease's holder and token; in local mode, this server with the local token.
async fn leader_of(state: &AppState) -> ApiResult<LeaderInfo> {
    if state.cluster.mode == crate::config::SchedulingMode::Distributed {
        return Ok(state.store.leader_lease().await?);
    }
    Ok(LeaderInfo {
        server_id: state
            .cluster
            .coordinator
            .is_leader()
            .then(|| state.config.server_id.clone()),
        fencing_token: state.cluster.coordinator.fencing_token().unwrap_or(0),
        acquired_at: Timestamp::from_millis(0),
        expires_at: Timestamp::from_millis(0),
    })
}

/// Every registered server, active or not, with its role and load score.
#[utoipa::path(get, path = "/api/v1/coordinator/servers", tag = "coordinator", security(("bearer" = [])),
    responses((status = 200, body = ServerDirectory), (status = 401, body = gantry_types::ErrorBody),
        (status = 403, body = gantry_types::ErrorBody)))]
pub async fn servers(
    State(state): State<AppState>,
    Auth(principal): Auth,
) -> ApiResult<Json<ServerDirectory>> {
    coordinator_caller(&principal)?;
    Ok(Json(ServerDirectory {
        servers: servers_of(&state).await?,
    }))
}

/// Registers a server (refused while another live server holds the id).
#[utoipa::path(post, path = "/api/v1/coordinator/servers/register", tag = "coordinator", security(("bearer" = [])),
    request_body = ServerRegister,
    responses((status = 201, body = ServerInfo), (status = 409, body = gantry_types::ErrorBody),
        (status = 422, body = gantry_types::ErrorBody), (status = 401, body = gantry_types::ErrorBody)))]
pub async fn register(
    State(state): State<AppState>,
    AdminOrServerAuth(principal): AdminOrServerAuth,
    ApiJson(body): ApiJson<ServerRegister>,
) -> ApiResult<(StatusCode, Json<ServerInfo>)> {
    let caller = caller_for_server(&principal, &body.server_id)?;
    let now = Timestamp::now();
    let live_after = Timestamp::from_millis(
        now.as_millis() - i64::try_from(state.config.server_timeout.as_millis()).unwrap_or(0),
    );
    let registration = gantry_store::ServerRegistration {
        server_id: &body.server_id,
        url: &body.url,
        version: &body.version,
        // A registration through the API is its own incarnation.
        incarnation: &format!("api:{}", gantry_auth::secrets::random_alphanumeric(12)),
        session_pid: None,
    };
    match state
        .store
        .register_server(&registration, now, live_after)
        .await?
    {
        Ok(record) => {
            tracing::info!(by = %caller, server_id = %record.server_id, url = %record.url, "registered a server through the API");
            let info = registry::describe(vec![record], now, state.config.server_timeout, None);
            let info = info
                .into_iter()
                .next()
                .ok_or_else(|| ApiError::internal("the registered row was not returned"))?;
            Ok((StatusCode::CREATED, Json(info)))
        }
        Err(gantry_store::RegistryConflict::Duplicate(other)) => Err(ApiError::conflict(format!(
            "server_id {:?} is in use by an active server at {}; pick another id",
            other.server_id, other.url
        ))),
    }
}

/// Removes a server from the registry.
#[utoipa::path(post, path = "/api/v1/coordinator/servers/unregister/{server_id}", tag = "coordinator",
    security(("bearer" = [])), params(("server_id" = String, Path, description = "server id")),
    responses((status = 204), (status = 404, body = gantry_types::ErrorBody), (status = 401, body = gantry_types::ErrorBody)))]
pub async fn unregister(
    State(state): State<AppState>,
    Auth(principal): Auth,
    ApiPath(server_id): ApiPath<String>,
) -> ApiResult<StatusCode> {
    let caller = caller_for_server(&principal, &server_id)?;
    if !state.store.unregister_server(&server_id, None).await? {
        return Err(ApiError::not_found(format!(
            "no server {server_id:?} is registered"
        )));
    }
    tracing::info!(by = %caller, %server_id, "unregistered a server through the API");
    Ok(StatusCode::NO_CONTENT)
}

/// A registered server's heartbeat, with its load.
#[utoipa::path(post, path = "/api/v1/coordinator/heartbeat", tag = "coordinator", security(("bearer" = [])),
    request_body = ServerHeartbeat,
    responses((status = 200, body = ServerInfo), (status = 404, body = gantry_types::ErrorBody),
        (status = 422, body = gantry_types::ErrorBody), (status = 401, body = gantry_types::ErrorBody)))]
pub async fn heartbeat(
    State(state): State<AppState>,
    AdminOrServerAuth(principal): AdminOrServerAuth,
    ApiJson(body): ApiJson<ServerHeartbeat>,
) -> ApiResult<Json<ServerInfo>> {
    caller_for_server(&principal, &body.server_id)?;
    let now = Timestamp::now();
    let record = state
        .store
        .server_heartbeat(&body.server_id, None, None, body.load, None, now)
        .await?
        .ok_or_else(|| {
            ApiError::not_found(format!(
                "no server {:?} is registered; register it first",
                body.server_id
            ))
        })?;
    let info = registry::describe(vec![record], now, state.config.server_timeout, None);
    info.into_iter()
        .next()
        .map(Json)
        .ok_or_else(|| ApiError::internal("the heartbeat's row was not returned"))
}

/// The cluster at a glance: servers, the leader and its fencing token, workers, load.
#[utoipa::path(get, path = "/api/v1/coordinator/cluster", tag = "coordinator", security(("bearer" = [])),
    responses((status = 200, body = ClusterStatus), (status = 401, body = gantry_types::ErrorBody),
        (status = 403, body = gantry_types::ErrorBody)))]
pub async fn cluster(
    State(state): State<AppState>,
    Auth(principal): Auth,
) -> ApiResult<Json<ClusterStatus>> {
    coordinator_caller(&principal)?;
    let leader = leader_of(&state).await?;
    let servers = servers_of(&state).await?;
    let active: Vec<&ServerInfo> = servers.iter().filter(|s| s.active).collect();
    let total_load = active.iter().map(|s| s.load.inflight_requests).sum();
    let active_servers = u64::try_from(active.len()).unwrap_or(u64::MAX);
    let total_workers = state
        .store
        .count_workers_by_state()
        .await?
        .iter()
        .map(|(_, n)| n)
        .sum();
    Ok(Json(ClusterStatus {
        scheduling_mode: state.cluster.mode_name().to_string(),
        servers,
        active_servers,
        leader,
        total_workers,
        total_load,
    }))
}

/// Takes a lock (or renews it, for its owner).
#[utoipa::path(post, path = "/api/v1/coordinator/locks/acquire", tag = "coordinator", security(("bearer" = [])),
    request_body = LockAcquire,
    responses((status = 200, body = LockInfo), (status = 409, body = gantry_types::ErrorBody),
        (status = 422, body = gantry_types::ErrorBody), (status = 401, body = gantry_types::ErrorBody)))]
pub async fn acquire_lock(
    State(state): State<AppState>,
    AdminOrServerAuth(principal): AdminOrServerAuth,
    ApiJson(body): ApiJson<LockAcquire>,
) -> ApiResult<Json<LockInfo>> {
    coordinator_caller(&principal)?;
    let timeout = body
        .timeout_ms
        .map_or(state.config.lock_timeout, std::time::Duration::from_millis);
    match state
        .store
        .acquire_lock(&body.name, &body.owner, timeout, Timestamp::now())
        .await?
    {
        Ok(lock) => Ok(Json(lock)),
        Err(holder) => Err(ApiError::conflict(format!(
            "lock {:?} is held by {:?} until {}; try again later",
            holder.name, holder.owner, holder.expires_at
        ))),
    }
}

/// Releases a lock; only its owner may.
#[utoipa::path(post, path = "/api/v1/coordinator/locks/release", tag = "coordinator", security(("bearer" = [])),
    request_body = LockRelease,
    responses((status = 204), (status = 403, body = gantry_types::ErrorBody), (status = 404, body = gantry_types::ErrorBody),
        (status = 422, body = gantry_types::ErrorBody), (status = 401, body = gantry_types::ErrorBody)))]
pub async fn release_lock(
    State(state): State<AppState>,
    AdminOrServerAuth(principal): AdminOrServerAuth,
    ApiJson(body): ApiJson<LockRelease>,
) -> ApiResult<StatusCode> {
    coordinator_caller(&principal)?;
    match state
        .store
        .release_lock(&body.name, &body.owner, Timestamp::now())
        .await?
    {
        Released::Released => Ok(StatusCode::NO_CONTENT),
        Released::NotOwner { owner } => Err(ApiError::forbidden(format!(
            "lock {:?} is held by {owner:?}, not {:?}; only its owner may release it",
            body.name, body.owner
        ))),
        Released::NotHeld => Err(ApiError::not_found(format!(
            "lock {:?} is not held (never taken, released, or lapsed)",
            body.name
        ))),
    }
}

/// The locks held now.
#[utoipa::path(get, path = "/api/v1/coordinator/locks", tag = "coordinator", security(("bearer" = [])),
    responses((status = 200, body = LockList), (status = 401, body = gantry_types::ErrorBody),
        (status = 403, body = gantry_types::ErrorBody)))]
pub async fn locks(
    State(state): State<AppState>,
    Auth(principal): Auth,
) -> ApiResult<Json<LockList>> {
    coordinator_caller(&principal)?;
    Ok(Json(LockList {
        locks: state.store.held_locks(Timestamp::now()).await?,
    }))
}

/// This server's view: role, mode, token, whether the coordination tables answer.
#[utoipa::path(get, path = "/api/v1/coordinator/health", tag = "coordinator", security(("bearer" = [])),
    responses((status = 200, body = CoordinatorHealth), (status = 401, body = gantry_types::ErrorBody),
        (status = 403, body = gantry_types::ErrorBody)))]
pub async fn health(
    State(state): State<AppState>,
    Auth(principal): Auth,
) -> ApiResult<Json<CoordinatorHealth>> {
    coordinator_caller(&principal)?;
    let database = state.store.leader_lease().await.is_ok();
    Ok(Json(CoordinatorHealth {
        server_id: state.config.server_id.clone(),
        role: state.cluster.role(),
        scheduling_mode: state.cluster.mode_name().to_string(),
        fencing_token: state.cluster.coordinator.fencing_token(),
        database,
    }))
}
