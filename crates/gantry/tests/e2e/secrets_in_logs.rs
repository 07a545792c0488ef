//! No secret in any log line, at any level: a server and a worker log at `trace` while
//! the secrets of a cluster are made and used — the admin's and a user's password (and a
//! wrong one), a session token, an API key used on the gateway, the registration token,
//! the worker's credential and API token, the JWT secret, a model provider's API key sent
//! on to the provider — and then every line of both
//! logs is searched for each of them.

use std::time::Duration;

use crate::common::{self, Cluster, ADMIN_PASSWORD};
use gantry_client::Client;
use gantry_types::{Role, UserCreate};
use serde_json::{json, Value};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_reaches_a_log_line_at_trace_level() {
    let dir = tempfile::tempdir().unwrap();
    let trace = [("GANTRY_LOG_LEVEL", "trace".to_string())];
    let server = Cluster::start_in(dir, &[], &trace).await;
    let worker = server.worker_with_env(
        "w1",
        &["--simulate-gpus", "1x8GiB", "--heartbeat-interval", "300ms"],
        &trace,
    );
    server.worker_id("w1", &worker).await;

    let admin = server.client();
    let user_password = "user-password-secret-7";
    admin
        .create_user(&UserCreate {
            cluster_admin_of: Vec::new(),
            username: "alice".into(),
            password: user_password.into(),
            role: Role::User,
            full_name: String::new(),
            require_password_change: false,
        })
        .await
        .unwrap();
    let anonymous = Client::new(&server.base);
    let wrong_password = "wrong-password-secret-9";
    assert!(anonymous.login("alice", wrong_password).await.is_err());
    let alice = anonymous.login("alice", user_password).await.unwrap();
    let key = common::create_api_key(&anonymous.for_token(alice.token.clone()), "k").await;
    let http = reqwest::Client::new();
    for path in ["/v1/models", "/api/v1/models"] {
        let response = http
            .get(format!("{}{path}", server.base))
            .bearer_auth(&key)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{path}");
    }
    let response = http
        .post(format!("{}/v1/chat/completions", server.base))
        .bearer_auth(&key)
        .json(&json!({"model": "none", "messages": []}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 404);
    // A model provider's key, sent on: the provider here is this server's own gateway,
    // which refuses the key (401), so the key crosses the wire as a request header.
    let provider_key = "sk-provider-trace-secret-3f8a1c90";
    let admin_token = admin.token().unwrap();
    for (path, body) in [
        (
            "/api/v1/model-providers",
            json!({"name": "self", "base_url": format!("{}/v1", server.base), "api_key": provider_key}),
        ),
        (
            "/api/v1/model-routes",
            json!({"name": "via-self", "targets": [{"provider": "self", "model": "none"}]}),
        ),
    ] {
        let response = http
            .post(format!("{}{path}", server.base))
            .bearer_auth(&admin_token)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 201, "{path}");
    }
    let discovered = http
        .get(format!(
            "{}/api/v1/model-providers/self/models",
            server.base
        ))
        .bearer_auth(&admin_token)
        .send()
        .await
        .unwrap();
    assert_eq!(discovered.status(), 502);
    gantry_testkit::eventually(
        "the gateway to know the route",
        Duration::from_secs(10),
        Duration::from_millis(50),
        || async {
            http.get(format!("{}/v1/models", server.base))
                .bearer_auth(&key)
                .send()
                .await?
                .text()
                .await
        },
        |models: &String| models.contains("via-self"),
        String::new,
    )
    .await;
    let through_provider = http
        .post(format!("{}/v1/chat/completions", server.base))
        .bearer_auth(&key)
        .json(&json!({"model": "via-self", "messages": []}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        through_provider.status(),
        401,
        "the provider refused the key"
    );
    // A few heartbeats with the worker's credential.
    tokio::time::sleep(Duration::from_secs(1)).await;

    let mut secrets: Vec<(String, String)> = vec![
        ("the admin's password".into(), ADMIN_PASSWORD.into()),
        ("a user's password".into(), user_password.into()),
        ("a wrong password".into(), wrong_password.into()),
        ("a session token".into(), alice.token.clone()),
        ("the admin's session token".into(), admin.token().unwrap()),
        ("an API key".into(), key.clone()),
        ("a model provider's API key".into(), provider_key.into()),
        (
            "an API key's secret half".into(),
            key.rsplit('_').next().unwrap().to_string(),
        ),
        ("the registration token".into(), server.registration_token()),
        (
            "the JWT secret".into(),
            std::fs::read_to_string(server.dir.path().join("server/jwt_secret"))
                .unwrap()
                .trim()
                .to_string(),
        ),
    ];
    let identity: Value = serde_json::from_str(
        &std::fs::read_to_string(server.dir.path().join("w1/worker/worker_credential.json"))
            .unwrap(),
    )
    .unwrap();
    for (field, value) in identity.as_object().unwrap() {
        if let Some(text) = value.as_str().filter(|t| t.len() >= 16) {
            secrets.push((format!("the worker's {field}"), text.to_string()));
        }
    }
    assert!(
        secrets
            .iter()
            .any(|(what, _)| what == "the worker's credential"),
        "{identity}"
    );

    let logs = [
        ("server", server.server.log_text()),
        ("worker", worker.log_text()),
    ];
    assert!(
        logs.iter().all(|(_, text)| text.contains(" TRACE ")),
        "the processes log at trace level"
    );
    let mut leaks = Vec::new();
    for (process, text) in &logs {
        for line in text.lines() {
            for (what, secret) in &secrets {
                if line.contains(secret.as_str()) {
                    leaks.push(format!("{what} in the {process} log: {line}"));
                }
            }
        }
    }
    assert!(
        leaks.is_empty(),
        "{} leaks:\n{}",
        leaks.len(),
        leaks.join("\n")
    );
}
