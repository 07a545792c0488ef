//! `/api/v1/users` (admin only).

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use axum::Json;
use gantry_store::{Change, NewUser};
use gantry_types::{ListResponse, User, UserCreate, UserQuery, UserUpdate};

use super::created;
use crate::auth::AdminAuth;
use crate::auth::{password, Auth};
use crate::error::{ApiError, ApiResult};
use crate::extract::{ApiJson, ApiPath, ApiQuery};
use crate::service;
use crate::state::AppState;

/// Lists users.
#[utoipa::path(get, path = "/api/v1/users", tag = "users", security(("bearer" = [])), params(UserQuery),
    responses((status = 200, body = ListResponse<User>), (status = 403, body = gantry_types::ErrorBody)))]
pub async fn list(
    State(state): State<AppState>,
    Auth(principal): Auth,
    ApiQuery(query): ApiQuery<UserQuery>,
) -> ApiResult<Response> {
    principal.require_admin()?;
    super::list_or_watch(&state, &query, Change::user).await
}

/// Creates a user.
#[utoipa::path(post, path = "/api/v1/users", tag = "users", security(("bearer" = [])), request_body = UserCreate,
    responses((status = 201, body = User), (status = 409, body = gantry_types::ErrorBody),
        (status = 422, body = gantry_types::ErrorBody)))]
pub async fn create(
    State(state): State<AppState>,
    AdminAuth(principal): AdminAuth,
    ApiJson(request): ApiJson<UserCreate>,
) -> ApiResult<Response> {
    let admin = principal.require_admin()?;
    service::users::check_clusters(&state.store, &request.cluster_admin_of).await?;
    if state
        .store
        .user_record_by_name(&request.username)
        .await
        .is_ok()
    {
        return Err(ApiError::conflict(format!(
            "user {} already exists",
            request.username
        )));
    }
    let user = state
        .store
        .create_user(&NewUser {
            cluster_admin_of: request.cluster_admin_of,
            username: request.username,
            password_hash: password::hash(request.password).await?,
            role: request.role,
            full_name: request.full_name,
            require_password_change: request.require_password_change,
        })
        .await?;
    tracing::info!(by = %admin.username, user_id = user.id, username = %user.username, role = user.role.as_str(), "created user");
    Ok(created(user))
}

/// Shows a user.
#[utoipa::path(get, path = "/api/v1/users/{id}", tag = "users", security(("bearer" = [])),
    params(("id" = i64, Path, description = "user id")),
    responses((status = 200, body = User), (status = 404, body = gantry_types::ErrorBody)))]
pub async fn get(
    State(state): State<AppState>,
    Auth(principal): Auth,
    ApiPath(id): ApiPath<i64>,
) -> ApiResult<Json<User>> {
    principal.require_admin()?;
    Ok(Json(state.store.get_user(id).await?))
}

/// Changes a user's role, name, password or password-change flag.
#[utoipa::path(patch, path = "/api/v1/users/{id}", tag = "users", security(("bearer" = [])),
    params(("id" = i64, Path, description = "user id")), request_body = UserUpdate,
    responses((status = 200, body = User), (status = 404, body = gantry_types::ErrorBody),
        (status = 409, body = gantry_types::ErrorBody), (status = 422, body = gantry_types::ErrorBody)))]
pub async fn update(
    State(state): State<AppState>,
    AdminAuth(principal): AdminAuth,
    ApiPath(id): ApiPath<i64>,
    ApiJson(request): ApiJson<UserUpdate>,
) -> ApiResult<Json<User>> {
    let admin = principal.require_admin()?;
    let user = service::users::update(&state.store, id, request).await?;
    tracing::info!(by = %admin.username, user_id = id, "updated user");
    Ok(Json(user))
}

/// Deletes a user and their API keys.
#[utoipa::path(delete, path = "/api/v1/users/{id}", tag = "users", security(("bearer" = [])),
    params(("id" = i64, Path, description = "user id")),
    responses((status = 204), (status = 404, body = gantry_types::ErrorBody), (status = 409, body = gantry_types::ErrorBody)))]
pub async fn delete(
    State(state): State<AppState>,
    Auth(principal): Auth,
    ApiPath(id): ApiPath<i64>,
) -> ApiResult<StatusCode> {
    let admin = principal.require_admin()?;
    let user = service::users::delete(&state.store, admin, id).await?;
    tracing::info!(by = %admin.username, user_id = id, username = %user.username, "deleted user");
    Ok(StatusCode::NO_CONTENT)
}
