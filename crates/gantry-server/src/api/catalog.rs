//! `/api/v1/model-catalog`: the well-known models to deploy (see `crate::catalog`).

use axum::extract::State;
use axum::Json;
use gantry_types::ModelCatalog;

use crate::auth::Auth;
use crate::error::ApiResult;
use crate::state::AppState;

/// The model catalog: well-known models with their source, backend, size and suggested
/// arguments. An entry's `name`, `source`, `backend` and `backend_args` make a
/// `POST /api/v1/models` body (estimate it first with `POST /api/v1/models/estimate`).
/// Built in, or the server's `model_catalog_file`.
#[utoipa::path(get, path = "/api/v1/model-catalog", tag = "models", security(("bearer" = [])),
    responses((status = 200, body = ModelCatalog), (status = 401, body = gantry_types::ErrorBody)))]
pub async fn list(
    State(state): State<AppState>,
    Auth(principal): Auth,
) -> ApiResult<Json<ModelCatalog>> {
    principal.require_user()?;
    Ok(Json(state.catalog.clone()))
}
