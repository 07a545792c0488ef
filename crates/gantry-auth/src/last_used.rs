//! API-key last-used times, batched off the request path: a request only records "key
//! K used at T" in memory (one short lock, no IO); a task writes the latest time of
//! each key to the store every [`LAST_USED_FLUSH_INTERVAL`] — one write per key per
//! flush, however often the key was used — and once more at shutdown, before the store
//! closes.
//!
//! Only accepted keys are recorded, so the pending map holds at most one entry per
//! key in use; it is bounded by [`MAX_PENDING_KEYS`] all the same (beyond it, uses of
//! further keys are dropped and counted). A failed flush keeps its times for the next
//! one.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use gantry_store::Store;
use gantry_types::Timestamp;

/// How often pending last-used times are written.
pub const LAST_USED_FLUSH_INTERVAL: Duration = Duration::from_secs(10);

/// Most distinct keys held between flushes.
pub const MAX_PENDING_KEYS: usize = 100_000;

/// The latest use of each key since the last flush.
#[derive(Debug, Default)]
pub struct LastUsedBatcher {
    pending: Mutex<HashMap<i64, Timestamp>>,
    dropped: AtomicU64,
}

impl LastUsedBatcher {
    /// Records a use of key `key_id` at `at` (an earlier time than one already
    /// recorded changes nothing).
    pub fn record(&self, key_id: i64, at: Timestamp) {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let full = pending.len() >= MAX_PENDING_KEYS;
        match pending.get_mut(&key_id) {
            Some(latest) => *latest = (*latest).max(at),
            None if full => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
            None => {
                pending.insert(key_id, at);
            }
        }
    }

    /// Uses that could not be held (too many distinct keys between flushes).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// The pending times, one per key, ordered by key id; empties the batch.
    pub fn take(&self) -> Vec<(i64, Timestamp)> {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let mut batch: Vec<(i64, Timestamp)> = std::mem::take(&mut *pending).into_iter().collect();
        batch.sort_unstable_by_key(|(key_id, _)| *key_id);
        batch
    }

    /// Writes what is pending, one write per key; on failure keeps the unwritten
    /// times for the next flush (a newer use recorded meanwhile wins).
    pub async fn flush(&self, store: &Store) {
        let batch = self.take();
        for (written, &(key_id, at)) in batch.iter().enumerate() {
            if let Err(e) = store.touch_api_key(key_id, at).await {
                let unwritten = &batch[written..];
                tracing::error!(
                    api_key_id = key_id,
                    keys = unwritten.len(),
                    error = %e,
                    "write API-key last-used times; keeping them for the next flush"
                );
                for &(key_id, at) in unwritten {
                    self.record(key_id, at);
                }
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use gantry_store::{NewApiKey, NewUser};
    use gantry_testkit::{TestDatabase, TestEngine};
    use gantry_types::Role;

    use super::*;

    #[test]
    fn several_uses_of_a_key_are_one_write_with_the_latest_time() {
        let batcher = LastUsedBatcher::default();
        batcher.record(7, Timestamp::from_millis(1_000));
        batcher.record(7, Timestamp::from_millis(3_000));
        batcher.record(7, Timestamp::from_millis(2_000));
        batcher.record(9, Timestamp::from_millis(500));
        assert_eq!(
            batcher.take(),
            [
                (7, Timestamp::from_millis(3_000)),
                (9, Timestamp::from_millis(500))
            ]
        );
        assert!(batcher.take().is_empty(), "a flush takes the batch");
        batcher.record(7, Timestamp::from_millis(4_000));
        assert_eq!(batcher.take(), [(7, Timestamp::from_millis(4_000))]);
    }

    #[tokio::test]
    async fn a_flush_writes_each_key_its_latest_use() {
        let db = TestDatabase::new(TestEngine::Sqlite).await;
        let store = db.open().await;
        let user = store
            .create_user(&NewUser {
                cluster_admin_of: Vec::new(),
                username: "alice".into(),
                password_hash: "hash".into(),
                role: Role::User,
                full_name: String::new(),
                require_password_change: false,
            })
            .await
            .unwrap();
        let key = store
            .create_api_key(&NewApiKey {
                user_id: user.id,
                name: "k".into(),
                description: String::new(),
                access_key: "access".into(),
                lookup_digest: "digest".into(),
                secret_hash: "hash".into(),
                expires_at: None,
                limits: Default::default(),
            })
            .await
            .unwrap();
        let batcher = LastUsedBatcher::default();
        for millis in [5_000, 9_000, 7_000] {
            batcher.record(key.id, Timestamp::from_millis(millis));
        }
        batcher.flush(&store).await;
        assert_eq!(
            store.get_api_key(key.id).await.unwrap().last_used_at,
            Some(Timestamp::from_millis(9_000))
        );
        assert!(batcher.take().is_empty());
    }
}
