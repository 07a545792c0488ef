//! The response body the gateway hands to the client: the backend's body, passed on
//! frame by frame as it arrives (nothing is held back to batch it), observed on the
//! way for the `usage` object, and accounted for when it is dropped.
//!
//! - JSON responses: the chunks are kept by reference (no copy) while the body is
//!   small, and only the last [`JSON_TAIL_BYTES`] of a large one; at the end the last
//!   `"usage"` key is parsed from them. OpenAI-style servers put `usage` last.
//! - Server-sent events: each `data:` line that mentions `"usage"` is parsed as it
//!   passes. When the gateway itself asked for usage (the client did not), the
//!   usage-only chunk (`"choices": []` plus `usage`) is removed; for that, and to set
//!   each event's `model` to the public name, an event split across two reads is held
//!   until its end arrives (it is of no use to the client before that anyway), and
//!   everything else is passed on unchanged.
//! - The answer's `model` is the name the client asked for (`answer_name.rs`): a JSON
//!   body whole in hand when its head arrived is renamed at once (its new length goes
//!   in the head), one still arriving is held until its `model` field has passed (and
//!   goes out chunked).
//!
//! The body reads the connection it arrives on itself (see `upstream.rs`). Dropping
//! the body — the response ended, or the client went away — releases the in-flight
//! counts, records latency, status and tokens, books usage, and returns the connection
//! to the instance's pool; a body dropped before its end closes the connection, which
//! cancels the backend's work.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use axum::http::HeaderValue;
use bytes::{Bytes, BytesMut};
use hyper::body::{Body, Frame, SizeHint};
use memchr::memmem;
use serde::de::IgnoredAny;
use serde::Deserialize;
use tokio::time::Instant;

use crate::answer_name::{self, JsonRename};
use crate::limits::KeyWindow;
use crate::metrics::{ErrorKind, InFlight, ModelMetrics, TargetMetrics};
use crate::model_routes::RoutePlan;
use crate::routing::{InFlightGuard, ModelRoute};
use crate::upstream::{RequestError, UpstreamConnection};
use crate::usage::{Caller, TokenUsage, UsageAggregator};

/// A JSON body up to this size is kept whole for the usage scan.
pub const JSON_KEEP_WHOLE_BYTES: usize = 1024 * 1024;
/// Of a larger JSON body, at least this much of its end is kept.
pub const JSON_TAIL_BYTES: usize = 64 * 1024;
/// An SSE event (or line) longer than this is passed on without inspection.
pub const SSE_MAX_PENDING_BYTES: usize = 1024 * 1024;

/// How the body is observed.
#[derive(Debug)]
pub enum Inspector {
    /// Not at all (an error response).
    None,
    /// A JSON body; renamed as it arrives when it was not whole in hand at its head.
    Json(JsonTail, Option<JsonRename>),
    Sse(SseScanner),
}

impl Inspector {
    /// A JSON body whose `model` is set to `public`.
    pub fn json_named(public: Arc<str>) -> Self {
        Self::Json(JsonTail::default(), Some(JsonRename::new(public)))
    }

    /// An event stream, its events' `model` set to `public`.
    pub fn sse(strip_usage_only_chunk: bool, public: Option<Arc<str>>) -> Self {
        Self::Sse(SseScanner {
            strip: strip_usage_only_chunk,
            rename: public,
            ..SseScanner::default()
        })
    }

    /// Whether the body passed on may differ from the backend's (its length with it).
    pub fn rewrites(&self) -> bool {
        match self {
            Self::None => false,
            Self::Json(_, rename) => rename.is_some(),
            Self::Sse(s) => s.edits(),
        }
    }

    /// Looks at a chunk; returns what to pass on (possibly empty).
    fn on_data(&mut self, data: Bytes) -> Bytes {
        match self {
            Self::None => data,
            Self::Json(tail, rename) => {
                let data = match rename {
                    Some(rename) => rename.on_data(data),
                    None => data,
                };
                if !data.is_empty() {
                    tail.push(data.clone());
                }
                data
            }
            Self::Sse(scanner) => scanner.on_data(data),
        }
    }

    /// The end of the backend's body: whatever was held back.
    fn finish(&mut self) -> Option<Bytes> {
        match self {
            Self::Sse(scanner) => scanner.finish(),
            Self::Json(tail, Some(rename)) => {
                let rest = rename.finish()?;
                tail.push(rest.clone());
                Some(rest)
            }
            _ => None,
        }
    }

    fn holds_back(&self) -> bool {
        match self {
            Self::None => false,
            Self::Json(_, rename) => rename.as_ref().is_some_and(JsonRename::holds_back),
            Self::Sse(s) => s.edits() && !s.pending.is_empty(),
        }
    }

    fn usage(&self) -> Option<TokenUsage> {
        match self {
            Self::None => None,
            Self::Json(tail, _) => tail.usage(),
            Self::Sse(scanner) => scanner.usage,
        }
    }
}

/// The end of a JSON body, kept by reference. Most answers arrive in one piece: that
/// one is kept on its own, and a queue is made only for a second.
#[derive(Debug, Default)]
pub struct JsonTail {
    first: Option<Bytes>,
    chunks: VecDeque<Bytes>,
    len: usize,
}

impl JsonTail {
    fn push(&mut self, data: Bytes) {
        self.len += data.len();
        if self.first.is_none() && self.chunks.is_empty() {
            self.first = Some(data);
            return;
        }
        if let Some(first) = self.first.take() {
            self.chunks.push_back(first);
        }
        self.chunks.push_back(data);
        if self.len > JSON_KEEP_WHOLE_BYTES {
            while let Some(front) = self.chunks.front() {
                if self.len - front.len() < JSON_TAIL_BYTES {
                    break;
                }
                self.len -= front.len();
                self.chunks.pop_front();
            }
        }
    }

    fn usage(&self) -> Option<TokenUsage> {
        if let Some(first) = &self.first {
            return find_usage(first);
        }
        match self.chunks.len() {
            0 => None,
            1 => find_usage(&self.chunks[0]),
            _ => {
                let mut whole = Vec::with_capacity(self.len);
                for chunk in &self.chunks {
                    whole.extend_from_slice(chunk);
                }
                find_usage(&whole)
            }
        }
    }
}

/// Parses the value of the last `"usage"` key in a JSON text, skipping `null`s and
/// values that are not a usage object.
pub fn find_usage(json: &[u8]) -> Option<TokenUsage> {
    // Built once: setting a finder up costs more than searching a small body.
    static FINDER: std::sync::LazyLock<memmem::FinderRev<'static>> =
        std::sync::LazyLock::new(|| memmem::FinderRev::new(b"\"usage\""));
    for at in FINDER.rfind_iter(json) {
        let rest = json[at + b"\"usage\"".len()..].trim_ascii_start();
        let Some(rest) = rest.strip_prefix(b":") else {
            continue;
        };
        let rest = rest.trim_ascii_start();
        if !rest.starts_with(b"{") {
            continue;
        }
        let mut deserializer = serde_json::Deserializer::from_slice(rest);
        if let Ok(usage) = TokenUsage::deserialize(&mut deserializer) {
            return Some(usage);
        }
    }
    None
}

/// What a streamed chunk says about usage.
#[derive(Debug, Deserialize)]
struct ChunkPeek {
    #[serde(default)]
    choices: Option<Vec<IgnoredAny>>,
    #[serde(default)]
    usage: Option<TokenUsage>,
}

/// Reads server-sent events as they pass.
#[derive(Debug, Default)]
pub struct SseScanner {
    /// Remove the usage-only chunk (the gateway asked for it, the client did not).
    strip: bool,
    /// Set each event's `model` to this (the public name).
    rename: Option<Arc<str>>,
    /// Strip mode: the start of an event whose end has not arrived. Observe mode: the
    /// start of a line whose end has not arrived.
    pending: BytesMut,
    /// Observe mode: the current line is too long to inspect; skip to its end.
    skipping_line: bool,
    /// The last usage seen.
    usage: Option<TokenUsage>,
}

fn trim_cr(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\r").unwrap_or(line)
}

impl SseScanner {
    /// Whether events are edited (held whole until their end), not only observed.
    fn edits(&self) -> bool {
        self.strip || self.rename.is_some()
    }

    fn on_data(&mut self, data: Bytes) -> Bytes {
        if self.edits() {
            self.edit_events(data)
        } else {
            self.observe_lines(&data);
            data
        }
    }

    /// Records usage from one line; true when the line is a usage-only chunk.
    fn inspect_line(&mut self, line: &[u8]) -> bool {
        let Some(payload) = trim_cr(line).strip_prefix(b"data:") else {
            return false;
        };
        static FINDER: std::sync::LazyLock<memmem::Finder<'static>> =
            std::sync::LazyLock::new(|| memmem::Finder::new(b"\"usage\""));
        if FINDER.find(payload).is_none() {
            return false;
        }
        let Ok(chunk) = serde_json::from_slice::<ChunkPeek>(payload.trim_ascii()) else {
            return false;
        };
        match chunk.usage {
            Some(usage) => {
                self.usage = Some(usage);
                chunk.choices.is_some_and(|c| c.is_empty())
            }
            None => false,
        }
    }

    fn observe_lines(&mut self, data: &[u8]) {
        let mut start = 0;
        if self.skipping_line || !self.pending.is_empty() {
            let Some(newline) = memchr::memchr(b'\n', data) else {
                if !self.skipping_line {
                    self.pending.extend_from_slice(data);
                    self.give_up_on_long_line();
                }
                return;
            };
            if !self.skipping_line {
                self.pending.extend_from_slice(&data[..newline]);
                let line = std::mem::take(&mut self.pending);
                self.inspect_line(&line);
            }
            self.skipping_line = false;
            start = newline + 1;
        }
        let base = start;
        for newline in memchr::memchr_iter(b'\n', &data[base..]) {
            let end = base + newline;
            let line = &data[start..end];
            self.inspect_line(line);
            start = end + 1;
        }
        self.pending.extend_from_slice(&data[start..]);
        self.give_up_on_long_line();
    }

    fn give_up_on_long_line(&mut self) {
        if self.pending.len() > SSE_MAX_PENDING_BYTES {
            self.pending.clear();
            self.skipping_line = true;
        }
    }

    /// Passes on the complete events in `data` (with what was held before it), the
    /// usage-only one cut out when stripping and each `model` renamed; the start of an
    /// unfinished event is held.
    fn edit_events(&mut self, data: Bytes) -> Bytes {
        let buffer = if self.pending.is_empty() {
            data
        } else {
            self.pending.extend_from_slice(&data);
            self.pending.split().freeze()
        };
        // Bytes [passed_until, event_start) are complete events to pass on, except for
        // the edits: a dropped event is cut out and a renamed `model` replaced, by copying
        // around them into `out` (made only when there is an edit).
        let mut out: Option<BytesMut> = None;
        let mut passed_until = 0;
        let mut event_start = 0;
        let mut line_start = 0;
        let mut usage_only = false;
        // The current event's `model` values to replace (one per data line, seldom more
        // than one line an event).
        let mut renames: Vec<std::ops::Range<usize>> = Vec::new();
        for newline in memchr::memchr_iter(b'\n', &buffer) {
            let line = &buffer[line_start..newline];
            if !trim_cr(line).is_empty() {
                let usage_chunk = self.inspect_line(line);
                usage_only |= self.strip && usage_chunk;
                if let Some(public) = &self.rename {
                    if let Some(span) = answer_name::sse_line_span(trim_cr(line), public) {
                        renames.push(line_start + span.start..line_start + span.end);
                    }
                }
                line_start = newline + 1;
                continue;
            }
            line_start = newline + 1;
            // A blank line ends an event.
            if usage_only {
                out.get_or_insert_with(BytesMut::new)
                    .extend_from_slice(&buffer[passed_until..event_start]);
                passed_until = line_start;
            } else if let Some(public) = &self.rename {
                for span in renames.iter() {
                    let out = out.get_or_insert_with(BytesMut::new);
                    out.extend_from_slice(&buffer[passed_until..span.start]);
                    out.extend_from_slice(&answer_name::json_characters(public));
                    passed_until = span.end;
                }
            }
            renames.clear();
            usage_only = false;
            event_start = line_start;
        }
        if event_start < buffer.len() {
            if buffer.len() - event_start > SSE_MAX_PENDING_BYTES {
                // Not an event stream we can edit; pass everything on from here.
                self.strip = false;
                self.rename = None;
                event_start = buffer.len();
            } else {
                self.pending.extend_from_slice(&buffer[event_start..]);
            }
        }
        match out {
            None => buffer.slice(passed_until..event_start),
            Some(mut out) => {
                out.extend_from_slice(&buffer[passed_until..event_start]);
                out.freeze()
            }
        }
    }

    /// The backend's stream ended; an unterminated last event is passed on as is.
    fn finish(&mut self) -> Option<Bytes> {
        if self.pending.is_empty() {
            return None;
        }
        let rest = self.pending.split().freeze();
        let rename = self.rename.take();
        let mut out: Option<BytesMut> = None;
        let (mut passed_until, mut line_start) = (0, 0);
        for line in rest.split(|b| *b == b'\n') {
            self.inspect_line(line);
            let span = rename.as_deref().and_then(|public| {
                Some((public, answer_name::sse_line_span(trim_cr(line), public)?))
            });
            if let Some((public, span)) = span {
                let out = out.get_or_insert_with(BytesMut::new);
                out.extend_from_slice(&rest[passed_until..line_start + span.start]);
                out.extend_from_slice(&answer_name::json_characters(public));
                passed_until = line_start + span.end;
            }
            line_start += line.len() + 1;
        }
        match out {
            None => Some(rest),
            Some(mut out) => {
                out.extend_from_slice(&rest[passed_until..]);
                Some(out.freeze())
            }
        }
    }
}

/// What answered a request: the names its usage is booked to, the counters it adds
/// to and the `x-gantry-target` it names.
#[derive(Debug)]
pub enum Answered {
    /// A deployed model (no route of its name), through its route: that holds the
    /// model's name, counters and header, so a request shares nothing else.
    Model(Arc<ModelRoute>),
    /// A defined route, through one of its targets (an index into `plan.targets`),
    /// which holds the label, counters and header.
    Route {
        plan: Arc<RoutePlan>,
        target: Option<usize>,
    },
}

impl Answered {
    /// The counters to add to. A model's are its route's, which the proxy looks up
    /// before it sends the route's first request (`Selection::metrics`), so they are
    /// always there for an answer.
    pub fn metrics(&self) -> Option<&ModelMetrics> {
        match self {
            Answered::Model(route) => route.metrics.get().map(|m| &**m),
            Answered::Route { plan, .. } => Some(&plan.metrics),
        }
    }

    /// The name the client sent.
    pub fn model(&self) -> &Arc<str> {
        match self {
            Answered::Model(route) => &route.name,
            Answered::Route { plan, .. } => &plan.name,
        }
    }

    /// What answered: the model itself, or the route target's label.
    pub fn target(&self) -> &Arc<str> {
        match self {
            Answered::Model(route) => &route.name,
            Answered::Route { plan, target } => {
                target.map_or(&plan.name, |i| &plan.targets[i].label)
            }
        }
    }

    fn target_metrics(&self) -> Option<&TargetMetrics> {
        match self {
            Answered::Model(_) => None,
            Answered::Route { plan, target } => target.map(|i| &*plan.targets[i].metrics),
        }
    }

    /// `x-gantry-target`, when it names something other than the backend.
    fn header(&self) -> Option<&HeaderValue> {
        match self {
            Answered::Model(route) => Some(&route.name_header),
            Answered::Route { plan, target } => target.map(|i| &plan.targets[i].header),
        }
    }
}

/// What is recorded when the response ends.
#[derive(Debug)]
pub struct Completion {
    pub answered: Answered,
    pub usage: Arc<UsageAggregator>,
    pub caller: Caller,
    /// The caller's key's window, when the key has a tokens-per-minute limit to count.
    pub key_window: Option<Arc<KeyWindow>>,
    pub status: u16,
    pub started: Instant,
    /// The instance (or provider) that answered, its in-flight count held.
    pub backend: InFlightGuard,
    /// Holds the gateway's count of requests in flight until the answer ends (its
    /// drop ends the request).
    pub _in_flight: InFlight,
}

impl Completion {
    /// `x-gantry-instance`: the instance (or provider) that answered.
    pub fn instance_header(&self) -> &HeaderValue {
        &self.backend.backend().header_value
    }

    /// `x-gantry-target`: the model, the route's target, else the backend.
    pub fn target_header(&self) -> &HeaderValue {
        self.answered
            .header()
            .unwrap_or_else(|| self.instance_header())
    }
}

/// The backend's body on its way to the client.
#[derive(Debug)]
pub struct ObservedBody {
    /// The connection the body arrives on; back to the instance's pool when the body
    /// ended, closed when it was abandoned.
    upstream: Option<UpstreamConnection>,
    inspector: Inspector,
    /// The body, renamed, when it was whole in hand with its head: passed on first.
    ready: Option<Bytes>,
    completion: Option<Completion>,
    ended: bool,
    failed: bool,
}

impl ObservedBody {
    /// The body of `upstream`'s answer. A JSON body to rename that is whole in hand is
    /// renamed here, so that its length is known for the head.
    pub fn new(
        mut upstream: UpstreamConnection,
        mut inspector: Inspector,
        completion: Completion,
    ) -> Self {
        let mut ready = None;
        if let Inspector::Json(_, rename) = &mut inspector {
            if let Some(public) = rename.as_ref().map(|r| Arc::clone(r.public_name())) {
                if let Some(body) = upstream.take_whole_body() {
                    ready = Some(answer_name::rename_json(body, &public));
                    *rename = None;
                }
            }
        }
        Self {
            upstream: Some(upstream),
            inspector,
            ready,
            completion: Some(completion),
            ended: false,
            failed: false,
        }
    }

    /// What is recorded when the body ends (there until then).
    pub fn completion(&self) -> Option<&Completion> {
        self.completion.as_ref()
    }

    /// Hands the answer head's list of header positions back to the connection once
    /// the head is written (the next response on it is parsed into it).
    pub fn recycle_headers(&mut self, headers: Vec<crate::h1::HeaderAt>) {
        if let Some(upstream) = &mut self.upstream {
            upstream.recycle_headers(headers);
        }
    }

    /// The next piece to pass on, `None` at the end.
    pub fn poll_chunk(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, RequestError>>> {
        if self.ended {
            return Poll::Ready(None);
        }
        if let Some(ready) = self.ready.take() {
            return Poll::Ready(Some(Ok(self.inspector.on_data(ready))));
        }
        let Some(upstream) = self.upstream.as_mut() else {
            return Poll::Ready(None);
        };
        loop {
            match ready!(upstream.poll_body(cx)) {
                None => {
                    self.ended = true;
                    return Poll::Ready(self.inspector.finish().map(Ok));
                }
                Some(Err(e)) => {
                    self.failed = true;
                    self.ended = true;
                    return Poll::Ready(Some(Err(e)));
                }
                Some(Ok(data)) => {
                    let out = self.inspector.on_data(data);
                    if !out.is_empty() {
                        return Poll::Ready(Some(Ok(out)));
                    }
                    // Everything was held back or cut out: read on.
                }
            }
        }
    }

    /// The length of what is passed on, when it is known before it is read: the
    /// backend's own, unless the body is rewritten.
    pub fn known_length(&self) -> Option<u64> {
        if self.inspector.rewrites() {
            return None;
        }
        let ready = self.ready.as_ref().map_or(0, |r| r.len() as u64);
        self.upstream
            .as_ref()
            .and_then(|u| u.body_remaining())
            .map(|n| n + ready)
    }

    fn backend_done(&self) -> bool {
        self.upstream.as_ref().is_some_and(|u| u.body_done())
    }
}

impl Body for ObservedBody {
    type Data = Bytes;
    type Error = RequestError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, RequestError>>> {
        self.get_mut()
            .poll_chunk(cx)
            .map(|chunk| chunk.map(|data| data.map(Frame::data)))
    }

    fn is_end_stream(&self) -> bool {
        self.ended || (self.ready.is_none() && self.backend_done() && !self.inspector.holds_back())
    }

    fn size_hint(&self) -> SizeHint {
        match self.known_length() {
            Some(n) => SizeHint::with_exact(n),
            None => SizeHint::default(),
        }
    }
}

impl Drop for ObservedBody {
    fn drop(&mut self) {
        let Some(completion) = self.completion.take() else {
            return;
        };
        let completed = !self.failed && (self.ended || self.backend_done());
        // One reading of the clock for the request's latency and the connection's
        // idle time.
        let now = Instant::now();
        if let Some(upstream) = self.upstream.take() {
            if completed {
                completion.backend.backend().give_back(upstream, now);
            }
            // Otherwise dropped here: closing the connection cancels the backend's work.
        }
        let usage = if completed || matches!(self.inspector, Inspector::Sse(_)) {
            self.inspector.usage()
        } else {
            None
        };
        if let Some(metrics) = completion.answered.metrics() {
            if self.failed {
                metrics.count_error(ErrorKind::UpstreamBody);
            } else if !completed {
                metrics.count_error(ErrorKind::ClientDisconnected);
            }
            metrics.observe_request(
                completion.status,
                now.saturating_duration_since(completion.started),
            );
            if let Some(usage) = usage {
                metrics.count_tokens(usage.prompt_tokens, usage.completion_tokens);
            }
        }
        if let (Some(usage), Some(window)) = (usage, &completion.key_window) {
            window.add_tokens(usage.total());
        }
        if let Some(target) = completion.answered.target_metrics() {
            target.answered.fetch_add(1, Ordering::Relaxed);
            if let Some(usage) = usage {
                target
                    .prompt_tokens
                    .fetch_add(usage.prompt_tokens, Ordering::Relaxed);
                target
                    .completion_tokens
                    .fetch_add(usage.completion_tokens, Ordering::Relaxed);
            }
        }
        if (200..300).contains(&completion.status) {
            completion.usage.record(
                &completion.caller,
                completion.answered.model(),
                completion.answered.target(),
                usage,
            );
        }
        // The in-flight guards in `completion` are released here.
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn usage(prompt: u64, completion: u64, total: u64) -> TokenUsage {
        TokenUsage {
            prompt_tokens: prompt,
            completion_tokens: completion,
            total_tokens: total,
        }
    }

    #[test]
    fn find_usage_reads_the_last_usage_object() {
        let body = br#"{"choices":[{"message":{"content":"say \"usage\": 5"}}],"usage": {"prompt_tokens":7,"completion_tokens":3,"total_tokens":10,"prompt_tokens_details":{"cached_tokens":0}},"id":"x"}"#;
        assert_eq!(find_usage(body), Some(usage(7, 3, 10)));
        assert_eq!(find_usage(br#"{"usage":null}"#), None);
        assert_eq!(find_usage(br#"{"a":1}"#), None);
    }

    #[test]
    fn json_tail_reads_usage_from_one_piece_or_across_pieces() {
        let body: &[u8] =
            br#"{"id":"x","usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10}}"#;
        let mut whole = JsonTail::default();
        assert_eq!(whole.usage(), None);
        whole.push(Bytes::copy_from_slice(body));
        assert!(whole.chunks.is_empty(), "one piece needs no queue");
        assert_eq!(whole.usage(), Some(usage(7, 3, 10)));

        for cut in [1, 20, 40, body.len() - 1] {
            let mut split = JsonTail::default();
            split.push(Bytes::copy_from_slice(&body[..cut]));
            split.push(Bytes::copy_from_slice(&body[cut..]));
            assert_eq!(split.usage(), Some(usage(7, 3, 10)), "cut at {cut}");
            assert_eq!(split.len, body.len());
        }
    }

    #[test]
    fn json_tail_keeps_the_end_of_a_large_body() {
        let mut tail = JsonTail::default();
        let filler = Bytes::from(vec![b' '; 256 * 1024]);
        tail.push(Bytes::from_static(b"{\"data\":\""));
        for _ in 0..8 {
            tail.push(filler.clone());
        }
        tail.push(Bytes::from_static(
            br#"","usage":{"prompt_tokens":4,"total_tokens":4}}"#,
        ));
        assert!(tail.len <= JSON_TAIL_BYTES + 256 * 1024 + 64);
        assert_eq!(tail.usage(), Some(usage(4, 0, 4)));
    }

    const CONTENT: &str = "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n";
    const FINISH: &str =
        "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":null}\n\n";
    const USAGE_ONLY: &str = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2,\"total_tokens\":7}}\n\n";
    const DONE: &str = "data: [DONE]\n\n";

    fn run(scanner: &mut SseScanner, chunks: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        for chunk in chunks {
            out.extend_from_slice(&scanner.on_data(Bytes::copy_from_slice(chunk)));
        }
        if let Some(rest) = scanner.finish() {
            out.extend_from_slice(&rest);
        }
        out
    }

    #[test]
    fn sse_strip_removes_only_the_usage_only_chunk_and_records_its_usage() {
        let stream = format!("{CONTENT}{CONTENT}{FINISH}{USAGE_ONLY}{DONE}");
        let expected = format!("{CONTENT}{CONTENT}{FINISH}{DONE}");
        // Every way of splitting the stream in two and three reads gives the same.
        let bytes = stream.as_bytes();
        for cut in 0..=bytes.len() {
            let mut scanner = SseScanner {
                strip: true,
                ..Default::default()
            };
            let out = run(&mut scanner, &[&bytes[..cut], &bytes[cut..]]);
            assert_eq!(String::from_utf8(out).unwrap(), expected, "cut at {cut}");
            assert_eq!(scanner.usage, Some(usage(5, 2, 7)));
        }
        for cut in (0..bytes.len()).step_by(7) {
            let second = (cut + 13).min(bytes.len());
            let mut scanner = SseScanner {
                strip: true,
                ..Default::default()
            };
            let out = run(
                &mut scanner,
                &[&bytes[..cut], &bytes[cut..second], &bytes[second..]],
            );
            assert_eq!(String::from_utf8(out).unwrap(), expected);
        }
    }

    #[test]
    fn sse_events_name_the_public_model_however_the_stream_is_cut() {
        let named = |model: &str| {
            format!(
                "data: {{\"model\":\"{model}\",\"choices\":[{{\"delta\":{{\"content\":\"hi\"}}}}]}}\n\n"
            )
        };
        let usage_only = format!(
            "data: {{\"model\":\"/m.gguf\",{}",
            &USAGE_ONLY["data: {".len()..]
        );
        let unterminated = "data: {\"model\":\"/m.gguf\"}";
        let stream = format!(
            "{}{}{usage_only}{DONE}{unterminated}",
            named("/m.gguf"),
            named("/m.gguf")
        );
        let bytes = stream.as_bytes();
        for strip in [false, true] {
            let expected = format!(
                "{}{}{}{DONE}data: {{\"model\":\"public\"}}",
                named("public"),
                named("public"),
                if strip {
                    String::new()
                } else {
                    usage_only.replace("/m.gguf", "public")
                }
            );
            for cut in 0..=bytes.len() {
                let mut scanner = SseScanner {
                    strip,
                    rename: Some(Arc::from("public")),
                    ..Default::default()
                };
                let out = run(&mut scanner, &[&bytes[..cut], &bytes[cut..]]);
                assert_eq!(
                    String::from_utf8(out).unwrap(),
                    expected,
                    "strip {strip}, cut at {cut}"
                );
                assert_eq!(scanner.usage, Some(usage(5, 2, 7)));
            }
        }
        // Events that already name it pass through without a copy.
        let mut scanner = SseScanner {
            rename: Some(Arc::from("public")),
            ..Default::default()
        };
        let chunk = Bytes::from(named("public"));
        assert_eq!(scanner.on_data(chunk.clone()).as_ptr(), chunk.as_ptr());
        // With CRLF line ends too.
        let mut scanner = SseScanner {
            rename: Some(Arc::from("public")),
            ..Default::default()
        };
        let crlf = named("/m.gguf").replace('\n', "\r\n");
        let out = run(&mut scanner, &[crlf.as_bytes()]);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            named("public").replace('\n', "\r\n")
        );
    }

    #[test]
    fn sse_strip_passes_whole_events_through_without_copying() {
        let mut scanner = SseScanner {
            strip: true,
            ..Default::default()
        };
        let chunk = Bytes::from(CONTENT);
        let out = scanner.on_data(chunk.clone());
        assert_eq!(out.as_ptr(), chunk.as_ptr());
        assert_eq!(out.len(), chunk.len());
    }

    #[test]
    fn sse_observe_passes_everything_and_records_usage_split_anywhere() {
        let stream = format!("{CONTENT}{FINISH}{USAGE_ONLY}{DONE}").replace("\n", "\r\n");
        let bytes = stream.as_bytes();
        for cut in 0..=bytes.len() {
            let mut scanner = SseScanner::default();
            let out = run(&mut scanner, &[&bytes[..cut], &bytes[cut..]]);
            assert_eq!(out, bytes);
            assert_eq!(scanner.usage, Some(usage(5, 2, 7)), "cut at {cut}");
        }
    }

    #[test]
    fn sse_usage_on_a_chunk_with_choices_is_recorded_but_kept() {
        let last = "data: {\"choices\":[{\"text\":\"x\",\"finish_reason\":\"length\"}],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":8,\"total_tokens\":11}}\n\n";
        let stream = format!("{last}{DONE}");
        let mut scanner = SseScanner {
            strip: true,
            ..Default::default()
        };
        let out = run(&mut scanner, &[stream.as_bytes()]);
        assert_eq!(out, stream.as_bytes());
        assert_eq!(scanner.usage, Some(usage(3, 8, 11)));
    }
}
