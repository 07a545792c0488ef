//! Model providers: their keys sealed before they are stored and never returned, the
//! routes that use them protected from their deletion, and their model lists asked of
//! them.

use gantry_auth::sealed::Sealer;
use gantry_store::{ProviderFields, Store, StoredProvider};
use gantry_types::{ModelProvider, ModelProviderCreate, ModelProviderUpdate, ProviderModels};

use crate::error::{ApiError, ApiResult};

/// Adds a provider, its key sealed.
pub async fn create(
    store: &Store,
    sealer: &Sealer,
    request: ModelProviderCreate,
) -> ApiResult<ModelProvider> {
    let fields = ProviderFields {
        description: request.description,
        base_url: request.base_url,
        api_key_sealed: request.api_key.as_deref().map(|key| sealer.seal(key)),
        headers: request.headers,
        timeout_seconds: request.timeout_seconds,
        models: request.models,
    };
    Ok(store
        .create_provider(&request.name, &fields)
        .await?
        .provider)
}

/// Applies a change: absent fields stay, `api_key: null` removes the key.
pub async fn update(
    store: &Store,
    sealer: &Sealer,
    name: &str,
    update: ModelProviderUpdate,
) -> ApiResult<ModelProvider> {
    let stored = store.get_provider(name).await?;
    let mut fields = ProviderFields::of(&stored);
    if let Some(description) = update.description {
        fields.description = description;
    }
    if let Some(base_url) = update.base_url {
        fields.base_url = base_url;
    }
    if let Some(key) = update.api_key {
        fields.api_key_sealed = key.as_deref().map(|key| sealer.seal(key));
    }
    if let Some(headers) = update.headers {
        fields.headers = headers;
    }
    if let Some(timeout) = update.timeout_seconds {
        fields.timeout_seconds = timeout;
    }
    if let Some(models) = update.models {
        fields.models = models;
    }
    let stored = store
        .update_provider(name, stored.provider.updated_at, &fields)
        .await?;
    Ok(stored.provider)
}

/// Asks the provider for its models (`GET {base_url}/models`).
pub async fn discover(store: &Store, sealer: &Sealer, name: &str) -> ApiResult<ProviderModels> {
    let stored = store.get_provider(name).await?;
    let key = open_key(sealer, &stored)?;
    let backend = gantry_gateway::providers::backend(&stored.provider, key.as_deref())
        .map_err(|e| ApiError::validation(e.to_string()))?;
    let models = gantry_gateway::providers::discover_models(&backend)
        .await
        .map_err(|e| {
            ApiError::new(
                gantry_types::ErrorCode::ProviderError,
                format!("model provider {name} at {}: {e}", stored.provider.base_url),
            )
        })?;
    Ok(ProviderModels {
        provider: stored.provider.name,
        models,
    })
}

fn open_key(sealer: &Sealer, stored: &StoredProvider) -> ApiResult<Option<String>> {
    match &stored.api_key_sealed {
        None => Ok(None),
        Some(sealed) => sealer.open(sealed).map(Some).map_err(|e| {
            ApiError::conflict(format!(
                "the API key of model provider {}: {e}",
                stored.provider.name
            ))
        }),
    }
}
