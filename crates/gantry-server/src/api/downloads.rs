//! `GET /downloads/gantry`: this server's own gantry executable, which new pool machines
//! install (their set-up script fetches it), so workers run the servers' version. Open
//! to anyone, like the software itself; it names its version in `x-gantry-version`.

use axum::body::Body;
use axum::extract::State;
use axum::http::header::{CONTENT_DISPOSITION, CONTENT_LENGTH, CONTENT_TYPE};
use axum::http::HeaderValue;
use axum::response::{IntoResponse, Response};

use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

/// The gantry executable this server runs (or its `gantry_program`), for machines of the
/// servers' platform to install.
#[utoipa::path(get, path = "/downloads/gantry", tag = "health",
    responses((status = 200, description = "the executable", content_type = "application/octet-stream"),
        (status = 500, body = gantry_types::ErrorBody)))]
pub async fn gantry(State(state): State<AppState>) -> ApiResult<Response> {
    let path = state.config.gantry_program().map_err(|e| {
        ApiError::internal(format!(
            "cannot tell where this gantry's executable is: {e}"
        ))
    })?;
    let file = tokio::fs::File::open(&path).await.map_err(|e| {
        ApiError::internal(format!(
            "cannot read this gantry's executable {}: {e}",
            path.display()
        ))
    })?;
    let length = file
        .metadata()
        .await
        .map_err(|e| ApiError::internal(format!("cannot read {}: {e}", path.display())))?
        .len();
    let body = Body::from_stream(tokio_util::io::ReaderStream::new(file));
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    headers.insert(CONTENT_LENGTH, HeaderValue::from(length));
    headers.insert(
        CONTENT_DISPOSITION,
        HeaderValue::from_static("attachment; filename=\"gantry\""),
    );
    headers.insert(
        "x-gantry-version",
        HeaderValue::from_static(env!("CARGO_PKG_VERSION")),
    );
    Ok(response)
}
