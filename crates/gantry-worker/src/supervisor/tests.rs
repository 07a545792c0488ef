//! The instance task's rules in paused time, against scripted processes
//! ([`FakeHost`], a test double): backoff, crash loops, readiness deadlines, health
//! thresholds, drains and stop grace, each checked to the millisecond of tokio's clock.
//! `tests/supervisor` runs the same supervisor against real processes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use gantry_backends::LaunchSpec;
use gantry_types::BackendKind;
use nix::sys::signal::Signal;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::host::fake::{FakeHost, Script};
use super::*;

const SEC: Duration = Duration::from_secs(1);
const MS: Duration = Duration::from_millis(1);

struct Harness {
    supervisor: Supervisor,
    events: mpsc::Receiver<InstanceEvent>,
    host: Arc<FakeHost>,
    _temp: tempfile::TempDir,
}

impl Harness {
    fn new(host: Arc<FakeHost>, configure: impl FnOnce(&mut SupervisorConfig)) -> Self {
        let temp = tempfile::tempdir().unwrap();
        let mut config = SupervisorConfig::new(temp.path().join("data"));
        config.port_range = gantry_testkit::reserve_ports(20);
        config.stop_grace_period = 10 * SEC;
        configure(&mut config);
        let (events_tx, events) = mpsc::channel(256);
        let supervisor =
            Supervisor::with_host(config, events_tx, Arc::clone(&host) as Arc<dyn Host>).unwrap();
        Self {
            supervisor,
            events,
            host,
            _temp: temp,
        }
    }

    fn spec(instance_id: i64) -> InstanceSpec {
        let launch = LaunchSpec {
            custom_command: Some(
                "fake-backend --host {host} --port {port} --model {model_path}".to_owned(),
            ),
            ..LaunchSpec::new(BackendKind::Custom, "/models/fake.gguf")
        };
        InstanceSpec::new(instance_id, format!("fake-model#{instance_id}"), launch)
    }

    /// The next state of instance 1, and when it came. An hour of (paused) time without
    /// one fails the test at once.
    async fn next(&mut self) -> (BackendState, Instant) {
        let event = tokio::time::timeout(3600 * SEC, self.events.recv())
            .await
            .expect("an event within the hour")
            .expect("the supervisor is alive");
        assert_eq!(event.instance_id, 1);
        (event.state, Instant::now())
    }

    async fn expect(&mut self, name: &str) -> (BackendState, Instant) {
        let (state, at) = self.next().await;
        assert_eq!(state.name(), name, "{state:?}");
        (state, at)
    }

    /// Starting, then Running: the pids and when it became ready.
    async fn expect_running(&mut self) -> (Vec<u32>, Instant) {
        self.expect("starting").await;
        match self.next().await {
            (BackendState::Running { pids, .. }, at) => (pids, at),
            other => panic!("expected running, got {other:?}"),
        }
    }

    fn signals(&self, pid: u32) -> Vec<Signal> {
        self.host
            .signals(pid)
            .into_iter()
            .map(|(signal, _)| signal)
            .collect()
    }

    fn signalled_at(&self, pid: u32, signal: Signal) -> Instant {
        self.host
            .signals(pid)
            .into_iter()
            .find(|(s, _)| *s == signal)
            .unwrap_or_else(|| panic!("{pid} got no {signal}"))
            .1
    }
}

fn between(took: Duration, low: Duration, high: Duration) {
    assert!(
        took >= low && took <= high,
        "took {took:?}, expected {low:?}..={high:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_ready_backend_runs_until_stopped_with_sigterm() {
    let mut h = Harness::new(FakeHost::new(Script::ready_after(2 * SEC)), |_| {});
    let started = Instant::now();
    h.supervisor.apply(Harness::spec(1)).unwrap();
    let (pids, ready_at) = h.expect_running().await;
    // Probes run every 250 ms at first.
    between(ready_at - started, 2 * SEC, 2 * SEC + 250 * MS);
    assert_eq!(h.supervisor.leased_ports().len(), 1);

    h.supervisor.remove(1);
    h.expect("stopped").await;
    assert_eq!(h.signals(pids[0]), [Signal::SIGTERM, Signal::SIGCONT]);
    assert!(!h.host.any_running());
    assert!(h.supervisor.leased_ports().is_empty());
    let spawns = h.host.spawns();
    assert_eq!(spawns.len(), 1);
    assert_eq!(spawns[0].program, "fake-backend");
}

#[tokio::test(start_paused = true)]
async fn crashes_after_ready_restart_after_a_backoff_that_doubles() {
    let script = Script::ready_after(SEC).exits_after(5 * SEC, 1);
    let mut h = Harness::new(FakeHost::new(script), |_| {});
    h.supervisor.apply(Harness::spec(1)).unwrap();
    h.expect("starting").await;
    for (attempt, backoff) in [(1, SEC), (2, 2 * SEC), (3, 4 * SEC)] {
        h.expect("running").await;
        let (state, crashed_at) = h.next().await;
        let BackendState::Restarting {
            attempt: got,
            backoff: waited,
            reason,
        } = state
        else {
            panic!("expected restarting, got {state:?}");
        };
        assert_eq!((got, waited), (attempt, backoff));
        assert!(
            reason.contains("exited with status 1 after running for 4.0s"),
            "{reason}"
        );
        let (_, started_at) = h.expect("starting").await;
        between(started_at - crashed_at, backoff, backoff + MS);
    }
    // Every start kept the first one's port, so the address stays the same.
    let mut ports: Vec<_> = h.host.spawns().iter().map(|s| s.port).collect();
    assert_eq!(ports.len(), 4);
    ports.dedup();
    assert_eq!(ports.len(), 1, "{ports:?}");
    assert_eq!(h.supervisor.status(1).unwrap().restart_count, 3);
}

#[tokio::test(start_paused = true)]
async fn a_restart_asked_for_stops_the_backend_starts_it_again_and_counts() {
    let mut h = Harness::new(FakeHost::new(Script::ready_after(SEC)), |_| {});
    assert!(!h.supervisor.restart_in_place(1), "nothing runs yet");
    h.supervisor.apply(Harness::spec(1)).unwrap();
    let (first, _) = h.expect_running().await;
    assert_eq!(h.supervisor.status(1).unwrap().restart_count, 0);

    assert!(h.supervisor.restart_in_place(1));
    h.expect("stopped").await;
    let (second, _) = h.expect_running().await;
    assert_ne!(first, second, "a new process");
    assert_eq!(h.signals(first[0]), [Signal::SIGTERM, Signal::SIGCONT]);
    assert_eq!(h.supervisor.status(1).unwrap().restart_count, 1);
    assert!(h.supervisor.restart_in_place(1));
    h.expect("stopped").await;
    h.expect_running().await;
    assert_eq!(h.supervisor.status(1).unwrap().restart_count, 2);
    let ports: Vec<_> = h.host.spawns().iter().map(|s| s.port).collect();
    assert_eq!(ports.len(), 3);

    // A spec set anew starts counting again; a removed instance cannot be restarted.
    h.supervisor.restart(Harness::spec(1)).unwrap();
    h.expect("stopped").await;
    h.expect_running().await;
    assert_eq!(h.supervisor.status(1).unwrap().restart_count, 0);
    h.supervisor.remove(1);
    h.expect("stopped").await;
    assert!(!h.supervisor.restart_in_place(1));
}

#[tokio::test(start_paused = true)]
async fn more_crashes_than_allowed_within_the_window_end_in_error() {
    let script = Script::ready_after(SEC)
        .exits_after(2 * SEC, 1)
        .stderr("CUDA error: out of memory");
    let mut h = Harness::new(FakeHost::new(script), |config| {
        config.restart.crash_loop_max_crashes = 2;
    });
    h.supervisor.apply(Harness::spec(1)).unwrap();
    for attempt in 1..=2 {
        h.expect_running().await;
        let (state, _) = h.expect("restarting").await;
        assert!(matches!(state, BackendState::Restarting { attempt: a, .. } if a == attempt));
    }
    h.expect_running().await;
    let (state, _) = h.expect("error").await;
    let BackendState::Error { message } = state else {
        unreachable!()
    };
    assert!(
        message.starts_with("crash loop: 3 crashes within 600s (more than 2 allowed)"),
        "{message}"
    );
    assert!(
        message.contains("last stderr lines:\nCUDA error: out of memory"),
        "{message}"
    );
    // Error holds nothing and is final: no further start, however long we wait.
    assert!(!h.host.any_running());
    assert!(h.supervisor.leased_ports().is_empty());
    tokio::time::sleep(3600 * SEC).await;
    assert_eq!(h.host.spawns().len(), 3);
    assert!(h.events.try_recv().is_err());
}

#[tokio::test(start_paused = true)]
async fn a_backend_that_exits_before_ready_is_an_error_at_once() {
    let script = Script::default()
        .exits_after(300 * MS, 3)
        .stderr("loading model /models/fake.gguf")
        .stderr("boom: the model file is corrupt");
    let mut h = Harness::new(FakeHost::new(script), |_| {});
    h.supervisor.apply(Harness::spec(1)).unwrap();
    let (_, started) = h.expect("starting").await;
    let (state, failed_at) = h.expect("error").await;
    between(failed_at - started, 300 * MS, 301 * MS);
    let BackendState::Error { message } = state else {
        unreachable!()
    };
    assert!(
        message.starts_with("fake-backend (rank 0, pid "),
        "{message}"
    );
    assert!(
        message.contains("exited with status 3 before it became ready"),
        "{message}"
    );
    assert!(
        message.ends_with("boom: the model file is corrupt"),
        "{message}"
    );
    tokio::time::sleep(3600 * SEC).await;
    assert_eq!(
        h.host.spawns().len(),
        1,
        "a model that cannot load is not retried"
    );
    // The same spec again changes nothing; a fresh start asked for does start it again.
    assert_eq!(
        h.supervisor.apply(Harness::spec(1)).unwrap(),
        EnsureOutcome::Unchanged
    );
    h.supervisor.restart(Harness::spec(1)).unwrap();
    h.expect("stopped").await;
    h.expect("starting").await;
    assert_eq!(h.host.spawns().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_backend_never_ready_fails_at_the_readiness_deadline() {
    let mut h = Harness::new(FakeHost::new(Script::default()), |_| {});
    let mut spec = Harness::spec(1);
    spec.ready_deadline = Some(30 * SEC);
    h.supervisor.apply(spec).unwrap();
    let (BackendState::Starting { port }, started) = h.next().await else {
        panic!("expected starting");
    };
    let (state, failed_at) = h.expect("error").await;
    between(failed_at - started, 30 * SEC, 30 * SEC + MS);
    let BackendState::Error { message } = state else {
        unreachable!()
    };
    assert!(
        message.starts_with(&format!(
            "not ready within the readiness deadline of 30s (last probe: GET \
             http://127.0.0.1:{port}/health answered 503 Service Unavailable)"
        )),
        "{message}"
    );
    let pid = h.host.spawns()[0].pid;
    assert_eq!(h.signals(pid)[0], Signal::SIGTERM);
    assert!(!h.host.any_running());
    assert!(h.supervisor.leased_ports().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_backend_ignoring_sigterm_is_killed_when_the_grace_period_ends() {
    let script = Script::ready_after(SEC).ignoring_sigterm();
    let mut h = Harness::new(FakeHost::new(script), |_| {});
    h.supervisor.apply(Harness::spec(1)).unwrap();
    let (pids, _) = h.expect_running().await;
    let asked = Instant::now();
    h.supervisor.stop(1).await;
    let term = h.signalled_at(pids[0], Signal::SIGTERM);
    let kill = h.signalled_at(pids[0], Signal::SIGKILL);
    // Nothing to drain: two idle readings, 50 ms apart, then SIGTERM; SIGKILL when the
    // rest of the grace period is over (checked every 25 ms).
    between(term - asked, 50 * MS, 50 * MS);
    between(kill - asked, 10 * SEC, 10 * SEC + 25 * MS);
    assert!(h.host.ended(pids[0]).is_some());
    h.expect("stopped").await;
}

#[tokio::test(start_paused = true)]
async fn a_stop_waits_for_requests_in_progress_for_at_most_half_the_grace_period() {
    let mut h = Harness::new(FakeHost::new(Script::ready_after(SEC)), |_| {});
    h.supervisor.apply(Harness::spec(1)).unwrap();
    let (pids, _) = h.expect_running().await;
    // A request finishes 3 s after the stop is asked: SIGTERM follows it.
    let asked = Instant::now();
    h.host.busy_until(asked + 3 * SEC);
    h.supervisor.stop(1).await;
    let term = h.signalled_at(pids[0], Signal::SIGTERM);
    between(term - asked, 3 * SEC, 3 * SEC + 100 * MS);

    // A request that never ends holds the stop for half the grace period, no more.
    h.expect("stopped").await;
    h.supervisor.apply(Harness::spec(1)).unwrap();
    let (pids, _) = h.expect_running().await;
    let asked = Instant::now();
    h.host.busy_until(asked + 3600 * SEC);
    h.supervisor.stop(1).await;
    let term = h.signalled_at(pids[0], Signal::SIGTERM);
    between(term - asked, 5 * SEC, 5 * SEC);
    let log = h.supervisor.read_log(1, 20).await.unwrap();
    assert!(
        log.contains("draining: 1 connection(s) still open after 5.0s; stopping anyway"),
        "{log}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_frozen_backend_is_found_unhealthy_killed_and_restarted() {
    // Frozen: no probe is answered and SIGTERM is not acted on.
    let frozen = Script::ready_after(SEC)
        .freezes_after(20 * SEC)
        .ignoring_sigterm();
    let host = FakeHost::new(Script::ready_after(SEC));
    host.then(frozen);
    let mut h = Harness::new(host, |config| {
        config.health = HealthPolicy {
            interval: 5 * SEC,
            timeout: 2 * SEC,
            failure_threshold: 3,
        };
    });
    h.supervisor.apply(Harness::spec(1)).unwrap();
    let (pids, ready_at) = h.expect_running().await;
    let frozen_at = h.host.spawns()[0].at + 20 * SEC;
    let (state, found_at) = h.expect("unhealthy").await;
    let BackendState::Unhealthy { reason } = state else {
        unreachable!()
    };
    assert!(
        reason.contains("health probe failed 3 times in a row (every 5s)"),
        "{reason}"
    );
    // Probes every 5 s from readiness; the first that fails is the first tick after the
    // freeze, the third fails 10 s later, once its 2 s timeout is over.
    let first_failed_tick = ready_at + 20 * SEC;
    assert!(first_failed_tick >= frozen_at);
    between(found_at - first_failed_tick, 12 * SEC, 12 * SEC + MS);
    // A short grace for the frozen process, then SIGKILL; then the usual backoff.
    let (state, _) = h.expect("restarting").await;
    assert!(matches!(state, BackendState::Restarting { attempt: 1, .. }));
    let term = h.signalled_at(pids[0], Signal::SIGTERM);
    let kill = h.signalled_at(pids[0], Signal::SIGKILL);
    between(term - found_at, Duration::ZERO, Duration::ZERO);
    between(kill - term, 5 * SEC, 5 * SEC + 25 * MS);
    h.expect_running().await;
    assert_eq!(h.host.spawns().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_failed_restart_of_a_once_ready_instance_goes_through_the_backoff() {
    let host = FakeHost::new(Script::ready_after(SEC));
    host.then(Script::ready_after(SEC).exits_after(3 * SEC, 1))
        .then(Script::default().exits_after(500 * MS, 2));
    let mut h = Harness::new(host, |_| {});
    h.supervisor.apply(Harness::spec(1)).unwrap();
    h.expect_running().await;
    let (state, _) = h.expect("restarting").await;
    assert!(matches!(state, BackendState::Restarting { attempt: 1, .. }));
    h.expect("starting").await;
    let (state, _) = h.expect("restarting").await;
    let BackendState::Restarting {
        attempt, reason, ..
    } = state
    else {
        unreachable!()
    };
    assert_eq!(attempt, 2);
    assert!(
        reason.contains("exited with status 2 before it became ready"),
        "{reason}"
    );
    h.expect_running().await;
}

#[tokio::test(start_paused = true)]
async fn a_long_healthy_run_resets_the_backoff() {
    let host = FakeHost::new(Script::ready_after(SEC));
    host.then(Script::ready_after(SEC).exits_after(2 * SEC, 1))
        .then(Script::ready_after(SEC).exits_after(2 * SEC, 1))
        .then(Script::ready_after(SEC).exits_after(120 * SEC, 1));
    let mut h = Harness::new(host, |config| {
        config.restart.reset_backoff_after = 60 * SEC;
    });
    h.supervisor.apply(Harness::spec(1)).unwrap();
    let mut backoffs = Vec::new();
    for _ in 0..3 {
        h.expect_running().await;
        match h.next().await {
            (BackendState::Restarting { backoff, .. }, _) => backoffs.push(backoff),
            other => panic!("expected restarting, got {other:?}"),
        }
    }
    assert_eq!(backoffs, [SEC, 2 * SEC, SEC]);
}

#[tokio::test(start_paused = true)]
async fn a_data_parallel_group_is_restarted_together() {
    let host = FakeHost::new(Script::ready_after(SEC));
    host.then(Script::ready_after(SEC))
        .then(Script::ready_after(SEC).exits_after(4 * SEC, 9));
    let mut h = Harness::new(host, |_| {});
    let mut spec = Harness::spec(1);
    spec.launch.gpu_indexes = vec![0, 1];
    spec.launch.data_parallel_size = Some(2);
    h.supervisor.apply(spec).unwrap();
    let (pids, _) = h.expect_running().await;
    assert_eq!(pids.len(), 2);
    let (state, _) = h.expect("restarting").await;
    let BackendState::Restarting { reason, .. } = state else {
        unreachable!()
    };
    assert!(
        reason.contains(&format!("(rank 1, pid {}) exited with status 9", pids[1])),
        "{reason}"
    );
    assert!(
        reason.ends_with("; restarting the whole data-parallel group"),
        "{reason}"
    );
    assert_eq!(h.signals(pids[0])[0], Signal::SIGTERM);
    let (new_pids, _) = h.expect_running().await;
    assert_eq!(new_pids.len(), 2);
    assert!(new_pids.iter().all(|pid| !pids.contains(pid)));
}

#[tokio::test(start_paused = true)]
async fn shutdown_stops_every_instance_and_refuses_new_ones() {
    let host = FakeHost::new(Script::ready_after(SEC).ignoring_sigterm());
    let (events_tx, mut events) = mpsc::channel(256);
    let temp = tempfile::tempdir().unwrap();
    let mut config = SupervisorConfig::new(temp.path());
    config.port_range = gantry_testkit::reserve_ports(20);
    config.stop_grace_period = 4 * SEC;
    let supervisor =
        Supervisor::with_host(config, events_tx, Arc::clone(&host) as Arc<dyn Host>).unwrap();
    for id in [1, 2] {
        supervisor.apply(Harness::spec(id)).unwrap();
    }
    let mut running = 0;
    while running < 2 {
        if events.recv().await.unwrap().state.name() == "running" {
            running += 1;
        }
    }
    let asked = Instant::now();
    supervisor.shutdown().await;
    // Both stop at once, not one after the other.
    between(asked.elapsed(), 4 * SEC, 4 * SEC + 25 * MS);
    assert!(!host.any_running());
    assert!(matches!(
        supervisor.apply(Harness::spec(3)),
        Err(SupervisorError::ShuttingDown)
    ));
}
