//! The worker end to end, as real processes: `gantry server`, `gantry worker`, a real
//! `llama-server` serving the tiny model. Placement is by hand here (the scheduler
//! places on its own in the scheduler tests).

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{
    alive, chat, descendants, llama_pids_on, manual_model_body, tail, tiny_model, Cluster,
};
use nix::sys::signal::Signal;
use reqwest::Method;
use serde_json::json;

const STARTUP: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_runs_restarts_logs_and_stops_a_real_llama_server() {
    let cluster = Cluster::start(&[]).await;
    let mut worker = cluster.worker("w1", &["--simulate-gpus", "2x8GiB"]);
    let worker_id = cluster.worker_id("w1", &worker).await;

    // Simulated GPUs are reported as such.
    let info = cluster.get(&format!("/api/v1/workers/{worker_id}")).await;
    assert_eq!(info["status"]["gpus"].as_array().unwrap().len(), 2);
    assert_eq!(info["status"]["gpus"][0]["simulated"], true);
    assert!(info["status"]["backends"]
        .as_array()
        .unwrap()
        .contains(&json!("llama.cpp")));

    let model = tiny_model(cluster.dir.path());
    let (_, instances) = cluster
        .create_model(manual_model_body("tiny", &model, 1))
        .await;
    let id = instances[0];
    cluster.place(id, worker_id, &[1]).await;
    let running = cluster.wait_instance(id, "running", STARTUP).await;
    let address = running["address"].as_str().unwrap().to_string();
    let port = running["port"].as_u64().unwrap() as u16;
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
    let (status, logs) = cluster
        .call(
            Method::GET,
            &format!("/api/v1/model-instances/{id}/logs?tail=50"),
            None,
        )
        .await;
    assert_eq!(status, 200);
    assert!(logs.as_str().unwrap().contains("llama"), "{logs}");

    // kill -9 of the backend: restarted and running again, with a new pid.
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pids[0]), Signal::SIGKILL).unwrap();
    let again = cluster
        .wait_for(
            "a restart",
            &format!("/api/v1/model-instances/{id}"),
            STARTUP,
            |i| i["state"] == "running" && i["restart_count"].as_u64() >= Some(1),
        )
        .await;
    let again_port = again["port"].as_u64().unwrap() as u16;
    let new_pids = llama_pids_on(again_port);
    assert_eq!(new_pids.len(), 1);
    assert_ne!(new_pids[0], pids[0]);
    chat(&cluster.http, again["address"].as_str().unwrap()).await;

    // Deleting the instance stops its process group and frees the port.
    let (status, _) = cluster
        .call(
            Method::DELETE,
            &format!("/api/v1/model-instances/{id}"),
            None,
        )
        .await;
    assert_eq!(status, 204);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(40);
    while alive(new_pids[0]) && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!alive(new_pids[0]), "backend still alive after delete");
    std::net::TcpListener::bind(("127.0.0.1", again_port)).expect("port is free again");

    // Place the replacement, then stop the worker: it exits 0 and leaves no child.
    let replacement = cluster
        .wait_for(
            "the replacement instance",
            "/api/v1/model-instances",
            Duration::from_secs(10),
            |list| list["pagination"]["total"] == 1 && list["items"][0]["id"] != id,
        )
        .await["items"][0]["id"]
        .as_i64()
        .unwrap();
    cluster.place(replacement, worker_id, &[0]).await;
    cluster.wait_instance(replacement, "running", STARTUP).await;
    let children = descendants(worker.pid());
    assert!(
        !children.is_empty(),
        "the worker should have a backend child"
    );
    let status = worker.terminate(Duration::from_secs(40));
    assert!(
        status.success(),
        "worker exit: {status:?}\n{}",
        tail(&worker.log_text(), 30)
    );
    for child in children {
        assert!(!alive(child), "child {child} outlived the worker");
    }
    let gone = cluster.get(&format!("/api/v1/workers/{worker_id}")).await;
    assert_eq!(gone["state"], "not_ready");
    assert_eq!(gone["state_message"], "worker shut down");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_model_file_ends_in_error_with_the_stderr_tail() {
    let cluster = Cluster::start(&[]).await;
    let worker = cluster.worker("w1", &["--simulate-gpus", "1x8GiB"]);
    let worker_id = cluster.worker_id("w1", &worker).await;
    let corrupt = cluster.dir.path().join("corrupt.gguf");
    std::fs::write(&corrupt, b"GGUF this is not a model at all, just bytes").unwrap();
    let (_, instances) = cluster
        .create_model(manual_model_body("broken", &corrupt, 1))
        .await;
    cluster.place(instances[0], worker_id, &[0]).await;
    let failed = cluster.wait_instance(instances[0], "error", STARTUP).await;
    let message = failed["state_message"].as_str().unwrap();
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
    assert!(first.terminate(Duration::from_secs(20)).success());
    let credential = cluster.dir.path().join("w1/worker/worker_credential.json");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&credential).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let second = cluster.worker("w1", &["--simulate-gpus", "1x8GiB"]);
    cluster
        .wait_for(
            "the worker back",
            &format!("/api/v1/workers/{id}"),
            STARTUP,
            |w| w["state"] == "ready",
        )
        .await;
    let all = cluster.get("/api/v1/workers").await;
    assert_eq!(
        all["pagination"]["total"], 1,
        "re-registration made a second worker"
    );
    // The server answers the re-registration before the worker logs it: wait for it.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !second.log_text().contains("registered again") {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{}",
            second.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
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
    let path = format!("/api/v1/workers/{id}");
    cluster
        .wait_for("ready", &path, STARTUP, |w| w["state"] == "ready")
        .await;
    // Freeze the worker: no heartbeats, but the process lives.
    worker.signal(Signal::SIGSTOP);
    cluster
        .wait_for("not_ready", &path, Duration::from_secs(10), |w| {
            w["state"] == "not_ready"
        })
        .await;
    cluster
        .wait_for("unreachable", &path, Duration::from_secs(10), |w| {
            w["state"] == "unreachable"
        })
        .await;
    worker.signal(Signal::SIGCONT);
    cluster
        .wait_for("ready again", &path, Duration::from_secs(10), |w| {
            w["state"] == "ready"
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_parallel_instance_runs_one_child_per_gpu_and_restarts_as_a_group() {
    let cluster = Cluster::start(&[]).await;
    let worker = cluster.worker("w1", &["--simulate-gpus", "2x8GiB"]);
    let worker_id = cluster.worker_id("w1", &worker).await;
    let model = tiny_model(cluster.dir.path());
    let mut body = manual_model_body("dp", &model, 1);
    body["data_parallel_size"] = json!(2);
    let (_, instances) = cluster.create_model(body).await;
    cluster.place(instances[0], worker_id, &[0, 1]).await;
    let running = cluster
        .wait_instance(instances[0], "running", STARTUP)
        .await;
    let port = running["port"].as_u64().unwrap() as u16;
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
            &format!("/api/v1/model-instances/{}", instances[0]),
            STARTUP,
            |i| i["state"] == "running" && i["restart_count"].as_u64() >= Some(1),
        )
        .await;
    let port = again["port"].as_u64().unwrap() as u16;
    let (a, b) = (llama_pids_on(port), llama_pids_on(port + 1));
    assert_eq!((a.len(), b.len()), (1, 1));
    assert!(
        !alive(first[0]),
        "the surviving child of the old group was not restarted"
    );
    assert_ne!(a[0], first[0]);
}
