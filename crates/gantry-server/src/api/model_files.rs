//! `/api/v1/model-files` (admin only): the files in the workers' model caches, asked of
//! each worker's own API (the cache lives on the worker's disk), and deleting one that no
//! instance uses.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use gantry_types::{
    CachedModelFile, ModelFile, ModelFileList, UnreachableWorker, Worker, WorkerFilter, WorkerState,
};
use serde::Deserialize;
use utoipa::IntoParams;

use crate::auth::Auth;
use crate::controllers::pass::EVERYTHING;
use crate::error::ApiResult;
use crate::extract::{ApiPath, ApiQuery};
use crate::service::worker_api::WorkerApi;
use crate::state::AppState;

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
    let api = WorkerApi::for_worker(&state.store, &state.worker_http, worker.clone()).await?;
    let response = api
        .send(api.request(reqwest::Method::GET, "/v1/model-files"))
        .await?;
    api.json(response, "a file list").await
}

/// Deletes a file from a worker's model cache: its blob or partial download and its
/// names. Refused (409) while an instance on that worker uses the file or it is being
/// downloaded.
#[utoipa::path(delete, path = "/api/v1/model-files/{worker_id}/{blob}", tag = "model-files", security(("bearer" = [])),
    params(("worker_id" = i64, Path, description = "worker id"),
        ("blob" = String, Path, description = "the file's `blob`, as listed: letters, digits, `-`, `_` and `.`, not starting with `.`",
            min_length = 1, max_length = 200, pattern = r"^[A-Za-z0-9_-][A-Za-z0-9._-]*$")),
    responses((status = 204), (status = 400, body = gantry_types::ErrorBody),
        (status = 403, body = gantry_types::ErrorBody), (status = 404, body = gantry_types::ErrorBody),
        (status = 409, body = gantry_types::ErrorBody), (status = 502, body = gantry_types::ErrorBody)))]
pub async fn delete(
    State(state): State<AppState>,
    Auth(principal): Auth,
    ApiPath((worker_id, blob)): ApiPath<(i64, String)>,
) -> ApiResult<StatusCode> {
    let admin = principal.require_admin()?;
    let api = WorkerApi::of(&state.store, &state.worker_http, worker_id).await?;
    api.send(api.request(reqwest::Method::DELETE, &format!("/v1/model-files/{blob}")))
        .await?;
    tracing::info!(by = %admin.username, worker_id, worker = %api.worker.name, blob, "deleted model file");
    Ok(StatusCode::NO_CONTENT)
}
