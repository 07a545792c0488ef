//! Usage accounting off the request path: a finished request adds its tokens to an
//! in-memory sum per (minute, user, API key, model, target) — one short lock of its
//! thread's own shard, no IO — and a
//! background task moves the sums to the store every [`FLUSH_INTERVAL`] in one
//! transaction. At shutdown the task flushes once more before the store closes.
//!
//! The pending sums are bounded by [`MAX_PENDING_GROUPS`] distinct groups (over every
//! shard); beyond that
//! new groups are dropped and counted (a flood of distinct callers while the database
//! is down must not exhaust memory). A failed flush keeps its sums for the next one.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gantry_store::{usage_minute_of, UsageIncrement, UsageSums};
use gantry_types::Timestamp;
use serde::Deserialize;

use crate::shard::Sharded;
use crate::store::GatewayStore;
use crate::GatewayContext;

/// How often pending usage is written to the store.
pub const FLUSH_INTERVAL: Duration = Duration::from_secs(1);

/// Most distinct (minute, user, key, model) groups held between flushes.
pub const MAX_PENDING_GROUPS: usize = 100_000;

/// The `usage` object of an OpenAI-style response. Missing fields count as 0.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub struct TokenUsage {
    #[serde(default)]
    pub prompt_tokens: u64,
    #[serde(default)]
    pub completion_tokens: u64,
    #[serde(default)]
    pub total_tokens: u64,
}

impl TokenUsage {
    /// `total_tokens`, or prompt + completion when the backend left it out.
    pub fn total(&self) -> u64 {
        if self.total_tokens > 0 {
            self.total_tokens
        } else {
            self.prompt_tokens.saturating_add(self.completion_tokens)
        }
    }
}

/// Who made a request: the usage is booked to them.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Caller {
    pub user_id: i64,
    /// `None` for a session token.
    pub api_key_id: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct GroupKey {
    minute_start: i64,
    caller: Caller,
    model: Arc<str>,
    target: Arc<str>,
}

/// One shard's sums: per (minute, caller), the (model, target) pairs it called, so a
/// request finds its group by a key of plain numbers and compares names, and the names
/// are shared (`Arc`) only when a group is new.
#[derive(Debug, Default)]
struct Pending {
    groups: HashMap<(i64, Caller), Vec<Named>>,
}

#[derive(Debug)]
struct Named {
    model: Arc<str>,
    target: Arc<str>,
    sums: UsageSums,
}

/// Usage summed since the last flush, one part per shard (`shard.rs`): a finished
/// request locks its own thread's part, which no other CPU touches until the flush.
#[derive(Debug, Default)]
pub struct UsageAggregator {
    pending: Sharded<Mutex<Pending>>,
    /// Groups held over every shard (changed only when a group is added or taken).
    groups: AtomicUsize,
    dropped: AtomicU64,
}

impl UsageAggregator {
    /// Books one request for `model` (the name the client sent) answered by `target`
    /// (and its tokens, when the backend reported them).
    pub fn record(
        &self,
        caller: &Caller,
        model: &Arc<str>,
        target: &Arc<str>,
        usage: Option<TokenUsage>,
    ) {
        let usage = usage.unwrap_or_default();
        let sums = UsageSums {
            requests: 1,
            prompt_tokens: usage.prompt_tokens,
            completion_tokens: usage.completion_tokens,
            total_tokens: usage.total(),
        };
        let minute_start = usage_minute_of(Timestamp::now()).as_millis();
        self.add(minute_start, caller, model, target, &sums);
    }

    fn add(
        &self,
        minute_start: i64,
        caller: &Caller,
        model: &Arc<str>,
        target: &Arc<str>,
        sums: &UsageSums,
    ) {
        let mut pending = self
            .pending
            .local()
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let full = self.groups.load(Ordering::Relaxed) >= MAX_PENDING_GROUPS;
        let group = (minute_start, caller.clone());
        let named = match pending.groups.get_mut(&group) {
            Some(named) => named,
            None if full => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                return;
            }
            None => pending.groups.entry(group).or_default(),
        };
        let same = |a: &Arc<str>, b: &Arc<str>| Arc::ptr_eq(a, b) || a == b;
        match named
            .iter_mut()
            .find(|n| same(&n.model, model) && same(&n.target, target))
        {
            Some(existing) => existing.sums.add(sums),
            None if full => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
            None => {
                named.push(Named {
                    model: Arc::clone(model),
                    target: Arc::clone(target),
                    sums: *sums,
                });
                self.groups.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Requests whose usage could not be held (too many distinct groups).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Everything pending, each group once (the shards' sums of a group added up: one
    /// write may not name a row twice).
    fn take(&self) -> Vec<(GroupKey, UsageSums)> {
        let mut all: HashMap<GroupKey, UsageSums> = HashMap::new();
        for shard in self.pending.iter() {
            let taken = std::mem::take(&mut *shard.lock().unwrap_or_else(|e| e.into_inner()));
            for ((minute_start, caller), named) in taken.groups {
                self.groups.fetch_sub(named.len(), Ordering::Relaxed);
                for Named {
                    model,
                    target,
                    sums,
                } in named
                {
                    let key = GroupKey {
                        minute_start,
                        caller: caller.clone(),
                        model,
                        target,
                    };
                    all.entry(key).or_default().add(&sums);
                }
            }
        }
        all.into_iter().collect()
    }

    /// Writes what is pending; on failure keeps it for the next try.
    pub async fn flush(&self, store: &dyn GatewayStore) {
        let batch = self.take();
        if batch.is_empty() {
            return;
        }
        let increments: Vec<UsageIncrement> = batch
            .iter()
            .map(|(key, sums)| UsageIncrement {
                minute_start: Timestamp::from_millis(key.minute_start),
                user_id: key.caller.user_id,
                api_key_id: key.caller.api_key_id,
                model: key.model.to_string(),
                target: key.target.to_string(),
                sums: *sums,
            })
            .collect();
        if let Err(e) = store.add_usage(&increments).await {
            tracing::error!(error = %e, groups = batch.len(), "write gateway usage; keeping it for the next flush");
            for (key, sums) in batch {
                self.add(
                    key.minute_start,
                    &key.caller,
                    &key.model,
                    &key.target,
                    &sums,
                );
            }
        }
    }
}

/// Flushes usage every `interval` until shutdown, then once more.
pub fn spawn_flusher(context: &GatewayContext, usage: Arc<UsageAggregator>, interval: Duration) {
    let store = Arc::clone(&context.store);
    let shutdown = context.shutdown.clone();
    context.tasks.spawn(async move {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                _ = tick.tick() => usage.flush(&*store).await,
            }
        }
        usage.flush(&*store).await;
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_sums_requests_of_one_caller_and_model_into_one_group() {
        let usage = UsageAggregator::default();
        let caller = Caller {
            user_id: 1,
            api_key_id: Some(2),
        };
        let model: Arc<str> = Arc::from("tiny");
        usage.record(
            &caller,
            &model,
            &model,
            Some(TokenUsage {
                prompt_tokens: 5,
                completion_tokens: 2,
                total_tokens: 0,
            }),
        );
        usage.record(&caller, &model, &model, None);
        let batch = usage.take();
        // Both requests fall in one minute unless the test straddles a minute
        // boundary, in which case they are two groups with the same totals.
        let mut total = UsageSums::default();
        for (_, sums) in &batch {
            total.add(sums);
        }
        assert_eq!(
            total,
            UsageSums {
                requests: 2,
                prompt_tokens: 5,
                completion_tokens: 2,
                total_tokens: 7
            }
        );
        assert!(usage.take().is_empty());
    }

    #[test]
    fn requests_booked_on_many_threads_come_out_as_one_group_per_name() {
        let usage = UsageAggregator::default();
        let caller = Caller {
            user_id: 1,
            api_key_id: None,
        };
        let model: Arc<str> = Arc::from("tiny");
        let target: Arc<str> = Arc::from("tiny");
        // The same name in another allocation is the same group.
        let other_model: Arc<str> = Arc::from("tiny");
        std::thread::scope(|scope| {
            for _ in 0..6 {
                scope.spawn(|| {
                    for _ in 0..100 {
                        usage.record(&caller, &model, &target, None);
                        usage.record(&caller, &other_model, &other_model, None);
                    }
                });
            }
        });
        let mut requests = 0;
        let mut minutes = std::collections::HashSet::new();
        for (key, sums) in usage.take() {
            assert_eq!(&*key.model, "tiny");
            // One group per minute: the shards' sums of a group were added up.
            assert!(
                minutes.insert(key.minute_start),
                "group {key:?} came out twice"
            );
            requests += sums.requests;
        }
        assert_eq!(requests, 1200);
        assert_eq!(usage.dropped(), 0);
    }
}
