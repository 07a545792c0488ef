//! The leader-only control loop: *when* the controllers' pass runs. What a pass does is
//! [`super::pass`]; this module owns every timer.
//!
//! A pass runs only while the coordinator says this server leads, and then:
//!
//! * at once when leadership is gained (a new term starts from the store alone:
//!   [`Reconcile::new_term`] drops what the last term remembered);
//! * after a store change that can make a difference ([`super::triggers`]; an instance
//!   becoming `running` only while the last pass says a roll waits for one): at once when
//!   the loop has been idle at least as long as its last pass took, else once it has (at
//!   most [`LoopConfig::debounce`] later), gathering whatever else changes meanwhile. A
//!   model created on a quiet cluster is scheduled in milliseconds, and a flood of changes
//!   keeps the loop busy at most about half the time, each pass taking in everything that
//!   came during the one before;
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

    /// Whether an instance becoming `running` can let the next pass do something new
    /// (a roll waits for it), as of the last pass; when not, such reports wake no pass
    /// (a fleet reporting 10,000 instances running would keep the loop busy re-reading
    /// the store for nothing).
    fn wakes_on_running(&self) -> bool {
        true
    }
}

/// Timing of the loop.
#[derive(Debug, Clone)]
pub struct LoopConfig {
    /// A pass runs at least this often, changes or not.
    pub period: Duration,
    /// The longest a change waits for its pass (while the loop rests after a long pass).
    pub debounce: Duration,
    /// Back-off after a pass failed on the store.
    pub error_retry: Duration,
}

/// When the last pass ended and how long it took.
#[derive(Debug, Clone, Copy)]
struct LastPass {
    ended: Instant,
    took: Duration,
}

impl LastPass {
    /// How long a change seen at `now` waits for its pass: until the loop has rested as
    /// long as the last pass took, at most `cap`.
    fn rest(&self, now: Instant, cap: Duration) -> Duration {
        self.took
            .saturating_sub(now.saturating_duration_since(self.ended))
            .min(cap)
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
        let ended = Instant::now();
        let last_pass = LastPass {
            ended,
            took: ended.saturating_duration_since(now),
        };
        filter.wake_on_running(outcome.is_err() || reconciler.wakes_on_running());
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
                let wait = last_pass.rest(Instant::now(), config.debounce);
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
        /// How long each pass takes (in the paused clock).
        pass_time: Arc<Mutex<Duration>>,
        /// What the passes say of `running` reports: wake on them unless set.
        ignores_running: Arc<Mutex<bool>>,
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

        fn wakes_on_running(&self) -> bool {
            !*self.ignores_running.lock().unwrap()
        }

        async fn pass(&mut self) -> Result<Action, StoreError> {
            self.runs.lock().unwrap().push(Instant::now());
            let took = *self.pass_time.lock().unwrap();
            if !took.is_zero() {
                tokio::time::sleep(took).await;
            }
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
    async fn running_reports_wake_the_loop_only_while_the_last_pass_waits_for_them() {
        let h = start(true);
        settle().await;
        assert_eq!(h.recorder.runs(), 1);
        h.changes
            .send(instance_change(InstanceState::Running))
            .unwrap();
        settle().await;
        assert_eq!(h.recorder.runs(), 2, "a roll may wait for it");
        // From the next pass on, no roll waits.
        *h.recorder.ignores_running.lock().unwrap() = true;
        h.changes
            .send(instance_change(InstanceState::Pending))
            .unwrap();
        settle().await;
        assert_eq!(h.recorder.runs(), 3);
        h.changes
            .send(instance_change(InstanceState::Running))
            .unwrap();
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(h.recorder.runs(), 3, "nothing waits for it");
        h.changes
            .send(instance_change(InstanceState::Error))
            .unwrap();
        settle().await;
        assert_eq!(h.recorder.runs(), 4);
        h.shutdown.cancel();
        h.task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_runs_a_pass_at_once_and_changes_during_a_long_pass_are_gathered() {
        let h = start(true);
        settle().await;
        assert_eq!(h.recorder.runs(), 1);
        // Reports of running instances do not trigger a pass that could place something.
        h.changes
            .send(instance_change(InstanceState::Starting))
            .unwrap();
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(h.recorder.runs(), 1);
        // A pending instance does, at once; passes that take no time never wait.
        for pass in 2..=5 {
            h.changes
                .send(instance_change(InstanceState::Pending))
                .unwrap();
            settle().await;
            assert_eq!(h.recorder.runs(), pass, "no waiting after quick passes");
        }
        // A pass that takes 30 ms: the loop rests 30 ms after it, and the changes that
        // come meanwhile make one pass.
        *h.recorder.pass_time.lock().unwrap() = Duration::from_millis(30);
        h.changes
            .send(instance_change(InstanceState::Pending))
            .unwrap();
        tokio::time::sleep(Duration::from_millis(31)).await;
        assert_eq!(h.recorder.runs(), 6);
        *h.recorder.pass_time.lock().unwrap() = Duration::ZERO;
        for _ in 0..3 {
            h.changes
                .send(instance_change(InstanceState::Pending))
                .unwrap();
        }
        tokio::time::sleep(Duration::from_millis(28)).await;
        assert_eq!(
            h.recorder.runs(),
            6,
            "resting as long as the last pass took"
        );
        tokio::time::sleep(Duration::from_millis(3)).await;
        settle().await;
        assert_eq!(h.recorder.runs(), 7, "three changes, one pass");
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
