//! Model routes and providers end to end: `gantry start` with a tiny GGUF on a real
//! llama-server as the local model, and an OpenAI-compatible provider process
//! (`fake_provider.py`, a test double of a hosted API that checks its key) behind one
//! public name.
//!
//! - 400 requests split 3:1 between the local model and the provider (within ±10 %);
//! - a provider answering 500 before its first byte falls through to the local model;
//! - stopping the local model mid-traffic sends everything to the provider with no
//!   failed request;
//! - a key limited to 60 requests a minute gets 429 with `Retry-After` on the 61st, and a
//!   key limited to other routes gets 403;
//! - a stream through the provider passes through as server-sent events;
//! - usage and metrics name the target that answered, with the provider's token counts;
//! - the provider's key appears in no API answer and no log line;
//! - with two servers on one PostgreSQL, a key's requests-per-minute limit holds across
//!   both: what one admitted counts on the other.

use crate::common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::{
    admin_client, instances_of, tiny_model, tiny_model_create, wait_gone, Cluster,
};
use gantry_testkit::{TestDatabase, TestEngine};
use gantry_types::{InstanceState, ModelUpdate};
use serde_json::{json, Value};

const PROVIDER_KEY: &str = "sk-provider-secret-7c1f9a2e5d";
const LOCAL: &str = "qwen";
const PROVIDER_TARGET: &str = "hosted/hosted-model";

fn python() -> String {
    std::env::var("GANTRY_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// One chat request for `model`: its status and `x-gantry-target`.
async fn chat(
    http: &reqwest::Client,
    base: &str,
    key: &str,
    model: &str,
) -> (u16, String, reqwest::header::HeaderMap) {
    let response = http
        .post(format!("{base}/v1/chat/completions"))
        .bearer_auth(key)
        .json(&json!({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}))
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let target = headers
        .get("x-gantry-target")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    let body = response.text().await.unwrap();
    assert!(
        !body.contains(PROVIDER_KEY),
        "a gateway answer holds the provider's key"
    );
    (status, target, headers)
}

/// `n` requests, `concurrency` at a time: how many each target answered, and the
/// failures (status and body target).
async fn burst(
    http: &reqwest::Client,
    base: &str,
    key: &str,
    model: &str,
    n: usize,
    concurrency: usize,
) -> (std::collections::BTreeMap<String, usize>, Vec<u16>) {
    let mut counts = std::collections::BTreeMap::new();
    let mut failures = Vec::new();
    let mut pending = Vec::new();
    for i in 0..n {
        let (http, base, key, model) = (
            http.clone(),
            base.to_string(),
            key.to_string(),
            model.to_string(),
        );
        pending.push(tokio::spawn(async move {
            chat(&http, &base, &key, &model).await
        }));
        if pending.len() == concurrency || i + 1 == n {
            for handle in pending.drain(..) {
                let (status, target, _) = handle.await.unwrap();
                if status == 200 {
                    *counts.entry(target).or_insert(0) += 1;
                } else {
                    failures.push(status);
                }
            }
        }
    }
    (counts, failures)
}

async fn control(http: &reqwest::Client, provider: &str, fail: Option<u16>) -> Value {
    gantry_testkit::answer_json(
        http.post(format!("{provider}/control"))
            .json(&json!({"fail": fail})),
    )
    .await
}

/// Starts `fake_provider.py` on a free port; returns it (killed when dropped) and its URL.
async fn start_provider(dir: &std::path::Path) -> (tokio::process::Child, String) {
    let provider_port = common::free_port();
    let provider_url = format!("http://127.0.0.1:{provider_port}");
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake_provider.py");
    let provider_log = std::fs::File::create(dir.join("provider.log")).unwrap();
    let provider = tokio::process::Command::new(python())
        .arg(&script)
        .args([
            "--port",
            &provider_port.to_string(),
            "--api-key",
            PROVIDER_KEY,
        ])
        .stdout(provider_log.try_clone().unwrap())
        .stderr(provider_log)
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let http = reqwest::Client::new();
    gantry_testkit::eventually(
        "the fake provider to listen",
        Duration::from_secs(20),
        Duration::from_millis(100),
        || async {
            Ok::<_, reqwest::Error>(
                http.get(format!("{provider_url}/control"))
                    .send()
                    .await?
                    .status(),
            )
        },
        |status| status.is_success(),
        String::new,
    )
    .await;

    (provider, provider_url)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_splits_falls_through_and_limits_keys() {
    let dir = tempfile::tempdir().unwrap();
    let (gantry, base) = common::start_gantry(
        dir.path(),
        &[
            "--bootstrap-password",
            "admin-password-1",
            "--simulate-gpus",
            "1x8GiB",
        ],
    )
    .await;
    let http = reqwest::Client::new();
    let admin = admin_client(&base, "admin-password-1").await;
    let token = admin.token().unwrap().to_string();
    let api = |method: reqwest::Method, path: &str| {
        http.request(method, format!("{base}/api/v1{path}"))
            .bearer_auth(&token)
    };

    // The provider: a separate OpenAI-compatible process that demands its key.
    let (_provider, provider_url) = start_provider(dir.path()).await;
    // The local model.
    let model = tiny_model(dir.path());
    let model_id = admin
        .create_model(&tiny_model_create(LOCAL, &model, 1))
        .await
        .unwrap()
        .id;
    let running = instances_of(
        &admin,
        model_id,
        "running",
        Duration::from_secs(60),
        &[&gantry],
        |items| items.len() == 1 && items[0].state == InstanceState::Running,
    )
    .await;

    // A provider: the key is accepted, never shown.
    let created = api(reqwest::Method::POST, "/model-providers")
        .json(&json!({"name": "hosted", "base_url": format!("{provider_url}/v1"), "api_key": PROVIDER_KEY, "timeout_seconds": 30}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    let created: Value = created.json().await.unwrap();
    assert_eq!(created["has_api_key"], true);
    let listed = gantry_testkit::answer_text(api(reqwest::Method::GET, "/model-providers")).await;
    assert!(!listed.contains(PROVIDER_KEY) && !created.to_string().contains(PROVIDER_KEY));
    let discovered: Value =
        gantry_testkit::answer_json(api(reqwest::Method::GET, "/model-providers/hosted/models"))
            .await;
    assert_eq!(
        discovered["models"],
        json!(["hosted-model"]),
        "{discovered}"
    );

    // Bad routes are refused, naming the field.
    let bad = api(reqwest::Method::POST, "/model-routes")
        .json(&json!({"name": "chat-default", "targets": [{"model": "no-such-model"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 422);
    assert!(bad.text().await.unwrap().contains("targets[0].model"));

    // The route: local weight 3, provider weight 1.
    let route = api(reqwest::Method::POST, "/model-routes")
        .json(&json!({"name": "chat-default", "targets": [
            {"model": LOCAL, "weight": 3},
            {"provider": "hosted", "model": "hosted-model", "weight": 1},
        ]}))
        .send()
        .await
        .unwrap();
    assert_eq!(route.status(), 201, "{}", route.text().await.unwrap());
    let key = common::create_api_key(&admin, "app").await;
    let listed: Value =
        gantry_testkit::answer_json(http.get(format!("{base}/v1/models")).bearer_auth(&key)).await;
    let ids: Vec<&str> = listed["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec!["chat-default", LOCAL]);

    // The split: 400 requests, 3:1 within ±10 %.
    let (counts, failures) = burst(&http, &base, &key, "chat-default", 400, 8).await;
    assert!(failures.is_empty(), "failed requests: {failures:?}");
    let local = counts.get(LOCAL).copied().unwrap_or(0) as f64;
    let hosted = counts.get(PROVIDER_TARGET).copied().unwrap_or(0) as f64;
    let ratio = local / hosted.max(1.0);
    println!("split of 400 requests: {counts:?} (ratio {ratio:.2})");
    assert!((2.7..=3.3).contains(&ratio), "split {counts:?}");
    // The provider was sent its own model name.
    let seen = control(&http, &provider_url, None).await;
    assert_eq!(
        seen["models"],
        json!({"hosted-model": hosted as u64}),
        "{seen}"
    );
    assert_eq!(seen["unauthorized"], 0);

    // A provider answering 500 before its first byte: its share falls through.
    control(&http, &provider_url, Some(500)).await;
    let (counts, failures) = burst(&http, &base, &key, "chat-default", 40, 4).await;
    assert!(
        failures.is_empty(),
        "failed requests while the provider fails: {failures:?}"
    );
    assert_eq!(counts.get(LOCAL), Some(&40), "{counts:?}");
    let seen = control(&http, &provider_url, None).await;
    assert!(
        seen["refused"].as_u64().unwrap() > 0,
        "the provider was tried: {seen}"
    );

    // Stopping the local model while traffic runs: everything goes to the provider, and
    // no request fails.
    let stop = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let mut load = Vec::new();
    for _ in 0..4 {
        let (http, base, key, stop, failed) = (
            http.clone(),
            base.clone(),
            key.clone(),
            Arc::clone(&stop),
            Arc::clone(&failed),
        );
        load.push(tokio::spawn(async move {
            let mut served = 0u64;
            while stop.load(Ordering::Relaxed) == 0 {
                let (status, _, _) = chat(&http, &base, &key, "chat-default").await;
                if status != 200 {
                    failed.fetch_add(1, Ordering::Relaxed);
                }
                served += 1;
            }
            served
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let port = running[0].port.unwrap();
    let pids = common::llama_pids_on(port);
    admin
        .update_model(
            model_id,
            &ModelUpdate {
                replicas: Some(0),
                ..ModelUpdate::default()
            },
        )
        .await
        .unwrap();
    wait_gone(&pids, "the local backend to stop", Duration::from_secs(40)).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(1, Ordering::Relaxed);
    let mut served = 0;
    for handle in load {
        served += handle.await.unwrap();
    }
    assert_eq!(
        failed.load(Ordering::Relaxed),
        0,
        "requests failed while the local model stopped ({served} sent)"
    );
    let (counts, failures) = burst(&http, &base, &key, "chat-default", 20, 4).await;
    assert!(failures.is_empty());
    assert_eq!(counts.get(PROVIDER_TARGET), Some(&20), "{counts:?}");
    println!("{served} requests during the stop, none failed");
    // A stream through the provider passes through as server-sent events; the usage
    // chunk the gateway asked for on the client's behalf is not passed on.
    let stream = http
        .post(format!("{base}/v1/chat/completions"))
        .bearer_auth(&key)
        .json(&json!({"model": "chat-default", "stream": true, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    assert_eq!(stream.headers()["x-gantry-target"], PROVIDER_TARGET);
    assert!(stream.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let events = stream.text().await.unwrap();
    assert!(
        events.contains("from the ") && events.contains("[DONE]"),
        "{events}"
    );
    assert!(!events.contains("\"usage\""), "{events}");

    // A key limited to 60 requests a minute: the 61st is refused with Retry-After.
    let limited = admin
        .create_api_key(&gantry_types::ApiKeyCreate {
            name: "limited".into(),
            requests_per_minute: Some(60),
            ..Default::default()
        })
        .await
        .unwrap()
        .key;
    let (_, failures) = burst(&http, &base, &limited, "chat-default", 60, 4).await;
    assert!(failures.is_empty(), "{failures:?}");
    let (status, _, headers) = chat(&http, &base, &limited, "chat-default").await;
    assert_eq!(status, 429);
    let retry_after: u64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry_after), "Retry-After {retry_after}");
    // A key limited to another route may not call this one.
    let other = admin
        .create_api_key(&gantry_types::ApiKeyCreate {
            name: "other-route".into(),
            allowed_routes: Some(vec![LOCAL.into()]),
            ..Default::default()
        })
        .await
        .unwrap()
        .key;
    assert_eq!(chat(&http, &base, &other, "chat-default").await.0, 403);
    // Nor does it see it listed (the key with no limit does).
    for (key, listed) in [(&other, false), (&key, true)] {
        let models =
            gantry_testkit::answer_text(http.get(format!("{base}/v1/models")).bearer_auth(key))
                .await;
        assert_eq!(models.contains("chat-default"), listed, "{models}");
    }

    // Usage names each target, with the provider's own token counts.
    let from = gantry_types::Timestamp::now().minus(Duration::from_secs(3600));
    let usage: Value = gantry_testkit::eventually(
        "usage per target to be written",
        Duration::from_secs(10),
        Duration::from_millis(200),
        || async {
            api(
                reqwest::Method::GET,
                &format!("/usage?model=chat-default&from={from}"),
            )
            .send()
            .await?
            .json::<Value>()
            .await
        },
        |usage: &Value| usage["targets"].as_array().is_some_and(|t| t.len() == 2),
        String::new,
    )
    .await;
    let hosted_usage = usage["targets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["target"] == PROVIDER_TARGET)
        .unwrap()
        .clone();
    let requests = hosted_usage["requests"].as_u64().unwrap();
    assert_eq!(
        hosted_usage["prompt_tokens"].as_u64().unwrap(),
        3 * requests,
        "{usage}"
    );
    assert_eq!(
        hosted_usage["completion_tokens"].as_u64().unwrap(),
        5 * requests,
        "{usage}"
    );
    let metrics = gantry_testkit::answer_text(http.get(format!("{base}/metrics"))).await;
    assert!(
        metrics.contains(&format!("gantry_gateway_target_requests_total{{model=\"chat-default\",target=\"{PROVIDER_TARGET}\"}}")),
        "{metrics}"
    );
    assert!(metrics.contains("gantry_gateway_target_fallthroughs_total{model=\"chat-default\",target=\"hosted/hosted-model\"}"));

    // The provider's key is in no answer, no log line and not in the database file.
    assert!(!metrics.contains(PROVIDER_KEY));
    let log = gantry.log_text();
    assert!(
        !log.contains(PROVIDER_KEY),
        "the provider's key is in the server log"
    );
    let dump = std::fs::read(dir.path().join("data/gantry.db")).unwrap_or_default();
    assert!(
        !String::from_utf8_lossy(&dump).contains(PROVIDER_KEY),
        "the provider's key is stored in clear"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_limit_holds_across_the_servers_of_a_cluster() {
    let db = TestDatabase::new(TestEngine::Postgres).await;
    let args = common::ha_server_args(&db.url);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let first = Cluster::start(&args).await;
    let second = Cluster::start(&args).await;
    let (_provider, provider_url) = start_provider(first.dir.path()).await;
    let http = reqwest::Client::new();
    let token = first.client().token().unwrap().to_string();
    for (path, body) in [
        (
            "/model-providers",
            json!({"name": "hosted", "base_url": format!("{provider_url}/v1"), "api_key": PROVIDER_KEY}),
        ),
        (
            "/model-routes",
            json!({"name": "chat", "targets": [{"provider": "hosted", "model": "hosted-model"}]}),
        ),
    ] {
        let created = http
            .post(format!("{}/api/v1{path}", first.base))
            .bearer_auth(&token)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(created.status(), 201);
    }
    let key = first
        .client()
        .create_api_key(&gantry_types::ApiKeyCreate {
            name: "shared-limit".into(),
            requests_per_minute: Some(20),
            ..Default::default()
        })
        .await
        .unwrap()
        .key;
    // The second server learns of the route and the key's limit from the first's writes.
    gantry_testkit::eventually(
        "the second server to serve the route",
        Duration::from_secs(15),
        Duration::from_millis(100),
        || async {
            Ok::<_, std::convert::Infallible>(chat(&http, &second.base, &key, "chat").await.0)
        },
        |status| *status == 200,
        String::new,
    )
    .await;

    // 11 more on the first server (12 in all), then time for the counts to be shared.
    let (_, failures) = burst(&http, &first.base, &key, "chat", 11, 4).await;
    assert!(failures.is_empty(), "{failures:?}");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    // The second admits what is left of the 20, and no more.
    let mut admitted = 0;
    let mut refused = None;
    for _ in 0..12 {
        let (status, _, headers) = chat(&http, &second.base, &key, "chat").await;
        match status {
            200 => admitted += 1,
            429 => {
                refused = Some(headers["retry-after"].to_str().unwrap().to_string());
                break;
            }
            other => panic!("unexpected status {other}"),
        }
    }
    assert_eq!(
        admitted, 8,
        "the second server admitted {admitted} after the first's 12"
    );
    assert!(refused.is_some(), "the 21st request was admitted");
    // And the first server now counts the second's as well.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(chat(&http, &first.base, &key, "chat").await.0, 429);
}
