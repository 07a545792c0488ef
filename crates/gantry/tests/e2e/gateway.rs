//! The main job end to end: `gantry start` (server and worker in one process), an API
//! key, a model with two replicas placed by the scheduler alone, chat completions
//! through the OpenAI-compatible gateway with the official `openai` Python package and
//! with curl, usage recorded, a killed backend not failing requests, and scaling to zero
//! stopping every backend.
//!
//! The management API is called through the typed client. The gateway (`/v1/*`) is
//! called raw — with the openai package, curl and reqwest — because the test is about
//! that OpenAI-compatible wire, which the client does not cover.

use crate::common;

use std::time::Duration;

use crate::common::{
    admin_client, instances_of, poll, tiny_model, tiny_model_create, wait_gone, Process,
};
use gantry_client::Client;
use gantry_types::usage::UsageQuery;
use gantry_types::{InstanceState, ModelInstance, ModelUpdate};
use serde_json::{json, Value};

/// The model's instances once both replicas run.
async fn both_running(
    client: &Client,
    model_id: i64,
    what: &str,
    gantry: &Process,
) -> Vec<ModelInstance> {
    instances_of(
        client,
        model_id,
        what,
        Duration::from_secs(60),
        &[gantry],
        |instances| {
            instances.len() == 2 && instances.iter().all(|i| i.state == InstanceState::Running)
        },
    )
    .await
}

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
    let session = admin_client(&base, "admin-password-1").await;
    let api_key = common::create_api_key(&session, "e2e").await;
    let client = session.for_token(&api_key);

    // One call deploys the model; the scheduler places both replicas.
    let model = tiny_model(dir.path());
    let model_id = client
        .create_model(&tiny_model_create("tiny", &model, 2))
        .await
        .unwrap()
        .id;
    let items = both_running(&client, model_id, "running", &gantry).await;
    assert!(items.iter().all(|i| i
        .placement
        .as_ref()
        .is_some_and(|record| record.reservation.is_some())));

    // The official openai client, plain and streaming. The stream decodes greedily: sampled
    // from the tiny random model, its few tokens can all be partial UTF-8, which streams as
    // no content at all (a single final chunk).
    let script = format!(
        r#"
import openai, sys
client = openai.OpenAI(base_url="{base}/v1", api_key="{api_key}")
reply = client.chat.completions.create(model="tiny", messages=[{{"role": "user", "content": "hi"}}], max_tokens=8)
assert reply.choices[0].message is not None, reply
assert reply.usage.completion_tokens > 0, reply
assert reply.model == "tiny", reply.model
chunks = list(client.chat.completions.create(model="tiny", messages=[{{"role": "user", "content": "hi"}}], max_tokens=8, stream=True, temperature=0))
assert len(chunks) >= 2, chunks
assert all(c.model == "tiny" for c in chunks), [c.model for c in chunks]
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
    // The answer names the model as the client did, never the file's path on the server.
    assert_eq!(reply["model"], "tiny", "{reply}");
    let stream = curl(
        json!({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "stream": true}),
    );
    let text = String::from_utf8_lossy(&stream.stdout).to_string();
    assert!(
        text.contains("data: ") && text.trim_end().ends_with("data: [DONE]"),
        "{text}"
    );
    let events: Vec<Value> = text
        .lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .filter(|data| *data != "[DONE]")
        .map(|data| serde_json::from_str(data).unwrap())
        .collect();
    assert!(!events.is_empty(), "{text}");
    assert!(
        events.iter().all(|event| event["model"] == "tiny"),
        "{text}"
    );

    // Usage was recorded against the key and the model.
    let everything = UsageQuery::default();
    poll(
        "usage of the model tiny",
        Duration::from_secs(10),
        &[&gantry],
        || client.usage(&everything),
        |report| report.models.iter().any(|m| m.model == "tiny"),
    )
    .await;

    // Kill one backend: requests keep succeeding through the other replica.
    let port_of = |i: &ModelInstance| i.port.unwrap();
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
    let running = both_running(&client, model_id, "running again", &gantry).await;
    let pids: Vec<i32> = running
        .iter()
        .flat_map(|i| common::llama_pids_on(port_of(i)))
        .collect();
    assert_eq!(
        pids.len(),
        2,
        "both replicas should run again before scaling down"
    );
    let to_zero = ModelUpdate {
        replicas: Some(0),
        ..ModelUpdate::default()
    };
    client.update_model(model_id, &to_zero).await.unwrap();
    wait_gone(
        &pids,
        "the backends to stop after scaling to 0",
        Duration::from_secs(40),
    )
    .await;
    let gone = http
        .post(format!("{base}/v1/chat/completions"))
        .bearer_auth(&api_key)
        .json(&json!({"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(gone.status(), 503);
}
