//! The model controller: every model has exactly `replicas` instances. It is the one place
//! instances are created for a model or removed when it shrinks; which ones go is the rule
//! in [`crate::service::replicas`]. Deleting one instance by hand leaves the count short, so
//! this controller creates a replacement: that is how an admin restarts a replica.
//!
//! Writes are conditional: a replica number already taken is skipped, and an instance is
//! deleted only if it has not changed since the pass read it, so a decision taken from a
//! stale read changes nothing and the next pass decides again.

use std::collections::HashMap;

use gantry_store::{Fence, Store, StoreError};
use gantry_types::{Model, ModelInstance};

use crate::service::replicas;

/// Brings every model of `models` to its replica count, given all `instances`. A failure
/// for one model is logged and does not stop the others; returns how many models had
/// instances to create or remove (whether or not that succeeded), so the caller knows
/// `instances` may be stale. A stale fence stops it: [`StoreError::Fenced`].
pub async fn reconcile_replicas(
    store: &Store,
    models: &[Model],
    instances: &[ModelInstance],
    fence: &Fence,
) -> Result<usize, StoreError> {
    let mut by_model: HashMap<i64, Vec<ModelInstance>> = HashMap::new();
    for instance in instances {
        by_model
            .entry(instance.model_id)
            .or_default()
            .push(instance.clone());
    }
    let mut changed = 0;
    for model in models {
        let mine = by_model.remove(&model.id).unwrap_or_default();
        let plan = replicas::plan(model, &mine);
        if plan.is_empty() {
            continue;
        }
        changed += 1;
        if let Err(e) = apply(store, model, &plan, fence).await {
            if matches!(e, StoreError::Fenced { .. }) {
                return Err(e);
            }
            tracing::warn!(model = %model.name, model_id = model.id, error = %e,
                "reconcile the model's replica count");
        }
    }
    Ok(changed)
}

async fn apply(
    store: &Store,
    model: &Model,
    plan: &replicas::ReplicaPlan,
    fence: &Fence,
) -> Result<(), StoreError> {
    let created = store.create_instances(model, &plan.create, fence).await?;
    for instance in &created {
        tracing::info!(model = %model.name, model_id = model.id, instance = %instance.name,
            instance_id = instance.id, "created instance");
    }
    for victim in &plan.delete {
        if store
            .delete_instance_if_unchanged(victim, fence)
            .await?
            .is_some()
        {
            tracing::info!(model = %model.name, model_id = model.id, instance = %victim.name,
                instance_id = victim.id, state = victim.state.as_str(),
                replicas = model.replicas, "removed instance: the model has fewer replicas");
        }
    }
    Ok(())
}
