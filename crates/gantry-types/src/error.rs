//! The one JSON shape every management-API error takes:
//! `{"error": {"code": "...", "message": "..."}}`, and every code it can carry.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The body of every error response from the management API.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

/// A machine-readable `code` and a message for people.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
pub struct ErrorDetail {
    pub code: ErrorCode,
    /// What went wrong and, where it helps, what to do next. Names the offending field.
    pub message: String,
}

/// Every `code` the management API answers with; stable, snake_case on the wire. Each
/// code implies its HTTP status ([`ErrorCode::status`]), so a handler names the code and
/// never a status of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// 400: the request is malformed (bad JSON, a bad path or query parameter).
    InvalidRequest,
    /// 401: no credentials, or credentials that are not (or no longer) valid.
    Unauthorized,
    /// 403: valid credentials without the right to do this.
    Forbidden,
    /// 403: the user must change the password before anything else.
    PasswordChangeRequired,
    /// 404: no such object or route.
    NotFound,
    /// 405: the route exists, the method does not.
    MethodNotAllowed,
    /// 409: the request clashes with what is stored (a name in use, a state that forbids it).
    Conflict,
    /// 413: the body is larger than the endpoint accepts.
    PayloadTooLarge,
    /// 415: the body is not JSON.
    UnsupportedMediaType,
    /// 422: the body is JSON of the right shape, but a field's value is not acceptable.
    ValidationFailed,
    /// 429: too many attempts (failed logins); `Retry-After` says when to try again.
    TooManyRequests,
    /// 500: the server failed (its log says why).
    Internal,
    /// 502: the worker holding the object could not be reached.
    WorkerUnreachable,
    /// 502: the worker holding the object answered with an error.
    WorkerError,
    /// 502: a model provider could not be reached or answered with an error.
    ProviderError,
    /// 503: the server cannot serve this now (shutting down, database unavailable).
    Unavailable,
    /// Only in watch streams: the stream fell behind and was ended; list and watch again.
    WatchLagged,
}

impl ErrorCode {
    /// Every code, for documentation and tests.
    pub const ALL: [ErrorCode; 17] = [
        ErrorCode::InvalidRequest,
        ErrorCode::Unauthorized,
        ErrorCode::Forbidden,
        ErrorCode::PasswordChangeRequired,
        ErrorCode::NotFound,
        ErrorCode::MethodNotAllowed,
        ErrorCode::Conflict,
        ErrorCode::PayloadTooLarge,
        ErrorCode::UnsupportedMediaType,
        ErrorCode::ValidationFailed,
        ErrorCode::TooManyRequests,
        ErrorCode::Internal,
        ErrorCode::WorkerUnreachable,
        ErrorCode::WorkerError,
        ErrorCode::ProviderError,
        ErrorCode::Unavailable,
        ErrorCode::WatchLagged,
    ];

    /// The HTTP status an error with this code is answered with.
    pub fn status(self) -> u16 {
        match self {
            ErrorCode::InvalidRequest => 400,
            ErrorCode::Unauthorized => 401,
            ErrorCode::Forbidden | ErrorCode::PasswordChangeRequired => 403,
            ErrorCode::NotFound => 404,
            ErrorCode::MethodNotAllowed => 405,
            ErrorCode::Conflict => 409,
            ErrorCode::PayloadTooLarge => 413,
            ErrorCode::UnsupportedMediaType => 415,
            ErrorCode::ValidationFailed => 422,
            ErrorCode::TooManyRequests => 429,
            ErrorCode::Internal => 500,
            ErrorCode::WorkerUnreachable | ErrorCode::WorkerError | ErrorCode::ProviderError => 502,
            ErrorCode::Unavailable => 503,
            // Sent inside a 200 stream; were it ever a response of its own, it would say
            // "try again".
            ErrorCode::WatchLagged => 503,
        }
    }

    /// The code as it appears on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidRequest => "invalid_request",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::PasswordChangeRequired => "password_change_required",
            ErrorCode::NotFound => "not_found",
            ErrorCode::MethodNotAllowed => "method_not_allowed",
            ErrorCode::Conflict => "conflict",
            ErrorCode::PayloadTooLarge => "payload_too_large",
            ErrorCode::UnsupportedMediaType => "unsupported_media_type",
            ErrorCode::ValidationFailed => "validation_failed",
            ErrorCode::TooManyRequests => "too_many_requests",
            ErrorCode::Internal => "internal",
            ErrorCode::WorkerUnreachable => "worker_unreachable",
            ErrorCode::WorkerError => "worker_error",
            ErrorCode::ProviderError => "provider_error",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::WatchLagged => "watch_lagged",
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_serialises_as_its_wire_name() {
        for code in ErrorCode::ALL {
            let json = serde_json::to_string(&code).expect("serialisable");
            assert_eq!(json, format!("\"{}\"", code.as_str()));
            let back: ErrorCode = serde_json::from_str(&json).expect("decodable");
            assert_eq!(back, code);
        }
    }
}
