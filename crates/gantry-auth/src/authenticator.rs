//! The [`Authenticator`]: turns a raw token into a [`Principal`], for the management API
//! (through its axum extractors) and the gateway alike.
//!
//! - API keys `gantry_<access>_<secret>`: through the one [`CredentialCache`]; a key is
//!   verified with argon2 once, then found by digest. Each use is recorded for the
//!   last-used batcher; nothing is written on the request path.
//! - Worker credentials `gantryw_…`: found by digest in the store, then kept in a
//!   [`WorkerCredentialCache`] until the worker changes (or a minute has passed).
//! - Server credentials `gantrys_…`: checked against the cluster's secret, no store read.
//! - Anything else is a session token: signature and expiry, then the user's session
//!   version in the store (a logout or password change ends older sessions at once).
//!
//! [`Authenticator::spawn`] starts the two tasks it needs, owned by the caller's task
//! tracker: one follows the store's change feed to invalidate cached keys, one flushes
//! the last-used times.

use std::sync::Arc;

use gantry_store::{Change, Store, StoreError};
use gantry_types::Timestamp;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::cache::{AcceptedKey, CacheConfig, Check, CredentialCache, Grant, Hit, Lookup};
use crate::error::AuthError;
use crate::jwt::{JwtKeys, SERVER_CREDENTIAL_PREFIX};
use crate::last_used::{LastUsedBatcher, LAST_USED_FLUSH_INTERVAL};
use crate::password;
use crate::principal::Principal;
use crate::secrets::{parse_api_key, SecretDigest, WORKER_CREDENTIAL_PREFIX};
use crate::worker_cache::{KnownWorker, WorkerCredentialCache};

/// How the authenticator caches and batches.
#[derive(Debug, Clone)]
pub struct AuthConfig {
    pub api_keys: CacheConfig,
    /// How often API-key last-used times are written.
    pub last_used_flush_interval: std::time::Duration,
}

impl Default for AuthConfig {
    fn default() -> Self {
        Self {
            api_keys: CacheConfig::default(),
            last_used_flush_interval: LAST_USED_FLUSH_INTERVAL,
        }
    }
}

/// Resolves credentials to principals. One per server, shared by both planes.
#[derive(Debug)]
pub struct Authenticator {
    store: Store,
    jwt: JwtKeys,
    api_keys: CredentialCache,
    workers: WorkerCredentialCache,
    last_used: LastUsedBatcher,
    last_used_flush_interval: std::time::Duration,
}

/// The user of an API key the cache holds.
fn key_user(hit: Hit) -> Principal {
    Principal::User {
        user: hit.user,
        api_key_id: Some(hit.key_id),
    }
}

/// The database cannot be reached (`error` says how): the key as this server last
/// verified it, if it did; else the error.
fn known_while_unreachable(check: Check<'_>, error: StoreError) -> Result<Principal, AuthError> {
    match check.known_while_store_unavailable() {
        Some(hit) => {
            tracing::debug!(api_key_id = hit.key_id, %error, "database unreachable; using the API key as last verified");
            Ok(key_user(hit))
        }
        None => Err(error.into()),
    }
}

impl Authenticator {
    pub fn new(store: Store, jwt: JwtKeys, config: AuthConfig) -> Self {
        Self {
            store,
            jwt,
            api_keys: CredentialCache::new(config.api_keys),
            workers: WorkerCredentialCache::default(),
            last_used: LastUsedBatcher::default(),
            last_used_flush_interval: config.last_used_flush_interval,
        }
    }

    /// The keys session tokens are signed and verified with.
    pub fn jwt(&self) -> &JwtKeys {
        &self.jwt
    }

    /// The cache of accepted API keys.
    pub fn api_keys(&self) -> &CredentialCache {
        &self.api_keys
    }

    /// The API-key uses not yet written to the store.
    pub fn last_used(&self) -> &LastUsedBatcher {
        &self.last_used
    }

    /// Resolves a raw credential (bearer token or session cookie value).
    pub async fn authenticate(&self, token: &str) -> Result<Principal, AuthError> {
        if let Some((_, secret)) = parse_api_key(token) {
            return Ok(self.authenticate_api_key(token, secret).await?.0);
        }
        if token.starts_with(WORKER_CREDENTIAL_PREFIX) {
            return self.authenticate_worker(token).await;
        }
        if token.starts_with(SERVER_CREDENTIAL_PREFIX) {
            return self
                .jwt
                .verify_server_credential(token)
                .map(|server_id| Principal::Server { server_id })
                .ok_or(AuthError::InvalidServerCredential);
        }
        let claims = self
            .jwt
            .verify(token)
            .map_err(AuthError::InvalidSessionToken)?;
        // A session is checked against the user's row every time (a logout ends it at
        // once), which cannot be done while the database is down: say so at once.
        if let Some(why) = self.store.unreachable() {
            return Err(StoreError::Unreachable(why).into());
        }
        let record = match self.store.user_record(claims.sub).await {
            Ok(record) => record,
            Err(StoreError::NotFound { .. }) => return Err(AuthError::SessionUserGone),
            Err(e) => return Err(e.into()),
        };
        if record.session_version != claims.sv {
            return Err(AuthError::SessionEnded);
        }
        Ok(Principal::User {
            user: Arc::new(record.user),
            api_key_id: None,
        })
    }

    async fn authenticate_worker(&self, token: &str) -> Result<Principal, AuthError> {
        let digest = SecretDigest::of(token);
        if let Some(known) = self.workers.get(&digest) {
            return Ok(Principal::Worker {
                worker_id: known.worker_id,
                worker_name: known.worker_name.to_string(),
            });
        }
        let began = self.workers.begin_lookup();
        match self.store.worker_by_credential(&digest.to_hex()).await {
            Ok(worker) => {
                let known = KnownWorker {
                    worker_id: worker.id,
                    worker_name: Arc::from(worker.name.as_str()),
                };
                self.workers.store(began, digest, known);
                Ok(Principal::Worker {
                    worker_id: worker.id,
                    worker_name: worker.name,
                })
            }
            Err(StoreError::NotFound { .. }) => Err(AuthError::UnknownWorkerCredential),
            Err(e) => Err(e.into()),
        }
    }

    /// Like [`Authenticator::authenticate`]; an API key served from the cache comes
    /// with the [`Grant`] to take it again, for the same token, without asking while
    /// [`Authenticator::grant_holds`] (the gateway keeps one per connection).
    pub async fn authenticate_granted(
        &self,
        token: &str,
    ) -> Result<(Principal, Option<Grant>), AuthError> {
        match parse_api_key(token) {
            Some((_, secret)) => self.authenticate_api_key(token, secret).await,
            None => Ok((self.authenticate(token).await?, None)),
        }
    }

    /// Whether a grant from [`Authenticator::authenticate_granted`] still holds at
    /// `now`.
    pub fn grant_holds(&self, grant: &Grant, now: Instant) -> bool {
        self.api_keys.holds(grant, now)
    }

    async fn authenticate_api_key(
        &self,
        token: &str,
        secret: &str,
    ) -> Result<(Principal, Option<Grant>), AuthError> {
        let digest = SecretDigest::of(token);
        let check = match self.api_keys.lookup(&digest) {
            Lookup::Hit(hit) => {
                if hit.report_use {
                    self.last_used.record(hit.key_id, Timestamp::now());
                }
                let grant = hit.grant;
                return Ok((key_user(hit), Some(grant)));
            }
            Lookup::Check(check) => check,
        };
        // The database is known to be down: a key verified before is used as it was,
        // without waiting for the store to time out.
        if let Some(why) = self.store.unreachable() {
            return Ok((
                known_while_unreachable(check, StoreError::Unreachable(why))?,
                None,
            ));
        }
        // A store error drops `check` unanswered: a cached key stays for the next
        // re-check (by digest), nothing is forgotten because the database hiccupped;
        // while the database cannot be reached at all, known keys keep working.
        let record = match self.store.api_key_by_digest(&digest.to_hex()).await {
            Ok(record) => record,
            Err(StoreError::NotFound { .. }) => {
                check.refused();
                return Err(AuthError::InvalidApiKey);
            }
            Err(e) if e.is_unavailable() => return Ok((known_while_unreachable(check, e)?, None)),
            Err(e) => return Err(e.into()),
        };
        // The row was found by the SHA-256 of the whole key, secret included, so argon2
        // adds nothing to a key this server already verified: a re-check reads the
        // store only, and busy keys do not pay argon2 again.
        if !check.is_recheck()
            && !password::verify(secret.to_string(), record.secret_hash.clone()).await
        {
            check.refused();
            return Err(AuthError::InvalidApiKey);
        }
        if let Some(expires_at) = record.key.expires_at {
            if expires_at <= Timestamp::now() {
                check.refused();
                return Err(AuthError::ApiKeyExpired {
                    name: record.key.name,
                    expires_at,
                });
            }
        }
        let user = Arc::new(self.store.get_user(record.key.user_id).await?);
        check.accepted(AcceptedKey {
            key_id: record.key.id,
            user: Arc::clone(&user),
            expires_at: record.key.expires_at,
        });
        self.last_used.record(record.key.id, Timestamp::now());
        let principal = Principal::User {
            user,
            api_key_id: Some(record.key.id),
        };
        // The next request's lookup finds the key and grants it.
        Ok((principal, None))
    }

    /// Applies a committed change to the cache.
    pub fn apply(&self, change: &Change) {
        self.api_keys.apply(change);
        self.workers.apply(change);
    }

    /// Writes the pending API-key last-used times.
    pub async fn flush_last_used(&self) {
        self.last_used.flush(&self.store).await;
    }

    /// Keeps the cache in step with every change the store publishes — inline, so a key
    /// this server deletes is refused by the very next request — and starts the task that
    /// flushes last-used times (once more after `shutdown`), owned by `tasks`.
    pub fn spawn(self: &Arc<Self>, shutdown: &CancellationToken, tasks: &TaskTracker) {
        // Weak: the store lives inside the authenticator, and the listener inside the store.
        let this = Arc::downgrade(self);
        self.store.on_change(Arc::new(move |change| {
            if let Some(this) = this.upgrade() {
                this.apply(change.as_ref());
            }
        }));

        let this = Arc::clone(self);
        let cancelled = shutdown.clone();
        tasks.spawn(async move {
            let period = this.last_used_flush_interval;
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    () = cancelled.cancelled() => break,
                    _ = tick.tick() => this.flush_last_used().await,
                }
            }
            this.flush_last_used().await;
        });
    }
}
