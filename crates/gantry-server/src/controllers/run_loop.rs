//! The leader-only control loop: *when* the controllers' pass runs. What a pass does is
//! [`super::pass`]; this module owns every timer.
//!
//! A pass runs only while the coordinator says this server leads, and then:
//!
//! * at once when leadership is gained (a new term starts from the store alone:
//!   [`Reconcile::new_term`] drops what the last term remembered);
//! * after a store change that can make a difference ([`super::triggers`]): at once while
//!   the pass budget lasts ([`LoopConfig::burst`] passes, refilled at that many per
//!   [`LoopConfig::debounce`]), so a model created on a quiet cluster is scheduled in
//!   milliseconds; past the budget a burst of changes is gathered until the next pass is
//!   due, so a flood of changes costs at most `burst` passes per `debounce`;
//! * when the last pass asked for it ([`Action::RequeueAt`]: a backoff or a retry falls
//!   due), and at least every [`LoopConfig::period`];
//! * [`LoopConfig::error_retry`] after a pass that failed on the store.
//!
//! Shutdown does not wait for a pass to end (an analysis may be stuck on a slow file
//! system); every write of a pass is a statement of its own, so stopping between two is
//! safe.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use gantry_coord::Coordinator;
use gantry_store::{Change, StoreError};
use tokio::sync::broadcast;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::triggers::TriggerFilter;

/// What a pass wants next, in the style of kube-runtime's `Action`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Nothing is due: the next pass comes with a change (or the periodic one).
    AwaitChange,
    /// Run again at this moment at the latest (a backoff or a retry falls due).
    RequeueAt(Instant),
}

impl Action {
    /// Run again after `delay` at the latest.
    pub fn requeue_after(delay: Duration) -> Self {
        Action::RequeueAt(Instant::now() + delay)
    }

    /// The more urgent of two actions.
    pub fn min(self, other: Action) -> Action {
        match (self, other) {
            (Action::RequeueAt(a), Action::RequeueAt(b)) => Action::RequeueAt(a.min(b)),
            (Action::RequeueAt(a), Action::AwaitChange)
            | (Action::AwaitChange, Action::RequeueAt(a)) => Action::RequeueAt(a),
            (Action::AwaitChange, Action::AwaitChange) => Action::AwaitChange,
        }
    }
}

/// Something the loop runs passes of.
pub trait Reconcile: Send {
    /// Leadership was gained: forget whatever a previous term kept in memory (another
    /// leader may have changed the store meanwhile).
    fn new_term(&mut self);

    /// One level-triggered pass over the store; never depends on why it was woken.
    fn pass(&mut self) -> impl Future<Output = Result<Action, StoreError>> + Send;
}

/// Timing of the loop.
#[derive(Debug, Clone)]
pub struct LoopConfig {
    /// A pass runs at least this often, changes or not.
    pub period: Duration,
    /// The window of the pass budget: changes trigger at most [`Self::burst`] passes per
    /// `debounce`; past that they are gathered.
    pub debounce: Duration,
    /// Passes a change may trigger at once, back to back, before changes are gathered.
    pub burst: u32,
    /// Back-off after a pass failed on the store.
    pub error_retry: Duration,
}

/// A token bucket of change-triggered passes: `burst` tokens, refilled at `burst` per
/// window. A pass taken while the bucket is empty runs when its token would have come, and
/// whatever changed meanwhile is gathered into it.
#[derive(Debug)]
struct PassBudget {
    capacity: f64,
    per_second: f64,
    /// Tokens left; below zero while passes are booked ahead.
    tokens: f64,
    updated: Instant,
}

impl PassBudget {
    fn new(config: &LoopConfig, now: Instant) -> Self {
        let capacity = f64::from(config.burst.max(1));
        let window = config.debounce.as_secs_f64();
        PassBudget {
            capacity,
            per_second: if window > 0.0 {
                capacity / window
            } else {
                f64::INFINITY
            },
            tokens: capacity,
            updated: now,
        }
    }

    /// Books a pass for a change seen at `now`: how long to wait before it runs (zero: at
    /// once).
    fn take(&mut self, now: Instant) -> Duration {
        if self.per_second.is_infinite() {
            return Duration::ZERO;
        }
        let refill = now.saturating_duration_since(self.updated).as_secs_f64() * self.per_second;
        self.tokens = (self.tokens + refill).min(self.capacity) - 1.0;
        self.updated = now;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.per_second)
        }
    }
}

/// Runs passes of `reconciler` as described in the module documentation until `shutdown`.
pub async fn run<R: Reconcile>(
    mut reconciler: R,
    coordinator: Arc<dyn Coordinator>,
    mut changes: broadcast::Receiver<Arc<Change>>,
    config: LoopConfig,
    shutdown: CancellationToken,
) {
    let mut leadership = coordinator.watch();
    let mut filter = TriggerFilter::default();
    let mut was_leader = false;
    let mut budget = PassBudget::new(&config, Instant::now());
    loop {
        if !coordinator.is_leader() {
            if was_leader {
                tracing::info!(
                    server_id = coordinator.server_id(),
                    "lost leadership; scheduler and controllers pause"
                );
            }
            was_leader = false;
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = leadership.until_leader() => {}
            }
            continue;
        }
        if !was_leader {
            was_leader = true;
            reconciler.new_term();
            changes = changes.resubscribe();
            filter.clear();
            tracing::info!(
                server_id = coordinator.server_id(),
                fencing_token = ?coordinator.fencing_token(),
                "leading: scheduler and controllers run"
            );
        }
        let now = Instant::now();
        let mut wake = now + config.period;
        let outcome = tokio::select! {
            () = shutdown.cancelled() => return,
            outcome = reconciler.pass() => outcome,
        };
        match outcome {
            Ok(Action::RequeueAt(due)) => wake = wake.min(due),
            Ok(Action::AwaitChange) => {}
            Err(e) => {
                tracing::error!(error = %e, "controller pass failed; retrying");
                wake = wake.min(now + config.error_retry);
            }
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep_until(wake) => {}
            _ = leadership.changed() => {}
            () = filter.next_trigger(&mut changes) => {
                let wait = budget.take(Instant::now());
                if !wait.is_zero() {
                    tokio::select! {
                        () = shutdown.cancelled() => return,
                        () = tokio::time::sleep(wait) => {}
                    }
                }
                filter.drain(&mut changes);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use gantry_coord::{Leadership, LocalCoordinator};
    use gantry_types::{fixtures, InstanceState};

    use super::*;

    /// What the next pass of the test double answers.
    enum Outcome {
        /// `Action::requeue_after` this long, counted from the pass.
        RequeueAfter(Duration),
        /// A store error.
        Fail,
    }

    /// A test double of a pass: records when it ran and answers with scripted outcomes.
    #[derive(Clone, Default)]
    struct Recorder {
        runs: Arc<Mutex<Vec<Instant>>>,
        terms: Arc<Mutex<u32>>,
        next: Arc<Mutex<Vec<Outcome>>>,
    }

    impl Recorder {
        fn runs(&self) -> usize {
            self.runs.lock().unwrap().len()
        }

        fn answer(&self, outcome: Outcome) {
            self.next.lock().unwrap().push(outcome);
        }
    }

    impl Reconcile for Recorder {
        fn new_term(&mut self) {
            *self.terms.lock().unwrap() += 1;
        }

        async fn pass(&mut self) -> Result<Action, StoreError> {
            self.runs.lock().unwrap().push(Instant::now());
            match self.next.lock().unwrap().pop() {
                None => Ok(Action::AwaitChange),
                Some(Outcome::RequeueAfter(delay)) => Ok(Action::requeue_after(delay)),
                Some(Outcome::Fail) => Err(StoreError::Config("database went away".into())),
            }
        }
    }

    const CONFIG: LoopConfig = LoopConfig {
        period: Duration::from_secs(10),
        debounce: Duration::from_millis(100),
        burst: 4,
        error_retry: Duration::from_secs(1),
    };

    struct Harness {
        recorder: Recorder,
        coordinator: Arc<LocalCoordinator>,
        changes: broadcast::Sender<Arc<Change>>,
        shutdown: CancellationToken,
        task: tokio::task::JoinHandle<()>,
    }

    fn start(leading: bool) -> Harness {
        let recorder = Recorder::default();
        let coordinator = Arc::new(LocalCoordinator::new("s1"));
        if !leading {
            coordinator.set_leadership(Leadership::Follower);
        }
        let (changes, receiver) = broadcast::channel(16);
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(run(
            recorder.clone(),
            Arc::clone(&coordinator) as Arc<dyn Coordinator>,
            receiver,
            CONFIG,
            shutdown.clone(),
        ));
        Harness {
            recorder,
            coordinator,
            changes,
            shutdown,
            task,
        }
    }

    /// Lets every ready task run without moving the clock.
    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    fn instance_change(state: InstanceState) -> Arc<Change> {
        let model = fixtures::model(1, "m");
        Arc::new(Change::Instance(
            gantry_store::ChangeKind::Updated,
            fixtures::instance(1, &model, 0, state),
        ))
    }

    #[tokio::test(start_paused = true)]
    async fn a_follower_runs_no_pass_however_long_it_waits() {
        let h = start(false);
        h.changes
            .send(instance_change(InstanceState::Pending))
            .unwrap();
        tokio::time::sleep(Duration::from_secs(3600)).await;
        assert_eq!(h.recorder.runs(), 0);
        h.coordinator
            .set_leadership(Leadership::Leader { fencing_token: 2 });
        settle().await;
        assert_eq!(h.recorder.runs(), 1, "a new leader passes at once");
        assert_eq!(*h.recorder.terms.lock().unwrap(), 1);
        h.shutdown.cancel();
        h.task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_runs_a_pass_at_once_and_a_flood_is_gathered_past_the_budget() {
        let h = start(true);
        settle().await;
        assert_eq!(h.recorder.runs(), 1);
        // Reports of running instances do not trigger a pass that could place something.
        h.changes
            .send(instance_change(InstanceState::Starting))
            .unwrap();
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(h.recorder.runs(), 1);
        // A pending instance does, at once: 4 changes one after the other, 4 passes.
        for pass in 2..=5 {
            h.changes
                .send(instance_change(InstanceState::Pending))
                .unwrap();
            settle().await;
            assert_eq!(h.recorder.runs(), pass, "no waiting while the budget lasts");
        }
        // The budget (4 per 100 ms) is spent: the next change waits for a token (25 ms)
        // and the changes that come meanwhile ride along.
        for _ in 0..3 {
            h.changes
                .send(instance_change(InstanceState::Pending))
                .unwrap();
        }
        tokio::time::sleep(Duration::from_millis(24)).await;
        assert_eq!(h.recorder.runs(), 5);
        tokio::time::sleep(Duration::from_millis(2)).await;
        settle().await;
        assert_eq!(h.recorder.runs(), 6, "three changes, one pass");
        // After a quiet spell the whole budget is back.
        tokio::time::sleep(Duration::from_secs(1)).await;
        for pass in 7..=10 {
            h.changes
                .send(instance_change(InstanceState::Pending))
                .unwrap();
            settle().await;
            assert_eq!(h.recorder.runs(), pass);
        }
        h.shutdown.cancel();
        h.task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn passes_come_every_period_and_when_requeued_sooner() {
        let h = start(true);
        settle().await;
        assert_eq!(h.recorder.runs(), 1);
        tokio::time::sleep(CONFIG.period).await;
        settle().await;
        assert_eq!(h.recorder.runs(), 2, "the periodic pass");
        h.recorder
            .answer(Outcome::RequeueAfter(Duration::from_secs(3)));
        tokio::time::sleep(CONFIG.period).await;
        settle().await;
        assert_eq!(h.recorder.runs(), 3);
        tokio::time::sleep(Duration::from_secs(3)).await;
        settle().await;
        assert_eq!(h.recorder.runs(), 4, "the requeue comes before the period");
        h.shutdown.cancel();
        h.task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_pass_is_retried_after_the_error_backoff() {
        let h = start(true);
        h.recorder.answer(Outcome::Fail);
        settle().await;
        assert_eq!(h.recorder.runs(), 1);
        tokio::time::sleep(CONFIG.error_retry).await;
        settle().await;
        assert_eq!(h.recorder.runs(), 2);
        h.shutdown.cancel();
        h.task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn losing_and_regaining_leadership_starts_a_new_term() {
        let h = start(true);
        settle().await;
        h.coordinator.set_leadership(Leadership::Follower);
        settle().await;
        h.changes
            .send(instance_change(InstanceState::Pending))
            .unwrap();
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(h.recorder.runs(), 1, "no pass while following");
        h.coordinator
            .set_leadership(Leadership::Leader { fencing_token: 3 });
        settle().await;
        assert_eq!(h.recorder.runs(), 2);
        assert_eq!(*h.recorder.terms.lock().unwrap(), 2);
        h.shutdown.cancel();
        h.task.await.unwrap();
    }

    #[test]
    fn the_more_urgent_action_wins() {
        let soon = Instant::now();
        let later = soon + Duration::from_secs(1);
        assert_eq!(
            Action::RequeueAt(later).min(Action::RequeueAt(soon)),
            Action::RequeueAt(soon)
        );
        assert_eq!(
            Action::AwaitChange.min(Action::RequeueAt(later)),
            Action::RequeueAt(later)
        );
        assert_eq!(
            Action::AwaitChange.min(Action::AwaitChange),
            Action::AwaitChange
        );
    }
}
