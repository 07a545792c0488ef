//! Stand-in backends (test doubles, not model servers) on loopback ports, for what a real
//! backend cannot be made to do on cue: answer 503, hang mid-stream, never answer.

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A stand-in backend (a test double, not a model server) that answers every request
/// with 503, as llama-server does while it loads a model.
pub async fn unavailable_backend() -> String {
    let body = "{\"error\":{\"message\":\"Loading model\"}}";
    gantry_testkit::gateway::fixed_answer_backend(format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    ))
    .await
}

/// A stand-in backend for the cancellation test (a test double, not a model server):
/// it answers one request with SSE headers and one event, then keeps the connection
/// open and reports when the gateway closes it.
pub async fn hanging_sse_backend() -> (String, tokio::sync::oneshot::Receiver<()>) {
    hanging_backend(true).await
}

/// Like [`hanging_sse_backend`]; with `answer: false` it never answers at all.
pub async fn hanging_backend(answer: bool) -> (String, tokio::sync::oneshot::Receiver<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let (closed_tx, closed_rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut request = Vec::new();
        let mut buffer = [0u8; 4096];
        while !request.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = socket.read(&mut buffer).await.unwrap();
            assert!(n > 0, "the gateway closed before sending a request");
            request.extend_from_slice(&buffer[..n]);
        }
        let event = "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n";
        let head = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{event}\r\n",
            event.len()
        );
        if answer {
            socket.write_all(head.as_bytes()).await.unwrap();
        }
        // Whatever else arrives is the rest of the request; EOF or a reset is the
        // gateway letting go.
        loop {
            match socket.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
        let _ = closed_tx.send(());
    });
    (address, closed_rx)
}
