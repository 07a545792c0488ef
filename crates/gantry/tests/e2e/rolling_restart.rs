//! A rolling restart under load: three `gantry server` processes on one PostgreSQL, a
//! worker running the tiny model in a real `llama-server`, and chat completions (plain and
//! streamed) spread over the three gateways while each server in turn is stopped with
//! SIGTERM and started again. No request fails.
//!
//! The load generator stands in for the load balancer in front of a real cluster (a test
//! double for one, as nginx, HAProxy or a Kubernetes service would be): it checks each
//! server's `/readyz` every 100 ms and sends each request to the next ready server in
//! turn; when a server refuses the connection (it is down, so nothing was sent), the
//! request goes to the next one, as a load balancer's retry of a failed connect does. A
//! stopping server answers `/readyz` with 503 for a second before it stops accepting,
//! which is what lets the balancer move away first. Every other outcome counts: an error
//! status, a connection broken after the request went out, or a stream without its end,
//! is a failed request.

use crate::common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::{instances_of, tail, tiny_model, tiny_model_create, Cluster};
use gantry_testkit::{TestDatabase, TestEngine};
use gantry_types::InstanceState;
use serde_json::json;

/// Where the sockets and the backends' threads stood, appended to
/// `/tmp/rolling-restart-logs/sockets.txt`: taken when a request times out or a server
/// takes long to stop, to find where a stuck request waits.
fn snapshot_sockets(why: &str) {
    let dir = std::path::Path::new("/tmp/rolling-restart-logs");
    let _ = std::fs::create_dir_all(dir);
    let mut text = format!("=== {why}\n");
    for (program, args) in [
        ("ss", &["-tnpioe"][..]),
        ("ps", &["-eLo", "pid,tid,stat,wchan:32,comm,args"][..]),
    ] {
        match std::process::Command::new(program).args(args).output() {
            Ok(out) => text.push_str(&String::from_utf8_lossy(&out.stdout)),
            Err(e) => text.push_str(&format!("{program}: {e}\n")),
        }
    }
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("sockets.txt"))
        .unwrap();
    std::io::Write::write_all(&mut file, text.as_bytes()).unwrap();
}

/// What the load generator saw.
#[derive(Default)]
struct Tally {
    ok: AtomicU64,
    /// Connections refused by a server that was down, sent on to the next server.
    refused: AtomicU64,
    failures: Mutex<Vec<String>>,
}

/// One chat completion through the gateway at `base`; `Err(None)` when the connection
/// was refused (nothing sent), `Err(Some(why))` for a failed request.
async fn one_request(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    stream: bool,
) -> Result<(), Option<String>> {
    let response = http
        .post(format!("{base}/v1/chat/completions"))
        .bearer_auth(token)
        .json(&json!({
            "model": "tiny",
            "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 4,
            "stream": stream,
        }))
        .timeout(Duration::from_secs(30))
        .send()
        .await;
    let response = match response {
        Ok(response) => response,
        Err(e) if e.is_connect() => return Err(None),
        Err(e) => {
            if e.is_timeout() {
                snapshot_sockets(&format!("request to {base} (stream {stream}) timed out"));
            }
            return Err(Some(format!("{base} (stream {stream}): {e:?}")));
        }
    };
    let status = response.status();
    let body = response.text().await.map_err(|e| {
        if e.is_timeout() {
            snapshot_sockets(&format!("body from {base} (stream {stream}) timed out"));
        }
        Some(format!("{base} (stream {stream}): body: {e:?}"))
    })?;
    if !status.is_success() {
        return Err(Some(format!("{base} (stream {stream}): {status}: {body}")));
    }
    let complete = if stream {
        body.trim_end().ends_with("data: [DONE]")
    } else {
        serde_json::from_str::<serde_json::Value>(&body).is_ok_and(|v| v["choices"].is_array())
    };
    if complete {
        Ok(())
    } else {
        Err(Some(format!(
            "{base} (stream {stream}): incomplete: {body}"
        )))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn gateway_requests_keep_succeeding_through_a_rolling_restart() {
    let db = TestDatabase::new(TestEngine::Postgres).await;
    let shared = common::ha_server_args(&db.url);
    let shared: Vec<&str> = shared.iter().map(String::as_str).collect();
    let mut servers = Vec::new();
    for _ in 0..3 {
        servers.push(Cluster::start(&shared).await);
    }
    let urls: Vec<String> = servers.iter().map(|s| s.base.clone()).collect();
    let worker = servers[0].worker_for(
        &urls.join(","),
        "w1",
        &["--simulate-gpus", "1x8GiB", "--heartbeat-interval", "300ms"],
    );
    servers[0].worker_id("w1", &worker).await;
    let model = tiny_model(servers[0].dir.path());
    let created = servers[0]
        .client()
        .create_model(&tiny_model_create("tiny", &model, 1))
        .await
        .unwrap();
    instances_of(
        servers[0].client(),
        created.id,
        "running",
        Duration::from_secs(60),
        &[&servers[0].server, &worker],
        |i| i.len() == 1 && i[0].state == InstanceState::Running,
    )
    .await;
    let token = servers[0].client().token().unwrap();

    // The balancer's health checks: /readyz of each server every 100 ms.
    let tally = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));
    let ready: Arc<Vec<AtomicBool>> =
        Arc::new(urls.iter().map(|_| AtomicBool::new(true)).collect());
    let mut checks = Vec::new();
    for (index, url) in urls.iter().enumerate() {
        let (ready, stop, url) = (Arc::clone(&ready), Arc::clone(&stop), url.clone());
        checks.push(tokio::spawn(async move {
            let http = reqwest::Client::new();
            while !stop.load(Ordering::Relaxed) {
                let up = http
                    .get(format!("{url}/readyz"))
                    .timeout(Duration::from_millis(500))
                    .send()
                    .await
                    .is_ok_and(|r| r.status().is_success());
                ready[index].store(up, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }));
    }

    // Load: four clients, each sending to the next ready server in turn.
    let per_server: Arc<Vec<AtomicU64>> =
        Arc::new(urls.iter().map(|_| AtomicU64::new(0)).collect());
    let mut load = Vec::new();
    for client in 0..4usize {
        let (tally, stop, urls, token) = (
            Arc::clone(&tally),
            Arc::clone(&stop),
            urls.clone(),
            token.clone(),
        );
        let per_server = Arc::clone(&per_server);
        let ready = Arc::clone(&ready);
        load.push(tokio::spawn(async move {
            let http = reqwest::Client::new();
            let mut next = client;
            let mut sent = 0u64;
            let began = std::time::Instant::now();
            while !stop.load(Ordering::Relaxed) {
                let stream = sent % 2 == 1;
                sent += 1;
                // Like a load balancer: a refused connection goes to the next server.
                let mut outcome = Err(None);
                for _ in 0..urls.len() {
                    // The next server the health checks call ready (any, if none is).
                    let index = (0..urls.len())
                        .map(|k| (next + k) % urls.len())
                        .find(|i| ready[*i].load(Ordering::Relaxed))
                        .unwrap_or(next % urls.len());
                    next = index + 1;
                    outcome = one_request(&http, &urls[index], &token, stream).await;
                    match &outcome {
                        Err(None) => {
                            tally.refused.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(()) => {
                            per_server[index].fetch_add(1, Ordering::Relaxed);
                            break;
                        }
                        Err(Some(_)) => break,
                    }
                }
                match outcome {
                    Ok(()) => {
                        tally.ok.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(why) => tally.failures.lock().unwrap().push(format!(
                        "sent {:?} after the load began: {}",
                        began.elapsed(),
                        why.unwrap_or_else(|| "every server refused".into())
                    )),
                }
            }
        }));
    }

    let began = std::time::Instant::now();
    tokio::time::sleep(Duration::from_secs(2)).await;
    for (i, server) in servers.iter_mut().enumerate() {
        let before = tally.ok.load(Ordering::Relaxed);
        let asked = began.elapsed();
        let base = server.base.clone();
        let slow_stop = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(15)).await;
            snapshot_sockets(&format!("{base} still stopping 15 s after SIGTERM"));
        });
        server.restart(Duration::from_secs(20)).await;
        slow_stop.abort();
        println!(
            "server {i} ({}) restarted ({asked:?} to {:?} after the load began); {} requests \
             succeeded meanwhile",
            server.base,
            began.elapsed(),
            tally.ok.load(Ordering::Relaxed) - before
        );
        // Let it take its share before the next one goes.
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for task in load.into_iter().chain(checks) {
        task.await.unwrap();
    }

    let ok = tally.ok.load(Ordering::Relaxed);
    let failures = tally.failures.lock().unwrap().clone();
    let shares: Vec<u64> = per_server
        .iter()
        .map(|n| n.load(Ordering::Relaxed))
        .collect();
    println!(
        "rolling restart of 3 servers under load: {ok} requests succeeded ({shares:?} per \
         server), {} failed, {} refused connections sent on to the next server",
        failures.len(),
        tally.refused.load(Ordering::Relaxed)
    );
    if !failures.is_empty() {
        for (i, server) in servers.iter().enumerate() {
            let keep = std::path::Path::new("/tmp/rolling-restart-logs").join(i.to_string());
            std::fs::create_dir_all(&keep).unwrap();
            for entry in std::fs::read_dir(server.dir.path()).unwrap().flatten() {
                if entry.path().extension().is_some_and(|e| e == "log") {
                    let _ = std::fs::copy(entry.path(), keep.join(entry.file_name()));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} requests failed, the first: {:?}\nlogs:\n{}",
        failures.len(),
        &failures[..failures.len().min(5)],
        servers
            .iter()
            .map(|s| tail(&s.server.log_text(), 15))
            .collect::<Vec<_>>()
            .join("\n---\n")
    );
    assert!(ok > 50, "the load made progress: {ok} requests");
    assert!(
        shares.iter().all(|n| *n > 0),
        "every server served: {shares:?}"
    );
}
