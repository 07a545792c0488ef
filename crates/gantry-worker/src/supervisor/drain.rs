//! Draining: before a serving instance is stopped, its backend finishes the requests it is
//! answering.
//!
//! The gateways stop routing to an instance as soon as it leaves `running` (or leaves the
//! cluster); the worker learns the same change through its assignment stream, usually a
//! little later. What the backend has already accepted would be cut by SIGTERM (llama.cpp's
//! server exits at once), so the stop first polls the backend's own load endpoint
//! ([`LoadProbe`]) until every rank reports no request [`IDLE_IN_A_ROW`] times in a row,
//! for at most half the stop grace period. A backend that does not tell its load is
//! stopped at once.

use std::time::Duration;

use gantry_backends::LoadProbe;
use tokio::time::Instant;

/// How often the load is read while draining.
pub(crate) const DRAIN_POLL: Duration = Duration::from_millis(50);

/// Idle answers in a row that end the drain: a request a gateway sent just before it saw
/// the change may still be on its way when the first idle answer comes.
pub(crate) const IDLE_IN_A_ROW: u32 = 2;

/// How a drain ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Drained {
    /// No request in progress on any rank.
    Idle,
    /// The backend did not tell its load: why.
    Unknown(String),
    /// Requests were still in progress when the time was up: how many.
    Busy(u64),
}

/// Polls `urls` (one per rank) until each reports no request in progress, or `budget`
/// is spent.
pub(crate) async fn drain(
    client: &reqwest::Client,
    urls: &[String],
    probe: LoadProbe,
    budget: Duration,
) -> Drained {
    let deadline = Instant::now() + budget;
    let mut idle_in_a_row = 0;
    loop {
        let mut in_progress = 0;
        for url in urls {
            match load(client, url, probe).await {
                Ok(Some(n)) => in_progress += n,
                // Too busy to answer: llama.cpp serves from a few threads, which requests
                // (and clients' idle keep-alive connections) may all hold.
                Ok(None) => in_progress += 1,
                Err(reason) => return Drained::Unknown(reason),
            }
        }
        if in_progress == 0 {
            idle_in_a_row += 1;
            if idle_in_a_row >= IDLE_IN_A_ROW {
                return Drained::Idle;
            }
        } else {
            idle_in_a_row = 0;
        }
        if Instant::now() + DRAIN_POLL > deadline {
            return Drained::Busy(in_progress);
        }
        tokio::time::sleep(DRAIN_POLL).await;
    }
}

/// The requests in progress at `url`: `None` when it gave no answer in time, an error
/// when its answer does not tell.
async fn load(
    client: &reqwest::Client,
    url: &str,
    probe: LoadProbe,
) -> Result<Option<u64>, String> {
    let response = match client.get(url).send().await {
        Ok(response) => response,
        Err(e) if e.is_timeout() => return Ok(None),
        Err(e) => return Err(format!("GET {url}: {e}")),
    };
    if !response.status().is_success() {
        return Err(format!("GET {url} answered {}", response.status()));
    }
    let body = match response.text().await {
        Ok(body) => body,
        Err(e) if e.is_timeout() => return Ok(None),
        Err(e) => return Err(format!("GET {url}: {e}")),
    };
    match (probe.read)(&body) {
        Some(n) => Ok(Some(n)),
        None => Err(format!("GET {url}: the answer does not tell the load")),
    }
}
