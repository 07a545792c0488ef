//! What can go wrong with a call.

use gantry_types::{ErrorCode, ErrorDetail};

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No server could be reached, or every one answered 502, 503 or 504 (other than a
    /// server's report that a worker or a model provider failed, which is
    /// [`ClientError::Api`]).
    #[error("no server answered ({tried} tried): {last}")]
    Unreachable { tried: usize, last: String },
    /// The server answered with its error body.
    #[error("{url} answered {status} {}: {}", .error.code, .error.message)]
    Api {
        url: String,
        status: u16,
        error: ErrorDetail,
    },
    /// The server answered an error without gantry's error body (a proxy in between, say).
    #[error("{url} answered {status}: {body}")]
    Status {
        url: String,
        status: u16,
        body: String,
    },
    /// The answer was not what the call expects: a body that does not decode, or a
    /// success status other than the call's (201 for a creation, 204 for no body).
    #[error("unreadable answer from {url}: {message}")]
    Decode { url: String, message: String },
}

impl ClientError {
    /// The HTTP status of an answered call.
    pub fn status(&self) -> Option<u16> {
        match self {
            ClientError::Api { status, .. } | ClientError::Status { status, .. } => Some(*status),
            ClientError::Unreachable { .. } | ClientError::Decode { .. } => None,
        }
    }

    /// The error code of the server's answer.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Api { error, .. } => Some(error.code),
            _ => None,
        }
    }

    /// The server's message, when it sent one.
    pub fn message(&self) -> Option<&str> {
        match self {
            ClientError::Api { error, .. } => Some(&error.message),
            _ => None,
        }
    }
}
