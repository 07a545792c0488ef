//! The restart policy: exponential backoff after a crash, and the crash-loop rule that gives
//! up. Pure bookkeeping over instants passed in, so it is tested without a clock.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

/// When and how often a crashed backend is restarted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestartPolicy {
    /// The wait before the first restart (default 1 s); it doubles with every further
    /// crash in a row.
    pub initial_backoff: Duration,
    /// The longest wait between restarts (default 5 min).
    pub max_backoff: Duration,
    /// A run at least this long counts as healthy: the next crash starts the backoff from
    /// `initial_backoff` again (default 10 min).
    pub reset_backoff_after: Duration,
    /// More than this many crashes within `crash_loop_window` is a crash loop: the instance
    /// goes to `Error` and is not restarted again (default 5).
    pub crash_loop_max_crashes: u32,
    /// The sliding window of the crash-loop rule (default 10 min).
    pub crash_loop_window: Duration,
}

impl Default for RestartPolicy {
    fn default() -> Self {
        Self {
            initial_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(5 * 60),
            reset_backoff_after: Duration::from_secs(10 * 60),
            crash_loop_max_crashes: 5,
            crash_loop_window: Duration::from_secs(10 * 60),
        }
    }
}

/// What to do after a crash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashVerdict {
    /// Restart after `backoff`; `attempt` counts the crashes in a row, from 1.
    Restart { attempt: u32, backoff: Duration },
    /// A crash loop: `crashes` crashes within the window exceed the limit.
    GiveUp { crashes: usize },
}

/// The crash history of one instance.
#[derive(Debug, Clone)]
pub struct CrashTracker {
    policy: RestartPolicy,
    /// Crashes in a row since the last healthy run.
    consecutive: u32,
    /// When recent crashes happened, oldest first, pruned to the window.
    recent: VecDeque<Instant>,
}

impl CrashTracker {
    pub fn new(policy: RestartPolicy) -> Self {
        Self {
            policy,
            consecutive: 0,
            recent: VecDeque::new(),
        }
    }

    /// The policy it applies.
    pub fn policy(&self) -> &RestartPolicy {
        &self.policy
    }

    /// Records a crash at `now` of a run that lasted `ran_for` and says what to do.
    pub fn record_crash(&mut self, now: Instant, ran_for: Duration) -> CrashVerdict {
        if ran_for >= self.policy.reset_backoff_after {
            self.consecutive = 0;
        }
        self.consecutive = self.consecutive.saturating_add(1);
        while let Some(oldest) = self.recent.front() {
            if now.duration_since(*oldest) > self.policy.crash_loop_window {
                self.recent.pop_front();
            } else {
                break;
            }
        }
        self.recent.push_back(now);
        if self.recent.len() > self.policy.crash_loop_max_crashes as usize {
            return CrashVerdict::GiveUp {
                crashes: self.recent.len(),
            };
        }
        CrashVerdict::Restart {
            attempt: self.consecutive,
            backoff: self.backoff(self.consecutive),
        }
    }

    /// `initial * 2^(attempt-1)`, capped.
    fn backoff(&self, attempt: u32) -> Duration {
        let doublings = attempt.saturating_sub(1).min(31);
        self.policy
            .initial_backoff
            .saturating_mul(1u32 << doublings)
            .min(self.policy.max_backoff)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: Duration = Duration::from_secs(1);

    fn restart(attempt: u32, secs: u64) -> CrashVerdict {
        CrashVerdict::Restart {
            attempt,
            backoff: Duration::from_secs(secs),
        }
    }

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let mut tracker = CrashTracker::new(RestartPolicy {
            crash_loop_max_crashes: 100,
            ..RestartPolicy::default()
        });
        let mut now = Instant::now();
        let mut backoffs = Vec::new();
        for _ in 0..12 {
            // Crashes far apart, so the crash-loop window never fills.
            now += Duration::from_secs(3600);
            match tracker.record_crash(now, SEC) {
                CrashVerdict::Restart { backoff, .. } => backoffs.push(backoff.as_secs()),
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(backoffs, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300]);
    }

    #[test]
    fn a_long_healthy_run_resets_the_backoff() {
        let mut tracker = CrashTracker::new(RestartPolicy::default());
        let now = Instant::now();
        assert_eq!(tracker.record_crash(now, SEC), restart(1, 1));
        assert_eq!(tracker.record_crash(now + 2 * SEC, SEC), restart(2, 2));
        assert_eq!(
            tracker.record_crash(now + 700 * SEC, Duration::from_secs(600)),
            restart(1, 1)
        );
    }

    #[test]
    fn more_than_the_limit_within_the_window_is_a_crash_loop() {
        let mut tracker = CrashTracker::new(RestartPolicy::default());
        let now = Instant::now();
        for i in 1..=5 {
            assert!(matches!(
                tracker.record_crash(now + i * SEC, SEC),
                CrashVerdict::Restart { .. }
            ));
        }
        assert_eq!(
            tracker.record_crash(now + 6 * SEC, SEC),
            CrashVerdict::GiveUp { crashes: 6 }
        );
    }

    #[test]
    fn crashes_older_than_the_window_do_not_count() {
        let mut tracker = CrashTracker::new(RestartPolicy {
            crash_loop_max_crashes: 2,
            crash_loop_window: Duration::from_secs(60),
            ..RestartPolicy::default()
        });
        let now = Instant::now();
        assert!(matches!(
            tracker.record_crash(now, SEC),
            CrashVerdict::Restart { .. }
        ));
        assert!(matches!(
            tracker.record_crash(now + 10 * SEC, SEC),
            CrashVerdict::Restart { .. }
        ));
        // The first crash has left the window: still two within it.
        assert!(matches!(
            tracker.record_crash(now + 61 * SEC, SEC),
            CrashVerdict::Restart { attempt: 3, .. }
        ));
        assert_eq!(
            tracker.record_crash(now + 62 * SEC, SEC),
            CrashVerdict::GiveUp { crashes: 3 }
        );
    }
}
