//! Who is calling, for the management API's handlers: the request's credential (bearer
//! token or session cookie) resolved to a [`Principal`] by the shared authenticator,
//! which caches API keys and batches their last-used times (`gantry-auth`).

use axum::extract::FromRequestParts;
use axum::http::header::{AUTHORIZATION, COOKIE};
use axum::http::request::Parts;
use gantry_auth::Principal;
use gantry_types::ErrorCode;

use crate::error::ApiError;
use crate::state::AppState;

/// Name of the session cookie set by `POST /auth/login`.
pub const SESSION_COOKIE: &str = "gantry_session";

/// Extracts the caller and refuses users who must change their password first.
#[derive(Debug, Clone)]
pub struct Auth(pub Principal);

/// Extracts the caller, also when they still must change their password (for
/// `change-password`, `logout` and `me`).
#[derive(Debug, Clone)]
pub struct AuthAllowingPasswordChange(pub Principal);

impl FromRequestParts<AppState> for Auth {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let principal = authenticate(parts, state).await?;
        if let Principal::User {
            user,
            api_key_id: None,
        } = &principal
        {
            if user.require_password_change {
                return Err(ApiError::new(
                    ErrorCode::PasswordChangeRequired,
                    "change your password first: POST /auth/change-password",
                ));
            }
        }
        Ok(Self(principal))
    }
}

impl FromRequestParts<AppState> for AuthAllowingPasswordChange {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        authenticate(parts, state).await.map(Self)
    }
}

/// The bearer token, or the session cookie.
pub fn credential_of(parts: &Parts) -> Option<String> {
    if let Some(value) = parts.headers.get(AUTHORIZATION) {
        let value = value.to_str().ok()?;
        return gantry_types::auth::bearer_token(value).map(str::to_owned);
    }
    for header in parts.headers.get_all(COOKIE) {
        let Ok(header) = header.to_str() else {
            continue;
        };
        for pair in header.split(';') {
            if let Some((name, value)) = pair.trim().split_once('=') {
                if name == SESSION_COOKIE && !value.is_empty() {
                    return Some(value.to_string());
                }
            }
        }
    }
    None
}

async fn authenticate(parts: &Parts, state: &AppState) -> Result<Principal, ApiError> {
    let token = credential_of(parts).ok_or_else(|| {
        ApiError::unauthorized(
            "missing credentials: send Authorization: Bearer <API key or session token from POST /auth/login>",
        )
    })?;
    Ok(state.authenticator.authenticate(&token).await?)
}
