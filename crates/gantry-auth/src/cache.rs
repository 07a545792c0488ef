//! The one cache of accepted API keys, used by both planes (the management API and the
//! gateway) through the [`Authenticator`](crate::Authenticator).
//!
//! Verifying an API key from scratch costs an indexed read by the SHA-256 of the whole
//! key and argon2 of its secret half (milliseconds of CPU); the gateway cannot pay that
//! per request. So an accepted key is remembered by its digest, and an entry is:
//!
//! - **fresh** for [`CacheConfig::fresh_for`] after the store last confirmed it: used as
//!   is. A hit is one SHA-256, one short lock and one map lookup, and hands the user out
//!   as an `Arc` (no copy per request).
//! - **stale** after that: the next request re-checks it, by digest only — the row is
//!   found by the SHA-256 of the whole key, secret included, so argon2 adds nothing to a
//!   key this server already verified. While that one request re-checks, the others
//!   keep using the entry for up to [`CacheConfig::refresh_grace`] more. A re-check the
//!   store could not answer (or that was cancelled) leaves the entry stale, so the next
//!   request re-checks it, still without argon2.
//! - **invalidated** when its key or its user changes, or, all of them, when changes
//!   were missed (the caller feeds the store's change feed to [`CredentialCache::apply`]
//!   and [`CredentialCache::invalidate_all`]): no request uses it until one has
//!   re-checked it by digest. A deleted key or user drops its entries outright. A check
//!   that began before any such change does not store its answer (it may have read the
//!   row before the change), so a deletion racing a check cannot be undone by it.
//!
//! On PostgreSQL the change feed carries the other servers' writes too, except those
//! made while this server's listener was reconnecting; `fresh_for` bounds how long a
//! key deleted elsewhere can keep working here then. A key past its `expires_at` is
//! never served from the cache. The cache holds at most [`CacheConfig::max_entries`]
//! keys; making room drops the entries that are not fresh, then an arbitrary tenth.
//!
//! Only API keys are kept: session tokens are checked against the user's session
//! version every time (a logout ends them at once), and workers call too rarely to
//! matter.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use gantry_store::{Change, ChangeKind};
use gantry_types::{Timestamp, User};
use tokio::time::Instant;

use crate::secrets::SecretDigest;

/// A hit reports its key's use to the last-used batcher at most this often, so a busy
/// key costs the hit path no second lock; last-used times have this resolution.
pub const USE_REPORT_INTERVAL: Duration = Duration::from_secs(1);

/// How long keys are trusted and how many are kept.
#[derive(Debug, Clone)]
pub struct CacheConfig {
    /// How long after the store confirmed a key it is used without asking again.
    pub fresh_for: Duration,
    /// How long past `fresh_for` a key keeps serving while one request re-checks it.
    pub refresh_grace: Duration,
    /// Most keys held.
    pub max_entries: usize,
}

impl CacheConfig {
    /// The default `fresh_for`.
    pub const DEFAULT_FRESH_FOR: Duration = Duration::from_secs(60);

    /// Keys fresh for `fresh_for`, with half as long again of grace while one request
    /// re-checks (at most 30 s).
    pub fn fresh_for(fresh_for: Duration) -> Self {
        Self {
            fresh_for,
            refresh_grace: (fresh_for / 2).min(Duration::from_secs(30)),
            max_entries: 100_000,
        }
    }
}

impl Default for CacheConfig {
    fn default() -> Self {
        Self::fresh_for(Self::DEFAULT_FRESH_FOR)
    }
}

/// An API key the store confirmed, as the cache keeps it.
#[derive(Debug, Clone)]
pub struct AcceptedKey {
    pub key_id: i64,
    pub user: Arc<User>,
    pub expires_at: Option<Timestamp>,
}

impl AcceptedKey {
    fn expired(&self) -> bool {
        self.expires_at.is_some_and(|at| at <= Timestamp::now())
    }
}

#[derive(Debug)]
struct Entry {
    key: AcceptedKey,
    /// When the store last confirmed the key; `None` once a change invalidated it.
    checked_at: Option<Instant>,
    /// A request is re-checking the key now.
    refreshing: bool,
    /// When a use of the key was last reported (see [`USE_REPORT_INTERVAL`]).
    use_reported_at: Instant,
}

#[derive(Debug, Default)]
struct Entries {
    by_digest: HashMap<SecretDigest, Entry>,
    /// Bumped by every change that invalidates or drops entries; a check stores its
    /// answer only if no such change came since it began.
    epoch: u64,
}

/// What the cache says about a key.
#[derive(Debug)]
pub enum Lookup<'a> {
    /// Use this key.
    Hit(Hit),
    /// Ask the store; the guard takes the answer (dropped unanswered, it lets the
    /// next request try).
    Check(Check<'a>),
}

/// A key served from the cache.
#[derive(Debug)]
pub struct Hit {
    pub key_id: i64,
    pub user: Arc<User>,
    /// Report this use to the last-used batcher (the first hit each
    /// [`USE_REPORT_INTERVAL`]).
    pub report_use: bool,
    /// How long the caller may take the key as this hit found it without asking
    /// again (see [`Grant`]).
    pub grant: Grant,
}

/// Leave to take an API key as a cache hit found it, for the caller's next requests
/// with the same key (the gateway keeps one per connection), without the digest, the
/// lock and the lookup: until the entry would need a re-check, the key expires or a
/// use is due to be reported ([`USE_REPORT_INTERVAL`]) — whichever comes first — and
/// only while no change invalidated any entry since ([`CredentialCache::holds`]).
#[derive(Debug, Clone, Copy)]
pub struct Grant {
    until: Instant,
    epoch: u64,
}

/// Accepted API keys by the SHA-256 of the whole key.
#[derive(Debug, Default)]
pub struct CredentialCache {
    config: CacheConfig,
    entries: Mutex<Entries>,
    /// `Entries::epoch`, readable without the lock (for [`Grant`]s).
    epoch: AtomicU64,
}

impl CredentialCache {
    pub fn new(config: CacheConfig) -> Self {
        Self {
            config,
            entries: Mutex::default(),
            epoch: AtomicU64::new(0),
        }
    }

    /// Whether `grant` still holds at `now`: before its end, and no change to a key or
    /// user (nor a missed one) invalidated entries since it was given (one atomic load; the counter changes
    /// only with keys and users, so its cache line is not passed between CPUs).
    pub fn holds(&self, grant: &Grant, now: Instant) -> bool {
        now < grant.until && self.epoch.load(Ordering::Acquire) == grant.epoch
    }

    fn lock(&self) -> MutexGuard<'_, Entries> {
        // Nothing panics while holding the lock; a poisoned map is still consistent.
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn lookup(&self, digest: &SecretDigest) -> Lookup<'_> {
        let now = Instant::now();
        let mut entries = self.lock();
        let epoch = entries.epoch;
        let recheck = match entries.by_digest.get_mut(digest) {
            None => false,
            Some(entry) => {
                if let Some(checked_at) = entry.checked_at {
                    let age = now.saturating_duration_since(checked_at);
                    let usable = age < self.config.fresh_for
                        || (entry.refreshing
                            && age < self.config.fresh_for + self.config.refresh_grace);
                    if usable && !entry.key.expired() {
                        let report_use = now.saturating_duration_since(entry.use_reported_at)
                            >= USE_REPORT_INTERVAL;
                        if report_use {
                            entry.use_reported_at = now;
                        }
                        // A use is due at most a second from now, so `until` is near
                        // whatever `fresh_for` (however long) and the expiry are.
                        let mut until = entry.use_reported_at + USE_REPORT_INTERVAL;
                        if let Some(fresh_until) = checked_at.checked_add(self.config.fresh_for) {
                            until = until.min(fresh_until);
                        }
                        if let Some(expires_at) = entry.key.expires_at {
                            let left = expires_at.as_millis() - Timestamp::now().as_millis();
                            let left = Duration::from_millis(u64::try_from(left).unwrap_or(0));
                            if let Some(expiry) = now.checked_add(left) {
                                until = until.min(expiry);
                            }
                        }
                        return Lookup::Hit(Hit {
                            key_id: entry.key.key_id,
                            user: Arc::clone(&entry.key.user),
                            report_use,
                            grant: Grant { until, epoch },
                        });
                    }
                }
                entry.refreshing = true;
                true
            }
        };
        Lookup::Check(Check {
            cache: self,
            digest: *digest,
            epoch,
            recheck,
            answered: false,
        })
    }

    /// Invalidates the entries a committed change makes stale (drops them for a
    /// deletion).
    pub fn apply(&self, change: &Change) {
        match change {
            Change::ApiKey(kind, key) => self.invalidate(*kind, |k| k.key_id == key.id),
            Change::User(kind, user) => self.invalidate(*kind, |k| k.user.id == user.id),
            Change::Worker(..)
            | Change::Model(..)
            | Change::Instance(..)
            | Change::Provider(..)
            | Change::Route(..) => {}
        }
    }

    /// Invalidates every entry (changes were missed).
    pub fn invalidate_all(&self) {
        self.invalidate(ChangeKind::Updated, |_| true);
    }

    fn invalidate(&self, kind: ChangeKind, affected: impl Fn(&AcceptedKey) -> bool) {
        let mut entries = self.lock();
        entries.epoch += 1;
        self.epoch.store(entries.epoch, Ordering::Release);
        if kind == ChangeKind::Deleted {
            entries.by_digest.retain(|_, entry| !affected(&entry.key));
            return;
        }
        for entry in entries.by_digest.values_mut() {
            if affected(&entry.key) {
                entry.checked_at = None;
            }
        }
    }

    /// Keys held.
    pub fn len(&self) -> usize {
        self.lock().by_digest.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Frees a place for one more entry: drops what is not fresh, then, if every entry
    /// is fresh, an arbitrary tenth (their next use verifies them with argon2 again).
    fn make_room(&self, entries: &mut Entries, now: Instant) {
        let max = self.config.max_entries.max(1);
        if entries.by_digest.len() < max {
            return;
        }
        let fresh_for = self.config.fresh_for;
        entries.by_digest.retain(|_, entry| {
            entry
                .checked_at
                .is_some_and(|at| now.saturating_duration_since(at) < fresh_for)
        });
        if entries.by_digest.len() < max {
            return;
        }
        let evict = (max / 10).max(1);
        let victims: Vec<SecretDigest> = entries.by_digest.keys().take(evict).copied().collect();
        for digest in &victims {
            entries.by_digest.remove(digest);
        }
        tracing::warn!(
            max_entries = max,
            evicted = victims.len(),
            "API-key cache is full of fresh keys; dropped some, which argon2 verifies again on their next use"
        );
    }
}

/// A pending check of one key against the store.
#[derive(Debug)]
pub struct Check<'a> {
    cache: &'a CredentialCache,
    digest: SecretDigest,
    epoch: u64,
    recheck: bool,
    answered: bool,
}

impl Check<'_> {
    /// True when this server verified the key's secret before: finding its row by
    /// digest is enough, no argon2.
    pub fn is_recheck(&self) -> bool {
        self.recheck
    }

    /// The store confirmed the key: remember it as fresh.
    pub fn accepted(mut self, key: AcceptedKey) {
        self.answered = true;
        let now = Instant::now();
        let mut entries = self.cache.lock();
        if entries.epoch != self.epoch {
            // A key or a user changed while this check read the store, so its answer
            // may predate the change: the next request checks again.
            if let Some(entry) = entries.by_digest.get_mut(&self.digest) {
                entry.refreshing = false;
            }
            return;
        }
        if !entries.by_digest.contains_key(&self.digest) {
            self.cache.make_room(&mut entries, now);
        }
        entries.by_digest.insert(
            self.digest,
            Entry {
                key,
                checked_at: Some(now),
                refreshing: false,
                use_reported_at: now,
            },
        );
    }

    /// The store could not be reached: the key as this server last confirmed it, if it
    /// did and no change invalidated it since, however long ago that was, unless it has
    /// expired. The data plane outlives a database outage this way: no key can be
    /// created, changed or deleted while the database is down, so what was true when
    /// the store last answered still is (a change made just before the outage whose
    /// notification this server missed is the one exception, as in normal running
    /// within `fresh_for`).
    pub fn known_while_store_unavailable(self) -> Option<Hit> {
        let entries = self.cache.lock();
        let entry = entries.by_digest.get(&self.digest)?;
        if entry.checked_at.is_none() || entry.key.expired() {
            return None;
        }
        Some(Hit {
            key_id: entry.key.key_id,
            user: Arc::clone(&entry.key.user),
            // Its last-used time cannot be written now.
            report_use: false,
            // Asked again on every request while the store is down.
            grant: Grant {
                until: Instant::now(),
                epoch: entries.epoch,
            },
        })
    }

    /// The key is unknown, wrong or expired: forget it.
    pub fn refused(mut self) {
        self.answered = true;
        self.cache.lock().by_digest.remove(&self.digest);
    }
}

impl Drop for Check<'_> {
    fn drop(&mut self) {
        if self.answered {
            return;
        }
        // The store did not answer or the request was cancelled: the entry stays as it
        // was (stale or invalidated), and the next request re-checks it.
        if let Some(entry) = self.cache.lock().by_digest.get_mut(&self.digest) {
            entry.refreshing = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use gantry_types::{ApiKey, Role};

    use super::*;

    const FRESH_FOR: Duration = Duration::from_secs(60);
    const GRACE: Duration = Duration::from_secs(30);

    fn cache(max_entries: usize) -> CredentialCache {
        CredentialCache::new(CacheConfig {
            fresh_for: FRESH_FOR,
            refresh_grace: GRACE,
            max_entries,
        })
    }

    fn user(id: i64) -> User {
        User {
            cluster_admin_of: Vec::new(),
            id,
            username: format!("user{id}"),
            role: Role::User,
            full_name: String::new(),
            require_password_change: false,
            created_at: Timestamp::from_millis(0),
            updated_at: Timestamp::from_millis(0),
        }
    }

    fn accepted(key_id: i64, user_id: i64) -> AcceptedKey {
        AcceptedKey {
            key_id,
            user: Arc::new(user(user_id)),
            expires_at: None,
        }
    }

    fn api_key(id: i64, user_id: i64) -> ApiKey {
        ApiKey {
            id,
            name: format!("key{id}"),
            user_id,
            access_key: "access".into(),
            description: String::new(),
            expires_at: None,
            last_used_at: None,
            created_at: Timestamp::from_millis(0),
            limits: Default::default(),
        }
    }

    fn digest(token: &str) -> SecretDigest {
        SecretDigest::of(token)
    }

    /// Looks a key up and accepts it, as a first successful check does.
    fn accept(cache: &CredentialCache, token: &str, key: AcceptedKey) {
        match cache.lookup(&digest(token)) {
            Lookup::Check(check) => check.accepted(key),
            Lookup::Hit(_) => panic!("{token} was expected to need a check"),
        }
    }

    fn is_hit(cache: &CredentialCache, token: &str) -> bool {
        matches!(cache.lookup(&digest(token)), Lookup::Hit(_))
    }

    /// `Some(true)` for a re-check by digest, `Some(false)` for a full check, `None`
    /// for a hit.
    fn check_kind(cache: &CredentialCache, token: &str) -> Option<bool> {
        match cache.lookup(&digest(token)) {
            Lookup::Hit(_) => None,
            Lookup::Check(check) => Some(check.is_recheck()),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_fresh_key_is_a_hit_that_shares_the_user() {
        let cache = cache(100);
        assert_eq!(check_kind(&cache, "k1"), Some(false), "unknown: full check");
        let key = accepted(7, 1);
        let user = Arc::clone(&key.user);
        accept(&cache, "k1", key);

        tokio::time::advance(FRESH_FOR - Duration::from_millis(1)).await;
        let Lookup::Hit(hit) = cache.lookup(&digest("k1")) else {
            panic!("a fresh key is a hit");
        };
        assert_eq!(hit.key_id, 7);
        assert!(
            Arc::ptr_eq(&hit.user, &user),
            "the user is shared, not copied"
        );
        assert_eq!(check_kind(&cache, "k2"), Some(false));
    }

    #[tokio::test(start_paused = true)]
    async fn one_request_rechecks_a_stale_key_by_digest_while_the_others_use_it() {
        let cache = cache(100);
        accept(&cache, "k", accepted(1, 1));
        tokio::time::advance(FRESH_FOR).await;

        let Lookup::Check(recheck) = cache.lookup(&digest("k")) else {
            panic!("a stale key is re-checked");
        };
        assert!(recheck.is_recheck(), "a stale key needs no argon2");
        // Meanwhile everyone else is served from the entry…
        assert!(is_hit(&cache, "k"));
        tokio::time::advance(GRACE - Duration::from_millis(1)).await;
        assert!(is_hit(&cache, "k"));
        recheck.accepted(accepted(1, 1));
        // …and the re-check makes it fresh again.
        tokio::time::advance(FRESH_FOR - Duration::from_millis(1)).await;
        assert!(is_hit(&cache, "k"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_recheck_that_takes_past_the_grace_lets_others_check_too() {
        let cache = cache(100);
        accept(&cache, "k", accepted(1, 1));
        tokio::time::advance(FRESH_FOR).await;
        let _slow = cache.lookup(&digest("k"));
        tokio::time::advance(GRACE).await;
        assert_eq!(check_kind(&cache, "k"), Some(true));
    }

    #[tokio::test(start_paused = true)]
    async fn an_unanswered_recheck_leaves_the_key_for_the_next_recheck_by_digest() {
        let cache = cache(100);
        accept(&cache, "k", accepted(1, 1));
        tokio::time::advance(FRESH_FOR).await;
        let first = cache.lookup(&digest("k"));
        assert!(matches!(first, Lookup::Check(_)));
        drop(first); // the store failed, or the request was cancelled
        assert_eq!(check_kind(&cache, "k"), Some(true));
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_key_is_forgotten() {
        let cache = cache(100);
        accept(&cache, "k", accepted(1, 1));
        tokio::time::advance(FRESH_FOR).await;
        if let Lookup::Check(check) = cache.lookup(&digest("k")) {
            check.refused();
        }
        assert_eq!(check_kind(&cache, "k"), Some(false));
        assert!(cache.is_empty());
    }

    fn grant(cache: &CredentialCache, token: &str) -> Grant {
        match cache.lookup(&digest(token)) {
            Lookup::Hit(hit) => hit.grant,
            Lookup::Check(_) => panic!("{token} was expected to be a hit"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_grant_holds_until_a_use_is_due_a_change_or_the_key_expires() {
        let cache = cache(100);
        accept(&cache, "k", accepted(1, 1));
        let first = grant(&cache, "k");
        assert!(cache.holds(&first, Instant::now()));
        // Its use was reported when the key was accepted: the next is due a second later.
        tokio::time::advance(USE_REPORT_INTERVAL).await;
        assert!(!cache.holds(&first, Instant::now()), "a use is due");

        let second = grant(&cache, "k");
        assert!(cache.holds(&second, Instant::now()));
        // Any change to keys or users ends every grant: its key is asked again.
        cache.apply(&Change::ApiKey(ChangeKind::Updated, api_key(2, 2)));
        assert!(!cache.holds(&second, Instant::now()), "a change came");
        assert!(cache.holds(&grant(&cache, "k"), Instant::now()));

        // Never past the re-check: after `FRESH_FOR` the key is asked of the store.
        tokio::time::advance(FRESH_FOR - USE_REPORT_INTERVAL - Duration::from_millis(500)).await;
        let late = grant(&cache, "k");
        tokio::time::advance(Duration::from_millis(500)).await;
        assert!(
            !cache.holds(&late, Instant::now()),
            "the key needs a re-check"
        );

        // Nor past the key's expiry.
        let expiring = AcceptedKey {
            expires_at: Some(Timestamp::now().plus(Duration::from_millis(300))),
            ..accepted(3, 1)
        };
        accept(&cache, "e", expiring);
        let short = grant(&cache, "e");
        assert!(cache.holds(&short, Instant::now()));
        assert!(!cache.holds(&short, Instant::now() + Duration::from_millis(300)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_changed_key_or_user_is_rechecked_before_any_further_use() {
        let cache = cache(100);
        accept(&cache, "alice-1", accepted(1, 10));
        accept(&cache, "alice-2", accepted(2, 10));
        accept(&cache, "bob", accepted(3, 20));

        cache.apply(&Change::ApiKey(ChangeKind::Updated, api_key(1, 10)));
        assert_eq!(check_kind(&cache, "alice-1"), Some(true));
        // Not even served while that re-check runs.
        assert_eq!(check_kind(&cache, "alice-1"), Some(true));
        assert!(is_hit(&cache, "alice-2"));

        cache.apply(&Change::User(ChangeKind::Updated, user(10)));
        assert_eq!(check_kind(&cache, "alice-2"), Some(true));
        assert!(is_hit(&cache, "bob"));

        cache.apply(&Change::ApiKey(ChangeKind::Deleted, api_key(3, 20)));
        assert_eq!(
            check_kind(&cache, "bob"),
            Some(false),
            "a deleted key is dropped"
        );

        accept(&cache, "bob", accepted(3, 20));
        cache.apply(&Change::User(ChangeKind::Deleted, user(20)));
        assert_eq!(
            check_kind(&cache, "bob"),
            Some(false),
            "so are a deleted user's"
        );

        accept(&cache, "bob", accepted(3, 20));
        cache.invalidate_all();
        assert_eq!(check_kind(&cache, "bob"), Some(true), "missed changes");
    }

    #[tokio::test(start_paused = true)]
    async fn a_check_that_began_before_a_change_does_not_store_its_answer() {
        let cache = cache(100);
        let Lookup::Check(check) = cache.lookup(&digest("k")) else {
            panic!("unknown key");
        };
        // The key is deleted while the check reads the store.
        cache.apply(&Change::ApiKey(ChangeKind::Deleted, api_key(1, 1)));
        check.accepted(accepted(1, 1));
        assert_eq!(check_kind(&cache, "k"), Some(false));
    }

    #[tokio::test(start_paused = true)]
    async fn an_expired_key_is_not_served() {
        let cache = cache(100);
        let mut later = accepted(1, 1);
        later.expires_at = Some(Timestamp::now().plus(Duration::from_secs(3600)));
        accept(&cache, "later", later);
        assert!(is_hit(&cache, "later"));

        let mut expired = accepted(2, 1);
        expired.expires_at = Some(Timestamp::from_millis(Timestamp::now().as_millis() - 1));
        accept(&cache, "expired", expired);
        assert_eq!(check_kind(&cache, "expired"), Some(true));
    }

    #[tokio::test(start_paused = true)]
    async fn a_hit_reports_its_key_use_once_per_interval() {
        let cache = cache(100);
        accept(&cache, "k", accepted(1, 1));
        let report = |cache: &CredentialCache| match cache.lookup(&digest("k")) {
            Lookup::Hit(hit) => hit.report_use,
            Lookup::Check(_) => panic!("fresh"),
        };
        // Accepting reported the use already.
        assert!(!report(&cache));
        tokio::time::advance(USE_REPORT_INTERVAL).await;
        assert!(report(&cache));
        assert!(!report(&cache));
        assert!(!report(&cache));
    }

    #[tokio::test(start_paused = true)]
    async fn the_cache_is_bounded_and_drops_stale_keys_first() {
        let cache = cache(10);
        for i in 0..5 {
            accept(&cache, &format!("old{i}"), accepted(i, 1));
        }
        tokio::time::advance(FRESH_FOR).await;
        for i in 0..5 {
            accept(&cache, &format!("new{i}"), accepted(100 + i, 1));
        }
        assert_eq!(cache.len(), 10);
        accept(&cache, "one-more", accepted(200, 1));
        assert_eq!(cache.len(), 6, "the five stale keys made room");
        for i in 0..5 {
            assert!(is_hit(&cache, &format!("new{i}")));
        }
        assert!(is_hit(&cache, "one-more"));

        for i in 0..100 {
            accept(&cache, &format!("flood{i}"), accepted(1000 + i, 1));
            assert!(cache.len() <= 10);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn known_keys_outlive_an_unreachable_store_but_not_an_invalidation_or_expiry() {
        let cache = cache(100);
        accept(&cache, "known", accepted(1, 1));
        accept(&cache, "changed", accepted(2, 2));
        let mut expiring = accepted(3, 1);
        expiring.expires_at = Some(Timestamp::from_millis(Timestamp::now().as_millis() + 1));
        accept(&cache, "expiring", expiring);
        cache.apply(&Change::User(ChangeKind::Updated, user(2)));
        std::thread::sleep(Duration::from_millis(5));
        // Long past fresh_for and the grace: every lookup asks the store, which does
        // not answer.
        tokio::time::advance(FRESH_FOR * 10).await;
        let known = |token: &str| match cache.lookup(&digest(token)) {
            Lookup::Check(check) => check.known_while_store_unavailable().map(|hit| hit.key_id),
            Lookup::Hit(_) => panic!("{token} is stale"),
        };
        assert_eq!(known("known"), Some(1));
        assert_eq!(known("known"), Some(1), "and again: the entry stays");
        assert_eq!(known("changed"), None, "a change invalidated it");
        assert_eq!(known("expiring"), None, "it expired");
        assert_eq!(known("never-seen"), None);
        // Once the store answers again, the key is confirmed as usual.
        accept(&cache, "known", accepted(1, 1));
        assert!(is_hit(&cache, "known"));
    }
}
