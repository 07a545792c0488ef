//! Users and their roles.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::time::Timestamp;
use crate::validate::{check_password, check_text, check_username, FieldError, Validate};

/// What a user may do. Admins manage users, workers and models; users manage their own
/// API keys and call the gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Admin,
    User,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::User => "user",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "admin" => Some(Role::Admin),
            "user" => Some(Role::User),
            _ => None,
        }
    }
}

/// A user as the API shows it. The password hash never leaves the store.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct User {
    pub id: i64,
    pub username: String,
    pub role: Role,
    pub full_name: String,
    /// Set for the generated bootstrap password: until the user changes it, every call
    /// but `change-password` and `logout` answers 403 `password_change_required`.
    pub require_password_change: bool,
    /// The clusters this user administers without being an admin: they deploy, scale and
    /// delete models there and see and label its workers. Empty for most users; an
    /// admin administers every cluster whatever this says.
    #[serde(default)]
    pub cluster_admin_of: Vec<i64>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

/// `POST /api/v1/users`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UserCreate {
    #[schema(min_length = 1, max_length = 63, pattern = r"^[a-z0-9][a-z0-9._-]*$")]
    pub username: String,
    #[schema(min_length = 8, max_length = 256)]
    pub password: String,
    #[serde(default = "default_role")]
    pub role: Role,
    #[serde(default)]
    #[schema(max_length = 200, pattern = r"^[^\x00-\x08\x0B-\x1F\x7F-\x9F]*$")]
    pub full_name: String,
    /// Make the user choose a new password at first login.
    #[serde(default)]
    pub require_password_change: bool,
    /// Ids of the clusters the user administers (see [`User::cluster_admin_of`]).
    #[serde(default)]
    #[schema(max_items = 100)]
    pub cluster_admin_of: Vec<i64>,
}

fn default_role() -> Role {
    Role::User
}

impl Validate for UserCreate {
    fn validate(&self) -> Result<(), FieldError> {
        check_username("username", &self.username)?;
        check_password("password", &self.password)?;
        check_text("full_name", &self.full_name, 200)?;
        check_cluster_ids("cluster_admin_of", &self.cluster_admin_of)
    }
}

/// `PATCH /api/v1/users/{id}`: every field optional; absent fields stay as they are.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UserUpdate {
    pub role: Option<Role>,
    #[schema(max_length = 200, pattern = r"^[^\x00-\x08\x0B-\x1F\x7F-\x9F]*$")]
    pub full_name: Option<String>,
    /// Sets a new password (admin reset); the user's sessions end.
    #[schema(min_length = 8, max_length = 256)]
    pub password: Option<String>,
    pub require_password_change: Option<bool>,
    /// Replaces the clusters the user administers (`[]`: none).
    #[schema(max_items = 100)]
    pub cluster_admin_of: Option<Vec<i64>>,
}

impl Validate for UserUpdate {
    fn validate(&self) -> Result<(), FieldError> {
        if let Some(full_name) = &self.full_name {
            check_text("full_name", full_name, 200)?;
        }
        if let Some(password) = &self.password {
            check_password("password", password)?;
        }
        if let Some(ids) = &self.cluster_admin_of {
            check_cluster_ids("cluster_admin_of", ids)?;
        }
        Ok(())
    }
}

/// A list of cluster ids: at most 100, each once. Whether they exist is the service's to
/// check.
fn check_cluster_ids(field: &str, ids: &[i64]) -> Result<(), FieldError> {
    if ids.len() > 100 {
        return Err(FieldError::new(field, "may name at most 100 clusters"));
    }
    let mut seen = std::collections::BTreeSet::new();
    for id in ids {
        if !seen.insert(id) {
            return Err(FieldError::new(field, format!("names cluster {id} twice")));
        }
    }
    Ok(())
}
