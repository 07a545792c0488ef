//! Every way a gateway request can fail answers in OpenAI's error shape, with the status
//! and code a client branches on: refused credentials, bad bodies, unknown models,
//! models without a running instance, backends nobody listens at, unknown paths and
//! methods; and a deleted API key stops working at once.

use reqwest::StatusCode;
use serde_json::{json, Value};

use gantry_testkit::gateway::assert_scheduler_queue_is_the_waiting_instances;

use crate::common::{assert_openai_error, free_port, metric, TestGateway};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_errors_have_the_openai_shape() {
    let gateway = TestGateway::start().await;
    let chat = json!({"model": "tiny", "messages": [{"role": "user", "content": "x"}]});

    // No key, a wrong key, a worker credential.
    for key in [None, Some("gantry_nope_nope")] {
        let (status, _, body) = gateway
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
    let worker = gateway.worker_credential().await;
    let (status, _, body) = gateway
        .post("/v1/chat/completions", Some(&worker), chat.clone())
        .await;
    assert_openai_error(status, &body, 403, "permission_error", "forbidden");
    // The console's session cookie is a credential too (its playground sends it); a
    // wrong one is refused like a wrong key.
    gateway
        .client()
        .assert_session_cookie_is_a_credential(&gateway.session)
        .await;
    let response = gateway
        .http
        .get(format!("{}/v1/models", gateway.base))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);

    // Bad bodies.
    let (status, _, body) = gateway
        .post(
            "/v1/chat/completions",
            Some(&gateway.key),
            json!({"messages": []}),
        )
        .await;
    let error = assert_openai_error(status, &body, 400, "invalid_request_error", "missing_model");
    assert_eq!(error["param"], "model");
    let (status, body) = gateway
        .post_bytes("/v1/chat/completions", &gateway.key, b"{nope")
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
        let (status, _, body) = gateway
            .post(
                path,
                Some(&gateway.key),
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
    gateway.deploy("idle", &[]).await;
    let (status, _, body) = gateway
        .post(
            "/v1/chat/completions",
            Some(&gateway.key),
            json!({"model": "idle", "messages": []}),
        )
        .await;
    assert_openai_error(status, &body, 503, "server_error", "model_not_ready");

    // A running instance nobody listens at: every try fails, 502.
    let dead = format!("127.0.0.1:{}", free_port());
    gateway.deploy("dead", &[dead]).await;
    let (status, instance, body) = gateway
        .post(
            "/v1/chat/completions",
            Some(&gateway.key),
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
    let response = gateway
        .http
        .get(format!("{}/v1/models", gateway.base))
        .bearer_auth(&gateway.key)
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
    // for a moment, and forgets them on the change), also on a kept connection.
    let (second_id, second_key) = gateway.create_key(gateway.admin_id, "short-lived").await;
    gateway
        .client()
        .assert_deleted_key_refused(&second_key, "idle", async {
            gateway.db.delete_api_key(second_id).await.unwrap();
        })
        .await;

    // Unknown gateway paths and wrong methods keep the shape too.
    let (status, _, body) = gateway
        .post("/v1/nothing-here", Some(&gateway.key), json!({}))
        .await;
    assert_openai_error(status, &body, 404, "invalid_request_error", "unknown_url");
    let response = gateway
        .http
        .get(format!("{}/v1/chat/completions", gateway.base))
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

    let text = gateway.metrics().await;
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
    assert_scheduler_queue_is_the_waiting_instances(&text);
    gateway.shutdown().await;
}
