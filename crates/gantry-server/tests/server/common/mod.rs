//! A real server on 127.0.0.1:0 over a fresh database, and how the tests talk to it.
//!
//! The tests call the API through the typed client, `gantry_client::Client`:
//! [`TestServer::client`] is the admin's, [`TestServer::client_for`] sends any other token,
//! [`TestServer::register`] makes a worker and its client. What the controllers do a moment
//! after a write is waited for in one place, [`TestServer::wait_for`] (and
//! [`TestServer::wait_for_instances`] on top of it).
//!
//! Raw HTTP ([`TestServer::raw`], [`TestServer::raw_bytes`], [`TestServer::http`]) is
//! only for what the typed client cannot say, because it is about the wire itself:
//! malformed JSON, other content types, unknown fields and mistyped values, bad path and
//! query parameters, unknown routes and methods, the exact error body, headers and
//! cookies, the OpenAI-compatible gateway and `/metrics`, the probes, the OpenAPI
//! document and the web UI.

#![allow(clippy::unwrap_used, dead_code)]

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::future::Future;
use std::time::Duration;

use gantry_client::{Client, ClientError, WatchStream};
use gantry_server::{RunningServer, ServerConfig};
use gantry_testkit::{TestDatabase, TestEngine};
use gantry_types::{
    ChangeKind, ErrorCode, InstanceQuery, ModelCreate, ModelInstance, WatchEvent, Worker,
    WorkerRegister,
};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

pub const ADMIN_PASSWORD: &str = "admin-password-1";
pub const GIB: u64 = 1 << 30;

/// How long [`TestServer::wait_for`] waits, and how often it looks.
const WAIT: Duration = Duration::from_secs(10);
const WAIT_STEP: Duration = Duration::from_millis(50);

pub struct TestServer {
    pub running: Option<RunningServer>,
    pub base: String,
    /// Plain HTTP, for the tests about the wire itself (see the module documentation).
    pub http: reqwest::Client,
    pub data_dir: tempfile::TempDir,
    /// A client without a token; the others share its connections.
    anonymous: Client,
    /// The admin, logged in at start when the password is known.
    admin: Option<Client>,
    _db: TestDatabase,
}

pub struct Options {
    pub bootstrap_password: Option<String>,
    pub max_request_body: usize,
    pub watch_heartbeat: Duration,
    pub heartbeat_interval: Duration,
    pub server_timeout: Duration,
    /// Changes the configuration last, for settings no other option covers.
    pub configure: fn(&mut ServerConfig),
}

impl Default for Options {
    fn default() -> Self {
        Self {
            bootstrap_password: Some(ADMIN_PASSWORD.to_string()),
            max_request_body: 1024 * 1024,
            watch_heartbeat: Duration::from_secs(15),
            heartbeat_interval: Duration::from_secs(15),
            server_timeout: Duration::from_secs(60),
            configure: |_| {},
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
        config.bootstrap_password = options.bootstrap_password.clone();
        config.max_request_body = options.max_request_body;
        config.watch_heartbeat = options.watch_heartbeat;
        config.heartbeat_interval = options.heartbeat_interval;
        config.server_timeout = options.server_timeout;
        // Usage reports are read right after the requests.
        config.usage_flush_interval = Duration::from_millis(100);
        (options.configure)(&mut config);
        match engine {
            TestEngine::Sqlite => {}
            TestEngine::Postgres => {
                config.database_url = Some(db.url.clone());
                config.jwt_secret = Some("a-test-secret-that-is-long-enough-0123456789".into());
            }
        }
        let running = gantry_server::start(config).await.unwrap();
        let base = format!("http://{}", running.addr);
        let mut server = Self {
            running: Some(running),
            base: base.clone(),
            http: reqwest::Client::new(),
            data_dir,
            anonymous: Client::new(&base),
            admin: None,
            _db: db,
        };
        if let Some(password) = &options.bootstrap_password {
            server.admin = Some(server.login("admin", password).await);
        }
        server
    }

    pub fn state(&self) -> &gantry_server::AppState {
        &self.running.as_ref().unwrap().state
    }

    /// Where the server listens.
    pub fn addr(&self) -> std::net::SocketAddr {
        self.running.as_ref().unwrap().addr
    }

    pub fn data_path(&self, file: &str) -> std::path::PathBuf {
        self.data_dir.path().join("data").join(file)
    }

    /// The admin's client (a session of the bootstrap admin).
    pub fn client(&self) -> &Client {
        self.admin
            .as_ref()
            .expect("the server was started without a bootstrap password: log in with `login`")
    }

    /// A client that sends `token`: a session, an API key or a worker credential.
    pub fn client_for(&self, token: &str) -> Client {
        self.anonymous.for_token(token)
    }

    /// A client that sends no token.
    pub fn anonymous(&self) -> &Client {
        &self.anonymous
    }

    /// Logs in and returns a client with the session.
    pub async fn login(&self, username: &str, password: &str) -> Client {
        let login = self.anonymous().login(username, password).await.unwrap();
        self.client_for(&login.token)
    }

    /// The registration token the server wrote on first start.
    pub fn registration_token(&self) -> String {
        std::fs::read_to_string(self.data_path("registration_token"))
            .unwrap()
            .trim()
            .to_string()
    }

    /// Registers a new worker with the registration token; returns it and a client with
    /// its credential.
    pub async fn register(&self, registration: &WorkerRegister) -> (Worker, Client) {
        let (registered, created) = self
            .anonymous()
            .register_worker(&self.registration_token(), registration)
            .await
            .unwrap();
        assert!(created, "{} was registered before", registration.name);
        let credential = registered
            .credential
            .expect("a new worker gets a credential");
        (registered.worker, self.client_for(&credential))
    }

    /// Polls `probe` until its answer satisfies `done` (within 10 s), and returns that
    /// answer. For what happens a moment after a write: the controllers creating and
    /// placing instances, a worker's health, usage being flushed.
    pub async fn wait_for<T, F, Fut>(&self, what: &str, probe: F, done: impl Fn(&T) -> bool) -> T
    where
        T: Debug,
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, ClientError>>,
    {
        gantry_testkit::eventually(what, WAIT, WAIT_STEP, probe, done, String::new).await
    }

    /// The instances of a model (in id order) once they satisfy `done`.
    pub async fn wait_for_instances(
        &self,
        model_id: i64,
        what: &str,
        done: impl Fn(&[ModelInstance]) -> bool,
    ) -> Vec<ModelInstance> {
        self.wait_for_instances_as(self.client(), model_id, what, done)
            .await
    }

    /// [`TestServer::wait_for_instances`], listing them as `client`.
    pub async fn wait_for_instances_as(
        &self,
        client: &Client,
        model_id: i64,
        what: &str,
        done: impl Fn(&[ModelInstance]) -> bool,
    ) -> Vec<ModelInstance> {
        let query = InstanceQuery {
            model_id: Some(model_id),
            ..InstanceQuery::default()
        };
        self.wait_for(
            &format!("the instances of model {model_id} to be {what}"),
            || async { Ok(client.list_instances(&query).await?.items) },
            |items: &Vec<ModelInstance>| done(items),
        )
        .await
    }

    /// A worker once it satisfies `done`.
    pub async fn wait_for_worker(
        &self,
        worker_id: i64,
        what: &str,
        done: impl Fn(&Worker) -> bool,
    ) -> Worker {
        let client = self.client();
        self.wait_for(
            &format!("worker {worker_id} to be {what}"),
            || client.get_worker(worker_id),
            done,
        )
        .await
    }

    /// The instances of a model once there are `count` (the model controller creates
    /// them a moment after the model).
    pub async fn instances_of(&self, model_id: i64, count: usize) -> Vec<ModelInstance> {
        self.wait_for_instances(model_id, &format!("{count} in number"), |items| {
            items.len() == count
        })
        .await
    }

    /// Sends a request as it is, for the tests about the wire; returns the status and the
    /// body parsed as JSON (`Null` if empty, a string if not JSON).
    pub async fn raw(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        answer_of(request).await
    }

    /// Sends raw bytes with a content type.
    pub async fn raw_bytes(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        content_type: &str,
        body: Vec<u8>,
    ) -> (StatusCode, Value) {
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.base))
            .header("content-type", content_type)
            .body(body);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        answer_of(request).await
    }

    pub async fn shutdown(mut self) {
        if let Some(running) = self.running.take() {
            running.shutdown().await;
        }
    }
}

async fn answer_of(request: reqwest::RequestBuilder) -> (StatusCode, Value) {
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

/// Asserts that a call failed with the server's error of this status and code, and
/// returns its message (which must not be empty).
pub fn expect_error<T: Debug>(
    result: Result<T, ClientError>,
    want_status: u16,
    want_code: ErrorCode,
) -> String {
    let error = result.expect_err("the call should fail");
    assert_eq!(error.status(), Some(want_status), "{error}");
    assert_eq!(error.code(), Some(want_code), "{error}");
    let message = error.message().unwrap_or_default().to_string();
    assert!(!message.is_empty(), "error without message: {error}");
    message
}

/// Asserts the one error shape on a raw answer and returns the message.
pub fn assert_raw_error(
    status: StatusCode,
    body: &Value,
    want_status: u16,
    want_code: ErrorCode,
) -> String {
    assert_eq!(status.as_u16(), want_status, "body: {body}");
    assert_eq!(body["error"]["code"], json!(want_code), "body: {body}");
    let message = body["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(!message.is_empty(), "error without message: {body}");
    message
}

/// A model of `replicas` replicas of the file at `path` on llama.cpp, everything else the
/// API's defaults (read through the type's own serde defaults, as the server reads a body).
pub fn model(name: &str, path: &str, replicas: u32) -> ModelCreate {
    serde_json::from_value(json!({
        "name": name,
        "source": {"type": "local_path", "path": path},
        "backend": "llama.cpp",
        "replicas": replicas,
    }))
    .unwrap()
}

/// A model whose file no test reads (for the API and the controllers' bookkeeping): an
/// empty file, there because the server refuses a local path it cannot find, and no model,
/// so its instances stay pending unless placed by hand.
pub fn tiny_model(name: &str, replicas: u32) -> ModelCreate {
    model(name, &unread_model_file(), replicas)
}

/// The path of an empty `.gguf` file under the test target's directory, made on first use
/// (by whichever test process comes first; the others find it).
pub fn unread_model_file() -> String {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("unread-model");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tiny.gguf");
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .unwrap();
    path.display().to_string()
}

/// A worker with `gpus` simulated 80 GiB GPUs, 8 CPUs, 64 GiB of RAM, llama.cpp and vLLM,
/// and no labels.
pub fn simulated_worker(name: &str, gpus: u32) -> WorkerRegister {
    WorkerRegister {
        name: name.into(),
        labels: BTreeMap::new(),
        address: "127.0.0.1:1".into(),
        status: gantry_types::fixtures::worker_status(name, gpus),
    }
}

/// Writes a worker with one simulated GPU straight into the store, found by the digest
/// of its credential: for tests below the API.
pub async fn stored_worker(
    store: &gantry_store::Store,
    name: &str,
    credential_digest: &str,
) -> Worker {
    store
        .create_worker(
            name,
            &BTreeMap::new(),
            "127.0.0.1:1",
            &simulated_worker(name, 1).status,
            credential_digest,
        )
        .await
        .unwrap()
}

/// Labels from pairs.
pub fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
        .collect()
}

/// The next event of a watch (within 10 s).
pub async fn next_event<T: Debug + serde::de::DeserializeOwned>(
    events: &mut WatchStream<T>,
) -> WatchEvent<T> {
    tokio::time::timeout(WAIT, events.next())
        .await
        .expect("a watch event within 10 s")
        .expect("the stream is open")
        .unwrap()
}

/// The next change a watch reports, passing over heartbeats.
pub async fn next_change<T: Debug + serde::de::DeserializeOwned>(
    events: &mut WatchStream<T>,
) -> (ChangeKind, T) {
    loop {
        match next_event(events).await {
            WatchEvent::Heartbeat => continue,
            WatchEvent::Error { error } => panic!("the watch ended with an error: {error:?}"),
            event => return event.into_change().unwrap(),
        }
    }
}

/// A user with role `user` and the API's defaults for the rest.
pub fn user(username: &str, password: &str) -> gantry_types::UserCreate {
    serde_json::from_value(json!({"username": username, "password": password})).unwrap()
}

/// An API key without description or expiry.
pub fn api_key(name: &str) -> gantry_types::ApiKeyCreate {
    gantry_types::ApiKeyCreate {
        name: name.into(),
        description: String::new(),
        expires_in_days: None,
        ..Default::default()
    }
}

/// A model directory whose one safetensors header claims 500 GB of BF16 weights; only the
/// header is written.
pub fn huge_safetensors_dir(server: &TestServer) -> std::path::PathBuf {
    let dir = server.data_dir.path().join("huge-model");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("config.json"),
        r#"{"hidden_size": 8192, "num_hidden_layers": 80, "num_attention_heads": 64,
            "num_key_value_heads": 8, "max_position_embeddings": 8192}"#,
    )
    .unwrap();
    let header = r#"{"w": {"dtype": "BF16", "shape": [250000, 1000000], "data_offsets": [0, 500000000000]}}"#;
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    std::fs::write(dir.join("model.safetensors"), bytes).unwrap();
    dir
}
