//! The data plane outlives the control plane: `gantry server` on a PostgreSQL server of
//! the test's own, a worker running the tiny model in real `llama-server`s, and gateway
//! traffic with an API key while the database is stopped for a while (20 s here,
//! `GANTRY_OUTAGE_SECONDS` to change it; `scripts/chaos.sh` runs 5 minutes) and started
//! again. Meanwhile the gateway answers every request with the API key it already knew
//! (long past the key cache's freshness), the worker keeps every backend running, the
//! management API answers 503 with `Retry-After`, and `/readyz` says the database is
//! unreachable. Afterwards everything resumes by itself: the API answers, the worker is
//! heard from, and no backend was restarted.
//!
//! The outage is longer than every timeout it could trip: the API-key cache's freshness
//! (2 s here), `server_timeout` (3 s, after which a silent worker is `unreachable` and its
//! instances rescheduled) and the leader's lease (3 s).

use crate::common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::{llama_pids_on, tail, tiny_model, Cluster};
use gantry_testkit::postgres::OwnPostgres;
use gantry_types::{InstanceState, ModelCreate, Timestamp, WorkerState};
use serde_json::json;

fn outage() -> Duration {
    Duration::from_secs(
        std::env::var("GANTRY_OUTAGE_SECONDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(20),
    )
}

/// Gateway traffic with one API key: a plain and a streaming client.
struct Load {
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicU64>,
    failures: Arc<Mutex<Vec<String>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(base: &str, key: &str) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let ok = Arc::new(AtomicU64::new(0));
        let failures = Arc::new(Mutex::new(Vec::new()));
        let tasks = [false, true]
            .into_iter()
            .map(|stream| {
                let (stop, ok, failures) = (stop.clone(), ok.clone(), failures.clone());
                let (url, key) = (format!("{base}/v1/chat/completions"), key.to_owned());
                tokio::spawn(async move {
                    let http = reqwest::Client::builder()
                        .timeout(Duration::from_secs(30))
                        .build()
                        .unwrap();
                    let began = Instant::now();
                    while !stop.load(Ordering::Relaxed) {
                        let body = json!({"model": "tiny", "max_tokens": 4, "stream": stream,
                            "messages": [{"role": "user", "content": "hi"}]});
                        let outcome =
                            match http.post(&url).bearer_auth(&key).json(&body).send().await {
                                Ok(response) => {
                                    let status = response.status();
                                    match response.text().await {
                                        Ok(text)
                                            if status.is_success()
                                                && (!stream
                                                    || text
                                                        .trim_end()
                                                        .ends_with("data: [DONE]")) =>
                                        {
                                            Ok(())
                                        }
                                        Ok(text) => Err(format!("{status}: {text}")),
                                        Err(e) => Err(format!("{status}: body: {e}")),
                                    }
                                }
                                Err(e) => Err(e.to_string()),
                            };
                        match outcome {
                            Ok(()) => {
                                ok.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(e) => failures.lock().unwrap().push(format!(
                                "(stream {stream}) {:.1} s into the load: {e}",
                                began.elapsed().as_secs_f64()
                            )),
                        }
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                })
            })
            .collect();
        Self {
            stop,
            ok,
            failures,
            tasks,
        }
    }

    fn answered(&self) -> u64 {
        self.ok.load(Ordering::Relaxed)
    }

    async fn finish(self) -> (u64, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks {
            task.await.unwrap();
        }
        let failures = self.failures.lock().unwrap().clone();
        (self.ok.load(Ordering::Relaxed), failures)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_gateway_and_the_backends_outlive_a_database_outage() {
    let mut postgres = tokio::task::block_in_place(OwnPostgres::start);
    let url = postgres.url();
    let mut args = common::ha_server_args(&url);
    args.extend(["--api-key-cache-ttl".to_owned(), "2s".to_owned()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let cluster = Cluster::start(&args).await;
    let worker = cluster.worker(
        "w1",
        &["--heartbeat-interval", "300ms", "--simulate-gpus", "1x8GiB"],
    );
    let worker_id = cluster.worker_id("w1", &worker).await;
    let path = tiny_model(cluster.dir.path());
    let create: ModelCreate =
        serde_json::from_value(common::tiny_model_body("tiny", &path, 2)).unwrap();
    let (model_id, _) = cluster.create_model(&create).await;
    let running = cluster
        .wait_instances(model_id, "running", Duration::from_secs(60), |i| {
            i.len() == 2 && i.iter().all(|i| i.state == InstanceState::Running)
        })
        .await;
    let backends: Vec<i32> = running
        .iter()
        .map(|i| {
            let pids = llama_pids_on(i.port.unwrap());
            assert_eq!(pids.len(), 1, "{pids:?}");
            pids[0]
        })
        .collect();
    let key = common::create_api_key(cluster.client(), "outage").await;

    let load = Load::start(&cluster.base, &key);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(load.answered() > 0, "the gateway answers before the outage");

    let length = outage();
    println!("outage: stopping PostgreSQL for {length:?}");
    tokio::task::block_in_place(|| postgres.stop());
    let stopped = Instant::now();
    let answered_before = load.answered();
    // Once the server has noticed, the management API and /readyz say why they cannot
    // answer; checked again near the end of the outage.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut checks = 0;
    loop {
        let response = cluster
            .http
            .get(format!("{}/api/v1/models", cluster.base))
            .bearer_auth(&key)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let retry_after = response.headers().get("retry-after").cloned();
        let body = response.text().await.unwrap();
        assert_eq!(status, 503, "management API during the outage: {body}");
        assert!(retry_after.is_some(), "503 with Retry-After: {body}");
        assert!(body.contains("unavailable"), "{body}");
        let response = cluster
            .http
            .get(format!("{}/readyz", cluster.base))
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let body = response.text().await.unwrap();
        assert_eq!(status, 503, "{body}");
        assert!(
            body.contains("database unreachable"),
            "/readyz says why: {body}"
        );
        checks += 1;
        let left = length.saturating_sub(stopped.elapsed());
        if left.is_zero() {
            break;
        }
        tokio::time::sleep(left.min(Duration::from_secs(15))).await;
    }
    let during = load.answered() - answered_before;
    println!(
        "outage: {during} gateway requests answered in the {:.0} s the database was down \
         ({checks} checks of the management API and /readyz: 503)",
        stopped.elapsed().as_secs_f64()
    );

    tokio::task::block_in_place(|| postgres.start_again());
    let (back, back_at) = (Instant::now(), Timestamp::now());
    // Everything resumes by itself: the API answers and records the worker's heartbeats.
    cluster
        .wait_worker(
            worker_id,
            "heard from since the database is back",
            Duration::from_secs(60),
            |w| w.state == WorkerState::Ready && w.last_heartbeat_at.is_some_and(|t| t > back_at),
        )
        .await;
    let resumed = back.elapsed();
    let after = cluster
        .wait_instances(model_id, "running", Duration::from_secs(30), |i| {
            i.len() == 2 && i.iter().all(|i| i.state == InstanceState::Running)
        })
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (answered, failures) = load.finish().await;
    println!(
        "outage: management API answering and the worker's heartbeats recorded {:.1} s after \
         the database was back; {answered} \
         requests answered in all, {} failed",
        resumed.as_secs_f64(),
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "{} requests failed, the first: {:#?}\nserver log:\n{}",
        failures.len(),
        &failures[..failures.len().min(5)],
        tail(&cluster.server.log_text(), 30)
    );
    assert!(
        during as f64 > length.as_secs_f64(),
        "the gateway kept answering during the outage: {during}"
    );
    // No backend was restarted: same instances, same processes, no restarts counted.
    assert_eq!(
        after.iter().map(|i| i.id).collect::<Vec<_>>(),
        running.iter().map(|i| i.id).collect::<Vec<_>>()
    );
    let now: Vec<i32> = after
        .iter()
        .map(|i| llama_pids_on(i.port.unwrap())[0])
        .collect();
    assert_eq!(now, backends, "the same backend processes");
    assert!(
        after.iter().all(|i| i.restart_count == 0),
        "no restarts: {after:?}"
    );
    assert!(
        !cluster.server.log_text().contains("worker went silent"),
        "no worker was judged silent for the database's outage:\n{}",
        tail(&cluster.server.log_text(), 30)
    );
}
