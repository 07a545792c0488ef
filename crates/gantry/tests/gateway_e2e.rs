//! The main job end to end: `gantry start` (server and worker in one process), an API
//! key, a model with two replicas placed by the scheduler alone, chat completions
//! through the OpenAI-compatible gateway with the official `openai` Python package and
//! with curl, usage recorded, a killed backend not failing requests, and scaling to zero
//! stopping every backend.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{alive, tail, tiny_model, tiny_model_body};
use serde_json::{json, Value};

fn python() -> String {
    std::env::var("GANTRY_PYTHON").unwrap_or_else(|_| {
        panic!(
            "GANTRY_PYTHON is not set: run the tests with scripts/test.sh, which prepares a \
             Python with the openai package (scripts/python-env.sh)"
        )
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deploy_with_one_call_and_serve_through_the_gateway() {
    let python = python();
    let dir = tempfile::tempdir().unwrap();
    let (gantry, base) = common::start_gantry(
        dir.path(),
        &[
            "--bootstrap-password",
            "admin-password-1",
            "--simulate-gpus",
            "2x8GiB",
        ],
    )
    .await;
    let http = reqwest::Client::new();
    let login: Value = http
        .post(format!("{base}/auth/login"))
        .json(&json!({"username": "admin", "password": "admin-password-1"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let session = login["token"].as_str().unwrap().to_string();
    let key: Value = http
        .post(format!("{base}/api/v1/api-keys"))
        .bearer_auth(&session)
        .json(&json!({"name": "e2e"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let api_key = key["key"].as_str().unwrap().to_string();
    let get = |path: String| {
        let (http, key, base) = (http.clone(), api_key.clone(), base.clone());
        async move {
            http.get(format!("{base}{path}"))
                .bearer_auth(key)
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        }
    };

    // One call deploys the model; the scheduler places both replicas.
    let model = tiny_model(dir.path());
    let created = http
        .post(format!("{base}/api/v1/models"))
        .bearer_auth(&api_key)
        .json(&tiny_model_body("tiny", &model, 2))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    let model_id = created.json::<Value>().await.unwrap()["id"]
        .as_i64()
        .unwrap();
    let mut instances = Value::Null;
    for _ in 0..600 {
        instances = get(format!("/api/v1/model-instances?model_id={model_id}")).await;
        let items = instances["items"].as_array().unwrap();
        if items.len() == 2 && items.iter().all(|i| i["state"] == "running") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let items = instances["items"].as_array().unwrap().clone();
    assert!(
        items.len() == 2 && items.iter().all(|i| i["state"] == "running"),
        "{instances}\n{}",
        tail(&gantry.log_text(), 40)
    );
    assert!(items
        .iter()
        .all(|i| i["placement"]["reservation"].is_object()));

    // The official openai client, plain and streaming.
    let script = format!(
        r#"
import openai, sys
client = openai.OpenAI(base_url="{base}/v1", api_key="{api_key}")
reply = client.chat.completions.create(model="tiny", messages=[{{"role": "user", "content": "hi"}}], max_tokens=8)
assert reply.choices[0].message is not None, reply
assert reply.usage.completion_tokens > 0, reply
chunks = list(client.chat.completions.create(model="tiny", messages=[{{"role": "user", "content": "hi"}}], max_tokens=8, stream=True))
assert len(chunks) >= 2, chunks
assert any(c.choices and c.choices[0].delta.content for c in chunks), chunks
models = [m.id for m in client.models.list()]
assert models == ["tiny"], models
print("openai client ok")
"#
    );
    let output = std::process::Command::new(&python)
        .args(["-c", &script])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "openai client failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );

    // curl, plain and streaming.
    let curl = |body: Value| {
        std::process::Command::new("curl")
            .args([
                "-sS",
                "--fail-with-body",
                &format!("{base}/v1/chat/completions"),
            ])
            .args(["-H", &format!("Authorization: Bearer {api_key}")])
            .args([
                "-H",
                "Content-Type: application/json",
                "-d",
                &body.to_string(),
            ])
            .output()
            .unwrap()
    };
    let plain = curl(
        json!({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}),
    );
    assert!(
        plain.status.success(),
        "{}",
        String::from_utf8_lossy(&plain.stdout)
    );
    let reply: Value = serde_json::from_slice(&plain.stdout).unwrap();
    assert!(reply["choices"][0]["message"].is_object(), "{reply}");
    let stream = curl(
        json!({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "stream": true}),
    );
    let text = String::from_utf8_lossy(&stream.stdout).to_string();
    assert!(
        text.contains("data: ") && text.trim_end().ends_with("data: [DONE]"),
        "{text}"
    );

    // Usage was recorded against the key and the model.
    let mut usage = Value::Null;
    for _ in 0..50 {
        usage = get("/api/v1/usage".into()).await;
        if usage.to_string().contains("tiny") && usage.to_string().contains("completion_tokens") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(usage.to_string().contains("tiny"), "{usage}");

    // Kill one backend: requests keep succeeding through the other replica.
    let port_of = |i: &Value| i["port"].as_u64().unwrap() as u16;
    let victim = common::llama_pids_on(port_of(&items[0]));
    assert_eq!(victim.len(), 1);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(victim[0]),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    for _ in 0..6 {
        let response = http
            .post(format!("{base}/v1/chat/completions"))
            .bearer_auth(&api_key)
            .json(&json!({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{}", response.text().await.unwrap());
    }

    // Scaling to zero stops both backends.
    let mut pids = Vec::new();
    for _ in 0..600 {
        let now = get(format!("/api/v1/model-instances?model_id={model_id}")).await;
        let running: Vec<u16> = now["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|i| i["state"] == "running")
            .map(port_of)
            .collect();
        if running.len() == 2 {
            pids = running
                .iter()
                .flat_map(|p| common::llama_pids_on(*p))
                .collect();
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        pids.len(),
        2,
        "both replicas should run again before scaling down"
    );
    let scaled = http
        .patch(format!("{base}/api/v1/models/{model_id}"))
        .bearer_auth(&api_key)
        .json(&json!({"replicas": 0}))
        .send()
        .await
        .unwrap();
    assert_eq!(scaled.status(), 200);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(40);
    while pids.iter().any(|p| alive(*p)) && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        pids.iter().all(|p| !alive(*p)),
        "backends still running after scaling to 0"
    );
    let gone = http
        .post(format!("{base}/v1/chat/completions"))
        .bearer_auth(&api_key)
        .json(&json!({"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(gone.status(), 503);
}
