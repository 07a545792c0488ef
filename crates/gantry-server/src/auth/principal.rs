//! Who is calling: the request's credential resolved to a user (via session token or
//! API key) or a worker (via its credential).
//!
//! API keys are checked with argon2 once, then remembered by the SHA-256 of the whole
//! key for [`API_KEY_CACHE_TTL`], so the gateway does not pay for argon2 per request.
//! Deleting a key or changing its user empties the entry at once on this server (the
//! store's change feed); other servers forget it within the TTL.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use axum::extract::FromRequestParts;
use axum::http::header::{AUTHORIZATION, COOKIE};
use axum::http::request::Parts;
use axum::http::StatusCode;
use gantry_store::{Change, StoreError};
use gantry_types::{Role, Timestamp, User};
use tokio::time::Instant;

use super::secrets::{digest, parse_api_key, WORKER_CREDENTIAL_PREFIX};
use crate::error::ApiError;
use crate::state::AppState;

/// Name of the session cookie set by `POST /auth/login`.
pub const SESSION_COOKIE: &str = "gantry_session";

/// How long a verified API key is trusted without another database read.
pub const API_KEY_CACHE_TTL: Duration = Duration::from_secs(60);

/// How often `last_used_at` is written for a busy key.
const TOUCH_INTERVAL: Duration = Duration::from_secs(60);

/// The authenticated caller.
#[derive(Debug, Clone)]
pub enum Principal {
    /// A person, through a session token (`api_key_id` is `None`) or an API key.
    User { user: User, api_key_id: Option<i64> },
    /// A worker agent, through the credential it received at registration.
    Worker { worker_id: i64, worker_name: String },
}

impl Principal {
    /// The user if they are an admin; 403 otherwise.
    pub fn require_admin(&self) -> Result<&User, ApiError> {
        match self {
            Principal::User { user, .. } if user.role == Role::Admin => Ok(user),
            Principal::User { .. } => Err(ApiError::forbidden("this action needs the admin role")),
            Principal::Worker { .. } => Err(ApiError::forbidden(
                "worker credentials can only call worker endpoints",
            )),
        }
    }

    /// Any person; 403 for workers.
    pub fn require_user(&self) -> Result<&User, ApiError> {
        match self {
            Principal::User { user, .. } => Ok(user),
            Principal::Worker { .. } => Err(ApiError::forbidden(
                "worker credentials can only call worker endpoints",
            )),
        }
    }

    /// A short description for log lines.
    pub fn describe(&self) -> String {
        match self {
            Principal::User {
                user,
                api_key_id: Some(key),
            } => format!("user {} (api key {key})", user.username),
            Principal::User { user, .. } => format!("user {}", user.username),
            Principal::Worker { worker_name, .. } => format!("worker {worker_name}"),
        }
    }
}

/// Extracts the caller and refuses users who must change their password first.
#[derive(Debug, Clone)]
pub struct Auth(pub Principal);

/// Extracts the caller, also when they still must change their password (for
/// `change-password`, `logout` and `me`).
#[derive(Debug, Clone)]
pub struct AuthAllowingPasswordChange(pub Principal);

impl FromRequestParts<AppState> for Auth {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let principal = authenticate(parts, state).await?;
        if let Principal::User {
            user,
            api_key_id: None,
        } = &principal
        {
            if user.require_password_change {
                return Err(ApiError::new(
                    StatusCode::FORBIDDEN,
                    "password_change_required",
                    "change your password first: POST /auth/change-password",
                ));
            }
        }
        Ok(Self(principal))
    }
}

impl FromRequestParts<AppState> for AuthAllowingPasswordChange {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        authenticate(parts, state).await.map(Self)
    }
}

/// The bearer token, or the session cookie.
pub fn credential_of(parts: &Parts) -> Option<String> {
    if let Some(value) = parts.headers.get(AUTHORIZATION) {
        let value = value.to_str().ok()?;
        return gantry_types::auth::bearer_token(value).map(str::to_owned);
    }
    for header in parts.headers.get_all(COOKIE) {
        let Ok(header) = header.to_str() else {
            continue;
        };
        for pair in header.split(';') {
            if let Some((name, value)) = pair.trim().split_once('=') {
                if name == SESSION_COOKIE && !value.is_empty() {
                    return Some(value.to_string());
                }
            }
        }
    }
    None
}

async fn authenticate(parts: &Parts, state: &AppState) -> Result<Principal, ApiError> {
    let token = credential_of(parts).ok_or_else(|| {
        ApiError::unauthorized(
            "missing credentials: send Authorization: Bearer <API key or session token from POST /auth/login>",
        )
    })?;
    authenticate_token(state, &token).await
}

/// Resolves a raw credential to a principal.
pub async fn authenticate_token(state: &AppState, token: &str) -> Result<Principal, ApiError> {
    if let Some((_, secret)) = parse_api_key(token) {
        return authenticate_api_key(state, token, secret).await;
    }
    if token.starts_with(WORKER_CREDENTIAL_PREFIX) {
        return match state.store.worker_by_credential(&digest(token)).await {
            Ok(worker) => Ok(Principal::Worker {
                worker_id: worker.id,
                worker_name: worker.name,
            }),
            Err(StoreError::NotFound { .. }) => Err(ApiError::unauthorized(
                "unknown worker credential: the worker was deleted; register it again",
            )),
            Err(e) => Err(e.into()),
        };
    }
    let claims = state.jwt.verify(token).map_err(|e| {
        ApiError::unauthorized(format!("invalid session token ({e}); log in again"))
    })?;
    let record = match state.store.user_record(claims.sub).await {
        Ok(record) => record,
        Err(StoreError::NotFound { .. }) => {
            return Err(ApiError::unauthorized(
                "the user of this session no longer exists",
            ))
        }
        Err(e) => return Err(e.into()),
    };
    if record.session_version != claims.sv {
        return Err(ApiError::unauthorized(
            "this session has ended (logout or password change); log in again",
        ));
    }
    Ok(Principal::User {
        user: record.user,
        api_key_id: None,
    })
}

async fn authenticate_api_key(
    state: &AppState,
    token: &str,
    secret: &str,
) -> Result<Principal, ApiError> {
    let key_digest = digest(token);
    let now = Instant::now();
    let stale = match state.api_keys.lookup(&key_digest, now, state) {
        Lookup::Fresh(principal) => return Ok(principal),
        Lookup::Stale => true,
        Lookup::Miss => false,
    };
    let invalid = || ApiError::unauthorized("invalid API key");
    let record = match state.store.api_key_by_digest(&key_digest).await {
        Ok(record) => record,
        Err(StoreError::NotFound { .. }) => return Err(invalid()),
        Err(e) => return Err(e.into()),
    };
    // The row was found by the SHA-256 of the whole key, secret included, so argon2
    // adds nothing to a key this server already verified: a stale entry is re-checked
    // against the database only, and busy keys do not pay argon2 every TTL.
    if !stale && !super::password::verify(secret.to_string(), record.secret_hash.clone()).await {
        return Err(invalid());
    }
    if let Some(expires_at) = record.key.expires_at {
        if expires_at <= Timestamp::now() {
            return Err(ApiError::unauthorized(format!(
                "API key {} expired at {expires_at}; create a new one",
                record.key.name
            )));
        }
    }
    let user = state.store.get_user(record.key.user_id).await?;
    let principal = Principal::User {
        user: user.clone(),
        api_key_id: Some(record.key.id),
    };
    state.api_keys.insert(
        key_digest,
        CachedKey {
            key_id: record.key.id,
            user,
            expires_at: record.key.expires_at,
            verified_at: now,
            touched_at: None,
        },
    );
    touch_later(state, record.key.id);
    Ok(principal)
}

fn touch_later(state: &AppState, key_id: i64) {
    let store = state.store.clone();
    state.tasks.spawn(async move {
        if let Err(e) = store.touch_api_key(key_id, Timestamp::now()).await {
            tracing::warn!(api_key_id = key_id, error = %e, "could not record API key use");
        }
    });
}

/// What the cache knows of a key.
enum Lookup {
    /// Verified within the TTL.
    Fresh(Principal),
    /// Verified before, longer ago than the TTL: re-check the database, not argon2.
    Stale,
    /// Never verified here (or expired, or evicted).
    Miss,
}

#[derive(Debug, Clone)]
struct CachedKey {
    key_id: i64,
    user: User,
    expires_at: Option<Timestamp>,
    verified_at: Instant,
    touched_at: Option<Instant>,
}

/// Verified API keys by the digest of the whole key.
#[derive(Debug, Default)]
pub struct ApiKeyCache {
    entries: Mutex<HashMap<String, CachedKey>>,
}

impl ApiKeyCache {
    fn lookup(&self, key_digest: &str, now: Instant, state: &AppState) -> Lookup {
        let Ok(mut entries) = self.entries.lock() else {
            return Lookup::Miss;
        };
        let Some(entry) = entries.get_mut(key_digest) else {
            return Lookup::Miss;
        };
        if entry.expires_at.is_some_and(|at| at <= Timestamp::now()) {
            entries.remove(key_digest);
            return Lookup::Miss;
        }
        if now.duration_since(entry.verified_at) > API_KEY_CACHE_TTL {
            return Lookup::Stale;
        }
        let touch = entry
            .touched_at
            .is_none_or(|at| now.duration_since(at) > TOUCH_INTERVAL);
        if touch {
            entry.touched_at = Some(now);
            touch_later(state, entry.key_id);
        }
        Lookup::Fresh(Principal::User {
            user: entry.user.clone(),
            api_key_id: Some(entry.key_id),
        })
    }

    fn insert(&self, key_digest: String, entry: CachedKey) {
        if let Ok(mut entries) = self.entries.lock() {
            // Bound the cache: a flood of distinct valid keys is unusual; forget all
            // rather than grow without limit.
            if entries.len() >= 100_000 {
                entries.clear();
            }
            entries.insert(key_digest, entry);
        }
    }

    /// Forgets every entry.
    pub fn apply_all_stale(&self) {
        if let Ok(mut entries) = self.entries.lock() {
            entries.clear();
        }
    }

    /// Forgets entries made stale by a committed change.
    pub fn apply(&self, change: &Change) {
        let Ok(mut entries) = self.entries.lock() else {
            return;
        };
        match change {
            Change::ApiKey(_, key) => entries.retain(|_, e| e.key_id != key.id),
            Change::User(_, user) => entries.retain(|_, e| e.user.id != user.id),
            _ => {}
        }
    }
}
