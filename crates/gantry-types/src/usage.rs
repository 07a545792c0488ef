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
    /// Also answer `series`: the usage per bucket of this length (UTC), per user, API key
    /// and model. Needs `from`; at most 2000 buckets from `from` to `to` (or now): a
    /// longer window is refused with 400 (for a week, take `hour` or `day`).
    pub bucket: Option<UsageBucket>,
}

/// The most buckets one report's `series` spans (the spec states the number in
/// `bucket`'s description; a test holds the two together).
pub const MAX_USAGE_BUCKETS: i64 = 2000;

/// The length of one bucket of a usage series.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum UsageBucket {
    Minute,
    Hour,
    Day,
}

impl UsageBucket {
    pub fn millis(self) -> i64 {
        match self {
            UsageBucket::Minute => 60_000,
            UsageBucket::Hour => 3_600_000,
            UsageBucket::Day => 86_400_000,
        }
    }
}

impl Validate for UsageQuery {
    fn validate(&self) -> Result<(), FieldError> {
        let Some(bucket) = self.bucket else {
            return Ok(());
        };
        let Some(from) = self.from else {
            return Err(FieldError::new(
                "from",
                "is needed with bucket: the series starts there",
            ));
        };
        let to = self.to.unwrap_or_else(Timestamp::now);
        let buckets = (to.as_millis() - from.as_millis()) / bucket.millis();
        if buckets > MAX_USAGE_BUCKETS {
            return Err(FieldError::new(
                "bucket",
                format!(
                    "spans {buckets} buckets from `from` to `to`, more than \
                     {MAX_USAGE_BUCKETS}; take a longer bucket or a shorter window"
                ),
            ));
        }
        Ok(())
    }
}

/// Usage of one user's API key (or session tokens) on one model during one bucket.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct UsagePoint {
    /// The bucket's start.
    pub start: Timestamp,
    pub user_id: i64,
    /// `null`: requests made with the user's session (the console).
    pub api_key_id: Option<i64>,
    pub model: String,
    #[serde(flatten)]
    pub totals: UsageTotals,
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

/// Usage of one route (or model) through one of its targets: the model itself, another
/// deployed model, or `provider/model`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TargetUsage {
    /// The name clients sent.
    pub model: String,
    /// What answered.
    pub target: String,
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
    /// Per model (or route) and the target that answered, by both. Read separately from
    /// the rest: a flush in between can make it a second newer.
    #[serde(default)]
    pub targets: Vec<TargetUsage>,
    /// With `bucket`: per bucket, user, API key and model, by bucket. Days older than the
    /// server's `usage_retention` are rolled up: they count whole at their start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket: Option<UsageBucket>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub series: Option<Vec<UsagePoint>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spec_states_the_most_buckets_a_series_spans() {
        let params = serde_json::to_value(UsageQuery::into_params(|| None)).unwrap_or_default();
        let bucket = params
            .as_array()
            .and_then(|all| all.iter().find(|p| p["name"] == "bucket"))
            .map(|p| p["description"].to_string())
            .unwrap_or_default();
        assert!(
            bucket.contains(&format!("at most {MAX_USAGE_BUCKETS} buckets")),
            "{bucket}"
        );
    }
}
