//! Three servers sharing one PostgreSQL; a worker configured with only the first learns
//! the others from the registry and moves between them without restarting its instances:
//! within two heartbeats when its server is killed, and within one heartbeat timeout more
//! when its server hangs (SIGSTOP). The backend keeps its PID throughout.

use std::time::Duration;

use crate::common::{alive, chat, llama_pids_on, manual_model_create, tail, tiny_model, Cluster};
use gantry_testkit::{TestDatabase, TestEngine};
use gantry_types::{InstanceState, Timestamp, WorkerState};
use nix::sys::signal::Signal;

/// The worker's heartbeat interval in this test.
const HEARTBEAT: Duration = Duration::from_secs(1);
/// How long one server has to answer a heartbeat (the worker's floor, above the interval).
const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(2);

/// The server the worker last switched to, from its log line
/// `switched to another server from=… to=…`.
fn switched_to(log: &str) -> Option<String> {
    let line = log
        .lines()
        .rev()
        .find(|l| l.contains("switched to another server"))?;
    let to = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("to="))?;
    Some(to.trim_matches('"').to_owned())
}

/// Milliseconds from `since` to the worker's first heartbeat after it, as `observer`
/// (a live server) reads it from the shared database, polled every 20 ms so that the
/// first heartbeat is the one seen.
async fn first_heartbeat_after(observer: &Cluster, worker_id: i64, since: Timestamp) -> i64 {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let worker = observer.client().get_worker(worker_id).await.unwrap();
        if let Some(at) = worker.last_heartbeat_at.filter(|at| *at > since) {
            assert_eq!(worker.state, WorkerState::Ready, "{worker:?}");
            return at.as_millis() - since.as_millis();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no heartbeat within 30 s; server log:\n{}",
            tail(&observer.server.log_text(), 30)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_moves_to_another_server_within_heartbeats_without_restarting_instances() {
    let db = TestDatabase::new(TestEngine::Postgres).await;
    let secret = "a-shared-jwt-secret-for-every-server-0123456789";
    let shared = [
        "--database-url",
        db.url.as_str(),
        "--jwt-secret",
        secret,
        "--heartbeat-interval",
        "300ms",
        "--server-timeout",
        "3s",
    ];
    let mut servers = Vec::new();
    for _ in 0..3 {
        servers.push(Cluster::start(&shared).await);
    }
    // Configured with the first server only: the others come from the registry.
    let worker = servers[0].worker_for(
        &servers[0].base,
        "w1",
        &["--simulate-gpus", "1x8GiB", "--heartbeat-interval", "1s"],
    );
    let worker_id = servers[0].worker_id("w1", &worker).await;
    servers[0]
        .wait_worker(worker_id, "heartbeating", Duration::from_secs(20), |w| {
            w.state == WorkerState::Ready
        })
        .await;
    let all_known = || {
        let log = worker.log_text();
        let line = log
            .lines()
            .rev()
            .find(|l| l.contains("servers of the cluster"))
            .unwrap_or_default()
            .to_owned();
        servers.iter().all(|s| line.contains(&s.base))
    };
    gantry_testkit::eventually(
        "the worker to learn every server from the registry",
        Duration::from_secs(20),
        Duration::from_millis(100),
        || async { Ok::<_, std::convert::Infallible>(all_known()) },
        |known| *known,
        || tail(&worker.log_text(), 20),
    )
    .await;

    let model = tiny_model(servers[0].dir.path());
    let (_, instances) = servers[0]
        .create_model(&manual_model_create("tiny", &model, 1))
        .await;
    // Placed through the second server while the worker follows the first: the change
    // reaches it through PostgreSQL notifications.
    servers[1].place(instances[0], worker_id, &[0]).await;
    let running = servers[0]
        .wait_instance(
            instances[0],
            InstanceState::Running,
            Duration::from_secs(60),
        )
        .await;
    let port = running.port.unwrap();
    let pids = llama_pids_on(port);
    assert_eq!(pids.len(), 1);

    // 1. The worker's server is killed: the next heartbeat goes to another server.
    let mut first = servers.remove(0);
    let killed = Timestamp::now();
    first.server.signal(Signal::SIGKILL);
    let _ = first.server.child.take().map(|mut c| c.wait());
    let gap = first_heartbeat_after(&servers[0], worker_id, killed).await;
    println!(
        "server killed: the worker's next heartbeat reached another server {gap} ms later \
         (heartbeat interval {} ms)",
        HEARTBEAT.as_millis()
    );
    assert!(
        gap <= 2 * i64::try_from(HEARTBEAT.as_millis()).unwrap(),
        "moved {gap} ms after the kill, more than two heartbeats; worker log:\n{}",
        tail(&worker.log_text(), 20)
    );
    // The server wrote the heartbeat before it answered; the worker logs the switch when
    // the answer arrives, a moment after the test may have seen the heartbeat.
    let mut now_on = None;
    for _ in 0..100 {
        now_on = switched_to(&worker.log_text());
        if now_on.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let now_on =
        now_on.unwrap_or_else(|| panic!("no switch logged:\n{}", tail(&worker.log_text(), 20)));
    let current = servers
        .iter()
        .position(|s| s.base == now_on)
        .unwrap_or_else(|| panic!("switched to {now_on}, not a live server"));

    // 2. The server it moved to hangs: left after one heartbeat timeout.
    let paused = servers.remove(current);
    let remaining = &servers[0];
    let stopped = Timestamp::now();
    paused.server.signal(Signal::SIGSTOP);
    let gap = first_heartbeat_after(remaining, worker_id, stopped).await;
    paused.server.signal(Signal::SIGCONT);
    println!(
        "server stopped: the worker's next heartbeat reached the last server {gap} ms later \
         (heartbeat timeout {} ms)",
        HEARTBEAT_TIMEOUT.as_millis()
    );
    assert!(
        gap <= i64::try_from((HEARTBEAT_TIMEOUT + 2 * HEARTBEAT).as_millis()).unwrap(),
        "moved {gap} ms after the stop; worker log:\n{}",
        tail(&worker.log_text(), 20)
    );

    // Five more heartbeats reach the remaining server: still ready, and the same backend
    // process serves.
    let admin = remaining.client();
    for _ in 0..5 {
        let seen = admin.get_worker(worker_id).await.unwrap().last_heartbeat_at;
        remaining
            .wait_worker(
                worker_id,
                "ready, with another heartbeat",
                Duration::from_secs(10),
                |w| w.state == WorkerState::Ready && w.last_heartbeat_at != seen,
            )
            .await;
    }
    assert!(alive(pids[0]), "the backend was restarted by the failover");
    assert_eq!(llama_pids_on(port), pids);
    chat(&remaining.http, running.address.as_deref().unwrap()).await;
    let instance = admin.get_instance(instances[0]).await.unwrap();
    assert_eq!(instance.state, InstanceState::Running);
    assert_eq!(instance.restart_count, 0);
    drop(paused);
}
