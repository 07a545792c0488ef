//! Which store changes wake the control loop: those that can let a pass do something new.

use std::collections::HashMap;
use std::sync::Arc;

use gantry_store::{Change, ChangeKind};
use gantry_types::InstanceState;
use tokio::sync::broadcast;

/// Whether a committed change may let a pass do something new. Instances the scheduler
/// itself moves to `analyzing` or `scheduled`, and worker reports of `starting`, do not;
/// an instance becoming `running` does (a roll waits for it); users and API keys never
/// do. Worker changes are left to
/// [`TriggerFilter`], which knows what the scheduler saw of the worker before.
pub fn triggers_pass(change: &Change) -> bool {
    match change {
        Change::Worker(..) | Change::Model(..) => true,
        Change::Instance(ChangeKind::Created | ChangeKind::Deleted, _) => true,
        Change::Instance(ChangeKind::Updated, instance) => matches!(
            instance.state,
            InstanceState::Pending
                | InstanceState::Running
                | InstanceState::Error
                | InstanceState::Unreachable
        ),
        _ => false,
    }
}

/// [`triggers_pass`], except that a worker update triggers only when something placement
/// looks at changed (state, labels, backends, GPUs, memory totals): workers report their
/// utilisation often, and those reports alone cannot make a placement possible.
///
/// An instance becoming `running` triggers only while [`TriggerFilter::wake_on_running`]
/// says so (the loop sets it from each pass).
#[derive(Debug)]
pub struct TriggerFilter {
    workers: HashMap<i64, gantry_sched::WorkerView>,
    running_matters: bool,
}

impl Default for TriggerFilter {
    fn default() -> Self {
        Self {
            workers: HashMap::new(),
            running_matters: true,
        }
    }
}

impl TriggerFilter {
    /// Whether an instance becoming `running` triggers from now on.
    pub fn wake_on_running(&mut self, matters: bool) {
        self.running_matters = matters;
    }

    pub fn triggers(&mut self, change: &Change) -> bool {
        match change {
            Change::Instance(ChangeKind::Updated, instance)
                if instance.state == InstanceState::Running =>
            {
                self.running_matters
            }
            Change::Worker(ChangeKind::Deleted, worker) => {
                self.workers.remove(&worker.id);
                true
            }
            Change::Worker(_, worker) => {
                let view = super::snapshot::worker_view(worker);
                self.workers.insert(worker.id, view.clone()) != Some(view)
            }
            other => triggers_pass(other),
        }
    }

    /// Forgets what it saw: after missed changes, the next worker update triggers.
    pub fn clear(&mut self) {
        self.workers.clear();
    }

    /// Waits for a change that triggers; a lagged receiver counts as one (changes were
    /// missed, so anything may have happened). Never returns once the store is gone.
    pub async fn next_trigger(&mut self, changes: &mut broadcast::Receiver<Arc<Change>>) {
        loop {
            match changes.recv().await {
                Ok(change) if self.triggers(&change) => return,
                Ok(_) => {}
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    self.clear();
                    return;
                }
                Err(broadcast::error::RecvError::Closed) => std::future::pending::<()>().await,
            }
        }
    }

    /// Discards the changes already queued (the pass about to run reads the store anew),
    /// letting the filter see the worker updates among them.
    pub fn drain(&mut self, changes: &mut broadcast::Receiver<Arc<Change>>) {
        loop {
            match changes.try_recv() {
                Ok(change) => {
                    self.triggers(&change);
                }
                Err(broadcast::error::TryRecvError::Lagged(_)) => self.clear(),
                Err(_) => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use gantry_types::{fixtures, Timestamp, Worker, WorkerState};

    use super::*;

    #[test]
    fn only_changes_that_matter_trigger_a_pass() {
        let model = fixtures::model(1, "m");
        let instance = |state| fixtures::instance(1, &model, 0, state);
        let updated = |state| Change::Instance(ChangeKind::Updated, instance(state));
        assert!(triggers_pass(&Change::Instance(
            ChangeKind::Created,
            instance(InstanceState::Pending)
        )));
        assert!(triggers_pass(&Change::Instance(
            ChangeKind::Deleted,
            instance(InstanceState::Running)
        )));
        assert!(triggers_pass(&updated(InstanceState::Unreachable)));
        assert!(triggers_pass(&updated(InstanceState::Error)));
        assert!(triggers_pass(&updated(InstanceState::Pending)));
        assert!(!triggers_pass(&updated(InstanceState::Scheduled)));
        assert!(!triggers_pass(&updated(InstanceState::Analyzing)));
        assert!(
            triggers_pass(&updated(InstanceState::Running)),
            "a roll waits for instances to run"
        );
        assert!(!triggers_pass(&updated(InstanceState::Starting)));
    }

    #[test]
    fn worker_updates_trigger_only_when_placement_inputs_change() {
        let mut worker = fixtures::worker(1, 0);
        let mut filter = TriggerFilter::default();
        let updated = |w: &Worker| Change::Worker(ChangeKind::Updated, w.clone());
        assert!(filter.triggers(&updated(&worker)), "first sight");
        assert!(!filter.triggers(&updated(&worker)), "nothing changed");
        worker.status.system.load_average = 3.0;
        worker.last_heartbeat_at = Some(Timestamp::from_millis(5));
        assert!(
            !filter.triggers(&updated(&worker)),
            "load is not a placement input"
        );
        worker.state = WorkerState::NotReady;
        assert!(filter.triggers(&updated(&worker)));
        worker.labels.insert("zone".into(), "a".into());
        assert!(filter.triggers(&updated(&worker)));
        assert!(filter.triggers(&Change::Worker(ChangeKind::Deleted, worker.clone())));
        assert!(
            filter.triggers(&updated(&worker)),
            "seen anew after deletion"
        );
    }

    #[test]
    fn running_instances_trigger_only_while_a_pass_waits_for_them() {
        let model = fixtures::model(1, "m");
        let change =
            |state| Change::Instance(ChangeKind::Updated, fixtures::instance(1, &model, 0, state));
        let mut filter = TriggerFilter::default();
        assert!(
            filter.triggers(&change(InstanceState::Running)),
            "until told"
        );
        filter.wake_on_running(false);
        assert!(!filter.triggers(&change(InstanceState::Running)));
        assert!(filter.triggers(&change(InstanceState::Error)));
        assert!(filter.triggers(&change(InstanceState::Pending)));
        filter.wake_on_running(true);
        assert!(filter.triggers(&change(InstanceState::Running)));
    }
}
