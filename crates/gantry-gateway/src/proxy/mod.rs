//! One gateway request, read phase by phase as a proxy is (Pingora's `proxy_trait.rs`
//! is the model): each phase is a plain function over the request's state on the
//! stack.
//!
//! 1. **authenticate** (`auth.rs`): the caller behind the bearer token or session
//!    cookie, through the shared authenticator; a keep-alive connection's memo skips it
//!    for the same key while its grant holds.
//! 2. **admit, resolve, rewrite** (`admit.rs`): the body is a JSON object naming a
//!    model, the key may call it and is within its rate; the name resolves to a defined
//!    route (`model_routes.rs`), else to the deployed model (`routing/`); the body
//!    sent upstream asks for the stream's usage on the client's behalf, and a route
//!    target is sent its own model name.
//! 3. **tries** (`attempts.rs`): the least-loaded running instance (or the route
//!    target's provider) over a pooled keep-alive connection (`upstream.rs`); until the
//!    response head arrives a try is abandoned — and the request sent elsewhere, within
//!    [`MAX_TRIES`] — when the instance fails (connection refused or broken, 502/503),
//!    leaves routing, or exceeds `gateway_first_byte_timeout`. For a route, a try that
//!    fails before the first byte, or an answer of 429 or 5xx while another target is
//!    left, falls through to the next target (`RoutePlan::pick`). Every failure and
//!    every answer is recorded on the instance for passive ejection (`eject.rs`).
//! 4. **answer** ([`respond`]): the head with `x-gantry-instance` (the instance or
//!    provider that answered) and `x-gantry-target`, and the body streamed back as it
//!    comes (`body.rs`), its usage read on the way and its `model` the name the client
//!    asked for (`answer_name.rs`). Once the head has arrived the
//!    response is the client's: nothing interrupts it.
//!
//! Two HTTP layers call in: the front's own HTTP/1.1 ([`authenticate_then_proxy`]) and
//! hyper for a connection the front handed over ([`forward`]).

mod admit;
mod attempts;
mod auth;

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body as AxumBody;
use axum::extract::Request;
use axum::http::header::{self, HeaderMap, HeaderName, HeaderValue};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use tokio::time::Instant;

use self::admit::Admitted;
use self::attempts::{Reached, TryRequest};
use crate::body::{Answered, Completion, Inspector, ObservedBody};
use crate::error::OpenAiError;
use crate::h1::{self, ResponseHead};
use crate::metrics::{InFlight, ModelMetrics};
use crate::usage::Caller;
use crate::Gateway;

pub use self::auth::{authenticate, KeyMemo};

/// Most instances one request is sent to.
pub const MAX_TRIES: usize = 3;
/// Wait before sending again to an instance that already failed this request (only
/// when no other instance is left), times the number of tries so far.
pub const RETRY_BACKOFF: Duration = Duration::from_millis(50);
/// How long an instance that refused a connection is avoided.
pub const FAILING_COOLDOWN: Duration = Duration::from_secs(5);

/// Response header naming the instance that served the request (a provider's name for
/// a provider).
pub static INSTANCE_HEADER: HeaderName = HeaderName::from_static("x-gantry-instance");
/// Response header naming the target that answered: the model's name, or a route
/// target's `provider/model`.
pub static TARGET_HEADER: HeaderName = HeaderName::from_static("x-gantry-target");

/// The OpenAI endpoints the gateway forwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    ChatCompletions,
    Completions,
    Embeddings,
}

impl Endpoint {
    /// The endpoint served at `path` (a `POST`'s), if it is one of the three.
    pub fn at(path: &[u8]) -> Option<Self> {
        match path {
            b"/v1/chat/completions" => Some(Endpoint::ChatCompletions),
            b"/v1/completions" => Some(Endpoint::Completions),
            b"/v1/embeddings" => Some(Endpoint::Embeddings),
            _ => None,
        }
    }

    pub(crate) fn path(self) -> &'static str {
        match self {
            Endpoint::ChatCompletions => "/v1/chat/completions",
            Endpoint::Completions => "/v1/completions",
            Endpoint::Embeddings => "/v1/embeddings",
        }
    }

    pub(crate) fn streams(self) -> bool {
        !matches!(self, Endpoint::Embeddings)
    }
}

/// Whether a request header is passed to the backend (see
/// [`h1::is_withheld_request_header`]).
fn forwarded(name: &HeaderName) -> bool {
    !h1::is_withheld_request_header(name.as_str().as_bytes())
}

/// Whether an error's chain contains the body-size limit.
fn is_length_limit(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut current = Some(error);
    while let Some(e) = current {
        if e.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        current = e.source();
    }
    false
}

fn too_large(limit: usize) -> OpenAiError {
    OpenAiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "invalid_request_error",
        "request_too_large",
        format!("request body is larger than the gateway's limit of {limit} bytes (gateway_max_request_body)"),
    )
}

/// A finished request that never reached a backend: count it and answer.
fn reject(metrics: &ModelMetrics, started: Instant, error: OpenAiError) -> Answer {
    metrics.observe_request(error.status.as_u16(), started.elapsed());
    Answer::Error(error)
}

/// A response head's status as a status code (one outside 100–999 never parses).
fn status_code(response: &ResponseHead) -> StatusCode {
    StatusCode::from_u16(response.status).unwrap_or(StatusCode::BAD_GATEWAY)
}

/// Forwards one request of an OpenAI endpoint that hyper read (a connection the hot-route
/// front handed over: `front.rs`).
pub async fn forward(gateway: Gateway, endpoint: Endpoint, request: Request) -> Response {
    let started = Instant::now();
    let in_flight = gateway.metrics.start_request();
    let (parts, body) = request.into_parts();
    let unrouted = gateway.metrics.unrouted();

    let caller = match auth::authenticate(&gateway, &parts.headers).await {
        Ok(caller) => caller,
        Err(e) => return reject(unrouted, started, e).into_response(),
    };

    let limit = gateway.config.max_request_body;
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return reject(unrouted, started, too_large(limit)).into_response();
    }
    let body = match axum::body::to_bytes(body, limit).await {
        Ok(body) => body,
        Err(e) => {
            let error = if is_length_limit(&e) {
                too_large(limit)
            } else {
                OpenAiError::bad_request(
                    "invalid_request",
                    format!("could not read the request body: {e}"),
                )
            };
            return reject(unrouted, started, error).into_response();
        }
    };
    let mut headers = Vec::with_capacity(256);
    for (name, value) in &parts.headers {
        if forwarded(name) {
            h1::put_header(&mut headers, name.as_str().as_bytes(), value.as_bytes());
        }
    }
    let request = ClientRequest {
        endpoint,
        caller,
        query: parts.uri.query(),
        headers: &headers,
        body,
        started,
        in_flight,
    };
    proxy(&gateway, request).await.into_response()
}

/// A client's request as the proxy needs it, whichever HTTP layer read it.
#[derive(Debug)]
pub struct ClientRequest<'a> {
    pub endpoint: Endpoint,
    pub caller: Caller,
    /// The request target's query, passed on.
    pub query: Option<&'a str>,
    /// The headers passed on to the backend, as `name: value\r\n` lines (without the
    /// ones [`forwarded`] withholds).
    pub headers: &'a [u8],
    pub body: Bytes,
    pub started: Instant,
    pub in_flight: InFlight,
}

/// What the proxy answers a request with.
// The backend answer is the common case: boxing it would cost an allocation
// per request to shrink a value that is moved once.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Answer {
    /// Nothing reached a backend (or none could answer); already counted.
    Error(OpenAiError),
    Backend(BackendAnswer),
}

impl IntoResponse for Answer {
    fn into_response(self) -> Response {
        match self {
            Answer::Error(e) => e.into_response(),
            Answer::Backend(answer) => answer.into_response(),
        }
    }
}

/// A backend's answer on its way to the client.
#[derive(Debug)]
pub struct BackendAnswer {
    /// The backend's head; its hop-by-hop and framing headers are not passed on
    /// ([`BackendAnswer::headers`]).
    pub head: ResponseHead,
    pub body: ObservedBody,
}

impl BackendAnswer {
    pub fn status(&self) -> u16 {
        self.head.status
    }

    /// The backend's headers that go to the client.
    pub fn headers(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.head
            .head
            .iter()
            .filter(|(name, _)| !h1::is_hop_by_hop_response_header(name))
    }

    /// The answer as a response for hyper to write (it frames the body itself).
    pub fn into_response(self) -> Response {
        let mut headers = HeaderMap::with_capacity(self.head.head.headers.len() + 2);
        for (name, value) in self.headers() {
            if let (Ok(name), Ok(value)) =
                (HeaderName::from_bytes(name), HeaderValue::from_bytes(value))
            {
                headers.append(name, value);
            }
        }
        if let Some(completion) = self.body.completion() {
            headers.insert(
                INSTANCE_HEADER.clone(),
                completion.instance_header().clone(),
            );
            headers.insert(TARGET_HEADER.clone(), completion.target_header().clone());
        }
        let mut response = Response::new(AxumBody::new(self.body));
        *response.status_mut() = status_code(&self.head);
        *response.headers_mut() = headers;
        response
    }
}

/// Authenticates a request's token (`memo`: the connection's last key), then proxies
/// the request `make` builds for the caller (the front's path: `front.rs`); `started`
/// is when the request was read.
pub async fn authenticate_then_proxy<'a>(
    gateway: &Gateway,
    token: Option<&str>,
    memo: &mut KeyMemo,
    started: Instant,
    make: impl FnOnce(Caller) -> ClientRequest<'a>,
) -> Answer {
    match auth::authenticate_kept(gateway, token, memo, started).await {
        Ok(caller) => proxy(gateway, make(caller)).await,
        Err(e) => reject(gateway.metrics.unrouted(), started, e),
    }
}

/// Proxies one authenticated request with its body read: admit and resolve, try the
/// backends, answer.
pub async fn proxy(gateway: &Gateway, request: ClientRequest<'_>) -> Answer {
    let ClientRequest {
        endpoint,
        caller,
        query,
        headers,
        body,
        started,
        in_flight,
    } = request;
    let Admitted {
        selection,
        key_window,
        rewrite,
    } = match admit::admit(gateway, endpoint, &caller, body).await {
        Ok(admitted) => admitted,
        Err((metrics, error)) => {
            let metrics = metrics.unwrap_or_else(|| Arc::clone(gateway.metrics.unrouted()));
            return reject(&metrics, started, error);
        }
    };
    let metrics = selection.metrics(&gateway.metrics);
    let request = TryRequest {
        endpoint,
        query,
        headers,
        name: selection.name(),
        started,
    };
    let reached = attempts::try_backends(
        &gateway.config,
        &gateway.routes,
        &selection,
        request,
        &rewrite,
        metrics,
    )
    .await;
    match reached {
        Ok(reached) => respond(
            gateway,
            reached,
            selection,
            rewrite.inject_usage,
            Completed {
                caller,
                key_window,
                started,
                in_flight,
            },
        ),
        Err(error) => reject(metrics, started, error),
    }
}

/// What the answer's end records besides the backend: who called, and when.
struct Completed {
    caller: Caller,
    key_window: Option<Arc<crate::limits::KeyWindow>>,
    started: Instant,
    in_flight: InFlight,
}

/// The answer phase: the backend's head, and its body on the way to the client with
/// its usage read as it passes (the usage-only chunk the gateway asked for dropped).
fn respond(
    gateway: &Gateway,
    reached: Reached,
    selection: admit::Selection,
    inject_usage: bool,
    completed: Completed,
) -> Answer {
    let Reached {
        head,
        connection,
        guard,
        target,
    } = reached;
    let status = status_code(&head);
    let is_sse = head
        .head
        .get("content-type")
        .is_some_and(|v| v.starts_with(b"text/event-stream"));
    let answered = match selection {
        // Its name, counters and header are the route's own.
        admit::Selection::Model(route) => Answered::Model(route),
        admit::Selection::Route(plan) => Answered::Route { plan, target },
    };
    // The answer names what the client asked for, whatever the backend calls it.
    let public = Arc::clone(answered.model());
    let inspector = if !status.is_success() {
        Inspector::None
    } else if is_sse {
        Inspector::sse(inject_usage, Some(public))
    } else {
        Inspector::json_named(public)
    };
    let body = ObservedBody::new(
        connection,
        inspector,
        Completion {
            answered,
            usage: gateway.usage.clone(),
            caller: completed.caller,
            key_window: completed.key_window,
            status: status.as_u16(),
            started: completed.started,
            backend: guard,
            _in_flight: completed.in_flight,
        },
    );
    Answer::Backend(BackendAnswer { head, body })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_and_hop_by_hop_headers_are_not_forwarded() {
        for name in [
            "authorization",
            "cookie",
            "connection",
            "host",
            "content-length",
        ] {
            assert!(!forwarded(&HeaderName::from_static(name)), "{name}");
        }
        for name in ["content-type", "accept", "user-agent", "x-request-id"] {
            assert!(forwarded(&HeaderName::from_static(name)), "{name}");
        }
    }
}
