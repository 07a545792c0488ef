//! `gantry start`: a server and a worker in one process on an embedded SQLite database,
//! as a newcomer runs it.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{chat, descendants, manual_model_body, tail, tiny_model};
use serde_json::{json, Value};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gantry_start_serves_writes_bootstrap_files_and_runs_a_model() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (mut gantry, base) = common::start_gantry(dir.path(), &["--simulate-gpus", "1x8GiB"]).await;
    let http = reqwest::Client::new();

    // The bootstrap files, private to the owner.
    use std::os::unix::fs::PermissionsExt;
    for file in ["initial_admin_password", "registration_token"] {
        let meta = std::fs::metadata(data.join(file)).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600, "{file}");
    }
    let password = std::fs::read_to_string(data.join("initial_admin_password")).unwrap();
    let login: Value = http
        .post(format!("{base}/auth/login"))
        .json(&json!({"username": "admin", "password": password.trim()}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let changed: Value = http
        .post(format!("{base}/auth/change-password"))
        .bearer_auth(login["token"].as_str().unwrap())
        .json(&json!({"current_password": password.trim(), "new_password": "a-better-password"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let token = changed["token"].as_str().unwrap().to_string();
    let get = |path: String| {
        let http = http.clone();
        let token = token.clone();
        let base = base.clone();
        async move {
            http.get(format!("{base}{path}"))
                .bearer_auth(token)
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        }
    };

    // The embedded worker joined on its own.
    let mut workers = Value::Null;
    for _ in 0..100 {
        workers = get("/api/v1/workers".into()).await;
        if workers["pagination"]["total"] == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        workers["pagination"]["total"],
        1,
        "{workers}\n{}",
        tail(&gantry.log_text(), 30)
    );
    let worker_id = workers["items"][0]["id"].as_i64().unwrap();
    assert_eq!(workers["items"][0]["status"]["gpus"][0]["simulated"], true);

    let model = tiny_model(dir.path());
    let created: Value = http
        .post(format!("{base}/api/v1/models"))
        .bearer_auth(&token)
        .json(&manual_model_body("tiny", &model, 1))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    // The model controller creates the instance a moment after the model.
    let mut instances = Value::Null;
    for _ in 0..100 {
        instances = get(format!(
            "/api/v1/model-instances?model_id={}",
            created["id"]
        ))
        .await;
        if instances["pagination"]["total"] == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let id = instances["items"][0]["id"].as_i64().unwrap();
    let placed = http
        .patch(format!("{base}/api/v1/model-instances/{id}"))
        .bearer_auth(&token)
        .json(&json!({"worker_id": worker_id, "gpu_indexes": [0]}))
        .send()
        .await
        .unwrap();
    assert_eq!(placed.status(), 200);
    let mut instance = Value::Null;
    for _ in 0..600 {
        instance = get(format!("/api/v1/model-instances/{id}")).await;
        if instance["state"] == "running" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        instance["state"],
        "running",
        "{instance}\n{}",
        tail(&gantry.log_text(), 30)
    );
    chat(&http, instance["address"].as_str().unwrap()).await;

    // Following the log streams what is there and keeps the response open.
    let mut follow = http
        .get(format!(
            "{base}/api/v1/model-instances/{id}/logs?tail=5&follow=true"
        ))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(follow.status(), 200);
    let first = tokio::time::timeout(Duration::from_secs(10), follow.chunk())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(!first.is_empty());
    drop(follow);

    // SIGTERM: backends stopped, exit 0, nothing left behind.
    let children = descendants(gantry.pid());
    assert!(!children.is_empty());
    let status = gantry.terminate(Duration::from_secs(40));
    assert!(
        status.success(),
        "{status:?}\n{}",
        tail(&gantry.log_text(), 30)
    );
    for child in children {
        assert!(!common::alive(child), "child {child} outlived gantry start");
    }
}
