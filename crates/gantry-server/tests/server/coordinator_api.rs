//! The coordinator API (`/api/v1/coordinator/*`, an admin or a server credential) and the workers' server
//! directory (`/api/v1/worker/servers`) over HTTP, against SQLite and PostgreSQL: who may
//! call them, bad input, lock ownership and expiry, the server registry, the leader, and
//! the OpenAPI document.
//!
//! The typed client has no coordinator calls yet, so requests go through
//! [`TestServer::raw`]; every answer is read into its `gantry_types` shape.

use std::convert::Infallible;
use std::time::Duration;

use crate::common::{assert_raw_error, simulated_worker, user, TestServer};
use gantry_testkit::{test_both_engines, TestEngine};
use gantry_types::{
    ClusterStatus, CoordinatorHealth, ErrorCode, LockInfo, ServerDirectory, ServerInfo, ServerLoad,
    ServerRole, Timestamp,
};
use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

/// The id [`TestServer`] runs with.
const SERVER_ID: &str = "test-server";

/// How long a wait for the leader (or a lock's expiry) may take: generous, as the
/// machine may be busy with other builds.
const WAIT: Duration = Duration::from_secs(30);
const WAIT_STEP: Duration = Duration::from_millis(50);

/// Reads an answer into its wire type, or fails showing it.
fn parse<T: DeserializeOwned>(body: &Value) -> T {
    serde_json::from_value(body.clone())
        .unwrap_or_else(|e| panic!("unexpected answer ({e}): {body}"))
}

/// The admin's bearer token.
fn admin_token(server: &TestServer) -> String {
    server.client().token().unwrap()
}

/// A plain user's session token (made through the admin client).
async fn plain_user_token(server: &TestServer) -> String {
    server
        .client()
        .create_user(&user("bob", "bob-password"))
        .await
        .unwrap();
    server
        .anonymous()
        .login("bob", "bob-password")
        .await
        .unwrap()
        .token
}

/// A registered worker's credential.
async fn worker_credential(server: &TestServer) -> String {
    let (_, worker) = server.register(&simulated_worker("w1", 1)).await;
    worker.token().unwrap()
}

/// `GET path` as `token`, expecting 200, read into `T`.
async fn get<T: DeserializeOwned>(server: &TestServer, path: &str, token: &str) -> T {
    let (status, body) = server.raw(Method::GET, path, Some(token), None).await;
    assert_eq!(status, StatusCode::OK, "GET {path}: {body}");
    parse(&body)
}

async fn servers(server: &TestServer, token: &str) -> Vec<ServerInfo> {
    get::<ServerDirectory>(server, "/api/v1/coordinator/servers", token)
        .await
        .servers
}

async fn locks(server: &TestServer, token: &str) -> Vec<LockInfo> {
    let list: Value = get(server, "/api/v1/coordinator/locks", token).await;
    parse(&list["locks"])
}

/// The lock of this name held now, if any.
async fn lock_named(server: &TestServer, token: &str, name: &str) -> Option<LockInfo> {
    locks(server, token)
        .await
        .into_iter()
        .find(|l| l.name == name)
}

async fn acquire(
    server: &TestServer,
    token: &str,
    name: &str,
    owner: &str,
    timeout_ms: Option<u64>,
) -> (StatusCode, Value) {
    let mut body = json!({"name": name, "owner": owner});
    if let Some(ms) = timeout_ms {
        body["timeout_ms"] = json!(ms);
    }
    server
        .raw(
            Method::POST,
            "/api/v1/coordinator/locks/acquire",
            Some(token),
            Some(body),
        )
        .await
}

async fn release(server: &TestServer, token: &str, name: &str, owner: &str) -> (StatusCode, Value) {
    server
        .raw(
            Method::POST,
            "/api/v1/coordinator/locks/release",
            Some(token),
            Some(json!({"name": name, "owner": owner})),
        )
        .await
}

async fn register(
    server: &TestServer,
    token: &str,
    server_id: &str,
    url: &str,
) -> (StatusCode, Value) {
    server
        .raw(
            Method::POST,
            "/api/v1/coordinator/servers/register",
            Some(token),
            Some(json!({"server_id": server_id, "url": url, "version": "9.9.9"})),
        )
        .await
}

async fn heartbeat(
    server: &TestServer,
    token: &str,
    server_id: &str,
    load: ServerLoad,
) -> (StatusCode, Value) {
    server
        .raw(
            Method::POST,
            "/api/v1/coordinator/heartbeat",
            Some(token),
            Some(json!({"server_id": server_id, "load": load})),
        )
        .await
}

async fn unregister(server: &TestServer, token: &str, server_id: &str) -> (StatusCode, Value) {
    server
        .raw(
            Method::POST,
            &format!("/api/v1/coordinator/servers/unregister/{server_id}"),
            Some(token),
            None,
        )
        .await
}

/// `GET path` as `token` until its answer satisfies `done` (the leader lease is taken a
/// moment after start on PostgreSQL).
async fn wait_for<T: DeserializeOwned + std::fmt::Debug>(
    server: &TestServer,
    what: &str,
    path: &str,
    token: &str,
    done: impl Fn(&T) -> bool,
) -> T {
    gantry_testkit::eventually(
        what,
        WAIT,
        WAIT_STEP,
        || async { Ok::<T, Infallible>(get(server, path, token).await) },
        done,
        String::new,
    )
    .await
}

fn scheduling_mode(engine: TestEngine) -> &'static str {
    match engine {
        TestEngine::Sqlite => "local",
        TestEngine::Postgres => "distributed",
    }
}

/// Every coordinator endpoint with a body it would accept from an admin.
fn coordinator_calls() -> Vec<(Method, &'static str, Option<Value>)> {
    vec![
        (Method::GET, "/api/v1/coordinator/servers", None),
        (
            Method::POST,
            "/api/v1/coordinator/servers/register",
            Some(json!({"server_id": "intruder", "url": "http://10.0.0.66:80"})),
        ),
        (
            Method::POST,
            "/api/v1/coordinator/servers/unregister/test-server",
            None,
        ),
        (
            Method::POST,
            "/api/v1/coordinator/heartbeat",
            Some(json!({"server_id": SERVER_ID})),
        ),
        (Method::GET, "/api/v1/coordinator/cluster", None),
        (
            Method::POST,
            "/api/v1/coordinator/locks/acquire",
            Some(json!({"name": "intruded", "owner": "intruder"})),
        ),
        (
            Method::POST,
            "/api/v1/coordinator/locks/release",
            Some(json!({"name": "held", "owner": "admin-tool"})),
        ),
        (Method::GET, "/api/v1/coordinator/locks", None),
        (Method::GET, "/api/v1/coordinator/health", None),
    ]
}

async fn coordinator_endpoints_need_an_admin(engine: TestEngine) {
    let server = TestServer::start(engine).await;
    let admin = admin_token(&server);
    let bob = plain_user_token(&server).await;
    let worker = worker_credential(&server).await;
    // A lock the refused release below must leave alone.
    let (status, body) = acquire(&server, &admin, "held", "admin-tool", None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let held: LockInfo = parse(&body);

    for (method, path, body) in coordinator_calls() {
        let (status, answer) = server.raw(method.clone(), path, None, body.clone()).await;
        let message = assert_raw_error(status, &answer, 401, ErrorCode::Unauthorized);
        assert!(message.contains("Bearer"), "{method} {path}: {message}");
        let (status, answer) = server
            .raw(method.clone(), path, Some("gantry_not_a_key"), body.clone())
            .await;
        assert_raw_error(status, &answer, 401, ErrorCode::Unauthorized);

        let (status, answer) = server
            .raw(method.clone(), path, Some(&bob), body.clone())
            .await;
        let message = assert_raw_error(status, &answer, 403, ErrorCode::Forbidden);
        assert!(message.contains("admin"), "{method} {path}: {message}");

        let (status, answer) = server.raw(method.clone(), path, Some(&worker), body).await;
        let message = assert_raw_error(status, &answer, 403, ErrorCode::Forbidden);
        assert!(message.contains("worker"), "{method} {path}: {message}");
    }

    // None of the refused calls changed anything.
    let ids: Vec<String> = servers(&server, &admin)
        .await
        .into_iter()
        .map(|s| s.server_id)
        .collect();
    assert_eq!(ids, [SERVER_ID], "the refused calls changed the registry");
    assert_eq!(lock_named(&server, &admin, "held").await, Some(held));
    assert_eq!(lock_named(&server, &admin, "intruded").await, None);
    server.shutdown().await;
}

async fn coordinator_bad_input_answers_4xx_naming_the_field(engine: TestEngine) {
    let server = TestServer::start(engine).await;
    let admin = admin_token(&server);
    let token = Some(admin.as_str());

    // Malformed JSON → 400 on every endpoint with a body.
    for path in [
        "/api/v1/coordinator/servers/register",
        "/api/v1/coordinator/heartbeat",
        "/api/v1/coordinator/locks/acquire",
        "/api/v1/coordinator/locks/release",
    ] {
        let (status, body) = server
            .raw_bytes(
                Method::POST,
                path,
                token,
                "application/json",
                b"{ this is not JSON".to_vec(),
            )
            .await;
        let message = assert_raw_error(status, &body, 400, ErrorCode::InvalidRequest);
        assert!(message.contains("JSON"), "{path}: {message}");
        // Not JSON at all → 415.
        let (status, body) = server
            .raw_bytes(Method::POST, path, token, "text/plain", b"name=x".to_vec())
            .await;
        assert_raw_error(status, &body, 415, ErrorCode::UnsupportedMediaType);
    }

    // A field whose value is not acceptable → 422 naming it.
    const ACQUIRE: &str = "/api/v1/coordinator/locks/acquire";
    const RELEASE: &str = "/api/v1/coordinator/locks/release";
    const REGISTER: &str = "/api/v1/coordinator/servers/register";
    const HEARTBEAT: &str = "/api/v1/coordinator/heartbeat";
    // One row per case: the path, the body, the field the 422 names.
    #[rustfmt::skip]
    let cases = [
        (ACQUIRE,   "name",              json!({"name": "", "owner": "tool"})),
        (ACQUIRE,   "name",              json!({"name": "a b", "owner": "tool"})),
        (ACQUIRE,   "owner",             json!({"name": "x", "owner": ""})),
        (ACQUIRE,   "timeout_ms",        json!({"name": "x", "owner": "tool", "timeout_ms": 0})),
        (ACQUIRE,   "timeout_ms",        json!({"name": "x", "owner": "tool", "timeout_ms": 3_600_001})),
        (ACQUIRE,   "timeout_ms",        json!({"name": "x", "owner": "tool", "timeout_ms": "soon"})),
        (ACQUIRE,   "colour",            json!({"name": "x", "owner": "tool", "colour": "red"})),
        (ACQUIRE,   "owner",             json!({"name": "x"})),
        (RELEASE,   "name",              json!({"name": "", "owner": "tool"})),
        (RELEASE,   "owner",             json!({"name": "x", "owner": "t\tab"})),
        (REGISTER,  "url",               json!({"server_id": "s1", "url": "ftp://10.0.0.1"})),
        (REGISTER,  "url",               json!({"server_id": "s1", "url": "10.0.0.1:80"})),
        (REGISTER,  "server_id",         json!({"server_id": "bad id", "url": "http://10.0.0.1"})),
        (REGISTER,  "server_id",         json!({"server_id": "", "url": "http://10.0.0.1"})),
        (REGISTER,  "version",           json!({"server_id": "s1", "url": "http://10.0.0.1", "version": "v".repeat(65)})),
        (HEARTBEAT, "server_id",         json!({"server_id": ""})),
        (HEARTBEAT, "server_id",         json!({"server_id": "s/1"})),
        (HEARTBEAT, "inflight_requests", json!({"server_id": SERVER_ID, "load": {"inflight_requests": -1, "connected_workers": 0}})),
    ];
    for (path, field, body) in cases {
        let (status, answer) = server
            .raw(Method::POST, path, token, Some(body.clone()))
            .await;
        let message = assert_raw_error(status, &answer, 422, ErrorCode::ValidationFailed);
        assert!(
            message.contains(field),
            "{path} {body}: {message} should name {field}"
        );
    }

    // An id nobody registered → 404 naming it, not a 500.
    let (status, body) = unregister(&server, &admin, "no.such-server").await;
    let message = assert_raw_error(status, &body, 404, ErrorCode::NotFound);
    assert!(message.contains("no.such-server"), "{message}");

    // A method the route does not have → 405.
    for (method, path) in [
        (Method::POST, "/api/v1/coordinator/servers"),
        (Method::GET, "/api/v1/coordinator/servers/register"),
        (
            Method::GET,
            "/api/v1/coordinator/servers/unregister/test-server",
        ),
        (Method::GET, "/api/v1/coordinator/heartbeat"),
        (Method::DELETE, "/api/v1/coordinator/cluster"),
        (Method::GET, "/api/v1/coordinator/locks/acquire"),
        (Method::DELETE, "/api/v1/coordinator/locks/release"),
        (Method::POST, "/api/v1/coordinator/locks"),
        (Method::PUT, "/api/v1/coordinator/health"),
    ] {
        let (status, body) = server.raw(method.clone(), path, token, None).await;
        assert_raw_error(status, &body, 405, ErrorCode::MethodNotAllowed);
    }

    // The refused requests changed nothing.
    assert_eq!(locks(&server, &admin).await, vec![]);
    let ids: Vec<String> = servers(&server, &admin)
        .await
        .into_iter()
        .map(|s| s.server_id)
        .collect();
    assert_eq!(ids, [SERVER_ID]);
    server.shutdown().await;
}

async fn a_lock_has_one_owner_who_renews_and_releases_it(engine: TestEngine) {
    let server = TestServer::start(engine).await;
    let admin = admin_token(&server);

    let (status, body) = acquire(&server, &admin, "deploy", "alice", Some(60_000)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let first: LockInfo = parse(&body);
    assert_eq!(
        (first.name.as_str(), first.owner.as_str()),
        ("deploy", "alice")
    );
    assert!(first.token >= 1, "{first:?}");
    assert_eq!(
        first.expires_at.as_millis() - first.acquired_at.as_millis(),
        60_000
    );
    assert_eq!(
        lock_named(&server, &admin, "deploy").await,
        Some(first.clone())
    );

    // Another owner → 409 naming the lock and its holder; the lock is unchanged.
    let (status, body) = acquire(&server, &admin, "deploy", "bob", Some(60_000)).await;
    let message = assert_raw_error(status, &body, 409, ErrorCode::Conflict);
    assert!(
        message.contains("alice") && message.contains("deploy"),
        "{message}"
    );
    assert_eq!(
        lock_named(&server, &admin, "deploy").await,
        Some(first.clone())
    );

    // The owner acquiring again renews it, with a larger token; without timeout_ms the
    // server's lock_timeout applies.
    let (status, body) = acquire(&server, &admin, "deploy", "alice", None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let renewed: LockInfo = parse(&body);
    assert_eq!(renewed.owner, "alice");
    assert!(renewed.token > first.token, "{renewed:?} after {first:?}");
    let lock_timeout = server.state().config.lock_timeout;
    assert_eq!(
        renewed.expires_at.as_millis() - renewed.acquired_at.as_millis(),
        i64::try_from(lock_timeout.as_millis()).unwrap()
    );
    assert_eq!(
        lock_named(&server, &admin, "deploy").await,
        Some(renewed.clone())
    );

    // A release by someone else → 403 naming the owner; the lock stays.
    let (status, body) = release(&server, &admin, "deploy", "bob").await;
    let message = assert_raw_error(status, &body, 403, ErrorCode::Forbidden);
    assert!(message.contains("alice"), "{message}");
    assert_eq!(
        lock_named(&server, &admin, "deploy").await,
        Some(renewed.clone())
    );

    // The owner releases it → 204; then it is not held: listed no more, a second release
    // is 404, and another owner takes it with a larger token.
    let (status, body) = release(&server, &admin, "deploy", "alice").await;
    assert_eq!((status, body), (StatusCode::NO_CONTENT, Value::Null));
    assert_eq!(lock_named(&server, &admin, "deploy").await, None);
    let (status, body) = release(&server, &admin, "deploy", "alice").await;
    let message = assert_raw_error(status, &body, 404, ErrorCode::NotFound);
    assert!(message.contains("deploy"), "{message}");
    let (status, body) = release(&server, &admin, "never-taken", "alice").await;
    assert_raw_error(status, &body, 404, ErrorCode::NotFound);

    let (status, body) = acquire(&server, &admin, "deploy", "bob", Some(60_000)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let bobs: LockInfo = parse(&body);
    assert_eq!(bobs.owner, "bob");
    assert!(bobs.token > renewed.token, "{bobs:?} after {renewed:?}");
    server.shutdown().await;
}

async fn a_lapsed_lock_is_taken_over_with_a_larger_token(engine: TestEngine) {
    let server = TestServer::start(engine).await;
    let admin = admin_token(&server);
    let (status, body) = acquire(&server, &admin, "short", "alice", Some(200)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let alice: LockInfo = parse(&body);

    // Bob asks until the lock lapses (409 until then).
    let (status, body) = gantry_testkit::eventually(
        "bob to take the lapsed lock",
        WAIT,
        WAIT_STEP,
        || async {
            Ok::<_, Infallible>(acquire(&server, &admin, "short", "bob", Some(60_000)).await)
        },
        |(status, _)| *status == StatusCode::OK,
        String::new,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let bob: LockInfo = parse(&body);
    assert_eq!(bob.owner, "bob");
    assert!(bob.token > alice.token, "{bob:?} after {alice:?}");
    // It was taken because it lapsed, not before.
    assert!(
        bob.acquired_at >= alice.expires_at,
        "{bob:?} before {alice:?} lapsed"
    );
    assert_eq!(
        lock_named(&server, &admin, "short").await,
        Some(bob.clone())
    );

    // The previous owner has lost it: refused, and may not release it.
    let (status, body) = acquire(&server, &admin, "short", "alice", Some(200)).await;
    assert!(assert_raw_error(status, &body, 409, ErrorCode::Conflict).contains("bob"));
    let (status, body) = release(&server, &admin, "short", "alice").await;
    assert!(assert_raw_error(status, &body, 403, ErrorCode::Forbidden).contains("bob"));
    assert_eq!(lock_named(&server, &admin, "short").await, Some(bob));

    // A lock that lapsed is held by no one: its owner's late release is a 404.
    let (status, body) = acquire(&server, &admin, "brief", "carol", Some(1)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    tokio::time::sleep(Duration::from_millis(20)).await;
    let (status, body) = release(&server, &admin, "brief", "carol").await;
    assert!(assert_raw_error(status, &body, 404, ErrorCode::NotFound).contains("lapsed"));
    server.shutdown().await;
}

async fn the_registry_lists_this_server_and_registers_others(engine: TestEngine) {
    let server = TestServer::start(engine).await;
    let admin = admin_token(&server);

    // This server is listed, active, as the leader.
    let listed = wait_for(
        &server,
        "this server to be listed as the leader",
        "/api/v1/coordinator/servers",
        &admin,
        |directory: &ServerDirectory| {
            directory
                .servers
                .iter()
                .any(|s| s.server_id == SERVER_ID && s.role == ServerRole::Leader)
        },
    )
    .await;
    let this = listed
        .servers
        .iter()
        .find(|s| s.server_id == SERVER_ID)
        .unwrap();
    assert!(this.active, "{this:?}");
    assert_eq!(this.url, server.base);
    assert_eq!(this.version, env!("CARGO_PKG_VERSION"));

    // Another id registers, and shows up as an active standby.
    let (status, body) = register(&server, &admin, "edge-1", "http://10.0.0.2:8080").await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let edge: ServerInfo = parse(&body);
    assert_eq!(
        (
            edge.server_id.as_str(),
            edge.url.as_str(),
            edge.version.as_str()
        ),
        ("edge-1", "http://10.0.0.2:8080", "9.9.9")
    );
    assert!(edge.active, "{edge:?}");
    assert_eq!(edge.role, ServerRole::Standby);
    assert_eq!(edge.load, ServerLoad::default());
    let listed = servers(&server, &admin).await;
    let ids: Vec<&str> = listed.iter().map(|s| s.server_id.as_str()).collect();
    assert_eq!(ids, ["edge-1", SERVER_ID]);
    assert!(
        listed[0].active && listed[0].role == ServerRole::Standby,
        "{listed:?}"
    );

    // A live server's id is refused → 409 naming it and where it runs; the live row is
    // untouched. That includes the running test server's own id.
    let (status, body) = register(&server, &admin, SERVER_ID, "http://10.0.0.3:80").await;
    let message = assert_raw_error(status, &body, 409, ErrorCode::Conflict);
    assert!(
        message.contains(SERVER_ID) && message.contains(&server.base),
        "{message}"
    );
    let (status, body) = register(&server, &admin, "edge-1", "http://10.0.0.3:80").await;
    let message = assert_raw_error(status, &body, 409, ErrorCode::Conflict);
    assert!(message.contains("edge-1"), "{message}");
    let listed = servers(&server, &admin).await;
    assert_eq!(listed[0].url, "http://10.0.0.2:8080");
    assert_eq!(listed[1].url, server.base);

    // A heartbeat carries the load.
    let load = ServerLoad {
        inflight_requests: 4,
        connected_workers: 2,
    };
    let (status, body) = heartbeat(&server, &admin, "edge-1", load).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let beat: ServerInfo = parse(&body);
    assert_eq!(beat.load, load);
    assert!(beat.last_heartbeat_at >= edge.last_heartbeat_at);
    assert_eq!(servers(&server, &admin).await[0].load, load);
    let (status, body) = heartbeat(&server, &admin, "nobody", load).await;
    let message = assert_raw_error(status, &body, 404, ErrorCode::NotFound);
    assert!(message.contains("nobody"), "{message}");

    // Unregistered: gone from the list; a second time, and its heartbeat, → 404.
    let (status, body) = unregister(&server, &admin, "edge-1").await;
    assert_eq!((status, body), (StatusCode::NO_CONTENT, Value::Null));
    let ids: Vec<String> = servers(&server, &admin)
        .await
        .into_iter()
        .map(|s| s.server_id)
        .collect();
    assert_eq!(ids, [SERVER_ID]);
    let (status, body) = unregister(&server, &admin, "edge-1").await;
    assert!(assert_raw_error(status, &body, 404, ErrorCode::NotFound).contains("edge-1"));
    let (status, body) = heartbeat(&server, &admin, "edge-1", load).await;
    assert_raw_error(status, &body, 404, ErrorCode::NotFound);
    server.shutdown().await;
}

async fn a_silent_server_is_inactive_and_its_id_free(engine: TestEngine) {
    let server = TestServer::start(engine).await;
    let admin = admin_token(&server);
    // A server last heard of two hours ago (far past server_timeout), written below the
    // API because the API registers with the current time.
    let two_hours_ago = Timestamp::from_millis(Timestamp::now().as_millis() - 2 * 3_600_000);
    server
        .state()
        .store
        .register_server(
            &gantry_store::ServerRegistration {
                server_id: "gone",
                url: "http://10.0.0.9:80",
                version: "0.1.0",
                incarnation: "long-dead",
                session_pid: None,
            },
            two_hours_ago,
            Timestamp::from_millis(0),
        )
        .await
        .unwrap()
        .unwrap();

    let listed = servers(&server, &admin).await;
    let gone = listed.iter().find(|s| s.server_id == "gone").unwrap();
    assert!(!gone.active, "{gone:?}");
    assert!(listed.iter().any(|s| s.server_id == SERVER_ID && s.active));
    let cluster: ClusterStatus = get(&server, "/api/v1/coordinator/cluster", &admin).await;
    assert_eq!(cluster.active_servers, 1, "{cluster:?}");

    // Its id may be taken by a new registration.
    let (status, body) = register(&server, &admin, "gone", "http://10.0.0.10:80").await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let back: ServerInfo = parse(&body);
    assert!(back.active);
    assert_eq!(back.url, "http://10.0.0.10:80");
    assert!(back.started_at > two_hours_ago);
    server.shutdown().await;
}

async fn cluster_and_health_show_this_server_leading(engine: TestEngine) {
    let server = TestServer::start(engine).await;
    let admin = admin_token(&server);
    server.register(&simulated_worker("w1", 1)).await;
    let (status, body) = register(&server, &admin, "edge-1", "http://10.0.0.2:8080").await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let load = ServerLoad {
        inflight_requests: 7,
        connected_workers: 1,
    };
    assert_eq!(
        heartbeat(&server, &admin, "edge-1", load).await.0,
        StatusCode::OK
    );

    let cluster = wait_for(
        &server,
        "this server to lead",
        "/api/v1/coordinator/cluster",
        &admin,
        |cluster: &ClusterStatus| cluster.leader.server_id.as_deref() == Some(SERVER_ID),
    )
    .await;
    assert_eq!(cluster.scheduling_mode, scheduling_mode(engine));
    assert!(cluster.leader.fencing_token >= 1, "{cluster:?}");
    assert_eq!(cluster.active_servers, 2, "{cluster:?}");
    assert_eq!(cluster.total_workers, 1, "{cluster:?}");
    // This server has no gateway request in flight; edge-1 reported 7.
    assert_eq!(cluster.total_load, 7, "{cluster:?}");
    let roles: Vec<(&str, ServerRole)> = cluster
        .servers
        .iter()
        .map(|s| (s.server_id.as_str(), s.role))
        .collect();
    assert_eq!(
        roles,
        [
            ("edge-1", ServerRole::Standby),
            (SERVER_ID, ServerRole::Leader)
        ]
    );

    let health = wait_for(
        &server,
        "this server to report itself the leader",
        "/api/v1/coordinator/health",
        &admin,
        |health: &CoordinatorHealth| health.role == ServerRole::Leader,
    )
    .await;
    assert_eq!(health.server_id, SERVER_ID);
    assert_eq!(health.scheduling_mode, scheduling_mode(engine));
    assert!(health.database, "{health:?}");
    let token = health.fencing_token.expect("a leader has a fencing token");
    assert!(token >= 1, "{health:?}");
    // The token this server holds is the one the cluster shows (they are read one after
    // the other, so wait in case the lease changed term in between).
    wait_for(
        &server,
        "the cluster's and this server's fencing tokens to agree",
        "/api/v1/coordinator/cluster",
        &admin,
        |cluster: &ClusterStatus| {
            cluster.leader.fencing_token
                == server
                    .state()
                    .cluster
                    .coordinator
                    .fencing_token()
                    .unwrap_or(0)
        },
    )
    .await;
    server.shutdown().await;
}

async fn workers_list_the_active_servers_by_load_score(engine: TestEngine) {
    let server = TestServer::start(engine).await;
    let admin = admin_token(&server);
    let worker = worker_credential(&server).await;
    let bob = plain_user_token(&server).await;

    for (id, inflight_requests, connected_workers) in
        [("busy", 10, 3), ("mid", 2, 3), ("idle", 0, 0)]
    {
        let url = format!("http://{id}.example:80");
        let (status, body) = register(&server, &admin, id, &url).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        let load = ServerLoad {
            inflight_requests,
            connected_workers,
        };
        assert_eq!(heartbeat(&server, &admin, id, load).await.0, StatusCode::OK);
    }
    // A silent one, which workers must not be sent to.
    server
        .state()
        .store
        .register_server(
            &gantry_store::ServerRegistration {
                server_id: "gone",
                url: "http://gone.example:80",
                version: "0.1.0",
                incarnation: "long-dead",
                session_pid: None,
            },
            Timestamp::from_millis(Timestamp::now().as_millis() - 3_600_000),
            Timestamp::from_millis(0),
        )
        .await
        .unwrap()
        .unwrap();

    let directory: ServerDirectory = get(&server, "/api/v1/worker/servers", &worker).await;
    let order: Vec<&str> = directory
        .servers
        .iter()
        .map(|s| s.server_id.as_str())
        .collect();
    // Scores: busy 0.4 * 3/3 + 0.6 * 10/10 = 1; mid 0.4 + 0.6 * 0.2 = 0.52; idle and this
    // server 0, in id order.
    assert_eq!(order, ["idle", SERVER_ID, "mid", "busy"], "{directory:?}");
    assert!(directory.servers.iter().all(|s| s.active));
    assert!(
        directory
            .servers
            .windows(2)
            .all(|pair| pair[0].load_score <= pair[1].load_score),
        "{directory:?}"
    );
    let score = |id: &str| {
        directory
            .servers
            .iter()
            .find(|s| s.server_id == id)
            .unwrap()
            .load_score
    };
    assert!((score("busy") - 1.0).abs() < 1e-9, "{directory:?}");
    assert!((score("mid") - 0.52).abs() < 1e-9, "{directory:?}");
    assert_eq!(score("idle"), 0.0);
    // The admin's view lists the silent one too.
    assert!(servers(&server, &admin)
        .await
        .iter()
        .any(|s| s.server_id == "gone" && !s.active));

    // For worker credentials only.
    let (status, body) = server
        .raw(Method::GET, "/api/v1/worker/servers", None, None)
        .await;
    assert_raw_error(status, &body, 401, ErrorCode::Unauthorized);
    for person in [&admin, &bob] {
        let (status, body) = server
            .raw(Method::GET, "/api/v1/worker/servers", Some(person), None)
            .await;
        let message = assert_raw_error(status, &body, 403, ErrorCode::Forbidden);
        assert!(message.contains("worker credential"), "{message}");
    }
    server.shutdown().await;
}

async fn openapi_lists_every_coordinator_path(engine: TestEngine) {
    let server = TestServer::start(engine).await;
    let (status, spec) = server
        .raw(Method::GET, "/api/openapi.json", None, None)
        .await;
    assert_eq!(status, StatusCode::OK);
    for (method, path) in [
        ("get", "/api/v1/coordinator/servers"),
        ("post", "/api/v1/coordinator/servers/register"),
        ("post", "/api/v1/coordinator/servers/unregister/{server_id}"),
        ("post", "/api/v1/coordinator/heartbeat"),
        ("get", "/api/v1/coordinator/cluster"),
        ("post", "/api/v1/coordinator/locks/acquire"),
        ("post", "/api/v1/coordinator/locks/release"),
        ("get", "/api/v1/coordinator/locks"),
        ("get", "/api/v1/coordinator/health"),
        ("get", "/api/v1/worker/servers"),
    ] {
        let operation = &spec["paths"][path][method];
        assert!(operation.is_object(), "{method} {path} is not in the spec");
        let tag = if path.starts_with("/api/v1/worker") {
            "worker-agent"
        } else {
            "coordinator"
        };
        assert_eq!(operation["tags"], json!([tag]), "{method} {path}");
    }
    for schema in [
        "ServerInfo",
        "ServerRegister",
        "ServerHeartbeat",
        "ClusterStatus",
        "LockAcquire",
        "LockRelease",
        "LockInfo",
        "LockList",
        "CoordinatorHealth",
        "ServerDirectory",
    ] {
        assert!(
            spec["components"]["schemas"][schema].is_object(),
            "schema {schema} is not in the spec"
        );
    }
    server.shutdown().await;
}

/// A server credential (written to `data_dir/server_credential`, made from the cluster's
/// secret) calls the coordinator API, for its own server id only; one made with another
/// secret is refused, and it opens nothing outside the coordinator API.
async fn a_server_credential_acts_on_the_coordinator_api_for_its_own_id(engine: TestEngine) {
    let server = TestServer::start(engine).await;
    let admin = admin_token(&server);
    let own = std::fs::read_to_string(server.data_path("server_credential")).unwrap();
    let own = own.trim();
    assert!(own.starts_with("gantrys_"), "{own}");
    let status: ClusterStatus = get(&server, "/api/v1/coordinator/cluster", own).await;
    assert!(status.servers.iter().any(|s| s.server_id == SERVER_ID));
    let health: CoordinatorHealth = get(&server, "/api/v1/coordinator/health", own).await;
    assert_eq!(health.server_id, SERVER_ID);
    let (code, body) = heartbeat(&server, own, SERVER_ID, ServerLoad::default()).await;
    assert_eq!(code, StatusCode::OK, "{body}");
    let (code, body) = acquire(&server, own, "tool-lock", SERVER_ID, None).await;
    assert_eq!(code, StatusCode::OK, "{body}");
    let (code, body) = release(&server, own, "tool-lock", SERVER_ID).await;
    assert_eq!(code, StatusCode::NO_CONTENT, "{body}");

    // Acting for another server id: refused, naming both, nothing stored.
    let (code, body) = register(&server, own, "peer-1", "http://10.0.0.7:80").await;
    let message = assert_raw_error(code, &body, 403, ErrorCode::Forbidden);
    assert!(
        message.contains("peer-1") && message.contains(SERVER_ID),
        "{message}"
    );
    let (code, body) = unregister(&server, own, SERVER_ID).await;
    assert_eq!(code, StatusCode::NO_CONTENT, "its own id: {body}");
    let (code, body) = heartbeat(&server, own, "peer-1", ServerLoad::default()).await;
    assert_raw_error(code, &body, 403, ErrorCode::Forbidden);

    // The credential of a peer, made with the same secret, registers that peer.
    let peer = server
        .state()
        .authenticator
        .jwt()
        .server_credential("peer-1");
    let (code, body) = register(&server, &peer, "peer-1", "http://10.0.0.7:80").await;
    assert_eq!(code, StatusCode::CREATED, "{body}");
    let (code, body) = heartbeat(&server, &peer, "peer-1", ServerLoad::default()).await;
    assert_eq!(code, StatusCode::OK, "{body}");
    assert!(servers(&server, &admin)
        .await
        .iter()
        .any(|s| s.server_id == "peer-1" && s.active));

    // One made with another secret, or tampered with: 401, saying why.
    let foreign = gantry_auth::jwt::JwtKeys::new(
        b"a-different-secret-of-enough-length-0123456789",
        Duration::from_secs(60),
    )
    .server_credential(SERVER_ID);
    let tampered = format!("{}x", &own[..own.len() - 1]);
    for bad in [foreign.as_str(), tampered.as_str()] {
        let (code, body) = server
            .raw(Method::GET, "/api/v1/coordinator/cluster", Some(bad), None)
            .await;
        let message = assert_raw_error(code, &body, 401, ErrorCode::Unauthorized);
        assert!(message.contains("server credential"), "{message}");
    }

    // Nothing outside the coordinator API: not the management API, not the gateway.
    let (code, body) = server
        .raw(Method::GET, "/api/v1/models", Some(own), None)
        .await;
    assert!(assert_raw_error(code, &body, 403, ErrorCode::Forbidden).contains("coordinator"));
    let (code, body) = server.raw(Method::GET, "/auth/me", Some(own), None).await;
    assert_raw_error(code, &body, 403, ErrorCode::Forbidden);
    let (code, _) = server
        .raw(
            Method::POST,
            "/v1/chat/completions",
            Some(own),
            Some(json!({"model": "m", "messages": []})),
        )
        .await;
    assert_eq!(code, StatusCode::FORBIDDEN);
    server.shutdown().await;
}

test_both_engines!(
    a_server_credential_acts_on_the_coordinator_api_for_its_own_id,
    coordinator_endpoints_need_an_admin,
    coordinator_bad_input_answers_4xx_naming_the_field,
    a_lock_has_one_owner_who_renews_and_releases_it,
    a_lapsed_lock_is_taken_over_with_a_larger_token,
    the_registry_lists_this_server_and_registers_others,
    a_silent_server_is_inactive_and_its_id_free,
    cluster_and_health_show_this_server_leading,
    workers_list_the_active_servers_by_load_score,
    openapi_lists_every_coordinator_path,
);
