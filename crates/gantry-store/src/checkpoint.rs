//! SQLite's write-ahead-log checkpoints, off the write path.
//!
//! By default SQLite checkpoints inside the commit that takes the log past 1,000 pages:
//! that commit copies the log into the database file and syncs it, and with one writer
//! connection (see [`crate::Store`]) every write queued behind it waits too, and a large
//! fleet's heartbeats alone fill that many pages often. So the writer never
//! checkpoints (`wal_autocheckpoint = 0`) and this task does, on a reading connection,
//! every [`CHECKPOINT_INTERVAL`]: a passive checkpoint copies what no reader still needs
//! and never blocks the writer.

use std::time::Duration;

use sqlx::AnyPool;
use tokio_util::sync::CancellationToken;

/// How often the log is copied into the database file.
pub(crate) const CHECKPOINT_INTERVAL: Duration = Duration::from_secs(1);

/// Checkpoints every [`CHECKPOINT_INTERVAL`] through `reads` until `shutdown`.
pub(crate) fn start(reads: AnyPool, shutdown: CancellationToken) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(CHECKPOINT_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing = false;
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            match sqlx::query("PRAGMA wal_checkpoint(PASSIVE)")
                .execute(&reads)
                .await
            {
                Ok(_) if failing => {
                    failing = false;
                    tracing::info!("SQLite checkpoints work again");
                }
                Ok(_) => {}
                Err(e) if !failing => {
                    failing = true;
                    tracing::warn!(error = %e, "SQLite checkpoint failed; the write-ahead log (the database file's -wal) grows until one succeeds, check the disk");
                }
                Err(_) => {}
            }
        }
    });
}
