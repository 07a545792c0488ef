//! API keys: `gantry_<access>_<secret>`, shown once at creation, stored hashed.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::time::Timestamp;
use crate::validate::{check_name, FieldError, Validate};

/// An API key as listed. The secret is never shown again after creation; `access_key`
/// is the public half and identifies the key in lists and logs.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct ApiKey {
    pub id: i64,
    pub name: String,
    pub user_id: i64,
    pub access_key: String,
    pub description: String,
    pub expires_at: Option<Timestamp>,
    pub last_used_at: Option<Timestamp>,
    pub created_at: Timestamp,
    /// What the gateway lets this key do.
    #[serde(flatten)]
    pub limits: ApiKeyLimits,
}

/// The gateway's limits on one key. Every server of a cluster enforces them; each
/// adds what the others admitted, shared through the database about once a second, so
/// a burst spread over several servers may pass a limit by about a second's worth.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ApiKeyLimits {
    /// The route (or deployed model) names the key may call; `null`: any.
    #[serde(default)]
    #[schema(value_type = Option<Vec<crate::validate::ResourceName>>, max_items = 1000)]
    pub allowed_routes: Option<Vec<String>>,
    /// Requests admitted in any 60 seconds; past it the gateway answers 429 with
    /// `Retry-After`. `null`: no limit.
    #[serde(default)]
    pub requests_per_minute: Option<u32>,
    /// Tokens (prompt and completion) used in any 60 seconds; a request is refused
    /// while the last minute's tokens reach it. `null`: no limit.
    #[serde(default)]
    pub tokens_per_minute: Option<u64>,
}

impl ApiKeyLimits {
    /// Whether any limit is set.
    pub fn is_limited(&self) -> bool {
        self.allowed_routes.is_some()
            || self.requests_per_minute.is_some()
            || self.tokens_per_minute.is_some()
    }

    /// Whether the key may call `route`.
    pub fn allows(&self, route: &str) -> bool {
        self.allowed_routes
            .as_ref()
            .is_none_or(|allowed| allowed.iter().any(|r| r == route))
    }
}

fn check_limits(
    allowed_routes: Option<&Vec<String>>,
    requests_per_minute: Option<u32>,
    tokens_per_minute: Option<u64>,
) -> Result<(), FieldError> {
    if let Some(routes) = allowed_routes {
        if routes.len() > 1000 {
            return Err(FieldError::new(
                "allowed_routes",
                "may name at most 1000 routes",
            ));
        }
        for (i, route) in routes.iter().enumerate() {
            check_name(&format!("allowed_routes[{i}]"), route)?;
        }
    }
    if requests_per_minute == Some(0) || requests_per_minute.is_some_and(|n| n > 1_000_000) {
        return Err(FieldError::new(
            "requests_per_minute",
            "must be between 1 and 1000000 (null: no limit)",
        ));
    }
    if tokens_per_minute == Some(0) || tokens_per_minute.is_some_and(|n| n > 1_000_000_000_000) {
        return Err(FieldError::new(
            "tokens_per_minute",
            "must be between 1 and 10^12 (null: no limit)",
        ));
    }
    Ok(())
}

/// `POST /api/v1/api-keys`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ApiKeyCreate {
    /// Unique per user.
    #[schema(min_length = 1, max_length = 63, pattern = r"^[a-z0-9][a-z0-9._-]*$")]
    pub name: String,
    #[serde(default)]
    #[schema(max_length = 500, pattern = r"^[^\x00-\x08\x0B-\x1F\x7F-\x9F]*$")]
    pub description: String,
    /// Days until the key expires (1 to 3650); absent means it never expires.
    #[schema(minimum = 1, maximum = 3650)]
    pub expires_in_days: Option<u32>,
    /// Route names the key may call; absent or `null`: any.
    #[serde(default)]
    #[schema(max_items = 1000)]
    pub allowed_routes: Option<Vec<String>>,
    #[serde(default)]
    #[schema(minimum = 1, maximum = 1000000)]
    pub requests_per_minute: Option<u32>,
    #[serde(default)]
    #[schema(minimum = 1, maximum = 1000000000000_u64)]
    pub tokens_per_minute: Option<u64>,
}

impl ApiKeyCreate {
    pub fn limits(&self) -> ApiKeyLimits {
        ApiKeyLimits {
            allowed_routes: self.allowed_routes.clone(),
            requests_per_minute: self.requests_per_minute,
            tokens_per_minute: self.tokens_per_minute,
        }
    }
}

/// `PATCH /api/v1/api-keys/{id}`: absent fields stay as they are; `null` lifts a limit.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ApiKeyUpdate {
    #[serde(
        default,
        deserialize_with = "crate::validate::not_null",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(
        nullable = false,
        max_length = 500,
        pattern = r"^[^\x00-\x08\x0B-\x1F\x7F-\x9F]*$"
    )]
    pub description: Option<String>,
    #[serde(
        default,
        with = "crate::model::double_option",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<Vec<String>>, max_items = 1000)]
    pub allowed_routes: Option<Option<Vec<String>>>,
    #[serde(
        default,
        with = "crate::model::double_option",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<u32>, minimum = 1, maximum = 1000000)]
    pub requests_per_minute: Option<Option<u32>>,
    #[serde(
        default,
        with = "crate::model::double_option",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<u64>, minimum = 1, maximum = 1000000000000_u64)]
    pub tokens_per_minute: Option<Option<u64>>,
}

impl ApiKeyUpdate {
    /// `limits` with this update applied.
    pub fn apply_to(&self, limits: &ApiKeyLimits) -> ApiKeyLimits {
        ApiKeyLimits {
            allowed_routes: self
                .allowed_routes
                .clone()
                .unwrap_or_else(|| limits.allowed_routes.clone()),
            requests_per_minute: self
                .requests_per_minute
                .unwrap_or(limits.requests_per_minute),
            tokens_per_minute: self.tokens_per_minute.unwrap_or(limits.tokens_per_minute),
        }
    }
}

impl Validate for ApiKeyUpdate {
    fn validate(&self) -> Result<(), FieldError> {
        if let Some(description) = &self.description {
            crate::validate::check_text("description", description, 500)?;
        }
        check_limits(
            self.allowed_routes.as_ref().and_then(Option::as_ref),
            self.requests_per_minute.flatten(),
            self.tokens_per_minute.flatten(),
        )
    }
}

impl Validate for ApiKeyCreate {
    fn validate(&self) -> Result<(), FieldError> {
        check_name("name", &self.name)?;
        crate::validate::check_text("description", &self.description, 500)?;
        if let Some(days) = self.expires_in_days {
            if !(1..=3650).contains(&days) {
                return Err(FieldError::new(
                    "expires_in_days",
                    "must be between 1 and 3650",
                ));
            }
        }
        check_limits(
            self.allowed_routes.as_ref(),
            self.requests_per_minute,
            self.tokens_per_minute,
        )
    }
}

/// The answer to a key creation: the only time the full key is shown.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ApiKeyCreated {
    #[serde(flatten)]
    pub api_key: ApiKey,
    /// The full key, `gantry_<access>_<secret>`. Store it now; it cannot be shown again.
    pub key: String,
}
