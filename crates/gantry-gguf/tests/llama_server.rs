//! End to end: the tiny model this crate writes is loaded and served by a real llama.cpp
//! `llama-server`, which answers an OpenAI-style chat completion.
//!
//! The server binary comes from `GANTRY_LLAMA_SERVER`; build it with
//! `scripts/build-llama-server.sh`, which prints its path:
//!
//! ```sh
//! GANTRY_LLAMA_SERVER=$(scripts/build-llama-server.sh) cargo test -p gantry-gguf
//! ```
//!
//! Without the variable the test fails (it never skips silently). HTTP is spoken by hand
//! over a `TcpStream` (HTTP/1.1, `Connection: close`) to keep the dependencies small.

use std::fs::File;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gantry_gguf::tiny_llama::TINY_LLAMA_CHAT_TEMPLATE;
use gantry_gguf::{write_tiny_llama, GgufFile};

/// How long the server may take to load the model and report healthy.
const READY_DEADLINE: Duration = Duration::from_secs(60);
/// How long one HTTP exchange may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

fn llama_server_binary() -> PathBuf {
    let Some(path) = std::env::var_os("GANTRY_LLAMA_SERVER") else {
        panic!(
            "GANTRY_LLAMA_SERVER is not set. This test needs a real llama.cpp llama-server: \
             run `GANTRY_LLAMA_SERVER=$(scripts/build-llama-server.sh) cargo test -p gantry-gguf` \
             (the script builds it once, about ten minutes, and caches it)."
        );
    };
    let path = PathBuf::from(path);
    assert!(
        path.is_file(),
        "GANTRY_LLAMA_SERVER={} is not a file; run scripts/build-llama-server.sh and use the \
         path it prints",
        path.display()
    );
    path
}

/// Kills and reaps the server however the test ends, panics included.
struct ServerGuard {
    child: Child,
    stderr_path: PathBuf,
}

impl ServerGuard {
    fn stderr_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.stderr_path).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }
}

impl Drop for ServerGuard {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A loopback port that was free a moment ago.
fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .expect("bind an ephemeral loopback port")
        .port()
}

fn start_server(binary: &Path, model: &Path, dir: &Path, port: u16) -> ServerGuard {
    let stderr_path = dir.join(format!("llama-server-{port}.log"));
    let stderr = File::create(&stderr_path).expect("create the server log");
    let child = Command::new(binary)
        .arg("--model")
        .arg(model)
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        // One slot over the model's whole trained context.
        .args(["--ctx-size", "256", "--parallel", "1"])
        // One thread: on a small shared machine, OpenMP threads spinning at barriers while
        // other processes hold the cores make each token ~100x slower.
        .args(["--threads", "1", "--threads-batch", "1"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap_or_else(|e| panic!("spawning {}: {e}", binary.display()));
    ServerGuard { child, stderr_path }
}

/// One HTTP/1.1 exchange; returns the status code and the body.
fn http(port: u16, method: &str, path: &str, body: Option<&str>) -> io::Result<(u16, String)> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut stream = TcpStream::connect_timeout(&addr, REQUEST_TIMEOUT)?;
    stream.set_read_timeout(Some(REQUEST_TIMEOUT))?;
    stream.set_write_timeout(Some(REQUEST_TIMEOUT))?;
    let body = body.unwrap_or("");
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAccept: application/json\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes())?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response)?;
    parse_response(&response)
}

fn bad(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

fn parse_response(response: &[u8]) -> io::Result<(u16, String)> {
    let split = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| bad(format!("no end of headers in {} bytes", response.len())))?;
    let head = String::from_utf8_lossy(&response[..split]);
    let mut body = response[split + 4..].to_vec();
    let status_line = head.lines().next().unwrap_or_default();
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad(format!("bad status line {status_line:?}")))?;
    let chunked = head.lines().any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    if chunked {
        body = dechunk(&body)?;
    }
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// Decodes a `Transfer-Encoding: chunked` body.
fn dechunk(mut data: &[u8]) -> io::Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = data
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or_else(|| bad("unterminated chunk size".into()))?;
        let size_text = String::from_utf8_lossy(&data[..line_end]);
        let size_hex = size_text.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_hex, 16)
            .map_err(|e| bad(format!("chunk size {size_hex:?}: {e}")))?;
        data = &data[line_end + 2..];
        if size == 0 {
            return Ok(out);
        }
        if data.len() < size + 2 {
            return Err(bad("chunk longer than the body".into()));
        }
        out.extend_from_slice(&data[..size]);
        data = &data[size + 2..];
    }
}

/// Polls `/health` until it answers 200. When the process exits first (a lost race for the
/// port, or a model it refuses) the error carries its log; past the deadline it panics.
fn wait_healthy(server: &mut ServerGuard, port: u16) -> Result<(), String> {
    let start = Instant::now();
    loop {
        if let Some(status) = server.child.try_wait().expect("poll the server process") {
            return Err(format!(
                "llama-server exited with {status} before becoming healthy; its log:\n{}",
                server.stderr_tail()
            ));
        }
        // Connection refused while it binds, 503 while it loads the model.
        if let Ok((200, _)) = http(port, "GET", "/health", None) {
            return Ok(());
        }
        if start.elapsed() > READY_DEADLINE {
            panic!(
                "llama-server not healthy after {READY_DEADLINE:?}; its log:\n{}",
                server.stderr_tail()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn llama_server_loads_the_tiny_model_and_answers_a_chat_completion() {
    let binary = llama_server_binary();
    let dir = tempfile::tempdir().expect("temp dir");
    let model = dir.path().join("tiny-llama.gguf");
    write_tiny_llama(&model).expect("write the tiny model");
    let model_len = std::fs::metadata(&model).expect("model written").len();
    // The file we hand to llama.cpp is one our own reader accepts.
    GgufFile::open(&model).expect("our reader parses the model");

    // A port free a moment ago can be taken before the server binds it; try a few.
    let mut attempts = Vec::new();
    let (mut server, port, healthy_after) = loop {
        let port = free_port();
        let spawned_at = Instant::now();
        let mut server = start_server(&binary, &model, dir.path(), port);
        match wait_healthy(&mut server, port) {
            Ok(_) => break (server, port, spawned_at.elapsed()),
            Err(log) if attempts.len() < 2 => attempts.push(log),
            Err(log) => panic!("{log}\n(earlier attempts: {attempts:#?})"),
        }
    };

    let (status, props) = http(port, "GET", "/props", None).expect("GET /props");
    assert_eq!(status, 200, "/props: {props}");
    let props: serde_json::Value = serde_json::from_str(&props).expect("/props is JSON");
    assert_eq!(
        props["chat_template"].as_str(),
        Some(TINY_LLAMA_CHAT_TEMPLATE),
        "llama-server should use the template from tokenizer.chat_template"
    );
    assert_eq!(props["bos_token"].as_str(), Some("<s>"));
    assert_eq!(props["eos_token"].as_str(), Some("</s>"));

    let request = serde_json::json!({
        "messages": [{"role": "user", "content": "hello world"}],
        "max_tokens": 8,
    })
    .to_string();
    let sent_at = Instant::now();
    let (status, body) = http(port, "POST", "/v1/chat/completions", Some(&request))
        .expect("POST /v1/chat/completions");
    let answered_after = sent_at.elapsed();
    assert_eq!(
        status,
        200,
        "chat completion failed: {body}\nserver log:\n{}",
        server.stderr_tail()
    );
    let reply: serde_json::Value = serde_json::from_str(&body).expect("the answer is JSON");
    let message = &reply["choices"][0]["message"];
    assert!(message.is_object(), "no choices[0].message in {reply}");
    assert_eq!(message["role"].as_str(), Some("assistant"), "{reply}");
    assert!(message["content"].is_string(), "{reply}");
    let completion_tokens = reply["usage"]["completion_tokens"]
        .as_u64()
        .expect("usage.completion_tokens");
    assert!(
        (1..=8).contains(&completion_tokens),
        "max_tokens 8 but {completion_tokens} generated: {reply}"
    );

    // A second request measures the warm path (the first one also warms caches).
    let sent_at = Instant::now();
    let (status, _) = http(port, "POST", "/v1/chat/completions", Some(&request))
        .expect("second POST /v1/chat/completions");
    let warm_answer = sent_at.elapsed();
    assert_eq!(status, 200);

    eprintln!(
        "tiny model {model_len} bytes; llama-server healthy after {healthy_after:?}, \
         first chat completion in {answered_after:?}, second in {warm_answer:?}"
    );
    assert!(
        server.child.try_wait().expect("poll").is_none(),
        "llama-server exited during the test; its log:\n{}",
        server.stderr_tail()
    );
}
