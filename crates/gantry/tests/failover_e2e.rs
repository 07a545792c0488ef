//! Two servers sharing one PostgreSQL; a worker configured with both moves to the
//! second when the first dies, without restarting its instances.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{alive, chat, llama_pids_on, manual_model_body, tail, tiny_model, Cluster};
use gantry_testkit::{TestDatabase, TestEngine};
use nix::sys::signal::Signal;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_fails_over_to_the_next_server_without_restarting_instances() {
    let db = TestDatabase::new(TestEngine::Postgres).await;
    let secret = "a-shared-jwt-secret-for-both-servers-0123456789";
    let shared = [
        "--database-url",
        db.url.as_str(),
        "--jwt-secret",
        secret,
        "--heartbeat-interval",
        "300ms",
        "--server-timeout",
        "5s",
    ];
    let first = Cluster::start(&shared).await;
    let second = Cluster::start(&shared).await;
    let urls = format!("{},{}", first.base, second.base);
    let worker = first.worker_for(
        &urls,
        "w1",
        &["--simulate-gpus", "1x8GiB", "--heartbeat-interval", "300ms"],
    );
    let worker_id = first.worker_id("w1", &worker).await;

    let model = tiny_model(first.dir.path());
    let (_, instances) = first
        .create_model(manual_model_body("tiny", &model, 1))
        .await;
    // Placed through the second server while the worker follows the first: the change
    // reaches it through PostgreSQL notifications.
    second.place(instances[0], worker_id, &[0]).await;
    let running = first
        .wait_instance(instances[0], "running", Duration::from_secs(60))
        .await;
    let port = running["port"].as_u64().unwrap() as u16;
    let pids = llama_pids_on(port);
    assert_eq!(pids.len(), 1);

    // The first server dies.
    let mut first = first;
    first.server.signal(Signal::SIGKILL);
    let _ = first.server.child.take().map(|mut c| c.wait());

    // Heartbeats now reach the second server, which keeps the worker ready.
    let path = format!("/api/v1/workers/{worker_id}");
    let before = second.get(&path).await["last_heartbeat_at"].clone();
    second
        .wait_for(
            "heartbeats through the second server",
            &path,
            Duration::from_secs(20),
            |w| w["state"] == "ready" && w["last_heartbeat_at"] != before,
        )
        .await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !worker.log_text().contains("switched to another server") {
        assert!(
            tokio::time::Instant::now() < deadline,
            "worker never switched; log:\n{}",
            tail(&worker.log_text(), 30)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Stay a few heartbeat periods: still ready, and the same backend process serves.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(second.get(&path).await["state"], "ready");
    assert!(alive(pids[0]), "the backend was restarted by the failover");
    assert_eq!(llama_pids_on(port), pids);
    chat(&second.http, running["address"].as_str().unwrap()).await;
    let instance = second
        .get(&format!("/api/v1/model-instances/{}", instances[0]))
        .await;
    assert_eq!(instance["state"], "running");
    assert_eq!(instance["restart_count"], 0);
}
