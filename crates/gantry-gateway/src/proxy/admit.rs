//! The first phases of a request, before any backend is tried: **admit** (the body is a
//! JSON object naming a model, the key may call it and is within its rate) and
//! **resolve** (a defined route by that name, else the deployed model), then
//! **rewrite**: what the body sent upstream looks like — `stream_options.include_usage`
//! asked on the client's behalf, a route target's own model name spliced in.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use gantry_store::{InstanceFilter, Page, StoreError};
use gantry_types::InstanceState;
use serde::Deserialize;

use super::Endpoint;
use crate::error::OpenAiError;
use crate::limits::KeyWindow;
use crate::metrics::{ErrorKind, Metrics, ModelMetrics};
use crate::model_routes::{PlannedTarget, RoutePlan};
use crate::routing::ModelRoute;
use crate::usage::Caller;
use crate::Gateway;

/// A request past the admit and resolve phases.
pub(super) struct Admitted {
    pub selection: Selection,
    /// The caller's key's window, when its tokens per minute are counted.
    pub key_window: Option<Arc<KeyWindow>>,
    pub rewrite: Rewrite,
}

/// Why a request is turned away before any try: the error, and the counters of the
/// model it named when it named a known one.
pub(super) type Refusal = (Option<Arc<ModelMetrics>>, OpenAiError);

/// Admits, resolves and plans the rewrite of one request's body.
pub(super) async fn admit(
    gateway: &Gateway,
    endpoint: Endpoint,
    caller: &Caller,
    body: Bytes,
) -> Result<Admitted, Refusal> {
    let peek: RequestPeek<'_> = match serde_json::from_slice(&body) {
        Ok(peek) if body.trim_ascii_start().starts_with(b"{") => peek,
        Ok(_) => return Err((None, not_an_object())),
        Err(e) => {
            return Err((
                None,
                OpenAiError::bad_request(
                    "invalid_request",
                    format!("the request body is not a JSON object with a string `model` (and an optional boolean `stream` and object `stream_options`): {e}"),
                ),
            ))
        }
    };
    let Some(model) = peek.model.as_deref().filter(|m| !m.is_empty()) else {
        return Err((
            None,
            OpenAiError::bad_request(
                "missing_model",
                "the request body has no `model`; GET /v1/models lists the models being served",
            )
            .with_param("model"),
        ));
    };

    // The key's limits: the routes it may call, its requests per minute (its tokens
    // are counted in when the request ends).
    let key_window = gateway
        .limiter
        .admit(caller.api_key_id, model)
        .map_err(|e| (None, e))?;

    // A defined route by that name, else the deployed model of that name.
    let selection = match gateway.model_routes.get(model) {
        Some(plan) => Selection::Route(plan),
        None => match gateway.routes.get(model) {
            Some(route) => Selection::Model(route),
            None => Selection::Model(route_after_miss(gateway, model).await?),
        },
    };

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
    let upstream = if inject_usage {
        match with_include_usage(&body, key_present) {
            Ok(rewritten) => rewritten,
            Err(e) => return Err((Some(Arc::clone(selection.metrics(&gateway.metrics))), e)),
        }
    } else {
        body.clone()
    };
    Ok(Admitted {
        selection,
        key_window,
        rewrite: Rewrite {
            original: body,
            upstream,
            model_span,
            inject_usage,
            key_present,
        },
    })
}

/// What is sent upstream: the client's body, rewritten where a try needs it.
pub(super) struct Rewrite {
    /// The body as the client sent it.
    original: Bytes,
    /// The body for a try that keeps the client's model name (with `include_usage` set
    /// when it was asked for the client): the same bytes as `original` otherwise.
    upstream: Bytes,
    /// Where the model name's characters are in `original`, when it had no escapes.
    model_span: Option<std::ops::Range<usize>>,
    /// The gateway asked for the usage chunk of a stream; the answer's body drops it.
    pub inject_usage: bool,
    /// The client's body has a `stream_options` key (possibly `null`).
    key_present: bool,
}

impl Rewrite {
    /// A body sent as the client sent it.
    #[cfg(test)]
    pub(super) fn plain(body: Bytes) -> Self {
        Self {
            upstream: body.clone(),
            original: body,
            model_span: None,
            inject_usage: false,
            key_present: false,
        }
    }

    /// The body for a try of `target` (none: a deployed model's instance): a route
    /// target that knows the model by another name is sent that name.
    pub(super) fn body_for(
        &self,
        target: Option<&PlannedTarget>,
        name: &str,
    ) -> Result<Cow<'_, Bytes>, OpenAiError> {
        let Some(target) = target.filter(|t| t.upstream_model() != name) else {
            return Ok(Cow::Borrowed(&self.upstream));
        };
        let renamed = with_model(
            &self.original,
            self.model_span.clone(),
            target.upstream_model(),
        )?;
        if self.inject_usage {
            with_include_usage(&renamed, self.key_present).map(Cow::Owned)
        } else {
            Ok(Cow::Owned(renamed))
        }
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

/// What a request's model name resolved to.
pub(super) enum Selection {
    /// A deployed model with no route of its name: its running instances.
    Model(Arc<ModelRoute>),
    /// A defined route.
    Route(Arc<RoutePlan>),
}

impl Selection {
    /// The name's counters: a model's are looked up once per route (table), a
    /// route's when it is planned; not on every request.
    pub(super) fn metrics(&self, all: &Metrics) -> &Arc<ModelMetrics> {
        match self {
            Selection::Model(route) => route.metrics.get_or_init(|| all.model(&route.name)),
            Selection::Route(plan) => &plan.metrics,
        }
    }

    pub(super) fn name(&self) -> &str {
        match self {
            Selection::Model(route) => &route.name,
            Selection::Route(plan) => &plan.name,
        }
    }

    /// A plain model or a route, as the rules of the tries tell them apart.
    pub(super) fn kind(&self) -> SelectionKind {
        match self {
            Selection::Model(_) => SelectionKind::Model,
            Selection::Route(_) => SelectionKind::Route,
        }
    }

    /// Route target `index`, for a route's try.
    pub(super) fn target(&self, index: Option<usize>) -> Option<&PlannedTarget> {
        match (self, index) {
            (Selection::Route(plan), Some(index)) => plan.targets.get(index),
            _ => None,
        }
    }
}

/// A plain model or a route: what the rules of the tries depend on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SelectionKind {
    Model,
    Route,
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
        within_clusters: None,
        cluster_id: None,
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

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
}
