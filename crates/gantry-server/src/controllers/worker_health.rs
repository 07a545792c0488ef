//! Worker health: a worker silent for three heartbeat intervals is `not_ready`
//! (nothing new is placed there); silent for `server_timeout` it is `unreachable` and
//! its instances are marked `unreachable` so they can be rescheduled. A heartbeat
//! brings it back to `ready` (in the heartbeat handler).
//!
//! Leader only, fenced like every controller: a server that is not sure it leads (a
//! standby, or a leader cut off from the database that could not renew) may be the one
//! that cannot hear the workers, so it must not judge them.
//!
//! Silence counts only from when heartbeats could be heard: from this server's start and
//! from the end of a spell in which the database could not be reached (no heartbeat
//! could be recorded then, so every worker looks silent for the length of the outage).
//! Without that, the first check after a server restart or a database outage longer than
//! `server_timeout` would mark every worker `unreachable` and reschedule every instance
//! that was serving all along.

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

/// [`thresholds`], counting silence only since `hearing_since` (when heartbeats could
/// last start being recorded): a threshold that lies before that moment judges nobody.
pub fn thresholds_since(
    now: Timestamp,
    hearing_since: Timestamp,
    heartbeat_interval: Duration,
    server_timeout: Duration,
) -> (Timestamp, Timestamp) {
    let (not_ready, unreachable) = thresholds(now, heartbeat_interval, server_timeout);
    // `last_heartbeat_at < i64::MIN` holds for no worker.
    let nobody = Timestamp::from_millis(i64::MIN);
    let heard = |threshold: Timestamp| {
        if hearing_since < threshold {
            threshold
        } else {
            nobody
        }
    };
    (heard(not_ready), heard(unreachable))
}

/// Heartbeats cannot be recorded (`why`): silence counts again from the first check after
/// they can.
fn stop_hearing(hearing_since: &mut Option<Timestamp>, why: &dyn std::fmt::Display) {
    if hearing_since.take().is_some() {
        tracing::warn!(error = %why, "database unreachable: no worker is judged silent until it is back and they have had time to send heartbeats again");
    }
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
        // Since when heartbeats could be recorded; `None` while the database cannot be
        // reached (set again by the first check after that).
        let mut hearing_since = Some(Timestamp::now());
        loop {
            tokio::select! {
                () = state.shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            if let Some(why) = state.store.unreachable() {
                // Checked before leadership: a leader cut off from the database loses
                // its lease, and leads again once it is back.
                stop_hearing(&mut hearing_since, &why);
                continue;
            }
            let Some(fence) = state.cluster.leader_fence() else {
                continue;
            };
            let now = Timestamp::now();
            let (not_ready, unreachable) = thresholds_since(
                now,
                *hearing_since.get_or_insert(now),
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
                Err(e) if e.is_unavailable() => stop_hearing(&mut hearing_since, &e),
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
    fn silence_counts_only_since_heartbeats_could_be_heard() {
        let (interval, timeout) = (Duration::from_secs(15), Duration::from_secs(60));
        let now = Timestamp::from_millis(1_000_000);
        let since = |ago: i64| Timestamp::from_millis(1_000_000 - ago);
        let nobody = Timestamp::from_millis(i64::MIN);
        // Just back: nobody is judged.
        assert_eq!(
            thresholds_since(now, since(1_000), interval, timeout),
            (nobody, nobody)
        );
        // Back for longer than three intervals, not yet server_timeout: not_ready only.
        assert_eq!(
            thresholds_since(now, since(50_000), interval, timeout),
            (Timestamp::from_millis(1_000_000 - 45_000), nobody)
        );
        // Back for longer than both: as usual.
        assert_eq!(
            thresholds_since(now, since(61_000), interval, timeout),
            thresholds(now, interval, timeout)
        );
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
