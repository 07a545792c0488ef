//! Per-API-key limits: the routes a key may call, requests per minute and tokens per
//! minute, over a sliding window of 60 seconds.
//!
//! Each server keeps, for every key with a limit, the times of the requests it admitted
//! and the tokens they used in the last minute. Once a second a task writes this
//! server's counts to the store (`gateway_key_load`) and reads the other servers'
//! sums; a request is admitted while this server's count plus the others' is under the
//! limit. So a cluster enforces a key's limit as one, to within about a second's
//! traffic on the other servers. Refused requests answer 429 with `Retry-After`: when
//! the oldest admission this server holds leaves the window.
//!
//! Keys without limits are not in the table: their requests pay one atomic load.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use gantry_store::{Change, ChangeKind, KeyLoad, StoreError};
use gantry_types::{ApiKey, ApiKeyLimits, Timestamp};
use tokio::sync::broadcast::error::RecvError;
use tokio::time::Instant;

use crate::error::OpenAiError;
use crate::store::GatewayStore;
use crate::GatewayContext;

/// The window the limits count over.
pub const WINDOW: Duration = Duration::from_secs(60);
/// How often this server's counts are shared and the others' read.
pub const SHARE_INTERVAL: Duration = Duration::from_secs(1);
/// Other servers' counts older than this are not added (the server stopped).
const OTHERS_FRESH_FOR: Duration = Duration::from_secs(5);
/// How often the limited keys are re-read from the store (changes arrive sooner).
const RELOAD_INTERVAL: Duration = Duration::from_secs(30);

/// One limited key's limits and what this server admitted in the last minute.
#[derive(Debug)]
pub struct KeyWindow {
    api_key_id: i64,
    state: Mutex<WindowState>,
    /// The other servers' counts over their last minute, as last read.
    others_requests: AtomicU64,
    others_tokens: AtomicU64,
}

#[derive(Debug)]
struct WindowState {
    limits: ApiKeyLimits,
    admitted: VecDeque<Instant>,
    tokens: VecDeque<(Instant, u64)>,
    token_sum: u64,
}

impl WindowState {
    fn prune(&mut self, now: Instant) {
        while self
            .admitted
            .front()
            .is_some_and(|at| now.duration_since(*at) >= WINDOW)
        {
            self.admitted.pop_front();
        }
        while let Some((at, n)) = self.tokens.front().copied() {
            if now.duration_since(at) < WINDOW {
                break;
            }
            self.tokens.pop_front();
            self.token_sum = self.token_sum.saturating_sub(n);
        }
    }
}

impl KeyWindow {
    fn new(api_key_id: i64, limits: ApiKeyLimits) -> Self {
        Self {
            api_key_id,
            state: Mutex::new(WindowState {
                limits,
                admitted: VecDeque::new(),
                tokens: VecDeque::new(),
                token_sum: 0,
            }),
            others_requests: AtomicU64::new(0),
            others_tokens: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, WindowState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Admits one request for `route`, or says why not.
    fn admit(&self, route: &str) -> Result<(), OpenAiError> {
        let now = Instant::now();
        let mut state = self.lock();
        if !state.limits.allows(route) {
            let allowed = state
                .limits
                .allowed_routes
                .as_deref()
                .unwrap_or_default()
                .join(", ");
            return Err(OpenAiError::new(
                axum::http::StatusCode::FORBIDDEN,
                "permission_error",
                "model_not_allowed",
                format!("this API key may not call `{route}`; it may call: {allowed}"),
            )
            .with_param("model"));
        }
        state.prune(now);
        let retry_after = |oldest: Option<Instant>| {
            oldest.map_or(SHARE_INTERVAL, |at| {
                WINDOW.saturating_sub(now.duration_since(at))
            })
        };
        if let Some(rpm) = state.limits.requests_per_minute {
            let used = state.admitted.len() as u64 + self.others_requests.load(Ordering::Relaxed);
            if used >= u64::from(rpm) {
                return Err(OpenAiError::rate_limited(
                    format!(
                        "this API key is limited to {rpm} requests per minute, and {used} were made in the last 60 seconds"
                    ),
                    retry_after(state.admitted.front().copied()),
                ));
            }
        }
        if let Some(tpm) = state.limits.tokens_per_minute {
            let used = state.token_sum + self.others_tokens.load(Ordering::Relaxed);
            if used >= tpm {
                return Err(OpenAiError::rate_limited(
                    format!(
                        "this API key is limited to {tpm} tokens per minute, and {used} were used in the last 60 seconds"
                    ),
                    retry_after(state.tokens.front().map(|(at, _)| *at)),
                ));
            }
        }
        state.admitted.push_back(now);
        Ok(())
    }

    /// Counts the tokens a finished request used.
    pub fn add_tokens(&self, tokens: u64) {
        if tokens == 0 {
            return;
        }
        let mut state = self.lock();
        if state.limits.tokens_per_minute.is_none() {
            return;
        }
        state.tokens.push_back((Instant::now(), tokens));
        state.token_sum = state.token_sum.saturating_add(tokens);
    }

    /// This server's counts over the last minute.
    fn load(&self) -> KeyLoad {
        let mut state = self.lock();
        state.prune(Instant::now());
        KeyLoad {
            api_key_id: self.api_key_id,
            requests: state.admitted.len() as u64,
            tokens: state.token_sum,
        }
    }
}

/// The limited keys of this server.
#[derive(Debug, Default)]
pub struct KeyLimiter {
    keys: RwLock<HashMap<i64, Arc<KeyWindow>>>,
    any: AtomicBool,
}

impl KeyLimiter {
    /// Admits a request of `api_key_id` for `route`: `Ok(None)` for a key with no
    /// limit, `Ok(Some(window))` to count the request's tokens in when it ends, or
    /// the 403/429 to answer.
    pub fn admit(
        &self,
        api_key_id: Option<i64>,
        route: &str,
    ) -> Result<Option<Arc<KeyWindow>>, OpenAiError> {
        let Some(id) = api_key_id else {
            return Ok(None);
        };
        if !self.any.load(Ordering::Relaxed) {
            return Ok(None);
        }
        let window = {
            let keys = self.keys.read().unwrap_or_else(|e| e.into_inner());
            match keys.get(&id) {
                Some(window) => Arc::clone(window),
                None => return Ok(None),
            }
        };
        window.admit(route)?;
        Ok(Some(window))
    }

    /// Whether the key may call `route` (keys without a route limit may call any).
    pub fn allows(&self, api_key_id: Option<i64>, route: &str) -> bool {
        let Some(id) = api_key_id else {
            return true;
        };
        if !self.any.load(Ordering::Relaxed) {
            return true;
        }
        let keys = self.keys.read().unwrap_or_else(|e| e.into_inner());
        keys.get(&id)
            .is_none_or(|window| window.lock().limits.allows(route))
    }

    /// Takes a key's new limits (keeping what it admitted), or drops it.
    fn set(&self, key: &ApiKey, deleted: bool) {
        let mut keys = self.keys.write().unwrap_or_else(|e| e.into_inner());
        if deleted || !key.limits.is_limited() {
            keys.remove(&key.id);
        } else {
            match keys.get(&key.id) {
                Some(window) => window.lock().limits = key.limits.clone(),
                None => {
                    keys.insert(key.id, Arc::new(KeyWindow::new(key.id, key.limits.clone())));
                }
            }
        }
        self.any.store(!keys.is_empty(), Ordering::Relaxed);
    }

    /// Replaces the whole set with the store's limited keys.
    async fn reload(&self, store: &dyn GatewayStore) -> Result<(), StoreError> {
        let limited = store.limited_api_keys().await?;
        let ids: std::collections::HashSet<i64> = limited.iter().map(|k| k.id).collect();
        for key in &limited {
            self.set(key, false);
        }
        let mut keys = self.keys.write().unwrap_or_else(|e| e.into_inner());
        keys.retain(|id, _| ids.contains(id));
        self.any.store(!keys.is_empty(), Ordering::Relaxed);
        Ok(())
    }

    fn windows(&self) -> Vec<Arc<KeyWindow>> {
        let keys = self.keys.read().unwrap_or_else(|e| e.into_inner());
        keys.values().cloned().collect()
    }

    /// Writes this server's counts and reads the others'.
    async fn share(&self, store: &dyn GatewayStore, server_id: &str, published_any: &mut bool) {
        let windows = self.windows();
        let loads: Vec<KeyLoad> = windows
            .iter()
            .map(|w| w.load())
            .filter(|load| load.requests > 0 || load.tokens > 0)
            .collect();
        // Nothing to say and nothing said before: no write.
        if !loads.is_empty() || *published_any {
            if let Err(e) = store.publish_key_load(server_id, &loads).await {
                tracing::warn!(error = %e, "share API-key request counts with the other servers");
            }
            *published_any = !loads.is_empty();
        }
        if windows.is_empty() {
            return;
        }
        let since = Timestamp::now().minus(OTHERS_FRESH_FOR);
        match store.key_load_of_others(server_id, since).await {
            Ok(others) => {
                let by_key: HashMap<i64, KeyLoad> =
                    others.into_iter().map(|l| (l.api_key_id, l)).collect();
                for window in &windows {
                    let other = by_key.get(&window.api_key_id).copied().unwrap_or_default();
                    window
                        .others_requests
                        .store(other.requests, Ordering::Relaxed);
                    window.others_tokens.store(other.tokens, Ordering::Relaxed);
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "read the other servers' API-key request counts")
            }
        }
    }
}

/// Loads the limited keys, then keeps them current and shares counts until shutdown.
pub async fn start(context: &GatewayContext, limiter: Arc<KeyLimiter>) -> Result<(), StoreError> {
    let mut changes = context.store.subscribe();
    limiter.reload(&*context.store).await?;
    let store = Arc::clone(&context.store);
    let shutdown = context.shutdown.clone();
    let server_id = context.server_id.clone();
    context.tasks.spawn(async move {
        let mut share = tokio::time::interval(SHARE_INTERVAL);
        share.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut reload =
            tokio::time::interval_at(Instant::now() + RELOAD_INTERVAL, RELOAD_INTERVAL);
        reload.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut published_any = false;
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                change = changes.recv() => match change {
                    Ok(change) => {
                        if let Change::ApiKey(kind, key) = &*change {
                            limiter.set(key, *kind == ChangeKind::Deleted);
                        }
                    }
                    Err(RecvError::Lagged(_)) => {
                        if let Err(e) = limiter.reload(&*store).await {
                            tracing::error!(error = %e, "reload API-key limits");
                        }
                    }
                    Err(RecvError::Closed) => break,
                },
                _ = share.tick() => limiter.share(&*store, &server_id, &mut published_any).await,
                _ = reload.tick() => {
                    if let Err(e) = limiter.reload(&*store).await {
                        tracing::error!(error = %e, "reload API-key limits");
                    }
                }
            }
        }
        // Leaving: the others stop counting this server's admissions.
        if published_any {
            let _ = store.publish_key_load(&server_id, &[]).await;
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn key(id: i64, limits: ApiKeyLimits) -> ApiKey {
        ApiKey {
            id,
            name: "k".into(),
            user_id: 1,
            access_key: "a".into(),
            description: String::new(),
            expires_at: None,
            last_used_at: None,
            created_at: Timestamp::from_millis(0),
            limits,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_request_past_the_limit_gets_429_until_the_oldest_leaves_the_window() {
        let limiter = KeyLimiter::default();
        limiter.set(
            &key(
                1,
                ApiKeyLimits {
                    requests_per_minute: Some(60),
                    ..Default::default()
                },
            ),
            false,
        );
        for _ in 0..60 {
            limiter.admit(Some(1), "chat").unwrap().unwrap();
            tokio::time::advance(Duration::from_millis(100)).await;
        }
        let refused = limiter.admit(Some(1), "chat").unwrap_err();
        assert_eq!(refused.status, axum::http::StatusCode::TOO_MANY_REQUESTS);
        // The first admission was 6 s ago: it leaves the window in 54 s.
        assert_eq!(refused.retry_after, Some(Duration::from_secs(54)));
        // Keys without limits, and session tokens, pass untouched.
        assert!(limiter.admit(Some(2), "chat").unwrap().is_none());
        assert!(limiter.admit(None, "chat").unwrap().is_none());
        tokio::time::advance(Duration::from_secs(54)).await;
        limiter.admit(Some(1), "chat").unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn other_servers_counts_and_tokens_count_too() {
        let limiter = KeyLimiter::default();
        limiter.set(
            &key(
                1,
                ApiKeyLimits {
                    requests_per_minute: Some(10),
                    tokens_per_minute: Some(100),
                    ..Default::default()
                },
            ),
            false,
        );
        let window = limiter.admit(Some(1), "chat").unwrap().unwrap();
        window.others_requests.store(9, Ordering::Relaxed);
        assert_eq!(
            limiter.admit(Some(1), "chat").unwrap_err().status,
            axum::http::StatusCode::TOO_MANY_REQUESTS
        );
        window.others_requests.store(0, Ordering::Relaxed);
        window.add_tokens(100);
        let refused = limiter.admit(Some(1), "chat").unwrap_err();
        assert!(
            refused.message.contains("100 tokens per minute"),
            "{}",
            refused.message
        );
    }

    #[test]
    fn a_key_limited_to_some_routes_is_refused_others_with_403() {
        let limiter = KeyLimiter::default();
        limiter.set(
            &key(
                1,
                ApiKeyLimits {
                    allowed_routes: Some(vec!["chat".into()]),
                    ..Default::default()
                },
            ),
            false,
        );
        limiter.admit(Some(1), "chat").unwrap();
        assert!(limiter.allows(Some(1), "chat") && !limiter.allows(Some(1), "embed"));
        let refused = limiter.admit(Some(1), "embed").unwrap_err();
        assert_eq!(refused.status, axum::http::StatusCode::FORBIDDEN);
        assert!(refused.message.contains("may call: chat"));
        // Lifting the limit drops the key from the table.
        limiter.set(&key(1, ApiKeyLimits::default()), false);
        assert!(limiter.admit(Some(1), "embed").unwrap().is_none());
    }
}
