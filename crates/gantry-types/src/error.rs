//! The one JSON shape every management-API error takes:
//! `{"error": {"code": "...", "message": "..."}}`.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The body of every error response from the management API.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

/// A machine-readable `code` (snake_case, stable) and a message for people.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
pub struct ErrorDetail {
    /// Stable, snake_case: `invalid_request`, `unauthorized`, `forbidden`, `not_found`,
    /// `conflict`, `payload_too_large`, `validation_failed`, ...
    pub code: String,
    /// What went wrong and, where it helps, what to do next. Names the offending field.
    pub message: String,
}
