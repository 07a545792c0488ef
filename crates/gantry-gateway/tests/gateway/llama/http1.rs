//! The gateway's HTTP/1.1 on raw connections, against a real llama-server.

use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::common::raw::{raw_post, read_raw_response};
use crate::common::TestGateway;

/// The gateway's HTTP/1.1 on raw connections, against a real llama-server: keep-alive
/// and pipelined requests, streaming, `Expect: 100-continue`, a connection that moves
/// on to the router behind the hot routes (the gateway's own, then the server's), a
/// chunked request body, an error that keeps the connection, `Connection: close`, and a
/// kept connection closed once the server drains.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_speaks_http1_on_raw_connections() {
    let gateway = TestGateway::start().await;
    let llama = gateway.llama_server().await;
    gateway.deploy("tiny", &[llama.address()]).await;
    let address = gateway.address().to_string();
    let key = gateway.key.clone();
    let completion = json!({"model": "tiny", "prompt": "hello", "max_tokens": 2});
    let chat =
        json!({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
    let streamed = json!({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": true});

    // Three requests in one write, then answers in order on the same connection.
    let mut stream = tokio::net::TcpStream::connect(&address).await.unwrap();
    let mut buf = Vec::new();
    let mut pipelined = raw_post("/v1/completions", &key, &completion, "");
    pipelined.extend(raw_post("/v1/chat/completions", &key, &streamed, ""));
    pipelined.extend(raw_post("/v1/chat/completions", &key, &chat, ""));
    stream.write_all(&pipelined).await.unwrap();
    let first = read_raw_response(&mut stream, &mut buf).await;
    assert_eq!(first.status, 200, "{first:?}");
    assert_eq!(first.header("x-gantry-instance"), Some("tiny-0"));
    assert_eq!(first.json()["object"], "text_completion", "{first:?}");
    let second = read_raw_response(&mut stream, &mut buf).await;
    assert_eq!(second.status, 200, "{second:?}");
    assert!(second
        .header("content-type")
        .unwrap()
        .starts_with("text/event-stream"));
    let events = String::from_utf8(second.body.clone()).unwrap();
    assert!(events.starts_with("data: "), "{events}");
    assert!(events.trim_end().ends_with("data: [DONE]"), "{events}");
    let third = read_raw_response(&mut stream, &mut buf).await;
    assert_eq!(third.status, 200, "{third:?}");
    assert_eq!(third.json()["object"], "chat.completion", "{third:?}");
    assert!(buf.is_empty(), "nothing follows the three answers");

    // The same connection moves on to the router (the gateway's `/v1/models`, then the
    // server's fallback), then back to the hot routes.
    stream
        .write_all(
            format!(
                "GET /v1/models HTTP/1.1\r\nhost: gantry\r\nauthorization: Bearer {key}\r\n\r\n"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let models = read_raw_response(&mut stream, &mut buf).await;
    assert_eq!(models.status, 200, "{models:?}");
    assert_eq!(models.json()["data"][0]["id"], "tiny", "{models:?}");
    stream
        .write_all(b"GET /fallback HTTP/1.1\r\nhost: gantry\r\n\r\n")
        .await
        .unwrap();
    let fallback = read_raw_response(&mut stream, &mut buf).await;
    assert_eq!(fallback.status, 200, "{fallback:?}");
    assert_eq!(fallback.body, b"the fallback", "{fallback:?}");
    stream
        .write_all(&raw_post("/v1/completions", &key, &completion, ""))
        .await
        .unwrap();
    let after = read_raw_response(&mut stream, &mut buf).await;
    assert_eq!(after.status, 200, "{after:?}");
    assert_eq!(after.json()["object"], "text_completion");

    // Expect: 100-continue: the body is sent once the gateway asks for it.
    let mut stream = tokio::net::TcpStream::connect(&address).await.unwrap();
    let mut buf = Vec::new();
    let request = raw_post(
        "/v1/completions",
        &key,
        &completion,
        "expect: 100-continue\r\n",
    );
    let split = request.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    stream.write_all(&request[..split]).await.unwrap();
    let interim = read_raw_response(&mut stream, &mut buf).await;
    assert_eq!(interim.status, 100, "{interim:?}");
    stream.write_all(&request[split..]).await.unwrap();
    let answered = read_raw_response(&mut stream, &mut buf).await;
    assert_eq!(answered.status, 200, "{answered:?}");
    assert_eq!(answered.json()["object"], "text_completion");

    // A chunked request body is served too (by the general HTTP server).
    let body = completion.to_string();
    let (front, back) = body.split_at(10);
    let request = format!(
        "POST /v1/completions HTTP/1.1\r\nhost: gantry\r\nauthorization: Bearer {key}\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{front}\r\n{:x}\r\n{back}\r\n0\r\n\r\n",
        front.len(),
        back.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let chunked = read_raw_response(&mut stream, &mut buf).await;
    assert_eq!(chunked.status, 200, "{chunked:?}");
    assert_eq!(chunked.json()["object"], "text_completion");

    // A refused key is an OpenAI error that keeps the connection; `Connection: close`
    // is answered, then the connection ends.
    let mut stream = tokio::net::TcpStream::connect(&address).await.unwrap();
    let mut buf = Vec::new();
    stream
        .write_all(&raw_post(
            "/v1/completions",
            "gantry-not-a-key",
            &completion,
            "",
        ))
        .await
        .unwrap();
    let refused = read_raw_response(&mut stream, &mut buf).await;
    assert_eq!(refused.status, 401, "{refused:?}");
    assert_eq!(
        refused.json()["error"]["code"],
        "invalid_api_key",
        "{refused:?}"
    );
    stream
        .write_all(&raw_post(
            "/v1/completions",
            &key,
            &completion,
            "connection: close\r\n",
        ))
        .await
        .unwrap();
    let last = read_raw_response(&mut stream, &mut buf).await;
    assert_eq!(last.status, 200, "{last:?}");
    assert_eq!(last.header("connection"), Some("close"), "{last:?}");
    let mut rest = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut rest))
        .await
        .expect("the gateway closes the connection after the answer")
        .unwrap_or(0);
    assert_eq!(n, 0, "nothing follows a `Connection: close` answer");

    // While the server drains, an answer on a kept connection closes it (the client
    // moves to another server).
    let mut stream = tokio::net::TcpStream::connect(&address).await.unwrap();
    let mut buf = Vec::new();
    stream
        .write_all(&raw_post("/v1/completions", &key, &completion, ""))
        .await
        .unwrap();
    let before = read_raw_response(&mut stream, &mut buf).await;
    assert_eq!(before.status, 200, "{before:?}");
    assert_eq!(before.header("connection"), None, "{before:?}");
    gateway.drain();
    stream
        .write_all(&raw_post("/v1/completions", &key, &completion, ""))
        .await
        .unwrap();
    let draining = read_raw_response(&mut stream, &mut buf).await;
    assert_eq!(draining.status, 200, "{draining:?}");
    assert_eq!(draining.header("connection"), Some("close"), "{draining:?}");
    gateway.shutdown().await;
    drop(llama);
}
