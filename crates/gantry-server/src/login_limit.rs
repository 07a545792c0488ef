//! Failed logins, limited per (username, client address) and per client address.
//!
//! Past [`PER_USER_AND_ADDRESS`] failures for one username from one address within
//! [`WINDOW`], or [`PER_ADDRESS`] failures from one address for any usernames, that
//! address's next attempts are answered 429 with `Retry-After` until the oldest failure
//! in the window has aged out — without checking the password, so a flood costs no
//! argon2 time either. The counts are keyed by address, so a flood from one address never
//! locks the account for anyone else. A success clears its (username, address) count.
//! Counts live in this server's memory: each server of a cluster limits its own share.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Failures for one username from one address within [`WINDOW`] before it is refused.
pub const PER_USER_AND_ADDRESS: usize = 5;
/// Failures from one address (any usernames) within [`WINDOW`] before it is refused.
pub const PER_ADDRESS: usize = 30;
/// How long a failure counts.
pub const WINDOW: Duration = Duration::from_secs(60);
/// Most keys kept per table; past it, the keys whose last failure is oldest go first.
const CAPACITY: usize = 100_000;

/// Recent failures per key.
#[derive(Debug)]
struct Failures<K> {
    by_key: HashMap<K, VecDeque<Instant>>,
}

impl<K: Hash + Eq + Clone> Failures<K> {
    fn new() -> Self {
        Self {
            by_key: HashMap::new(),
        }
    }

    /// How long until `key` is under `limit` again; `None` when it is now.
    fn wait(&mut self, key: &K, limit: usize, now: Instant) -> Option<Duration> {
        let times = self.by_key.get_mut(key)?;
        while times
            .front()
            .is_some_and(|t| now.duration_since(*t) >= WINDOW)
        {
            times.pop_front();
        }
        if times.is_empty() {
            self.by_key.remove(key);
            return None;
        }
        (times.len() >= limit).then(|| {
            // Under the limit once the failures beyond `limit - 1` have aged out.
            let releasing = times[times.len() - limit];
            (releasing + WINDOW).saturating_duration_since(now)
        })
    }

    fn record(&mut self, key: K, limit: usize, now: Instant) {
        if self.by_key.len() >= CAPACITY && !self.by_key.contains_key(&key) {
            self.prune(now);
        }
        let times = self.by_key.entry(key).or_default();
        times.push_back(now);
        // Only the newest `limit` matter for the answer.
        while times.len() > limit {
            times.pop_front();
        }
    }

    fn forget(&mut self, key: &K) {
        self.by_key.remove(key);
    }

    /// Drops aged-out keys, then, while still full, the half whose last failure is
    /// oldest.
    fn prune(&mut self, now: Instant) {
        self.by_key.retain(|_, times| {
            times
                .back()
                .is_some_and(|t| now.duration_since(*t) < WINDOW)
        });
        if self.by_key.len() >= CAPACITY {
            let mut last: Vec<Instant> = self
                .by_key
                .values()
                .filter_map(|t| t.back().copied())
                .collect();
            last.sort_unstable();
            let cut = last[last.len() / 2];
            self.by_key
                .retain(|_, times| times.back().is_some_and(|t| *t > cut));
        }
    }
}

#[derive(Debug)]
struct Tables {
    by_user_and_address: Failures<(String, IpAddr)>,
    by_address: Failures<IpAddr>,
}

/// See the module documentation.
#[derive(Debug)]
pub struct LoginLimiter {
    tables: Mutex<Tables>,
}

impl Default for LoginLimiter {
    fn default() -> Self {
        Self {
            tables: Mutex::new(Tables {
                by_user_and_address: Failures::new(),
                by_address: Failures::new(),
            }),
        }
    }
}

impl LoginLimiter {
    fn lock(&self) -> std::sync::MutexGuard<'_, Tables> {
        self.tables.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How long `address` must wait before trying `username` again; `None`: try now.
    pub fn wait(&self, username: &str, address: IpAddr) -> Option<Duration> {
        let now = Instant::now();
        let mut tables = self.lock();
        let pair = tables.by_user_and_address.wait(
            &(username.to_owned(), address),
            PER_USER_AND_ADDRESS,
            now,
        );
        let any = tables.by_address.wait(&address, PER_ADDRESS, now);
        pair.max(any)
    }

    /// Counts a failed attempt.
    pub fn failed(&self, username: &str, address: IpAddr) {
        let now = Instant::now();
        let mut tables = self.lock();
        tables.by_user_and_address.record(
            (username.to_owned(), address),
            PER_USER_AND_ADDRESS,
            now,
        );
        tables.by_address.record(address, PER_ADDRESS, now);
    }

    /// A successful login clears the (username, address) count.
    pub fn succeeded(&self, username: &str, address: IpAddr) {
        self.lock()
            .by_user_and_address
            .forget(&(username.to_owned(), address));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    #[tokio::test(start_paused = true)]
    async fn five_failures_lock_that_username_from_that_address_for_the_rest_of_the_minute() {
        let limiter = LoginLimiter::default();
        for _ in 0..PER_USER_AND_ADDRESS {
            assert_eq!(limiter.wait("alice", ip(1)), None);
            limiter.failed("alice", ip(1));
            tokio::time::advance(Duration::from_secs(1)).await;
        }
        // The first failure was 5 s ago: 55 s to go.
        assert_eq!(limiter.wait("alice", ip(1)), Some(Duration::from_secs(55)));
        // Another address, and another username from this one, are not affected.
        assert_eq!(limiter.wait("alice", ip(2)), None);
        assert_eq!(limiter.wait("bob", ip(1)), None);
        tokio::time::advance(Duration::from_secs(55)).await;
        assert_eq!(limiter.wait("alice", ip(1)), None);
    }

    #[tokio::test(start_paused = true)]
    async fn an_address_trying_many_usernames_is_limited_as_a_whole() {
        let limiter = LoginLimiter::default();
        for i in 0..PER_ADDRESS {
            limiter.failed(&format!("user{i}"), ip(1));
        }
        assert_eq!(limiter.wait("someone-else", ip(1)), Some(WINDOW));
        assert_eq!(limiter.wait("someone-else", ip(2)), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_success_clears_its_own_count_only() {
        let limiter = LoginLimiter::default();
        for _ in 0..PER_USER_AND_ADDRESS - 1 {
            limiter.failed("alice", ip(1));
        }
        limiter.succeeded("alice", ip(1));
        limiter.failed("alice", ip(1));
        assert_eq!(limiter.wait("alice", ip(1)), None);
    }

    #[tokio::test(start_paused = true)]
    async fn the_tables_are_bounded() {
        let limiter = LoginLimiter::default();
        for i in 0..CAPACITY + 10 {
            let address = IpAddr::from((i as u128).to_be_bytes());
            limiter.failed("alice", address);
            if i % 10_000 == 0 {
                tokio::time::advance(Duration::from_millis(1)).await;
            }
        }
        let tables = limiter.lock();
        assert!(tables.by_address.by_key.len() <= CAPACITY);
        assert!(tables.by_user_and_address.by_key.len() <= CAPACITY);
    }
}
