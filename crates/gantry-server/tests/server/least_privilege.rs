//! Least privilege, walked over the whole OpenAPI spec of a running server: every
//! operation the spec marks as needing credentials answers 401 without them, and 403 to a
//! worker's credential unless it is one of the worker agent's own operations; every
//! admin-only operation (of an admin tag, or listed in [`ADMIN_OPERATIONS`]) and every
//! worker agent's operation answers 403 to a user's session, and to the administrator of
//! another cluster unless [`CLUSTER_ADMIN_OPERATIONS`] lets them; and a user sees and
//! deletes only their own API keys.
//!
//! Path parameters are `1` (the default cluster, and a worker, model and instance of it),
//! bodies `{}` (or the smallest valid one, where the object is looked at after the body):
//! the point is that the credential is refused before anything else is looked at.

use std::time::Duration;

use crate::common::{simulated_worker, user, TestServer};
use gantry_testkit::{test_both_engines, TestEngine};
use gantry_types::{ApiKeyCreate, ApiKeyQuery};
use reqwest::{Method, StatusCode};
use serde_json::Value;

/// The tags whose every operation is for admins (their descriptions say "(admin)").
const ADMIN_TAGS: &[&str] = &["users", "workers", "coordinator", "model-files"];

/// Admin-only operations in tags that users also use (`{id}` written as `1`).
const ADMIN_OPERATIONS: &[(&str, &str)] = &[
    ("POST", "/api/v1/models"),
    ("POST", "/api/v1/models/estimate"),
    ("PATCH", "/api/v1/models/1"),
    ("DELETE", "/api/v1/models/1"),
    ("PATCH", "/api/v1/model-instances/1"),
    ("DELETE", "/api/v1/model-instances/1"),
    ("POST", "/api/v1/model-instances/1/restart"),
    ("POST", "/api/v1/clusters"),
    ("GET", "/api/v1/clusters/1"),
    ("PATCH", "/api/v1/clusters/1"),
    ("DELETE", "/api/v1/clusters/1"),
    ("GET", "/api/v1/clusters/1/registration-token"),
    ("POST", "/api/v1/clusters/1/registration-token"),
    ("GET", "/api/v1/clusters/1/worker-pools"),
    ("POST", "/api/v1/clusters/1/worker-pools"),
    ("GET", "/api/v1/clusters/1/worker-pools/1"),
    ("PATCH", "/api/v1/clusters/1/worker-pools/1"),
    ("DELETE", "/api/v1/clusters/1/worker-pools/1"),
    ("GET", "/api/v1/clusters/1/worker-pools/1/events"),
    ("POST", "/api/v1/inference-backends"),
    ("PATCH", "/api/v1/inference-backends/1"),
    ("DELETE", "/api/v1/inference-backends/1"),
];

/// Admin operations the administrator of a cluster may call too, for their own cluster:
/// with another cluster's objects they are refused all the same, but these answer (a
/// list of their cluster's workers, a body checked before the cluster it names).
const CLUSTER_ADMIN_OPERATIONS: &[(&str, &str)] = &[
    ("GET", "/api/v1/workers"),
    ("POST", "/api/v1/models"),
    ("POST", "/api/v1/models/estimate"),
];

struct Operation {
    method: Method,
    path: String,
    tags: Vec<String>,
    secured: bool,
}

fn operations(spec: &Value) -> Vec<Operation> {
    let mut found = Vec::new();
    for (path, item) in spec["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            let Ok(method) = method.to_uppercase().parse::<Method>() else {
                continue;
            };
            // Path parameters: `{id}` → 1, `{*rest}`-style → x.
            let mut concrete = String::new();
            let mut in_param = false;
            for c in path.chars() {
                match (c, in_param) {
                    ('{', _) => in_param = true,
                    ('}', _) => {
                        in_param = false;
                        concrete.push('1');
                    }
                    (_, true) => {}
                    (c, false) => concrete.push(c),
                }
            }
            found.push(Operation {
                method,
                path: concrete,
                tags: operation["tags"]
                    .as_array()
                    .map(|t| {
                        t.iter()
                            .filter_map(|t| t.as_str().map(str::to_owned))
                            .collect()
                    })
                    .unwrap_or_default(),
                secured: operation["security"]
                    .as_array()
                    .is_some_and(|s| !s.is_empty()),
            });
        }
    }
    found
}

async fn status_of(
    http: &reqwest::Client,
    base: &str,
    operation: &Operation,
    token: Option<&str>,
) -> StatusCode {
    let mut request = http
        .request(
            operation.method.clone(),
            format!("{base}{}", operation.path),
        )
        .timeout(Duration::from_secs(10));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if matches!(operation.method, Method::POST | Method::PUT | Method::PATCH) {
        let body = if operation.path.ends_with("/labels") {
            r#"{"labels": {}}"#
        } else if operation.path.starts_with("/api/v1/model-instances/") {
            r#"{"worker_id": null}"#
        } else {
            "{}"
        };
        request = request
            .header("content-type", "application/json")
            .body(body);
    }
    request.send().await.unwrap().status()
}

async fn every_secured_operation_refuses_the_wrong_credentials(engine: TestEngine) {
    let server = TestServer::start(engine).await;
    let http = reqwest::Client::new();
    let spec: Value =
        gantry_testkit::answer_json(http.get(format!("{}/api/openapi.json", server.base))).await;
    let operations = operations(&spec);
    assert!(operations.len() > 40, "{} operations", operations.len());
    for (method, path) in ADMIN_OPERATIONS {
        assert!(
            operations
                .iter()
                .any(|o| o.method.as_str() == *method && o.path == *path),
            "{method} {path} is listed as admin-only but is not in the spec"
        );
    }

    let (_, worker) = server.register(&simulated_worker("w1", 1)).await;
    let worker_token = worker.token().unwrap();
    server
        .client()
        .create_user(&user("alice", "alice-password-1"))
        .await
        .unwrap();
    let user_token = gantry_client::Client::new(&server.base)
        .login("alice", "alice-password-1")
        .await
        .unwrap()
        .token;
    // Carol administers another cluster than the default one, where worker, model and
    // instance 1 are.
    let east = server
        .client()
        .create_cluster(&gantry_types::ClusterCreate {
            name: "east".into(),
            description: String::new(),
            provider: gantry_types::ClusterProvider::Custom,
        })
        .await
        .unwrap();
    let mut carol = user("carol", "carol-password-1");
    carol.cluster_admin_of = vec![east.id];
    server.client().create_user(&carol).await.unwrap();
    let cluster_admin_token = gantry_client::Client::new(&server.base)
        .login("carol", "carol-password-1")
        .await
        .unwrap()
        .token;
    let model = server
        .client()
        .create_model(&crate::common::tiny_model("in-default", 1))
        .await
        .unwrap();
    server.instances_of(model.id, 1).await;

    let mut wrong = Vec::new();
    let mut secured = 0;
    for operation in &operations {
        if !operation.secured {
            continue;
        }
        secured += 1;
        let what = format!("{} {}", operation.method, operation.path);
        let anonymous = status_of(&http, &server.base, operation, None).await;
        if anonymous != StatusCode::UNAUTHORIZED {
            wrong.push(format!("{what} without credentials: {anonymous}, not 401"));
        }
        if !operation.tags.iter().any(|t| t == "worker-agent") {
            let as_worker = status_of(&http, &server.base, operation, Some(&worker_token)).await;
            if as_worker != StatusCode::FORBIDDEN {
                wrong.push(format!(
                    "{what} with a worker credential: {as_worker}, not 403"
                ));
            }
        }
        let for_workers = operation.tags.iter().any(|t| t == "worker-agent")
            && operation.path != "/api/v1/workers/register";
        let for_admins = operation
            .tags
            .iter()
            .any(|t| ADMIN_TAGS.contains(&t.as_str()))
            || ADMIN_OPERATIONS.contains(&(operation.method.as_str(), operation.path.as_str()));
        if for_admins || for_workers {
            let as_user = status_of(&http, &server.base, operation, Some(&user_token)).await;
            if as_user != StatusCode::FORBIDDEN {
                wrong.push(format!("{what} as a user: {as_user}, not 403"));
            }
            let may = CLUSTER_ADMIN_OPERATIONS
                .contains(&(operation.method.as_str(), operation.path.as_str()));
            let as_cluster_admin =
                status_of(&http, &server.base, operation, Some(&cluster_admin_token)).await;
            if may == (as_cluster_admin == StatusCode::FORBIDDEN) {
                wrong.push(format!(
                    "{what} as another cluster's administrator: {as_cluster_admin}, {}",
                    if may { "refused" } else { "not 403" }
                ));
            }
        }
    }
    assert!(secured > 30, "{secured} secured operations");
    assert!(
        wrong.is_empty(),
        "{} wrong answers:\n{}",
        wrong.len(),
        wrong.join("\n")
    );

    // A user sees and deletes only their own API keys.
    let admin_key = server
        .client()
        .create_api_key(&api_key("admins"))
        .await
        .unwrap();
    let alice = server.client_for(&user_token);
    let own = alice.create_api_key(&api_key("alices")).await.unwrap();
    let listed = alice.list_api_keys(&ApiKeyQuery::default()).await.unwrap();
    assert_eq!(
        listed.items.iter().map(|k| k.id).collect::<Vec<_>>(),
        vec![own.api_key.id],
        "a user lists only their own keys"
    );
    let refused = alice
        .delete_api_key(admin_key.api_key.id)
        .await
        .unwrap_err();
    assert!(
        matches!(refused.status(), Some(403 | 404)),
        "deleting another user's key: {refused}"
    );
    let still = server.client_for(&admin_key.key);
    still.list_api_keys(&ApiKeyQuery::default()).await.unwrap();
    alice.delete_api_key(own.api_key.id).await.unwrap();
    server.shutdown().await;
}

test_both_engines!(every_secured_operation_refuses_the_wrong_credentials);

fn api_key(name: &str) -> ApiKeyCreate {
    ApiKeyCreate {
        name: name.into(),
        description: String::new(),
        expires_in_days: None,
        ..Default::default()
    }
}
