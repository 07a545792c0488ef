//! Streamed chat completions from a real backend: SSE through the gateway, the usage
//! chunk the gateway asks for removed unless the client asked for it too, and the usage
//! booked either way.

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::common::raw::sse_payloads;
use crate::common::{sum_usage, TestGateway};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_arrives_as_sse_with_a_usage_chunk_only_when_asked() {
    let gateway = TestGateway::start().await;
    let backend = gateway.llama_server().await;
    gateway.deploy("tiny", &[backend.address()]).await;
    // Greedy decoding: sampled from the tiny random model, the few tokens can all be
    // partial UTF-8, which streams as no content at all (a single final chunk).
    let stream = |include_usage: Option<bool>| {
        let mut body = json!({"model": "tiny", "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 6, "stream": true, "temperature": 0});
        if let Some(include_usage) = include_usage {
            body["stream_options"] = json!({"include_usage": include_usage});
        }
        gateway
            .http
            .post(format!("{}/v1/chat/completions", gateway.base))
            .bearer_auth(&gateway.key)
            .json(&body)
            .send()
    };

    // Not asked: chunks end with [DONE] and none is a usage-only chunk, although the
    // gateway asked the backend for usage to record it.
    let response = stream(None).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(response.headers().get("x-gantry-instance").is_some());
    let payloads = sse_payloads(response).await;
    assert_eq!(
        payloads.last().map(String::as_str),
        Some("[DONE]"),
        "{payloads:#?}"
    );
    let chunks: Vec<Value> = payloads[..payloads.len() - 1]
        .iter()
        .map(|p| serde_json::from_str(p).unwrap())
        .collect();
    assert!(chunks.len() >= 2, "{payloads:#?}");
    for chunk in &chunks {
        assert_eq!(chunk["object"], "chat.completion.chunk", "{chunk}");
        assert!(
            !chunk["choices"].as_array().unwrap().is_empty(),
            "usage-only chunk leaked: {chunk}"
        );
        assert!(chunk.get("usage").is_none_or(Value::is_null), "{chunk}");
    }
    // …and the usage was still booked.
    gateway
        .usage_until("the streamed request with its tokens", |usage| {
            let sums = sum_usage(usage, |_| true);
            sums.requests == 1 && sums.completion_tokens > 0
        })
        .await;

    // Asked (also with include_usage explicitly false → treated as not asked).
    let payloads = sse_payloads(stream(Some(false)).await.unwrap()).await;
    assert!(
        payloads.iter().all(|p| !p.contains("\"choices\":[]")),
        "{payloads:#?}"
    );

    let payloads = sse_payloads(stream(Some(true)).await.unwrap()).await;
    assert_eq!(payloads.last().map(String::as_str), Some("[DONE]"));
    let usage_chunk: Value = serde_json::from_str(&payloads[payloads.len() - 2]).unwrap();
    assert_eq!(usage_chunk["choices"], json!([]), "{payloads:#?}");
    let completion_tokens = usage_chunk["usage"]["completion_tokens"].as_u64().unwrap();
    assert!(completion_tokens > 0);
    gateway
        .usage_until("three streamed requests", |usage| {
            sum_usage(usage, |_| true).requests == 3
        })
        .await;

    drop(backend);
    gateway.shutdown().await;
}
