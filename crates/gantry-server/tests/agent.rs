//! The endpoints worker agents call, against SQLite and PostgreSQL: registration,
//! heartbeats and health transitions, the worker-scoped assignment stream, and state
//! reports.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{assert_error, ndjson_lines, next_non_heartbeat, tiny_model, Options, TestServer};
use gantry_testkit::{test_both_engines, TestEngine};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

fn registration(name: &str, gpus: u32) -> Value {
    let gpus: Vec<Value> = (0..gpus)
        .map(|i| {
            json!({"index": i, "name": "Simulated GPU", "uuid": format!("SIM-{name}-{i}"),
                   "memory_total": 85899345920u64, "memory_used": 0, "utilization": null,
                   "temperature": null, "simulated": true})
        })
        .collect();
    json!({
        "name": name,
        "labels": {"zone": "a"},
        "address": "127.0.0.1:1",
        "status": {"gpus": gpus, "system": {"cpu_count": 2, "load_average": 0.1,
            "memory_total": 1, "memory_available": 1, "disk_free": 1, "os": "linux",
            "hostname": name}, "backends": ["llama.cpp"]},
    })
}

async fn register(server: &TestServer, name: &str, gpus: u32) -> (i64, String) {
    let token = server.registration_token();
    let (status, body) = server
        .call(
            Method::POST,
            "/api/v1/workers/register",
            Some(&token),
            Some(registration(name, gpus)),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    (
        body["worker"]["id"].as_i64().unwrap(),
        body["credential"].as_str().unwrap().to_string(),
    )
}

async fn workers_register_once_and_reregister_idempotently(engine: TestEngine) {
    let server = TestServer::start(engine).await;
    let admin = server.admin_token().await;
    let (status, body) = server
        .call(
            Method::POST,
            "/api/v1/workers/register",
            Some("gantryreg_wrong"),
            Some(registration("w1", 2)),
        )
        .await;
    assert_error(status, &body, 401, "unauthorized");

    let (id, credential) = register(&server, "w1", 2).await;
    assert!(credential.starts_with("gantryw_"));
    let (_, worker) = server
        .call(
            Method::GET,
            &format!("/api/v1/workers/{id}"),
            Some(&admin),
            None,
        )
        .await;
    assert_eq!(worker["state"], "ready");
    assert_eq!(worker["status"]["gpus"][1]["simulated"], true);
    assert_eq!(worker["labels"]["zone"], "a");

    // Same name with the token again: conflict, the first registration stays.
    let token = server.registration_token();
    let (status, body) = server
        .call(
            Method::POST,
            "/api/v1/workers/register",
            Some(&token),
            Some(registration("w1", 8)),
        )
        .await;
    assert_error(status, &body, 409, "conflict");

    // With its credential: the same worker, updated, no new credential.
    let (status, body) = server
        .call(
            Method::POST,
            "/api/v1/workers/register",
            Some(&credential),
            Some(registration("w1", 4)),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["worker"]["id"].as_i64().unwrap(), id);
    assert!(body["credential"].is_null());
    assert_eq!(
        body["worker"]["status"]["gpus"].as_array().unwrap().len(),
        4
    );

    // A credential cannot register under another name.
    let (status, body) = server
        .call(
            Method::POST,
            "/api/v1/workers/register",
            Some(&credential),
            Some(registration("w2", 1)),
        )
        .await;
    assert_error(status, &body, 409, "conflict");

    // Users cannot call worker endpoints.
    let (status, body) = server
        .call(Method::POST, "/api/v1/worker/heartbeat", Some(&admin), None)
        .await;
    assert_error(status, &body, 403, "forbidden");
    server.shutdown().await;
}

async fn silent_workers_become_not_ready_then_unreachable_and_recover(engine: TestEngine) {
    let server = TestServer::start_with(
        engine,
        Options {
            heartbeat_interval: Duration::from_millis(200),
            server_timeout: Duration::from_millis(1500),
            ..Default::default()
        },
    )
    .await;
    let admin = server.admin_token().await;
    let (worker_id, credential) = register(&server, "w1", 1).await;
    let (_, model) = server
        .call(
            Method::POST,
            "/api/v1/models",
            Some(&admin),
            Some(tiny_model("tiny", 1)),
        )
        .await;
    let instances = server
        .instances_of(&admin, model["id"].as_i64().unwrap(), 1)
        .await;
    let instance_id = instances["items"][0]["id"].as_i64().unwrap();
    server
        .call(
            Method::PATCH,
            &format!("/api/v1/model-instances/{instance_id}"),
            Some(&admin),
            Some(json!({"worker_id": worker_id, "gpu_indexes": [0]})),
        )
        .await;
    let (status, _) = server
        .call(
            Method::POST,
            &format!("/api/v1/worker/instances/{instance_id}/state"),
            Some(&credential),
            Some(json!({"state": "running", "port": 40000, "address": "127.0.0.1:40000"})),
        )
        .await;
    assert_eq!(status, StatusCode::OK);

    let state_of = |body: &Value| body["state"].as_str().unwrap().to_string();
    let wait_for = |want: &'static str| {
        let server = &server;
        let admin = admin.clone();
        async move {
            for _ in 0..100 {
                let (_, worker) = server
                    .call(
                        Method::GET,
                        &format!("/api/v1/workers/{worker_id}"),
                        Some(&admin),
                        None,
                    )
                    .await;
                if worker["state"] == want {
                    return worker;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            panic!("worker never became {want}");
        }
    };
    let worker = wait_for("not_ready").await;
    assert!(worker["state_message"]
        .as_str()
        .unwrap()
        .contains("heartbeat"));
    wait_for("unreachable").await;
    let (_, instance) = server
        .call(
            Method::GET,
            &format!("/api/v1/model-instances/{instance_id}"),
            Some(&admin),
            None,
        )
        .await;
    assert_eq!(state_of(&instance), "unreachable");

    let (status, body) = server
        .call(
            Method::POST,
            "/api/v1/worker/heartbeat",
            Some(&credential),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["state"], "ready");

    // Goodbye marks it not_ready at once.
    let (status, _) = server
        .call(
            Method::POST,
            "/api/v1/worker/goodbye",
            Some(&credential),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (_, worker) = server
        .call(
            Method::GET,
            &format!("/api/v1/workers/{worker_id}"),
            Some(&admin),
            None,
        )
        .await;
    assert_eq!(worker["state"], "not_ready");
    assert_eq!(worker["state_message"], "worker shut down");
    server.shutdown().await;
}

async fn assignment_stream_is_scoped_to_the_calling_worker(engine: TestEngine) {
    let server = TestServer::start(engine).await;
    let admin = server.admin_token().await;
    let (w1, cred1) = register(&server, "w1", 2).await;
    let (w2, cred2) = register(&server, "w2", 2).await;
    let (_, model) = server
        .call(
            Method::POST,
            "/api/v1/models",
            Some(&admin),
            Some(tiny_model("tiny", 2)),
        )
        .await;
    let instances = server
        .instances_of(&admin, model["id"].as_i64().unwrap(), 2)
        .await;
    let a = instances["items"][0]["id"].as_i64().unwrap();
    let b = instances["items"][1]["id"].as_i64().unwrap();
    let place = |id: i64, worker: Option<i64>| {
        let server = &server;
        let admin = admin.clone();
        async move {
            let (status, body) = server
                .call(
                    Method::PATCH,
                    &format!("/api/v1/model-instances/{id}"),
                    Some(&admin),
                    Some(json!({"worker_id": worker, "gpu_indexes": if worker.is_some() { json!([0]) } else { json!([]) }})),
                )
                .await;
            assert_eq!(status, StatusCode::OK, "{body}");
        }
    };
    place(a, Some(w1)).await;
    place(b, Some(w2)).await;

    // The plain list shows only this worker's instance, with what it runs.
    let (status, list) = server
        .call(
            Method::GET,
            "/api/v1/worker/assignments",
            Some(&cred1),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(list.as_array().unwrap().len(), 1);
    assert_eq!(list[0]["id"].as_i64().unwrap(), a);
    assert_eq!(list[0]["model_name"], "tiny");
    assert_eq!(list[0]["placement"]["launch"]["backend"], "llama.cpp");

    // A worker cannot report on another worker's instance, nor list all instances.
    let (status, body) = server
        .call(
            Method::POST,
            &format!("/api/v1/worker/instances/{b}/state"),
            Some(&cred1),
            Some(json!({"state": "starting"})),
        )
        .await;
    assert_error(status, &body, 404, "not_found");
    let (status, body) = server
        .call(Method::GET, "/api/v1/model-instances", Some(&cred1), None)
        .await;
    assert_error(status, &body, 403, "forbidden");
    let (status, body) = server
        .call(
            Method::POST,
            &format!("/api/v1/worker/instances/{a}/state"),
            Some(&cred1),
            Some(json!({"state": "running"})),
        )
        .await;
    assert!(assert_error(status, &body, 422, "validation_failed").contains("address"));

    let response = server
        .client
        .get(format!(
            "{}/api/v1/worker/assignments?watch=true",
            server.base
        ))
        .bearer_auth(&cred1)
        .send()
        .await
        .unwrap();
    let mut lines = ndjson_lines(response);
    let first = next_non_heartbeat(&mut lines).await;
    assert_eq!(first["type"], "CREATED");
    assert_eq!(first["object"]["id"].as_i64().unwrap(), a);

    // Changes to the other worker's instance are not sent; a model change reaches this
    // worker's instance as a new launch (placed by hand, it restarts where it is).
    server
        .call(
            Method::POST,
            &format!("/api/v1/worker/instances/{b}/state"),
            Some(&cred2),
            Some(json!({"state": "starting"})),
        )
        .await;
    server
        .call(
            Method::PATCH,
            &format!("/api/v1/models/{}", model["id"]),
            Some(&admin),
            Some(json!({"backend_args": ["-c", "256"]})),
        )
        .await;
    let event = next_non_heartbeat(&mut lines).await;
    assert_eq!(event["type"], "UPDATED");
    assert_eq!(event["object"]["id"].as_i64().unwrap(), a);
    assert_eq!(
        event["object"]["placement"]["launch"]["backend_args"],
        json!(["-c", "256"])
    );

    // Moving the instance away is a DELETED for this worker; moving one here a CREATED.
    place(a, Some(w2)).await;
    let event = next_non_heartbeat(&mut lines).await;
    assert_eq!(event["type"], "DELETED");
    assert_eq!(event["object"]["id"].as_i64().unwrap(), a);
    place(b, Some(w1)).await;
    let event = next_non_heartbeat(&mut lines).await;
    assert_eq!(event["type"], "CREATED");
    assert_eq!(event["object"]["id"].as_i64().unwrap(), b);
    server.shutdown().await;
}

test_both_engines!(
    workers_register_once_and_reregister_idempotently,
    silent_workers_become_not_ready_then_unreachable_and_recover,
    assignment_stream_is_scoped_to_the_calling_worker,
);
