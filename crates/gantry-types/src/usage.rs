//! The usage report of `/api/v1/usage`: what the gateway served, per model and per API key.

use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::time::Timestamp;
use crate::validate::{FieldError, Validate};

/// Filters of the usage report; every one narrows it.
#[derive(Debug, Clone, Default, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct UsageQuery {
    /// Admins only (others may give only their own id).
    pub user_id: Option<i64>,
    pub api_key_id: Option<i64>,
    /// Model name.
    pub model: Option<String>,
    /// RFC 3339; minutes starting at or after this time.
    pub from: Option<Timestamp>,
    /// RFC 3339; minutes starting before this time. A window that ends at or before it
    /// begins holds nothing: the report is empty.
    pub to: Option<Timestamp>,
}

impl Validate for UsageQuery {
    fn validate(&self) -> Result<(), FieldError> {
        Ok(())
    }
}

/// Request count and token sums.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, ToSchema)]
pub struct UsageTotals {
    pub requests: u64,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub total_tokens: u64,
}

/// Usage of one model.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ModelUsage {
    pub model: String,
    #[serde(flatten)]
    pub totals: UsageTotals,
}

/// Usage of one model through one API key (`api_key_id: null`: session tokens).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ApiKeyUsage {
    pub user_id: i64,
    pub api_key_id: Option<i64>,
    pub model: String,
    #[serde(flatten)]
    pub totals: UsageTotals,
}

/// The usage report.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct UsageReport {
    /// The filters applied (the caller's own id for non-admins).
    pub user_id: Option<i64>,
    pub api_key_id: Option<i64>,
    pub model: Option<String>,
    pub from: Option<Timestamp>,
    pub to: Option<Timestamp>,
    /// Everything selected.
    pub total: UsageTotals,
    /// Per model, by name.
    pub models: Vec<ModelUsage>,
    /// Per user, API key and model.
    pub api_keys: Vec<ApiKeyUsage>,
}
