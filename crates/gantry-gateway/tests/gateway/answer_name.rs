//! The answer names the model the client asked for, whatever the backend calls it: a
//! backend that answers with its file path (a stand-in here, a test double: what
//! llama-server says without `--alias`, or a custom command) is renamed to the deployed
//! model's name, and a route's answer to the route's name, in plain and streamed answers.

use std::time::Duration;

use gantry_types::{ModelRoute, RouteTarget, Timestamp};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::common::raw::sse_payloads;
use crate::common::TestGateway;

const PATH: &str = "/var/lib/gantry/models/tiny.gguf";

fn plain_answer() -> String {
    // The `model` comes after a long `choices`, as llama-server orders its fields; a
    // `model` key inside the content is not the answer's.
    let body = json!({
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "{\"model\": \"x\"}"}}],
        "created": 1,
        "model": PATH,
        "object": "chat.completion",
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    })
    .to_string();
    format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
}

fn stream_answer() -> String {
    let mut body = String::new();
    for event in [
        json!({"model": PATH, "choices": [{"index": 0, "delta": {"content": "hi"}}]}),
        json!({"model": PATH, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
        json!({"model": PATH, "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}),
    ] {
        let event = format!("data: {event}\n\n");
        body.push_str(&format!("{:x}\r\n{event}\r\n", event.len()));
    }
    body.push_str("e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n");
    format!("HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n{body}")
}

/// A stand-in backend (a test double) that answers JSON when the request asks for no
/// stream and SSE when it does; `split` sends a JSON answer's body in two writes 50 ms
/// apart, so that the gateway has only its head and part of it at first.
async fn path_naming_backend(split: bool) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buffer = [0u8; 8192];
                loop {
                    match socket.read(&mut buffer).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buffer[..n]),
                    }
                    let Some(end) = request.windows(4).position(|w| w == b"\r\n\r\n") else {
                        continue;
                    };
                    let head = String::from_utf8_lossy(&request[..end]).to_ascii_lowercase();
                    let length: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .map_or(0, |v| v.trim().parse().unwrap());
                    if request.len() < end + 4 + length {
                        continue;
                    }
                    let body: Value =
                        serde_json::from_slice(&request[end + 4..end + 4 + length]).unwrap();
                    request.clear();
                    let answer = if body["stream"] == true {
                        stream_answer()
                    } else {
                        plain_answer()
                    };
                    let cut = if split && body["stream"] != true {
                        answer.len() - 40
                    } else {
                        answer.len()
                    };
                    if socket.write_all(&answer.as_bytes()[..cut]).await.is_err() {
                        return;
                    }
                    if cut < answer.len() {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        if socket.write_all(&answer.as_bytes()[cut..]).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    address
}

async fn plain(gateway: &TestGateway, model: &str) -> (Value, Option<String>) {
    let response = gateway
        .http
        .post(format!("{}/v1/chat/completions", gateway.base))
        .bearer_auth(&gateway.key)
        .json(&json!({"model": model, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let length = response
        .headers()
        .get("content-length")
        .map(|v| v.to_str().unwrap().to_owned());
    let text = response.text().await.unwrap();
    if let Some(length) = &length {
        assert_eq!(
            length.parse::<usize>().unwrap(),
            text.len(),
            "the length is the renamed body's"
        );
    }
    (serde_json::from_str(&text).unwrap(), length)
}

async fn streamed(gateway: &TestGateway, model: &str) -> Vec<String> {
    let response = gateway
        .http
        .post(format!("{}/v1/chat/completions", gateway.base))
        .bearer_auth(&gateway.key)
        .json(&json!({"model": model, "stream": true, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    sse_payloads(response).await
}

fn assert_named(answer: &Value, name: &str) {
    assert_eq!(answer["model"], name, "{answer}");
    // The content's own `model` is the backend's text, untouched.
    assert_eq!(
        answer["choices"][0]["message"]["content"],
        "{\"model\": \"x\"}"
    );
    assert_eq!(answer["usage"]["total_tokens"], 5);
}

fn assert_events_named(payloads: &[String], name: &str) {
    assert_eq!(
        payloads.last().map(String::as_str),
        Some("[DONE]"),
        "{payloads:?}"
    );
    let events: Vec<Value> = payloads[..payloads.len() - 1]
        .iter()
        .map(|p| serde_json::from_str(p).unwrap())
        .collect();
    // The usage-only event the gateway asked for on the client's behalf is not passed on.
    assert_eq!(events.len(), 2, "{payloads:?}");
    for event in &events {
        assert_eq!(event["model"], name, "{event}");
    }
    assert_eq!(events[0]["choices"][0]["delta"]["content"], "hi");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_name_the_model_or_route_the_client_asked_for() {
    let gateway = TestGateway::start().await;
    gateway
        .deploy("tiny", &[path_naming_backend(false).await])
        .await;
    gateway
        .deploy("tiny-split", &[path_naming_backend(true).await])
        .await;

    // A whole answer keeps its length framing, with the renamed body's length.
    let (answer, length) = plain(&gateway, "tiny").await;
    assert_named(&answer, "tiny");
    assert!(length.is_some());
    // One still arriving when its head came goes out chunked, renamed all the same.
    let (answer, _) = plain(&gateway, "tiny-split").await;
    assert_named(&answer, "tiny-split");
    assert_events_named(&streamed(&gateway, "tiny").await, "tiny");

    // A route answers with its own name, whatever its target is called.
    let now = Timestamp::now();
    gateway.store.put_route(ModelRoute {
        id: 900,
        name: "assistant".into(),
        description: String::new(),
        targets: vec![RouteTarget {
            model: "tiny".into(),
            provider: None,
            weight: 1,
            priority: 0,
        }],
        created_at: now,
        updated_at: now,
    });
    let mut renamed = None;
    for _ in 0..100 {
        let response = gateway
            .http
            .post(format!("{}/v1/chat/completions", gateway.base))
            .bearer_auth(&gateway.key)
            .json(&json!({"model": "assistant", "messages": []}))
            .send()
            .await
            .unwrap();
        if response.status() == 200 {
            renamed = Some(response.json::<Value>().await.unwrap());
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_named(
        &renamed.expect("the route is served within 5 s"),
        "assistant",
    );
    assert_events_named(&streamed(&gateway, "assistant").await, "assistant");
    gateway.shutdown().await;
}
