//! The management API end to end over HTTP, against SQLite and PostgreSQL: the tour a
//! newcomer takes, every error case with its status and body, and watch streams.
//!
//! The calls go through the typed client. Raw HTTP stays where the test is about the
//! wire, which the typed client cannot say: secrets absent from an answer (a field the
//! typed answer does not have), malformed JSON, another content type, unknown fields and
//! mistyped values, bad path and query parameters, unknown routes and methods, the
//! session cookie, the NDJSON content type and heartbeat line, the probes and the OpenAPI
//! document.

use std::time::Duration;

use crate::common::{
    api_key, assert_raw_error, expect_error, model, next_change, next_event, simulated_worker,
    stored_worker, tiny_model, user, Options, TestServer, ADMIN_PASSWORD,
};
use gantry_testkit::{test_both_engines, TestEngine};
use gantry_types::{
    ApiKeyQuery, ChangeKind, ChangePasswordRequest, ErrorCode, InstanceQuery, InstanceState,
    InstanceStateReport, ModelQuery, ModelSource, ModelUpdate, Role, User, UserUpdate, WatchEvent,
};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

async fn tour_login_keys_users_models_instances(engine: TestEngine) {
    let server = TestServer::start(engine).await;
    let admin = server.client();

    // An API key, shown once, works as a bearer token.
    let key = admin.create_api_key(&api_key("ci")).await.unwrap();
    assert!(key.key.starts_with("gantry_"));
    let ci = server.client_for(&key.key);
    let keys = ci.list_api_keys(&ApiKeyQuery::default()).await.unwrap();
    assert_eq!(keys.items[0].name, "ci");
    // Read raw: what must not be listed is a field the typed answer does not have.
    let (status, keys) = server
        .raw(Method::GET, "/api/v1/api-keys", Some(&key.key), None)
        .await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        keys["items"][0].get("key").is_none(),
        "secret must not be listed"
    );

    // A user with role user; the answer is read raw for the same reason.
    let (status, bob) = server
        .raw(
            Method::POST,
            "/api/v1/users",
            Some(&key.key),
            Some(json!({"username": "bob", "password": "bob-password"})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{bob}");
    assert!(bob.get("password").is_none() && bob.get("password_hash").is_none());
    let bob: User = serde_json::from_value(bob).unwrap();
    assert_eq!(bob.role, Role::User);

    // A model with two replicas makes two pending instances.
    let model = ci.create_model(&tiny_model("tiny", 2)).await.unwrap();
    let instances = server
        .wait_for_instances_as(&ci, model.id, "2 in number", |items| items.len() == 2)
        .await;
    assert_eq!(instances[0].state, InstanceState::Pending);
    assert_eq!(instances[1].name, "tiny-1");

    // Bob can read models but not change them.
    let bob = server.login("bob", "bob-password").await;
    bob.list_models(&ModelQuery::default()).await.unwrap();

    // Scaling to 1 removes one instance; deleting the model removes the rest.
    let update = ModelUpdate {
        replicas: Some(1),
        description: Some("the tiny one".into()),
        ..ModelUpdate::default()
    };
    let model = admin.update_model(model.id, &update).await.unwrap();
    assert_eq!(model.description, "the tiny one");
    let instances = server.instances_of(model.id, 1).await;

    // Deleting an instance replaces it (a restart of that replica).
    let instance_id = instances[0].id;
    admin.delete_instance(instance_id).await.unwrap();
    let instances = server
        .wait_for_instances(model.id, "one replacement", |items| {
            items.len() == 1 && items[0].id != instance_id
        })
        .await;
    assert_ne!(instances[0].id, instance_id);

    admin.delete_model(model.id).await.unwrap();
    let instances = admin
        .list_instances(&InstanceQuery::default())
        .await
        .unwrap();
    assert_eq!(instances.pagination.total, 0);
    server.shutdown().await;
}

async fn generated_admin_password_must_be_changed_at_first_login(engine: TestEngine) {
    let server = TestServer::start_with(
        engine,
        Options {
            bootstrap_password: None,
            ..Default::default()
        },
    )
    .await;
    let password_file = server.data_path("initial_admin_password");
    let password = std::fs::read_to_string(&password_file)
        .unwrap()
        .trim()
        .to_string();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&password_file)
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o600
    );
    let token_file = server.data_path("registration_token");
    assert!(std::fs::read_to_string(&token_file)
        .unwrap()
        .starts_with("gantryreg_"));
    assert_eq!(
        std::fs::metadata(&token_file).unwrap().permissions().mode() & 0o777,
        0o600
    );

    let first = server.login("admin", &password).await;
    expect_error(
        first.list_models(&ModelQuery::default()).await,
        403,
        ErrorCode::PasswordChangeRequired,
    );
    let me = first.me().await.unwrap();
    assert!(me.require_password_change);

    let change = |current: &str, new: &str| ChangePasswordRequest {
        current_password: current.into(),
        new_password: new.into(),
    };
    expect_error(
        first
            .change_password(&change("wrong-password", "brand-new-pass"))
            .await,
        401,
        ErrorCode::Unauthorized,
    );
    let message = expect_error(
        first.change_password(&change(&password, "short")).await,
        422,
        ErrorCode::ValidationFailed,
    );
    assert!(message.contains("new_password"), "{message}");

    let changed = first
        .change_password(&change(&password, "brand-new-pass"))
        .await
        .unwrap();
    let second = server.client_for(&changed.token);
    second.list_models(&ModelQuery::default()).await.unwrap();
    // The session from before the change has ended.
    expect_error(first.me().await, 401, ErrorCode::Unauthorized);
    server.login("admin", "brand-new-pass").await;
    server.shutdown().await;
}

async fn logout_ends_the_session_and_clears_the_cookie(engine: TestEngine) {
    let server = TestServer::start(engine).await;
    let admin = server.client();
    // Raw: the test is about the cookie header.
    let response = server
        .http
        .post(format!("{}/auth/logout", server.base))
        .bearer_auth(admin.token().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    let cookie = response.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(
        cookie.starts_with("gantry_session=;") && cookie.contains("Max-Age=0"),
        "{cookie}"
    );
    expect_error(admin.me().await, 401, ErrorCode::Unauthorized);
    server.shutdown().await;
}

async fn session_cookie_authenticates(engine: TestEngine) {
    let server = TestServer::start(engine).await;
    // Raw: the test is about the cookie header.
    let response = server
        .http
        .post(format!("{}/auth/login", server.base))
        .json(&json!({"username": "admin", "password": ADMIN_PASSWORD}))
        .send()
        .await
        .unwrap();
    let cookie = response.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(cookie.contains("HttpOnly"), "{cookie}");
    let pair = cookie.split(';').next().unwrap().to_string();
    let response = server
        .http
        .get(format!("{}/auth/me", server.base))
        .header("cookie", pair)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    server.shutdown().await;
}

async fn bad_input_answers_4xx_naming_the_problem(engine: TestEngine) {
    let server = TestServer::start(engine).await;
    let admin = server.client();
    let token = admin.token();
    let token = token.as_deref();
    // The raw bodies below start from a valid model.
    let valid = || serde_json::to_value(tiny_model("m1", 1)).unwrap();

    // Malformed JSON → 400.
    let (status, body) = server
        .raw_bytes(
            Method::POST,
            "/api/v1/models",
            token,
            "application/json",
            b"{\"name\": ".to_vec(),
        )
        .await;
    assert!(assert_raw_error(status, &body, 400, ErrorCode::InvalidRequest).contains("JSON"));

    // Not JSON at all → 415.
    let (status, body) = server
        .raw_bytes(
            Method::POST,
            "/api/v1/models",
            token,
            "text/plain",
            b"hello".to_vec(),
        )
        .await;
    assert_raw_error(status, &body, 415, ErrorCode::UnsupportedMediaType);

    // Unknown field → 422 naming it.
    let mut unknown = valid();
    unknown["replica"] = json!(3);
    let (status, body) = server
        .raw(Method::POST, "/api/v1/models", token, Some(unknown))
        .await;
    assert!(assert_raw_error(status, &body, 422, ErrorCode::ValidationFailed).contains("replica"));

    // Wrong type → 422 naming the field.
    let mut wrong = valid();
    wrong["replicas"] = json!("two");
    let (status, body) = server
        .raw(Method::POST, "/api/v1/models", token, Some(wrong))
        .await;
    assert!(assert_raw_error(status, &body, 422, ErrorCode::ValidationFailed).contains("replicas"));
    let mut unknown_backend = valid();
    unknown_backend["backend"] = json!("tensorrt");
    let (status, body) = server
        .raw(Method::POST, "/api/v1/models", token, Some(unknown_backend))
        .await;
    assert!(assert_raw_error(status, &body, 422, ErrorCode::ValidationFailed).contains("backend"));

    // Out of range → 422 naming the field.
    let message = expect_error(
        admin.create_model(&tiny_model("m1", 5000)).await,
        422,
        ErrorCode::ValidationFailed,
    );
    assert!(message.contains("replicas"), "{message}");
    let message = expect_error(
        admin.create_model(&tiny_model("Bad Name", 1)).await,
        422,
        ErrorCode::ValidationFailed,
    );
    assert!(message.contains("name"), "{message}");
    let mut relative = tiny_model("m1", 1);
    relative.source = ModelSource::LocalPath {
        path: "relative".into(),
    };
    let message = expect_error(
        admin.create_model(&relative).await,
        422,
        ErrorCode::ValidationFailed,
    );
    assert!(message.contains("source.path"), "{message}");

    // Bad path parameter and query string → 400.
    let (status, body) = server
        .raw(Method::GET, "/api/v1/models/abc", token, None)
        .await;
    assert_raw_error(status, &body, 400, ErrorCode::InvalidRequest);
    let message = expect_error(
        admin
            .list_models(&ModelQuery {
                per_page: Some(0),
                ..ModelQuery::default()
            })
            .await,
        400,
        ErrorCode::InvalidRequest,
    );
    assert!(message.contains("per_page"), "{message}");
    let (status, body) = server
        .raw(Method::GET, "/api/v1/models?colour=red", token, None)
        .await;
    assert!(assert_raw_error(status, &body, 400, ErrorCode::InvalidRequest).contains("colour"));
    let (status, body) = server
        .raw(
            Method::GET,
            "/api/v1/model-instances?state=dancing",
            token,
            None,
        )
        .await;
    assert_raw_error(status, &body, 400, ErrorCode::InvalidRequest);

    // Unknown id → 404; unknown route → 404; wrong method → 405.
    let message = expect_error(admin.get_model(999).await, 404, ErrorCode::NotFound);
    assert!(message.contains("999"), "{message}");
    let (status, body) = server
        .raw(Method::GET, "/api/v1/nothing-here", token, None)
        .await;
    assert_raw_error(status, &body, 404, ErrorCode::NotFound);
    let (status, body) = server.raw(Method::PUT, "/api/v1/models", token, None).await;
    assert_raw_error(status, &body, 405, ErrorCode::MethodNotAllowed);

    // Duplicate name → 409, and the stored model is untouched.
    let original = admin.create_model(&tiny_model("m1", 1)).await.unwrap();
    let mut clash = tiny_model("m1", 3);
    clash.description = "impostor".into();
    let message = expect_error(admin.create_model(&clash).await, 409, ErrorCode::Conflict);
    assert!(message.contains("m1"), "{message}");
    assert_eq!(admin.get_model(original.id).await.unwrap(), original);
    expect_error(
        admin.create_user(&user("admin", "whatever-123")).await,
        409,
        ErrorCode::Conflict,
    );

    // A rejected update leaves the model as it was.
    let (status, body) = server
        .raw(
            Method::PATCH,
            &format!("/api/v1/models/{}", original.id),
            token,
            Some(json!({"replicas": -1})),
        )
        .await;
    assert!(assert_raw_error(status, &body, 422, ErrorCode::ValidationFailed).contains("replicas"));
    assert_eq!(admin.get_model(original.id).await.unwrap(), original);

    // Over the body limit → 413.
    let mut huge = tiny_model("m2", 1);
    huge.description = "x".repeat(2 * 1024 * 1024);
    expect_error(
        admin.create_model(&huge).await,
        413,
        ErrorCode::PayloadTooLarge,
    );
    server.shutdown().await;
}

async fn credentials_are_checked_and_roles_enforced(engine: TestEngine) {
    let server = TestServer::start(engine).await;
    let admin = server.client();
    let all_models = ModelQuery::default();

    // Missing and invalid credentials → 401.
    let message = expect_error(
        server.anonymous().list_models(&all_models).await,
        401,
        ErrorCode::Unauthorized,
    );
    assert!(message.contains("Bearer"), "{message}");
    for bad in ["garbage", "gantry_abc_def", "gantryw_nope", "eyJ.eyJ.sig"] {
        expect_error(
            server.client_for(bad).list_models(&all_models).await,
            401,
            ErrorCode::Unauthorized,
        );
    }
    for (username, password) in [
        ("admin", "not-the-password"),
        ("nobody", "not-the-password"),
    ] {
        expect_error(
            server.anonymous().login(username, password).await,
            401,
            ErrorCode::Unauthorized,
        );
    }

    // A plain user → 403 on admin endpoints, but manages their own keys.
    admin
        .create_user(&user("bob", "bob-password"))
        .await
        .unwrap();
    let bob = server.login("bob", "bob-password").await;
    expect_error(
        bob.create_model(&tiny_model("x", 1)).await,
        403,
        ErrorCode::Forbidden,
    );
    expect_error(
        bob.list_users(&Default::default()).await,
        403,
        ErrorCode::Forbidden,
    );
    expect_error(
        bob.list_workers(&Default::default()).await,
        403,
        ErrorCode::Forbidden,
    );
    expect_error(bob.delete_model(1).await, 403, ErrorCode::Forbidden);
    let key = bob.create_api_key(&api_key("bobs")).await.unwrap();
    let bob_key = server.client_for(&key.key);
    expect_error(
        bob_key.create_model(&tiny_model("x", 1)).await,
        403,
        ErrorCode::Forbidden,
    );

    // Admins see every key; Bob sees only his and cannot ask for others'.
    let others = ApiKeyQuery {
        user_id: Some(1),
        ..ApiKeyQuery::default()
    };
    expect_error(bob.list_api_keys(&others).await, 403, ErrorCode::Forbidden);
    let all = admin.list_api_keys(&ApiKeyQuery::default()).await.unwrap();
    assert_eq!(all.pagination.total, 1);

    // Deleting a key revokes it at once, even though it was just used (cached).
    bob.delete_api_key(key.api_key.id).await.unwrap();
    expect_error(
        bob_key.list_models(&all_models).await,
        401,
        ErrorCode::Unauthorized,
    );

    // A worker credential may call worker endpoints only.
    let credential = "gantryw_testcredential0123456789";
    let digest = gantry_server::auth::secrets::digest(credential);
    stored_worker(&server.state().store, "w1", &digest).await;
    let worker = server.client_for(credential);
    let refusals = [
        expect_error(
            worker.list_workers(&Default::default()).await,
            403,
            ErrorCode::Forbidden,
        ),
        expect_error(
            worker.list_users(&Default::default()).await,
            403,
            ErrorCode::Forbidden,
        ),
        expect_error(worker.delete_model(1).await, 403, ErrorCode::Forbidden),
        expect_error(worker.me().await, 403, ErrorCode::Forbidden),
    ];
    for message in refusals {
        assert!(message.contains("worker"), "{message}");
    }

    // The last admin can be neither deleted nor demoted.
    expect_error(admin.delete_user(1).await, 409, ErrorCode::Conflict);
    let demote = UserUpdate {
        role: Some(Role::User),
        ..UserUpdate::default()
    };
    expect_error(
        admin.update_user(1, &demote).await,
        409,
        ErrorCode::Conflict,
    );
    server.shutdown().await;
}

async fn expired_api_keys_are_refused(engine: TestEngine) {
    let server = TestServer::start(engine).await;
    let secret = "expiredsecret0123456789";
    let full = format!("gantry_oldkey_{secret}");
    let store = &server.state().store;
    store
        .create_api_key(&gantry_store::NewApiKey {
            user_id: 1,
            name: "old".into(),
            description: String::new(),
            access_key: "oldkey".into(),
            lookup_digest: gantry_server::auth::secrets::digest(&full),
            secret_hash: gantry_server::auth::password::hash(secret.into())
                .await
                .unwrap(),
            expires_at: Some(gantry_types::Timestamp::from_millis(1_000)),
            limits: Default::default(),
        })
        .await
        .unwrap();
    let message = expect_error(
        server
            .client_for(&full)
            .list_models(&ModelQuery::default())
            .await,
        401,
        ErrorCode::Unauthorized,
    );
    assert!(message.contains("expired"), "{message}");
    server.shutdown().await;
}

/// Reads an NDJSON answer as it comes until a line satisfies `want`, and returns it.
async fn raw_line_until(response: &mut reqwest::Response, want: impl Fn(&Value) -> bool) -> Value {
    let mut buffer = String::new();
    loop {
        while let Some(end) = buffer.find('\n') {
            let line: Value = serde_json::from_str(&buffer[..end]).unwrap();
            buffer.drain(..=end);
            if want(&line) {
                return line;
            }
        }
        let chunk = tokio::time::timeout(Duration::from_secs(10), response.chunk())
            .await
            .expect("a line within 10 s")
            .unwrap()
            .expect("the stream is open");
        buffer.push_str(std::str::from_utf8(&chunk).unwrap());
    }
}

async fn watch_streams_send_existing_then_live_events(engine: TestEngine) {
    let server = TestServer::start_with(
        engine,
        Options {
            watch_heartbeat: Duration::from_millis(300),
            ..Default::default()
        },
    )
    .await;
    let admin = server.client();
    admin.create_model(&tiny_model("first", 0)).await.unwrap();
    // Raw alongside: the content type, and the exact heartbeat line (below).
    let mut raw = server
        .http
        .get(format!("{}/api/v1/models?watch=true", server.base))
        .bearer_auth(admin.token().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(raw.status(), StatusCode::OK);
    assert_eq!(raw.headers()["content-type"], "application/x-ndjson");

    let mut events = admin.watch_models(&ModelQuery::default()).await.unwrap();
    match next_event(&mut events).await {
        WatchEvent::Created { object } => assert_eq!(object.name, "first"),
        other => panic!("the existing model comes first: {other:?}"),
    }

    let second = admin.create_model(&tiny_model("second", 0)).await.unwrap();
    let (kind, model) = next_change(&mut events).await;
    assert_eq!((kind, model.name.as_str()), (ChangeKind::Created, "second"));
    let update = ModelUpdate {
        description: Some("changed".into()),
        ..ModelUpdate::default()
    };
    admin.update_model(second.id, &update).await.unwrap();
    let (kind, model) = next_change(&mut events).await;
    assert_eq!(kind, ChangeKind::Updated);
    assert_eq!(model.description, "changed");
    admin.delete_model(second.id).await.unwrap();
    let (kind, model) = next_change(&mut events).await;
    assert_eq!(kind, ChangeKind::Deleted);
    assert_eq!(model.name, "second");

    // An idle stream says it is alive, with a line that carries nothing else.
    assert_eq!(next_event(&mut events).await, WatchEvent::Heartbeat);
    let heartbeat = raw_line_until(&mut raw, |line| line["type"] == "HEARTBEAT").await;
    assert!(heartbeat.get("object").is_none(), "{heartbeat}");

    // Filtered watches see only what matches.
    let running = InstanceQuery {
        state: Some(InstanceState::Running),
        ..InstanceQuery::default()
    };
    let mut instance_events = admin.watch_instances(&running).await.unwrap();
    admin.create_model(&tiny_model("third", 1)).await.unwrap();
    let event = next_event(&mut instance_events).await;
    assert_eq!(
        event,
        WatchEvent::Heartbeat,
        "pending instances must not pass a state=running filter: {event:?}"
    );
    server.shutdown().await;
}

async fn probes_and_openapi_are_served(engine: TestEngine) {
    let server = TestServer::start(engine).await;
    let (status, body) = server.raw(Method::GET, "/healthz", None, None).await;
    assert_eq!(
        (status, body["status"].as_str()),
        (StatusCode::OK, Some("ok"))
    );
    let (status, body) = server.raw(Method::GET, "/readyz", None, None).await;
    assert_eq!(
        (status, body["status"].as_str()),
        (StatusCode::OK, Some("ready"))
    );
    let (status, spec) = server
        .raw(Method::GET, "/api/openapi.json", None, None)
        .await;
    assert_eq!(status, StatusCode::OK);
    for path in [
        "/auth/login",
        "/auth/change-password",
        "/api/v1/users",
        "/api/v1/users/{id}",
        "/api/v1/api-keys",
        "/api/v1/workers/{id}/labels",
        "/api/v1/models/{id}",
        "/api/v1/model-instances/{id}",
    ] {
        assert!(spec["paths"].get(path).is_some(), "spec lacks {path}");
    }
    assert!(spec["components"]["schemas"].get("ModelCreate").is_some());
    let docs = server
        .http
        .get(format!("{}/docs", server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(docs.status(), StatusCode::OK);
    assert!(docs.text().await.unwrap().contains("/api/openapi.json"));
    server.shutdown().await;
}

async fn failed_logins_are_limited_per_address_and_username(engine: TestEngine) {
    let server = TestServer::start(engine).await;
    let login = |http: reqwest::Client, username: &'static str, password: &'static str| {
        let url = format!("{}/auth/login", server.base);
        async move {
            http.post(url)
                .json(&json!({"username": username, "password": password}))
                .send()
                .await
                .unwrap()
        }
    };
    let here = reqwest::Client::new();
    for _ in 0..gantry_server::login_limit::PER_USER_AND_ADDRESS {
        let response = login(here.clone(), "admin", "wrong-password").await;
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    }
    // Refused without checking the password, even the right one.
    let response = login(here.clone(), "admin", ADMIN_PASSWORD).await;
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry_after: u64 = response.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&retry_after), "{retry_after}");
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "too_many_requests", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("try again in"),
        "{body}"
    );
    // Another username from this address is still checked.
    let response = login(here.clone(), "nobody", "wrong-password").await;
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    // The flood from 127.0.0.1 does not lock the account for another address.
    let elsewhere = reqwest::Client::builder()
        .local_address(std::net::IpAddr::from([127, 0, 0, 2]))
        .build()
        .unwrap();
    let response = login(elsewhere, "admin", ADMIN_PASSWORD).await;
    assert_eq!(response.status(), StatusCode::OK);
    server.shutdown().await;
}

/// A local path the server cannot find is refused on creation and on a change, naming the
/// field and the path; a source that exists replaces the old one through PATCH and rolls
/// the instance onto it.
async fn a_missing_model_file_is_refused_and_a_new_source_rolls_the_instances(engine: TestEngine) {
    let server = TestServer::start(engine).await;
    let admin = server.client();
    let (_, worker) = server.register(&simulated_worker("w1", 1)).await;

    let missing = server.data_dir.path().join("missing.gguf");
    let missing = missing.display().to_string();
    let message = expect_error(
        admin.create_model(&model("tiny", &missing, 1)).await,
        422,
        ErrorCode::ValidationFailed,
    );
    assert!(
        message.starts_with("source.path:")
            && message.contains(&missing)
            && message.contains("does not exist on the server"),
        "{message}"
    );
    let models = admin.list_models(&ModelQuery::default()).await.unwrap();
    assert!(models.items.is_empty(), "a refused model is not stored");
    // A custom backend's files are never read by the server: only its workers can tell.
    let mut custom = model("custom", &missing, 0);
    custom.backend = gantry_types::BackendName::new("custom");
    custom.custom_command = Some("serve --port {port}".into());
    admin.create_model(&custom).await.unwrap();

    let first = server.data_dir.path().join("first.gguf");
    gantry_gguf::write_tiny_llama(&first).unwrap();
    let created = admin
        .create_model(&model("tiny", &first.display().to_string(), 1))
        .await
        .unwrap();
    let placed = server
        .wait_for_instances(created.id, "placed", |list| {
            list.len() == 1 && list[0].state == InstanceState::Scheduled
        })
        .await;
    let running = InstanceStateReport {
        address: Some("127.0.0.1:40000".into()),
        port: Some(40000),
        ..InstanceStateReport::new(InstanceState::Running, "")
    };
    worker.report_state(placed[0].id, &running).await.unwrap();

    // A new source the server cannot find changes nothing.
    let to_missing = ModelUpdate {
        source: Some(ModelSource::LocalPath {
            path: missing.clone(),
        }),
        ..ModelUpdate::default()
    };
    let message = expect_error(
        admin.update_model(created.id, &to_missing).await,
        422,
        ErrorCode::ValidationFailed,
    );
    assert!(message.starts_with("source.path:"), "{message}");
    assert_eq!(
        admin.get_model(created.id).await.unwrap().source,
        created.source
    );

    // One that exists replaces it, and the running instance is moved onto it.
    let second = server.data_dir.path().join("second.gguf");
    gantry_gguf::write_tiny_llama(&second).unwrap();
    let new_source = ModelSource::LocalPath {
        path: second.display().to_string(),
    };
    let to_second = ModelUpdate {
        source: Some(new_source.clone()),
        ..ModelUpdate::default()
    };
    let updated = admin.update_model(created.id, &to_second).await.unwrap();
    assert_eq!(updated.source, new_source);
    let rolled = server
        .wait_for_instances(created.id, "placed with the new source", |list| {
            list.len() == 1
                && list[0].state == InstanceState::Scheduled
                && list[0]
                    .placement
                    .as_ref()
                    .is_some_and(|record| record.launch.source == new_source)
        })
        .await;
    assert_eq!(rolled[0].id, placed[0].id, "the same replica, rolled");
    server.shutdown().await;
}

/// `POST /api/v1/model-instances/{id}/restart` asks the instance's worker; what cannot be
/// asked says why: no such instance, not placed yet, a worker that cannot be reached.
async fn a_restart_goes_to_the_instances_worker_or_says_why_it_cannot(engine: TestEngine) {
    let server = TestServer::start(engine).await;
    let admin = server.client();
    let token = admin.token().unwrap();
    let restart = |id: i64| {
        let token = token.clone();
        let server = &server;
        async move {
            server
                .raw(
                    Method::POST,
                    &format!("/api/v1/model-instances/{id}/restart"),
                    Some(&token),
                    None,
                )
                .await
        }
    };
    let (status, body) = restart(999).await;
    assert_raw_error(status, &body, 404, ErrorCode::NotFound);

    let pending = admin.create_model(&tiny_model("pending", 1)).await.unwrap();
    let unplaced = server
        .wait_for_instances(pending.id, "one instance", |list| list.len() == 1)
        .await;
    let (status, body) = restart(unplaced[0].id).await;
    let message = assert_raw_error(status, &body, 409, ErrorCode::Conflict);
    assert!(message.contains("not placed on a worker yet"), "{message}");

    // A worker registered where nothing listens (127.0.0.1:1).
    let (worker, _) = server.register(&simulated_worker("w1", 1)).await;
    let placement = gantry_types::InstancePatch {
        worker_id: Some(Some(worker.id)),
        gpu_indexes: Some(vec![0]),
    };
    admin
        .place_instance(unplaced[0].id, &placement)
        .await
        .unwrap();
    let (status, body) = restart(unplaced[0].id).await;
    let message = assert_raw_error(status, &body, 502, ErrorCode::WorkerUnreachable);
    assert!(message.contains("w1"), "{message}");

    // Users may look, not restart.
    admin
        .create_user(&user("bob", "bob-password"))
        .await
        .unwrap();
    let bob = server.login("bob", "bob-password").await;
    let (status, body) = server
        .raw(
            Method::POST,
            &format!("/api/v1/model-instances/{}/restart", unplaced[0].id),
            Some(&bob.token().unwrap()),
            None,
        )
        .await;
    assert_raw_error(status, &body, 403, ErrorCode::Forbidden);
    server.shutdown().await;
}

test_both_engines!(
    a_restart_goes_to_the_instances_worker_or_says_why_it_cannot,
    a_missing_model_file_is_refused_and_a_new_source_rolls_the_instances,
    tour_login_keys_users_models_instances,
    generated_admin_password_must_be_changed_at_first_login,
    logout_ends_the_session_and_clears_the_cookie,
    session_cookie_authenticates,
    bad_input_answers_4xx_naming_the_problem,
    credentials_are_checked_and_roles_enforced,
    expired_api_keys_are_refused,
    watch_streams_send_existing_then_live_events,
    probes_and_openapi_are_served,
    failed_logins_are_limited_per_address_and_username,
);
