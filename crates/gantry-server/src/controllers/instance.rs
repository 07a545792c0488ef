//! The instance controller: an instance whose worker was lost (`unreachable`) or gave up
//! on it (`error`, after the worker's own restart budget) is taken off that worker and
//! made `pending` again, so the scheduler places it anew — on another worker when one
//! fits, see the scheduler.
//!
//! Rescheduling waits, with a delay that doubles per reschedule of the same instance
//! ([`RescheduleBackoff`]): a model that fails everywhere does not hop between workers
//! in a tight loop, and a worker that was only briefly silent gets a moment to report
//! back. The bookkeeping is in memory: a new leader starts every instance from the base
//! delay, which errs on the side of retrying sooner. An instance that has not been
//! rescheduled for [`FORGET_AFTER`] starts from the base delay again.
//!
//! The message the instance had is kept: `rescheduling after: <old message>`.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use gantry_store::{Fence, Store, StoreError};
use gantry_types::{InstanceState, ModelInstance};
use tokio::time::Instant;

use super::run_loop::Action;

/// How long after its last reschedule an instance's backoff is forgotten.
pub const FORGET_AFTER: Duration = Duration::from_secs(3600);

/// The prefix of the message of a rescheduled instance.
pub const RESCHEDULE_NOTE: &str = "rescheduling after: ";

/// An instance that lost its worker: in `unreachable` or `error`, still on that worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LostInstance {
    pub id: i64,
    pub name: String,
    pub state: InstanceState,
    pub worker_id: i64,
    pub worker_name: String,
    pub state_message: String,
}

impl LostInstance {
    /// The instance as a lost one, when it is.
    pub fn of(instance: &ModelInstance) -> Option<Self> {
        if !matches!(
            instance.state,
            InstanceState::Unreachable | InstanceState::Error
        ) {
            return None;
        }
        Some(LostInstance {
            id: instance.id,
            name: instance.name.clone(),
            state: instance.state,
            worker_id: instance.worker_id?,
            worker_name: instance.worker_name.clone().unwrap_or_default(),
            state_message: instance.state_message.clone(),
        })
    }

    /// The message it gets when it is taken off its worker.
    pub fn reschedule_message(&self) -> String {
        let old = if self.state_message.is_empty() {
            format!("{} on worker {}", self.state.as_str(), self.worker_name)
        } else {
            self.state_message.clone()
        };
        format!("{RESCHEDULE_NOTE}{old}")
    }
}

/// Takes lost instances (of `instances`) off their workers once their backoff has
/// passed. Returns when the next backoff falls due, and the instances that an `error` took
/// off a worker with that worker (their next placement prefers another).
/// What [`reschedule_lost`] did.
#[derive(Debug)]
pub struct Rescheduled {
    /// When to look again (the next reschedule that falls due).
    pub action: Action,
    /// (instance, worker) of instances taken back from a worker that gave them up
    /// (`error`): their next placement prefers another worker.
    pub gave_up: Vec<(i64, i64)>,
    /// Instances put back to `pending` now.
    pub count: usize,
}

pub async fn reschedule_lost(
    store: &Store,
    backoff: &mut RescheduleBackoff,
    instances: &[ModelInstance],
    fence: &Fence,
) -> Result<Rescheduled, StoreError> {
    let lost: Vec<LostInstance> = instances.iter().filter_map(LostInstance::of).collect();
    let now = Instant::now();
    let (due, next) = backoff.due(&lost, now);
    let mut gave_up = Vec::new();
    let mut rescheduled = 0;
    for instance in due {
        let message = instance.reschedule_message();
        let unplaced = store
            .unplace_instance(
                instance.id,
                instance.state,
                instance.worker_id,
                &message,
                fence,
            )
            .await?;
        if unplaced.is_some() {
            rescheduled += 1;
            backoff.rescheduled(instance.id, now);
            if instance.state == InstanceState::Error {
                gave_up.push((instance.id, instance.worker_id));
            }
            tracing::warn!(instance = %instance.name, instance_id = instance.id,
                worker = %instance.worker_name, state = instance.state.as_str(),
                reason = %instance.state_message, "rescheduling instance");
        }
    }
    Ok(Rescheduled {
        action: next.map_or(Action::AwaitChange, Action::RequeueAt),
        gave_up,
        count: rescheduled,
    })
}

/// `reason`, followed by the reschedule note of `current_message` when it has one, so a
/// rescheduled instance keeps saying why it moved while the scheduler explains its
/// placement. Idempotent: applied to its own output it gives the same message.
pub fn with_reschedule_note(reason: &str, current_message: &str) -> String {
    match current_message.find(RESCHEDULE_NOTE) {
        Some(start) => format!("{reason}; {}", &current_message[start..]),
        None => reason.to_owned(),
    }
}

fn backoff_delay(base: Duration, cap: Duration, reschedules: u32) -> Duration {
    let factor = 2u32.saturating_pow(reschedules.min(20));
    base.saturating_mul(factor).min(cap)
}

/// Per-instance reschedule delays: `base × 2^reschedules`, capped.
#[derive(Debug)]
pub struct RescheduleBackoff {
    base: Duration,
    cap: Duration,
    entries: HashMap<i64, Entry>,
}

#[derive(Debug)]
struct Entry {
    /// Reschedules of this instance so far.
    reschedules: u32,
    last_rescheduled: Option<Instant>,
    /// Since when it has been lost in this state on this worker.
    lost: Option<(InstanceState, i64, Instant)>,
}

impl RescheduleBackoff {
    pub fn new(base: Duration, cap: Duration) -> Self {
        RescheduleBackoff {
            base,
            cap,
            entries: HashMap::new(),
        }
    }

    /// The wait before rescheduling an instance rescheduled `reschedules` times before.
    pub fn delay(&self, reschedules: u32) -> Duration {
        backoff_delay(self.base, self.cap, reschedules)
    }

    /// Looks at the instances lost now: returns those whose delay has passed, and the
    /// earliest time another one will be due.
    pub fn due(
        &mut self,
        lost: &[LostInstance],
        now: Instant,
    ) -> (Vec<LostInstance>, Option<Instant>) {
        let lost_ids: HashSet<i64> = lost.iter().map(|l| l.id).collect();
        self.entries.retain(|id, entry| {
            if !lost_ids.contains(id) {
                entry.lost = None;
            }
            entry.lost.is_some()
                || entry
                    .last_rescheduled
                    .is_some_and(|at| now < at + FORGET_AFTER)
        });
        let (base, cap) = (self.base, self.cap);
        let mut due = Vec::new();
        let mut next = None::<Instant>;
        for instance in lost {
            let entry = self.entries.entry(instance.id).or_insert(Entry {
                reschedules: 0,
                last_rescheduled: None,
                lost: None,
            });
            let since = match entry.lost {
                Some((state, worker, since))
                    if state == instance.state && worker == instance.worker_id =>
                {
                    since
                }
                _ => {
                    entry.lost = Some((instance.state, instance.worker_id, now));
                    now
                }
            };
            let at = since + backoff_delay(base, cap, entry.reschedules);
            if now >= at {
                due.push(instance.clone());
            } else {
                next = Some(next.map_or(at, |n| n.min(at)));
            }
        }
        (due, next)
    }

    /// Counts a reschedule of the instance.
    pub fn rescheduled(&mut self, id: i64, now: Instant) {
        if let Some(entry) = self.entries.get_mut(&id) {
            entry.reschedules = entry.reschedules.saturating_add(1);
            entry.last_rescheduled = Some(now);
            entry.lost = None;
        }
    }

    /// Forgets everything (a new leadership term).
    pub fn clear(&mut self) {
        self.entries.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lost(id: i64, state: InstanceState, worker_id: i64) -> LostInstance {
        LostInstance {
            id,
            name: format!("m-{id}"),
            state,
            worker_id,
            worker_name: format!("w{worker_id}"),
            state_message: "worker w1 is unreachable".to_owned(),
        }
    }

    #[test]
    fn delay_doubles_per_reschedule_up_to_the_cap() {
        let backoff = RescheduleBackoff::new(Duration::from_secs(10), Duration::from_secs(300));
        let delays: Vec<u64> = (0..7).map(|n| backoff.delay(n).as_secs()).collect();
        assert_eq!(delays, [10, 20, 40, 80, 160, 300, 300]);
        assert_eq!(backoff.delay(u32::MAX), Duration::from_secs(300));
    }

    #[tokio::test(start_paused = true)]
    async fn lost_instances_are_due_after_their_delay() {
        let mut backoff = RescheduleBackoff::new(Duration::from_secs(10), Duration::from_secs(300));
        let start = Instant::now();
        let a = lost(1, InstanceState::Unreachable, 1);
        let (due, next) = backoff.due(std::slice::from_ref(&a), start);
        assert!(due.is_empty());
        assert_eq!(next, Some(start + Duration::from_secs(10)));
        let (due, _) = backoff.due(std::slice::from_ref(&a), start + Duration::from_secs(9));
        assert!(due.is_empty());
        let (due, next) = backoff.due(std::slice::from_ref(&a), start + Duration::from_secs(10));
        assert_eq!(due, vec![a.clone()]);
        assert_eq!(next, None);
        backoff.rescheduled(1, start + Duration::from_secs(10));

        // Lost again on another worker: the clock starts over, with twice the delay.
        let again = lost(1, InstanceState::Error, 2);
        let t = start + Duration::from_secs(60);
        let (due, next) = backoff.due(std::slice::from_ref(&again), t);
        assert!(due.is_empty());
        assert_eq!(next, Some(t + Duration::from_secs(20)));
        let (due, _) = backoff.due(std::slice::from_ref(&again), t + Duration::from_secs(20));
        assert_eq!(due.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn recovered_instances_are_forgotten_after_an_hour() {
        let mut backoff = RescheduleBackoff::new(Duration::from_secs(10), Duration::from_secs(300));
        let start = Instant::now();
        let a = lost(1, InstanceState::Error, 1);
        backoff.due(std::slice::from_ref(&a), start);
        backoff.due(std::slice::from_ref(&a), start + Duration::from_secs(10));
        backoff.rescheduled(1, start + Duration::from_secs(10));
        // Recovered (not lost) for a while: the count is kept…
        backoff.due(&[], start + Duration::from_secs(100));
        let t = start + Duration::from_secs(200);
        let (_, next) = backoff.due(std::slice::from_ref(&a), t);
        assert_eq!(next, Some(t + Duration::from_secs(20)));
        // …and after it was not lost for an hour past its last reschedule, dropped.
        backoff.due(&[], t);
        let t = start + FORGET_AFTER + Duration::from_secs(11);
        backoff.due(&[], t);
        let (_, next) = backoff.due(std::slice::from_ref(&a), t);
        assert_eq!(next, Some(t + Duration::from_secs(10)));
    }

    #[test]
    fn reschedule_notes_are_kept_and_idempotent() {
        let a = lost(1, InstanceState::Unreachable, 1);
        let message = a.reschedule_message();
        assert_eq!(message, "rescheduling after: worker w1 is unreachable");
        let placed = with_reschedule_note("placed on w2", &message);
        assert_eq!(
            placed,
            "placed on w2; rescheduling after: worker w1 is unreachable"
        );
        assert_eq!(with_reschedule_note("placed on w2", &placed), placed);
        assert_eq!(with_reschedule_note("no room", "an old reason"), "no room");
        let mut silent = lost(2, InstanceState::Error, 3);
        silent.state_message.clear();
        assert_eq!(
            silent.reschedule_message(),
            "rescheduling after: error on worker w3"
        );
    }
}
