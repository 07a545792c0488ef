//! The management API end to end over HTTP, against SQLite and PostgreSQL: the tour a
//! newcomer takes, every error case with its status and body, and watch streams.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{
    assert_error, ndjson_lines, next_event, next_non_heartbeat, tiny_model, Options, TestServer,
    ADMIN_PASSWORD,
};
use gantry_testkit::{test_both_engines, TestEngine};
use reqwest::{Method, StatusCode};
use serde_json::json;

async fn tour_login_keys_users_models_instances(engine: TestEngine) {
    let server = TestServer::start(engine).await;
    let admin = server.admin_token().await;

    // An API key, shown once, works as a bearer token.
    let (status, key) = server
        .call(
            Method::POST,
            "/api/v1/api-keys",
            Some(&admin),
            Some(json!({"name": "ci"})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{key}");
    let full_key = key["key"].as_str().unwrap().to_string();
    assert!(full_key.starts_with("gantry_"));
    let (status, keys) = server
        .call(Method::GET, "/api/v1/api-keys", Some(&full_key), None)
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(keys["items"][0]["name"], "ci");
    assert!(
        keys["items"][0].get("key").is_none(),
        "secret must not be listed"
    );

    // A user with role user.
    let (status, user) = server
        .call(
            Method::POST,
            "/api/v1/users",
            Some(&full_key),
            Some(json!({"username": "bob", "password": "bob-password"})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{user}");
    assert_eq!(user["role"], "user");
    assert!(user.get("password").is_none() && user.get("password_hash").is_none());

    // A model with two replicas makes two pending instances.
    let (status, model) = server
        .call(
            Method::POST,
            "/api/v1/models",
            Some(&full_key),
            Some(tiny_model("tiny", 2)),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{model}");
    let model_id = model["id"].as_i64().unwrap();
    let instances = server.instances_of(&full_key, model_id, 2).await;
    assert_eq!(instances["items"][0]["state"], "pending");
    assert_eq!(instances["items"][1]["name"], "tiny-1");

    // Bob can read models but not change them.
    let bob = server.login("bob", "bob-password").await;
    let (status, _) = server
        .call(Method::GET, "/api/v1/models", Some(&bob), None)
        .await;
    assert_eq!(status, StatusCode::OK);

    // Scaling to 1 removes one instance; deleting the model removes the rest.
    let (status, model) = server
        .call(
            Method::PATCH,
            &format!("/api/v1/models/{model_id}"),
            Some(&admin),
            Some(json!({"replicas": 1, "description": "the tiny one"})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{model}");
    assert_eq!(model["description"], "the tiny one");
    let instances = server.instances_of(&admin, model_id, 1).await;

    // Deleting an instance replaces it (a restart of that replica).
    let instance_id = instances["items"][0]["id"].as_i64().unwrap();
    let (status, _) = server
        .call(
            Method::DELETE,
            &format!("/api/v1/model-instances/{instance_id}"),
            Some(&admin),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let instances = server
        .wait_for("/api/v1/model-instances", &admin, |list| {
            list["pagination"]["total"] == 1 && list["items"][0]["id"] != instance_id
        })
        .await;
    assert_ne!(instances["items"][0]["id"].as_i64().unwrap(), instance_id);

    let (status, _) = server
        .call(
            Method::DELETE,
            &format!("/api/v1/models/{model_id}"),
            Some(&admin),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (_, instances) = server
        .call(Method::GET, "/api/v1/model-instances", Some(&admin), None)
        .await;
    assert_eq!(instances["pagination"]["total"], 0);
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
    let (status, body) = server
        .call(Method::GET, "/api/v1/models", Some(&first), None)
        .await;
    assert_error(status, &body, 403, "password_change_required");
    let (status, me) = server
        .call(Method::GET, "/auth/me", Some(&first), None)
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(me["require_password_change"], true);

    let (status, body) = server
        .call(
            Method::POST,
            "/auth/change-password",
            Some(&first),
            Some(json!({"current_password": "wrong-password", "new_password": "brand-new-pass"})),
        )
        .await;
    assert_error(status, &body, 401, "unauthorized");
    let (status, body) = server
        .call(
            Method::POST,
            "/auth/change-password",
            Some(&first),
            Some(json!({"current_password": password, "new_password": "short"})),
        )
        .await;
    assert!(assert_error(status, &body, 422, "validation_failed").contains("new_password"));

    let (status, changed) = server
        .call(
            Method::POST,
            "/auth/change-password",
            Some(&first),
            Some(json!({"current_password": password, "new_password": "brand-new-pass"})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{changed}");
    let second = changed["token"].as_str().unwrap();
    let (status, _) = server
        .call(Method::GET, "/api/v1/models", Some(second), None)
        .await;
    assert_eq!(status, StatusCode::OK);
    // The session from before the change has ended.
    let (status, body) = server
        .call(Method::GET, "/auth/me", Some(&first), None)
        .await;
    assert_error(status, &body, 401, "unauthorized");
    server.login("admin", "brand-new-pass").await;
    server.shutdown().await;
}

async fn logout_ends_the_session_and_clears_the_cookie(engine: TestEngine) {
    let server = TestServer::start(engine).await;
    let token = server.admin_token().await;
    let response = server
        .client
        .post(format!("{}/auth/logout", server.base))
        .bearer_auth(&token)
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
    let (status, body) = server
        .call(Method::GET, "/auth/me", Some(&token), None)
        .await;
    assert_error(status, &body, 401, "unauthorized");
    server.shutdown().await;
}

async fn session_cookie_authenticates(engine: TestEngine) {
    let server = TestServer::start(engine).await;
    let response = server
        .client
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
        .client
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
    let admin = server.admin_token().await;
    let token = Some(admin.as_str());

    // Malformed JSON → 400.
    let (status, body) = server
        .call_raw(
            Method::POST,
            "/api/v1/models",
            token,
            "application/json",
            b"{\"name\": ".to_vec(),
        )
        .await;
    assert!(assert_error(status, &body, 400, "invalid_request").contains("JSON"));

    // Not JSON at all → 415.
    let (status, body) = server
        .call_raw(
            Method::POST,
            "/api/v1/models",
            token,
            "text/plain",
            b"hello".to_vec(),
        )
        .await;
    assert_error(status, &body, 415, "unsupported_media_type");

    // Unknown field → 422 naming it.
    let mut unknown = tiny_model("m1", 1);
    unknown["replica"] = json!(3);
    let (status, body) = server
        .call(Method::POST, "/api/v1/models", token, Some(unknown))
        .await;
    assert!(assert_error(status, &body, 422, "validation_failed").contains("replica"));

    // Wrong type → 422 naming the field.
    let mut wrong = tiny_model("m1", 1);
    wrong["replicas"] = json!("two");
    let (status, body) = server
        .call(Method::POST, "/api/v1/models", token, Some(wrong))
        .await;
    assert!(assert_error(status, &body, 422, "validation_failed").contains("replicas"));

    // Out of range → 422 naming the field.
    let (status, body) = server
        .call(
            Method::POST,
            "/api/v1/models",
            token,
            Some(tiny_model("m1", 5000)),
        )
        .await;
    assert!(assert_error(status, &body, 422, "validation_failed").contains("replicas"));
    let mut bad_name = tiny_model("Bad Name", 1);
    bad_name["name"] = json!("Bad Name");
    let (status, body) = server
        .call(Method::POST, "/api/v1/models", token, Some(bad_name))
        .await;
    assert!(assert_error(status, &body, 422, "validation_failed").contains("name"));
    let (status, body) = server
        .call(
            Method::POST,
            "/api/v1/models",
            token,
            Some(json!({"name": "m1", "source": {"type": "local_path", "path": "relative"}, "backend": "llama.cpp"})),
        )
        .await;
    assert!(assert_error(status, &body, 422, "validation_failed").contains("source.path"));
    let (status, body) = server
        .call(
            Method::POST,
            "/api/v1/models",
            token,
            Some(json!({"name": "m1", "source": {"type": "local_path", "path": "/m"}, "backend": "tensorrt"})),
        )
        .await;
    assert!(assert_error(status, &body, 422, "validation_failed").contains("backend"));

    // Bad path parameter and query string → 400.
    let (status, body) = server
        .call(Method::GET, "/api/v1/models/abc", token, None)
        .await;
    assert_error(status, &body, 400, "invalid_request");
    let (status, body) = server
        .call(Method::GET, "/api/v1/models?per_page=0", token, None)
        .await;
    assert!(assert_error(status, &body, 400, "invalid_request").contains("per_page"));
    let (status, body) = server
        .call(Method::GET, "/api/v1/models?colour=red", token, None)
        .await;
    assert!(assert_error(status, &body, 400, "invalid_request").contains("colour"));
    let (status, body) = server
        .call(
            Method::GET,
            "/api/v1/model-instances?state=dancing",
            token,
            None,
        )
        .await;
    assert_error(status, &body, 400, "invalid_request");

    // Unknown id → 404; unknown route → 404; wrong method → 405.
    let (status, body) = server
        .call(Method::GET, "/api/v1/models/999", token, None)
        .await;
    assert!(assert_error(status, &body, 404, "not_found").contains("999"));
    let (status, body) = server
        .call(Method::GET, "/api/v1/nothing-here", token, None)
        .await;
    assert_error(status, &body, 404, "not_found");
    let (status, body) = server
        .call(Method::PUT, "/api/v1/models", token, None)
        .await;
    assert_error(status, &body, 405, "method_not_allowed");

    // Duplicate name → 409, and the stored model is untouched.
    let (status, original) = server
        .call(
            Method::POST,
            "/api/v1/models",
            token,
            Some(tiny_model("m1", 1)),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let mut clash = tiny_model("m1", 3);
    clash["description"] = json!("impostor");
    let (status, body) = server
        .call(Method::POST, "/api/v1/models", token, Some(clash))
        .await;
    assert!(assert_error(status, &body, 409, "conflict").contains("m1"));
    let (_, stored) = server
        .call(
            Method::GET,
            &format!("/api/v1/models/{}", original["id"]),
            token,
            None,
        )
        .await;
    assert_eq!(stored, original);
    let (status, body) = server
        .call(
            Method::POST,
            "/api/v1/users",
            token,
            Some(json!({"username": "admin", "password": "whatever-123"})),
        )
        .await;
    assert_error(status, &body, 409, "conflict");

    // A rejected update leaves the model as it was.
    let (status, body) = server
        .call(
            Method::PATCH,
            &format!("/api/v1/models/{}", original["id"]),
            token,
            Some(json!({"replicas": -1})),
        )
        .await;
    assert!(assert_error(status, &body, 422, "validation_failed").contains("replicas"));
    let (_, stored) = server
        .call(
            Method::GET,
            &format!("/api/v1/models/{}", original["id"]),
            token,
            None,
        )
        .await;
    assert_eq!(stored, original);

    // Over the body limit → 413.
    let mut huge = tiny_model("m2", 1);
    huge["description"] = json!("x".repeat(2 * 1024 * 1024));
    let (status, body) = server
        .call(Method::POST, "/api/v1/models", token, Some(huge))
        .await;
    assert_error(status, &body, 413, "payload_too_large");
    server.shutdown().await;
}

async fn credentials_are_checked_and_roles_enforced(engine: TestEngine) {
    let server = TestServer::start(engine).await;
    let admin = server.admin_token().await;

    // Missing and invalid credentials → 401.
    let (status, body) = server.call(Method::GET, "/api/v1/models", None, None).await;
    assert!(assert_error(status, &body, 401, "unauthorized").contains("Bearer"));
    for bad in ["garbage", "gantry_abc_def", "gantryw_nope", "eyJ.eyJ.sig"] {
        let (status, body) = server
            .call(Method::GET, "/api/v1/models", Some(bad), None)
            .await;
        assert_error(status, &body, 401, "unauthorized");
    }
    let (status, body) = server
        .call(
            Method::POST,
            "/auth/login",
            None,
            Some(json!({"username": "admin", "password": "not-the-password"})),
        )
        .await;
    assert_error(status, &body, 401, "unauthorized");
    let (status, body) = server
        .call(
            Method::POST,
            "/auth/login",
            None,
            Some(json!({"username": "nobody", "password": "not-the-password"})),
        )
        .await;
    assert_error(status, &body, 401, "unauthorized");

    // A plain user → 403 on admin endpoints, but manages their own keys.
    server
        .call(
            Method::POST,
            "/api/v1/users",
            Some(&admin),
            Some(json!({"username": "bob", "password": "bob-password"})),
        )
        .await;
    let bob = server.login("bob", "bob-password").await;
    for (method, path, body) in [
        (Method::POST, "/api/v1/models", Some(tiny_model("x", 1))),
        (Method::GET, "/api/v1/users", None),
        (Method::GET, "/api/v1/workers", None),
        (Method::DELETE, "/api/v1/models/1", None),
    ] {
        let (status, response) = server.call(method, path, Some(&bob), body).await;
        assert_error(status, &response, 403, "forbidden");
    }
    let (status, key) = server
        .call(
            Method::POST,
            "/api/v1/api-keys",
            Some(&bob),
            Some(json!({"name": "bobs"})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let bob_key = key["key"].as_str().unwrap().to_string();
    let (status, body) = server
        .call(
            Method::POST,
            "/api/v1/models",
            Some(&bob_key),
            Some(tiny_model("x", 1)),
        )
        .await;
    assert_error(status, &body, 403, "forbidden");

    // Admins see every key; Bob sees only his and cannot ask for others'.
    let (status, body) = server
        .call(Method::GET, "/api/v1/api-keys?user_id=1", Some(&bob), None)
        .await;
    assert_error(status, &body, 403, "forbidden");
    let (_, all) = server
        .call(Method::GET, "/api/v1/api-keys", Some(&admin), None)
        .await;
    assert_eq!(all["pagination"]["total"], 1);

    // Deleting a key revokes it at once, even though it was just used (cached).
    let key_id = key["id"].as_i64().unwrap();
    let (status, _) = server
        .call(
            Method::DELETE,
            &format!("/api/v1/api-keys/{key_id}"),
            Some(&bob),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, body) = server
        .call(Method::GET, "/api/v1/models", Some(&bob_key), None)
        .await;
    assert_error(status, &body, 401, "unauthorized");

    // A worker credential may call worker endpoints only.
    let credential = "gantryw_testcredential0123456789";
    server
        .state()
        .store
        .create_worker(
            "w1",
            &Default::default(),
            "127.0.0.1:1",
            &Default::default(),
            &gantry_server::auth::secrets::digest(credential),
        )
        .await
        .unwrap();
    for (method, path) in [
        (Method::GET, "/api/v1/workers"),
        (Method::GET, "/api/v1/users"),
        (Method::DELETE, "/api/v1/models/1"),
        (Method::GET, "/auth/me"),
    ] {
        let (status, body) = server.call(method, path, Some(credential), None).await;
        assert!(assert_error(status, &body, 403, "forbidden").contains("worker"));
    }

    // The last admin can be neither deleted nor demoted.
    let (status, body) = server
        .call(Method::DELETE, "/api/v1/users/1", Some(&admin), None)
        .await;
    assert_error(status, &body, 409, "conflict");
    let (status, body) = server
        .call(
            Method::PATCH,
            "/api/v1/users/1",
            Some(&admin),
            Some(json!({"role": "user"})),
        )
        .await;
    assert_error(status, &body, 409, "conflict");
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
        })
        .await
        .unwrap();
    let (status, body) = server
        .call(Method::GET, "/api/v1/models", Some(&full), None)
        .await;
    assert!(assert_error(status, &body, 401, "unauthorized").contains("expired"));
    server.shutdown().await;
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
    let admin = server.admin_token().await;
    server
        .call(
            Method::POST,
            "/api/v1/models",
            Some(&admin),
            Some(tiny_model("first", 0)),
        )
        .await;
    let response = server
        .client
        .get(format!("{}/api/v1/models?watch=true", server.base))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["content-type"], "application/x-ndjson");
    let mut lines = ndjson_lines(response);
    let first = next_event(&mut lines).await;
    assert_eq!(first["type"], "CREATED");
    assert_eq!(first["object"]["name"], "first");

    let (_, second) = server
        .call(
            Method::POST,
            "/api/v1/models",
            Some(&admin),
            Some(tiny_model("second", 0)),
        )
        .await;
    let event = next_non_heartbeat(&mut lines).await;
    assert_eq!(
        (event["type"].as_str(), event["object"]["name"].as_str()),
        (Some("CREATED"), Some("second"))
    );
    server
        .call(
            Method::PATCH,
            &format!("/api/v1/models/{}", second["id"]),
            Some(&admin),
            Some(json!({"description": "changed"})),
        )
        .await;
    let event = next_non_heartbeat(&mut lines).await;
    assert_eq!(event["type"], "UPDATED");
    assert_eq!(event["object"]["description"], "changed");
    server
        .call(
            Method::DELETE,
            &format!("/api/v1/models/{}", second["id"]),
            Some(&admin),
            None,
        )
        .await;
    let event = next_non_heartbeat(&mut lines).await;
    assert_eq!(event["type"], "DELETED");
    assert_eq!(event["object"]["name"], "second");

    // An idle stream says it is alive.
    let heartbeat = next_event(&mut lines).await;
    assert_eq!(heartbeat["type"], "HEARTBEAT");
    assert!(heartbeat.get("object").is_none());

    // Filtered watches see only what matches.
    let response = server
        .client
        .get(format!(
            "{}/api/v1/model-instances?watch=true&state=running",
            server.base
        ))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    let mut instance_lines = ndjson_lines(response);
    server
        .call(
            Method::POST,
            "/api/v1/models",
            Some(&admin),
            Some(tiny_model("third", 1)),
        )
        .await;
    let event = next_event(&mut instance_lines).await;
    assert_eq!(
        event["type"], "HEARTBEAT",
        "pending instances must not pass a state=running filter: {event}"
    );
    server.shutdown().await;
}

async fn probes_and_openapi_are_served(engine: TestEngine) {
    let server = TestServer::start(engine).await;
    let (status, body) = server.call(Method::GET, "/healthz", None, None).await;
    assert_eq!(
        (status, body["status"].as_str()),
        (StatusCode::OK, Some("ok"))
    );
    let (status, body) = server.call(Method::GET, "/readyz", None, None).await;
    assert_eq!(
        (status, body["status"].as_str()),
        (StatusCode::OK, Some("ready"))
    );
    let (status, spec) = server
        .call(Method::GET, "/api/openapi.json", None, None)
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
        .client
        .get(format!("{}/docs", server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(docs.status(), StatusCode::OK);
    assert!(docs.text().await.unwrap().contains("/api/openapi.json"));
    server.shutdown().await;
}

test_both_engines!(
    tour_login_keys_users_models_instances,
    generated_admin_password_must_be_changed_at_first_login,
    logout_ends_the_session_and_clears_the_cookie,
    session_cookie_authenticates,
    bad_input_answers_4xx_naming_the_problem,
    credentials_are_checked_and_roles_enforced,
    expired_api_keys_are_refused,
    watch_streams_send_existing_then_live_events,
    probes_and_openapi_are_served,
);
