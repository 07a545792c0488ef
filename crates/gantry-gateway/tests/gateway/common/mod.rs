//! The gateway on a loopback port, started as the server starts it (`start`, then `serve`
//! with a fallback router), with no server around it.
//!
//! What the gateway reads from the store (models, instances) is a [`MemoryStore`]: a test
//! "deploys" a model by writing it and its running instances there, as a worker's state
//! report would reach the store. Who calls is decided by the real `Authenticator`, which
//! reads users, API keys and workers from a SQLite store of the test's own (no server, no
//! management API: the rows are written directly).

pub mod fake;
pub mod llama;
pub mod prometheus;
pub mod raw;

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use gantry_auth::jwt::JwtKeys;
use gantry_auth::sealed::Sealer;
use gantry_auth::secrets::{digest, generate_worker_credential, GeneratedApiKey};
use gantry_auth::{password, AuthConfig, Authenticator};
use gantry_gateway::testing::MemoryStore;
use gantry_gateway::{GatewayConfig, GatewayContext, ServeConfig};
use gantry_store::{NewApiKey, NewUser, Store, StoreConfig};
pub use gantry_testkit::free_port;
use gantry_testkit::gateway::{answer_of, chat_request, GatewayClient};
pub use gantry_testkit::gateway::{assert_openai_error, metric};
use gantry_types::{fixtures, ApiKeyLimits, InstanceState, ModelInstance, Role};
use reqwest::StatusCode;
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The cluster secret session tokens are signed with.
const SECRET: &[u8] = b"the gateway tests' cluster secret";

/// The worker every deployed instance is placed on.
const WORKER_ID: i64 = 1;

/// A gateway serving on `127.0.0.1:0`, an admin with an API key and a session.
pub struct TestGateway {
    /// What the gateway routes by.
    pub store: Arc<MemoryStore>,
    /// Users, API keys and workers, for the authenticator.
    pub db: Store,
    /// `http://127.0.0.1:<port>`.
    pub base: String,
    pub http: reqwest::Client,
    /// The admin's API key, and its id.
    pub key: String,
    pub key_id: i64,
    /// The admin's id, and a session token of theirs.
    pub admin_id: i64,
    pub session: String,
    shutdown: CancellationToken,
    draining: CancellationToken,
    tasks: TaskTracker,
    next_id: AtomicI64,
    dir: tempfile::TempDir,
}

impl TestGateway {
    pub async fn start() -> Self {
        Self::start_with(|_| {}).await
    }

    /// Like [`TestGateway::start`], with the gateway's configuration changed by
    /// `configure`.
    pub async fn start_with(configure: fn(&mut GatewayConfig)) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let db = Store::open(&StoreConfig {
            url: format!("sqlite://{}/gantry.db", dir.path().display()),
            max_connections: 4,
        })
        .await
        .unwrap();
        let store = Arc::new(MemoryStore::new());
        store.put_worker(fixtures::worker(WORKER_ID, 1));
        let shutdown = CancellationToken::new();
        let draining = CancellationToken::new();
        let tasks = TaskTracker::new();
        let jwt = JwtKeys::new(SECRET, Duration::from_secs(3600));
        let authenticator = Arc::new(Authenticator::new(db.clone(), jwt, AuthConfig::default()));
        authenticator.spawn(&shutdown, &tasks);

        let admin = db
            .create_user(&NewUser {
                cluster_admin_of: Vec::new(),
                username: "admin".into(),
                password_hash: password::hash("admin-password-1".into()).await.unwrap(),
                role: Role::Admin,
                full_name: String::new(),
                require_password_change: false,
            })
            .await
            .unwrap();
        let session_version = db.user_record(admin.id).await.unwrap().session_version;
        let (session, _) = authenticator
            .jwt()
            .issue(admin.id, "admin", Role::Admin, session_version)
            .unwrap();

        let mut config = GatewayConfig {
            // Usage reaches the store quickly, so tests wait little for it.
            usage_flush_interval: Duration::from_millis(100),
            ..GatewayConfig::default()
        };
        configure(&mut config);
        let gateway = gantry_gateway::start(
            config,
            GatewayContext {
                store: Arc::clone(&store) as Arc<dyn gantry_gateway::GatewayStore>,
                authenticator,
                shutdown: shutdown.clone(),
                tasks: tasks.clone(),
                server_id: "server-1".into(),
                provider_keys: Arc::new(Sealer::provider_keys(SECRET)),
            },
        )
        .await
        .unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        // What the server's own router would answer: here one path, to see a connection
        // leave the gateway's routes and come back.
        let fallback = Router::new().route("/fallback", get(|| async { "the fallback" }));
        tasks.spawn(gantry_gateway::serve(
            listener,
            gateway,
            ServeConfig {
                fallback,
                tls: None,
                draining: draining.clone(),
                shutdown: shutdown.clone(),
                tasks: tasks.clone(),
            },
        ));
        let mut this = Self {
            store,
            db,
            base,
            http: reqwest::Client::new(),
            key: String::new(),
            key_id: 0,
            admin_id: admin.id,
            session,
            shutdown,
            draining,
            tasks,
            next_id: AtomicI64::new(1),
            dir,
        };
        let (key_id, key) = this.create_key(admin.id, "gateway-test").await;
        this.key = key;
        this.key_id = key_id;
        this
    }

    /// `host:port` of the gateway.
    pub fn address(&self) -> &str {
        self.base.trim_start_matches("http://")
    }

    /// A client of the gateway's wire.
    pub fn client(&self) -> GatewayClient<'_> {
        GatewayClient::new(&self.http, &self.base)
    }

    /// A temporary directory of the test's own.
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// Creates an API key of `user_id`, as the management API does; returns its id and
    /// the key.
    pub async fn create_key(&self, user_id: i64, name: &str) -> (i64, String) {
        let generated = GeneratedApiKey::generate();
        let full = generated.full();
        let key = self
            .db
            .create_api_key(&NewApiKey {
                user_id,
                name: name.into(),
                description: String::new(),
                access_key: generated.access.clone(),
                lookup_digest: digest(&full),
                secret_hash: password::hash(generated.secret.clone()).await.unwrap(),
                expires_at: None,
                limits: ApiKeyLimits::default(),
            })
            .await
            .unwrap();
        (key.id, full)
    }

    /// Creates a user (not an admin), and an API key of theirs.
    pub async fn create_user(&self, username: &str) -> (i64, String) {
        let user = self
            .db
            .create_user(&NewUser {
                cluster_admin_of: Vec::new(),
                username: username.into(),
                password_hash: password::hash("user-password-1".into()).await.unwrap(),
                role: Role::User,
                full_name: String::new(),
                require_password_change: false,
            })
            .await
            .unwrap();
        let (_, key) = self.create_key(user.id, "mine").await;
        (user.id, key)
    }

    /// Registers a worker, as the management API does; returns its credential.
    pub async fn worker_credential(&self) -> String {
        let credential = generate_worker_credential();
        self.db
            .create_worker(
                "worker-1",
                &Default::default(),
                "127.0.0.1:1",
                &fixtures::worker_status("worker-1", 1),
                &digest(&credential),
            )
            .await
            .unwrap();
        credential
    }

    fn next_id(&self) -> i64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Creates a model with one replica per address, each `running` there; waits until
    /// the gateway routes to them. An empty list leaves one replica pending. Returns the
    /// instances' ids; replica `n` is named `<name>-<n>`.
    pub async fn deploy(&self, name: &str, addresses: &[String]) -> Vec<i64> {
        let mut model = fixtures::model(self.next_id(), name);
        model.created_at = gantry_types::Timestamp::now();
        model.replicas = u32::try_from(addresses.len().max(1)).unwrap();
        self.store.put_model(model.clone());
        let mut ids = Vec::new();
        if addresses.is_empty() {
            let id = self.next_id();
            self.store
                .put_instance(fixtures::instance(id, &model, 0, InstanceState::Pending));
            ids.push(id);
        }
        for (replica, address) in addresses.iter().enumerate() {
            let id = self.next_id();
            let mut instance = fixtures::instance(
                id,
                &model,
                u32::try_from(replica).unwrap(),
                InstanceState::Pending,
            );
            instance.worker_id = Some(WORKER_ID);
            instance.worker_name = Some(format!("w{WORKER_ID}"));
            instance.gpu_indexes = vec![0];
            self.store.put_instance(instance);
            self.report(id, InstanceState::Running, address);
            ids.push(id);
        }
        if !addresses.is_empty() {
            self.wait_routable(name, addresses.len()).await;
        }
        ids
    }

    /// Reports an instance in `state` at `address`, as its worker would.
    pub fn report(&self, id: i64, state: InstanceState, address: &str) {
        let port: u16 = address.rsplit(':').next().unwrap().parse().unwrap();
        let instance = self.store.instance(id).unwrap();
        self.store.put_instance(ModelInstance {
            state,
            port: Some(port),
            address: Some(address.to_owned()),
            updated_at: gantry_types::Timestamp::now(),
            ..instance
        });
    }

    /// Waits until the gateway routes to `count` instances of the model (the routing
    /// table follows the store's change feed asynchronously).
    pub async fn wait_routable(&self, model: &str, count: usize) {
        self.client().wait_routable(model, count).await;
    }

    /// The metrics once `done` holds for them (within 5 s): for what the gateway does
    /// asynchronously, such as following the change feed or ending a request.
    pub async fn metrics_until(&self, what: &str, done: impl Fn(&str) -> bool) -> String {
        self.client().metrics_until(what, done).await
    }

    /// Waits until no request is in flight, and asserts that none is on `instance` of
    /// `model` either; returns the metrics.
    pub async fn wait_idle(&self, model: &str, instance: &str) -> String {
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

    pub async fn metrics(&self) -> String {
        self.client().metrics().await
    }

    /// POSTs to a gateway endpoint; returns status, `x-gantry-instance` and the JSON.
    pub async fn post(
        &self,
        path: &str,
        key: Option<&str>,
        body: Value,
    ) -> (StatusCode, Option<String>, Value) {
        self.client().post(path, key, body).await
    }

    /// POSTs raw bytes with a bearer key; returns status and the JSON.
    pub async fn post_bytes(
        &self,
        path: &str,
        key: &str,
        body: &'static [u8],
    ) -> (StatusCode, Value) {
        let response = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(key)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        let (status, _, value) = answer_of(response).await;
        (status, value)
    }

    pub async fn chat(&self, model: &str) -> (StatusCode, Option<String>, Value) {
        self.client().chat(&self.key, model).await
    }

    /// What [`TestGateway::chat`] needs, to send chats from spawned tasks.
    pub fn chatter(&self) -> Chatter {
        Chatter {
            http: self.http.clone(),
            base: self.base.clone(),
            key: self.key.clone(),
        }
    }

    /// The usage the gateway has written to the store, once `done` holds for it (usage
    /// is flushed every 100 ms here).
    pub async fn usage_until(
        &self,
        what: &str,
        done: impl Fn(&[gantry_store::UsageIncrement]) -> bool,
    ) -> Vec<gantry_store::UsageIncrement> {
        gantry_testkit::eventually(
            &format!("the usage written to show {what}"),
            Duration::from_secs(5),
            Duration::from_millis(25),
            || async { Ok::<_, std::convert::Infallible>(self.store.usage()) },
            |usage: &Vec<gantry_store::UsageIncrement>| done(usage),
            String::new,
        )
        .await
    }

    /// Starts draining, as the server does before it stops: answers from now on close
    /// their connections.
    pub fn drain(&self) {
        self.draining.cancel();
    }

    /// Stops the gateway and waits for every task it started.
    pub async fn shutdown(self) {
        self.shutdown.cancel();
        self.tasks.close();
        tokio::time::timeout(Duration::from_secs(30), self.tasks.wait())
            .await
            .expect("the gateway's tasks end within 30 s of shutdown");
    }
}

/// The usage sums of the increments that `select` picks.
pub fn sum_usage(
    usage: &[gantry_store::UsageIncrement],
    select: impl Fn(&gantry_store::UsageIncrement) -> bool,
) -> gantry_store::UsageSums {
    let mut sums = gantry_store::UsageSums::default();
    for increment in usage.iter().filter(|i| select(i)) {
        sums.add(&increment.sums);
    }
    sums
}

/// Sends chat completions from a task of its own.
#[derive(Clone)]
pub struct Chatter {
    http: reqwest::Client,
    base: String,
    key: String,
}

impl Chatter {
    /// A chat completion: status, `x-gantry-instance`, the JSON, and how long it took.
    /// Fails after a minute rather than hang the test when the gateway keeps it waiting.
    pub async fn chat(&self, model: &str) -> (StatusCode, Option<String>, Value, Duration) {
        let started = tokio::time::Instant::now();
        let response = self
            .http
            .post(format!("{}/v1/chat/completions", self.base))
            .timeout(Duration::from_secs(60))
            .bearer_auth(&self.key)
            .json(&chat_request(model))
            .send()
            .await
            .unwrap();
        let (status, instance, value) = answer_of(response).await;
        (status, instance, value, started.elapsed())
    }
}
