//! `/auth/*`: login, logout, password change and "who am I".

use axum::extract::State;
use axum::http::header::SET_COOKIE;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use gantry_store::StoreError;
use gantry_types::{ChangePasswordRequest, ErrorCode, LoginRequest, LoginResponse, User};

use crate::auth::principal::SESSION_COOKIE;
use crate::auth::UserAllowingPasswordChange;
use crate::auth::{password, AuthAllowingPasswordChange, Principal};
use crate::error::{ApiError, ApiResult};
use crate::extract::{ApiJson, ClientAddress};
use crate::state::AppState;

fn session_cookie(token: &str, max_age_secs: u64) -> HeaderValue {
    HeaderValue::from_str(&format!(
        "{SESSION_COOKIE}={token}; Path=/; HttpOnly; SameSite=Lax; Max-Age={max_age_secs}"
    ))
    .unwrap_or_else(|_| HeaderValue::from_static("gantry_session=; Path=/; Max-Age=0"))
}

fn with_session(state: &AppState, login: LoginResponse) -> Response {
    let mut headers = HeaderMap::new();
    headers.insert(
        SET_COOKIE,
        session_cookie(
            &login.token,
            state.authenticator.jwt().session_ttl.as_secs(),
        ),
    );
    (headers, Json(login)).into_response()
}

fn issue(state: &AppState, user: User, session_version: i64) -> ApiResult<LoginResponse> {
    let (token, expires_at) = state
        .authenticator
        .jwt()
        .issue(user.id, &user.username, user.role, session_version)
        .map_err(|e| ApiError::internal(format!("sign session token: {e}")))?;
    Ok(LoginResponse {
        token,
        expires_at,
        user,
    })
}

/// Exchanges a username and password for a session token (also set as a cookie).
/// Failed logins are limited per (username, client address) and per client address
/// (`login_limit.rs`): past the limit the answer is 429 with `Retry-After`, and the
/// password is not checked.
#[utoipa::path(post, path = "/auth/login", tag = "auth", request_body = LoginRequest,
    responses((status = 200, body = LoginResponse), (status = 401, body = gantry_types::ErrorBody),
        (status = 429, body = gantry_types::ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds until this address may try again")))))]
pub async fn login(
    State(state): State<AppState>,
    ClientAddress(address): ClientAddress,
    ApiJson(request): ApiJson<LoginRequest>,
) -> ApiResult<Response> {
    if let Some(address) = address {
        if let Some(wait) = state.logins.wait(&request.username, address) {
            let seconds = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
            tracing::warn!(username = %request.username, %address, retry_after_s = seconds, "login refused: too many failed attempts from this address");
            let mut response = ApiError::new(
                ErrorCode::TooManyRequests,
                format!("too many failed logins from this address; try again in {seconds} s"),
            )
            .into_response();
            response
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, HeaderValue::from(seconds));
            return Ok(response);
        }
    }
    let failed = |why: &str| {
        if let Some(address) = address {
            state.logins.failed(&request.username, address);
        }
        tracing::info!(username = %request.username, address = ?address, "login failed: {why}");
        ApiError::unauthorized("invalid username or password")
    };
    let record = match state.store.user_record_by_name(&request.username).await {
        Ok(record) => record,
        Err(StoreError::NotFound { .. }) => {
            password::dummy_verify(request.password).await;
            return Err(failed("no such user"));
        }
        Err(e) => return Err(e.into()),
    };
    if !password::verify(request.password, record.password_hash.clone()).await {
        return Err(failed("wrong password"));
    }
    if let Some(address) = address {
        state.logins.succeeded(&request.username, address);
    }
    tracing::info!(username = %record.user.username, user_id = record.user.id, "logged in");
    let login = issue(&state, record.user, record.session_version)?;
    Ok(with_session(&state, login))
}

/// Ends every session of the caller and clears the cookie.
#[utoipa::path(post, path = "/auth/logout", tag = "auth", security(("bearer" = [])),
    responses((status = 204), (status = 401, body = gantry_types::ErrorBody)))]
pub async fn logout(
    State(state): State<AppState>,
    AuthAllowingPasswordChange(principal): AuthAllowingPasswordChange,
) -> ApiResult<Response> {
    let user = principal.require_user()?;
    state.store.bump_session_version(user.id).await?;
    let mut headers = HeaderMap::new();
    headers.insert(SET_COOKIE, session_cookie("", 0));
    Ok((StatusCode::NO_CONTENT, headers).into_response())
}

/// Changes the caller's password. Every other session ends; the answer carries a new
/// session token.
#[utoipa::path(post, path = "/auth/change-password", tag = "auth", security(("bearer" = [])),
    request_body = ChangePasswordRequest,
    responses((status = 200, body = LoginResponse), (status = 401, body = gantry_types::ErrorBody),
        (status = 422, body = gantry_types::ErrorBody)))]
pub async fn change_password(
    State(state): State<AppState>,
    UserAllowingPasswordChange(principal): UserAllowingPasswordChange,
    ApiJson(request): ApiJson<ChangePasswordRequest>,
) -> ApiResult<Response> {
    let user = principal.require_user()?;
    let record = state.store.user_record(user.id).await?;
    if !password::verify(request.current_password, record.password_hash).await {
        return Err(ApiError::unauthorized("current_password is wrong"));
    }
    let hash = password::hash(request.new_password).await?;
    let user = state.store.set_password(user.id, &hash, false).await?;
    let record = state.store.user_record(user.id).await?;
    tracing::info!(username = %user.username, user_id = user.id, "password changed");
    let login = issue(&state, record.user, record.session_version)?;
    Ok(with_session(&state, login))
}

/// The calling user.
#[utoipa::path(get, path = "/auth/me", tag = "auth", security(("bearer" = [])),
    responses((status = 200, body = User), (status = 401, body = gantry_types::ErrorBody)))]
pub async fn me(
    AuthAllowingPasswordChange(principal): AuthAllowingPasswordChange,
) -> ApiResult<Json<User>> {
    match principal {
        Principal::User { user, .. } => Ok(Json(User::clone(&user))),
        Principal::Worker { .. } => Err(ApiError::forbidden(
            "worker credentials can only call worker endpoints",
        )),
        Principal::Server { .. } => Err(ApiError::forbidden(
            "server credentials can only call the coordinator endpoints",
        )),
    }
}
