//! `openai-responder`: a TEST DOUBLE for load benchmarks only — a minimal, fast
//! OpenAI-compatible server with no model behind it.
//!
//! - `POST /v1/chat/completions`, `POST /v1/completions`: a fixed small
//!   `chat.completion` JSON with `usage`; with `"stream": true`, server-sent events:
//!   four content chunks, a finish chunk, a usage-only chunk (`"choices": []`) when the
//!   request has `"include_usage": true`, then `data: [DONE]`;
//! - `GET /health`: `{"status":"ok"}`.
//!
//! Usage: `openai-responder --port 18001 [--host 127.0.0.1] [--threads 2]
//! [--chunk-interval-ms 0]` — with an interval, each SSE event waits that long before it
//! goes, so that many streams are open at once (`BENCH_STREAMS` in bench-gateway.sh).

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use futures_util::{stream, StreamExt};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use memchr::memmem;

type Body = UnsyncBoxBody<Bytes, Infallible>;

const COMPLETION: &str = r#"{"id":"chatcmpl-bench","object":"chat.completion","created":1700000000,"model":"bench","choices":[{"index":0,"message":{"role":"assistant","content":"This is a fixed answer from the benchmark responder."},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":11,"total_tokens":23}}"#;

const CHUNK: &str = "data: {\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"bench\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"word \"},\"finish_reason\":null}]}\n\n";
const FINISH: &str = "data: {\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"bench\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n";
const USAGE: &str = "data: {\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"bench\",\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":4,\"total_tokens\":16}}\n\n";
const DONE: &str = "data: [DONE]\n\n";

fn full(status: StatusCode, content_type: &'static str, body: &'static str) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from_static(body.as_bytes())).boxed_unsync());
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

/// The pause before each SSE event (`--chunk-interval-ms`), set once at start.
static CHUNK_INTERVAL: std::sync::OnceLock<std::time::Duration> = std::sync::OnceLock::new();

fn events(include_usage: bool) -> Response<Body> {
    let mut frames: Vec<&'static str> = vec![CHUNK, CHUNK, CHUNK, CHUNK, FINISH];
    if include_usage {
        frames.push(USAGE);
    }
    frames.push(DONE);
    let interval = CHUNK_INTERVAL.get().copied().unwrap_or_default();
    let mut response = if interval.is_zero() {
        let body = StreamBody::new(stream::iter(frames.into_iter().map(|event| {
            Ok::<_, Infallible>(Frame::data(Bytes::from_static(event.as_bytes())))
        })));
        Response::new(body.boxed_unsync())
    } else {
        let body = StreamBody::new(stream::iter(frames).then(move |event| async move {
            tokio::time::sleep(interval).await;
            Ok::<_, Infallible>(Frame::data(Bytes::from_static(event.as_bytes())))
        }));
        Response::new(body.boxed_unsync())
    };
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    response
}

fn mentions(body: &[u8], key: &str, value: &str) -> bool {
    // A test double: the exact spellings clients and proxies send are enough.
    [format!("\"{key}\":{value}"), format!("\"{key}\": {value}")]
        .iter()
        .any(|needle| memmem::find(body, needle.as_bytes()).is_some())
}

async fn handle(request: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    Ok(match (method, path.as_str()) {
        (Method::GET, "/health") => full(StatusCode::OK, "application/json", "{\"status\":\"ok\"}"),
        (Method::POST, "/v1/chat/completions" | "/v1/completions") => {
            let body = match request.into_body().collect().await {
                Ok(collected) => collected.to_bytes(),
                Err(_) => return Ok(full(StatusCode::BAD_REQUEST, "text/plain", "bad body")),
            };
            if mentions(&body, "stream", "true") {
                events(mentions(&body, "include_usage", "true"))
            } else {
                full(StatusCode::OK, "application/json", COMPLETION)
            }
        }
        _ => full(StatusCode::NOT_FOUND, "text/plain", "not found"),
    })
}

fn argument(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let port: u16 = argument(&args, "--port")
        .ok_or("usage: openai-responder --port PORT [--host HOST] [--threads N]")?
        .parse()?;
    let host = argument(&args, "--host").unwrap_or_else(|| "127.0.0.1".to_string());
    let threads: usize = match argument(&args, "--threads") {
        Some(n) => n.parse()?,
        None => 2,
    };
    if let Some(ms) = argument(&args, "--chunk-interval-ms") {
        let _ = CHUNK_INTERVAL.set(std::time::Duration::from_millis(ms.parse()?));
    }
    let address: SocketAddr = format!("{host}:{port}").parse()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(address).await?;
        eprintln!("openai-responder (benchmark test double) listening on {address}");
        loop {
            let (socket, _) = listener.accept().await?;
            let _ = socket.set_nodelay(true);
            tokio::spawn(async move {
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(socket), service_fn(handle))
                    .await;
            });
        }
    })
}
