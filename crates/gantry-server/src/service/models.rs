//! Models: declaring, changing and removing what is served.
//!
//! A model is the desired state; its instances follow through the controllers: the model
//! controller brings the instance count to `replicas` ([`super::replicas`]), the roll
//! controller moves instances whose launch settings no longer match the model onto the new
//! ones, one at a time, and the scheduler places what is pending.

use gantry_store::Store;
use gantry_types::{Model, ModelCreate, ModelUpdate};

use crate::error::ApiResult;

/// Declares a model; its instances appear with the next controller pass.
pub async fn create(store: &Store, create: &ModelCreate) -> ApiResult<Model> {
    Ok(store.create_model(create).await?)
}

/// Applies a validated update. Changing what an instance runs (source, backend, arguments,
/// environment, command, data parallelism) rolls the model's instances; changing only
/// replicas, selectors or descriptions restarts nothing.
pub async fn update(store: &Store, id: i64, update: ModelUpdate) -> ApiResult<(Model, bool)> {
    let mut model = store.get_model(id).await?;
    let before = model.launch_template();
    model.apply(update);
    let rolls = model.launch_template() != before;
    Ok((store.update_model(&model).await?, rolls))
}

/// Removes a model and every instance of it (their workers stop them).
pub async fn delete(store: &Store, id: i64) -> ApiResult<Model> {
    Ok(store.delete_model(id).await?)
}
