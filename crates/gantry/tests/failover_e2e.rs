//! Two servers sharing one PostgreSQL; a worker configured with both moves to the
//! second when the first dies, without restarting its instances.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{alive, chat, llama_pids_on, manual_model_create, tiny_model, Cluster};
use gantry_testkit::{TestDatabase, TestEngine};
use gantry_types::{InstanceState, WorkerState};
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
        .create_model(&manual_model_create("tiny", &model, 1))
        .await;
    // Placed through the second server while the worker follows the first: the change
    // reaches it through PostgreSQL notifications.
    second.place(instances[0], worker_id, &[0]).await;
    let running = first
        .wait_instance(
            instances[0],
            InstanceState::Running,
            Duration::from_secs(60),
        )
        .await;
    let port = running.port.unwrap();
    let pids = llama_pids_on(port);
    assert_eq!(pids.len(), 1);

    // The first server dies.
    let mut first = first;
    first.server.signal(Signal::SIGKILL);
    let _ = first.server.child.take().map(|mut c| c.wait());

    // Heartbeats now reach the second server, which keeps the worker ready.
    let second = &second;
    let admin = second.client();
    let another_heartbeat = |within: Duration| async move {
        let seen = admin.get_worker(worker_id).await.unwrap().last_heartbeat_at;
        second
            .wait_worker(
                worker_id,
                "ready, with a heartbeat through the second server",
                within,
                |w| w.state == WorkerState::Ready && w.last_heartbeat_at != seen,
            )
            .await
    };
    another_heartbeat(Duration::from_secs(20)).await;
    worker
        .wait_for_log("switched to another server", Duration::from_secs(20))
        .await;
    // Stay a few heartbeat periods (five more heartbeats reach the second server): still
    // ready, and the same backend process serves.
    for _ in 0..5 {
        another_heartbeat(Duration::from_secs(10)).await;
    }
    assert!(alive(pids[0]), "the backend was restarted by the failover");
    assert_eq!(llama_pids_on(port), pids);
    chat(&second.http, running.address.as_deref().unwrap()).await;
    let instance = admin.get_instance(instances[0]).await.unwrap();
    assert_eq!(instance.state, InstanceState::Running);
    assert_eq!(instance.restart_count, 0);
}
