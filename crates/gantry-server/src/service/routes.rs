//! Model routes: their targets checked against what exists when they are written (a
//! deployed model by name, a provider and, when it lists them, one of its models).
//! What is deleted later makes a target unavailable, not the route invalid: the gateway
//! passes over it.

use gantry_store::{Store, StoreError};
use gantry_types::{ModelRoute, ModelRouteCreate, ModelRouteUpdate, RouteTarget};

use crate::error::{ApiError, ApiResult};

/// Adds a route.
pub async fn create(store: &Store, request: ModelRouteCreate) -> ApiResult<ModelRoute> {
    check_targets(store, &request.targets, &[]).await?;
    Ok(store
        .create_route(&request.name, &request.description, &request.targets)
        .await?)
}

/// Changes a route's description or replaces its targets.
pub async fn update(store: &Store, name: &str, update: ModelRouteUpdate) -> ApiResult<ModelRoute> {
    let route = store.get_route(name).await?;
    let targets = match update.targets {
        Some(targets) => {
            // Targets the route already has are kept as they are, even when their model
            // was deleted since (the gateway passes over it): only new ones must exist.
            check_targets(store, &targets, &route.targets).await?;
            targets
        }
        None => route.targets.clone(),
    };
    let description = update.description.unwrap_or(route.description);
    Ok(store
        .update_route(name, route.updated_at, &description, &targets)
        .await?)
}

/// 422 naming the first target that names nothing, leaving out those in `stored` (the
/// route's targets as they were).
async fn check_targets(
    store: &Store,
    targets: &[RouteTarget],
    stored: &[RouteTarget],
) -> ApiResult<()> {
    for (i, target) in targets.iter().enumerate() {
        if stored
            .iter()
            .any(|old| old.provider == target.provider && old.model == target.model)
        {
            continue;
        }
        match &target.provider {
            None => match store.get_model_by_name(&target.model).await {
                Ok(_) => {}
                Err(StoreError::NotFound { .. }) => {
                    return Err(ApiError::validation(format!(
                        "targets[{i}].model: no deployed model is named {:?}; deploy it first, \
                         or give `provider` for a provider's model",
                        target.model
                    )))
                }
                Err(e) => return Err(e.into()),
            },
            Some(provider) => {
                let stored = match store.get_provider(provider).await {
                    Ok(stored) => stored,
                    Err(StoreError::NotFound { .. }) => {
                        return Err(ApiError::validation(format!(
                            "targets[{i}].provider: no model provider is named {provider:?}"
                        )))
                    }
                    Err(e) => return Err(e.into()),
                };
                let offered = &stored.provider.models;
                if !offered.is_empty() && !offered.contains(&target.model) {
                    return Err(ApiError::validation(format!(
                        "targets[{i}].model: provider {provider} does not list {:?}; it offers {}",
                        target.model,
                        offered.join(", ")
                    )));
                }
            }
        }
    }
    Ok(())
}
