//! `/api/v1/api-keys`: users manage their own keys; admins see and revoke everyone's.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use axum::Json;
use gantry_store::{Change, NewApiKey};
use gantry_types::{
    ApiKey, ApiKeyCreate, ApiKeyCreated, ApiKeyQuery, ApiKeyUpdate, ListResponse, Role, Timestamp,
};

use super::created;
use crate::auth::secrets::{digest, GeneratedApiKey};
use crate::auth::UserAuth;
use crate::auth::{password, Auth};
use crate::error::{ApiError, ApiResult};
use crate::extract::{ApiJson, ApiPath, ApiQuery};
use crate::state::AppState;

/// Lists API keys (never their secrets).
#[utoipa::path(get, path = "/api/v1/api-keys", tag = "api-keys", security(("bearer" = [])), params(ApiKeyQuery),
    responses((status = 200, body = ListResponse<ApiKey>)))]
pub async fn list(
    State(state): State<AppState>,
    Auth(principal): Auth,
    ApiQuery(query): ApiQuery<ApiKeyQuery>,
) -> ApiResult<Response> {
    let user = principal.require_user()?;
    let owner = match (user.role, query.user_id) {
        (Role::Admin, requested) => requested,
        (Role::User, None) => Some(user.id),
        (Role::User, Some(requested)) if requested == user.id => Some(user.id),
        (Role::User, Some(_)) => {
            return Err(ApiError::forbidden(
                "only admins can list other users' keys",
            ))
        }
    };
    let query = ApiKeyQuery {
        user_id: owner,
        ..query
    };
    super::list_or_watch(&state, &query, Change::api_key).await
}

/// Creates a key for the caller. The answer is the only time the full key is shown.
#[utoipa::path(post, path = "/api/v1/api-keys", tag = "api-keys", security(("bearer" = [])), request_body = ApiKeyCreate,
    responses((status = 201, body = ApiKeyCreated), (status = 409, body = gantry_types::ErrorBody),
        (status = 422, body = gantry_types::ErrorBody)))]
pub async fn create(
    State(state): State<AppState>,
    UserAuth(principal): UserAuth,
    ApiJson(request): ApiJson<ApiKeyCreate>,
) -> ApiResult<Response> {
    let user = principal.require_user()?;
    let limits = request.limits();
    let generated = GeneratedApiKey::generate();
    let full = generated.full();
    let key = state
        .store
        .create_api_key(&NewApiKey {
            user_id: user.id,
            name: request.name,
            description: request.description,
            access_key: generated.access.clone(),
            lookup_digest: digest(&full),
            secret_hash: password::hash(generated.secret.clone()).await?,
            expires_at: request.expires_in_days.map(|days| {
                Timestamp::now().plus(std::time::Duration::from_secs(u64::from(days) * 86_400))
            }),
            limits,
        })
        .await?;
    tracing::info!(username = %user.username, api_key_id = key.id, access_key = %key.access_key, "created API key");
    Ok(created(ApiKeyCreated {
        api_key: key,
        key: full,
    }))
}

fn visible(key: &ApiKey, user: &gantry_types::User) -> bool {
    user.role == Role::Admin || key.user_id == user.id
}

/// Shows one key.
#[utoipa::path(get, path = "/api/v1/api-keys/{id}", tag = "api-keys", security(("bearer" = [])),
    params(("id" = i64, Path, description = "API key id")),
    responses((status = 200, body = ApiKey), (status = 404, body = gantry_types::ErrorBody)))]
pub async fn get(
    State(state): State<AppState>,
    Auth(principal): Auth,
    ApiPath(id): ApiPath<i64>,
) -> ApiResult<Json<ApiKey>> {
    let user = principal.require_user()?;
    let key = state.store.get_api_key(id).await?;
    if !visible(&key, user) {
        // Someone else's key: answer as if it did not exist.
        return Err(ApiError::not_found(format!("api key {id} not found")));
    }
    Ok(Json(key))
}

/// Changes a key's description (its owner or an admin) and its gateway limits (admins
/// only: a limit an admin set is not for the key's owner to lift). `null` lifts a limit.
/// Every server applies the change within about a second.
#[utoipa::path(patch, path = "/api/v1/api-keys/{id}", tag = "api-keys", security(("bearer" = [])),
    params(("id" = i64, Path, description = "API key id")), request_body = ApiKeyUpdate,
    responses((status = 200, body = ApiKey), (status = 403, body = gantry_types::ErrorBody),
        (status = 404, body = gantry_types::ErrorBody), (status = 422, body = gantry_types::ErrorBody)))]
pub async fn update(
    State(state): State<AppState>,
    UserAuth(principal): UserAuth,
    ApiPath(id): ApiPath<i64>,
    ApiJson(request): ApiJson<ApiKeyUpdate>,
) -> ApiResult<Json<ApiKey>> {
    let user = principal.require_user()?;
    let key = state.store.get_api_key(id).await?;
    if !visible(&key, user) {
        return Err(ApiError::not_found(format!("api key {id} not found")));
    }
    let changes_limits = request.allowed_routes.is_some()
        || request.requests_per_minute.is_some()
        || request.tokens_per_minute.is_some();
    if changes_limits && user.role != Role::Admin {
        return Err(ApiError::forbidden(
            "only admins can change a key's limits; set them when you create a key",
        ));
    }
    let limits = request.apply_to(&key.limits);
    let description = request.description.as_deref().unwrap_or(&key.description);
    let key = state.store.update_api_key(id, description, &limits).await?;
    tracing::info!(username = %user.username, api_key_id = id, allowed_routes = ?limits.allowed_routes, requests_per_minute = ?limits.requests_per_minute, tokens_per_minute = ?limits.tokens_per_minute, "changed API key");
    Ok(Json(key))
}

/// Revokes a key at once.
#[utoipa::path(delete, path = "/api/v1/api-keys/{id}", tag = "api-keys", security(("bearer" = [])),
    params(("id" = i64, Path, description = "API key id")),
    responses((status = 204), (status = 404, body = gantry_types::ErrorBody)))]
pub async fn delete(
    State(state): State<AppState>,
    Auth(principal): Auth,
    ApiPath(id): ApiPath<i64>,
) -> ApiResult<StatusCode> {
    let user = principal.require_user()?;
    let key = state.store.get_api_key(id).await?;
    if !visible(&key, user) {
        return Err(ApiError::not_found(format!("api key {id} not found")));
    }
    state.store.delete_api_key(id).await?;
    tracing::info!(username = %user.username, api_key_id = id, "deleted API key");
    Ok(StatusCode::NO_CONTENT)
}
