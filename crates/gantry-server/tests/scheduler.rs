//! The scheduler loop and the controllers against a real server, on SQLite and
//! PostgreSQL: workers with simulated GPUs register through the API, models are created
//! through the API, and the instances must reach `scheduled` (or stay `pending` with a
//! reason) without any manual placement.

#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{Options, TestServer};
use gantry_testkit::{test_both_engines, TestEngine};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

const GIB: u64 = 1 << 30;

/// A worker registration with `gpus` simulated 80 GiB GPUs, 64 GiB of RAM, llama.cpp and
/// vLLM.
fn registration(name: &str, gpus: u32, labels: Value) -> Value {
    let gpus: Vec<Value> = (0..gpus)
        .map(|i| {
            json!({"index": i, "name": "Simulated GPU", "uuid": format!("SIM-{name}-{i}"),
                   "memory_total": 80 * GIB, "memory_used": 0, "utilization": null,
                   "temperature": null, "simulated": true})
        })
        .collect();
    json!({
        "name": name,
        "labels": labels,
        "address": "127.0.0.1:1",
        "status": {"gpus": gpus, "system": {"cpu_count": 8, "load_average": 0.1,
            "memory_total": 64 * GIB, "memory_available": 60 * GIB, "disk_free": 100 * GIB,
            "os": "linux", "hostname": name}, "backends": ["llama.cpp", "vllm"]},
    })
}

/// Registers a worker; returns its id and credential.
async fn register(server: &TestServer, name: &str, gpus: u32, labels: Value) -> (i64, String) {
    let token = server.registration_token();
    let (status, body) = server
        .call(
            Method::POST,
            "/api/v1/workers/register",
            Some(&token),
            Some(registration(name, gpus, labels)),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    (
        body["worker"]["id"].as_i64().unwrap(),
        body["credential"].as_str().unwrap().to_string(),
    )
}

/// Sends heartbeats for the workers every 100 ms until dropped.
struct KeepAlive(tokio::task::JoinHandle<()>);

impl Drop for KeepAlive {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn keep_alive(server: &TestServer, credentials: &[&str]) -> KeepAlive {
    let client = server.client.clone();
    let url = format!("{}/api/v1/worker/heartbeat", server.base);
    let credentials: Vec<String> = credentials.iter().map(|c| (*c).to_string()).collect();
    KeepAlive(tokio::spawn(async move {
        loop {
            for credential in &credentials {
                let _ = client.post(&url).bearer_auth(credential).send().await;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }))
}

/// Writes the tiny GGUF model into the test's data directory.
fn tiny_gguf(server: &TestServer) -> PathBuf {
    let path = server.data_dir.path().join("tiny.gguf");
    gantry_gguf::write_tiny_llama(&path).unwrap();
    path
}

/// A model directory whose one safetensors header claims 500 GB of BF16 weights; only the
/// header is written.
fn huge_safetensors_dir(server: &TestServer) -> PathBuf {
    let dir = server.data_dir.path().join("huge-model");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("config.json"),
        r#"{"hidden_size": 8192, "num_hidden_layers": 80, "num_attention_heads": 64,
            "num_key_value_heads": 8, "max_position_embeddings": 8192}"#,
    )
    .unwrap();
    let header = r#"{"w": {"dtype": "BF16", "shape": [250000, 1000000], "data_offsets": [0, 500000000000]}}"#;
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    std::fs::write(dir.join("model.safetensors"), bytes).unwrap();
    dir
}

async fn create_model(server: &TestServer, admin: &str, body: Value) -> i64 {
    let (status, model) = server
        .call(Method::POST, "/api/v1/models", Some(admin), Some(body))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{model}");
    model["id"].as_i64().unwrap()
}

fn llama_model(name: &str, path: &Path, replicas: u32) -> Value {
    json!({
        "name": name,
        "source": {"type": "local_path", "path": path.display().to_string()},
        "backend": "llama.cpp",
        "replicas": replicas,
    })
}

async fn instances_of(server: &TestServer, admin: &str, model_id: i64) -> Vec<Value> {
    let (status, body) = server
        .call(
            Method::GET,
            &format!("/api/v1/model-instances?model_id={model_id}"),
            Some(admin),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["items"].as_array().unwrap().clone()
}

/// Polls the model's instances until `done` holds for the list (10 s at most).
async fn wait_for_instances(
    server: &TestServer,
    admin: &str,
    model_id: i64,
    what: &str,
    done: impl Fn(&[Value]) -> bool,
) -> Vec<Value> {
    let mut last = Vec::new();
    for _ in 0..200 {
        last = instances_of(server, admin, model_id).await;
        if done(&last) {
            return last;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("instances never {what}: {last:#?}");
}

fn all_in(state: &'static str, count: usize) -> impl Fn(&[Value]) -> bool {
    move |instances| instances.len() == count && instances.iter().all(|i| i["state"] == state)
}

/// Waits until every instance is pending with a non-empty reason.
async fn wait_pending_with_reason(
    server: &TestServer,
    admin: &str,
    model_id: i64,
    count: usize,
) -> Vec<Value> {
    wait_for_instances(
        server,
        admin,
        model_id,
        "pending with a reason",
        |instances| {
            instances.len() == count
                && instances.iter().all(|i| {
                    i["state"] == "pending" && !i["state_message"].as_str().unwrap().is_empty()
                })
        },
    )
    .await
}

fn worker_names(instances: &[Value]) -> Vec<String> {
    instances
        .iter()
        .map(|i| i["worker_name"].as_str().unwrap_or("-").to_string())
        .collect()
}

async fn replicas_are_scheduled_on_simulated_gpus_spread_over_workers(engine: TestEngine) {
    let server = TestServer::start(engine).await;
    let admin = server.admin_token().await;
    register(&server, "w1", 2, json!({})).await;
    register(&server, "w2", 2, json!({})).await;
    let path = tiny_gguf(&server);
    let model_id = create_model(&server, &admin, llama_model("tiny", &path, 2)).await;

    let instances = wait_for_instances(
        &server,
        &admin,
        model_id,
        "scheduled",
        all_in("scheduled", 2),
    )
    .await;
    let mut names = worker_names(&instances);
    names.sort();
    assert_eq!(names, ["w1", "w2"], "spread puts one on each worker");
    for instance in &instances {
        assert_eq!(instance["gpu_indexes"], json!([0]), "{instance}");
        let message = instance["state_message"].as_str().unwrap();
        assert!(
            message.contains("simulated GPU 0"),
            "the message says where, and that the GPU is simulated: {message}"
        );
        let record = &instance["placement"];
        let reservation = &record["reservation"];
        assert!(
            reservation["claim"]["memory"]["Layers"].is_object(),
            "{record}"
        );
        assert_eq!(
            reservation["placement"]["worker_name"],
            instance["worker_name"]
        );
        assert_eq!(reservation["placement"]["kind"], "SingleGpu");
        assert_eq!(record["launch"]["backend"], "llama.cpp");
        // The tiny model has 2 blocks (3 layers with the output) and a 256-token context.
        assert_eq!(
            record["placement_args"],
            json!(["--ctx-size", "256", "-ngl", "3"]),
            "{record}"
        );
    }
    server.shutdown().await;
}

async fn binpack_packs_replicas_onto_one_worker(engine: TestEngine) {
    let server = TestServer::start(engine).await;
    let admin = server.admin_token().await;
    register(&server, "w1", 2, json!({})).await;
    register(&server, "w2", 2, json!({})).await;
    let path = tiny_gguf(&server);
    let mut body = llama_model("packed", &path, 2);
    body["placement_strategy"] = json!("binpack");
    let model_id = create_model(&server, &admin, body).await;
    let instances = wait_for_instances(
        &server,
        &admin,
        model_id,
        "scheduled",
        all_in("scheduled", 2),
    )
    .await;
    assert_eq!(worker_names(&instances), ["w1", "w1"]);
    server.shutdown().await;
}

async fn models_too_large_for_any_worker_stay_pending_with_the_shortfall(engine: TestEngine) {
    let server = TestServer::start(engine).await;
    let admin = server.admin_token().await;
    register(&server, "w1", 2, json!({})).await;

    // vLLM with 500 GB of weights: not even both 80 GiB GPUs together hold it.
    let dir = huge_safetensors_dir(&server);
    let huge = create_model(
        &server,
        &admin,
        json!({"name": "huge", "backend": "vllm", "replicas": 1,
               "source": {"type": "local_path", "path": dir.display().to_string()}}),
    )
    .await;
    let instances = wait_pending_with_reason(&server, &admin, huge, 1).await;
    let message = instances[0]["state_message"].as_str().unwrap();
    assert!(
        message.starts_with("no ready worker has 1 GPU with 90% of memory free")
            && message.contains("2 GPUs")
            && message.contains("best: w1"),
        "the reason names what was needed and the closest worker: {message}"
    );
    assert!(instances[0]["worker_id"].is_null());
    assert!(instances[0]["computed_resource_claim"].is_null());

    // llama.cpp with a 16M-token context and no CPU offload: the KV cache and compute
    // buffers exceed any GPU.
    let path = tiny_gguf(&server);
    let mut body = llama_model("long", &path, 1);
    body["backend_args"] = json!(["--ctx-size", "16777216"]);
    body["cpu_offload"] = json!(false);
    let long = create_model(&server, &admin, body).await;
    let instances = wait_pending_with_reason(&server, &admin, long, 1).await;
    let message = instances[0]["state_message"].as_str().unwrap();
    assert!(
        message.starts_with("no ready worker has 1 GPU with") && message.contains("best: w1"),
        "{message}"
    );
    server.shutdown().await;
}

async fn a_missing_model_file_leaves_instances_pending_naming_the_path(engine: TestEngine) {
    let server = TestServer::start(engine).await;
    let admin = server.admin_token().await;
    register(&server, "w1", 1, json!({})).await;
    let path = server.data_dir.path().join("not-there.gguf");
    let model_id = create_model(&server, &admin, llama_model("ghost", &path, 2)).await;
    let instances = wait_pending_with_reason(&server, &admin, model_id, 2).await;
    for instance in &instances {
        let message = instance["state_message"].as_str().unwrap();
        assert!(
            message.contains(&path.display().to_string()) && message.contains("source.path"),
            "the message names the path and what to fix: {message}"
        );
    }

    // Once the file appears (and the model is touched, or the retry comes round), the
    // instances are placed.
    gantry_gguf::write_tiny_llama(&path).unwrap();
    let (status, _) = server
        .call(
            Method::PATCH,
            &format!("/api/v1/models/{model_id}"),
            Some(&admin),
            Some(json!({"description": "the file is there now"})),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    wait_for_instances(
        &server,
        &admin,
        model_id,
        "scheduled",
        all_in("scheduled", 2),
    )
    .await;
    server.shutdown().await;
}

async fn worker_selectors_are_respected(engine: TestEngine) {
    let server = TestServer::start(engine).await;
    let admin = server.admin_token().await;
    register(&server, "wa", 1, json!({"zone": "a"})).await;
    register(&server, "wb", 1, json!({"zone": "b"})).await;
    let path = tiny_gguf(&server);

    let mut body = llama_model("in-b", &path, 2);
    body["worker_selector"] = json!({"zone": "b"});
    let in_b = create_model(&server, &admin, body).await;
    let instances =
        wait_for_instances(&server, &admin, in_b, "scheduled", all_in("scheduled", 2)).await;
    assert_eq!(worker_names(&instances), ["wb", "wb"]);

    let mut body = llama_model("in-c", &path, 1);
    body["worker_selector"] = json!({"zone": "c"});
    let in_c = create_model(&server, &admin, body).await;
    let instances = wait_pending_with_reason(&server, &admin, in_c, 1).await;
    assert_eq!(
        instances[0]["state_message"],
        "no worker matches selector zone=c"
    );
    server.shutdown().await;
}

async fn replicas_follow_the_model_and_deleted_instances_are_replaced(engine: TestEngine) {
    let server = TestServer::start(engine).await;
    let admin = server.admin_token().await;
    register(&server, "w1", 2, json!({})).await;
    let path = tiny_gguf(&server);
    let model_id = create_model(&server, &admin, llama_model("scaled", &path, 2)).await;
    wait_for_instances(
        &server,
        &admin,
        model_id,
        "scheduled",
        all_in("scheduled", 2),
    )
    .await;

    let patch = |replicas: u32| {
        let server = &server;
        let admin = admin.clone();
        async move {
            let (status, body) = server
                .call(
                    Method::PATCH,
                    &format!("/api/v1/models/{model_id}"),
                    Some(&admin),
                    Some(json!({"replicas": replicas})),
                )
                .await;
            assert_eq!(status, StatusCode::OK, "{body}");
        }
    };
    patch(3).await;
    wait_for_instances(
        &server,
        &admin,
        model_id,
        "scheduled",
        all_in("scheduled", 3),
    )
    .await;
    patch(1).await;
    let instances = wait_for_instances(
        &server,
        &admin,
        model_id,
        "scaled down",
        all_in("scheduled", 1),
    )
    .await;

    // An instance deleted on its own is replaced and placed again.
    let old = instances[0]["id"].as_i64().unwrap();
    let (status, _) = server
        .call(
            Method::DELETE,
            &format!("/api/v1/model-instances/{old}"),
            Some(&admin),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let instances = wait_for_instances(&server, &admin, model_id, "replaced", |instances| {
        all_in("scheduled", 1)(instances) && instances[0]["id"].as_i64() != Some(old)
    })
    .await;
    assert_eq!(instances[0]["worker_name"], "w1");

    patch(0).await;
    wait_for_instances(&server, &admin, model_id, "gone", |instances| {
        instances.is_empty()
    })
    .await;
    server.shutdown().await;
}

/// Short heartbeats so that a silent worker is unreachable within 1.5 s, and the
/// reschedule delay (a third of that) is half a second.
fn fast_health() -> Options {
    Options {
        heartbeat_interval: Duration::from_millis(200),
        server_timeout: Duration::from_millis(1500),
        ..Default::default()
    }
}

async fn instances_of_an_unreachable_worker_move_to_another(engine: TestEngine) {
    let server = TestServer::start_with(engine, fast_health()).await;
    let admin = server.admin_token().await;
    let (_, cred1) = register(&server, "w1", 1, json!({})).await;
    let (_, cred2) = register(&server, "w2", 1, json!({})).await;
    let both = keep_alive(&server, &[&cred1, &cred2]);
    let path = tiny_gguf(&server);
    let model_id = create_model(&server, &admin, llama_model("mobile", &path, 1)).await;
    let instances = wait_for_instances(
        &server,
        &admin,
        model_id,
        "scheduled",
        all_in("scheduled", 1),
    )
    .await;
    assert_eq!(
        worker_names(&instances),
        ["w1"],
        "spread breaks ties by worker id"
    );

    // w1 goes silent; only w2 keeps sending heartbeats.
    drop(both);
    let _w2 = keep_alive(&server, &[&cred2]);
    let instances = wait_for_instances(&server, &admin, model_id, "moved to w2", |i| {
        i.len() == 1 && i[0]["state"] == "scheduled" && i[0]["worker_name"] == "w2"
    })
    .await;
    let message = instances[0]["state_message"].as_str().unwrap();
    assert!(
        message.contains("rescheduling after: worker w1 is unreachable"),
        "{message}"
    );
    assert_eq!(
        instances[0]["placement"]["reservation"]["placement"]["worker_name"],
        "w2"
    );
    server.shutdown().await;
}

async fn errored_instances_are_rescheduled_on_another_worker(engine: TestEngine) {
    let server = TestServer::start_with(engine, fast_health()).await;
    let admin = server.admin_token().await;
    let (_, cred1) = register(&server, "w1", 1, json!({})).await;
    let (_, cred2) = register(&server, "w2", 1, json!({})).await;
    let _alive = keep_alive(&server, &[&cred1, &cred2]);
    let path = tiny_gguf(&server);
    let model_id = create_model(&server, &admin, llama_model("flaky", &path, 1)).await;
    let instances = wait_for_instances(
        &server,
        &admin,
        model_id,
        "scheduled",
        all_in("scheduled", 1),
    )
    .await;
    assert_eq!(worker_names(&instances), ["w1"]);
    let id = instances[0]["id"].as_i64().unwrap();

    // w1 gives up on it after its restart budget.
    let (status, body) = server
        .call(
            Method::POST,
            &format!("/api/v1/worker/instances/{id}/state"),
            Some(&cred1),
            Some(json!({"state": "error", "state_message": "llama-server exited 5 times"})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // Both workers are ready and equally empty, so spread alone would pick w1 again; the
    // rescheduled instance prefers the worker that did not give up on it.
    let instances = wait_for_instances(&server, &admin, model_id, "moved to w2", |i| {
        i.len() == 1 && i[0]["state"] == "scheduled" && i[0]["worker_name"] == "w2"
    })
    .await;
    assert_eq!(
        instances[0]["id"].as_i64(),
        Some(id),
        "the same instance moved"
    );
    let message = instances[0]["state_message"].as_str().unwrap();
    assert!(
        message.contains("rescheduling after: llama-server exited 5 times"),
        "{message}"
    );
    assert_eq!(instances[0]["restart_count"], 0);
    server.shutdown().await;
}

test_both_engines!(
    replicas_are_scheduled_on_simulated_gpus_spread_over_workers,
    binpack_packs_replicas_onto_one_worker,
    models_too_large_for_any_worker_stay_pending_with_the_shortfall,
    a_missing_model_file_leaves_instances_pending_naming_the_path,
    worker_selectors_are_respected,
    replicas_follow_the_model_and_deleted_instances_are_replaced,
    instances_of_an_unreachable_worker_move_to_another,
    errored_instances_are_rescheduled_on_another_worker,
);
