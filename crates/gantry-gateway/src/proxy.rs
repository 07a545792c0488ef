//! One gateway request: authenticate, read the body once, check the key's limits
//! (`limits.rs`), resolve the name — a defined route (`model_routes.rs`), else the
//! deployed model of that name (`routing.rs`) — forward to the least-loaded running
//! instance (or the route target's provider) over a pooled keep-alive connection
//! (`upstream.rs`), retry elsewhere when a backend cannot answer, and stream the answer
//! back. `x-gantry-instance` names the instance (or provider) that answered,
//! `x-gantry-target` the target.
//!
//! For a route, a try that fails before the first byte — and an answer of 429 or 5xx
//! while another target is left — falls through to the next target (`RoutePlan::pick`:
//! the same priority's others by weight, then the next priority). A route target is
//! sent its own model name in the body.
//!
//! Until the response head arrives, a try is abandoned — and the request sent to
//! another instance, within [`MAX_TRIES`] — when the instance fails (connection
//! refused or broken, 502/503), when the routing table drops the instance (its worker
//! reported it `unhealthy`, it stopped, it was deleted), or when
//! `gateway_first_byte_timeout` runs out. Every failure and every answer is recorded
//! on the instance for passive ejection (`eject.rs`). Once the head has arrived the
//! response is the client's: nothing interrupts it.

use std::borrow::Cow;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body as AxumBody;
use axum::extract::Request;
use axum::http::header::{self, HeaderMap, HeaderName, HeaderValue};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use bytes::{Bytes, BytesMut};
use gantry_auth::cache::Grant;
use gantry_auth::Principal;
use gantry_store::{InstanceFilter, Page, StoreError};
use gantry_types::{units, InstanceState};
use serde::Deserialize;
use tokio::time::Instant;

use crate::body::{Answered, Completion, Inspector, ObservedBody};
use crate::eject::EjectionPolicy;
use crate::error::OpenAiError;
use crate::h1::{self, ResponseHead};
use crate::metrics::{ErrorKind, InFlight, Metrics, ModelMetrics};
use crate::model_routes::{RoutePlan, TargetMask};
use crate::routing::{Backend, InFlightGuard, ModelRoute};
use crate::upstream::{ConnectError, Outgoing, RequestError, UpstreamConnection};
use crate::usage::Caller;
use crate::Gateway;

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

    fn path(self) -> &'static str {
        match self {
            Endpoint::ChatCompletions => "/v1/chat/completions",
            Endpoint::Completions => "/v1/completions",
            Endpoint::Embeddings => "/v1/embeddings",
        }
    }

    fn streams(self) -> bool {
        !matches!(self, Endpoint::Embeddings)
    }
}

/// The few request fields the gateway needs; everything else passes through unread.
#[derive(Debug, Deserialize)]
struct RequestPeek<'a> {
    #[serde(default, borrow, deserialize_with = "borrowed_str")]
    model: Option<Cow<'a, str>>,
    #[serde(default)]
    stream: Option<bool>,
    /// Outer `None`: the key is absent; `Some(None)`: it is `null`.
    #[serde(default, deserialize_with = "present")]
    stream_options: Option<Option<StreamOptionsPeek>>,
}

#[derive(Debug, Deserialize)]
struct StreamOptionsPeek {
    #[serde(default)]
    include_usage: Option<bool>,
}

/// A string borrowed from the body when it has no escapes (serde's own `Cow`
/// deserialisation copies it whenever it sits in an `Option`): no allocation per request,
/// and the name's position in the body is known. `null` is `None`.
fn borrowed_str<'de, D>(deserializer: D) -> Result<Option<Cow<'de, str>>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    struct Text;
    impl<'de> serde::de::Visitor<'de> for Text {
        type Value = Option<Cow<'de, str>>;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a string")
        }

        fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
            Ok(Some(Cow::Borrowed(v)))
        }

        fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
            Ok(Some(Cow::Owned(v.to_owned())))
        }

        fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
            Ok(Some(Cow::Owned(v)))
        }

        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
    }
    deserializer.deserialize_any(Text)
}

fn present<'de, D, T>(deserializer: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(deserializer).map(Some)
}

/// The bearer token of a request.
/// The request's bearer token, else its session cookie (the web console's playground calls
/// the gateway with the session it signed in with; the cookie is `SameSite=Lax`, so no
/// other site's page can send it with a POST).
fn bearer(headers: &HeaderMap) -> Option<&str> {
    if let Some(value) = headers.get(header::AUTHORIZATION) {
        return gantry_types::auth::bearer_token(value.to_str().ok()?);
    }
    gantry_types::auth::session_cookie(
        headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|value| value.to_str().ok()),
    )
}

/// The caller behind a request's bearer token: a person (API key or session), resolved
/// by the shared authenticator (API keys from its cache).
pub async fn authenticate(gateway: &Gateway, headers: &HeaderMap) -> Result<Caller, OpenAiError> {
    authenticate_token(gateway, bearer(headers)).await
}

/// The caller behind a bearer token (or session cookie token) already taken from the
/// request.
pub async fn authenticate_token(
    gateway: &Gateway,
    token: Option<&str>,
) -> Result<Caller, OpenAiError> {
    let token = token.ok_or_else(OpenAiError::missing_api_key)?;
    caller_of(gateway.authenticator.authenticate(token).await?)
}

/// The caller a principal may call the gateway as.
fn caller_of(principal: Principal) -> Result<Caller, OpenAiError> {
    match principal {
        Principal::User {
            user,
            api_key_id: Some(api_key_id),
        } => Ok(Caller {
            user_id: user.id,
            api_key_id: Some(api_key_id),
        }),
        Principal::User {
            user,
            api_key_id: None,
        } => {
            if user.require_password_change {
                return Err(OpenAiError::new(
                    StatusCode::FORBIDDEN,
                    "permission_error",
                    "password_change_required",
                    "change your password first: POST /auth/change-password",
                ));
            }
            Ok(Caller {
                user_id: user.id,
                api_key_id: None,
            })
        }
        Principal::Worker { .. } | Principal::Server { .. } => Err(OpenAiError::new(
            StatusCode::FORBIDDEN,
            "permission_error",
            "forbidden",
            "worker and server credentials cannot call the gateway; use an API key",
        )),
    }
}

/// The caller of a connection's last API key, kept for its next requests with the same
/// key while the authenticator's [`Grant`] holds: a keep-alive connection's requests
/// then skip the key's digest, the cache's lock and its lookup.
#[derive(Debug, Default)]
pub struct KeyMemo {
    token: Vec<u8>,
    held: Option<(Caller, Grant)>,
}

impl KeyMemo {
    /// The caller of `token` if it is the kept key and its grant still holds.
    fn caller(&self, gateway: &Gateway, token: &str, now: Instant) -> Option<Caller> {
        let (caller, grant) = self.held.as_ref()?;
        (same_secret(&self.token, token.as_bytes())
            && gateway.authenticator.grant_holds(grant, now))
        .then(|| caller.clone())
    }

    fn keep(&mut self, token: &str, caller: &Caller, grant: Option<Grant>) {
        match grant {
            Some(grant) => {
                self.token.clear();
                self.token.extend_from_slice(token.as_bytes());
                self.held = Some((caller.clone(), grant));
            }
            None => self.held = None,
        }
    }
}

/// Whether two secrets are equal, in a time that does not depend on where they
/// differ (one connection may carry several clients' requests, through a proxy).
///
/// Every byte pair is folded into one difference with no branch on it, and the fold is
/// hidden from the optimiser only once at the end (`black_box`), not per byte as
/// `subtle` does: its per-byte barriers were 0.22 % of the gateway's CPU samples under
/// the gateway bench (about 45 ns of every keep-alive request). A length difference is
/// not secret (keys have one format).
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let difference = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(difference) == 0
}

/// The caller behind a token, from `memo` when it holds the token's grant; else asked
/// of the authenticator, and the grant kept.
async fn authenticate_kept(
    gateway: &Gateway,
    token: Option<&str>,
    memo: &mut KeyMemo,
    now: Instant,
) -> Result<Caller, OpenAiError> {
    let token = token.ok_or_else(OpenAiError::missing_api_key)?;
    if let Some(caller) = memo.caller(gateway, token, now) {
        return Ok(caller);
    }
    let (principal, grant) = gateway.authenticator.authenticate_granted(token).await?;
    let caller = caller_of(principal)?;
    memo.keep(token, &caller, grant);
    Ok(caller)
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

/// The request body with `stream_options.include_usage` set to true.
fn with_include_usage(body: &Bytes, key_present: bool) -> Result<Bytes, OpenAiError> {
    if !key_present {
        // Splice the key in after the opening brace: no re-serialisation of a body
        // that may be large. The body is known to be an object with a `model` key,
        // so a comma always follows.
        let open = body
            .iter()
            .position(|b| *b == b'{')
            .ok_or_else(not_an_object)?;
        const KEY: &[u8] = br#""stream_options":{"include_usage":true},"#;
        let mut out = BytesMut::with_capacity(body.len() + KEY.len());
        out.extend_from_slice(&body[..=open]);
        out.extend_from_slice(KEY);
        out.extend_from_slice(&body[open + 1..]);
        return Ok(out.freeze());
    }
    let mut object: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(body).map_err(|_| not_an_object())?;
    match object.get_mut("stream_options") {
        Some(serde_json::Value::Object(options)) => {
            options.insert("include_usage".into(), serde_json::Value::Bool(true));
        }
        _ => {
            object.insert(
                "stream_options".into(),
                serde_json::json!({"include_usage": true}),
            );
        }
    }
    serde_json::to_vec(&object)
        .map(Bytes::from)
        .map_err(|e| OpenAiError::internal(format!("re-encode the request body: {e}")))
}

fn not_an_object() -> OpenAiError {
    OpenAiError::bad_request("invalid_request", "the request body must be a JSON object")
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

    let caller = match authenticate(&gateway, &parts.headers).await {
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
    match authenticate_kept(gateway, token, memo, started).await {
        Ok(caller) => proxy(gateway, make(caller)).await,
        Err(e) => reject(gateway.metrics.unrouted(), started, e),
    }
}

/// Proxies one authenticated request with its body read.
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
    let unrouted = gateway.metrics.unrouted();

    let peek: RequestPeek<'_> = match serde_json::from_slice(&body) {
        Ok(peek) if body.trim_ascii_start().starts_with(b"{") => peek,
        Ok(_) => return reject(unrouted, started, not_an_object()),
        Err(e) => {
            return reject(
                unrouted,
                started,
                OpenAiError::bad_request(
                    "invalid_request",
                    format!("the request body is not a JSON object with a string `model` (and an optional boolean `stream` and object `stream_options`): {e}"),
                ),
            )
        }
    };
    let Some(model) = peek.model.as_deref().filter(|m| !m.is_empty()) else {
        return reject(
            unrouted,
            started,
            OpenAiError::bad_request(
                "missing_model",
                "the request body has no `model`; GET /v1/models lists the models being served",
            )
            .with_param("model"),
        );
    };

    // The key's limits: the routes it may call, its requests per minute (its tokens
    // are counted in when the request ends).
    let key_window = match gateway.limiter.admit(caller.api_key_id, model) {
        Ok(window) => window,
        Err(e) => return reject(unrouted, started, e),
    };

    // A defined route by that name, else the deployed model of that name.
    let selection = match gateway.model_routes.get(model) {
        Some(plan) => Selection::Route(plan),
        None => match gateway.routes.get(model) {
            Some(route) => Selection::Model(route),
            None => match route_after_miss(gateway, model).await {
                Ok(route) => Selection::Model(route),
                Err((metrics, error)) => {
                    let metrics = metrics.unwrap_or_else(|| Arc::clone(unrouted));
                    return reject(&metrics, started, error);
                }
            },
        },
    };
    let name = selection.name();
    let metrics = selection.metrics(&gateway.metrics);
    // A model's route as the table has it now, when a retry looked again.
    let mut latest: Option<Arc<ModelRoute>> = None;

    // Streams report usage only when asked; ask on the client's behalf and remove the
    // extra chunk from what it receives.
    let inject_usage = endpoint.streams()
        && peek.stream == Some(true)
        && !matches!(
            peek.stream_options,
            Some(Some(StreamOptionsPeek {
                include_usage: Some(true)
            }))
        );
    let key_present = peek.stream_options.is_some();
    let upstream_body = if inject_usage {
        match with_include_usage(&body, key_present) {
            Ok(rewritten) => rewritten,
            Err(e) => return reject(metrics, started, e),
        }
    } else {
        body.clone()
    };
    // Where the `model` string's characters are in the body, when it has no escapes
    // (serde borrowed it): a route's target gets its own name spliced in there.
    let model_span = match &peek.model {
        Some(Cow::Borrowed(m)) => {
            let start = (m.as_ptr() as usize).wrapping_sub(body.as_ptr() as usize);
            (start
                .checked_add(m.len())
                .is_some_and(|end| end <= body.len()))
            .then(|| start..start + m.len())
        }
        _ => None,
    };
    drop(peek);

    let policy = &gateway.config.ejection;
    // Instances tried (a provider counts as minus its id), and for routes the targets
    // tried (bit i: target i): a provider target is tried once per request, a local one
    // while it has untried instances.
    let mut tried = [0i64; MAX_TRIES];
    let mut tried_count = 0;
    let mut tried_targets: TargetMask = 0;
    let mut failures: Vec<String> = Vec::new();
    // After a try ran out of the first-byte timeout, the request goes only to
    // instances it has not tried: the same one would most likely keep it waiting again.
    let mut timed_out = false;
    let mut last_failure = LastFailure::None;
    for attempt in 0..MAX_TRIES {
        let (backend, target_index) = match &selection {
            Selection::Model(route) => {
                if attempt > 0 {
                    // Instances may have left routing since the last try (that may be
                    // why it ended): pick from the table as it is now.
                    match gateway.routes.get(&route.name) {
                        Some(current) => latest = Some(current),
                        None => {
                            last_failure = LastFailure::NoRouteLeft;
                            break;
                        }
                    }
                }
                let route = latest.as_ref().unwrap_or(route);
                let picked = if timed_out {
                    route.pick_untried(&tried[..tried_count])
                } else {
                    route.pick(&tried[..tried_count])
                };
                let Some(backend) = picked else {
                    break;
                };
                if tried[..tried_count].contains(&backend.instance_id) {
                    // Only instances that already failed are left: give them a moment.
                    tokio::time::sleep(RETRY_BACKOFF * attempt as u32).await;
                } else {
                    tried[tried_count] = backend.instance_id;
                    tried_count += 1;
                }
                (backend, None)
            }
            Selection::Route(plan) => {
                let Some((index, backend)) =
                    plan.pick(&gateway.routes, &tried[..tried_count], tried_targets)
                else {
                    if attempt == 0 {
                        last_failure = LastFailure::NoTarget;
                    }
                    break;
                };
                if backend.provider.is_some() {
                    tried_targets |= 1 << index;
                } else {
                    tried[tried_count] = backend.instance_id;
                    tried_count += 1;
                }
                (backend, Some(index))
            }
        };
        let target = match (&selection, target_index) {
            (Selection::Route(plan), Some(index)) => Some(&plan.targets[index]),
            _ => None,
        };
        let guard = InFlightGuard::start(backend);
        let backend = guard.backend();
        // What differs for this try: a provider's path, credentials and timeout; the
        // `model` a route's target is sent.
        let rewritten;
        let try_body = match target {
            Some(target) if target.upstream_model() != name => {
                let with_usage = |renamed: Bytes| {
                    if inject_usage {
                        with_include_usage(&renamed, key_present)
                    } else {
                        Ok(renamed)
                    }
                };
                rewritten = match with_model(&body, model_span.clone(), target.upstream_model())
                    .and_then(with_usage)
                {
                    Ok(body) => body,
                    Err(e) => return reject(metrics, started, e),
                };
                &rewritten
            }
            _ => &upstream_body,
        };
        let provider_path;
        let provider_headers;
        let (path, try_headers, first_byte_timeout) = match &backend.provider {
            None => (endpoint.path(), headers, gateway.config.first_byte_timeout),
            Some(provider) => {
                provider_path = provider.path_for(endpoint.path());
                provider_headers = provider.with_headers(headers);
                (
                    provider_path.as_str(),
                    provider_headers.as_slice(),
                    Some(provider.timeout),
                )
            }
        };
        let outgoing = Outgoing {
            method: "POST",
            path,
            query,
            host: backend.host_header.as_bytes(),
            headers: try_headers,
            body: try_body,
        };
        last_failure = LastFailure::Other;
        let fell_through = |failures: &mut Vec<String>, reason: String| {
            if let Some(target) = target {
                target.metrics.fell_through.fetch_add(1, Ordering::Relaxed);
            }
            failures.push(reason);
        };
        // The request's first try reads no clock of its own: it began a moment ago.
        let now = if attempt == 0 {
            started
        } else {
            Instant::now()
        };
        match send_until_head(backend, outgoing, first_byte_timeout, now).await {
            Ok((response, _))
                if selection.falls_through(status_code(&response))
                    && another_target_left(
                        &selection,
                        gateway,
                        attempt,
                        &tried[..tried_count],
                        tried_targets,
                    ) =>
            {
                record_failure(backend, policy);
                metrics.count_error(ErrorKind::UpstreamUnavailable);
                tracing::warn!(route = %name, instance = %backend.instance_name, status = response.status, attempt, "backend cannot serve; trying another");
                fell_through(
                    &mut failures,
                    format!(
                        "{} answered {}",
                        backend.instance_name,
                        status_code(&response)
                    ),
                );
            }
            Ok((response, connection)) => {
                backend.mark_healthy();
                let status = status_code(&response);
                if status.is_server_error()
                    || (target.is_some() && status == StatusCode::TOO_MANY_REQUESTS)
                {
                    // Passed on to the client (the backend may mean it), but it counts
                    // towards ejection like any failure.
                    record_failure(backend, policy);
                } else {
                    record_success(backend);
                }
                let is_sse = response
                    .head
                    .get("content-type")
                    .is_some_and(|v| v.starts_with(b"text/event-stream"));
                let inspector = if !status.is_success() {
                    Inspector::None
                } else if is_sse {
                    Inspector::sse(inject_usage)
                } else {
                    Inspector::json()
                };
                let answered = match selection {
                    // Its name, counters and header are the route's own.
                    Selection::Model(route) => Answered::Model(route),
                    Selection::Route(plan) => Answered::Route {
                        plan,
                        target: target_index,
                    },
                };
                let body = ObservedBody::new(
                    connection,
                    inspector,
                    Completion {
                        answered,
                        usage: gateway.usage.clone(),
                        caller,
                        key_window,
                        status: status.as_u16(),
                        started,
                        backend: guard,
                        _in_flight: in_flight,
                    },
                );
                return Answer::Backend(BackendAnswer {
                    head: response,
                    body,
                });
            }
            Err(TryError::Connect(e)) => {
                // Nothing has reached the client yet, so another backend may answer
                // instead; this one is avoided for a while.
                backend.mark_failing(FAILING_COOLDOWN);
                record_failure(backend, policy);
                metrics.count_error(ErrorKind::UpstreamConnect);
                tracing::warn!(route = %name, instance = %backend.instance_name, error = %ErrorChain(&e), attempt, "cannot connect to backend; trying another");
                fell_through(
                    &mut failures,
                    format!("{}: {}", backend.instance_name, ErrorChain(&e)),
                );
            }
            Err(TryError::Request(e)) => {
                // The backend failed before answering (closed the connection, broke
                // the protocol): nothing has reached the client, so another may answer.
                record_failure(backend, policy);
                metrics.count_error(ErrorKind::UpstreamRequest);
                tracing::warn!(route = %name, instance = %backend.instance_name, error = %ErrorChain(&e), attempt, "request to backend failed; trying another");
                fell_through(
                    &mut failures,
                    format!("{}: {}", backend.instance_name, ErrorChain(&e)),
                );
            }
            Err(TryError::FirstByteTimeout(limit)) => {
                // Dropping the try closed its connection, which cancels the work.
                record_failure(backend, policy);
                metrics.count_error(ErrorKind::UpstreamTimeout);
                tracing::warn!(route = %name, instance = %backend.instance_name, timeout = ?limit, attempt, "backend sent no response head in time; trying another");
                let setting = if backend.provider.is_some() {
                    "the provider's timeout_seconds"
                } else {
                    "gateway_first_byte_timeout"
                };
                fell_through(
                    &mut failures,
                    format!(
                        "{} sent no response head within {} ({setting})",
                        backend.instance_name,
                        units::format_duration(limit)
                    ),
                );
                timed_out = true;
                last_failure = LastFailure::Timeout(limit);
            }
            Err(TryError::LeftRouting) => {
                // Not the instance's failure as far as ejection goes: it is out of
                // routing already. The request goes elsewhere at once.
                metrics.count_error(ErrorKind::InstanceLeftRouting);
                tracing::info!(route = %name, instance = %backend.instance_name, attempt, "instance left routing before answering; trying another");
                fell_through(
                    &mut failures,
                    format!(
                        "{} left routing (no longer running) before answering",
                        backend.instance_name
                    ),
                );
            }
        }
        drop(guard);
    }
    match last_failure {
        LastFailure::Timeout(limit) => {
            metrics.count_error(ErrorKind::AllTriesFailed);
            reject(
                metrics,
                started,
                OpenAiError::gateway_timeout(format!(
                    "no backend of `{name}` sent a response head within its first-byte timeout of {}: {}",
                    units::format_duration(limit),
                    failures.join("; ")
                )),
            )
        }
        LastFailure::NoRouteLeft => {
            // Its instances left routing while the request tried them.
            metrics.count_error(ErrorKind::NoRunningInstance);
            reject(
                metrics,
                started,
                OpenAiError::no_running_instance_left(name, &failures.join("; ")),
            )
        }
        LastFailure::NoTarget => {
            metrics.count_error(ErrorKind::NoRunningInstance);
            let Selection::Route(plan) = &selection else {
                return reject(metrics, started, OpenAiError::no_running_instance(name));
            };
            reject(
                metrics,
                started,
                OpenAiError::no_available_target(name, &plan.unavailable_reasons(&gateway.routes)),
            )
        }
        LastFailure::None | LastFailure::Other => {
            metrics.count_error(ErrorKind::AllTriesFailed);
            reject(
                metrics,
                started,
                OpenAiError::bad_gateway(format!(
                    "no backend of `{name}` could answer: {}",
                    failures.join("; ")
                )),
            )
        }
    }
}

/// What a request's model name resolved to.
enum Selection {
    /// A deployed model with no route of its name: its running instances.
    Model(Arc<ModelRoute>),
    /// A defined route.
    Route(Arc<RoutePlan>),
}

impl Selection {
    /// The name's counters: a model's are looked up once per route (table), a
    /// route's when it is planned; not on every request.
    fn metrics(&self, all: &Metrics) -> &Arc<ModelMetrics> {
        match self {
            Selection::Model(route) => route.metrics.get_or_init(|| all.model(&route.name)),
            Selection::Route(plan) => &plan.metrics,
        }
    }

    fn name(&self) -> &str {
        match self {
            Selection::Model(route) => &route.name,
            Selection::Route(plan) => &plan.name,
        }
    }

    /// Whether an answer with this status goes to another backend instead of the
    /// client. A plain model's instance that answers 502/503 cannot serve; a route also
    /// passes over a target that answers 429 or any 5xx (a provider over its quota, a
    /// provider's outage), as long as another target is left.
    fn falls_through(&self, status: StatusCode) -> bool {
        match self {
            Selection::Model(_) => matches!(
                status,
                StatusCode::BAD_GATEWAY | StatusCode::SERVICE_UNAVAILABLE
            ),
            Selection::Route(_) => {
                status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS
            }
        }
    }
}

/// Whether a failing answer may go to another try: always for a plain model (as
/// before routes); for a route, only while it has a backend left (else the failing
/// target's answer goes to the client as it is: its 429 and `Retry-After` mean more
/// than a 502).
fn another_target_left(
    selection: &Selection,
    gateway: &Gateway,
    attempt: usize,
    tried: &[i64],
    tried_targets: TargetMask,
) -> bool {
    let Selection::Route(plan) = selection else {
        return true;
    };
    attempt + 1 < MAX_TRIES && plan.pick(&gateway.routes, tried, tried_targets).is_some()
}

/// The request body with `model` set to `model` (a route's target is sent the name
/// its backend knows): spliced in at `span` (where the old name's characters are) when
/// known, else by re-encoding the body.
fn with_model(
    body: &Bytes,
    span: Option<std::ops::Range<usize>>,
    model: &str,
) -> Result<Bytes, OpenAiError> {
    if let Some(span) = span {
        // The JSON string of the name, without its quotes (they are in the body).
        let quoted = serde_json::to_string(model)
            .map_err(|e| OpenAiError::internal(format!("encode the model name: {e}")))?;
        let inner = &quoted.as_bytes()[1..quoted.len() - 1];
        let mut out = BytesMut::with_capacity(body.len() + inner.len());
        out.extend_from_slice(&body[..span.start]);
        out.extend_from_slice(inner);
        out.extend_from_slice(&body[span.end..]);
        return Ok(out.freeze());
    }
    let mut object: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(body).map_err(|_| not_an_object())?;
    object.insert("model".into(), serde_json::Value::String(model.to_owned()));
    serde_json::to_vec(&object)
        .map(Bytes::from)
        .map_err(|e| OpenAiError::internal(format!("re-encode the request body: {e}")))
}

/// How the tries of a request ended, for the answer when none succeeded.
#[derive(Debug, Clone, Copy)]
enum LastFailure {
    /// No try was made.
    None,
    /// The last try ran out of the first-byte timeout: 504.
    Timeout(Duration),
    /// The model has no running instance any more: 503.
    NoRouteLeft,
    /// No target of the route was available at the first try: 503.
    NoTarget,
    /// Any other failure: 502.
    Other,
}

/// Counts a failed try on its instance, and logs the ejection it causes.
fn record_failure(backend: &Backend, policy: &EjectionPolicy) {
    if let Some(ejected) = backend.record_failure(policy) {
        tracing::warn!(
            model = %backend.model_name,
            instance = %backend.instance_name,
            instance_id = backend.instance_id,
            failures = ejected.failures,
            cooldown = %units::format_duration(ejected.cooldown),
            ejections_in_a_row = ejected.ejections_in_a_row,
            "instance ejected from routing after failures in a row"
        );
    }
}

/// Counts an answer on its instance, and logs the ejection it ends.
fn record_success(backend: &Backend) {
    if let Some(recovered) = backend.record_success() {
        if recovered.was_ejected {
            tracing::info!(
                model = %backend.model_name,
                instance = %backend.instance_name,
                instance_id = backend.instance_id,
                failures = recovered.failures,
                "ejected instance answered; back in routing"
            );
        }
    }
}

/// Why one try failed.
enum TryError {
    Connect(ConnectError),
    Request(RequestError),
    /// No response head within `gateway_first_byte_timeout` (the value).
    FirstByteTimeout(Duration),
    /// The routing table dropped the instance while the try waited for its head.
    LeftRouting,
}

/// How long a request for a model that the store says is running waits for this
/// server's routing table to hear of it.
const ROUTE_CATCH_UP: Duration = Duration::from_secs(2);

/// A model with no route in this server's table: the store may know better, since a
/// change made through another server (a model created, an instance reported running)
/// reaches this table a moment later. Waits for the route when the store has a running
/// instance; otherwise answers 503 (the model exists, nothing runs) or 404 (no such model),
/// with the model's counters when it exists.
async fn route_after_miss(
    gateway: &Gateway,
    model: &str,
) -> Result<Arc<ModelRoute>, (Option<Arc<ModelMetrics>>, OpenAiError)> {
    let not_running = || {
        let metrics = gateway.metrics.model(model);
        metrics.count_error(ErrorKind::NoRunningInstance);
        (Some(metrics), OpenAiError::no_running_instance(model))
    };
    if gateway.routes.knows(model) && gateway.routes.recently_missed(model) {
        return Err(not_running());
    }
    let internal = |e: StoreError| {
        tracing::error!(error = %e, model, "look up a model for the gateway");
        (
            None,
            OpenAiError::internal("the database failed to answer; see the server log"),
        )
    };
    let found = match gateway.store.get_model_by_name(model).await {
        Ok(found) => found,
        Err(StoreError::NotFound { .. }) => {
            return Err((None, OpenAiError::model_not_found(model)))
        }
        Err(e) => return Err(internal(e)),
    };
    let running = InstanceFilter {
        model_id: Some(found.id),
        worker_id: None,
        state: Some(InstanceState::Running),
    };
    let (_, count) = gateway
        .store
        .list_instances(
            &running,
            Page {
                page: 1,
                per_page: 1,
            },
        )
        .await
        .map_err(internal)?;
    let route = if count > 0 {
        gateway.routes.wait_for(model, ROUTE_CATCH_UP).await
    } else {
        None
    };
    route.ok_or_else(|| {
        gateway.routes.missed(model);
        not_running()
    })
}

/// [`send_to`], given up when the instance leaves routing or, with a first-byte
/// timeout, when that runs out first. Dropping the try closes its connection.
async fn send_until_head(
    backend: &Backend,
    request: Outgoing<'_>,
    first_byte_timeout: Option<Duration>,
    now: Instant,
) -> Result<(ResponseHead, UpstreamConnection), TryError> {
    let send = async {
        match first_byte_timeout {
            None => send_to(backend, request, now).await,
            Some(limit) => tokio::time::timeout(limit, send_to(backend, request, now))
                .await
                .unwrap_or(Err(TryError::FirstByteTimeout(limit))),
        }
    };
    tokio::select! {
        // A head that arrived with the removal is still taken.
        biased;
        result = send => result,
        () = backend.left_routing() => Err(TryError::LeftRouting),
    }
}

/// Sends a request to an instance over a pooled connection (or a new one), and
/// returns the response head with the connection that carries its body.
async fn send_to(
    backend: &Backend,
    request: Outgoing<'_>,
    now: Instant,
) -> Result<(ResponseHead, UpstreamConnection), TryError> {
    let mut connection = backend.connection(now).await.map_err(TryError::Connect)?;
    match connection.send(request).await {
        Ok(response) => Ok((response, connection)),
        // An idle keep-alive connection that the instance closed just as it was
        // reused: the request was not processed, so it goes once more on a new
        // connection, without counting as a try.
        Err(e) if connection.reused && e.is_closed_early() => {
            tracing::debug!(instance = %backend.instance_name, error = %e, "reused connection was closed; reconnecting");
            drop(connection);
            let mut fresh = Box::pin(backend.connect())
                .await
                .map_err(TryError::Connect)?;
            let response = fresh.send(request).await.map_err(TryError::Request)?;
            Ok((response, fresh))
        }
        Err(e) => Err(TryError::Request(e)),
    }
}

/// An error with its sources, `a: b: c`.
struct ErrorChain<'a>(&'a (dyn std::error::Error + 'static));

impl std::fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut text = self.0.to_string();
        let mut source = self.0.source();
        while let Some(e) = source {
            // Errors that print their source already (`connect to …: refused`) would
            // otherwise say it twice.
            let cause = e.to_string();
            if !text.ends_with(&cause) {
                text.push_str(": ");
                text.push_str(&cause);
            }
            source = e.source();
        }
        f.write_str(&text)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn secrets_are_the_same_only_when_every_byte_is() {
        let key = b"gantry_0123456789abcdef0123456789abcdef0123456789ab";
        assert!(same_secret(key, key));
        let mut other = *key;
        for at in [0, 25, key.len() - 1] {
            other[at] ^= 1;
            assert!(!same_secret(key, &other), "differs at {at}");
            other[at] ^= 1;
        }
        assert!(!same_secret(key, &key[..key.len() - 1]));
        assert!(same_secret(b"", b""));
    }

    #[test]
    fn include_usage_is_spliced_in_when_absent_and_set_when_present() {
        let body = Bytes::from_static(br#" {"model":"m","stream":true}"#);
        let out = with_include_usage(&body, false).unwrap();
        let value: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(value["stream_options"]["include_usage"], true);
        assert_eq!(value["model"], "m");

        let body = Bytes::from_static(
            br#"{"model":"m","stream":true,"stream_options":{"include_usage":false,"x":1}}"#,
        );
        let out = with_include_usage(&body, true).unwrap();
        let value: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(value["stream_options"]["include_usage"], true);
        assert_eq!(value["stream_options"]["x"], 1);

        let body = Bytes::from_static(br#"{"model":"m","stream_options":null}"#);
        let out = with_include_usage(&body, true).unwrap();
        let value: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(value["stream_options"]["include_usage"], true);
    }

    #[test]
    fn peek_reads_model_stream_and_whether_stream_options_is_present() {
        let peek: RequestPeek<'_> = serde_json::from_slice(
            br#"{"messages":[{"role":"user","content":"x"}],"model":"tiny","stream":true}"#,
        )
        .unwrap();
        assert_eq!(peek.model.as_deref(), Some("tiny"));
        assert_eq!(peek.stream, Some(true));
        assert!(peek.stream_options.is_none());
        let peek: RequestPeek<'_> =
            serde_json::from_slice(br#"{"model":"t","stream_options":null}"#).unwrap();
        assert!(matches!(peek.stream_options, Some(None)));
    }

    #[test]
    fn a_targets_model_name_is_spliced_in_where_the_routes_was() {
        let body =
            Bytes::from_static(br#"{"messages":[{"content":"model"}],"model":"chat","n":1}"#);
        let peek: RequestPeek<'_> = serde_json::from_slice(&body).unwrap();
        let Some(Cow::Borrowed(m)) = &peek.model else {
            panic!("borrowed");
        };
        let start = m.as_ptr() as usize - body.as_ptr() as usize;
        let spliced = with_model(&body, Some(start..start + m.len()), "meta/llama \"3\"").unwrap();
        let value: serde_json::Value = serde_json::from_slice(&spliced).unwrap();
        assert_eq!(value["model"], "meta/llama \"3\"");
        assert_eq!(value["messages"][0]["content"], "model");
        // Without a span (the name had escapes), the body is re-encoded.
        let escaped = Bytes::from_static(br#"{"model":"ch\u0061t"}"#);
        let value: serde_json::Value =
            serde_json::from_slice(&with_model(&escaped, None, "qwen").unwrap()).unwrap();
        assert_eq!(value["model"], "qwen");
    }

    #[test]
    fn an_error_chain_says_each_cause_once() {
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let e = ConnectError::Io {
            address: "127.0.0.1:9".into(),
            source: refused,
        };
        assert_eq!(
            ErrorChain(&e).to_string(),
            "connect to 127.0.0.1:9: refused"
        );
    }

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
