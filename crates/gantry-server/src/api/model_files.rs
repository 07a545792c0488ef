//! `/api/v1/model-files` (admin only): the files in the workers' model caches, asked of
//! each worker's own API (the cache lives on the worker's disk), and deleting one that no
//! instance uses.

use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use gantry_types::{
    CachedModelFile, ErrorCode, ModelFile, ModelFileList, UnreachableWorker, Worker, WorkerFilter,
    WorkerState,
};
use serde::Deserialize;
use utoipa::IntoParams;

use crate::auth::Auth;
use crate::controllers::pass::EVERYTHING;
use crate::error::{ApiError, ApiResult};
use crate::extract::{ApiPath, ApiQuery};
use crate::state::AppState;

/// How long one worker may take to list its files.
const WORKER_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ModelFileQuery {
    /// Only this worker's files.
    pub worker_id: Option<i64>,
}

impl gantry_types::Validate for ModelFileQuery {
    fn validate(&self) -> Result<(), gantry_types::FieldError> {
        Ok(())
    }
}

/// Lists the files of every reachable worker's model cache (or one worker's): their
/// names in model directories, size, state (`ready`, `downloading` with bytes done,
/// `partial` for an interrupted download, `error`) and the models that use them.
/// Workers that do not answer are listed under `unreachable`.
#[utoipa::path(get, path = "/api/v1/model-files", tag = "model-files", security(("bearer" = [])),
    params(ModelFileQuery),
    responses((status = 200, body = ModelFileList), (status = 403, body = gantry_types::ErrorBody),
        (status = 404, body = gantry_types::ErrorBody)))]
pub async fn list(
    State(state): State<AppState>,
    Auth(principal): Auth,
    ApiQuery(query): ApiQuery<ModelFileQuery>,
) -> ApiResult<Json<ModelFileList>> {
    principal.require_admin()?;
    let workers: Vec<Worker> = match query.worker_id {
        Some(id) => vec![state.store.get_worker(id).await?],
        None => {
            state
                .store
                .list_workers(&WorkerFilter::default(), EVERYTHING)
                .await?
                .0
        }
    };
    let asked = workers
        .into_iter()
        .filter(|w| w.state != WorkerState::Unreachable)
        .map(|worker| {
            let state = state.clone();
            async move {
                let answer = files_of(&state, &worker).await;
                (worker, answer)
            }
        });
    let mut list = ModelFileList {
        items: Vec::new(),
        unreachable: Vec::new(),
    };
    for (worker, answer) in futures_util::future::join_all(asked).await {
        match answer {
            Ok(files) => list.items.extend(files.into_iter().map(|file| ModelFile {
                id: format!("{}/{}", worker.id, file.blob),
                worker_id: worker.id,
                worker_name: worker.name.clone(),
                file,
            })),
            Err(e) => list.unreachable.push(UnreachableWorker {
                worker_id: worker.id,
                worker_name: worker.name,
                error: e.message,
            }),
        }
    }
    Ok(Json(list))
}

async fn files_of(state: &AppState, worker: &Worker) -> ApiResult<Vec<CachedModelFile>> {
    let token = state.store.worker_api_token(worker.id).await?;
    let response = state
        .worker_http
        .get(gantry_types::worker::worker_api_url(
            &worker.address,
            "/v1/model-files",
        ))
        .bearer_auth(token)
        .timeout(WORKER_TIMEOUT)
        .send()
        .await
        .map_err(|e| unreachable(worker, &e))?;
    let response = worker_status(worker, response).await?;
    response.json().await.map_err(|e| {
        ApiError::new(
            ErrorCode::WorkerError,
            format!(
                "worker {} sent a file list that cannot be read: {e}",
                worker.name
            ),
        )
    })
}

/// Deletes a file from a worker's model cache: its blob or partial download and its
/// names. Refused (409) while an instance on that worker uses the file or it is being
/// downloaded.
#[utoipa::path(delete, path = "/api/v1/model-files/{worker_id}/{blob}", tag = "model-files", security(("bearer" = [])),
    params(("worker_id" = i64, Path, description = "worker id"),
        ("blob" = String, Path, description = "the file's `blob`, as listed")),
    responses((status = 204), (status = 400, body = gantry_types::ErrorBody),
        (status = 403, body = gantry_types::ErrorBody), (status = 404, body = gantry_types::ErrorBody),
        (status = 409, body = gantry_types::ErrorBody), (status = 502, body = gantry_types::ErrorBody)))]
pub async fn delete(
    State(state): State<AppState>,
    Auth(principal): Auth,
    ApiPath((worker_id, blob)): ApiPath<(i64, String)>,
) -> ApiResult<StatusCode> {
    let admin = principal.require_admin()?;
    let worker = state.store.get_worker(worker_id).await?;
    let token = state.store.worker_api_token(worker.id).await?;
    let response = state
        .worker_http
        .delete(gantry_types::worker::worker_api_url(
            &worker.address,
            &format!("/v1/model-files/{blob}"),
        ))
        .bearer_auth(token)
        .timeout(WORKER_TIMEOUT)
        .send()
        .await
        .map_err(|e| unreachable(&worker, &e))?;
    worker_status(&worker, response).await?;
    tracing::info!(by = %admin.username, worker_id, worker = %worker.name, blob, "deleted model file");
    Ok(StatusCode::NO_CONTENT)
}

fn unreachable(worker: &Worker, error: &reqwest::Error) -> ApiError {
    ApiError::new(
        ErrorCode::WorkerUnreachable,
        format!(
            "cannot reach worker {} at {}: {error}; is the worker running and its address \
             reachable from this server?",
            worker.name, worker.address
        ),
    )
}

/// Passes a success; turns the worker's refusal into the same answer from the server.
async fn worker_status(
    worker: &Worker,
    response: reqwest::Response,
) -> ApiResult<reqwest::Response> {
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let text = response.text().await.unwrap_or_default();
    let text = text.trim();
    Err(match status.as_u16() {
        400 => ApiError::bad_request(text.to_owned()),
        404 => ApiError::not_found(format!("worker {}: {text}", worker.name)),
        409 => ApiError::conflict(format!("worker {}: {text}", worker.name)),
        _ => ApiError::new(
            ErrorCode::WorkerError,
            format!("worker {} answered {status}: {text}", worker.name),
        ),
    })
}
