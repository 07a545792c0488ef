//! Chat and legacy completions proxied to a real backend, the usage it reports booked per
//! caller and model, and the counters of `/metrics` as Prometheus and the dashboard read
//! them.

use gantry_testkit::gateway::assert_one_instance_running_on_one_ready_worker;
use reqwest::StatusCode;
use serde_json::json;

use crate::common::prometheus::{dashboard_queries_fit, promtool_accepts};
use crate::common::{metric, sum_usage, TestGateway};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_and_completions_are_proxied_and_usage_is_recorded() {
    let gateway = TestGateway::start().await;
    let backend = gateway.llama_server().await;
    gateway.deploy("tiny", &[backend.address()]).await;

    let mut prompt_tokens = 0;
    let mut completion_tokens = 0;
    for _ in 0..3 {
        let (status, served_by, reply) = gateway.chat("tiny").await;
        assert_eq!(status, StatusCode::OK, "{reply}\n{}", backend.log_tail());
        assert_eq!(served_by.as_deref(), Some("tiny-0"));
        assert_eq!(reply["object"], "chat.completion", "{reply}");
        assert_eq!(reply["choices"][0]["message"]["role"], "assistant");
        prompt_tokens += reply["usage"]["prompt_tokens"].as_u64().unwrap();
        completion_tokens += reply["usage"]["completion_tokens"].as_u64().unwrap();
    }
    assert!(prompt_tokens > 0 && completion_tokens > 0);

    // The legacy completions endpoint.
    let (status, _, reply) = gateway
        .post(
            "/v1/completions",
            Some(&gateway.key),
            json!({"model": "tiny", "prompt": "hello", "max_tokens": 3}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    assert_eq!(reply["object"], "text_completion", "{reply}");
    prompt_tokens += reply["usage"]["prompt_tokens"].as_u64().unwrap();
    completion_tokens += reply["usage"]["completion_tokens"].as_u64().unwrap();

    // Usage per model and per key, exactly what the backend reported, booked to the
    // key's user, the model as its own target, each on a minute's start.
    let key_id = gateway.key_id;
    let usage = gateway
        .usage_until("four requests of the key", |usage| {
            sum_usage(usage, |i| i.api_key_id == Some(key_id)).requests == 4
        })
        .await;
    let tiny = sum_usage(&usage, |i| i.model == "tiny");
    assert_eq!(tiny.requests, 4, "{usage:?}");
    assert_eq!(tiny.prompt_tokens, prompt_tokens, "{usage:?}");
    assert_eq!(tiny.completion_tokens, completion_tokens, "{usage:?}");
    assert_eq!(
        tiny.total_tokens,
        prompt_tokens + completion_tokens,
        "{usage:?}"
    );
    for increment in &usage {
        assert_eq!(increment.user_id, gateway.admin_id, "{increment:?}");
        assert_eq!(increment.target, "tiny", "{increment:?}");
        assert_eq!(
            increment.minute_start.as_millis() % 60_000,
            0,
            "{increment:?}"
        );
    }

    // A session token works too, booked without a key.
    let (status, _, _) = gateway
        .post(
            "/v1/chat/completions",
            Some(&gateway.session),
            json!({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let usage = gateway
        .usage_until("a request without a key", |usage| {
            sum_usage(usage, |i| i.api_key_id.is_none()).requests == 1
        })
        .await;
    let session_rows: Vec<_> = usage.iter().filter(|i| i.api_key_id.is_none()).collect();
    assert!(
        session_rows.iter().all(|i| i.user_id == gateway.admin_id),
        "{usage:?}"
    );

    // Another user's key is booked to that user and that key.
    let (alice, alice_key) = gateway.create_user("alice").await;
    let (status, _, _) = gateway
        .post(
            "/v1/chat/completions",
            Some(&alice_key),
            json!({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let usage = gateway
        .usage_until("alice's request", |usage| {
            sum_usage(usage, |i| i.user_id == alice).requests == 1
        })
        .await;
    let alices: Vec<_> = usage.iter().filter(|i| i.user_id == alice).collect();
    assert!(
        alices
            .iter()
            .all(|i| i.api_key_id.is_some() && i.api_key_id != Some(key_id)),
        "{usage:?}"
    );
    assert_eq!(sum_usage(&usage, |_| true).requests, 6, "{usage:?}");

    // The counters moved.
    let text = gateway.metrics().await;
    assert!(
        metric(
            &text,
            "gantry_gateway_requests_total{model=\"tiny\",code=\"200\"}"
        ) >= 6.0,
        "{text}"
    );
    assert!(
        metric(&text, "gantry_gateway_prompt_tokens_total{model=\"tiny\"}") >= prompt_tokens as f64,
        "{text}"
    );
    assert!(
        metric(
            &text,
            "gantry_gateway_completion_tokens_total{model=\"tiny\"}"
        ) >= completion_tokens as f64,
        "{text}"
    );
    assert!(
        metric(
            &text,
            "gantry_gateway_request_duration_seconds_count{model=\"tiny\"}"
        ) >= 6.0,
        "{text}"
    );
    assert_eq!(
        metric(&text, "gantry_gateway_requests_in_flight"),
        0.0,
        "{text}"
    );
    assert_one_instance_running_on_one_ready_worker(&text);
    assert!(
        text.contains("# TYPE gantry_gateway_request_duration_seconds histogram"),
        "{text}"
    );
    // With every kind of series present, the exposition passes Prometheus' own check,
    // and the Grafana dashboard asks only for what it has.
    promtool_accepts(&text);
    dashboard_queries_fit(&text);

    drop(backend);
    gateway.shutdown().await;
}
