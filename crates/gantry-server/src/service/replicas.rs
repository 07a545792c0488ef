//! How many instances a model has: exactly `replicas`. The model controller applies
//! [`plan`] on every pass (the only place instances are created or removed for a count);
//! the rule of which instances go when a model shrinks lives here.

use std::collections::BTreeSet;

use gantry_types::{InstanceState, Model, ModelInstance};

/// What to do to bring a model's instances to its replica count.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ReplicaPlan {
    /// Replica numbers to create: the lowest free ones.
    pub create: Vec<u32>,
    /// Instances to delete, least useful first.
    pub delete: Vec<ModelInstance>,
}

impl ReplicaPlan {
    pub fn is_empty(&self) -> bool {
        self.create.is_empty() && self.delete.is_empty()
    }
}

/// How keepable an instance is when a model shrinks: lower goes first. Errored ones go
/// first, then any that is not serving, then serving ones.
fn keep_rank(state: InstanceState) -> u8 {
    match state {
        InstanceState::Error => 0,
        InstanceState::Running => 2,
        _ => 1,
    }
}

/// The plan for `model` whose instances are `instances` (of this model only). Among equally
/// keepable instances the newest goes first, so a scale-down undoes the latest scale-up.
pub fn plan(model: &Model, instances: &[ModelInstance]) -> ReplicaPlan {
    let wanted = model.replicas as usize;
    let mut plan = ReplicaPlan::default();
    if instances.len() < wanted {
        let taken: BTreeSet<u32> = instances.iter().map(|i| i.replica).collect();
        plan.create = (0u32..)
            .filter(|r| !taken.contains(r))
            .take(wanted - instances.len())
            .collect();
    } else if instances.len() > wanted {
        let mut victims = instances.to_vec();
        victims.sort_by(|a, b| {
            keep_rank(a.state)
                .cmp(&keep_rank(b.state))
                .then(b.created_at.cmp(&a.created_at))
                .then(b.id.cmp(&a.id))
        });
        victims.truncate(instances.len() - wanted);
        plan.delete = victims;
    }
    plan
}

#[cfg(test)]
mod tests {
    use gantry_types::fixtures;

    use super::*;

    fn model(replicas: u32) -> Model {
        Model {
            replicas,
            ..fixtures::model(1, "m")
        }
    }

    fn instance(id: i64, replica: u32, state: InstanceState) -> ModelInstance {
        fixtures::instance(id, &model(1), replica, state)
    }

    #[test]
    fn growing_fills_the_lowest_free_replica_numbers() {
        let have = [
            instance(1, 0, InstanceState::Running),
            instance(2, 2, InstanceState::Running),
        ];
        assert_eq!(plan(&model(4), &have).create, vec![1, 3]);
        assert!(plan(&model(2), &have).is_empty());
    }

    #[test]
    fn shrinking_removes_errored_then_not_running_then_the_newest() {
        let have = [
            instance(1, 0, InstanceState::Running),
            instance(2, 1, InstanceState::Scheduled),
            instance(3, 2, InstanceState::Running),
            instance(4, 3, InstanceState::Error),
            instance(5, 4, InstanceState::Pending),
        ];
        let ids = |plan: ReplicaPlan| plan.delete.iter().map(|i| i.id).collect::<Vec<_>>();
        assert_eq!(ids(plan(&model(4), &have)), vec![4]);
        assert_eq!(ids(plan(&model(2), &have)), vec![4, 5, 2]);
        assert_eq!(ids(plan(&model(1), &have)), vec![4, 5, 2, 3]);
        assert_eq!(ids(plan(&model(0), &have)).len(), 5);
    }
}
