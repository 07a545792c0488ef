//! The usage archiver: whole days of per-minute usage older than `usage_retention` are
//! rolled up into one row per day, user, API key and model
//! ([`gantry_store::Store::roll_up_usage`]), so the usage table grows by days, not
//! minutes.
//!
//! Leader only, to do the work once; the roll-up itself counts nothing twice even when
//! two servers run it at once (each day is one transaction that deletes what it sums), so
//! it needs no fence.

use std::time::Duration;

use gantry_types::Timestamp;

use crate::state::AppState;

/// How often the leader looks for days to roll up.
pub const PERIOD: Duration = Duration::from_secs(600);

/// Runs the archiver until shutdown: a minute after start, then every [`PERIOD`].
pub fn spawn(state: &AppState) {
    let state = state.clone();
    let tasks = state.tasks.clone();
    tasks.spawn(async move {
        let first = tokio::time::Instant::now() + Duration::from_secs(60);
        let mut tick = tokio::time::interval_at(first, PERIOD);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = state.shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            if state.store.unreachable().is_some() || state.cluster.leader_fence().is_none() {
                continue;
            }
            let before = cutoff(Timestamp::now(), state.config.usage_retention);
            if let Err(e) = state.store.roll_up_usage(before).await {
                tracing::warn!(error = %e, "rolling old usage up failed; tried again in 10 min");
            }
        }
    });
}

/// The time before which minutes are rolled up.
pub fn cutoff(now: Timestamp, retention: Duration) -> Timestamp {
    let retention = i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
    Timestamp::from_millis(now.as_millis().saturating_sub(retention))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cutoff_is_the_retention_back() {
        let now = Timestamp::from_millis(10 * 86_400_000);
        let week = Duration::from_secs(7 * 86_400);
        assert_eq!(cutoff(now, week).as_millis(), 3 * 86_400_000);
        assert!(
            cutoff(now, Duration::MAX).as_millis() < 0,
            "before everything"
        );
    }
}
