//! Health after ready: every running instance is probed on its health path every
//! `interval`; `failure_threshold` failed probes in a row (no 200 within `timeout`) of any of
//! its processes make it unhealthy, and its task restarts it (the whole group for data
//! parallelism, as a crash would).
//!
//! Probes run on a fixed-rate tick, so a probe that times out does not push the next one
//! back: a backend that stops answering is found within `interval × threshold + timeout`.

use std::time::Duration;

use tokio::time::MissedTickBehavior;

use super::host::Host;

/// How running instances are probed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthPolicy {
    /// Time between probes (default 5 s).
    pub interval: Duration,
    /// How long one probe may take (default 2 s).
    pub timeout: Duration,
    /// Failed probes in a row that make an instance unhealthy (default 3).
    pub failure_threshold: u32,
}

impl Default for HealthPolicy {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(5),
            timeout: Duration::from_secs(2),
            failure_threshold: 3,
        }
    }
}

/// Probes `urls` (one per process) until one of them fails `failure_threshold` times in a
/// row; returns why. Never returns while they stay healthy: the caller races it against
/// the processes' exit and cancellation.
pub(crate) async fn watch(host: &dyn Host, urls: &[String], policy: HealthPolicy) -> String {
    let threshold = policy.failure_threshold.max(1);
    let mut failures = vec![0u32; urls.len()];
    let mut tick = tokio::time::interval_at(
        tokio::time::Instant::now() + policy.interval,
        policy.interval,
    );
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let probes = urls
            .iter()
            .map(|url| super::readiness::probe(host, url, policy.timeout));
        let outcomes = futures_util::future::join_all(probes).await;
        for ((url, failed), outcome) in urls.iter().zip(failures.iter_mut()).zip(outcomes) {
            match outcome {
                Ok(()) => *failed = 0,
                Err(reason) => {
                    *failed += 1;
                    tracing::debug!(%url, failures = *failed, %reason, "health probe failed");
                    if *failed >= threshold {
                        return format!(
                            "health probe failed {threshold} times in a row (every {:?}): {reason}",
                            policy.interval
                        );
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::supervisor::host::system::SystemHost;

    fn system_host() -> SystemHost {
        SystemHost::new(crate::supervisor::readiness::probe_client().unwrap())
    }

    /// A listener that accepts connections and never answers: a frozen backend.
    async fn silent_listener() -> (tokio::net::TcpListener, String) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/health", listener.local_addr().unwrap());
        (listener, url)
    }

    #[tokio::test]
    async fn a_backend_that_stops_answering_is_found_within_interval_times_threshold_plus_timeout()
    {
        let (_listener, url) = silent_listener().await;
        let host = system_host();
        let policy = HealthPolicy {
            interval: Duration::from_millis(200),
            timeout: Duration::from_millis(100),
            failure_threshold: 3,
        };
        let started = tokio::time::Instant::now();
        let reason = tokio::time::timeout(Duration::from_secs(10), watch(&host, &[url], policy))
            .await
            .expect("found unhealthy");
        let took = started.elapsed();
        assert!(reason.contains("3 times in a row"), "{reason}");
        assert!(reason.contains("no answer within"), "{reason}");
        assert!(
            took >= Duration::from_millis(600) && took < Duration::from_secs(5),
            "took {took:?}"
        );
    }

    #[tokio::test]
    async fn one_good_answer_resets_the_count() {
        // An HTTP server that fails every other probe: never three in a row.
        use std::sync::atomic::{AtomicU32, Ordering};
        use std::sync::Arc;
        let count = Arc::new(AtomicU32::new(0));
        let app = axum::Router::new().route(
            "/health",
            axum::routing::get({
                let count = count.clone();
                move || {
                    let n = count.fetch_add(1, Ordering::SeqCst);
                    async move {
                        if n.is_multiple_of(2) {
                            axum::http::StatusCode::SERVICE_UNAVAILABLE
                        } else {
                            axum::http::StatusCode::OK
                        }
                    }
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/health", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        let host = system_host();
        let policy = HealthPolicy {
            interval: Duration::from_millis(50),
            timeout: Duration::from_millis(500),
            failure_threshold: 2,
        };
        let outcome =
            tokio::time::timeout(Duration::from_secs(1), watch(&host, &[url], policy)).await;
        assert!(
            outcome.is_err(),
            "alternating answers never reach the threshold: {outcome:?}"
        );
        assert!(count.load(Ordering::SeqCst) >= 10);
    }
}
