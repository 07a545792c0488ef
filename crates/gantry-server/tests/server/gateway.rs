//! The gateway as part of the server, against SQLite and PostgreSQL: what the management
//! API and the worker agent write reaches the gateway through the store (models, instance
//! reports, API keys, worker credentials, sessions), the usage the gateway records is what
//! the management API reports, and the server's drain reaches the gateway's connections.
//!
//! How the gateway itself proxies, retries, ejects, streams and speaks HTTP/1.1 is tested
//! in its own crate (`crates/gantry-gateway/tests/gateway/`), without a server; here the
//! backend is a stand-in on a loopback port that answers every request with the same
//! usage.
//!
//! The management API (models, placement, state reports, keys, usage) is called through
//! the typed client. The gateway (`/v1/*`) and `/metrics` are called with raw HTTP: they
//! are the OpenAI-compatible wire and Prometheus text, which the client does not cover.

use std::path::PathBuf;
use std::time::Duration;

use crate::common::{
    api_key, assert_raw_error, expect_error, model, simulated_worker, user, Options, TestServer,
};
use gantry_client::Client;
use gantry_server::ServerConfig;
use gantry_testkit::gateway::{
    assert_one_instance_running_on_one_ready_worker, assert_openai_error,
    assert_scheduler_queue_is_the_waiting_instances, fixed_answer_backend, metric, GatewayClient,
};
use gantry_testkit::{test_both_engines, TestEngine};
use gantry_types::usage::{UsageBucket, UsageQuery, UsageReport};
use gantry_types::{
    ApiKeyQuery, ErrorCode, InstancePatch, InstanceState, InstanceStateReport, Timestamp,
};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The usage the stand-in backend reports for every request.
const PROMPT_TOKENS: u64 = 7;
const COMPLETION_TOKENS: u64 = 3;

/// A stand-in backend (a test double, not a model server) that answers every request
/// with the same chat completion and its usage.
async fn answering_backend() -> String {
    let body = json!({
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": COMPLETION_TOKENS,
                  "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS},
    })
    .to_string();
    let answer = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    fixed_answer_backend(answer).await
}

/// A server with an admin, an API key and a registered (simulated-GPU) worker.
struct Cluster {
    server: TestServer,
    /// The API key the gateway requests carry.
    key: String,
    /// The registered worker's client (its credential).
    worker: Client,
    worker_id: i64,
    /// Holds the model file.
    _dir: tempfile::TempDir,
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
            _dir: dir,
            model_file,
        }
    }

    /// A client of the gateway's wire.
    fn gateway(&self) -> GatewayClient<'_> {
        GatewayClient::new(&self.server.http, &self.server.base)
    }

    fn admin(&self) -> &Client {
        self.server.client()
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

    /// Waits until the gateway routes to `count` instances of the model.
    async fn wait_routable(&self, model: &str, count: usize) {
        self.gateway().wait_routable(model, count).await;
    }

    async fn metrics(&self) -> String {
        self.gateway().metrics().await
    }

    async fn post(
        &self,
        path: &str,
        key: Option<&str>,
        body: Value,
    ) -> (StatusCode, Option<String>, Value) {
        self.gateway().post(path, key, body).await
    }

    async fn chat(&self, model: &str) -> (StatusCode, Option<String>, Value) {
        self.gateway().chat(&self.key, model).await
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

async fn usage_the_gateway_records_is_reported_by_the_management_api(engine: TestEngine) {
    let cluster = Cluster::start(engine).await;
    let backend = answering_backend().await;
    let instances = cluster.deploy("tiny", &[backend]).await;
    let admin = cluster.admin();
    let instance_name = admin.get_instance(instances[0]).await.unwrap().name;

    for _ in 0..3 {
        let (status, served_by, reply) = cluster.chat("tiny").await;
        assert_eq!(status, StatusCode::OK, "{reply}");
        assert_eq!(served_by.as_deref(), Some(instance_name.as_str()));
    }
    let (status, _, reply) = cluster
        .post(
            "/v1/completions",
            Some(&cluster.key),
            json!({"model": "tiny", "prompt": "hello", "max_tokens": 3}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    let prompt_tokens = 4 * PROMPT_TOKENS;
    let completion_tokens = 4 * COMPLETION_TOKENS;

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

    // The cluster's counts in /metrics are the store's.
    let text = cluster.metrics().await;
    assert_one_instance_running_on_one_ready_worker(&text);
    cluster.server.shutdown().await;
}

async fn the_gateway_follows_what_the_management_api_and_workers_write(engine: TestEngine) {
    let cluster = Cluster::start(engine).await;
    let chat = json!({"model": "tiny", "messages": [{"role": "user", "content": "x"}]});

    // A worker's credential, registered through the agent API, cannot call the gateway.
    let (status, _, body) = cluster
        .post(
            "/v1/chat/completions",
            cluster.worker.token().as_deref(),
            chat.clone(),
        )
        .await;
    assert_openai_error(status, &body, 403, "permission_error", "forbidden");
    // The session of a login is a credential, also as the console's cookie.
    let session = cluster.admin().token().unwrap().to_owned();
    cluster
        .gateway()
        .assert_session_cookie_is_a_credential(&session)
        .await;

    // A model created through the API, with no instance running: 503.
    cluster.deploy("idle", &[]).await;
    let (status, _, body) = cluster
        .post(
            "/v1/chat/completions",
            Some(&cluster.key),
            json!({"model": "idle", "messages": []}),
        )
        .await;
    assert_openai_error(status, &body, 503, "server_error", "model_not_ready");

    // Placed through the API and reported running by its worker: routed, and listed.
    let backend = answering_backend().await;
    let ids = cluster.deploy("tiny", std::slice::from_ref(&backend)).await;
    let (status, instance, reply) = cluster.chat("tiny").await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    assert_eq!(instance.as_deref(), Some("tiny-0"));
    let response = cluster
        .server
        .http
        .get(format!("{}/v1/models", cluster.server.base))
        .bearer_auth(&cluster.key)
        .send()
        .await
        .unwrap();
    let list: Value = response.json().await.unwrap();
    let listed: Vec<&str> = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(listed, vec!["tiny"], "{list}");
    // Reported unhealthy by its worker: out of routing.
    cluster
        .report(ids[0], InstanceState::Unhealthy, &backend)
        .await;
    cluster
        .gateway()
        .metrics_until("no longer routes to tiny-0", |text| {
            metric(text, "gantry_gateway_routable_instances{model=\"tiny\"}") == 0.0
        })
        .await;
    let (status, _, body) = cluster.chat("tiny").await;
    assert_openai_error(status, &body, 503, "server_error", "model_not_ready");

    // A deleted API key stops working at once (the gateway remembers accepted keys
    // for a moment, and forgets them on the change), also on a kept connection.
    let second = cluster
        .admin()
        .create_api_key(&api_key("short-lived"))
        .await
        .unwrap();
    cluster
        .gateway()
        .assert_deleted_key_refused(&second.key, "idle", async {
            cluster
                .admin()
                .delete_api_key(second.api_key.id)
                .await
                .unwrap();
        })
        .await;

    // The scheduler queue is the pending and analyzing instances (the idle model's
    // replica, unless a scheduler has placed it meanwhile).
    assert_scheduler_queue_is_the_waiting_instances(&cluster.metrics().await);

    // While the server drains, an answer on a kept connection closes it (the client
    // moves to another server).
    let address = cluster.server.base.trim_start_matches("http://").to_owned();
    let mut stream = tokio::net::TcpStream::connect(&address).await.unwrap();
    let models = format!(
        "GET /v1/models HTTP/1.1\r\nhost: gantry\r\nauthorization: Bearer {}\r\n\r\n",
        cluster.key
    );
    stream.write_all(models.as_bytes()).await.unwrap();
    let before = read_head(&mut stream).await;
    assert!(before.starts_with("http/1.1 200"), "{before}");
    assert!(!before.contains("connection: close"), "{before}");
    let base = cluster.server.base.clone();
    let stopping = tokio::spawn(cluster.server.shutdown());
    let http = reqwest::Client::new();
    let began = std::time::Instant::now();
    loop {
        let ready = http.get(format!("{base}/readyz")).send().await.unwrap();
        if ready.status() == StatusCode::SERVICE_UNAVAILABLE {
            break;
        }
        assert!(
            began.elapsed() < Duration::from_secs(10),
            "the server drains"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    stream.write_all(models.as_bytes()).await.unwrap();
    let draining = read_head(&mut stream).await;
    assert!(draining.starts_with("http/1.1 200"), "{draining}");
    assert!(draining.contains("connection: close"), "{draining}");
    stopping.await.unwrap();
}

/// Reads one response with a content-length body off `stream`; returns its head,
/// lowercased.
async fn read_head(stream: &mut tokio::net::TcpStream) -> String {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        let n = tokio::time::timeout(Duration::from_secs(30), stream.read(&mut chunk))
            .await
            .expect("the server answers within 30 s")
            .unwrap();
        assert!(n > 0, "the connection closed mid-response");
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|line| line.strip_prefix("content-length:"))
        .expect("a content-length answer")
        .trim()
        .parse()
        .unwrap();
    while buf.len() < head_end + length {
        let n = stream.read(&mut chunk).await.unwrap();
        assert!(n > 0, "the connection closed mid-body");
        buf.extend_from_slice(&chunk[..n]);
    }
    head
}

test_both_engines!(
    usage_the_gateway_records_is_reported_by_the_management_api,
    the_gateway_follows_what_the_management_api_and_workers_write,
);
