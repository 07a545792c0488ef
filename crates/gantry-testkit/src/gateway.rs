//! What the tests of the OpenAI-compatible gateway share, whether the gateway runs alone
//! (`crates/gantry-gateway/tests/gateway/`) or inside the server
//! (`crates/gantry-server/tests/server/gateway.rs`): a client of its wire
//! ([`GatewayClient`]), `/metrics` read as Prometheus text ([`metric`]), OpenAI's error
//! shape ([`assert_openai_error`]) and a stand-in backend that answers every request
//! alike ([`fixed_answer_backend`]).
//!
//! The gateway and `/metrics` are called with raw HTTP on purpose: they are the
//! OpenAI-compatible wire and Prometheus text, which no typed client of ours covers.

use std::future::Future;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Calls the gateway at `base` (`http://host:port`) with `http`.
#[derive(Clone, Copy)]
pub struct GatewayClient<'a> {
    pub http: &'a reqwest::Client,
    pub base: &'a str,
}

impl<'a> GatewayClient<'a> {
    pub fn new(http: &'a reqwest::Client, base: &'a str) -> Self {
        Self { http, base }
    }

    /// `/metrics`, which must answer 200.
    pub async fn metrics(&self) -> String {
        let response = self
            .http
            .get(format!("{}/metrics", self.base))
            .send()
            .await
            .expect("the gateway answers /metrics");
        assert_eq!(response.status(), StatusCode::OK);
        response.text().await.expect("read /metrics")
    }

    /// The metrics once `done` holds for them (within 5 s): for what the gateway does
    /// asynchronously, such as following the change feed or ending a request.
    pub async fn metrics_until(&self, what: &str, done: impl Fn(&str) -> bool) -> String {
        crate::eventually(
            &format!("the metrics to show that the gateway {what}"),
            Duration::from_secs(5),
            Duration::from_millis(25),
            || async { Ok::<_, std::convert::Infallible>(self.metrics().await) },
            |text: &String| done(text),
            String::new,
        )
        .await
    }

    /// Waits until the gateway routes to `count` instances of the model (the routing
    /// table follows the store's change feed asynchronously).
    pub async fn wait_routable(&self, model: &str, count: usize) {
        let want = format!("gantry_gateway_routable_instances{{model=\"{model}\"}} {count}");
        self.metrics_until(&format!("routes to {count} instances of {model}"), |text| {
            text.lines().any(|l| l == want)
        })
        .await;
    }

    /// POSTs to a gateway endpoint; returns status, `x-gantry-instance` and the JSON.
    pub async fn post(
        &self,
        path: &str,
        key: Option<&str>,
        body: Value,
    ) -> (StatusCode, Option<String>, Value) {
        let mut request = self.http.post(format!("{}{path}", self.base)).json(&body);
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        answer_of(request.send().await.expect("the gateway answers")).await
    }

    /// A short chat completion of `model` with `key`.
    pub async fn chat(&self, key: &str, model: &str) -> (StatusCode, Option<String>, Value) {
        self.post("/v1/chat/completions", Some(key), chat_request(model))
            .await
    }

    /// The console's session cookie is a credential (its playground sends it), beside
    /// other cookies; a wrong one is refused like a wrong key.
    pub async fn assert_session_cookie_is_a_credential(&self, session: &str) {
        for (cookie, expected) in [
            (
                format!("theme=dark; gantry_session={session}"),
                StatusCode::OK,
            ),
            ("gantry_session=nope".to_owned(), StatusCode::UNAUTHORIZED),
        ] {
            let response = self
                .http
                .get(format!("{}/v1/models", self.base))
                .header(reqwest::header::COOKIE, cookie)
                .send()
                .await
                .expect("the gateway answers");
            assert_eq!(response.status(), expected);
        }
    }

    /// A deleted API key stops working at once. `key` works on `/v1/models`, and on the
    /// hot routes, where a keep-alive connection keeps its last key for its next
    /// requests (a chat with `idle_model`, which has no running instance, gets as far as
    /// the model: 503, three times). Then `delete` deletes the key: the gateway, which
    /// remembers accepted keys for a moment, forgets it on the change and refuses it
    /// within a second; the connection that kept it is refused at once, as the deletion
    /// ended its grant.
    pub async fn assert_deleted_key_refused(
        &self,
        key: &str,
        idle_model: &str,
        delete: impl Future<Output = ()>,
    ) {
        let models = || {
            let request = self
                .http
                .get(format!("{}/v1/models", self.base))
                .bearer_auth(key);
            async move { request.send().await.expect("the gateway answers").status() }
        };
        let chat = || {
            let request = self
                .http
                .post(format!("{}/v1/chat/completions", self.base))
                .bearer_auth(key)
                .json(&json!({"model": idle_model, "messages": []}));
            async move { request.send().await.expect("the gateway answers").status() }
        };
        assert_eq!(models().await, StatusCode::OK);
        for _ in 0..3 {
            assert_eq!(chat().await, StatusCode::SERVICE_UNAVAILABLE);
        }
        delete.await;
        crate::eventually(
            "the gateway to refuse the deleted key",
            Duration::from_secs(1),
            Duration::from_millis(20),
            || async { Ok::<_, std::convert::Infallible>(models().await) },
            |status| *status == StatusCode::UNAUTHORIZED,
            String::new,
        )
        .await;
        assert_eq!(chat().await, StatusCode::UNAUTHORIZED);
    }
}

/// The body of a short chat completion of `model`.
pub fn chat_request(model: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "hello world"}], "max_tokens": 4})
}

/// Status, `x-gantry-instance` and the JSON (or the text, as a JSON string) of an answer.
pub async fn answer_of(response: reqwest::Response) -> (StatusCode, Option<String>, Value) {
    let status = response.status();
    let instance = response
        .headers()
        .get("x-gantry-instance")
        .map(|v| v.to_str().expect("x-gantry-instance is text").to_string());
    let text = response.text().await.expect("read the answer");
    let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, instance, value)
}

/// The sample value of a metric line, 0 when absent.
pub fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

/// Asserts the OpenAI error shape and returns the error object.
pub fn assert_openai_error(
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

/// The cluster's counts in `/metrics` are the store's: one instance running, on one ready
/// worker; and the scheduler queue's gauge is there.
pub fn assert_one_instance_running_on_one_ready_worker(text: &str) {
    assert_eq!(
        metric(text, "gantry_instances{state=\"running\"}"),
        1.0,
        "{text}"
    );
    assert_eq!(
        metric(text, "gantry_workers{state=\"ready\"}"),
        1.0,
        "{text}"
    );
    assert!(
        text.contains("# TYPE gantry_scheduler_queue_length gauge"),
        "{text}"
    );
}

/// The scheduler queue in `/metrics` is the pending and analyzing instances.
pub fn assert_scheduler_queue_is_the_waiting_instances(text: &str) {
    assert_eq!(
        metric(text, "gantry_scheduler_queue_length"),
        metric(text, "gantry_instances{state=\"pending\"}")
            + metric(text, "gantry_instances{state=\"analyzing\"}"),
        "{text}"
    );
}

/// A stand-in backend (a test double, not a model server) on a loopback port that
/// answers every request with `answer`, a whole raw HTTP/1.1 response; returns its
/// `host:port`.
pub async fn fixed_answer_backend(answer: String) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let address = listener
        .local_addr()
        .expect("a bound listener has an address")
        .to_string();
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            let answer = answer.clone();
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
