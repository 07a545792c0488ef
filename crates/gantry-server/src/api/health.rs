//! Liveness and readiness probes.

use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;

use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

/// A probe's answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct HealthStatus {
    pub status: &'static str,
}

/// The process is alive and serving HTTP.
#[utoipa::path(get, path = "/healthz", tag = "health",
    responses((status = 200, body = HealthStatus)))]
pub async fn healthz() -> Json<HealthStatus> {
    Json(HealthStatus { status: "ok" })
}

/// The store answers and every migration is applied.
#[utoipa::path(get, path = "/readyz", tag = "health",
    responses((status = 200, body = HealthStatus), (status = 503, body = gantry_types::ErrorBody)))]
pub async fn readyz(
    axum::extract::State(state): axum::extract::State<AppState>,
) -> ApiResult<Json<HealthStatus>> {
    if state.draining.is_cancelled() {
        return Err(ApiError::unavailable(
            "this server is shutting down; use another server",
        ));
    }
    if let Some(why) = state.store.unreachable() {
        return Err(ApiError::unavailable(format!(
            "database unreachable: {why}"
        )));
    }
    match state.store.migrations_done().await {
        Ok(true) => Ok(Json(HealthStatus { status: "ready" })),
        Ok(false) => Err(ApiError::unavailable(
            "database migrations are not applied yet",
        )),
        Err(e) => Err(ApiError::unavailable(format!("database unreachable: {e}"))),
    }
}
