//! Worker credentials already found in the store, by digest.
//!
//! Every worker calls its server at least twice per heartbeat interval (heartbeat and
//! server list); with thousands of workers a store read per call is most of the
//! server's work at rest. A credential never changes while its worker exists, so a
//! found worker is kept until its worker changes or is deleted (the store's change feed,
//! applied inline, also for changes made through other servers) or [`FRESH_FOR`] has
//! passed. A lookup that began before such a change does not store its answer, so a
//! deleted worker's credential is refused by the very next request.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use gantry_store::Change;
use tokio::time::Instant;

use crate::secrets::SecretDigest;

/// How long a found credential is used without asking the store again.
pub const FRESH_FOR: Duration = Duration::from_secs(60);
/// Most credentials kept; past it the oldest half is dropped.
pub const CAPACITY: usize = 100_000;

/// A worker found by its credential.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KnownWorker {
    pub worker_id: i64,
    pub worker_name: Arc<str>,
}

#[derive(Debug)]
struct Entry {
    worker: KnownWorker,
    found_at: Instant,
}

/// See the module documentation.
#[derive(Debug, Default)]
pub struct WorkerCredentialCache {
    entries: Mutex<HashMap<SecretDigest, Entry>>,
    /// Moves on every change that may have ended a credential.
    generation: AtomicU64,
}

/// Where a lookup began, for [`WorkerCredentialCache::store`].
#[derive(Debug, Clone, Copy)]
pub struct LookupStart(u64);

impl WorkerCredentialCache {
    fn lock(&self) -> MutexGuard<'_, HashMap<SecretDigest, Entry>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The worker with this credential, when found less than [`FRESH_FOR`] ago.
    pub fn get(&self, digest: &SecretDigest) -> Option<KnownWorker> {
        let entries = self.lock();
        let entry = entries.get(digest)?;
        (entry.found_at.elapsed() < FRESH_FOR).then(|| entry.worker.clone())
    }

    /// Call before asking the store; pass the result to [`Self::store`].
    pub fn begin_lookup(&self) -> LookupStart {
        LookupStart(self.generation.load(Ordering::Acquire))
    }

    /// Keeps what the store answered, unless a worker changed since the lookup began.
    pub fn store(&self, start: LookupStart, digest: SecretDigest, worker: KnownWorker) {
        let mut entries = self.lock();
        // Checked under the lock that `forget` takes too: a change applied after this
        // check removes the entry below.
        if self.generation.load(Ordering::Acquire) != start.0 {
            return;
        }
        if entries.len() >= CAPACITY {
            let mut ages: Vec<Instant> = entries.values().map(|e| e.found_at).collect();
            ages.sort_unstable();
            let cut = ages[ages.len() / 2];
            entries.retain(|_, e| e.found_at > cut);
        }
        entries.insert(
            digest,
            Entry {
                worker,
                found_at: Instant::now(),
            },
        );
    }

    /// Applies a committed change: any change of a worker forgets its credential.
    pub fn apply(&self, change: &Change) {
        if let Change::Worker(_, worker) = change {
            self.forget(worker.id);
        }
    }

    fn forget(&self, worker_id: i64) {
        let mut entries = self.lock();
        self.generation.fetch_add(1, Ordering::AcqRel);
        entries.retain(|_, e| e.worker.worker_id != worker_id);
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn known(id: i64) -> KnownWorker {
        KnownWorker {
            worker_id: id,
            worker_name: Arc::from(format!("w{id}")),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_found_credential_is_kept_until_it_is_stale() {
        let cache = WorkerCredentialCache::default();
        let digest = SecretDigest::of("gantryw_a");
        assert_eq!(cache.get(&digest), None);
        cache.store(cache.begin_lookup(), digest, known(1));
        assert_eq!(cache.get(&digest), Some(known(1)));
        tokio::time::advance(FRESH_FOR - Duration::from_millis(1)).await;
        assert_eq!(cache.get(&digest), Some(known(1)));
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(cache.get(&digest), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_of_the_worker_forgets_it_and_an_earlier_lookup_does_not_bring_it_back() {
        let cache = WorkerCredentialCache::default();
        let (a, b) = (SecretDigest::of("gantryw_a"), SecretDigest::of("gantryw_b"));
        cache.store(cache.begin_lookup(), a, known(1));
        cache.store(cache.begin_lookup(), b, known(2));
        let began = cache.begin_lookup();
        cache.forget(1);
        assert_eq!(cache.get(&a), None);
        assert_eq!(cache.get(&b), Some(known(2)), "other workers stay");
        // A lookup of worker 1 that read the store before its deletion.
        cache.store(began, a, known(1));
        assert_eq!(cache.get(&a), None);
        cache.store(cache.begin_lookup(), a, known(1));
        assert_eq!(cache.get(&a), Some(known(1)));
    }

    #[tokio::test(start_paused = true)]
    async fn the_cache_is_bounded() {
        let cache = WorkerCredentialCache::default();
        for i in 0..CAPACITY + 1 {
            cache.store(
                cache.begin_lookup(),
                SecretDigest::of(&format!("gantryw_{i}")),
                known(i as i64),
            );
            if i % 1000 == 0 {
                tokio::time::advance(Duration::from_millis(1)).await;
            }
        }
        assert!(cache.len() <= CAPACITY, "{}", cache.len());
        assert!(cache.len() > CAPACITY / 4, "{}", cache.len());
    }
}
