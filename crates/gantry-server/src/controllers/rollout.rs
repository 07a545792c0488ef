//! The roll controller: moves the instances of a changed model onto its new launch
//! settings, one serving instance at a time.
//!
//! Every placed instance runs the [`LaunchTemplate`] pinned in its placement record. When
//! the model's template differs (its source, backend, arguments, environment, command or
//! data parallelism changed), the instance is *outdated*, and:
//!
//! * an outdated instance that is not serving (`scheduled`, `starting`, `error`,
//!   `unreachable`) is moved at once: nothing is lost by it;
//! * an outdated `running` instance is moved only when every other instance of the model is
//!   `running` — so at least one keeps serving while another restarts, and a roll whose new
//!   settings fail (the moved instance ends in `error`) stops there instead of taking every
//!   instance down; a model with a single instance has nothing to keep and moves it.
//!
//! Moving means going back through the scheduler (unplaced, then placed with a fresh
//! estimate of the new settings, which may need different memory) — except for an instance
//! placed by hand, which is started anew where it is. A record that cannot be read counts
//! as outdated: the roll is how such an instance gets a record again.
//!
//! The worker sees the instance leave (or its record change) and stops the old process; the
//! gateway stops routing to it as soon as it is no longer `running`.

use gantry_store::{Fence, Store, StoreError};
use gantry_types::{InstanceState, LaunchTemplate, Model, ModelInstance, PlacementRecord};

/// One move of the roll.
#[derive(Debug, Clone, PartialEq)]
pub enum RollStep {
    /// Back to `pending`, for the scheduler to place with the new settings.
    Unplace(ModelInstance),
    /// Placed by hand: started anew on the same worker and GPUs.
    Relaunch(ModelInstance),
}

/// Whether `instance` is placed and runs other settings than `template`.
fn outdated(instance: &ModelInstance, template: &LaunchTemplate) -> bool {
    instance.worker_id.is_some()
        && instance
            .placement
            .as_ref()
            .is_none_or(|record| record.launch != *template)
}

fn step(instance: &ModelInstance) -> RollStep {
    let by_hand = instance
        .placement
        .as_ref()
        .is_some_and(|record| record.reservation.is_none());
    if by_hand {
        RollStep::Relaunch(instance.clone())
    } else {
        RollStep::Unplace(instance.clone())
    }
}

/// The moves to make now for `model`, whose instances are `instances`.
pub fn plan(model: &Model, instances: &[ModelInstance]) -> Vec<RollStep> {
    let template = model.launch_template();
    let mut steps: Vec<RollStep> = instances
        .iter()
        .filter(|i| outdated(i, &template) && i.state != InstanceState::Running)
        .map(step)
        .collect();
    let mut serving_outdated: Vec<&ModelInstance> = instances
        .iter()
        .filter(|i| outdated(i, &template) && i.state == InstanceState::Running)
        .collect();
    serving_outdated.sort_by_key(|i| (i.replica, i.id));
    if let Some(next) = serving_outdated.first() {
        let others_serving = instances
            .iter()
            .filter(|i| i.id != next.id)
            .all(|i| i.state == InstanceState::Running);
        if others_serving {
            steps.push(step(next));
        }
    }
    steps
}

/// Whether some instance of `models` runs other settings than its model's: a roll is under
/// way, and waits for instances to be `running`.
pub fn under_way(models: &[Model], instances: &[ModelInstance]) -> bool {
    let templates: std::collections::HashMap<i64, LaunchTemplate> = models
        .iter()
        .map(|model| (model.id, model.launch_template()))
        .collect();
    instances.iter().any(|instance| {
        templates
            .get(&instance.model_id)
            .is_some_and(|template| outdated(instance, template))
    })
}

/// Makes this pass's moves for every model; returns how many instances moved.
pub async fn roll(
    store: &Store,
    models: &[Model],
    instances: &[ModelInstance],
    fence: &Fence,
) -> Result<usize, StoreError> {
    let mut moved = 0;
    for model in models {
        let mine: Vec<ModelInstance> = instances
            .iter()
            .filter(|i| i.model_id == model.id)
            .cloned()
            .collect();
        for step in plan(model, &mine) {
            let (instance, done) = match &step {
                RollStep::Unplace(instance) => {
                    let Some(worker_id) = instance.worker_id else {
                        continue;
                    };
                    let done = store
                        .unplace_instance(
                            instance.id,
                            instance.state,
                            worker_id,
                            "moving onto the model's new settings",
                            fence,
                        )
                        .await?;
                    (instance, done.is_some())
                }
                RollStep::Relaunch(instance) => {
                    let record = PlacementRecord::by_hand(model);
                    let done = store
                        .relaunch_instance(
                            instance,
                            &record,
                            "restarting with the model's new settings (placed by hand)",
                            fence,
                        )
                        .await?;
                    (instance, done.is_some())
                }
            };
            if done {
                moved += 1;
                tracing::info!(model = %model.name, model_id = model.id, instance = %instance.name,
                    instance_id = instance.id, state = instance.state.as_str(),
                    worker = instance.worker_name.as_deref().unwrap_or(""),
                    "rolling instance onto the model's new settings");
            }
        }
    }
    Ok(moved)
}

#[cfg(test)]
mod tests {
    use gantry_types::{fixtures, Reservation};

    use super::*;

    fn model(args: &[&str]) -> Model {
        Model {
            backend_args: args.iter().map(|a| (*a).to_owned()).collect(),
            replicas: 2,
            ..fixtures::model(1, "m")
        }
    }

    /// An instance placed by the scheduler on worker 1 for `placed_for`, in `state`.
    fn instance(id: i64, placed_for: &Model, state: InstanceState) -> ModelInstance {
        let mut record = PlacementRecord::by_hand(placed_for);
        record.reservation = Some(Reservation {
            claim: gantry_backends::custom::declared_claim(&Default::default())
                .expect("default claim"),
            placement: gantry_types::Placement {
                instance_id: id,
                worker_id: 1,
                worker_name: "w1".into(),
                gpus: Vec::new(),
                ram_bytes: 0,
                kind: gantry_types::PlacementKind::CpuOnly,
                tensor_parallel_size: 1,
                data_parallel_size: 1,
                llama: None,
            },
            parts: None,
        });
        let replica = u32::try_from(id).expect("small");
        ModelInstance {
            worker_id: Some(1),
            worker_name: Some("w1".into()),
            placement: Some(record),
            ..fixtures::instance(id, placed_for, replica, state)
        }
    }

    fn ids(steps: &[RollStep]) -> Vec<i64> {
        steps
            .iter()
            .map(|s| match s {
                RollStep::Unplace(i) | RollStep::Relaunch(i) => i.id,
            })
            .collect()
    }

    #[test]
    fn nothing_moves_while_every_instance_runs_the_models_settings() {
        let m = model(&["-c", "256"]);
        let all = [
            instance(0, &m, InstanceState::Running),
            instance(1, &m, InstanceState::Starting),
        ];
        assert!(plan(&m, &all).is_empty());
    }

    #[test]
    fn serving_instances_move_one_at_a_time_while_the_others_serve() {
        let old = model(&["-c", "256"]);
        let new = model(&["-c", "512"]);
        let both_old = [
            instance(0, &old, InstanceState::Running),
            instance(1, &old, InstanceState::Running),
        ];
        assert_eq!(ids(&plan(&new, &both_old)), vec![0], "the first of two");
        // While instance 0 comes back, instance 1 keeps serving the old settings.
        let rolling = [
            instance(0, &new, InstanceState::Starting),
            instance(1, &old, InstanceState::Running),
        ];
        assert!(plan(&new, &rolling).is_empty());
        let unplaced = [
            ModelInstance {
                worker_id: None,
                placement: None,
                ..instance(0, &new, InstanceState::Pending)
            },
            instance(1, &old, InstanceState::Running),
        ];
        assert!(
            plan(&new, &unplaced).is_empty(),
            "pending counts as not serving"
        );
        let back = [
            instance(0, &new, InstanceState::Running),
            instance(1, &old, InstanceState::Running),
        ];
        assert_eq!(ids(&plan(&new, &back)), vec![1], "then the second");
    }

    #[test]
    fn a_roll_whose_new_settings_fail_stops() {
        let old = model(&["-c", "256"]);
        let new = model(&["--no-such-flag"]);
        let failed = [
            instance(0, &new, InstanceState::Error),
            instance(1, &old, InstanceState::Running),
        ];
        assert!(plan(&new, &failed).is_empty(), "the last one keeps serving");
    }

    #[test]
    fn instances_not_serving_move_at_once_and_a_lone_instance_moves_too() {
        let old = model(&["-c", "256"]);
        let new = model(&["-c", "512"]);
        let mixed = [
            instance(0, &old, InstanceState::Error),
            instance(1, &old, InstanceState::Starting),
            instance(2, &old, InstanceState::Running),
        ];
        assert_eq!(ids(&plan(&new, &mixed)), vec![0, 1]);
        let alone = [instance(0, &old, InstanceState::Running)];
        assert_eq!(ids(&plan(&new, &alone)), vec![0]);
    }

    #[test]
    fn unreadable_records_are_moved_and_hand_placed_ones_restart_in_place() {
        let m = model(&["-c", "256"]);
        let unreadable = ModelInstance {
            placement: None,
            ..instance(0, &m, InstanceState::Starting)
        };
        assert!(matches!(
            plan(&m, &[unreadable])[..],
            [RollStep::Unplace(_)]
        ));
        let old = model(&["-c", "128"]);
        let mut by_hand = instance(0, &old, InstanceState::Running);
        if let Some(record) = &mut by_hand.placement {
            record.reservation = None;
        }
        assert!(matches!(plan(&m, &[by_hand])[..], [RollStep::Relaunch(_)]));
    }
}
