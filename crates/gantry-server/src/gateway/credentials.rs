//! The gateway's memory of API keys it has just accepted, in front of the server's own
//! API-key check (`auth::principal::authenticate_token`).
//!
//! It was added because the server's cache re-ran argon2 for every concurrent request
//! when an entry expired (a p99 of over half a second once a minute in
//! `scripts/bench-gateway.sh`). The server's cache now re-checks stale keys by digest
//! only, so that reason is gone; what remains is a cheaper hit (one hash and one map
//! lookup, no clone of the user, no bookkeeping) and one request re-checking a stale
//! entry while the others keep using it. Whether the gateway still needs its own layer
//! has not been measured since; fold it into the server's cache if it does not.
//!
//! An entry is trusted for [`FRESH_FOR`], then re-checked by the next request (served
//! to others for at most [`STALE_LIMIT`] while that runs). Every entry is dropped when
//! any API key or user changes (this server's change feed), so a deleted key stops
//! working here as soon as it does in the server's cache. Only API keys are kept:
//! session tokens go to `authenticate_token` every time.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::time::Instant;

use super::usage::Caller;

/// How long an accepted key is used without asking the server's check again.
pub const FRESH_FOR: Duration = Duration::from_secs(1);
/// How long an entry may be used while one request re-checks it.
pub const STALE_LIMIT: Duration = Duration::from_secs(30);
/// Most keys remembered; beyond it everything is forgotten.
const MAX_ENTRIES: usize = 100_000;

type Key = [u8; 32];

#[derive(Debug)]
struct Entry {
    caller: Caller,
    checked_at: Instant,
    /// A request is re-checking this key now.
    refreshing: bool,
}

/// What the cache says about a token.
#[derive(Debug)]
pub enum Lookup<'a> {
    /// Use this caller.
    Hit(Caller),
    /// Check the token; the guard records the outcome (or, if dropped, lets the next
    /// request try).
    Check(CheckGuard<'a>),
}

/// Accepted API keys by the SHA-256 of the whole key.
#[derive(Debug, Default)]
pub struct CredentialCache {
    entries: Mutex<HashMap<Key, Entry>>,
}

impl CredentialCache {
    pub fn lookup<'a>(&'a self, token: &str) -> Lookup<'a> {
        let key: Key = Sha256::digest(token.as_bytes()).into();
        let now = Instant::now();
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(entry) = entries.get_mut(&key) {
            let age = now.duration_since(entry.checked_at);
            if age < FRESH_FOR || (entry.refreshing && age < STALE_LIMIT) {
                return Lookup::Hit(entry.caller.clone());
            }
            entry.refreshing = true;
        }
        Lookup::Check(CheckGuard {
            cache: self,
            key,
            done: false,
        })
    }

    /// Forgets every key (an API key or a user changed, or changes were missed).
    pub fn clear(&self) {
        self.entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }
}

/// A pending check of one token.
#[derive(Debug)]
pub struct CheckGuard<'a> {
    cache: &'a CredentialCache,
    key: Key,
    done: bool,
}

impl CheckGuard<'_> {
    /// The server's check accepted an API key: remember it.
    pub fn accepted(mut self, caller: &Caller) {
        self.done = true;
        let mut entries = self.cache.entries.lock().unwrap_or_else(|e| e.into_inner());
        if entries.len() >= MAX_ENTRIES && !entries.contains_key(&self.key) {
            entries.clear();
        }
        entries.insert(
            self.key,
            Entry {
                caller: caller.clone(),
                checked_at: Instant::now(),
                refreshing: false,
            },
        );
    }

    /// The check refused the token, or it is not an API key: forget it.
    pub fn rejected(mut self) {
        self.done = true;
        let mut entries = self.cache.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.remove(&self.key);
    }
}

impl Drop for CheckGuard<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        // The checking request was cancelled: let the next one check.
        let mut entries = self.cache.entries.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(entry) = entries.get_mut(&self.key) {
            entry.refreshing = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller() -> Caller {
        Caller {
            user_id: 1,
            api_key_id: Some(2),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn one_request_rechecks_a_stale_key_while_the_others_use_it() {
        let cache = CredentialCache::default();
        let Lookup::Check(check) = cache.lookup("gantry_a_b") else {
            panic!("an unknown key must be checked");
        };
        check.accepted(&caller());
        assert!(matches!(cache.lookup("gantry_a_b"), Lookup::Hit(_)));
        assert!(matches!(cache.lookup("gantry_other"), Lookup::Check(_)));

        tokio::time::advance(FRESH_FOR).await;
        let Lookup::Check(recheck) = cache.lookup("gantry_a_b") else {
            panic!("a stale key is re-checked");
        };
        // Meanwhile everyone else is served from the entry.
        assert!(matches!(cache.lookup("gantry_a_b"), Lookup::Hit(_)));
        recheck.accepted(&caller());
        assert!(matches!(cache.lookup("gantry_a_b"), Lookup::Hit(_)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_rejected_or_cleared_key_is_checked_again() {
        let cache = CredentialCache::default();
        if let Lookup::Check(check) = cache.lookup("k") {
            check.accepted(&caller());
        }
        tokio::time::advance(FRESH_FOR).await;
        if let Lookup::Check(check) = cache.lookup("k") {
            check.rejected();
        }
        assert!(matches!(cache.lookup("k"), Lookup::Check(_)));

        if let Lookup::Check(check) = cache.lookup("k") {
            check.accepted(&caller());
        }
        cache.clear();
        assert!(matches!(cache.lookup("k"), Lookup::Check(_)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancelled_check_lets_the_next_request_check() {
        let cache = CredentialCache::default();
        if let Lookup::Check(check) = cache.lookup("k") {
            check.accepted(&caller());
        }
        tokio::time::advance(FRESH_FOR).await;
        let first = cache.lookup("k");
        assert!(matches!(first, Lookup::Check(_)));
        drop(first);
        assert!(matches!(cache.lookup("k"), Lookup::Check(_)));
    }
}
