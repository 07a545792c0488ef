//! The **tries** phase of a request: pick a backend, send, and decide from the outcome
//! whether the answer is the client's or the request goes to another backend — until
//! one answers or [`MAX_TRIES`] is reached — and, when none answered, the error that
//! says why.
//!
//! The state of the tries is plain data on the request's stack ([`Attempts`]); what an
//! outcome means is decided by two pure functions, [`judge_head`] for an answer and
//! [`judge_error`] for a failure, so the rules are tested without backends and the loop
//! with fake ones on loopback ports.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use gantry_types::units;
use tokio::time::Instant;

use super::admit::{Rewrite, Selection, SelectionKind};
use super::{status_code, Endpoint, FAILING_COOLDOWN, MAX_TRIES, RETRY_BACKOFF};
use crate::eject::EjectionPolicy;
use crate::error::OpenAiError;
use crate::h1::ResponseHead;
use crate::metrics::{ErrorKind, ModelMetrics};
use crate::model_routes::TargetMask;
use crate::routing::{Backend, InFlightGuard, ModelRoute, RoutingTable};
use crate::upstream::{ConnectError, Outgoing, RequestError, UpstreamConnection};
use crate::GatewayConfig;

/// What every try of one request sends, besides the body's rewrite.
#[derive(Clone, Copy)]
pub(super) struct TryRequest<'a> {
    pub endpoint: Endpoint,
    /// The request target's query, passed on.
    pub query: Option<&'a str>,
    /// The headers passed on, as `name: value\r\n` lines.
    pub headers: &'a [u8],
    /// The name the client asked for (a route's or a model's).
    pub name: &'a str,
    pub started: Instant,
}

/// A backend that answered: its head, the connection carrying the body, the in-flight
/// count it holds, and the route target it was (for a route).
pub(super) struct Reached {
    pub head: ResponseHead,
    pub connection: UpstreamConnection,
    pub guard: InFlightGuard,
    pub target: Option<usize>,
}

/// Sends the request to backends of `selection` until one answers, within
/// [`MAX_TRIES`]. The error, when none answered, is counted on `metrics` already.
pub(super) async fn try_backends(
    config: &GatewayConfig,
    routes: &RoutingTable,
    selection: &Selection,
    request: TryRequest<'_>,
    rewrite: &Rewrite,
    metrics: &ModelMetrics,
) -> Result<Reached, OpenAiError> {
    let policy = &config.ejection;
    let name = request.name;
    let mut attempts = Attempts::default();
    for attempt in 0..MAX_TRIES {
        let Some(pick) = attempts.pick(attempt, selection, routes) else {
            break;
        };
        if let Some(wait) = pick.backoff {
            // Only instances that already failed are left: give them a moment.
            tokio::time::sleep(wait).await;
        }
        let target = selection.target(pick.target);
        let guard = InFlightGuard::start(pick.backend);
        let backend = guard.backend();
        // What differs for this try: a provider's path, credentials and timeout; the
        // `model` a route's target is sent.
        let body = rewrite.body_for(target, name)?;
        let provider_path;
        let provider_headers;
        let (path, headers, first_byte_timeout) = match &backend.provider {
            None => (
                request.endpoint.path(),
                request.headers,
                config.first_byte_timeout,
            ),
            Some(provider) => {
                provider_path = provider.path_for(request.endpoint.path());
                provider_headers = provider.with_headers(request.headers);
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
            query: request.query,
            host: backend.host_header.as_bytes(),
            headers,
            body: &body,
        };
        attempts.last_failure = LastFailure::Other;
        // The request's first try reads no clock of its own: it began a moment ago.
        let now = if attempt == 0 {
            request.started
        } else {
            Instant::now()
        };
        let failure = match send_until_head(backend, outgoing, first_byte_timeout, now).await {
            Ok((head, connection)) => {
                let status = status_code(&head);
                let another_left = || {
                    another_target_left(
                        selection,
                        routes,
                        attempt,
                        attempts.tried(),
                        attempts.tried_targets,
                    )
                };
                match judge_head(selection.kind(), status, another_left) {
                    HeadVerdict::Answer { counts_as_failure } => {
                        backend.mark_healthy();
                        if counts_as_failure {
                            record_failure(backend, policy);
                        } else {
                            record_success(backend);
                        }
                        return Ok(Reached {
                            head,
                            connection,
                            guard,
                            target: pick.target,
                        });
                    }
                    HeadVerdict::FallThrough => {
                        record_failure(backend, policy);
                        metrics.count_error(ErrorKind::UpstreamUnavailable);
                        tracing::warn!(route = %name, instance = %backend.instance_name, status = head.status, attempt, "backend cannot serve; trying another");
                        format!("{} answered {status}", backend.instance_name)
                    }
                }
            }
            Err(error) => {
                let retry = judge_error(&error);
                if retry.avoid {
                    backend.mark_failing(FAILING_COOLDOWN);
                }
                if retry.counts_as_failure {
                    record_failure(backend, policy);
                }
                metrics.count_error(retry.kind);
                if let TryError::FirstByteTimeout(limit) = error {
                    attempts.timed_out = true;
                    attempts.last_failure = LastFailure::Timeout(limit);
                }
                describe_failure(backend, &error, name, attempt)
            }
        };
        if let Some(target) = target {
            target.metrics.fell_through.fetch_add(1, Ordering::Relaxed);
        }
        attempts.failures.push(failure);
    }
    Err(attempts.into_error(selection, routes, metrics))
}

/// Where a request's tries stand. Plain data on the request's stack.
#[derive(Default)]
pub(super) struct Attempts {
    /// Instances tried, in order (a provider counts as minus its id); the first
    /// `tried_count` entries are set.
    tried: [i64; MAX_TRIES],
    tried_count: usize,
    /// A route's targets tried (bit `i`: target `i`): a provider target is tried once
    /// per request, a local one while it has untried instances.
    tried_targets: TargetMask,
    /// Why each failed try failed, for the error when none answered.
    failures: Vec<String>,
    /// A try ran out of the first-byte timeout: later ones go only to instances not
    /// tried yet, since the same one would most likely keep the request waiting again.
    timed_out: bool,
    last_failure: LastFailure,
    /// A model's route as the table has it now, when a retry looked again.
    latest: Option<Arc<ModelRoute>>,
}

/// The backend a try goes to.
pub(super) struct Pick {
    pub backend: Arc<Backend>,
    /// The route target it belongs to (a route's try).
    pub target: Option<usize>,
    /// Wait this long first: only instances that already failed are left.
    pub backoff: Option<Duration>,
}

impl Attempts {
    pub(super) fn tried(&self) -> &[i64] {
        &self.tried[..self.tried_count]
    }

    fn remember(&mut self, instance_id: i64) {
        if self.tried_count < MAX_TRIES {
            self.tried[self.tried_count] = instance_id;
            self.tried_count += 1;
        }
    }

    /// The backend for try number `attempt`, or none: every backend was tried or the
    /// model left routing (recorded as why the tries ended).
    pub(super) fn pick(
        &mut self,
        attempt: usize,
        selection: &Selection,
        routes: &RoutingTable,
    ) -> Option<Pick> {
        match selection {
            Selection::Model(route) => {
                if attempt > 0 {
                    // Instances may have left routing since the last try (that may be
                    // why it ended): pick from the table as it is now.
                    match routes.get(&route.name) {
                        Some(current) => self.latest = Some(current),
                        None => {
                            self.last_failure = LastFailure::NoRouteLeft;
                            return None;
                        }
                    }
                }
                let route = self.latest.as_ref().unwrap_or(route);
                let backend = if self.timed_out {
                    route.pick_untried(self.tried())
                } else {
                    route.pick(self.tried())
                }?;
                let backoff = if self.tried().contains(&backend.instance_id) {
                    Some(RETRY_BACKOFF * attempt as u32)
                } else {
                    self.remember(backend.instance_id);
                    None
                };
                Some(Pick {
                    backend,
                    target: None,
                    backoff,
                })
            }
            Selection::Route(plan) => {
                let Some((index, backend)) = plan.pick(routes, self.tried(), self.tried_targets)
                else {
                    if attempt == 0 {
                        self.last_failure = LastFailure::NoTarget;
                    }
                    return None;
                };
                if backend.provider.is_some() {
                    self.tried_targets |= 1 << index;
                } else {
                    self.remember(backend.instance_id);
                }
                Some(Pick {
                    backend,
                    target: Some(index),
                    backoff: None,
                })
            }
        }
    }

    /// The error when no try answered, counted on `metrics`.
    pub(super) fn into_error(
        self,
        selection: &Selection,
        routes: &RoutingTable,
        metrics: &ModelMetrics,
    ) -> OpenAiError {
        let name = selection.name();
        match self.last_failure {
            LastFailure::Timeout(limit) => {
                metrics.count_error(ErrorKind::AllTriesFailed);
                OpenAiError::gateway_timeout(format!(
                    "no backend of `{name}` sent a response head within its first-byte timeout of {}: {}",
                    units::format_duration(limit),
                    self.failures.join("; ")
                ))
            }
            LastFailure::NoRouteLeft => {
                // Its instances left routing while the request tried them.
                metrics.count_error(ErrorKind::NoRunningInstance);
                OpenAiError::no_running_instance_left(name, &self.failures.join("; "))
            }
            LastFailure::NoTarget => {
                metrics.count_error(ErrorKind::NoRunningInstance);
                match selection {
                    Selection::Route(plan) => {
                        OpenAiError::no_available_target(name, &plan.unavailable_reasons(routes))
                    }
                    Selection::Model(_) => OpenAiError::no_running_instance(name),
                }
            }
            LastFailure::None | LastFailure::Other => {
                metrics.count_error(ErrorKind::AllTriesFailed);
                OpenAiError::bad_gateway(format!(
                    "no backend of `{name}` could answer: {}",
                    self.failures.join("; ")
                ))
            }
        }
    }
}

/// What an answer's head means for the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum HeadVerdict {
    /// The answer goes to the client; `counts_as_failure`: it still counts towards the
    /// instance's ejection (the backend may mean it, but it is failing).
    Answer { counts_as_failure: bool },
    /// The backend cannot serve: the request goes to another try.
    FallThrough,
}

/// What an answer with `status` means. A plain model's instance that answers 502/503
/// cannot serve, and the request goes on; a route also passes over a target that answers
/// 429 or any 5xx (a provider over its quota, a provider's outage) — but only while
/// `another_left` says another backend is left: else its answer, with its
/// `Retry-After`, means more to the client than a 502 would.
pub(super) fn judge_head(
    kind: SelectionKind,
    status: StatusCode,
    another_left: impl FnOnce() -> bool,
) -> HeadVerdict {
    let cannot_serve = match kind {
        SelectionKind::Model => matches!(
            status,
            StatusCode::BAD_GATEWAY | StatusCode::SERVICE_UNAVAILABLE
        ),
        SelectionKind::Route => status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS,
    };
    if cannot_serve && another_left() {
        return HeadVerdict::FallThrough;
    }
    HeadVerdict::Answer {
        counts_as_failure: status.is_server_error()
            || (kind == SelectionKind::Route && status == StatusCode::TOO_MANY_REQUESTS),
    }
}

/// What a failed try means: nothing has reached the client yet, so the request always
/// goes on to another try; how the failure is counted depends on its kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Retry {
    /// The failure as counted on the model.
    pub kind: ErrorKind,
    /// It counts towards the instance's ejection.
    pub counts_as_failure: bool,
    /// The instance is avoided for [`FAILING_COOLDOWN`] (it refused a connection).
    pub avoid: bool,
}

/// What a failed try means for the instance and the counters.
pub(super) fn judge_error(error: &TryError) -> Retry {
    match error {
        TryError::Connect(_) => Retry {
            kind: ErrorKind::UpstreamConnect,
            counts_as_failure: true,
            avoid: true,
        },
        TryError::Request(_) => Retry {
            kind: ErrorKind::UpstreamRequest,
            counts_as_failure: true,
            avoid: false,
        },
        // Dropping the try closed its connection, which cancels the work.
        TryError::FirstByteTimeout(_) => Retry {
            kind: ErrorKind::UpstreamTimeout,
            counts_as_failure: true,
            avoid: false,
        },
        // Not the instance's failure as far as ejection goes: it is out of routing
        // already.
        TryError::LeftRouting => Retry {
            kind: ErrorKind::InstanceLeftRouting,
            counts_as_failure: false,
            avoid: false,
        },
    }
}

/// Logs a failed try and says why it failed, for the error when none answers.
fn describe_failure(backend: &Backend, error: &TryError, name: &str, attempt: usize) -> String {
    let instance = &backend.instance_name;
    match error {
        TryError::Connect(e) => {
            tracing::warn!(route = %name, %instance, error = %ErrorChain(e), attempt, "cannot connect to backend; trying another");
            format!("{instance}: {}", ErrorChain(e))
        }
        TryError::Request(e) => {
            tracing::warn!(route = %name, %instance, error = %ErrorChain(e), attempt, "request to backend failed; trying another");
            format!("{instance}: {}", ErrorChain(e))
        }
        TryError::FirstByteTimeout(limit) => {
            tracing::warn!(route = %name, %instance, timeout = ?limit, attempt, "backend sent no response head in time; trying another");
            let setting = if backend.provider.is_some() {
                "the provider's timeout_seconds"
            } else {
                "gateway_first_byte_timeout"
            };
            format!(
                "{instance} sent no response head within {} ({setting})",
                units::format_duration(*limit)
            )
        }
        TryError::LeftRouting => {
            tracing::info!(route = %name, %instance, attempt, "instance left routing before answering; trying another");
            format!("{instance} left routing (no longer running) before answering")
        }
    }
}

/// Whether a failing answer may go to another try: always for a plain model (as
/// before routes); for a route, only while it has a backend left (else the failing
/// target's answer goes to the client as it is: its 429 and `Retry-After` mean more
/// than a 502).
fn another_target_left(
    selection: &Selection,
    routes: &RoutingTable,
    attempt: usize,
    tried: &[i64],
    tried_targets: TargetMask,
) -> bool {
    let Selection::Route(plan) = selection else {
        return true;
    };
    attempt + 1 < MAX_TRIES && plan.pick(routes, tried, tried_targets).is_some()
}

/// How the tries of a request ended, for the answer when none succeeded.
#[derive(Debug, Clone, Copy, Default)]
pub(super) enum LastFailure {
    /// No try was made.
    #[default]
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
pub(super) enum TryError {
    Connect(ConnectError),
    Request(RequestError),
    /// No response head within `gateway_first_byte_timeout` (the value).
    FirstByteTimeout(Duration),
    /// The routing table dropped the instance while the try waited for its head.
    LeftRouting,
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

    use std::sync::atomic::AtomicUsize;

    use bytes::Bytes;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;
    use crate::metrics::Metrics;
    use crate::routing::testing;

    #[test]
    fn a_plain_models_502_and_503_go_on_while_anything_is_left_and_count_as_failures() {
        for status in [StatusCode::BAD_GATEWAY, StatusCode::SERVICE_UNAVAILABLE] {
            assert_eq!(
                judge_head(SelectionKind::Model, status, || true),
                HeadVerdict::FallThrough
            );
            assert_eq!(
                judge_head(SelectionKind::Model, status, || false),
                HeadVerdict::Answer {
                    counts_as_failure: true
                }
            );
        }
        // Another 5xx is the backend's answer to this request: passed on, counted.
        assert_eq!(
            judge_head(
                SelectionKind::Model,
                StatusCode::INTERNAL_SERVER_ERROR,
                || true
            ),
            HeadVerdict::Answer {
                counts_as_failure: true
            }
        );
        // A model's 429 is the instance speaking for itself, not a failure.
        assert_eq!(
            judge_head(SelectionKind::Model, StatusCode::TOO_MANY_REQUESTS, || true),
            HeadVerdict::Answer {
                counts_as_failure: false
            }
        );
    }

    #[test]
    fn a_routes_429_and_5xx_fall_through_only_while_another_target_is_left() {
        for status in [
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::INTERNAL_SERVER_ERROR,
            StatusCode::SERVICE_UNAVAILABLE,
        ] {
            assert_eq!(
                judge_head(SelectionKind::Route, status, || true),
                HeadVerdict::FallThrough,
                "{status}"
            );
            assert_eq!(
                judge_head(SelectionKind::Route, status, || false),
                HeadVerdict::Answer {
                    counts_as_failure: true
                },
                "{status}: the last target's answer goes to the client"
            );
        }
    }

    #[test]
    fn a_good_answer_is_the_clients_without_asking_what_is_left() {
        for kind in [SelectionKind::Model, SelectionKind::Route] {
            for status in [
                StatusCode::OK,
                StatusCode::BAD_REQUEST,
                StatusCode::NOT_FOUND,
            ] {
                assert_eq!(
                    judge_head(kind, status, || panic!("no other target is needed")),
                    HeadVerdict::Answer {
                        counts_as_failure: false
                    }
                );
            }
        }
    }

    #[test]
    fn a_failed_try_is_counted_by_its_kind_and_only_a_refused_connection_avoids_the_instance() {
        let refused = ConnectError::Io {
            address: "127.0.0.1:9".into(),
            source: std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
        };
        let connect = judge_error(&TryError::Connect(refused));
        assert_eq!(connect.kind, ErrorKind::UpstreamConnect);
        assert!(connect.counts_as_failure && connect.avoid);
        let timeout = judge_error(&TryError::FirstByteTimeout(Duration::from_secs(1)));
        assert_eq!(timeout.kind, ErrorKind::UpstreamTimeout);
        assert!(timeout.counts_as_failure && !timeout.avoid);
        let left = judge_error(&TryError::LeftRouting);
        assert_eq!(left.kind, ErrorKind::InstanceLeftRouting);
        assert!(!left.counts_as_failure && !left.avoid);
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

    /// What a fake instance does with each request on its connections.
    #[derive(Clone, Copy)]
    enum Fake {
        /// Answers with this status and a two-byte JSON body.
        Answers(u16),
        /// Reads the request and closes the connection.
        Closes,
        /// Reads the request and never answers.
        Silent,
    }

    /// A fake instance on a loopback port, and how many requests reached it.
    async fn fake_instance(behaviour: Fake) -> (u16, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let requests = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&requests);
        tokio::spawn(async move {
            loop {
                let (mut socket, _) = listener.accept().await.unwrap();
                let counted = Arc::clone(&counted);
                tokio::spawn(async move {
                    let mut buffer = vec![0u8; 64 * 1024];
                    loop {
                        match socket.read(&mut buffer).await {
                            Ok(0) | Err(_) => return,
                            Ok(_) => {}
                        }
                        counted.fetch_add(1, Ordering::SeqCst);
                        match behaviour {
                            Fake::Answers(status) => {
                                let head = format!(
                                    "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{{}}"
                                );
                                if socket.write_all(head.as_bytes()).await.is_err() {
                                    return;
                                }
                            }
                            Fake::Closes => return,
                            Fake::Silent => std::future::pending::<()>().await,
                        }
                    }
                });
            }
        });
        (port, requests)
    }

    /// A loopback port nothing listens on.
    async fn refusing_port() -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        listener.local_addr().unwrap().port()
    }

    /// Runs the tries of one chat request for the model `tiny` served by `backends`.
    async fn tries(
        backends: Vec<Arc<Backend>>,
        config: &GatewayConfig,
        metrics: &ModelMetrics,
    ) -> Result<Reached, OpenAiError> {
        let routes = testing::table("tiny", backends);
        let selection = Selection::Model(routes.get("tiny").unwrap());
        let body = Bytes::from_static(br#"{"model":"tiny"}"#);
        let rewrite = Rewrite::plain(body);
        let request = TryRequest {
            endpoint: Endpoint::ChatCompletions,
            query: None,
            headers: b"",
            name: "tiny",
            started: Instant::now(),
        };
        try_backends(config, &routes, &selection, request, &rewrite, metrics).await
    }

    #[tokio::test]
    async fn a_refused_connection_goes_to_the_next_instance_and_avoids_the_first() {
        let (port, requests) = fake_instance(Fake::Answers(200)).await;
        let refusing = testing::backend("tiny", 1, refusing_port().await);
        let answering = testing::backend("tiny", 2, port);
        let metrics = Metrics::default().model("tiny");
        let reached = tries(
            vec![Arc::clone(&refusing), Arc::clone(&answering)],
            &GatewayConfig::default(),
            &metrics,
        )
        .await
        .unwrap_or_else(|e| panic!("answered: {}", e.message));
        assert_eq!(reached.head.status, 200);
        assert_eq!(reached.guard.backend().instance_id, 2);
        assert_eq!(requests.load(Ordering::SeqCst), 1);
        assert!(!refusing.is_healthy(), "the refusing instance is avoided");
        assert_eq!(metrics.errors(ErrorKind::UpstreamConnect), 1);
    }

    #[tokio::test]
    async fn instances_that_cannot_serve_are_each_tried_and_the_error_names_every_failure() {
        let (first_port, first) = fake_instance(Fake::Answers(503)).await;
        let (second_port, second) = fake_instance(Fake::Closes).await;
        let metrics = Metrics::default().model("tiny");
        let error = match tries(
            vec![
                testing::backend("tiny", 1, first_port),
                testing::backend("tiny", 2, second_port),
            ],
            &GatewayConfig::default(),
            &metrics,
        )
        .await
        {
            Ok(_) => panic!("no instance can serve"),
            Err(error) => error,
        };
        assert_eq!(error.status, StatusCode::BAD_GATEWAY);
        // Three tries: each instance once, then one of them again after a backoff.
        assert_eq!(
            first.load(Ordering::SeqCst) + second.load(Ordering::SeqCst),
            MAX_TRIES
        );
        assert!(first.load(Ordering::SeqCst) >= 1 && second.load(Ordering::SeqCst) >= 1);
        assert!(
            error.message.contains("answered 503") && error.message.contains("tiny-"),
            "{}",
            error.message
        );
        assert_eq!(metrics.errors(ErrorKind::AllTriesFailed), 1);
        assert!(metrics.errors(ErrorKind::UpstreamUnavailable) >= 1);
        assert!(metrics.errors(ErrorKind::UpstreamRequest) >= 1);
    }

    #[tokio::test]
    async fn after_a_first_byte_timeout_only_untried_instances_are_tried_and_then_504() {
        let (silent_port, silent) = fake_instance(Fake::Silent).await;
        let config = GatewayConfig {
            first_byte_timeout: Some(Duration::from_millis(100)),
            ..GatewayConfig::default()
        };
        let metrics = Metrics::default().model("tiny");
        let error = match tries(
            vec![testing::backend("tiny", 1, silent_port)],
            &config,
            &metrics,
        )
        .await
        {
            Ok(_) => panic!("a silent instance cannot answer"),
            Err(error) => error,
        };
        assert_eq!(error.status, StatusCode::GATEWAY_TIMEOUT);
        assert_eq!(silent.load(Ordering::SeqCst), 1, "not asked again");
        assert!(
            error.message.contains("gateway_first_byte_timeout"),
            "{}",
            error.message
        );

        // With another instance, the request goes there.
        let (silent_port, _) = fake_instance(Fake::Silent).await;
        let (port, _) = fake_instance(Fake::Answers(200)).await;
        let reached = tries(
            vec![
                testing::backend("tiny", 1, silent_port),
                testing::backend("tiny", 2, port),
            ],
            &config,
            &metrics,
        )
        .await
        .unwrap_or_else(|e| panic!("answered: {}", e.message));
        assert_eq!(reached.head.status, 200);
    }

    #[tokio::test]
    async fn a_plain_models_last_instance_answering_500_is_passed_on_as_it_is() {
        let (port, requests) = fake_instance(Fake::Answers(500)).await;
        let metrics = Metrics::default().model("tiny");
        let reached = tries(
            vec![testing::backend("tiny", 1, port)],
            &GatewayConfig::default(),
            &metrics,
        )
        .await
        .unwrap_or_else(|e| panic!("answered: {}", e.message));
        assert_eq!(reached.head.status, 500);
        assert_eq!(requests.load(Ordering::SeqCst), 1);
    }
}
