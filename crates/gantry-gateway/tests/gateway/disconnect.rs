//! A client that goes away, mid-stream or before the answer, cancels the request to the
//! backend: the gateway closes that connection and counts the request as ended.

use std::time::Duration;

use futures_util::StreamExt;
use reqwest::StatusCode;
use serde_json::json;

use crate::common::fake::{hanging_backend, hanging_sse_backend};
use crate::common::{metric, TestGateway};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_disconnect_cancels_the_upstream_request() {
    let gateway = TestGateway::start().await;
    let (address, closed) = hanging_sse_backend().await;
    gateway.deploy("slow", &[address]).await;
    let response = gateway
        .http
        .post(format!("{}/v1/chat/completions", gateway.base))
        .bearer_auth(&gateway.key)
        .json(&json!({"model": "slow", "messages": [], "stream": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.bytes_stream();
    let first = tokio::time::timeout(Duration::from_secs(10), body.next())
        .await
        .expect("the first event passes through without waiting for the rest")
        .unwrap()
        .unwrap();
    assert!(std::str::from_utf8(&first).unwrap().starts_with("data: "));
    let text = gateway.metrics().await;
    assert_eq!(
        metric(&text, "gantry_gateway_requests_in_flight"),
        1.0,
        "{text}"
    );
    assert_eq!(
        metric(
            &text,
            "gantry_gateway_instance_requests_in_flight{model=\"slow\",model_instance=\"slow-0\"}"
        ),
        1.0,
        "{text}"
    );

    // The client goes away: the gateway drops the upstream body, which closes the
    // connection to the backend.
    drop(body);
    tokio::time::timeout(Duration::from_secs(10), closed)
        .await
        .expect("the backend connection is closed when the client disconnects")
        .unwrap();
    let text = gateway.wait_idle("slow", "slow-0").await;
    assert_eq!(
        metric(
            &text,
            "gantry_gateway_errors_total{model=\"slow\",kind=\"client_disconnected\"}"
        ),
        1.0,
        "{text}"
    );
    gateway.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_disconnect_before_the_answer_cancels_the_upstream_request() {
    let gateway = TestGateway::start().await;
    let (address, closed) = hanging_backend(false).await;
    gateway.deploy("mute", &[address]).await;
    // The client gives up while the gateway still waits for the response head.
    let result = gateway
        .http
        .post(format!("{}/v1/chat/completions", gateway.base))
        .bearer_auth(&gateway.key)
        .timeout(Duration::from_millis(500))
        .json(&json!({"model": "mute", "messages": []}))
        .send()
        .await;
    assert!(result.unwrap_err().is_timeout());
    tokio::time::timeout(Duration::from_secs(10), closed)
        .await
        .expect("the backend connection is closed when the client gives up")
        .unwrap();
    gateway.wait_idle("mute", "mute-0").await;
    gateway.shutdown().await;
}
