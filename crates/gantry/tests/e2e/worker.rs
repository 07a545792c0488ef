//! The worker end to end, as real processes: `gantry server`, `gantry worker`, a real
//! `llama-server` serving the tiny model. Placement is by hand here (the scheduler
//! places on its own in the scheduler tests). The API is called through the typed client;
//! the backends' own OpenAI API ([`common::chat`]) with raw HTTP.

use crate::common;

use std::time::Duration;

use crate::common::{
    alive, chat, descendants, llama_pids_on, manual_model_create, tiny_model, Cluster,
};
use gantry_types::{InstanceState, LogQuery, WorkerQuery, WorkerState};
use nix::sys::signal::Signal;

const STARTUP: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_runs_restarts_logs_and_stops_a_real_llama_server() {
    let cluster = Cluster::start(&[]).await;
    let mut worker = cluster.worker("w1", &["--simulate-gpus", "2x8GiB"]);
    let worker_id = cluster.worker_id("w1", &worker).await;
    let admin = cluster.client();

    // Simulated GPUs are reported as such.
    let info = admin.get_worker(worker_id).await.unwrap();
    assert_eq!(info.status.gpus.len(), 2);
    assert!(info.status.gpus[0].simulated);
    assert!(info.status.backends.iter().any(|b| b == "llama.cpp"));

    let model = tiny_model(cluster.dir.path());
    let (_, instances) = cluster
        .create_model(&manual_model_create("tiny", &model, 1))
        .await;
    let id = instances[0];
    cluster.place(id, worker_id, &[1]).await;
    let running = cluster
        .wait_instance(id, InstanceState::Running, STARTUP)
        .await;
    let address = running.address.unwrap();
    let port = running.port.unwrap();
    let reply = chat(&cluster.http, &address).await;
    assert!(reply["choices"][0]["message"].is_object(), "{reply}");

    // The backend sees only its GPU.
    let pids = llama_pids_on(port);
    assert_eq!(pids.len(), 1);
    let environ = std::fs::read(format!("/proc/{}/environ", pids[0])).unwrap();
    assert!(environ
        .split(|b| *b == 0)
        .any(|v| v == b"CUDA_VISIBLE_DEVICES=1"));

    // Logs come through the server from the worker.
    let last_50 = LogQuery {
        tail: Some(50),
        ..LogQuery::default()
    };
    let logs = admin.instance_logs(id, &last_50).await.unwrap();
    let logs = logs.text().await.unwrap();
    assert!(logs.contains("llama"), "{logs}");
    // A followed log ends after the client's timeout_seconds.
    let follow = LogQuery {
        tail: Some(5),
        follow: Some(true),
        timeout_seconds: Some(1),
    };
    let began = std::time::Instant::now();
    let followed = admin.instance_logs(id, &follow).await.unwrap();
    let followed = followed.text().await.unwrap();
    let took = began.elapsed();
    assert!(!followed.trim().is_empty(), "the last lines came first");
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(10),
        "a follow with timeout_seconds=1 ended after {took:?}"
    );

    // kill -9 of the backend: restarted and running again, with a new pid.
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pids[0]), Signal::SIGKILL).unwrap();
    let again = cluster
        .wait_for(
            "a restart",
            STARTUP,
            || admin.get_instance(id),
            |i| i.state == InstanceState::Running && i.restart_count >= 1,
        )
        .await;
    let again_port = again.port.unwrap();
    let new_pids = llama_pids_on(again_port);
    assert_eq!(new_pids.len(), 1);
    assert_ne!(new_pids[0], pids[0]);
    chat(&cluster.http, again.address.as_deref().unwrap()).await;

    // Deleting the instance stops its process group and frees the port.
    admin.delete_instance(id).await.unwrap();
    common::wait_gone(
        &new_pids,
        "the backend to stop after the delete",
        Duration::from_secs(40),
    )
    .await;
    std::net::TcpListener::bind(("127.0.0.1", again_port)).expect("port is free again");

    // Place the replacement, then stop the worker: it exits 0 and leaves no child.
    let replacement = cluster
        .wait_instances(
            running.model_id,
            "replaced",
            Duration::from_secs(10),
            |instances| instances.len() == 1 && instances[0].id != id,
        )
        .await[0]
        .id;
    cluster.place(replacement, worker_id, &[0]).await;
    cluster
        .wait_instance(replacement, InstanceState::Running, STARTUP)
        .await;
    let children = descendants(worker.pid());
    assert!(
        !children.is_empty(),
        "the worker should have a backend child"
    );
    worker.terminate_cleanly(Duration::from_secs(40));
    for child in children {
        assert!(!alive(child), "child {child} outlived the worker");
    }
    let gone = admin.get_worker(worker_id).await.unwrap();
    assert_eq!(gone.state, WorkerState::NotReady);
    assert_eq!(gone.state_message, "worker shut down");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_model_file_ends_in_error_with_the_stderr_tail() {
    let cluster = Cluster::start(&[]).await;
    let worker = cluster.worker("w1", &["--simulate-gpus", "1x8GiB"]);
    let worker_id = cluster.worker_id("w1", &worker).await;
    let corrupt = cluster.dir.path().join("corrupt.gguf");
    std::fs::write(&corrupt, b"GGUF this is not a model at all, just bytes").unwrap();
    let (_, instances) = cluster
        .create_model(&manual_model_create("broken", &corrupt, 1))
        .await;
    cluster.place(instances[0], worker_id, &[0]).await;
    let failed = cluster
        .wait_instance(instances[0], InstanceState::Error, STARTUP)
        .await;
    let message = &failed.state_message;
    assert!(message.contains("exit"), "{message}");
    // llama-server's own words about the file are in the message.
    assert!(
        message.to_lowercase().contains("gguf") || message.contains("failed to load"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_keeps_its_identity_across_restarts() {
    let cluster = Cluster::start(&[]).await;
    let mut first = cluster.worker("w1", &["--simulate-gpus", "1x8GiB"]);
    let id = cluster.worker_id("w1", &first).await;
    first.terminate_cleanly(Duration::from_secs(20));
    let credential = cluster.dir.path().join("w1/worker/worker_credential.json");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&credential).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let second = cluster.worker("w1", &["--simulate-gpus", "1x8GiB"]);
    cluster
        .wait_worker(id, "back", STARTUP, |w| w.state == WorkerState::Ready)
        .await;
    let all = cluster
        .client()
        .list_workers(&WorkerQuery::default())
        .await
        .unwrap();
    assert_eq!(
        all.pagination.total, 1,
        "re-registration made a second worker"
    );
    // The server answers the re-registration before the worker logs it: wait for it.
    second
        .wait_for_log("registered again", Duration::from_secs(10))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_worker_goes_not_ready_then_unreachable_and_comes_back() {
    let cluster =
        Cluster::start(&["--heartbeat-interval", "300ms", "--server-timeout", "2s"]).await;
    let worker = cluster.worker(
        "w1",
        &["--simulate-gpus", "1x8GiB", "--heartbeat-interval", "300ms"],
    );
    let id = cluster.worker_id("w1", &worker).await;
    let in_state = |want: WorkerState| move |w: &gantry_types::Worker| w.state == want;
    cluster
        .wait_worker(id, "ready", STARTUP, in_state(WorkerState::Ready))
        .await;
    // Freeze the worker: no heartbeats, but the process lives.
    worker.signal(Signal::SIGSTOP);
    let within = Duration::from_secs(10);
    cluster
        .wait_worker(id, "not_ready", within, in_state(WorkerState::NotReady))
        .await;
    cluster
        .wait_worker(
            id,
            "unreachable",
            within,
            in_state(WorkerState::Unreachable),
        )
        .await;
    worker.signal(Signal::SIGCONT);
    cluster
        .wait_worker(id, "ready again", within, in_state(WorkerState::Ready))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_parallel_instance_runs_one_child_per_gpu_and_restarts_as_a_group() {
    let cluster = Cluster::start(&[]).await;
    let worker = cluster.worker("w1", &["--simulate-gpus", "2x8GiB"]);
    let worker_id = cluster.worker_id("w1", &worker).await;
    let model = tiny_model(cluster.dir.path());
    let data_parallel = gantry_types::ModelCreate {
        data_parallel_size: Some(2),
        ..manual_model_create("dp", &model, 1)
    };
    let (_, instances) = cluster.create_model(&data_parallel).await;
    cluster.place(instances[0], worker_id, &[0, 1]).await;
    let running = cluster
        .wait_instance(instances[0], InstanceState::Running, STARTUP)
        .await;
    let port = running.port.unwrap();
    let first = llama_pids_on(port);
    let second = llama_pids_on(port + 1);
    assert_eq!(
        (first.len(), second.len()),
        (1, 1),
        "children on consecutive ports"
    );
    let visible = |pid: i32| -> String {
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
        environ
            .split(|b| *b == 0)
            .find_map(|v| v.strip_prefix(b"CUDA_VISIBLE_DEVICES="))
            .map(|v| String::from_utf8_lossy(v).to_string())
            .unwrap()
    };
    assert_eq!(
        (visible(first[0]).as_str(), visible(second[0]).as_str()),
        ("0", "1")
    );
    chat(&cluster.http, &format!("127.0.0.1:{}", port + 1)).await;

    // Losing one child restarts the whole group.
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(second[0]), Signal::SIGKILL).unwrap();
    let again = cluster
        .wait_for(
            "the group restarted",
            STARTUP,
            || cluster.client().get_instance(instances[0]),
            |i| i.state == InstanceState::Running && i.restart_count >= 1,
        )
        .await;
    let port = again.port.unwrap();
    let (a, b) = (llama_pids_on(port), llama_pids_on(port + 1));
    assert_eq!((a.len(), b.len()), (1, 1));
    assert!(
        !alive(first[0]),
        "the surviving child of the old group was not restarted"
    );
    assert_ne!(a[0], first[0]);
}
