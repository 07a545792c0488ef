//! `stream-load`: many concurrent streaming chat completions through one gateway, and the
//! server's memory meanwhile (`BENCH_STREAMS` in `scripts/bench-gateway.sh`).
//!
//! Opens `--streams N` streaming requests at once (one connection each), reads every
//! stream to its end and counts those that failed or ended without `data: [DONE]`.
//! Samples the RSS of `--server-pid` every 50 ms: before, at its peak, right after the
//! last stream ended and `--settle-s` seconds later. `--rounds R` repeats that, so that
//! memory kept by the allocator (a plateau) can be told from a leak (growth every round).
//! Exits non-zero when any stream failed.
//!
//! Usage: `stream-load --url http://127.0.0.1:8080 --key gantry_… --model bench
//! --streams 1000 --server-pid PID [--settle-s 10] [--rounds 1]`

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use futures_util::StreamExt;

fn argument(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

/// Resident set size of a process in bytes (`VmRSS` of `/proc/PID/status`).
fn rss(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("read /proc/{pid}/status"))?;
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .context("no VmRSS line")?;
    Ok(kib * 1024)
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// One streaming request read to its end: `Ok(true)` when it ended with `[DONE]`.
async fn one_stream(
    http: reqwest::Client,
    url: String,
    key: String,
    body: serde_json::Value,
) -> anyhow::Result<bool> {
    let response = http
        .post(url)
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .context("send")?;
    let status = response.status();
    if !status.is_success() {
        bail!(
            "answered {status}: {}",
            response.text().await.unwrap_or_default()
        );
    }
    let mut stream = response.bytes_stream();
    let mut tail = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.context("read the stream")?;
        tail.extend_from_slice(&chunk);
        if tail.len() > 64 {
            tail.drain(..tail.len() - 64);
        }
    }
    Ok(String::from_utf8_lossy(&tail)
        .trim_end()
        .ends_with("data: [DONE]"))
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: stream-load --url URL --key KEY --model MODEL --streams N --server-pid PID [--settle-s S] [--rounds R]";
    let base = argument(&args, "--url").context(usage)?;
    let key = argument(&args, "--key").context(usage)?;
    let model = argument(&args, "--model").context(usage)?;
    let streams: usize = argument(&args, "--streams").context(usage)?.parse()?;
    let pid: u32 = argument(&args, "--server-pid").context(usage)?.parse()?;
    let settle = Duration::from_secs(
        argument(&args, "--settle-s")
            .map(|s| s.parse())
            .transpose()?
            .unwrap_or(10),
    );
    let rounds: usize = argument(&args, "--rounds")
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(1);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let first = rss(pid)?;
    for round in 1..=rounds {
        println!("round {round} of {rounds}:");
        runtime.block_on(one_round(&base, &key, &model, streams, pid, settle))?;
    }
    if rounds > 1 {
        let last = rss(pid)?;
        println!(
            "server RSS after {rounds} rounds: {:.1} MiB (+{:.1} over before the first)",
            mib(last),
            mib(last.saturating_sub(first))
        );
    }
    Ok(())
}

/// One round: `streams` streams at once, read to their ends, then `settle`.
async fn one_round(
    base: &str,
    key: &str,
    model: &str,
    streams: usize,
    pid: u32,
    settle: Duration,
) -> anyhow::Result<()> {
    let before = rss(pid)?;
    let peak = Arc::new(AtomicU64::new(before));
    let sampling = {
        let peak = Arc::clone(&peak);
        tokio::spawn(async move {
            loop {
                if let Ok(now) = rss(pid) {
                    peak.fetch_max(now, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    // One connection per stream, as many clients would hold.
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(120))
        .build()?;
    let url = format!("{}/v1/chat/completions", base.trim_end_matches('/'));
    let body = serde_json::json!({
        "model": model,
        "messages": [{"role": "user", "content": "Say something short."}],
        "max_tokens": 16,
        "stream": true,
    });
    let started = Instant::now();
    let tasks: Vec<_> = (0..streams)
        .map(|_| {
            tokio::spawn(one_stream(
                http.clone(),
                url.clone(),
                key.to_owned(),
                body.clone(),
            ))
        })
        .collect();
    let (mut complete, mut incomplete, mut failed) = (0usize, 0usize, Vec::new());
    for task in tasks {
        match task.await? {
            Ok(true) => complete += 1,
            Ok(false) => incomplete += 1,
            Err(e) => failed.push(format!("{e:#}")),
        }
    }
    let took = started.elapsed();
    let after = rss(pid)?;
    drop(http);
    tokio::time::sleep(settle).await;
    sampling.abort();
    let settled = rss(pid)?;
    let peak = peak.load(Ordering::Relaxed);
    println!(
        "streams {streams}: {complete} complete, {incomplete} without [DONE], {} failed, in {:.2} s",
        failed.len(),
        took.as_secs_f64()
    );
    println!(
        "server RSS: before {:.1} MiB, peak {:.1} MiB (+{:.1}), right after {:.1} MiB, {} s later {:.1} MiB (+{:.1} over before)",
        mib(before),
        mib(peak),
        mib(peak.saturating_sub(before)),
        mib(after),
        settle.as_secs(),
        mib(settled),
        mib(settled.saturating_sub(before))
    );
    for why in failed.iter().take(5) {
        println!("  failed: {why}");
    }
    if !failed.is_empty() || incomplete > 0 {
        bail!("{} streams failed, {incomplete} ended early", failed.len());
    }
    Ok(())
}
