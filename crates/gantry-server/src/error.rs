//! The one place where errors become HTTP responses: every management-API error is
//! `{"error": {"code", "message"}}` with the status its [`ErrorCode`] implies.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use gantry_auth::password::PasswordError;
use gantry_auth::{AuthError, Forbidden};
use gantry_store::StoreError;
use gantry_types::{ErrorBody, ErrorCode, ErrorDetail, FieldError};

/// An error on its way to the client.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    /// The HTTP status of the response.
    pub fn status(&self) -> StatusCode {
        StatusCode::from_u16(self.code.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidRequest, message)
    }

    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Unauthorized, message)
    }

    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Forbidden, message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::NotFound, message)
    }

    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Conflict, message)
    }

    pub fn validation(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::ValidationFailed, message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Internal, message)
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Unavailable, message)
    }
}

impl From<FieldError> for ApiError {
    fn from(e: FieldError) -> Self {
        Self::validation(e.to_string())
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound { .. } => Self::not_found(e.to_string()),
            StoreError::Conflict { .. } | StoreError::InUse { .. } => Self::conflict(e.to_string()),
            StoreError::Invalid(message) => Self::validation(message),
            StoreError::Unreachable(_) => {
                // Known before asking; the store logged when it became so.
                Self::unavailable("the database is not answering; try again shortly")
            }
            unavailable if unavailable.is_unavailable() => {
                tracing::warn!(error = %unavailable, "the database is not answering");
                Self::unavailable("the database is not answering; try again shortly")
            }
            other => {
                // Logged here, where it is turned into a response; the client gets a
                // message without database internals.
                tracing::error!(error = %other, "store operation failed");
                Self::internal("the database failed to answer; see the server log")
            }
        }
    }
}

/// A refused credential is a 401 with the authenticator's message; a store that did
/// not answer is what any store error is.
impl From<AuthError> for ApiError {
    fn from(e: AuthError) -> Self {
        match e {
            AuthError::Store(e) => e.into(),
            refused => Self::unauthorized(refused.to_string()),
        }
    }
}

impl From<Forbidden> for ApiError {
    fn from(e: Forbidden) -> Self {
        Self::forbidden(e.0)
    }
}

impl From<PasswordError> for ApiError {
    fn from(e: PasswordError) -> Self {
        Self::internal(e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code,
                message: self.message,
            },
        };
        let mut response = (status, Json(body)).into_response();
        if self.code == ErrorCode::Unavailable {
            // A 503 says when to come back.
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from_static(RETRY_UNAVAILABLE_AFTER_S),
            );
        }
        response
    }
}

/// The `Retry-After` of a 503 (seconds): a database that went away, a server shutting down.
pub const RETRY_UNAVAILABLE_AFTER_S: &str = "5";

/// Handler result type.
pub type ApiResult<T> = Result<T, ApiError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unreachable_database_is_a_503_with_retry_after_and_a_broken_query_a_500() {
        let response =
            ApiError::from(StoreError::Database(sqlx::Error::PoolTimedOut)).into_response();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()["retry-after"], RETRY_UNAVAILABLE_AFTER_S);
        let response =
            ApiError::from(StoreError::Database(sqlx::Error::RowNotFound)).into_response();
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert!(response.headers().get("retry-after").is_none());
    }
}
