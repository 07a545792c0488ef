//! `/api/v1/model-providers`: external OpenAI-compatible endpoints, admins only. The API
//! key is write-only: answers say `has_api_key`, never the key.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use axum::Json;
use gantry_types::{ModelProvider, ModelProviderCreate, ModelProviderUpdate, ProviderModels};

use super::created;
use crate::auth::{AdminAuth, Auth};
use crate::error::ApiResult;
use crate::extract::{ApiJson, ApiPath};
use crate::service;
use crate::state::AppState;

/// Lists the providers, by name.
#[utoipa::path(get, path = "/api/v1/model-providers", tag = "model-routes", security(("bearer" = [])),
    responses((status = 200, body = Vec<ModelProvider>), (status = 401, body = gantry_types::ErrorBody),
        (status = 403, body = gantry_types::ErrorBody)))]
pub async fn list(
    State(state): State<AppState>,
    Auth(principal): Auth,
) -> ApiResult<Json<Vec<ModelProvider>>> {
    principal.require_admin()?;
    let providers = state.store.list_providers().await?;
    Ok(Json(providers.into_iter().map(|p| p.provider).collect()))
}

/// Adds a provider: an OpenAI-compatible base URL (`https://api.example.com/v1`), its
/// API key (stored sealed with a key derived from the server secret), extra headers,
/// how long it may take to start answering, and the models it offers (empty: any).
#[utoipa::path(post, path = "/api/v1/model-providers", tag = "model-routes", security(("bearer" = [])),
    request_body = ModelProviderCreate,
    responses((status = 201, body = ModelProvider), (status = 409, body = gantry_types::ErrorBody),
        (status = 422, body = gantry_types::ErrorBody)))]
pub async fn create(
    State(state): State<AppState>,
    AdminAuth(principal): AdminAuth,
    ApiJson(request): ApiJson<ModelProviderCreate>,
) -> ApiResult<Response> {
    let admin = principal.require_admin()?;
    let provider = service::providers::create(&state.store, &state.provider_keys, request).await?;
    tracing::info!(by = %admin.username, provider = %provider.name, base_url = %provider.base_url, has_api_key = provider.has_api_key, "added model provider");
    Ok(created(provider))
}

/// Shows a provider.
#[utoipa::path(get, path = "/api/v1/model-providers/{name}", tag = "model-routes", security(("bearer" = [])),
    params(("name" = String, Path, description = "provider name")),
    responses((status = 200, body = ModelProvider), (status = 404, body = gantry_types::ErrorBody)))]
pub async fn get(
    State(state): State<AppState>,
    Auth(principal): Auth,
    ApiPath(name): ApiPath<String>,
) -> ApiResult<Json<ModelProvider>> {
    principal.require_admin()?;
    Ok(Json(state.store.get_provider(&name).await?.provider))
}

/// Changes a provider; absent fields stay as they are, `"api_key": null` removes the
/// key. The gateways of every server take the change within about a second.
#[utoipa::path(patch, path = "/api/v1/model-providers/{name}", tag = "model-routes", security(("bearer" = [])),
    params(("name" = String, Path, description = "provider name")),
    request_body = ModelProviderUpdate,
    responses((status = 200, body = ModelProvider), (status = 404, body = gantry_types::ErrorBody),
        (status = 409, body = gantry_types::ErrorBody), (status = 422, body = gantry_types::ErrorBody)))]
pub async fn update(
    State(state): State<AppState>,
    AdminAuth(principal): AdminAuth,
    ApiPath(name): ApiPath<String>,
    ApiJson(request): ApiJson<ModelProviderUpdate>,
) -> ApiResult<Json<ModelProvider>> {
    let admin = principal.require_admin()?;
    let key_changed = request.api_key.is_some();
    let provider =
        service::providers::update(&state.store, &state.provider_keys, &name, request).await?;
    tracing::info!(by = %admin.username, provider = %provider.name, key_changed, "changed model provider");
    Ok(Json(provider))
}

/// Deletes a provider no route uses (409 naming the routes otherwise).
#[utoipa::path(delete, path = "/api/v1/model-providers/{name}", tag = "model-routes", security(("bearer" = [])),
    params(("name" = String, Path, description = "provider name")),
    responses((status = 204), (status = 404, body = gantry_types::ErrorBody),
        (status = 409, body = gantry_types::ErrorBody)))]
pub async fn delete(
    State(state): State<AppState>,
    AdminAuth(principal): AdminAuth,
    ApiPath(name): ApiPath<String>,
) -> ApiResult<StatusCode> {
    let admin = principal.require_admin()?;
    state.store.delete_provider(&name).await?;
    tracing::info!(by = %admin.username, provider = %name, "deleted model provider");
    Ok(StatusCode::NO_CONTENT)
}

/// Asks the provider which models it offers (its `GET /models`), now. 502 with the
/// provider's words when it cannot be reached or answers with an error.
#[utoipa::path(get, path = "/api/v1/model-providers/{name}/models", tag = "model-routes", security(("bearer" = [])),
    params(("name" = String, Path, description = "provider name")),
    responses((status = 200, body = ProviderModels), (status = 404, body = gantry_types::ErrorBody),
        (status = 502, body = gantry_types::ErrorBody)))]
pub async fn models(
    State(state): State<AppState>,
    Auth(principal): Auth,
    ApiPath(name): ApiPath<String>,
) -> ApiResult<Json<ProviderModels>> {
    principal.require_admin()?;
    Ok(Json(
        service::providers::discover(&state.store, &state.provider_keys, &name).await?,
    ))
}
