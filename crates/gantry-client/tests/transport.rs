//! What the client puts on the wire and how it reads the answers, against stand-in servers
//! (test doubles on loopback that record each request and give one canned answer): the
//! query string of lists and watches, which error answers send a call on to the next
//! server, and the success status each call expects.

#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};

use gantry_client::{Client, ClientError};
use gantry_types::{ErrorCode, InstanceQuery, InstanceState, LogQuery, ModelQuery, WatchEvent};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A stand-in server: answers every request with the same status, content type and body,
/// and remembers each request's target (`/path?query`).
struct StandIn {
    url: String,
    targets: Arc<Mutex<Vec<String>>>,
}

impl StandIn {
    async fn answering(status: &str, content_type: &str, body: &str) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let targets = Arc::new(Mutex::new(Vec::new()));
        let answer = format!(
            "HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        let recorded = Arc::clone(&targets);
        tokio::spawn(async move {
            loop {
                let Ok((mut socket, _)) = listener.accept().await else {
                    return;
                };
                let mut head = Vec::new();
                let mut buffer = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match socket.read(&mut buffer).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => head.extend_from_slice(&buffer[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&head).to_string();
                let target = head.split(' ').nth(1).unwrap_or_default().to_string();
                recorded.lock().unwrap().push(target);
                // The bodies these tests send are small and arrive with the head; the
                // connection closes after the answer.
                let _ = socket.write_all(answer.as_bytes()).await;
                let _ = socket.shutdown().await;
            }
        });
        StandIn { url, targets }
    }

    fn targets(&self) -> Vec<String> {
        self.targets.lock().unwrap().clone()
    }
}

/// The query parameters of a request target, in order.
fn query_pairs(target: &str) -> Vec<(String, String)> {
    let query = target.split_once('?').map(|(_, q)| q).unwrap_or_default();
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            (key.to_string(), value.to_string())
        })
        .collect()
}

const EMPTY_PAGE: &str = r#"{"items":[],"pagination":{"page":1,"per_page":100,"total":0}}"#;

#[tokio::test]
async fn a_watch_sends_watch_true_once_whatever_the_query_holds() {
    let server = StandIn::answering(
        "200 OK",
        "application/x-ndjson",
        "{\"type\":\"HEARTBEAT\"}\n",
    )
    .await;
    let client = Client::new(&server.url);
    for left_in_the_query in [None, Some(false), Some(true)] {
        let query = InstanceQuery {
            state: Some(InstanceState::Running),
            watch: left_in_the_query,
            ..InstanceQuery::default()
        };
        let mut events = client.watch_instances(&query).await.unwrap();
        assert_eq!(events.next().await.unwrap().unwrap(), WatchEvent::Heartbeat);
        assert!(events.next().await.is_none());
    }
    for target in server.targets() {
        assert!(target.starts_with("/api/v1/model-instances?"), "{target}");
        assert_eq!(
            query_pairs(&target),
            [
                ("state".into(), "running".into()),
                ("watch".into(), "true".into())
            ],
            "{target}"
        );
    }
    assert_eq!(server.targets().len(), 3);
}

#[tokio::test]
async fn a_list_sends_no_watch_whatever_the_query_holds() {
    let server = StandIn::answering("200 OK", "application/json", EMPTY_PAGE).await;
    let client = Client::new(&server.url);
    let query = ModelQuery {
        search: Some("tiny".into()),
        per_page: Some(10),
        watch: Some(true),
        ..ModelQuery::default()
    };
    let page = client.list_models(&query).await.unwrap();
    assert_eq!(page.pagination.total, 0);
    assert_eq!(
        query_pairs(&server.targets()[0]),
        [
            ("search".into(), "tiny".into()),
            ("per_page".into(), "10".into())
        ]
    );
}

#[tokio::test]
async fn a_worker_failure_reported_by_a_server_is_its_final_answer() {
    let first = StandIn::answering(
        "502 Bad Gateway",
        "application/json",
        r#"{"error":{"code":"worker_unreachable","message":"cannot reach worker w1"}}"#,
    )
    .await;
    let second = StandIn::answering("200 OK", "text/plain", "log lines").await;
    let client = Client::with_servers(vec![first.url.clone(), second.url.clone()]);
    let error = client
        .instance_logs(7, &LogQuery::default())
        .await
        .unwrap_err();
    assert_eq!(error.status(), Some(502), "{error}");
    assert_eq!(error.code(), Some(ErrorCode::WorkerUnreachable), "{error}");
    assert_eq!(error.message(), Some("cannot reach worker w1"));
    assert!(
        second.targets().is_empty(),
        "another server would reach the same worker"
    );
}

#[tokio::test]
async fn an_unavailable_server_passes_the_call_to_the_next() {
    let first = StandIn::answering(
        "503 Service Unavailable",
        "application/json",
        r#"{"error":{"code":"unavailable","message":"shutting down"}}"#,
    )
    .await;
    let second = StandIn::answering("200 OK", "application/json", EMPTY_PAGE).await;
    let client = Client::with_servers(vec![first.url.clone(), second.url.clone()]);
    client.list_models(&ModelQuery::default()).await.unwrap();
    assert_eq!(client.current_url(), second.url);
    assert_eq!(first.targets().len(), 1);

    // With no server left, the call is unreachable and says what the last one answered.
    let alone = Client::new(&first.url);
    let error = alone.list_models(&ModelQuery::default()).await.unwrap_err();
    assert!(
        matches!(&error, ClientError::Unreachable { tried: 1, last } if last.contains("shutting down")),
        "{error}"
    );
}

#[tokio::test]
async fn a_success_with_another_status_than_the_call_expects_is_an_error() {
    let server = StandIn::answering("200 OK", "application/json", "{}").await;
    let error = Client::new(&server.url).delete_model(1).await.unwrap_err();
    assert!(
        matches!(&error, ClientError::Decode { message, .. } if message.contains("204")),
        "{error}"
    );
    let server = StandIn::answering("204 No Content", "application/json", "").await;
    Client::new(&server.url).delete_model(1).await.unwrap();
}

#[tokio::test]
async fn a_client_for_another_token_leaves_the_first_client_its_own() {
    let server = StandIn::answering("200 OK", "application/json", EMPTY_PAGE).await;
    let admin = Client::new(&server.url).with_token("admin-token");
    let bob = admin.for_token("bob-token");
    assert_eq!(admin.token().as_deref(), Some("admin-token"));
    assert_eq!(bob.token().as_deref(), Some("bob-token"));
    let clone = admin.clone();
    clone.set_token("changed");
    assert_eq!(
        admin.token().as_deref(),
        Some("changed"),
        "clones share a token"
    );
    assert_eq!(bob.token().as_deref(), Some("bob-token"));
}
