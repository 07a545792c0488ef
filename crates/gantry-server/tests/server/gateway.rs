//! The OpenAI-compatible gateway end to end, against SQLite and PostgreSQL: a real
//! server, a worker registered through the API, instances placed by hand and reported
//! `running` at the address of a real llama.cpp `llama-server` serving the tiny model
//! this project writes — so every byte of the serving path is real.
//!
//! Needs `GANTRY_LLAMA_SERVER` (scripts/build-llama-server.sh prints it) and, for the
//! OpenAI-client test, `GANTRY_PYTHON` (scripts/python-env.sh prints it). scripts/test.sh
//! sets both. Without them the tests fail with a message saying so; they never skip.
//!
//! The management API (models, placement, state reports, keys, usage) is called through
//! the typed client. The gateway (`/v1/*`) and `/metrics` are called with raw HTTP: they
//! are the OpenAI-compatible wire and Prometheus text, which the client does not cover,
//! and the tests are about exactly those bytes.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::common::{
    api_key, assert_raw_error, expect_error, model, simulated_worker, user, Options, TestServer,
};
use futures_util::StreamExt;
use gantry_client::Client;
use gantry_server::ServerConfig;
use gantry_testkit::{test_both_engines, TestEngine};
use gantry_types::usage::{UsageBucket, UsageQuery, UsageReport};
use gantry_types::{
    ApiKeyQuery, ErrorCode, InstancePatch, InstanceState, InstanceStateReport, Timestamp,
};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long llama-server may take to load the tiny model.
const READY_DEADLINE: Duration = Duration::from_secs(60);

fn llama_server_binary() -> PathBuf {
    let Some(path) = std::env::var_os("GANTRY_LLAMA_SERVER") else {
        panic!(
            "GANTRY_LLAMA_SERVER is not set. The gateway tests proxy to a real llama.cpp \
             llama-server: run them with scripts/test.sh, or set \
             GANTRY_LLAMA_SERVER=$(scripts/build-llama-server.sh | tail -1)."
        );
    };
    let path = PathBuf::from(path);
    assert!(
        path.is_file(),
        "GANTRY_LLAMA_SERVER={} is not a file; run scripts/build-llama-server.sh and use the path it prints",
        path.display()
    );
    path
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A real llama-server serving the tiny model; killed when dropped.
struct LlamaServer {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl LlamaServer {
    /// Starts one and waits for `/health`. A port free a moment ago can be taken
    /// before the server binds it, so a few ports are tried.
    async fn start(dir: &Path, model: &Path) -> Self {
        let binary = llama_server_binary();
        let mut failures = Vec::new();
        for _ in 0..3 {
            let port = free_port();
            let log = dir.join(format!("llama-server-{port}.log"));
            let child = Command::new(&binary)
                .arg("-m")
                .arg(model)
                .args(["-c", "256", "-t", "1", "-tb", "1", "-np", "1"])
                .args(["--host", "127.0.0.1", "--port", &port.to_string()])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).unwrap())
                .spawn()
                .unwrap_or_else(|e| panic!("spawn {}: {e}", binary.display()));
            let mut server = Self { child, port, log };
            match server.wait_healthy().await {
                Ok(()) => return server,
                Err(e) => failures.push(e),
            }
        }
        panic!("llama-server did not start: {failures:#?}");
    }

    async fn wait_healthy(&mut self) -> Result<(), String> {
        let client = reqwest::Client::new();
        let url = format!("http://127.0.0.1:{}/health", self.port);
        let deadline = tokio::time::Instant::now() + READY_DEADLINE;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Err(format!("exited with {status}: {}", self.log_tail()));
            }
            if let Ok(response) = client.get(&url).send().await {
                if response.status() == StatusCode::OK {
                    return Ok(());
                }
            }
            if tokio::time::Instant::now() > deadline {
                return Err(format!(
                    "not healthy after {READY_DEADLINE:?}: {}",
                    self.log_tail()
                ));
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// SIGSTOP: the process keeps its socket, so connections are still accepted (by
    /// the kernel), but nothing is answered: a hung backend.
    fn freeze(&self) {
        self.signal(nix::sys::signal::Signal::SIGSTOP);
    }

    /// SIGCONT after [`LlamaServer::freeze`].
    fn thaw(&self) {
        self.signal(nix::sys::signal::Signal::SIGCONT);
    }

    fn signal(&self, signal: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).unwrap());
        nix::sys::signal::kill(pid, signal).unwrap_or_else(|e| panic!("{signal} {pid}: {e}"));
    }

    /// SIGKILL, and wait until the process is gone.
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for LlamaServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A server with an admin, an API key and a registered (simulated-GPU) worker.
struct Cluster {
    server: TestServer,
    /// The API key the gateway requests carry.
    key: String,
    /// The registered worker's client (its credential).
    worker: Client,
    worker_id: i64,
    dir: tempfile::TempDir,
    model_file: PathBuf,
}

impl Cluster {
    async fn start(engine: TestEngine) -> Self {
        Self::start_with(engine, |_| {}).await
    }

    /// Like [`Cluster::start`], with the server's configuration changed by `configure`
    /// (the gateway's settings).
    async fn start_with(engine: TestEngine, configure: fn(&mut ServerConfig)) -> Self {
        // No heartbeats are sent: keep the worker (and so its instances) healthy for
        // the whole test.
        let server = TestServer::start_with(
            engine,
            Options {
                heartbeat_interval: Duration::from_secs(600),
                server_timeout: Duration::from_secs(3600),
                configure,
                ..Default::default()
            },
        )
        .await;
        let created = server
            .client()
            .create_api_key(&api_key("gateway-test"))
            .await
            .unwrap();
        let (worker, worker_client) = server.register(&simulated_worker("worker-1", 1)).await;
        let dir = tempfile::tempdir().unwrap();
        let model_file = dir.path().join("tiny-llama.gguf");
        gantry_gguf::write_tiny_llama(&model_file).unwrap();
        Self {
            key: created.key,
            worker: worker_client,
            worker_id: worker.id,
            server,
            dir,
            model_file,
        }
    }

    fn admin(&self) -> &Client {
        self.server.client()
    }

    async fn llama_server(&self) -> LlamaServer {
        LlamaServer::start(self.dir.path(), &self.model_file).await
    }

    /// Creates a model with one replica per address, places each replica on the worker
    /// and reports it `running` there. An empty list leaves one replica pending.
    async fn deploy(&self, name: &str, addresses: &[String]) -> Vec<i64> {
        let count = addresses.len().max(1);
        let path = self.model_file.display().to_string();
        let replicas = u32::try_from(count).unwrap();
        let created = self
            .admin()
            .create_model(&model(name, &path, replicas))
            .await
            .unwrap();
        let ids: Vec<i64> = self
            .server
            .instances_of(created.id, count)
            .await
            .iter()
            .map(|instance| instance.id)
            .collect();
        for (id, address) in ids.iter().zip(addresses) {
            let patch = InstancePatch {
                worker_id: Some(Some(self.worker_id)),
                gpu_indexes: Some(vec![0]),
            };
            self.admin().place_instance(*id, &patch).await.unwrap();
            self.report(*id, InstanceState::Running, address).await;
        }
        if !addresses.is_empty() {
            self.wait_routable(name, addresses.len()).await;
        }
        ids
    }

    /// Reports an instance in `state` at `address`, as its worker would.
    async fn report(&self, id: i64, state: InstanceState, address: &str) {
        let port: u16 = address.rsplit(':').next().unwrap().parse().unwrap();
        let report = InstanceStateReport {
            state,
            state_message: String::new(),
            port: Some(port),
            address: Some(address.to_string()),
            restart_count: 0,
            download: None,
            install: None,
            backend_version: None,
        };
        self.worker.report_state(id, &report).await.unwrap();
    }

    /// Waits until the gateway routes to `count` instances of the model (the routing
    /// table follows the store's change feed asynchronously).
    async fn wait_routable(&self, model: &str, count: usize) {
        let want = format!("gantry_gateway_routable_instances{{model=\"{model}\"}} {count}");
        self.metrics_until(&format!("routes to {count} instances of {model}"), |text| {
            text.lines().any(|l| l == want)
        })
        .await;
    }

    /// The metrics once `done` holds for them (within 5 s): for what the gateway does
    /// asynchronously, such as following the change feed or ending a request.
    async fn metrics_until(&self, what: &str, done: impl Fn(&str) -> bool) -> String {
        gantry_testkit::eventually(
            &format!("the metrics to show that the gateway {what}"),
            Duration::from_secs(5),
            Duration::from_millis(25),
            || async { Ok::<_, std::convert::Infallible>(self.metrics().await) },
            |text: &String| done(text),
            String::new,
        )
        .await
    }

    /// Waits until no request is in flight, and asserts that none is on `instance` of
    /// `model` either; returns the metrics.
    async fn wait_idle(&self, model: &str, instance: &str) -> String {
        let text = self
            .metrics_until("has no request in flight", |text| {
                metric(text, "gantry_gateway_requests_in_flight") == 0.0
            })
            .await;
        let series = format!(
            "gantry_gateway_instance_requests_in_flight{{model=\"{model}\",model_instance=\"{instance}\"}}"
        );
        assert_eq!(metric(&text, &series), 0.0, "{text}");
        text
    }

    async fn metrics(&self) -> String {
        let response = self
            .server
            .http
            .get(format!("{}/metrics", self.server.base))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        response.text().await.unwrap()
    }

    /// POSTs to a gateway endpoint; returns status, `x-gantry-instance` and the JSON.
    async fn post(
        &self,
        path: &str,
        key: Option<&str>,
        body: Value,
    ) -> (StatusCode, Option<String>, Value) {
        let mut request = self
            .server
            .http
            .post(format!("{}{path}", self.server.base))
            .json(&body);
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        let response = request.send().await.unwrap();
        let status = response.status();
        let instance = response
            .headers()
            .get("x-gantry-instance")
            .map(|v| v.to_str().unwrap().to_string());
        let text = response.text().await.unwrap();
        let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, instance, value)
    }

    async fn chat(&self, model: &str) -> (StatusCode, Option<String>, Value) {
        self.post(
            "/v1/chat/completions",
            Some(&self.key),
            json!({"model": model, "messages": [{"role": "user", "content": "hello world"}], "max_tokens": 4}),
        )
        .await
    }

    /// What [`Cluster::chat`] needs, to send chats from spawned tasks.
    fn chatter(&self) -> Chatter {
        Chatter {
            http: self.server.http.clone(),
            base: self.server.base.clone(),
            key: self.key.clone(),
        }
    }

    /// The usage report `client` may see, polled until `done` holds (usage is flushed
    /// about once a second).
    async fn usage_until(
        &self,
        client: &Client,
        query: &UsageQuery,
        done: impl Fn(&UsageReport) -> bool,
    ) -> UsageReport {
        self.server
            .wait_for("the usage report", || client.usage(query), done)
            .await
    }
}

/// Sends chat completions from a task of its own.
#[derive(Clone)]
struct Chatter {
    http: reqwest::Client,
    base: String,
    key: String,
}

impl Chatter {
    /// A chat completion: status, `x-gantry-instance`, the JSON, and how long it took.
    /// Fails after a minute rather than hang the test when the gateway keeps it waiting.
    async fn chat(&self, model: &str) -> (StatusCode, Option<String>, Value, Duration) {
        let started = tokio::time::Instant::now();
        let response = self
            .http
            .post(format!("{}/v1/chat/completions", self.base))
            .timeout(Duration::from_secs(60))
            .bearer_auth(&self.key)
            .json(&json!({"model": model, "messages": [{"role": "user", "content": "hello world"}], "max_tokens": 4}))
            .send()
            .await
            .unwrap();
        let status = response.status();
        let instance = response
            .headers()
            .get("x-gantry-instance")
            .map(|v| v.to_str().unwrap().to_string());
        let text = response.text().await.unwrap();
        let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, instance, value, started.elapsed())
    }
}

/// The sample value of a metric line, 0 when absent.
fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

/// Asserts the OpenAI error shape and returns the error object.
fn assert_openai_error(
    status: StatusCode,
    body: &Value,
    want: u16,
    kind: &str,
    code: &str,
) -> Value {
    assert_eq!(status.as_u16(), want, "{body}");
    let error = &body["error"];
    assert_eq!(error["type"], kind, "{body}");
    assert_eq!(error["code"], code, "{body}");
    assert!(
        error["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
    assert!(
        error.get("param").is_some(),
        "param must be present (null allowed): {body}"
    );
    error.clone()
}

async fn chat_and_completions_are_proxied_and_usage_is_recorded(engine: TestEngine) {
    let cluster = Cluster::start(engine).await;
    let backend = cluster.llama_server().await;
    let instances = cluster.deploy("tiny", &[backend.address()]).await;
    let admin = cluster.admin();
    let instance_name = admin.get_instance(instances[0]).await.unwrap().name;

    let mut prompt_tokens = 0;
    let mut completion_tokens = 0;
    for _ in 0..3 {
        let (status, served_by, reply) = cluster.chat("tiny").await;
        assert_eq!(status, StatusCode::OK, "{reply}\n{}", backend.log_tail());
        assert_eq!(served_by.as_deref(), Some(instance_name.as_str()));
        assert_eq!(reply["object"], "chat.completion", "{reply}");
        assert_eq!(reply["choices"][0]["message"]["role"], "assistant");
        prompt_tokens += reply["usage"]["prompt_tokens"].as_u64().unwrap();
        completion_tokens += reply["usage"]["completion_tokens"].as_u64().unwrap();
    }
    assert!(prompt_tokens > 0 && completion_tokens > 0);

    // The legacy completions endpoint.
    let (status, _, reply) = cluster
        .post(
            "/v1/completions",
            Some(&cluster.key),
            json!({"model": "tiny", "prompt": "hello", "max_tokens": 3}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    assert_eq!(reply["object"], "text_completion", "{reply}");
    prompt_tokens += reply["usage"]["prompt_tokens"].as_u64().unwrap();
    completion_tokens += reply["usage"]["completion_tokens"].as_u64().unwrap();

    // Usage per model and per key, exactly what the backend reported.
    let keys = admin.list_api_keys(&ApiKeyQuery::default()).await.unwrap();
    let key_id = keys.items[0].id;
    let tiny = UsageQuery {
        model: Some("tiny".into()),
        ..UsageQuery::default()
    };
    let report = cluster
        .usage_until(admin, &tiny, |r| r.total.requests == 4)
        .await;
    assert_eq!(report.total.prompt_tokens, prompt_tokens, "{report:?}");
    assert_eq!(
        report.total.completion_tokens, completion_tokens,
        "{report:?}"
    );
    assert_eq!(
        report.total.total_tokens,
        prompt_tokens + completion_tokens,
        "{report:?}"
    );
    assert_eq!(report.models[0].model, "tiny");
    assert_eq!(report.api_keys[0].api_key_id, Some(key_id), "{report:?}");
    assert_eq!(report.api_keys[0].totals.requests, 4, "{report:?}");

    // A session token works too, booked without a key.
    let (status, _, _) = cluster
        .post(
            "/v1/chat/completions",
            admin.token().as_deref(),
            json!({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let everything = UsageQuery::default();
    let report = cluster
        .usage_until(admin, &everything, |r| r.total.requests == 5)
        .await;
    let session_row = report
        .api_keys
        .iter()
        .find(|row| row.api_key_id.is_none())
        .unwrap_or_else(|| panic!("no session-token row: {report:?}"));
    assert_eq!(session_row.totals.requests, 1);

    // A user sees only their own usage; filters by key and time narrow the report.
    admin
        .create_user(&user("alice", "alice-password-1"))
        .await
        .unwrap();
    let alice = cluster.server.login("alice", "alice-password-1").await;
    let alice_key = alice.create_api_key(&api_key("mine")).await.unwrap().key;
    let (status, _, _) = cluster
        .post(
            "/v1/chat/completions",
            Some(&alice_key),
            json!({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let report = cluster
        .usage_until(&alice, &everything, |r| r.total.requests == 1)
        .await;
    assert_eq!(report.api_keys.len(), 1, "{report:?}");
    let admins = UsageQuery {
        user_id: Some(1),
        ..UsageQuery::default()
    };
    expect_error(alice.usage(&admins).await, 403, ErrorCode::Forbidden);
    let by_key = UsageQuery {
        api_key_id: Some(key_id),
        ..UsageQuery::default()
    };
    let report = cluster
        .usage_until(admin, &by_key, |r| r.total.requests == 4)
        .await;
    assert_eq!(report.api_keys.len(), 1, "{report:?}");
    // 2000-01-01T00:00:00Z to 2000-01-02T00:00:00Z.
    let long_ago = UsageQuery {
        from: Some(Timestamp::from_millis(946_684_800_000)),
        to: Some(Timestamp::from_millis(946_771_200_000)),
        ..UsageQuery::default()
    };
    let report = admin.usage(&long_ago).await.unwrap();
    assert_eq!(report.total.requests, 0, "{report:?}");
    // Over time: per-minute points of the last hour that add up to the totals, each on a
    // minute's start.
    let hour_ago = Timestamp::from_millis(Timestamp::now().as_millis() - 3_600_000);
    let over_time = UsageQuery {
        from: Some(hour_ago),
        bucket: Some(UsageBucket::Minute),
        ..UsageQuery::default()
    };
    let report = admin.usage(&over_time).await.unwrap();
    let series = report
        .series
        .clone()
        .expect("a series when a bucket is asked for");
    assert_eq!(
        series.iter().map(|p| p.totals.requests).sum::<u64>(),
        report.total.requests,
        "{report:?}"
    );
    assert!(report.total.requests >= 6, "{report:?}");
    assert!(series.iter().all(|p| p.start.as_millis() % 60_000 == 0));
    assert!(admin.usage(&everything).await.unwrap().series.is_none());
    // A bucket needs a start, and at most 2000 buckets.
    let no_start = UsageQuery {
        bucket: Some(UsageBucket::Hour),
        ..UsageQuery::default()
    };
    let refused = admin.usage(&no_start).await.unwrap_err();
    assert!(refused.to_string().contains("from"), "{refused}");
    let too_many = UsageQuery {
        from: Some(Timestamp::from_millis(946_684_800_000)),
        bucket: Some(UsageBucket::Minute),
        ..UsageQuery::default()
    };
    let refused = admin.usage(&too_many).await.unwrap_err();
    assert!(refused.to_string().contains("bucket"), "{refused}");
    // Raw: a time the typed query cannot hold.
    let (status, body) = cluster
        .server
        .raw(
            Method::GET,
            "/api/v1/usage?from=yesterday",
            admin.token().as_deref(),
            None,
        )
        .await;
    assert_raw_error(status, &body, 400, ErrorCode::InvalidRequest);

    // The counters moved.
    let text = cluster.metrics().await;
    assert!(
        metric(
            &text,
            "gantry_gateway_requests_total{model=\"tiny\",code=\"200\"}"
        ) >= 6.0,
        "{text}"
    );
    assert!(
        metric(&text, "gantry_gateway_prompt_tokens_total{model=\"tiny\"}") >= prompt_tokens as f64,
        "{text}"
    );
    assert!(
        metric(
            &text,
            "gantry_gateway_completion_tokens_total{model=\"tiny\"}"
        ) >= completion_tokens as f64,
        "{text}"
    );
    assert!(
        metric(
            &text,
            "gantry_gateway_request_duration_seconds_count{model=\"tiny\"}"
        ) >= 6.0,
        "{text}"
    );
    assert_eq!(
        metric(&text, "gantry_gateway_requests_in_flight"),
        0.0,
        "{text}"
    );
    assert_eq!(
        metric(&text, "gantry_instances{state=\"running\"}"),
        1.0,
        "{text}"
    );
    assert_eq!(
        metric(&text, "gantry_workers{state=\"ready\"}"),
        1.0,
        "{text}"
    );
    assert!(
        text.contains("# TYPE gantry_scheduler_queue_length gauge"),
        "{text}"
    );
    assert!(
        text.contains("# TYPE gantry_gateway_request_duration_seconds histogram"),
        "{text}"
    );
    // With every kind of series present, the exposition passes Prometheus' own check,
    // and the Grafana dashboard asks only for what it has.
    promtool_accepts(&text);
    dashboard_queries_fit(&text);

    drop(backend);
    cluster.server.shutdown().await;
}

/// The PromQL queries of `packaging/grafana/gantry.json`, the dashboard's variables
/// filled in as Grafana would (`$model` as "all").
fn dashboard_queries() -> Vec<String> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../packaging/grafana/gantry.json");
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap())
        .unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()));
    let mut queries: Vec<String> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|panel| panel["targets"].as_array().unwrap().iter())
        .map(|target| target["expr"].as_str().unwrap().to_owned())
        .collect();
    for variable in dashboard["templating"]["list"].as_array().unwrap() {
        if let Some(definition) = variable["definition"].as_str() {
            // label_values(metric, label) is Grafana's, not PromQL: check the metric.
            let inner = definition
                .trim_start_matches("label_values(")
                .trim_end_matches(')');
            queries.push(inner.split(',').next().unwrap().trim().to_owned());
        }
    }
    assert!(queries.len() > 10, "{queries:?}");
    queries
        .into_iter()
        .map(|q| q.replace("$__rate_interval", "5m").replace("$model", ".*"))
        .collect()
}

/// Every query of the Grafana dashboard parses as PromQL (`promtool check rules`) and
/// names only metrics that `/metrics` serves, grouped by labels they carry.
fn dashboard_queries_fit(text: &str) {
    let queries = dashboard_queries();
    let series: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
    let is_name = |c: char| c.is_ascii_alphanumeric() || c == '_';
    for query in &queries {
        let metrics: Vec<&str> = query
            .match_indices("gantry_")
            .map(|(at, _)| {
                let rest = &query[at..];
                &rest[..rest.find(|c: char| !is_name(c)).unwrap_or(rest.len())]
            })
            .collect();
        assert!(
            !metrics.is_empty(),
            "a query without a gantry metric: {query}"
        );
        for metric in &metrics {
            let family = ["_bucket", "_count", "_sum"]
                .iter()
                .find_map(|suffix| metric.strip_suffix(suffix))
                .unwrap_or(metric);
            assert!(
                text.contains(&format!("\n# TYPE {family} ")),
                "the dashboard asks for {metric}, which /metrics does not serve:\n{query}\n{text}"
            );
        }
        // Grouping labels, where the metrics have series to show them (a counter of
        // failures has none until something fails).
        let shown: Vec<&&str> = series
            .iter()
            .filter(|l| metrics.iter().any(|m| l.starts_with(&format!("{m}{{"))))
            .collect();
        for (at, _) in query.match_indices("by (") {
            let labels = &query[at + 4..];
            for label in labels[..labels.find(')').unwrap()]
                .split(',')
                .map(str::trim)
            {
                assert!(
                    shown.is_empty()
                        || shown.iter().any(|l| {
                            l.contains(&format!("{{{label}=\""))
                                || l.contains(&format!(",{label}=\""))
                        }),
                    "the dashboard groups {metrics:?} by {label}, a label they do not carry:\n{query}"
                );
            }
        }
    }
    // As recording rules, so that promtool parses each query.
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("dashboard.rules.yml");
    let mut yaml = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (n, query) in queries.iter().enumerate() {
        yaml.push_str(&format!(
            "      - record: dashboard:query_{n}\n        expr: '{}'\n",
            query.replace('\'', "''")
        ));
    }
    std::fs::write(&rules, yaml).unwrap();
    let promtool = std::env::var("GANTRY_PROMTOOL").unwrap_or_else(|_| "promtool".into());
    let output = std::process::Command::new(&promtool)
        .args(["check", "rules"])
        .arg(&rules)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {promtool}: {e}"));
    assert!(
        output.status.success(),
        "promtool check rules refused a dashboard query:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Runs `promtool check metrics` (Debian's package `prometheus`, which scripts/test.sh
/// installs; `GANTRY_PROMTOOL` names another) on an exposition: it must parse and follow
/// Prometheus' naming rules (units spelled out, `_total` on counters, …).
fn promtool_accepts(text: &str) {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let promtool = std::env::var("GANTRY_PROMTOOL").unwrap_or_else(|_| "promtool".into());
    let mut child = Command::new(&promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run {promtool}: {e}; install Debian's prometheus package \
                 (scripts/test.sh does) or set GANTRY_PROMTOOL"
            )
        });
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "promtool check metrics refused /metrics:\n{}{}\n--- the exposition ---\n{text}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Reads a whole SSE response into its events' data payloads.
async fn sse_payloads(response: reqwest::Response) -> Vec<String> {
    assert!(
        response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream")),
        "{:?}",
        response.headers()
    );
    let mut text = String::new();
    let mut stream = response.bytes_stream();
    while let Some(chunk) = stream.next().await {
        text.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
    }
    text.split("\n\n")
        .filter(|event| !event.trim().is_empty())
        .map(|event| {
            event
                .strip_prefix("data: ")
                .unwrap_or_else(|| panic!("not a data event: {event:?}"))
                .to_string()
        })
        .collect()
}

async fn streaming_arrives_as_sse_with_a_usage_chunk_only_when_asked(engine: TestEngine) {
    let cluster = Cluster::start(engine).await;
    let backend = cluster.llama_server().await;
    cluster.deploy("tiny", &[backend.address()]).await;
    // Greedy decoding: sampled from the tiny random model, the few tokens can all be
    // partial UTF-8, which streams as no content at all (a single final chunk).
    let stream = |include_usage: Option<bool>| {
        let mut body = json!({"model": "tiny", "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 6, "stream": true, "temperature": 0});
        if let Some(include_usage) = include_usage {
            body["stream_options"] = json!({"include_usage": include_usage});
        }
        cluster
            .server
            .http
            .post(format!("{}/v1/chat/completions", cluster.server.base))
            .bearer_auth(&cluster.key)
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
    let everything = UsageQuery::default();
    cluster
        .usage_until(cluster.admin(), &everything, |r| {
            r.total.requests == 1 && r.total.completion_tokens > 0
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
    cluster
        .usage_until(cluster.admin(), &everything, |r| r.total.requests == 3)
        .await;

    drop(backend);
    cluster.server.shutdown().await;
}

async fn requests_spread_over_instances_and_survive_a_killed_backend(engine: TestEngine) {
    let cluster = Cluster::start(engine).await;
    let mut first = cluster.llama_server().await;
    let second = cluster.llama_server().await;
    cluster
        .deploy("tiny", &[first.address(), second.address()])
        .await;

    let mut served = std::collections::BTreeMap::<String, u32>::new();
    for _ in 0..6 {
        let (status, instance, reply) = cluster.chat("tiny").await;
        assert_eq!(status, StatusCode::OK, "{reply}");
        *served.entry(instance.unwrap()).or_default() += 1;
    }
    assert_eq!(served.len(), 2, "requests were not spread: {served:?}");
    assert!(
        served.values().all(|n| *n == 3),
        "ties should alternate: {served:?}"
    );

    // kill -9 one backend: every request still succeeds, on the other one.
    first.kill();
    let mut survivors = std::collections::BTreeSet::new();
    for _ in 0..6 {
        let (status, instance, reply) = cluster.chat("tiny").await;
        assert_eq!(status, StatusCode::OK, "{reply}");
        survivors.insert(instance.unwrap());
    }
    assert_eq!(survivors.len(), 1, "{survivors:?}");
    let text = cluster.metrics().await;
    let failed_tries = metric(
        &text,
        "gantry_gateway_errors_total{model=\"tiny\",kind=\"upstream_connect\"}",
    ) + metric(
        &text,
        "gantry_gateway_errors_total{model=\"tiny\",kind=\"upstream_request\"}",
    );
    assert!(
        failed_tries >= 1.0,
        "the dead backend was never tried:\n{text}"
    );
    assert_eq!(
        metric(
            &text,
            "gantry_gateway_errors_total{model=\"tiny\",kind=\"all_tries_failed\"}"
        ),
        0.0
    );

    drop(second);
    cluster.server.shutdown().await;
}

/// A stand-in backend (a test double, not a model server) that answers every request
/// with 503, as llama-server does while it loads a model.
async fn unavailable_backend() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buffer = [0u8; 4096];
                loop {
                    match socket.read(&mut buffer).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buffer[..n]),
                    }
                    // Good enough for the gateway's requests: headers, then a body of
                    // the declared length arrives at once.
                    if request.windows(4).any(|w| w == b"\r\n\r\n") {
                        request.clear();
                        let answer = "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: 37\r\n\r\n{\"error\":{\"message\":\"Loading model\"}}";
                        if socket.write_all(answer.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    address
}

async fn a_503_from_an_instance_is_retried_on_another(engine: TestEngine) {
    let cluster = Cluster::start(engine).await;
    let backend = cluster.llama_server().await;
    let loading = unavailable_backend().await;
    cluster.deploy("tiny", &[loading, backend.address()]).await;
    for _ in 0..4 {
        let (status, instance, reply) = cluster.chat("tiny").await;
        assert_eq!(status, StatusCode::OK, "{reply}");
        assert_eq!(
            instance.as_deref(),
            Some("tiny-1"),
            "served by the loading instance"
        );
    }
    let text = cluster.metrics().await;
    assert!(
        metric(
            &text,
            "gantry_gateway_errors_total{model=\"tiny\",kind=\"upstream_unavailable\"}"
        ) >= 1.0,
        "{text}"
    );
    drop(backend);
    cluster.server.shutdown().await;
}

async fn gateway_errors_have_the_openai_shape(engine: TestEngine) {
    let cluster = Cluster::start(engine).await;
    let chat = json!({"model": "tiny", "messages": [{"role": "user", "content": "x"}]});

    // No key, a wrong key, a worker credential.
    for key in [None, Some("gantry_nope_nope")] {
        let (status, _, body) = cluster
            .post("/v1/chat/completions", key, chat.clone())
            .await;
        assert_openai_error(
            status,
            &body,
            401,
            "invalid_request_error",
            "invalid_api_key",
        );
    }
    let (status, _, body) = cluster
        .post(
            "/v1/chat/completions",
            cluster.worker.token().as_deref(),
            chat.clone(),
        )
        .await;
    assert_openai_error(status, &body, 403, "permission_error", "forbidden");
    // The console's session cookie is a credential too (its playground sends it); a
    // wrong one is refused like a wrong key.
    let session = cluster.admin().token().unwrap().to_owned();
    for (cookie, expected) in [
        (
            format!("theme=dark; gantry_session={session}"),
            StatusCode::OK,
        ),
        ("gantry_session=nope".to_owned(), StatusCode::UNAUTHORIZED),
    ] {
        let response = cluster
            .server
            .http
            .get(format!("{}/v1/models", cluster.server.base))
            .header(reqwest::header::COOKIE, cookie)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), expected);
    }
    let response = cluster
        .server
        .http
        .get(format!("{}/v1/models", cluster.server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);

    // Bad bodies.
    let (status, _, body) = cluster
        .post(
            "/v1/chat/completions",
            Some(&cluster.key),
            json!({"messages": []}),
        )
        .await;
    let error = assert_openai_error(status, &body, 400, "invalid_request_error", "missing_model");
    assert_eq!(error["param"], "model");
    let (status, body) = cluster
        .server
        .raw_bytes(
            Method::POST,
            "/v1/chat/completions",
            Some(&cluster.key),
            "application/json",
            b"{nope".to_vec(),
        )
        .await;
    assert_openai_error(
        status,
        &body,
        400,
        "invalid_request_error",
        "invalid_request",
    );

    // An unknown model (on every endpoint); a model without a running instance.
    for path in ["/v1/chat/completions", "/v1/completions", "/v1/embeddings"] {
        let (status, _, body) = cluster
            .post(
                path,
                Some(&cluster.key),
                json!({"model": "no-such-model", "input": "x"}),
            )
            .await;
        let error = assert_openai_error(
            status,
            &body,
            404,
            "invalid_request_error",
            "model_not_found",
        );
        assert_eq!(error["param"], "model");
    }
    cluster.deploy("idle", &[]).await;
    let (status, _, body) = cluster
        .post(
            "/v1/chat/completions",
            Some(&cluster.key),
            json!({"model": "idle", "messages": []}),
        )
        .await;
    assert_openai_error(status, &body, 503, "server_error", "model_not_ready");

    // A running instance nobody listens at: every try fails, 502.
    let dead = format!("127.0.0.1:{}", free_port());
    cluster.deploy("dead", &[dead]).await;
    let (status, instance, body) = cluster
        .post(
            "/v1/chat/completions",
            Some(&cluster.key),
            json!({"model": "dead", "messages": []}),
        )
        .await;
    let error = assert_openai_error(status, &body, 502, "server_error", "upstream_error");
    assert!(
        error["message"].as_str().unwrap().contains("dead-0"),
        "{error}"
    );
    assert!(instance.is_none());

    // /v1/models lists only models with a running instance.
    let response = cluster
        .server
        .http
        .get(format!("{}/v1/models", cluster.server.base))
        .bearer_auth(&cluster.key)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let list: Value = response.json().await.unwrap();
    assert_eq!(list["object"], "list");
    let ids: Vec<&str> = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec!["dead"], "{list}");
    assert_eq!(list["data"][0]["object"], "model");
    assert_eq!(list["data"][0]["owned_by"], "gantry");
    assert!(list["data"][0]["created"].as_i64().unwrap() > 1_600_000_000);

    // A deleted API key stops working at once (the gateway remembers accepted keys
    // for a moment, and forgets them on the change).
    let second = cluster
        .admin()
        .create_api_key(&api_key("short-lived"))
        .await
        .unwrap();
    let second_key = second.key.clone();
    let models = |key: String| {
        let request = cluster
            .server
            .http
            .get(format!("{}/v1/models", cluster.server.base))
            .bearer_auth(key);
        async move { request.send().await.unwrap().status() }
    };
    assert_eq!(models(second_key.clone()).await, StatusCode::OK);
    // The hot routes too, where a keep-alive connection keeps its last key for its
    // next requests (authenticated, the request gets as far as the model: 503).
    let chat = |key: String| {
        let request = cluster
            .server
            .http
            .post(format!("{}/v1/chat/completions", cluster.server.base))
            .bearer_auth(key)
            .json(&json!({"model": "idle", "messages": []}));
        async move { request.send().await.unwrap().status() }
    };
    for _ in 0..3 {
        assert_eq!(
            chat(second_key.clone()).await,
            StatusCode::SERVICE_UNAVAILABLE
        );
    }
    cluster
        .admin()
        .delete_api_key(second.api_key.id)
        .await
        .unwrap();
    gantry_testkit::eventually(
        "the gateway to refuse the deleted key",
        Duration::from_secs(1),
        Duration::from_millis(20),
        || async { Ok::<_, std::convert::Infallible>(models(second_key.clone()).await) },
        |status| *status == StatusCode::UNAUTHORIZED,
        String::new,
    )
    .await;
    // At once on the connection that kept it: the deletion ended its grant.
    assert_eq!(chat(second_key.clone()).await, StatusCode::UNAUTHORIZED);

    // Unknown gateway paths and wrong methods keep the shape too.
    let (status, _, body) = cluster
        .post("/v1/nothing-here", Some(&cluster.key), json!({}))
        .await;
    assert_openai_error(status, &body, 404, "invalid_request_error", "unknown_url");
    let response = cluster
        .server
        .http
        .get(format!("{}/v1/chat/completions", cluster.server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED);
    // RFC 9110: a 405 lists the methods the path takes.
    assert_eq!(
        response
            .headers()
            .get("allow")
            .and_then(|v| v.to_str().ok()),
        Some("POST")
    );

    let text = cluster.metrics().await;
    assert!(
        metric(
            &text,
            "gantry_gateway_requests_total{model=\"\",code=\"401\"}"
        ) >= 2.0,
        "{text}"
    );
    assert!(
        metric(
            &text,
            "gantry_gateway_requests_total{model=\"\",code=\"404\"}"
        ) >= 3.0,
        "{text}"
    );
    assert_eq!(
        metric(
            &text,
            "gantry_gateway_requests_total{model=\"idle\",code=\"503\"}"
        ),
        // One asked above, three with the short-lived key.
        4.0,
        "{text}"
    );
    assert_eq!(
        metric(
            &text,
            "gantry_gateway_requests_total{model=\"dead\",code=\"502\"}"
        ),
        1.0,
        "{text}"
    );
    assert_eq!(
        metric(
            &text,
            "gantry_gateway_errors_total{model=\"dead\",kind=\"all_tries_failed\"}"
        ),
        1.0,
        "{text}"
    );
    // The scheduler queue is the pending and analyzing instances (the idle model's
    // replica, unless a scheduler has placed it meanwhile).
    assert_eq!(
        metric(&text, "gantry_scheduler_queue_length"),
        metric(&text, "gantry_instances{state=\"pending\"}")
            + metric(&text, "gantry_instances{state=\"analyzing\"}"),
        "{text}"
    );
    cluster.server.shutdown().await;
}

/// A stand-in backend for the cancellation test (a test double, not a model server):
/// it answers one request with SSE headers and one event, then keeps the connection
/// open and reports when the gateway closes it.
async fn hanging_sse_backend() -> (String, tokio::sync::oneshot::Receiver<()>) {
    hanging_backend(true).await
}

/// Like [`hanging_sse_backend`]; with `answer: false` it never answers at all.
async fn hanging_backend(answer: bool) -> (String, tokio::sync::oneshot::Receiver<()>) {
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

async fn a_client_disconnect_cancels_the_upstream_request(engine: TestEngine) {
    let cluster = Cluster::start(engine).await;
    let (address, closed) = hanging_sse_backend().await;
    cluster.deploy("slow", &[address]).await;
    let response = cluster
        .server
        .http
        .post(format!("{}/v1/chat/completions", cluster.server.base))
        .bearer_auth(&cluster.key)
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
    let text = cluster.metrics().await;
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
    let text = cluster.wait_idle("slow", "slow-0").await;
    assert_eq!(
        metric(
            &text,
            "gantry_gateway_errors_total{model=\"slow\",kind=\"client_disconnected\"}"
        ),
        1.0,
        "{text}"
    );
    cluster.server.shutdown().await;
}

async fn a_client_disconnect_before_the_answer_cancels_the_upstream_request(engine: TestEngine) {
    let cluster = Cluster::start(engine).await;
    let (address, closed) = hanging_backend(false).await;
    cluster.deploy("mute", &[address]).await;
    // The client gives up while the gateway still waits for the response head.
    let result = cluster
        .server
        .http
        .post(format!("{}/v1/chat/completions", cluster.server.base))
        .bearer_auth(&cluster.key)
        .timeout(Duration::from_millis(500))
        .json(&json!({"model": "mute", "messages": []}))
        .send()
        .await;
    assert!(result.unwrap_err().is_timeout());
    tokio::time::timeout(Duration::from_secs(10), closed)
        .await
        .expect("the backend connection is closed when the client gives up")
        .unwrap();
    cluster.wait_idle("mute", "mute-0").await;
    cluster.server.shutdown().await;
}

const OPENAI_CLIENT_CHECK: &str = r#"
import sys
import openai

base_url, api_key, model = sys.argv[1:4]
client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=60)
messages = [{"role": "user", "content": "hello"}]

reply = client.chat.completions.create(model=model, messages=messages, max_tokens=4)
assert reply.choices[0].message.role == "assistant", reply
assert reply.usage.total_tokens > 0, reply

chunks = list(client.chat.completions.create(model=model, messages=messages, max_tokens=4, stream=True))
assert chunks, "no chunks"
assert all(chunk.choices for chunk in chunks), "a usage-only chunk reached the client"

chunks = list(client.chat.completions.create(
    model=model, messages=messages, max_tokens=4, stream=True,
    stream_options={"include_usage": True}))
assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0, chunks[-1]

assert model in [m.id for m in client.models.list().data]

try:
    client.chat.completions.create(model="no-such-model", messages=messages)
    raise AssertionError("expected a 404")
except openai.NotFoundError as e:
    assert e.code == "model_not_found", e.body
print("openai client ok")
"#;

async fn the_official_openai_python_client_works_against_the_gateway(engine: TestEngine) {
    let Some(python) = std::env::var_os("GANTRY_PYTHON") else {
        panic!(
            "GANTRY_PYTHON is not set. This test runs the official openai Python client: run \
             the tests with scripts/test.sh, or set GANTRY_PYTHON=$(scripts/python-env.sh | tail -1)."
        );
    };
    let cluster = Cluster::start(engine).await;
    let backend = cluster.llama_server().await;
    cluster.deploy("tiny", &[backend.address()]).await;
    let output = tokio::process::Command::new(&python)
        .arg("-c")
        .arg(OPENAI_CLIENT_CHECK)
        .arg(format!("{}/v1", cluster.server.base))
        .arg(&cluster.key)
        .arg("tiny")
        .output()
        .await
        .unwrap_or_else(|e| panic!("run {python:?}: {e}"));
    assert!(
        output.status.success(),
        "the openai client failed ({}):\nstdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    drop(backend);
    cluster.server.shutdown().await;
}

/// The first-byte timeout the ejection test configures.
const FIRST_BYTE_TIMEOUT: Duration = Duration::from_secs(2);
/// The failures in a row the ejection test configures.
const EJECT_AFTER: usize = 3;

async fn a_frozen_instance_is_ejected_and_every_request_is_served_by_the_other(engine: TestEngine) {
    let cluster = Cluster::start_with(engine, |config| {
        config.gateway_first_byte_timeout = Some(FIRST_BYTE_TIMEOUT);
        config.gateway_eject_after = EJECT_AFTER;
        // Far longer than the test: the frozen instance must not come back during it.
        config.gateway_eject_cooldown = Duration::from_secs(600);
    })
    .await;
    let frozen = cluster.llama_server().await;
    let healthy = cluster.llama_server().await;
    // tiny-0 is the frozen one; solo-0 is the same frozen server, alone in its model.
    cluster
        .deploy("tiny", &[frozen.address(), healthy.address()])
        .await;
    cluster.deploy("solo", &[frozen.address()]).await;
    frozen.freeze();

    let chatter = cluster.chatter();
    let timeouts = "gantry_gateway_errors_total{model=\"tiny\",kind=\"upstream_timeout\"}";
    let ejections =
        "gantry_gateway_instance_ejections_total{model=\"tiny\",model_instance=\"tiny-0\"}";
    let mut ejected_after = None;
    let mut slowest = Duration::ZERO;
    for i in 0..20 {
        let (status, instance, reply, took) = chatter.chat("tiny").await;
        assert_eq!(status, StatusCode::OK, "request {i}: {reply}");
        assert_eq!(instance.as_deref(), Some("tiny-1"), "request {i}");
        // At most one try waited out the timeout; generous for a busy machine.
        assert!(
            took < FIRST_BYTE_TIMEOUT + Duration::from_secs(8),
            "request {i} took {took:?}"
        );
        slowest = slowest.max(took);
        if ejected_after.is_none() && metric(&cluster.metrics().await, ejections) == 1.0 {
            ejected_after = Some(i + 1);
        }
    }
    let ejected_after = ejected_after.expect("the frozen instance was never ejected");
    let text = cluster.metrics().await;
    assert_eq!(metric(&text, timeouts), EJECT_AFTER as f64, "{text}");
    // Each request tries the frozen instance first while the balancer's turn falls on
    // it (every one, as the turns go with two instances): ejected after about as many.
    assert!(
        (EJECT_AFTER..=2 * EJECT_AFTER).contains(&ejected_after),
        "ejected after {ejected_after} requests:\n{text}"
    );
    assert_eq!(
        metric(
            &text,
            "gantry_gateway_instance_ejected{model=\"tiny\",model_instance=\"tiny-0\"}"
        ),
        1.0,
        "{text}"
    );

    // Concurrent requests after the ejection: none is sent to the frozen instance, even
    // though it is the least loaded.
    let concurrent: Vec<_> = (0..5)
        .map(|_| {
            let chatter = chatter.clone();
            tokio::spawn(async move { chatter.chat("tiny").await })
        })
        .collect();
    for request in concurrent {
        let (status, instance, reply, took) = request.await.unwrap();
        assert_eq!(status, StatusCode::OK, "{reply}");
        assert_eq!(instance.as_deref(), Some("tiny-1"));
        slowest = slowest.max(took);
    }
    let text = cluster.metrics().await;
    assert_eq!(
        metric(&text, timeouts),
        EJECT_AFTER as f64,
        "an ejected instance got another try:\n{text}"
    );
    assert_eq!(metric(&text, ejections), 1.0, "{text}");
    assert_eq!(
        metric(
            &text,
            "gantry_gateway_errors_total{model=\"tiny\",kind=\"all_tries_failed\"}"
        ),
        0.0,
        "{text}"
    );
    eprintln!(
        "measured: frozen instance ejected after {ejected_after} requests; slowest of 25 requests {slowest:?}"
    );

    // A model whose only instance is frozen: 504 once the timeout runs out, naming it.
    let (status, _, reply, took) = chatter.chat("solo").await;
    let error = assert_openai_error(status, &reply, 504, "server_error", "upstream_timeout");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("gateway_first_byte_timeout"),
        "{reply}"
    );
    assert!(
        took >= FIRST_BYTE_TIMEOUT && took < FIRST_BYTE_TIMEOUT + Duration::from_secs(8),
        "the 504 took {took:?}"
    );
    eprintln!("measured: 504 from the frozen single instance after {took:?}");

    frozen.thaw();
    drop((frozen, healthy));
    cluster.server.shutdown().await;
}

async fn a_request_waiting_on_an_instance_that_leaves_routing_is_retried_at_once(
    engine: TestEngine,
) {
    // No first-byte timeout: only the instance leaving routing can free the request.
    let cluster = Cluster::start(engine).await;
    let frozen = cluster.llama_server().await;
    let healthy = cluster.llama_server().await;
    let ids = cluster
        .deploy("tiny", &[frozen.address(), healthy.address()])
        .await;
    frozen.freeze();

    // Send requests until one waits on the frozen instance: the balancer takes turns
    // while both are idle.
    let chatter = cluster.chatter();
    let stuck_series =
        "gantry_gateway_instance_requests_in_flight{model=\"tiny\",model_instance=\"tiny-0\"}";
    let mut stuck = None;
    'send: for _ in 0..4 {
        let request = tokio::spawn({
            let chatter = chatter.clone();
            async move { chatter.chat("tiny").await }
        });
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            if metric(&cluster.metrics().await, stuck_series) == 1.0 {
                stuck = Some(request);
                break 'send;
            }
            if request.is_finished() {
                let (status, instance, reply, _) = request.await.unwrap();
                assert_eq!(status, StatusCode::OK, "{reply}");
                assert_eq!(instance.as_deref(), Some("tiny-1"));
                continue 'send;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "a request neither ended nor waited on tiny-0"
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
    let stuck = stuck.expect("no request was sent to the frozen instance");
    // It stays stuck: nothing else frees it.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !stuck.is_finished(),
        "the request on the frozen instance ended by itself"
    );

    // Its worker finds it failing its health probe.
    let reported = tokio::time::Instant::now();
    cluster
        .report(ids[0], InstanceState::Unhealthy, &frozen.address())
        .await;
    let (status, instance, reply, took) = tokio::time::timeout(Duration::from_secs(10), stuck)
        .await
        .expect("the request on the instance that left routing was not retried")
        .unwrap();
    let retried_after = reported.elapsed();
    assert_eq!(status, StatusCode::OK, "{reply}");
    assert_eq!(instance.as_deref(), Some("tiny-1"));
    assert!(
        retried_after < Duration::from_secs(5),
        "retried only after {retried_after:?}"
    );
    eprintln!(
        "measured: request answered {retried_after:?} after tiny-0 was reported unhealthy ({took:?} in all)"
    );
    let text = cluster.wait_idle("tiny", "tiny-1").await;
    assert_eq!(
        metric(
            &text,
            "gantry_gateway_errors_total{model=\"tiny\",kind=\"instance_left_routing\"}"
        ),
        1.0,
        "{text}"
    );
    assert_eq!(
        metric(&text, "gantry_gateway_routable_instances{model=\"tiny\"}"),
        1.0,
        "{text}"
    );

    frozen.thaw();
    drop((frozen, healthy));
    cluster.server.shutdown().await;
}

/// One HTTP/1.1 response as read off a raw connection.
#[derive(Debug)]
struct RawResponse {
    status: u16,
    /// Header names lowercased.
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl RawResponse {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&self.body)))
    }
}

/// Reads more of `stream` into `buf`; fails the test on EOF or after 30 s.
async fn read_more(stream: &mut tokio::net::TcpStream, buf: &mut Vec<u8>) {
    let mut chunk = [0u8; 8192];
    let n = tokio::time::timeout(Duration::from_secs(30), stream.read(&mut chunk))
        .await
        .expect("the gateway answers within 30 s")
        .unwrap();
    assert!(
        n > 0,
        "the connection closed mid-response: {:?}",
        String::from_utf8_lossy(buf)
    );
    buf.extend_from_slice(&chunk[..n]);
}

/// Reads one response off `stream` (what follows it stays in `buf`): a plain
/// HTTP/1.1 parser, independent of the gateway's, with content-length and chunked
/// bodies.
async fn read_raw_response(stream: &mut tokio::net::TcpStream, buf: &mut Vec<u8>) -> RawResponse {
    let head_end = loop {
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        read_more(stream, buf).await;
    };
    let head = String::from_utf8(buf.drain(..head_end).collect()).unwrap();
    let mut lines = head.trim_end().split("\r\n");
    let status_line = lines.next().unwrap();
    assert!(status_line.starts_with("HTTP/1.1 "), "{head}");
    let status: u16 = status_line[9..12].parse().unwrap();
    let headers: Vec<(String, String)> = lines
        .map(|line| {
            let (name, value) = line.split_once(':').unwrap();
            (name.trim().to_ascii_lowercase(), value.trim().to_string())
        })
        .collect();
    let mut response = RawResponse {
        status,
        headers,
        body: Vec::new(),
    };
    if status == 100 {
        return response;
    }
    if let Some(length) = response.header("content-length") {
        let length: usize = length.parse().unwrap();
        while buf.len() < length {
            read_more(stream, buf).await;
        }
        response.body = buf.drain(..length).collect();
        return response;
    }
    assert_eq!(
        response.header("transfer-encoding"),
        Some("chunked"),
        "{head}"
    );
    loop {
        let line_end = loop {
            if let Some(at) = buf.windows(2).position(|w| w == b"\r\n") {
                break at;
            }
            read_more(stream, buf).await;
        };
        let size_text = String::from_utf8(buf.drain(..line_end + 2).collect()).unwrap();
        let size = usize::from_str_radix(size_text.trim_end().split(';').next().unwrap(), 16)
            .unwrap_or_else(|e| panic!("chunk size {size_text:?}: {e}"));
        while buf.len() < size + 2 {
            read_more(stream, buf).await;
        }
        response.body.extend(buf.drain(..size));
        assert_eq!(buf.drain(..2).collect::<Vec<u8>>(), b"\r\n");
        if size == 0 {
            return response;
        }
    }
}

/// A request with a content-length body, as raw bytes.
fn raw_post(path: &str, key: &str, body: &Value, extra: &str) -> Vec<u8> {
    let body = body.to_string();
    let mut request = format!(
        "POST {path} HTTP/1.1\r\nhost: gantry\r\nauthorization: Bearer {key}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{extra}\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(body.as_bytes());
    request
}

/// The gateway's HTTP/1.1 on raw connections, against a real llama-server: keep-alive
/// and pipelined requests, streaming, `Expect: 100-continue`, a connection that moves
/// on to the management API, a chunked request body, an error that keeps the
/// connection, and `Connection: close`.
async fn the_gateway_speaks_http1_on_raw_connections(engine: TestEngine) {
    let cluster = Cluster::start(engine).await;
    let llama = cluster.llama_server().await;
    cluster.deploy("tiny", &[llama.address()]).await;
    let address = cluster
        .server
        .base
        .trim_start_matches("http://")
        .to_string();
    let key = cluster.key.clone();
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

    // The same connection moves on to the management API, then back to the gateway.
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
    let base = cluster.server.base.clone();
    let stopping = tokio::spawn(cluster.server.shutdown());
    let http = reqwest::Client::new();
    let began = std::time::Instant::now();
    loop {
        let ready = http.get(format!("{base}/readyz")).send().await.unwrap();
        if ready.status() == reqwest::StatusCode::SERVICE_UNAVAILABLE {
            break;
        }
        assert!(
            began.elapsed() < Duration::from_secs(10),
            "the server drains"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    stream
        .write_all(&raw_post("/v1/completions", &key, &completion, ""))
        .await
        .unwrap();
    let draining = read_raw_response(&mut stream, &mut buf).await;
    assert_eq!(draining.status, 200, "{draining:?}");
    assert_eq!(draining.header("connection"), Some("close"), "{draining:?}");
    stopping.await.unwrap();
    drop(llama);
}

test_both_engines!(
    chat_and_completions_are_proxied_and_usage_is_recorded,
    streaming_arrives_as_sse_with_a_usage_chunk_only_when_asked,
    requests_spread_over_instances_and_survive_a_killed_backend,
    a_503_from_an_instance_is_retried_on_another,
    gateway_errors_have_the_openai_shape,
    a_client_disconnect_cancels_the_upstream_request,
    a_client_disconnect_before_the_answer_cancels_the_upstream_request,
    the_official_openai_python_client_works_against_the_gateway,
    a_frozen_instance_is_ejected_and_every_request_is_served_by_the_other,
    a_request_waiting_on_an_instance_that_leaves_routing_is_retried_at_once,
    the_gateway_speaks_http1_on_raw_connections,
);
