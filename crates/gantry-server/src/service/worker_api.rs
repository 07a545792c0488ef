//! Calls from this server to a worker's own API (its model cache, its installed
//! backends): the worker's address and token come from the store, and every failure is an
//! [`ApiError`] that names the worker — unreachable (502), or the worker's own refusal
//! passed on with the same status (400, 404, 409).

use std::time::Duration;

use gantry_store::Store;
use gantry_types::{ErrorCode, Worker};
use serde::de::DeserializeOwned;

use crate::error::{ApiError, ApiResult};

/// How long one call may take unless the caller says otherwise.
pub const WORKER_TIMEOUT: Duration = Duration::from_secs(5);

/// One worker's API, ready to call.
pub struct WorkerApi<'a> {
    pub worker: Worker,
    token: String,
    http: &'a reqwest::Client,
}

impl<'a> WorkerApi<'a> {
    /// The API of worker `worker_id` (404 when there is no such worker).
    pub async fn of(store: &Store, http: &'a reqwest::Client, worker_id: i64) -> ApiResult<Self> {
        let worker = store.get_worker(worker_id).await?;
        Self::for_worker(store, http, worker).await
    }

    /// The API of `worker`, read already.
    pub async fn for_worker(
        store: &Store,
        http: &'a reqwest::Client,
        worker: Worker,
    ) -> ApiResult<Self> {
        let token = store.worker_api_token(worker.id).await?;
        Ok(Self {
            worker,
            token,
            http,
        })
    }

    /// A request to `path` on the worker, authenticated, with [`WORKER_TIMEOUT`].
    pub fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.http
            .request(
                method,
                gantry_types::worker::worker_api_url(&self.worker.address, path),
            )
            .bearer_auth(&self.token)
            .timeout(WORKER_TIMEOUT)
    }

    /// Sends `request`: a success as it came, anything else as an [`ApiError`] naming the
    /// worker.
    pub async fn send(&self, request: reqwest::RequestBuilder) -> ApiResult<reqwest::Response> {
        let response = request.send().await.map_err(|e| self.unreachable(&e))?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let text = response.text().await.unwrap_or_default();
        let text = text.trim();
        let name = &self.worker.name;
        Err(match status.as_u16() {
            400 => ApiError::bad_request(format!("worker {name}: {text}")),
            404 => ApiError::not_found(format!("worker {name}: {text}")),
            409 => ApiError::conflict(format!("worker {name}: {text}")),
            _ => ApiError::new(
                ErrorCode::WorkerError,
                format!("worker {name} answered {status}: {text}"),
            ),
        })
    }

    /// The body of a successful answer, read as JSON.
    pub async fn json<T: DeserializeOwned>(
        &self,
        response: reqwest::Response,
        what: &str,
    ) -> ApiResult<T> {
        response.json().await.map_err(|e| {
            ApiError::new(
                ErrorCode::WorkerError,
                format!(
                    "worker {} sent {what} that cannot be read: {e}",
                    self.worker.name
                ),
            )
        })
    }

    fn unreachable(&self, error: &reqwest::Error) -> ApiError {
        ApiError::new(
            ErrorCode::WorkerUnreachable,
            format!(
                "cannot reach worker {} at {}: {error}; is the worker running and its address \
                 reachable from this server?",
                self.worker.name, self.worker.address
            ),
        )
    }
}
