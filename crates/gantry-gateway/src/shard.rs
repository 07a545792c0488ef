//! Per-thread shards of state that every request writes.
//!
//! A counter, lock or wait list that every request touches is one cache line that the
//! CPUs serving requests pass back and forth: each atomic operation on it waits for the
//! line to come over from the CPU that wrote it last. Such state is kept as one copy
//! per shard instead, each on cache lines of its own; a thread always uses the same
//! shard (threads are given shards in turn as they first ask), so a request's writes
//! stay in its own CPU's cache, and whoever reads the whole (a `/metrics` scrape, the
//! usage flush) visits every shard.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

/// Most shards: beyond this, threads share shards (still correct, a little slower).
const MAX_SHARDS: usize = 16;

/// How many shards each sharded value has: the machine's CPUs, rounded up to a power
/// of two, at most [`MAX_SHARDS`].
pub fn count() -> usize {
    static COUNT: OnceLock<usize> = OnceLock::new();
    *COUNT.get_or_init(|| {
        std::thread::available_parallelism()
            .map_or(1, usize::from)
            .next_power_of_two()
            .min(MAX_SHARDS)
    })
}

/// The calling thread's shard.
pub fn index() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static INDEX: usize = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    INDEX.with(|index| *index) & (count() - 1)
}

/// A value on cache lines of its own (128 bytes: two lines, as the adjacent-line
/// prefetcher pairs them).
#[derive(Debug, Default)]
#[repr(align(128))]
pub struct Padded<T>(pub T);

/// One `T` per shard.
#[derive(Debug)]
pub struct Sharded<T> {
    shards: Box<[Padded<T>]>,
}

impl<T: Default> Default for Sharded<T> {
    fn default() -> Self {
        Self {
            shards: (0..count()).map(|_| Padded(T::default())).collect(),
        }
    }
}

impl<T> Sharded<T> {
    /// The calling thread's copy.
    pub fn local(&self) -> &T {
        // `count()` is fixed for the process, so every index is in range.
        &self.shards[index() & (self.shards.len() - 1)].0
    }

    /// Every copy, to sum or drain.
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.shards.iter().map(|shard| &shard.0)
    }

    /// Every copy but the calling thread's, to fall back on.
    pub fn others(&self) -> impl Iterator<Item = &T> {
        let local = self.local();
        self.iter()
            .filter(move |shard| !std::ptr::eq(*shard, local))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::atomic::AtomicU64;

    use super::*;

    #[test]
    fn threads_write_their_own_shard_and_the_sum_sees_every_write() {
        let counter: Sharded<AtomicU64> = Sharded::default();
        assert!(count().is_power_of_two() && count() <= MAX_SHARDS);
        std::thread::scope(|scope| {
            for _ in 0..8 {
                scope.spawn(|| {
                    for _ in 0..1000 {
                        counter.local().fetch_add(1, Ordering::Relaxed);
                    }
                    // One thread, one shard: it stays the same however often asked.
                    assert_eq!(index(), index());
                });
            }
        });
        let total: u64 = counter.iter().map(|c| c.load(Ordering::Relaxed)).sum();
        assert_eq!(total, 8000);
        assert_eq!(counter.iter().count(), count());
        assert_eq!(std::mem::align_of::<Padded<u8>>(), 128);
    }
}
