//! `/api/v1/workers` (admin only): list, show, delete, label, and the last hour of how busy
//! each was.

use axum::extract::State;
use axum::http::header::{HeaderName, HeaderValue, AUTHORIZATION, COOKIE};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::Json;
use gantry_store::Change;
use gantry_types::query::ListQuery;
use gantry_types::{
    ListResponse, ServerInfo, Timestamp, Worker, WorkerHistory, WorkerJoin, WorkerLabelsUpdate,
    WorkerQuery,
};

use crate::auth::{Auth, ClusterAdminAuth, Principal};
use crate::error::ApiResult;
use crate::extract::{ApiJson, ApiPath, ApiQuery};
use crate::service;
use crate::state::AppState;

/// Lists workers: every one for an admin, those of the clusters they administer for a
/// cluster administrator.
#[utoipa::path(get, path = "/api/v1/workers", tag = "workers", security(("bearer" = [])), params(WorkerQuery),
    responses((status = 200, body = ListResponse<Worker>), (status = 403, body = gantry_types::ErrorBody)))]
pub async fn list(
    State(state): State<AppState>,
    ClusterAdminAuth(principal): ClusterAdminAuth,
    ApiQuery(query): ApiQuery<WorkerQuery>,
) -> ApiResult<Response> {
    let mut filter = query.filter();
    filter.within_clusters = principal.visible_clusters();
    super::list_or_watch_filtered(&state, &query, filter, Change::worker).await
}

/// A worker, for an admin or the administrator of its cluster.
async fn worker_for(state: &AppState, principal: &Principal, id: i64) -> ApiResult<Worker> {
    let worker = state.store.get_worker(id).await?;
    principal.require_cluster_admin(worker.cluster_id)?;
    Ok(worker)
}

/// How a new machine joins the default cluster as a worker: the active servers' URLs, the
/// default cluster's registration token, and the `gantry worker` command line with both.
/// The token is `null` only while it is one from before clusters existed that just the
/// server holding it in its data directory knows. Other clusters: `GET
/// /api/v1/clusters/{id}/registration-token`.
#[utoipa::path(get, path = "/api/v1/workers/join", tag = "workers", security(("bearer" = [])),
    responses((status = 200, body = WorkerJoin), (status = 403, body = gantry_types::ErrorBody)))]
pub async fn join(
    State(state): State<AppState>,
    Auth(principal): Auth,
) -> ApiResult<Json<WorkerJoin>> {
    let admin = principal.require_admin()?;
    let joining = joining(&state, String::new()).await?;
    let join = service::workers::join(&state.store, &joining).await?;
    if join.token.is_some() {
        tracing::info!(by = %admin.username, "showed the worker registration token");
    }
    Ok(Json(join))
}

/// What showing a cluster's registration needs on this server: the sealer, the active
/// servers' URLs, the data directory, and the image a Kubernetes DaemonSet runs.
pub(crate) async fn joining(
    state: &AppState,
    image: String,
) -> ApiResult<service::clusters::Joining<'_>> {
    Ok(service::clusters::Joining {
        sealer: &state.registration_tokens,
        server_urls: active_server_urls(state).await?,
        data_dir: &state.config.data_dir,
        image,
    })
}

/// The active servers' URLs, this server's first: the one the caller reached is the
/// likeliest to be reachable.
async fn active_server_urls(state: &AppState) -> ApiResult<Vec<String>> {
    let mut server_urls = vec![state.cluster.url.clone()];
    for server in super::coordinator::servers_of(state).await? {
        if server.active && !server_urls.contains(&server.url) {
            server_urls.push(server.url);
        }
    }
    Ok(server_urls)
}

/// Shows a worker with its last reported hardware.
#[utoipa::path(get, path = "/api/v1/workers/{id}", tag = "workers", security(("bearer" = [])),
    params(("id" = i64, Path, description = "worker id")),
    responses((status = 200, body = Worker), (status = 404, body = gantry_types::ErrorBody)))]
pub async fn get(
    State(state): State<AppState>,
    ClusterAdminAuth(principal): ClusterAdminAuth,
    ApiPath(id): ApiPath<i64>,
) -> ApiResult<Json<Worker>> {
    Ok(Json(worker_for(&state, &principal, id).await?))
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
    state.histories.forget(id);
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
    ClusterAdminAuth(principal): ClusterAdminAuth,
    ApiPath(id): ApiPath<i64>,
    ApiJson(request): ApiJson<WorkerLabelsUpdate>,
) -> ApiResult<Json<Worker>> {
    let cluster_id = state.store.get_worker(id).await?.cluster_id;
    let admin = principal.require_cluster_admin(cluster_id)?;
    let worker = state.store.set_worker_labels(id, &request.labels).await?;
    tracing::info!(by = %admin.username, worker_id = id, "set worker labels");
    Ok(Json(worker))
}

#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct HistoryQuery {
    /// Only the samples this server heard (servers ask each other with it).
    pub local: Option<bool>,
}

impl gantry_types::Validate for HistoryQuery {
    fn validate(&self) -> Result<(), gantry_types::FieldError> {
        Ok(())
    }
}

/// How busy a worker was over the last hour: CPU, RAM and each GPU's memory and
/// utilisation, one sample per 10 s or so from its heartbeats, oldest first. Gathered from
/// every active server (each keeps what it heard); `servers_missing` names those that did
/// not answer.
#[utoipa::path(get, path = "/api/v1/workers/{id}/history", tag = "workers", security(("bearer" = [])),
    params(("id" = i64, Path, description = "worker id"), HistoryQuery),
    responses((status = 200, body = WorkerHistory), (status = 403, body = gantry_types::ErrorBody),
        (status = 404, body = gantry_types::ErrorBody)))]
pub async fn history(
    State(state): State<AppState>,
    ClusterAdminAuth(principal): ClusterAdminAuth,
    ApiPath(id): ApiPath<i64>,
    ApiQuery(query): ApiQuery<HistoryQuery>,
    headers: HeaderMap,
) -> ApiResult<Json<WorkerHistory>> {
    worker_for(&state, &principal, id).await?;
    let mine = state.histories.of(id, Timestamp::now());
    if query.local == Some(true) {
        return Ok(Json(WorkerHistory {
            worker_id: id,
            samples: mine,
            servers_missing: Vec::new(),
        }));
    }
    let peers: Vec<ServerInfo> = super::coordinator::servers_of(&state)
        .await?
        .into_iter()
        .filter(|s| s.active && s.server_id != state.config.server_id)
        .collect();
    let credentials: Vec<(HeaderName, HeaderValue)> = [AUTHORIZATION, COOKIE]
        .into_iter()
        .filter_map(|name| headers.get(&name).map(|value| (name, value.clone())))
        .collect();
    let asked = peers.into_iter().map(|peer| {
        let mut request = state
            .worker_http
            .get(format!(
                "{}/api/v1/workers/{id}/history?local=true",
                peer.url.trim_end_matches('/')
            ))
            .timeout(PEER_TIMEOUT);
        for (name, value) in &credentials {
            request = request.header(name, value);
        }
        async move {
            let answer = async {
                request
                    .send()
                    .await?
                    .error_for_status()?
                    .json::<WorkerHistory>()
                    .await
            }
            .await;
            (peer.server_id, answer)
        }
    });
    let mut parts = vec![mine];
    let mut servers_missing = Vec::new();
    for (server_id, answer) in futures_util::future::join_all(asked).await {
        match answer {
            Ok(part) => parts.push(part.samples),
            Err(e) => {
                tracing::warn!(server = %server_id, worker_id = id, error = %e, "a server did not give its part of a worker's history");
                servers_missing.push(server_id);
            }
        }
    }
    Ok(Json(WorkerHistory {
        worker_id: id,
        samples: crate::history::merge(parts),
        servers_missing,
    }))
}

/// How long another server has to give its part of a worker's history.
const PEER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);
