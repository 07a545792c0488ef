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
}

/// `POST /api/v1/api-keys`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
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
        Ok(())
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
