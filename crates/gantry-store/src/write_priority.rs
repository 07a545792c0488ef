//! The leader's batched instance writes go ahead of the fleet's routine writes.
//!
//! When a burst of instances is placed (10,000 after a restart, say), the workers report
//! the first placed instances `starting` and `running` while the scheduler is still
//! writing the rest, and every worker goes on heartbeating. On SQLite all of those queue
//! for the one writer connection in arrival order, each placement batch behind a share
//! of reports and heartbeats; on PostgreSQL they share the machine's CPUs with it. So
//! the routine writes — instance reports and heartbeats — wait while a leader write is
//! waiting or under way, at most [`MOST_YIELD`] each time: none waits long even under a
//! scheduler that writes without a pause, and a heartbeat a second late is nothing
//! against the intervals worker health judges by. Reports that wait are written
//! together afterwards (see `reports.rs`).

use std::time::Duration;

use tokio::sync::watch;

/// The longest a routine write waits for the leader's writes.
pub const MOST_YIELD: Duration = Duration::from_secs(2);

/// How many leader writes are waiting or under way.
#[derive(Debug)]
pub(crate) struct WritePriority {
    leader: watch::Sender<usize>,
}

impl Default for WritePriority {
    fn default() -> Self {
        WritePriority {
            leader: watch::Sender::new(0),
        }
    }
}

/// A leader write waiting or under way, until dropped.
pub(crate) struct LeaderWrite<'a>(&'a WritePriority);

impl Drop for LeaderWrite<'_> {
    fn drop(&mut self) {
        self.0.leader.send_modify(|n| *n = n.saturating_sub(1));
    }
}

impl WritePriority {
    /// Marks a leader write from now until the guard is dropped (after its commit).
    pub(crate) fn leader_write(&self) -> LeaderWrite<'_> {
        self.leader.send_modify(|n| *n += 1);
        LeaderWrite(self)
    }

    /// Waits until no leader write is waiting or under way, at most [`MOST_YIELD`].
    pub(crate) async fn yield_to_leader(&self) {
        if *self.leader.borrow() == 0 {
            return;
        }
        let mut leader = self.leader.subscribe();
        let _ = tokio::time::timeout(MOST_YIELD, leader.wait_for(|n| *n == 0)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn routine_writes_wait_for_the_leaders_and_no_longer_than_the_limit() {
        let priority = WritePriority::default();
        let began = tokio::time::Instant::now();
        priority.yield_to_leader().await;
        assert_eq!(began.elapsed(), Duration::ZERO, "nothing to wait for");

        let write = priority.leader_write();
        let waited = async {
            priority.yield_to_leader().await;
            began.elapsed()
        };
        let finish = async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            drop(write);
        };
        let (waited, ()) = tokio::join!(waited, finish);
        assert_eq!(
            waited,
            Duration::from_millis(300),
            "until the leader's write ended"
        );

        let _stuck = priority.leader_write();
        let began = tokio::time::Instant::now();
        priority.yield_to_leader().await;
        assert_eq!(began.elapsed(), MOST_YIELD, "never longer than the limit");
    }
}
