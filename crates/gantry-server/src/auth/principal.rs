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

pub use gantry_types::auth::SESSION_COOKIE;

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

/// The caller when they are an admin. Refused with 403 at extraction, so that an
/// endpoint's role is checked before its request body is read.
#[derive(Debug, Clone)]
pub struct AdminAuth(pub Principal);

/// The caller when they are a user (a session or an API key), not a worker's or a
/// server's credential; refused with 403 before the body is read.
#[derive(Debug, Clone)]
pub struct UserAuth(pub Principal);

/// [`UserAuth`], also when the user must change their password first.
#[derive(Debug, Clone)]
pub struct UserAllowingPasswordChange(pub Principal);

/// The caller when an admin or a server credential (the coordinator API); refused with
/// 403 before the body is read.
#[derive(Debug, Clone)]
pub struct AdminOrServerAuth(pub Principal);

impl FromRequestParts<AppState> for AdminAuth {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let Auth(principal) = Auth::from_request_parts(parts, state).await?;
        principal.require_admin()?;
        Ok(Self(principal))
    }
}

/// The caller when an admin or the administrator of some cluster, refused with 403
/// before the body is read; the handler checks the cluster the request concerns.
#[derive(Debug, Clone)]
pub struct ClusterAdminAuth(pub Principal);

impl FromRequestParts<AppState> for ClusterAdminAuth {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let Auth(principal) = Auth::from_request_parts(parts, state).await?;
        principal.require_any_cluster_admin()?;
        Ok(Self(principal))
    }
}

impl FromRequestParts<AppState> for UserAuth {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let Auth(principal) = Auth::from_request_parts(parts, state).await?;
        principal.require_user()?;
        Ok(Self(principal))
    }
}

impl FromRequestParts<AppState> for UserAllowingPasswordChange {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let principal = authenticate(parts, state).await?;
        principal.require_user()?;
        Ok(Self(principal))
    }
}

impl FromRequestParts<AppState> for AdminOrServerAuth {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let Auth(principal) = Auth::from_request_parts(parts, state).await?;
        principal.require_admin_or_server()?;
        Ok(Self(principal))
    }
}

/// The bearer token, or the session cookie.
pub fn credential_of(parts: &Parts) -> Option<String> {
    if let Some(value) = parts.headers.get(AUTHORIZATION) {
        let value = value.to_str().ok()?;
        return gantry_types::auth::bearer_token(value).map(str::to_owned);
    }
    gantry_types::auth::session_cookie(
        parts
            .headers
            .get_all(COOKIE)
            .iter()
            .filter_map(|value| value.to_str().ok()),
    )
    .map(str::to_owned)
}

async fn authenticate(parts: &Parts, state: &AppState) -> Result<Principal, ApiError> {
    let token = credential_of(parts).ok_or_else(|| {
        ApiError::unauthorized(
            "missing credentials: send Authorization: Bearer <API key or session token from POST /auth/login>",
        )
    })?;
    Ok(state.authenticator.authenticate(&token).await?)
}
