//! The worker converges on each instance on its own, and a model change rolls its
//! replicas: `gantry start` as a real process, with real backends (a Python test backend
//! for the custom backend, the real `llama-server` for the roll), driven through the typed
//! client and the OpenAI-compatible gateway.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::{
    admin_client, alive, create_api_key, instances_of, start_gantry, tail, tiny_model,
    tiny_model_create,
};
use gantry_client::Client;
use gantry_types::{
    InstanceQuery, InstanceState, ModelCreate, ModelInstance, ModelUpdate, PlacementRecord,
};
use serde_json::json;

const ADMIN_PASSWORD: &str = "admin-password-1";

/// A test double of an inference backend: answers `/health` and writes its pid next to
/// the "model" it is given; with `--ignore-term` it ignores SIGTERM, like a backend that
/// takes its whole stop grace period.
const TEST_BACKEND: &str = r#"
import argparse, http.server, os, signal
parser = argparse.ArgumentParser()
parser.add_argument("--host")
parser.add_argument("--port", type=int)
parser.add_argument("--model")
parser.add_argument("--ignore-term", action="store_true")
args = parser.parse_args()
if args.ignore_term:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
with open(args.model + ".pid", "w") as f:
    f.write(str(os.getpid()))
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()
"#;

/// A CPU-only `custom` model running the test backend on `model` (a file whose pid file
/// the backend writes), with extra arguments.
fn custom_model(name: &str, script: &Path, model: &Path, args: &[&str]) -> ModelCreate {
    serde_json::from_value(json!({
        "name": name,
        "source": {"type": "local_path", "path": model.display().to_string()},
        "backend": "custom",
        "custom_command": format!(
            "python3 {} --host {{host}} --port {{port}} --model {{model_path}}",
            script.display()
        ),
        "backend_args": args,
        "env": {"GANTRY_GPU_COUNT": "0"},
        "replicas": 1,
    }))
    .unwrap()
}

async fn instances(client: &Client, model_id: i64) -> Vec<ModelInstance> {
    let query = InstanceQuery {
        model_id: Some(model_id),
        ..InstanceQuery::default()
    };
    client.list_instances(&query).await.unwrap().items
}

fn all_running(count: usize) -> impl Fn(&[ModelInstance]) -> bool {
    move |list| list.len() == count && list.iter().all(|i| i.state == InstanceState::Running)
}

fn read_pid(path: &Path) -> i32 {
    std::fs::read_to_string(path)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_ignores_sigterm_holds_up_no_other_instance() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("backend.py");
    std::fs::write(&script, TEST_BACKEND).unwrap();
    let (gantry, base) = start_gantry(
        dir.path(),
        &[
            "--bootstrap-password",
            ADMIN_PASSWORD,
            "--stop-grace-period",
            "30s",
        ],
    )
    .await;
    let client = admin_client(&base, ADMIN_PASSWORD).await;

    let stubborn_file = dir.path().join("stubborn.model");
    std::fs::write(&stubborn_file, b"weights").unwrap();
    let stubborn = client
        .create_model(&custom_model(
            "stubborn",
            &script,
            &stubborn_file,
            &["--ignore-term"],
        ))
        .await
        .unwrap();
    instances_of(
        &client,
        stubborn.id,
        "running",
        Duration::from_secs(30),
        &[&gantry],
        all_running(1),
    )
    .await;
    let stubborn_pid = read_pid(&dir.path().join("stubborn.model.pid"));

    // Removing the stubborn model starts its 30 s stop; a new model must not wait for it.
    let quick_file = dir.path().join("quick.model");
    std::fs::write(&quick_file, b"weights").unwrap();
    client.delete_model(stubborn.id).await.unwrap();
    let removed_at = tokio::time::Instant::now();
    let quick = client
        .create_model(&custom_model("quick", &script, &quick_file, &[]))
        .await
        .unwrap();
    instances_of(
        &client,
        quick.id,
        "running",
        Duration::from_secs(3),
        &[&gantry],
        all_running(1),
    )
    .await;
    let took = removed_at.elapsed();
    assert!(
        alive(stubborn_pid),
        "the stubborn backend is still in its stop grace period"
    );
    assert!(took < Duration::from_secs(3), "took {took:?}");
    println!("the new instance ran {took:?} after the stubborn one was removed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changing_a_models_arguments_rolls_its_replicas_without_failing_a_request() {
    let dir = tempfile::tempdir().unwrap();
    let (gantry, base) = start_gantry(
        dir.path(),
        &[
            "--bootstrap-password",
            ADMIN_PASSWORD,
            "--stop-grace-period",
            "5s",
        ],
    )
    .await;
    let client = admin_client(&base, ADMIN_PASSWORD).await;
    let key = create_api_key(&client, "roll").await;

    let model_file = tiny_model(dir.path());
    let body = tiny_model_create("tiny", &model_file, 2);
    let model = client.create_model(&body).await.unwrap();
    let before = instances_of(
        &client,
        model.id,
        "running",
        Duration::from_secs(60),
        &[&gantry],
        all_running(2),
    )
    .await;

    // Requests go through the gateway, one after another, for the whole roll.
    let stop = Arc::new(tokio::sync::Notify::new());
    let served = Arc::new(AtomicU64::new(0));
    let failures = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let traffic = {
        let (stop, served, failures) = (stop.clone(), served.clone(), failures.clone());
        let (http, base, key) = (reqwest::Client::new(), base.clone(), key.clone());
        tokio::spawn(async move {
            let mut streaming = false;
            loop {
                let request = http
                    .post(format!("{base}/v1/chat/completions"))
                    .bearer_auth(&key)
                    .json(&json!({
                        "model": "tiny",
                        "messages": [{"role": "user", "content": "hello"}],
                        "max_tokens": 4,
                        "stream": streaming,
                    }))
                    .send();
                let outcome = tokio::select! {
                    () = stop.notified() => return,
                    outcome = request => outcome,
                };
                let result = match outcome {
                    Ok(response) if response.status().is_success() => match response.text().await {
                        Ok(text) if !streaming || text.contains("[DONE]") => Ok(()),
                        Ok(text) => Err(format!("a stream cut short: {text}")),
                        Err(e) => Err(format!("reading the answer: {e}")),
                    },
                    Ok(response) => Err(format!(
                        "{}: {}",
                        response.status(),
                        response.text().await.unwrap_or_default()
                    )),
                    Err(e) => Err(format!("sending: {e}")),
                };
                match result {
                    Ok(()) => {
                        served.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => failures.lock().unwrap().push(e),
                }
                streaming = !streaming;
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Watch the instances while the model changes: at every moment one of them serves.
    let mut watch = client
        .watch_instances(&InstanceQuery {
            model_id: Some(model.id),
            ..InstanceQuery::default()
        })
        .await
        .unwrap();
    let mut args = body.backend_args.clone();
    args.extend(["--seed".to_owned(), "42".to_owned()]);
    client
        .update_model(
            model.id,
            &ModelUpdate {
                backend_args: Some(args.clone()),
                ..ModelUpdate::default()
            },
        )
        .await
        .unwrap();
    let rolled = |list: &[ModelInstance]| {
        all_running(2)(list)
            && list.iter().all(|i| {
                i.placement
                    .as_ref()
                    .is_some_and(|r: &PlacementRecord| r.launch.backend_args == args)
            })
    };
    let mut states: std::collections::BTreeMap<i64, InstanceState> =
        before.iter().map(|i| (i.id, i.state)).collect();
    let mut fewest_running = 2;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let event = tokio::time::timeout_at(deadline, watch.next())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "the roll did not finish; log:\n{}",
                    tail(&gantry.log_text(), 80)
                )
            })
            .expect("the watch stays open")
            .unwrap();
        if let Some((kind, instance)) = event.into_change() {
            if kind == gantry_types::ChangeKind::Deleted {
                states.remove(&instance.id);
            } else {
                states.insert(instance.id, instance.state);
            }
            let running = states
                .values()
                .filter(|s| **s == InstanceState::Running)
                .count();
            fewest_running = fewest_running.min(running);
            if rolled(&instances(&client, model.id).await) {
                break;
            }
        }
    }
    // A few more requests on the new settings, then stop the traffic.
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.notify_one();
    traffic.await.unwrap();

    let failures = failures.lock().unwrap().clone();
    let served = served.load(Ordering::Relaxed);
    println!("roll: {served} requests served, {} failed", failures.len());
    assert!(
        failures.is_empty(),
        "requests failed during the roll: {failures:#?}"
    );
    assert!(served > 10, "only {served} requests went through");
    assert_eq!(
        fewest_running, 1,
        "one replica at a time restarted, the other kept serving"
    );
}
