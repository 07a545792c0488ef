//! Worker health: a worker silent for three heartbeat intervals is `not_ready`
//! (nothing new is placed there); silent for `server_timeout` it is `unreachable` and
//! its instances are marked `unreachable` so they can be rescheduled. A heartbeat
//! brings it back to `ready` (in the heartbeat handler).
//!
//! Leader only, fenced like every controller: a server that is not sure it leads (a
//! standby, or a leader cut off from the database that could not renew) may be the one
//! that cannot hear the workers, so it must not judge them.

use std::time::Duration;

use gantry_types::Timestamp;

use crate::state::AppState;

/// How many heartbeat intervals a worker may miss before it is `not_ready`.
pub const MISSED_HEARTBEATS_FOR_NOT_READY: u32 = 3;

/// The heartbeat times before which a worker is `not_ready` and `unreachable`.
pub fn thresholds(
    now: Timestamp,
    heartbeat_interval: Duration,
    server_timeout: Duration,
) -> (Timestamp, Timestamp) {
    let millis = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
    let not_ready = now.as_millis() - millis(heartbeat_interval * MISSED_HEARTBEATS_FOR_NOT_READY);
    let unreachable = now.as_millis() - millis(server_timeout);
    (
        Timestamp::from_millis(not_ready),
        Timestamp::from_millis(unreachable),
    )
}

/// How often the check runs: often enough to notice within a fraction of an interval.
pub fn check_period(heartbeat_interval: Duration) -> Duration {
    (heartbeat_interval / 3).clamp(Duration::from_millis(100), Duration::from_secs(5))
}

/// Runs the check until shutdown.
pub fn spawn(state: &AppState) {
    let state_for_task = state.clone();
    state.tasks.spawn(async move {
        let state = state_for_task;
        let mut tick = tokio::time::interval(check_period(state.config.heartbeat_interval));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = state.shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            let Some(fence) = state.cluster.leader_fence() else {
                continue;
            };
            let (not_ready, unreachable) = thresholds(
                Timestamp::now(),
                state.config.heartbeat_interval,
                state.config.server_timeout,
            );
            match state
                .store
                .mark_silent_workers(not_ready, unreachable, &fence)
                .await
            {
                Ok(changed) => {
                    for worker in changed {
                        tracing::warn!(worker_id = worker.id, worker = %worker.name, state = worker.state.as_str(), last_heartbeat_at = ?worker.last_heartbeat_at.map(|t| t.to_string()), "worker went silent");
                    }
                }
                Err(e @ gantry_store::StoreError::Fenced { .. }) => state.cluster.on_write_error(&e),
                Err(e) => tracing::error!(error = %e, "check worker heartbeats"),
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thresholds_are_three_intervals_and_the_timeout_back() {
        let now = Timestamp::from_millis(1_000_000);
        let (not_ready, unreachable) =
            thresholds(now, Duration::from_secs(15), Duration::from_secs(60));
        assert_eq!(not_ready.as_millis(), 1_000_000 - 45_000);
        assert_eq!(unreachable.as_millis(), 1_000_000 - 60_000);
    }

    #[test]
    fn check_period_is_bounded() {
        assert_eq!(
            check_period(Duration::from_secs(15)),
            Duration::from_secs(5)
        );
        assert_eq!(
            check_period(Duration::from_millis(30)),
            Duration::from_millis(100)
        );
        assert_eq!(
            check_period(Duration::from_millis(900)),
            Duration::from_millis(300)
        );
    }
}
