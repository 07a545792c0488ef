//! `/api/v1/model-files/uploads` (admin): files uploaded to the servers to deploy as
//! `{"type": "upload", "id": …}` (`staging.rs` keeps them).
//!
//! An upload is created with its name, size and (optionally) SHA-256, then its bytes
//! are appended with `PATCH` requests carrying `Upload-Offset` (where they start, as in
//! the tus protocol): an interrupted upload continues from the `bytes_received` that
//! `GET` (or `HEAD`) shows. When the last byte arrives the file is hashed and checked, and
//! the upload becomes `ready`. Workers download it through a signed URL
//! (`GET /api/v1/worker/uploads/{id}` gives one); the `…/content` endpoint checks the
//! signature, not a bearer token.

use axum::body::Body;
use axum::extract::{OriginalUri, Request, State};
use axum::http::header::{CONTENT_TYPE, LOCATION};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::StreamExt;
use gantry_types::{
    ErrorCode, ModelFilter, ModelSource, StagedUpload, Upload, UploadCreate, UploadList,
    UploadState,
};
use serde::Deserialize;
use tokio::io::AsyncWriteExt;
use tower::ServiceExt;
use utoipa::IntoParams;

use crate::auth::AdminAuth;
use crate::auth::{Auth, Principal};
use crate::controllers::pass::EVERYTHING;
use crate::error::{ApiError, ApiResult};
use crate::extract::{ApiJson, ApiPath, ApiQuery};
use crate::staging::Staging;
use crate::state::AppState;

/// Where a `PATCH` starts, and (in answers) how many bytes the upload has.
pub const UPLOAD_OFFSET: HeaderName = HeaderName::from_static("upload-offset");

/// The upload as this server sees it: the bytes on its disk when it holds it.
fn current(state: &AppState, mut upload: Upload) -> Upload {
    if state.staging.is_here(&upload) {
        upload.bytes_received = state.staging.received_here(&upload);
    }
    upload
}

/// The upload as JSON, with its offset in `Upload-Offset`.
fn answer(status: StatusCode, upload: Upload) -> Response {
    let offset = HeaderValue::from(upload.bytes_received);
    (status, [(UPLOAD_OFFSET, offset)], Json(upload)).into_response()
}

/// A redirect of this request (`request_uri`: its path and query as sent, before the
/// router's nesting strips a prefix) to the server that holds the upload's bytes.
async fn to_holder(state: &AppState, upload: &Upload, request_uri: &str) -> ApiResult<Response> {
    let base = state.staging.holder_url(&state.store, upload).await?;
    let target = format!("{base}{request_uri}");
    let location = HeaderValue::from_str(&target)
        .map_err(|_| ApiError::internal(format!("the holder's URL {target} is not a header")))?;
    Ok((StatusCode::TEMPORARY_REDIRECT, [(LOCATION, location)]).into_response())
}

/// Starts an upload: its name, size and optional SHA-256. The bytes follow with `PATCH`.
/// Refused (413) above `upload_max_size` or when the server's disk cannot hold it.
#[utoipa::path(post, path = "/api/v1/model-files/uploads", tag = "model-files", security(("bearer" = [])),
    request_body = UploadCreate,
    responses((status = 201, body = Upload), (status = 403, body = gantry_types::ErrorBody),
        (status = 413, body = gantry_types::ErrorBody), (status = 422, body = gantry_types::ErrorBody)))]
pub async fn create(
    State(state): State<AppState>,
    AdminAuth(principal): AdminAuth,
    ApiJson(request): ApiJson<UploadCreate>,
) -> ApiResult<Response> {
    let admin = principal.require_admin()?;
    if request.size > state.staging.max_size {
        // The body is small; what it declares is out of range (the spec says so: the
        // schema's maximum is this server's limit).
        return Err(ApiError::validation(format!(
            "size: {} is larger than this server accepts (upload_max_size = {} bytes)",
            request.size, state.staging.max_size
        )));
    }
    state.staging.check_free_space(request.size)?;
    let upload = state
        .store
        .create_upload(&request, &state.staging.here(), admin.id)
        .await?;
    if let Err(e) = state.staging.prepare(&upload).await {
        let _ = state.store.delete_upload(upload.id).await;
        return Err(e);
    }
    tracing::info!(by = %admin.username, upload_id = upload.id, name = %upload.name, bytes = upload.size, "upload started");
    Ok(answer(StatusCode::CREATED, upload))
}

/// Every upload, newest first.
#[utoipa::path(get, path = "/api/v1/model-files/uploads", tag = "model-files", security(("bearer" = [])),
    responses((status = 200, body = UploadList), (status = 403, body = gantry_types::ErrorBody)))]
pub async fn list(
    State(state): State<AppState>,
    Auth(principal): Auth,
) -> ApiResult<Json<UploadList>> {
    principal.require_admin()?;
    let items = state.store.list_uploads().await?;
    let items = items.into_iter().map(|u| current(&state, u)).collect();
    Ok(Json(UploadList { items }))
}

/// An upload, with `bytes_received` (also in `Upload-Offset`): where its next `PATCH`
/// starts.
#[utoipa::path(get, path = "/api/v1/model-files/uploads/{id}", tag = "model-files", security(("bearer" = [])),
    params(("id" = i64, Path, description = "upload id")),
    responses((status = 200, body = Upload), (status = 403, body = gantry_types::ErrorBody),
        (status = 404, body = gantry_types::ErrorBody)))]
pub async fn get(
    State(state): State<AppState>,
    Auth(principal): Auth,
    ApiPath(id): ApiPath<i64>,
) -> ApiResult<Response> {
    principal.require_admin()?;
    let upload = state.store.get_upload(id).await?;
    Ok(answer(StatusCode::OK, current(&state, upload)))
}

/// Appends bytes to an upload: the raw bytes as the body
/// (`Content-Type: application/offset+octet-stream` or `application/octet-stream`), and
/// `Upload-Offset` saying where they start, which must be `bytes_received` (409 with the
/// right offset otherwise). The body may be cut off: what arrived is kept, and the next
/// `PATCH` continues from it. The request that brings the last byte gets the checked,
/// `ready` upload; wrong bytes (a SHA-256 other than the declared one) are discarded
/// (422 naming both digests). Sent to a server that does not hold the upload, it is
/// redirected (307) to the one that does.
#[utoipa::path(patch, path = "/api/v1/model-files/uploads/{id}", tag = "model-files", security(("bearer" = [])),
    params(("id" = i64, Path, description = "upload id"),
        ("Upload-Offset" = u64, Header, description = "where the body's bytes start")),
    request_body(content = Vec<u8>, content_type = "application/offset+octet-stream"),
    responses((status = 200, body = Upload), (status = 307, description = "held by another server"),
        (status = 400, body = gantry_types::ErrorBody), (status = 403, body = gantry_types::ErrorBody),
        (status = 404, body = gantry_types::ErrorBody), (status = 409, body = gantry_types::ErrorBody),
        (status = 413, body = gantry_types::ErrorBody), (status = 415, body = gantry_types::ErrorBody),
        (status = 422, body = gantry_types::ErrorBody)))]
pub async fn append(
    State(state): State<AppState>,
    Auth(principal): Auth,
    ApiPath(id): ApiPath<i64>,
    OriginalUri(uri): OriginalUri,
    request: Request,
) -> ApiResult<Response> {
    let admin = principal.require_admin()?;
    let upload = state.store.get_upload(id).await?;
    if upload.state == UploadState::Ready {
        return Err(ApiError::conflict(format!(
            "upload {id} ({}) is complete; create another upload to send another file",
            upload.name
        )));
    }
    if !state.staging.is_here(&upload) {
        return to_holder(&state, &upload, &uri.to_string()).await;
    }
    let headers = request.headers();
    let content_type = headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if !matches!(
        content_type.split(';').next().unwrap_or_default().trim(),
        "application/offset+octet-stream" | "application/octet-stream"
    ) {
        return Err(ApiError::new(
            ErrorCode::UnsupportedMediaType,
            "send the file's bytes with Content-Type: application/offset+octet-stream",
        ));
    }
    let offset = offset_of(headers)?;
    let Some(_writing) = state.staging.start_writing(id) else {
        return Err(ApiError::conflict(format!(
            "another request is writing upload {id} now; wait for it, then continue from the \
             Upload-Offset that GET shows"
        )));
    };
    let have = state.staging.received_here(&upload);
    if offset != have {
        let body = ApiError::conflict(format!(
            "upload {id} has {have} bytes; send Upload-Offset: {have} to continue"
        ));
        let mut response = body.into_response();
        response
            .headers_mut()
            .insert(UPLOAD_OFFSET, HeaderValue::from(have));
        return Ok(response);
    }
    let (received, outcome) = receive(&state.staging, &upload, have, request.into_body()).await;
    state.store.set_upload_received(id, received).await?;
    outcome?;
    if received < upload.size {
        let upload = current(&state, state.store.get_upload(id).await?);
        return Ok(answer(StatusCode::OK, upload));
    }
    let done = match state.staging.complete(&upload).await {
        Ok(done) => done,
        Err(e) => {
            state
                .store
                .set_upload_received(id, state.staging.received_here(&upload))
                .await?;
            return Err(e);
        }
    };
    let upload = state.store.finish_upload(id, &done).await?;
    tracing::info!(by = %admin.username, upload_id = id, name = %upload.name, "upload ready");
    Ok(answer(StatusCode::OK, upload))
}

/// The `Upload-Offset` header.
fn offset_of(headers: &HeaderMap) -> ApiResult<u64> {
    let value = headers.get(&UPLOAD_OFFSET).ok_or_else(|| {
        ApiError::bad_request(
            "send Upload-Offset: the upload's bytes_received (0 for a new upload)",
        )
    })?;
    value
        .to_str()
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| ApiError::bad_request("Upload-Offset must be a whole number of bytes"))
}

/// Appends the body to the upload's file; returns the bytes it has afterwards, and how
/// the body ended (a body longer than the declared size is refused past the size).
async fn receive(
    staging: &Staging,
    upload: &Upload,
    mut have: u64,
    body: Body,
) -> (u64, ApiResult<()>) {
    let part = staging.part_of(upload);
    let disk =
        |e: std::io::Error| ApiError::internal(format!("cannot write {}: {e}", part.display()));
    let mut file = match tokio::fs::OpenOptions::new().append(true).open(&part).await {
        Ok(file) => file,
        Err(e) => return (have, Err(disk(e))),
    };
    let mut stream = body.into_data_stream();
    let mut outcome = Ok(());
    while let Some(chunk) = stream.next().await {
        let chunk = match chunk {
            Ok(chunk) => chunk,
            // The client went away: keep what arrived.
            Err(e) => {
                tracing::info!(upload_id = upload.id, bytes = have, error = %e, "upload request ended early; it continues from its offset");
                break;
            }
        };
        let room = usize::try_from(upload.size - have).unwrap_or(usize::MAX);
        let fits = &chunk[..chunk.len().min(room)];
        if let Err(e) = file.write_all(fits).await {
            outcome = Err(disk(e));
            break;
        }
        have += fits.len() as u64;
        if fits.len() < chunk.len() {
            outcome = Err(ApiError::new(
                ErrorCode::PayloadTooLarge,
                format!(
                    "upload {} was declared as {} bytes; the bytes past that were refused",
                    upload.id, upload.size
                ),
            ));
            break;
        }
    }
    if let Err(e) = file.flush().await {
        outcome = Err(disk(e));
    }
    (have, outcome)
}

/// Deletes an upload and its bytes; refused (409) while a model uses it.
#[utoipa::path(delete, path = "/api/v1/model-files/uploads/{id}", tag = "model-files", security(("bearer" = [])),
    params(("id" = i64, Path, description = "upload id")),
    responses((status = 204), (status = 307, description = "held by another server"),
        (status = 403, body = gantry_types::ErrorBody),
        (status = 404, body = gantry_types::ErrorBody), (status = 409, body = gantry_types::ErrorBody)))]
pub async fn delete(
    State(state): State<AppState>,
    Auth(principal): Auth,
    ApiPath(id): ApiPath<i64>,
    OriginalUri(uri): OriginalUri,
) -> ApiResult<Response> {
    let admin = principal.require_admin()?;
    let upload = state.store.get_upload(id).await?;
    if Staging::holder(&upload).is_some() && !state.staging.is_here(&upload) {
        return to_holder(&state, &upload, &uri.to_string()).await;
    }
    let users: Vec<String> = state
        .store
        .list_models(&ModelFilter::default(), EVERYTHING)
        .await?
        .0
        .into_iter()
        .filter(|m| matches!(m.source, ModelSource::Upload { id: used } if used == id))
        .map(|m| m.name)
        .collect();
    if !users.is_empty() {
        return Err(ApiError::conflict(format!(
            "upload {id} is the source of model(s) {}; delete or change them first",
            users.join(", ")
        )));
    }
    let Some(_writing) = state.staging.start_writing(id) else {
        return Err(ApiError::conflict(format!(
            "a request is writing upload {id} now; try again when it ends"
        )));
    };
    state.staging.remove(&upload).await?;
    state.store.delete_upload(id).await?;
    tracing::info!(by = %admin.username, upload_id = id, name = %upload.name, "deleted upload");
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ContentQuery {
    /// When the URL stops working (milliseconds since the epoch).
    pub expires: i64,
    /// The URL's signature (hex).
    pub signature: String,
}

impl gantry_types::Validate for ContentQuery {
    fn validate(&self) -> Result<(), gantry_types::FieldError> {
        Ok(())
    }
}

/// The bytes of a complete upload, through a signed URL (from
/// `GET /api/v1/worker/uploads/{id}`), no bearer token needed. `Range` requests are
/// honoured. A server that does not hold the bytes redirects (307) to the one that does,
/// or to the S3 object.
#[utoipa::path(get, path = "/api/v1/model-files/uploads/{id}/content", tag = "model-files",
    params(("id" = i64, Path, description = "upload id"), ContentQuery),
    responses((status = 200, description = "the file", content_type = "application/octet-stream"),
        (status = 206, description = "the range asked for"),
        (status = 307, description = "held elsewhere"), (status = 403, body = gantry_types::ErrorBody),
        (status = 404, body = gantry_types::ErrorBody), (status = 409, body = gantry_types::ErrorBody)))]
pub async fn content(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<i64>,
    ApiQuery(query): ApiQuery<ContentQuery>,
    OriginalUri(uri): OriginalUri,
    request: Request,
) -> ApiResult<Response> {
    if !state.staging.verify(id, query.expires, &query.signature) {
        return Err(ApiError::forbidden(
            "the download URL is not valid (wrong signature, or expired after a day); ask \
             GET /api/v1/worker/uploads/{id} for a new one",
        ));
    }
    let upload = state.store.get_upload(id).await?;
    if upload.state != UploadState::Ready {
        return Err(ApiError::conflict(format!(
            "upload {id} is not complete: {} of {} bytes received",
            upload.bytes_received, upload.size
        )));
    }
    if Staging::holder(&upload).is_none() {
        // In S3: a presigned URL of the object.
        let staged = state.staging.staged(&upload, None).await?;
        let location = HeaderValue::from_str(&staged.url)
            .map_err(|_| ApiError::internal("the signed URL is not a header value"))?;
        return Ok((StatusCode::TEMPORARY_REDIRECT, [(LOCATION, location)]).into_response());
    }
    if !state.staging.is_here(&upload) {
        return to_holder(&state, &upload, &uri.to_string()).await;
    }
    let file = state.staging.file_of(&upload);
    let served = tower_http::services::ServeFile::new(&file)
        .oneshot(request)
        .await
        .map_err(|e| ApiError::internal(format!("cannot read {}: {e}", file.display())))?;
    Ok(served.map(Body::new))
}

/// Where the calling worker downloads a complete upload: its name, size, SHA-256 and a
/// signed URL (a path on this server, or a presigned S3 URL), valid for a day.
#[utoipa::path(get, path = "/api/v1/worker/uploads/{id}", tag = "worker-agent", security(("bearer" = [])),
    params(("id" = i64, Path, description = "upload id")),
    responses((status = 200, body = StagedUpload), (status = 403, body = gantry_types::ErrorBody),
        (status = 404, body = gantry_types::ErrorBody), (status = 409, body = gantry_types::ErrorBody)))]
pub async fn staged(
    State(state): State<AppState>,
    Auth(principal): Auth,
    ApiPath(id): ApiPath<i64>,
) -> ApiResult<Json<StagedUpload>> {
    if !matches!(principal, Principal::Worker { .. }) {
        principal.require_admin()?;
    }
    let upload = state.store.get_upload(id).await?;
    Ok(Json(state.staging.staged(&upload, None).await?))
}
