//! Errors of the OpenAI-compatible endpoints, in the shape OpenAI clients parse:
//! `{"error": {"message", "type", "param", "code"}}`. The management API keeps its own
//! shape (`gantry-server`'s `error.rs`); this is the one place that builds the gateway's.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use gantry_auth::AuthError;
use gantry_store::StoreError;
use serde::Serialize;
use utoipa::ToSchema;

/// An error on its way to a gateway client.
#[derive(Debug, Clone)]
pub struct OpenAiError {
    pub status: StatusCode,
    /// OpenAI's `type`: `invalid_request_error`, `permission_error`, `server_error`…
    pub kind: &'static str,
    /// OpenAI's `code`: a stable machine-readable reason.
    pub code: &'static str,
    /// The request field the error is about, when there is one.
    pub param: Option<&'static str>,
    pub message: String,
    /// Sent as `Retry-After` (whole seconds, at least 1).
    pub retry_after: Option<std::time::Duration>,
}

/// The JSON body of a gateway error.
#[derive(Debug, Serialize, ToSchema)]
pub struct OpenAiErrorBody {
    pub error: OpenAiErrorDetail,
}

/// What went wrong, as OpenAI describes errors.
#[derive(Debug, Serialize, ToSchema)]
pub struct OpenAiErrorDetail {
    pub message: String,
    /// `invalid_request_error`, `permission_error` or `server_error`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The request field the error is about.
    pub param: Option<String>,
    /// A stable reason: `invalid_api_key`, `model_not_found`, `missing_model`,
    /// `model_not_ready`, `upstream_error`, `upstream_timeout`…
    pub code: String,
}

impl OpenAiError {
    pub fn new(
        status: StatusCode,
        kind: &'static str,
        code: &'static str,
        message: impl Into<String>,
    ) -> Self {
        Self {
            status,
            kind,
            code,
            param: None,
            message: message.into(),
            retry_after: None,
        }
    }

    /// The same error, about a request field.
    pub fn with_param(mut self, param: &'static str) -> Self {
        self.param = Some(param);
        self
    }

    pub fn missing_api_key() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            "invalid_api_key",
            "missing API key: send Authorization: Bearer <API key>",
        )
    }

    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            code,
            message,
        )
    }

    pub fn model_not_found(model: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "model_not_found",
            format!(
                "the model `{model}` does not exist; GET /v1/models lists the models being served"
            ),
        )
        .with_param("model")
    }

    pub fn no_running_instance(model: &str) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "model_not_ready",
            format!("the model `{model}` has no running instance right now; retry later"),
        )
        .with_param("model")
    }

    /// Every instance the request was sent to left routing (or failed) before
    /// answering, and none is left.
    pub fn no_running_instance_left(model: &str, tries: &str) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "model_not_ready",
            format!("the model `{model}` has no running instance left; retry later ({tries})"),
        )
        .with_param("model")
    }

    /// No target of a route can take a request now.
    pub fn no_available_target(route: &str, reasons: &str) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "model_not_ready",
            format!(
                "no target of the route `{route}` is available right now ({reasons}); retry later"
            ),
        )
        .with_param("model")
    }

    /// No instance sent a response head within `gateway_first_byte_timeout`.
    pub fn gateway_timeout(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::GATEWAY_TIMEOUT,
            "server_error",
            "upstream_timeout",
            message,
        )
    }

    pub fn bad_gateway(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_GATEWAY,
            "server_error",
            "upstream_error",
            message,
        )
    }

    /// A key past its requests- or tokens-per-minute limit.
    pub fn rate_limited(message: impl Into<String>, retry_after: std::time::Duration) -> Self {
        let mut error = Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            "rate_limit_exceeded",
            message,
        );
        error.retry_after = Some(retry_after);
        error
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            "internal_error",
            message,
        )
    }
}

/// Authentication failures come from the shared authenticator: a refused credential is
/// a 401 with its message, a store that did not answer a 500 (a row that vanished
/// between two reads, a 404).
impl From<AuthError> for OpenAiError {
    fn from(e: AuthError) -> Self {
        match e {
            AuthError::Store(e @ StoreError::NotFound { .. }) => Self::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                "invalid_request",
                e.to_string(),
            ),
            AuthError::Store(e) => {
                // Logged here, where it becomes a response; the client gets a message
                // without database internals.
                tracing::error!(error = %e, "store operation failed while authenticating a gateway request");
                Self::internal("the database failed to answer; see the server log")
            }
            refused => Self::new(
                StatusCode::UNAUTHORIZED,
                "invalid_request_error",
                "invalid_api_key",
                refused.to_string(),
            ),
        }
    }
}

impl OpenAiError {
    /// The JSON body sent to the client.
    pub fn body(&self) -> Vec<u8> {
        let body = OpenAiErrorBody {
            error: OpenAiErrorDetail {
                message: self.message.clone(),
                kind: self.kind.to_string(),
                param: self.param.map(str::to_string),
                code: self.code.to_string(),
            },
        };
        // Serialising a struct of strings cannot fail; an empty body would still carry
        // the status.
        serde_json::to_vec(&body).unwrap_or_default()
    }

    /// `Retry-After` in whole seconds, rounded up (a client that waits this long is
    /// admitted), at least 1.
    pub fn retry_after_seconds(&self) -> Option<u64> {
        self.retry_after
            .map(|after| (after.as_secs() + u64::from(after.subsec_nanos() > 0)).max(1))
    }
}

impl IntoResponse for OpenAiError {
    fn into_response(self) -> Response {
        let bytes = self.body();
        let retry_after = self.retry_after_seconds();
        let mut response = (
            self.status,
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            bytes,
        )
            .into_response();
        if let Some(seconds) = retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}
