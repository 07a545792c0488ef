//! A real server on 127.0.0.1:0 over a fresh database, and a small HTTP client for it.

#![allow(clippy::unwrap_used, dead_code)]

use std::time::Duration;

use futures_util::StreamExt;
use gantry_server::{RunningServer, ServerConfig};
use gantry_testkit::{TestDatabase, TestEngine};
use reqwest::{Method, StatusCode};
use serde_json::Value;

pub const ADMIN_PASSWORD: &str = "admin-password-1";

pub struct TestServer {
    pub running: Option<RunningServer>,
    pub base: String,
    pub client: reqwest::Client,
    pub data_dir: tempfile::TempDir,
    _db: TestDatabase,
}

pub struct Options {
    pub bootstrap_password: Option<String>,
    pub max_request_body: usize,
    pub watch_heartbeat: Duration,
    pub heartbeat_interval: Duration,
    pub server_timeout: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            bootstrap_password: Some(ADMIN_PASSWORD.to_string()),
            max_request_body: 1024 * 1024,
            watch_heartbeat: Duration::from_secs(15),
            heartbeat_interval: Duration::from_secs(15),
            server_timeout: Duration::from_secs(60),
        }
    }
}

impl TestServer {
    pub async fn start(engine: TestEngine) -> Self {
        Self::start_with(engine, Options::default()).await
    }

    pub async fn start_with(engine: TestEngine, options: Options) -> Self {
        let db = TestDatabase::new(engine).await;
        let data_dir = tempfile::tempdir().unwrap();
        let mut config = ServerConfig::new(data_dir.path().join("data"));
        config.host = "127.0.0.1".into();
        config.port = 0;
        config.server_id = "test-server".into();
        config.bootstrap_password = options.bootstrap_password;
        config.max_request_body = options.max_request_body;
        config.watch_heartbeat = options.watch_heartbeat;
        config.heartbeat_interval = options.heartbeat_interval;
        config.server_timeout = options.server_timeout;
        match engine {
            TestEngine::Sqlite => {}
            TestEngine::Postgres => {
                config.database_url = Some(db.url.clone());
                config.jwt_secret = Some("a-test-secret-that-is-long-enough-0123456789".into());
            }
        }
        let running = gantry_server::start(config).await.unwrap();
        let base = format!("http://{}", running.addr);
        Self {
            running: Some(running),
            base,
            client: reqwest::Client::new(),
            data_dir,
            _db: db,
        }
    }

    pub fn state(&self) -> &gantry_server::AppState {
        &self.running.as_ref().unwrap().state
    }

    pub fn data_path(&self, file: &str) -> std::path::PathBuf {
        self.data_dir.path().join("data").join(file)
    }

    /// Sends a request; returns the status and the body parsed as JSON (Null if empty).
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut request = self.client.request(method, format!("{}{path}", self.base));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        let status = response.status();
        let text = response.text().await.unwrap();
        let value = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        (status, value)
    }

    /// Sends raw bytes with a content type.
    pub async fn call_raw(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        content_type: &str,
        body: Vec<u8>,
    ) -> (StatusCode, Value) {
        let mut request = self
            .client
            .request(method, format!("{}{path}", self.base))
            .header("content-type", content_type)
            .body(body);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.unwrap();
        let status = response.status();
        let text = response.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    /// The registration token the server wrote on first start.
    pub fn registration_token(&self) -> String {
        std::fs::read_to_string(self.data_path("registration_token"))
            .unwrap()
            .trim()
            .to_string()
    }

    pub async fn login(&self, username: &str, password: &str) -> String {
        let (status, body) = self
            .call(
                Method::POST,
                "/auth/login",
                None,
                Some(serde_json::json!({"username": username, "password": password})),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        body["token"].as_str().unwrap().to_string()
    }

    pub async fn admin_token(&self) -> String {
        self.login("admin", ADMIN_PASSWORD).await
    }

    /// Polls GET `path` until `check` holds on its JSON body (within 10 s), and returns it.
    /// For what the controllers do a moment after a write, such as creating a model's
    /// instances.
    pub async fn wait_for(&self, path: &str, token: &str, check: impl Fn(&Value) -> bool) -> Value {
        let mut last = Value::Null;
        for _ in 0..200 {
            let (status, body) = self.call(Method::GET, path, Some(token), None).await;
            if status == StatusCode::OK && check(&body) {
                return body;
            }
            last = body;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("GET {path} never satisfied the check; last answer: {last}");
    }

    /// The instance list of a model once it has `count` instances (the model controller
    /// creates them a moment after the model).
    pub async fn instances_of(&self, token: &str, model_id: i64, count: u64) -> Value {
        self.wait_for(
            &format!("/api/v1/model-instances?model_id={model_id}"),
            token,
            |list| list["pagination"]["total"] == count,
        )
        .await
    }

    pub async fn shutdown(mut self) {
        if let Some(running) = self.running.take() {
            running.shutdown().await;
        }
    }
}

/// Asserts the one error shape and returns the message.
pub fn assert_error(status: StatusCode, body: &Value, want_status: u16, want_code: &str) -> String {
    assert_eq!(status.as_u16(), want_status, "body: {body}");
    assert_eq!(body["error"]["code"], want_code, "body: {body}");
    let message = body["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(!message.is_empty(), "error without message: {body}");
    message
}

pub fn tiny_model(name: &str, replicas: u32) -> Value {
    serde_json::json!({
        "name": name,
        "source": {"type": "local_path", "path": "/models/tiny.gguf"},
        "backend": "llama.cpp",
        "replicas": replicas,
    })
}

pub type Lines = std::pin::Pin<Box<dyn futures_util::Stream<Item = String> + Send>>;

pub fn ndjson_lines(response: reqwest::Response) -> Lines {
    let mut buffer = String::new();
    Box::pin(
        response
            .bytes_stream()
            .map(move |chunk| {
                buffer.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
                let mut lines = Vec::new();
                while let Some(end) = buffer.find('\n') {
                    lines.push(buffer[..end].to_string());
                    buffer.drain(..=end);
                }
                futures_util::stream::iter(lines)
            })
            .flatten(),
    )
}

pub async fn next_event(lines: &mut Lines) -> Value {
    let line = tokio::time::timeout(Duration::from_secs(10), lines.next())
        .await
        .expect("a watch event within 10 s")
        .expect("the stream is open");
    serde_json::from_str(&line).unwrap()
}

pub async fn next_non_heartbeat(lines: &mut Lines) -> Value {
    loop {
        let event = next_event(lines).await;
        if event["type"] != "HEARTBEAT" {
            return event;
        }
    }
}
