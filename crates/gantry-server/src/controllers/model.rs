//! The model controller: every model has exactly `replicas` instances.
//!
//! The store already reconciles the count inside the transaction that changes a model,
//! so this controller heals what happens outside one: an instance deleted on its own (an
//! admin restarting a replica), a change whose reconciliation failed, or rows left by an
//! older server. It calls [`Store::reconcile_model_replicas`] per model on every pass;
//! that function picks what to remove when scaling down (errored first, then instances
//! not running, then the newest) and publishes what it created and deleted.

use gantry_store::{Store, StoreError};
use gantry_types::Model;

/// Reconciles the replica count of every model in `models`. A failure for one model is
/// logged and does not stop the others; the count of failures is returned.
pub async fn reconcile_replicas(store: &Store, models: &[Model]) -> usize {
    let mut failures = 0;
    for model in models {
        match store.reconcile_model_replicas(model.id).await {
            Ok(()) => {}
            // Deleted meanwhile, or another writer created the same replica first: the
            // next pass sees the outcome.
            Err(StoreError::NotFound { .. } | StoreError::Conflict { .. }) => {}
            Err(e) => {
                failures += 1;
                tracing::warn!(model = %model.name, model_id = model.id, error = %e,
                    "reconcile the model's replica count");
            }
        }
    }
    failures
}
