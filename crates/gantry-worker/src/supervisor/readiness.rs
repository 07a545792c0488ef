//! Readiness: poll each backend's health path until it answers 200.
//!
//! The probe is a plain `GET` with a short timeout, without proxies (a worker's
//! `HTTP_PROXY` must not swallow loopback probes) and without keeping connections open
//! (llama.cpp serves from a small thread pool; an idle pooled connection would hold a slot).
//! Probes run every 250 ms for the first 10 s, so small models are seen ready promptly, then
//! every second, since large models take minutes to load.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use super::host::{GetError, Host};

/// One probe may take this long before it counts as "not ready yet".
pub(crate) const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// The HTTP client used for probes.
pub(crate) fn probe_client() -> reqwest::Result<reqwest::Client> {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(PROBE_TIMEOUT)
        .pool_max_idle_per_host(0)
        .build()
}

/// The URL to probe for a backend bound to `bind_host:port`. A backend bound to every
/// interface is probed on loopback.
pub(crate) fn backend_url(bind_host: IpAddr, port: u16, health_path: &str) -> String {
    let host = match bind_host {
        IpAddr::V4(v4) if v4.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(v6) if v6.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        other => other,
    };
    format!("http://{}{health_path}", SocketAddr::new(host, port))
}

fn probe_interval(elapsed: Duration) -> Duration {
    if elapsed < Duration::from_secs(10) {
        Duration::from_millis(250)
    } else {
        Duration::from_secs(1)
    }
}

/// Probes every URL until each has answered 200 once. Never returns otherwise: the caller
/// races it against the deadline and the processes' exit. `last_result` holds the outcome
/// of the latest failed probe, for the deadline's error message.
pub(crate) async fn wait_until_healthy(
    host: &dyn Host,
    urls: &[String],
    last_result: &Mutex<String>,
) {
    let started = Instant::now();
    let mut healthy = vec![false; urls.len()];
    loop {
        for (url, healthy) in urls.iter().zip(healthy.iter_mut()) {
            if *healthy {
                continue;
            }
            let outcome = match probe(host, url, PROBE_TIMEOUT).await {
                Ok(()) => {
                    *healthy = true;
                    continue;
                }
                Err(outcome) => outcome,
            };
            *last_result
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()) = outcome;
        }
        if healthy.iter().all(|h| *h) {
            return;
        }
        tokio::time::sleep(probe_interval(started.elapsed())).await;
    }
}

/// One `GET` of a health URL: `Ok` for 200 within `timeout`, else what happened.
pub(crate) async fn probe(host: &dyn Host, url: &str, timeout: Duration) -> Result<(), String> {
    match host.get(url, timeout).await {
        Ok(answer) if answer.status == reqwest::StatusCode::OK => Ok(()),
        Ok(answer) => Err(format!("GET {url} answered {}", answer.status)),
        Err(GetError::Refused) => Err(format!("GET {url}: connection refused")),
        Err(GetError::Timeout) => Err(format!("GET {url}: no answer within {timeout:?}")),
        Err(GetError::Other(e)) => Err(format!("GET {url}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_url_probes_loopback_for_wildcard_binds() {
        assert_eq!(
            backend_url("127.0.0.1".parse().unwrap(), 40000, "/health"),
            "http://127.0.0.1:40000/health"
        );
        assert_eq!(
            backend_url("0.0.0.0".parse().unwrap(), 40000, "/health"),
            "http://127.0.0.1:40000/health"
        );
        assert_eq!(
            backend_url("::".parse().unwrap(), 1, "/h"),
            "http://[::1]:1/h"
        );
        assert_eq!(
            backend_url("10.0.0.5".parse().unwrap(), 2, "/h"),
            "http://10.0.0.5:2/h"
        );
    }

    #[test]
    fn probes_slow_down_after_ten_seconds() {
        assert_eq!(
            probe_interval(Duration::from_secs(1)),
            Duration::from_millis(250)
        );
        assert_eq!(
            probe_interval(Duration::from_secs(30)),
            Duration::from_secs(1)
        );
    }
}
