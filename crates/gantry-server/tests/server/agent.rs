//! The endpoints worker agents call, against SQLite and PostgreSQL: registration,
//! heartbeats and health transitions, the worker-scoped assignment stream, and state
//! reports. Every call goes through the typed client, as the worker agent's do.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::common::{
    expect_error, labels, next_change, simulated_worker, tiny_model, Options, TestServer,
};
use gantry_client::Client;
use gantry_testkit::{test_both_engines, TestEngine};
use gantry_types::{
    BackendKind, ChangeKind, ErrorCode, InstancePatch, InstanceQuery, InstanceState,
    InstanceStateReport, ModelInstance, ModelUpdate, WatchEvent, Worker, WorkerRegister,
    WorkerState,
};

/// A worker in zone a with `gpus` simulated GPUs.
fn registration(name: &str, gpus: u32) -> WorkerRegister {
    WorkerRegister {
        labels: labels(&[("zone", "a")]),
        ..simulated_worker(name, gpus)
    }
}

/// A report of `state` with nothing else.
fn report(state: InstanceState) -> InstanceStateReport {
    InstanceStateReport::new(state, "")
}

/// Places an instance on a worker's GPU 0, or unplaces it.
async fn place(admin: &Client, instance: i64, worker: Option<i64>) {
    let patch = InstancePatch {
        worker_id: Some(worker),
        gpu_indexes: Some(if worker.is_some() { vec![0] } else { vec![] }),
    };
    admin.place_instance(instance, &patch).await.unwrap();
}

async fn workers_register_once_and_reregister_idempotently(engine: TestEngine) {
    let server = TestServer::start(engine).await;
    let admin = server.client();
    expect_error(
        server
            .anonymous()
            .register_worker("gantryreg_wrong", &registration("w1", 2))
            .await,
        401,
        ErrorCode::Unauthorized,
    );

    let (registered, worker) = server.register(&registration("w1", 2)).await;
    let credential = worker.token().unwrap();
    assert!(credential.starts_with("gantryw_"));
    let stored = admin.get_worker(registered.id).await.unwrap();
    assert_eq!(stored.state, WorkerState::Ready);
    assert!(stored.status.gpus[1].simulated);
    assert_eq!(stored.labels, labels(&[("zone", "a")]));

    // Same name with the token again: conflict, the first registration stays.
    expect_error(
        server
            .anonymous()
            .register_worker(&server.registration_token(), &registration("w1", 8))
            .await,
        409,
        ErrorCode::Conflict,
    );

    // With its credential: the same worker, updated, no new credential.
    let (again, created) = worker
        .register_worker(&credential, &registration("w1", 4))
        .await
        .unwrap();
    assert!(!created, "registering again is 200, not 201");
    assert_eq!(again.worker.id, registered.id);
    assert!(again.credential.is_none());
    assert_eq!(again.worker.status.gpus.len(), 4);

    // A credential cannot register under another name.
    expect_error(
        worker
            .register_worker(&credential, &registration("w2", 1))
            .await,
        409,
        ErrorCode::Conflict,
    );

    // Users cannot call worker endpoints.
    expect_error(admin.heartbeat().await, 403, ErrorCode::Forbidden);
    server.shutdown().await;
}

async fn silent_workers_become_not_ready_then_unreachable_and_recover(engine: TestEngine) {
    let server = TestServer::start_with(
        engine,
        Options {
            heartbeat_interval: Duration::from_millis(200),
            server_timeout: Duration::from_millis(1500),
            ..Default::default()
        },
    )
    .await;
    let admin = server.client();
    let (registered, worker) = server.register(&registration("w1", 1)).await;
    let model = admin.create_model(&tiny_model("tiny", 1)).await.unwrap();
    let instance_id = server.instances_of(model.id, 1).await[0].id;
    place(admin, instance_id, Some(registered.id)).await;
    let running = InstanceStateReport {
        port: Some(40000),
        address: Some("127.0.0.1:40000".into()),
        ..report(InstanceState::Running)
    };
    worker.report_state(instance_id, &running).await.unwrap();

    let in_state = |want: WorkerState| move |worker: &Worker| worker.state == want;
    let silent = server
        .wait_for_worker(registered.id, "not_ready", in_state(WorkerState::NotReady))
        .await;
    assert!(silent.state_message.contains("heartbeat"), "{silent:?}");
    server
        .wait_for_worker(
            registered.id,
            "unreachable",
            in_state(WorkerState::Unreachable),
        )
        .await;
    let instance = admin.get_instance(instance_id).await.unwrap();
    assert_eq!(instance.state, InstanceState::Unreachable);

    let back = worker.heartbeat().await.unwrap();
    assert_eq!(back.state, WorkerState::Ready);
    // A ready worker's heartbeat (the one-statement path) moves only its time.
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    let again = worker.heartbeat().await.unwrap();
    assert_eq!(again.state, WorkerState::Ready);
    assert_eq!(again.state_message, back.state_message);
    assert!(
        again.last_heartbeat_at > back.last_heartbeat_at,
        "{again:?} after {back:?}"
    );

    // Goodbye marks it not_ready at once.
    worker.goodbye().await.unwrap();
    let gone = admin.get_worker(registered.id).await.unwrap();
    assert_eq!(gone.state, WorkerState::NotReady);
    assert_eq!(gone.state_message, "worker shut down");
    server.shutdown().await;
}

async fn assignment_stream_is_scoped_to_the_calling_worker(engine: TestEngine) {
    let server = TestServer::start(engine).await;
    let admin = server.client();
    let (w1, worker1) = server.register(&registration("w1", 2)).await;
    let (w2, worker2) = server.register(&registration("w2", 2)).await;
    let model = admin.create_model(&tiny_model("tiny", 2)).await.unwrap();
    let instances = server.instances_of(model.id, 2).await;
    let (a, b) = (instances[0].id, instances[1].id);
    place(admin, a, Some(w1.id)).await;
    place(admin, b, Some(w2.id)).await;

    // The plain list shows only this worker's instance, with what it runs.
    let list = worker1.assignments().await.unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].id, a);
    assert_eq!(list[0].model_name, "tiny");
    assert_eq!(
        list[0].placement.as_ref().unwrap().launch.backend,
        BackendKind::LlamaCpp
    );

    // A worker cannot report on another worker's instance, nor list all instances.
    expect_error(
        worker1
            .report_state(b, &report(InstanceState::Starting))
            .await,
        404,
        ErrorCode::NotFound,
    );
    expect_error(
        worker1.list_instances(&InstanceQuery::default()).await,
        403,
        ErrorCode::Forbidden,
    );
    let message = expect_error(
        worker1
            .report_state(a, &report(InstanceState::Running))
            .await,
        422,
        ErrorCode::ValidationFailed,
    );
    assert!(message.contains("address"), "{message}");

    let mut events = worker1.watch_assignments().await.unwrap();
    let (kind, first) = next_change(&mut events).await;
    assert_eq!((kind, first.id), (ChangeKind::Created, a));

    // Changes to the other worker's instance are not sent; a model change reaches this
    // worker's instance as a new launch (placed by hand, it restarts where it is).
    worker2
        .report_state(b, &report(InstanceState::Starting))
        .await
        .unwrap();
    let args = ModelUpdate {
        backend_args: Some(vec!["-c".into(), "256".into()]),
        ..ModelUpdate::default()
    };
    admin.update_model(model.id, &args).await.unwrap();
    let (kind, changed) = next_change(&mut events).await;
    assert_eq!((kind, changed.id), (ChangeKind::Updated, a));
    assert_eq!(
        changed.placement.unwrap().launch.backend_args,
        ["-c", "256"]
    );

    // Moving the instance away is a DELETED for this worker; moving one here a CREATED.
    place(admin, a, Some(w2.id)).await;
    let (kind, gone) = next_change(&mut events).await;
    assert_eq!((kind, gone.id), (ChangeKind::Deleted, a));
    place(admin, b, Some(w1.id)).await;
    let (kind, arrived) = next_change(&mut events).await;
    assert_eq!((kind, arrived.id), (ChangeKind::Created, b));
    server.shutdown().await;
}

/// Sends `request` on a new connection and reads until the server closes it.
async fn exchange(addr: std::net::SocketAddr, request: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
    socket.write_all(request.as_bytes()).await.unwrap();
    let mut received = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), socket.read_to_end(&mut received))
        .await
        .expect("the server closes the connection when the watch ends")
        .unwrap();
    String::from_utf8(received).unwrap()
}

/// The one event of a watch answer's body, which must be `CREATED` of `instance`.
fn only_created(body: &str, instance: i64) {
    let lines: Vec<&str> = body.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{body:?}");
    let event: WatchEvent<ModelInstance> = serde_json::from_str(lines[0]).unwrap();
    assert!(
        matches!(&event, WatchEvent::Created { object } if object.id == instance),
        "{event:?}"
    );
}

async fn the_assignment_watch_moves_to_the_bare_connection_only_when_asked(engine: TestEngine) {
    let server = TestServer::start(engine).await;
    let admin = server.client();
    let (w1, worker1) = server.register(&registration("w1", 2)).await;
    let model = admin.create_model(&tiny_model("tiny", 1)).await.unwrap();
    let instance = server.instances_of(model.id, 1).await[0].id;
    place(admin, instance, Some(w1.id)).await;
    let token = worker1.token().unwrap();
    let request = |extra: &str| {
        format!(
            "GET /api/v1/worker/assignments?watch=true&timeout_seconds=1 HTTP/1.1\r\n\
             Host: test\r\nAuthorization: Bearer {token}\r\n{extra}\r\n"
        )
    };

    // Asked: 101, then the NDJSON lines with no HTTP framing until the stream ends and
    // the server closes the connection.
    let answer = exchange(
        server.addr(),
        &request("Connection: keep-alive, Upgrade\r\nUpgrade: gantry-watch\r\n"),
    )
    .await;
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 101 "), "{head}");
    let head = head.to_ascii_lowercase();
    assert!(head.contains("upgrade: gantry-watch"), "{head}");
    assert!(!head.contains("transfer-encoding"), "{head}");
    only_created(body, instance);

    // Another protocol, or none: the ordinary streaming answer (and `close`, so that the
    // server closes the connection after it).
    for extra in [
        "Connection: Upgrade, close\r\nUpgrade: websocket\r\n",
        "Connection: close\r\n",
    ] {
        let answer = exchange(server.addr(), &request(extra)).await;
        let (head, body) = answer.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
        assert!(
            head.to_ascii_lowercase()
                .contains("transfer-encoding: chunked"),
            "{head}"
        );
        // One chunk: its size line, the event, the terminating chunk.
        let event = body.lines().nth(1).unwrap();
        only_created(event, instance);
    }

    // The typed client asks for the bare connection, and reads it.
    let mut events = worker1.watch_assignments().await.unwrap();
    let (kind, first) = next_change(&mut events).await;
    assert_eq!((kind, first.id), (ChangeKind::Created, instance));
    server.shutdown().await;
}

/// Heartbeats may carry how busy the worker is; the server keeps an hour of it, one sample
/// per 10 s, and an admin reads it back.
async fn heartbeat_samples_make_the_workers_history(engine: TestEngine) {
    let server = TestServer::start(engine).await;
    let admin = server.client();
    let (registered, worker) = server.register(&registration("w1", 2)).await;
    let history = format!("/api/v1/workers/{}/history", registered.id);
    let (status, body) = server
        .raw(Method::GET, &history, admin.token().as_deref(), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["samples"], json!([]));

    let sample = |used: u64| gantry_types::WorkerSample {
        cpu_percent: Some(12.5),
        memory_used: used,
        memory_total: 64 << 30,
        gpus: vec![gantry_types::GpuSample {
            index: 0,
            memory_used: used,
            memory_total: 24 << 30,
            utilization: Some(40),
        }],
        ..Default::default()
    };
    let timeout = Duration::from_secs(5);
    worker
        .heartbeat_within(timeout, Some(&sample(1 << 30)))
        .await
        .unwrap();
    // Within 10 s of the first: not kept.
    worker
        .heartbeat_within(timeout, Some(&sample(2 << 30)))
        .await
        .unwrap();
    // No sample at all: still a heartbeat.
    worker.heartbeat().await.unwrap();
    let (status, body) = server
        .raw(Method::GET, &history, admin.token().as_deref(), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let samples = body["samples"].as_array().unwrap();
    assert_eq!(samples.len(), 1, "{body}");
    assert_eq!(samples[0]["gpus"][0]["memory_used"], json!(1u64 << 30));
    assert_eq!(samples[0]["cpu_percent"], json!(12.5));
    assert!(samples[0]["at"].is_string(), "{body}");

    // Bad samples are refused, naming the field; the history keeps what it had.
    let (status, body) = server
        .raw(
            Method::POST,
            "/api/v1/worker/heartbeat",
            worker.token().as_deref(),
            Some(json!({"sample": {"cpu_percent": 150, "memory_used": 1, "memory_total": 2}})),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(body.to_string().contains("cpu_percent"), "{body}");
    let (status, body) = server
        .raw(Method::GET, &history, worker.token().as_deref(), None)
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let (status, _) = server
        .raw(
            Method::GET,
            "/api/v1/workers/424242/history",
            admin.token().as_deref(),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    server.shutdown().await;
}

/// A heartbeat's body is optional, as the spec says: no body, an empty one announced
/// with `Content-Length: 0` and no content type (what aiohttp and other clients send),
/// a JSON `null` (the spec's body is nullable) and a JSON sample are all accepted; a
/// body of another type is refused with 415.
async fn a_heartbeat_without_a_body_is_accepted_however_it_is_sent(engine: TestEngine) {
    let server = TestServer::start(engine).await;
    let (_, worker) = server.register(&registration("w1", 1)).await;
    let token = worker.token().unwrap();
    let heartbeat = |headers: &str, body: &str| {
        format!(
            "POST /api/v1/worker/heartbeat HTTP/1.1\r\nhost: gantry\r\nauthorization: Bearer {token}\r\n\
             connection: close\r\n{headers}\r\n{body}"
        )
    };
    let status = |answer: &str| answer.split(' ').nth(1).unwrap_or_default().to_owned();
    for (what, headers, body, expected) in [
        ("no body", "", "", "200"),
        (
            "an empty body of length 0",
            "content-length: 0\r\n",
            "",
            "200",
        ),
        (
            "a JSON sample",
            "content-type: application/json\r\ncontent-length: 2\r\n",
            "{}",
            "200",
        ),
        (
            "a JSON null",
            "content-type: application/json\r\ncontent-length: 4\r\n",
            "null",
            "200",
        ),
        (
            "a text body",
            "content-type: text/plain\r\ncontent-length: 2\r\n",
            "hi",
            "415",
        ),
    ] {
        let answer = exchange(server.addr(), &heartbeat(headers, body)).await;
        assert_eq!(status(&answer), expected, "{what}: {answer}");
    }
    server.shutdown().await;
}

test_both_engines!(
    a_heartbeat_without_a_body_is_accepted_however_it_is_sent,
    heartbeat_samples_make_the_workers_history,
    the_assignment_watch_moves_to_the_bare_connection_only_when_asked,
    workers_register_once_and_reregister_idempotently,
    silent_workers_become_not_ready_then_unreachable_and_recover,
    assignment_stream_is_scoped_to_the_calling_worker,
);
