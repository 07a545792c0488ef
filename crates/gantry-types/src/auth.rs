//! Login, logout and password change.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::time::Timestamp;
use crate::user::User;
use crate::validate::{check_password, FieldError, Validate};

/// `POST /auth/login`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LoginRequest {
    pub username: String,
    pub password: String,
}

impl Validate for LoginRequest {
    fn validate(&self) -> Result<(), FieldError> {
        if self.username.is_empty() {
            return Err(FieldError::new("username", "must not be empty"));
        }
        if self.password.is_empty() || self.password.len() > 1024 {
            return Err(FieldError::new("password", "must be 1 to 1024 bytes"));
        }
        Ok(())
    }
}

/// The session token (also set as the `gantry_session` cookie) and who it belongs to.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct LoginResponse {
    /// A JWT (HS256) to send as `Authorization: Bearer <token>`.
    pub token: String,
    pub expires_at: Timestamp,
    pub user: User,
}

/// `POST /auth/change-password`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ChangePasswordRequest {
    pub current_password: String,
    pub new_password: String,
}

impl Validate for ChangePasswordRequest {
    fn validate(&self) -> Result<(), FieldError> {
        check_password("new_password", &self.new_password)?;
        if self.new_password == self.current_password {
            return Err(FieldError::new(
                "new_password",
                "must differ from the current password",
            ));
        }
        Ok(())
    }
}
