//! Login, logout and password change, and reading the bearer token of an
//! `Authorization` header (one reader for the API, the gateway and the worker).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::time::Timestamp;
use crate::user::User;
use crate::validate::{check_password, FieldError, Validate};

/// `POST /auth/login`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LoginRequest {
    #[schema(min_length = 1)]
    pub username: String,
    #[schema(min_length = 1, max_length = 1024)]
    pub password: String,
}

impl Validate for LoginRequest {
    fn validate(&self) -> Result<(), FieldError> {
        if self.username.is_empty() {
            return Err(FieldError::new("username", "must not be empty"));
        }
        if self.password.is_empty() || self.password.chars().count() > 1024 {
            return Err(FieldError::new("password", "must be 1 to 1024 characters"));
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
    /// 8 to 256 characters, not the current password.
    #[schema(min_length = 8, max_length = 256)]
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

/// The token of an `Authorization: Bearer <token>` header value. The scheme is
/// case-insensitive (`bearer`, `BEARER`; RFC 9110 §11.1) and whitespace around the token
/// is ignored. Another scheme, a missing scheme or an empty token is `None`.
pub fn bearer_token(header_value: &str) -> Option<&str> {
    let (scheme, token) = header_value.trim_start().split_once([' ', '\t'])?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Name of the session cookie set by `POST /auth/login`.
pub const SESSION_COOKIE: &str = "gantry_session";

/// The session token in `Cookie` header values, if one names [`SESSION_COOKIE`].
pub fn session_cookie<'a>(cookie_headers: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    cookie_headers
        .into_iter()
        .flat_map(|header| header.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, value)| *name == SESSION_COOKIE && !value.is_empty())
        .map(|(_, value)| value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_session_cookie_is_found_among_others() {
        assert_eq!(
            session_cookie(["theme=dark; gantry_session=tok; x=1"]),
            Some("tok")
        );
        assert_eq!(session_cookie(["a=1", "gantry_session=t2"]), Some("t2"));
        assert_eq!(session_cookie(["gantry_session="]), None);
        assert_eq!(session_cookie(["gantry_sessionx=1"]), None);
    }

    #[test]
    fn bearer_scheme_is_case_insensitive() {
        assert_eq!(bearer_token("Bearer abc"), Some("abc"));
        assert_eq!(bearer_token("bearer abc"), Some("abc"));
        assert_eq!(bearer_token("BEARER abc"), Some("abc"));
    }

    #[test]
    fn whitespace_around_the_bearer_token_is_trimmed() {
        assert_eq!(bearer_token("  Bearer   abc \t"), Some("abc"));
        assert_eq!(bearer_token("Bearer\tabc"), Some("abc"));
    }

    #[test]
    fn missing_scheme_other_scheme_or_empty_token_is_no_token() {
        assert_eq!(bearer_token("abc"), None);
        assert_eq!(bearer_token("Basic YWxhZGRpbjpvcGVuc2VzYW1l"), None);
        assert_eq!(bearer_token("Bearer"), None);
        assert_eq!(bearer_token("Bearer   "), None);
        assert_eq!(bearer_token("Bearerabc"), None);
        assert_eq!(bearer_token(""), None);
    }
}
