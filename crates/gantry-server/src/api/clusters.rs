//! `/api/v1/clusters`: sets of workers with their own registration tokens, into which
//! models are deployed. Admins manage them; a cluster's administrators see it.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use axum::Json;
use gantry_types::{Cluster, ClusterCreate, ClusterRegistration, ClusterUpdate};

use super::created;
use crate::auth::{AdminAuth, Auth};
use crate::error::ApiResult;
use crate::extract::{ApiJson, ApiPath, ApiQuery};
use crate::service;
use crate::state::AppState;

/// Lists the clusters the caller may see (every one for an admin, the ones they
/// administer for anyone else), each with its counts and its state.
#[utoipa::path(get, path = "/api/v1/clusters", tag = "clusters", security(("bearer" = [])),
    responses((status = 200, body = Vec<Cluster>), (status = 401, body = gantry_types::ErrorBody),
        (status = 403, body = gantry_types::ErrorBody)))]
pub async fn list(
    State(state): State<AppState>,
    Auth(principal): Auth,
) -> ApiResult<Json<Vec<Cluster>>> {
    principal.require_user()?;
    Ok(Json(
        service::clusters::list(&state.store, &principal).await?,
    ))
}

/// Adds a cluster (`provider`: `custom` for machines you bring, `kubernetes` for a
/// Kubernetes cluster's GPU nodes) with a registration token of its own; see it, with the
/// command that joins a machine, at `GET /api/v1/clusters/{id}/registration-token`.
#[utoipa::path(post, path = "/api/v1/clusters", tag = "clusters", security(("bearer" = [])),
    request_body = ClusterCreate,
    responses((status = 201, body = Cluster), (status = 403, body = gantry_types::ErrorBody),
        (status = 409, body = gantry_types::ErrorBody), (status = 422, body = gantry_types::ErrorBody)))]
pub async fn create(
    State(state): State<AppState>,
    AdminAuth(principal): AdminAuth,
    ApiJson(request): ApiJson<ClusterCreate>,
) -> ApiResult<Response> {
    let admin = principal.require_admin()?;
    let cluster =
        service::clusters::create(&state.store, &state.registration_tokens, request).await?;
    tracing::info!(by = %admin.username, cluster_id = cluster.id, cluster = %cluster.name,
        provider = cluster.provider.as_str(), "created cluster");
    Ok(created(cluster))
}

/// Shows a cluster, to an admin or its administrator.
#[utoipa::path(get, path = "/api/v1/clusters/{id}", tag = "clusters", security(("bearer" = [])),
    params(("id" = i64, Path, description = "cluster id")),
    responses((status = 200, body = Cluster), (status = 403, body = gantry_types::ErrorBody),
        (status = 404, body = gantry_types::ErrorBody)))]
pub async fn get(
    State(state): State<AppState>,
    Auth(principal): Auth,
    ApiPath(id): ApiPath<i64>,
) -> ApiResult<Json<Cluster>> {
    Ok(Json(
        service::clusters::get(&state.store, &principal, id).await?,
    ))
}

/// Renames a cluster or changes its description or provider; absent fields stay. Its
/// workers, models and token are unchanged.
#[utoipa::path(patch, path = "/api/v1/clusters/{id}", tag = "clusters", security(("bearer" = [])),
    params(("id" = i64, Path, description = "cluster id")), request_body = ClusterUpdate,
    responses((status = 200, body = Cluster), (status = 404, body = gantry_types::ErrorBody),
        (status = 409, body = gantry_types::ErrorBody), (status = 422, body = gantry_types::ErrorBody)))]
pub async fn update(
    State(state): State<AppState>,
    AdminAuth(principal): AdminAuth,
    ApiPath(id): ApiPath<i64>,
    ApiJson(request): ApiJson<ClusterUpdate>,
) -> ApiResult<Json<Cluster>> {
    let admin = principal.require_admin()?;
    let cluster = service::clusters::update(&state.store, id, request).await?;
    tracing::info!(by = %admin.username, cluster_id = id, cluster = %cluster.name, "changed cluster");
    Ok(Json(cluster))
}

/// Deletes a cluster with no workers and no models (409 naming them otherwise); the
/// default cluster stays.
#[utoipa::path(delete, path = "/api/v1/clusters/{id}", tag = "clusters", security(("bearer" = [])),
    params(("id" = i64, Path, description = "cluster id")),
    responses((status = 204), (status = 404, body = gantry_types::ErrorBody),
        (status = 409, body = gantry_types::ErrorBody)))]
pub async fn delete(
    State(state): State<AppState>,
    AdminAuth(principal): AdminAuth,
    ApiPath(id): ApiPath<i64>,
) -> ApiResult<StatusCode> {
    let admin = principal.require_admin()?;
    let cluster = service::clusters::delete(&state.store, id).await?;
    tracing::info!(by = %admin.username, cluster_id = id, cluster = %cluster.name, "deleted cluster");
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Default, serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct RegistrationQuery {
    /// For a `kubernetes` cluster: the image its worker DaemonSet runs (gantry's
    /// Dockerfile, built and pushed where the nodes pull from). Default `gantry:<this
    /// server's version>`.
    #[param(max_length = 500, pattern = r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]*$")]
    pub image: Option<String>,
}

impl gantry_types::Validate for RegistrationQuery {
    fn validate(&self) -> Result<(), gantry_types::FieldError> {
        let Some(image) = &self.image else {
            return Ok(());
        };
        let plain = image.len() <= 500
            && image.starts_with(|c: char| c.is_ascii_alphanumeric())
            && image
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "._/:@+-".contains(c));
        if plain {
            Ok(())
        } else {
            Err(gantry_types::FieldError::new(
                "image",
                "must be an image reference such as registry.example.com/gantry:0.4.0",
            ))
        }
    }
}

/// The DaemonSet's image: the query's, else `gantry:<this server's version>`.
fn image_of(query: RegistrationQuery) -> String {
    query
        .image
        .unwrap_or_else(|| format!("gantry:{}", env!("CARGO_PKG_VERSION")))
}

/// The cluster's registration token and the `gantry worker` command that joins a machine
/// to it (for a `kubernetes` cluster also the manifests: the token as a Secret and a
/// worker DaemonSet on the GPU nodes). Admins only: the token lets any machine join.
#[utoipa::path(get, path = "/api/v1/clusters/{id}/registration-token", tag = "clusters", security(("bearer" = [])),
    params(("id" = i64, Path, description = "cluster id"), RegistrationQuery),
    responses((status = 200, body = ClusterRegistration), (status = 403, body = gantry_types::ErrorBody),
        (status = 404, body = gantry_types::ErrorBody), (status = 409, body = gantry_types::ErrorBody)))]
pub async fn registration(
    State(state): State<AppState>,
    Auth(principal): Auth,
    ApiPath(id): ApiPath<i64>,
    ApiQuery(query): ApiQuery<RegistrationQuery>,
) -> ApiResult<Json<ClusterRegistration>> {
    let admin = principal.require_admin()?;
    let joining = super::workers::joining(&state, image_of(query)).await?;
    let registration = service::clusters::registration(&state.store, &joining, id).await?;
    tracing::info!(by = %admin.username, cluster_id = id, cluster = %registration.cluster_name,
        "showed the cluster's registration token");
    Ok(Json(registration))
}

/// Replaces the cluster's registration token and answers the new one: machines join with
/// it from now on; workers already registered keep working (they use their own
/// credentials).
#[utoipa::path(post, path = "/api/v1/clusters/{id}/registration-token", tag = "clusters", security(("bearer" = [])),
    params(("id" = i64, Path, description = "cluster id"), RegistrationQuery),
    responses((status = 200, body = ClusterRegistration), (status = 403, body = gantry_types::ErrorBody),
        (status = 404, body = gantry_types::ErrorBody)))]
pub async fn rotate(
    State(state): State<AppState>,
    AdminAuth(principal): AdminAuth,
    ApiPath(id): ApiPath<i64>,
    ApiQuery(query): ApiQuery<RegistrationQuery>,
) -> ApiResult<Json<ClusterRegistration>> {
    let admin = principal.require_admin()?;
    let joining = super::workers::joining(&state, image_of(query)).await?;
    let registration = service::clusters::rotate(&state.store, &joining, id).await?;
    tracing::info!(by = %admin.username, cluster_id = id, cluster = %registration.cluster_name,
        "rotated the cluster's registration token");
    Ok(Json(registration))
}
