//! Counters of the gateway and the Prometheus text exposition of `/metrics`.
//!
//! Everything a request touches is an atomic in a per-model [`ModelMetrics`] that the
//! request holds an `Arc` to, so counting costs no lock on the hot path, and each
//! thread adds to its own shard of them (`shard.rs`), so counting moves no cache line
//! between CPUs. The cluster
//! gauges (instances and workers by state, the scheduler queue) are read from the
//! store at scrape time with two grouped counts.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use gantry_types::{InstanceState, WorkerState};

use crate::routing::{Backend, RoutingTable};
use crate::shard::Sharded;

/// Upper bounds (seconds) of the latency histogram's buckets.
pub const LATENCY_BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

/// Why a gateway request (or one try of it) failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// Connecting to an instance failed.
    UpstreamConnect,
    /// An instance failed before answering (connection closed, protocol error).
    UpstreamRequest,
    /// An instance answered 502 or 503.
    UpstreamUnavailable,
    /// The response body broke off after it had started.
    UpstreamBody,
    /// An instance sent no response head within `gateway_first_byte_timeout`.
    UpstreamTimeout,
    /// The routing table dropped an instance while a try waited for its response head
    /// (the try went elsewhere).
    InstanceLeftRouting,
    /// The model has no running instance.
    NoRunningInstance,
    /// Every try failed; the client got a 502.
    AllTriesFailed,
    /// The client went away before the response ended.
    ClientDisconnected,
}

impl ErrorKind {
    const ALL: [ErrorKind; 9] = [
        ErrorKind::UpstreamConnect,
        ErrorKind::UpstreamRequest,
        ErrorKind::UpstreamUnavailable,
        ErrorKind::UpstreamBody,
        ErrorKind::UpstreamTimeout,
        ErrorKind::InstanceLeftRouting,
        ErrorKind::NoRunningInstance,
        ErrorKind::AllTriesFailed,
        ErrorKind::ClientDisconnected,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::UpstreamConnect => "upstream_connect",
            ErrorKind::UpstreamRequest => "upstream_request",
            ErrorKind::UpstreamUnavailable => "upstream_unavailable",
            ErrorKind::UpstreamBody => "upstream_body",
            ErrorKind::UpstreamTimeout => "upstream_timeout",
            ErrorKind::InstanceLeftRouting => "instance_left_routing",
            ErrorKind::NoRunningInstance => "no_running_instance",
            ErrorKind::AllTriesFailed => "all_tries_failed",
            ErrorKind::ClientDisconnected => "client_disconnected",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Status codes 100..=599 get a counter each; anything else counts as 599.
const CODES: usize = 500;

/// One shard's counters of a model (see [`ModelMetrics`]).
#[derive(Debug)]
struct Counters {
    requests_by_code: Box<[AtomicU64]>,
    errors: [AtomicU64; ErrorKind::ALL.len()],
    latency_buckets: [AtomicU64; LATENCY_BUCKETS.len()],
    latency_count: AtomicU64,
    latency_sum_micros: AtomicU64,
    prompt_tokens: AtomicU64,
    completion_tokens: AtomicU64,
}

impl Default for Counters {
    fn default() -> Self {
        Self {
            requests_by_code: (0..CODES).map(|_| AtomicU64::new(0)).collect(),
            errors: Default::default(),
            latency_buckets: Default::default(),
            latency_count: AtomicU64::new(0),
            latency_sum_micros: AtomicU64::new(0),
            prompt_tokens: AtomicU64::new(0),
            completion_tokens: AtomicU64::new(0),
        }
    }
}

/// The counters of one model (or of requests that named no known model), one copy per
/// shard (`shard.rs`): every request adds to its thread's, a scrape sums them.
#[derive(Debug, Default)]
pub struct ModelMetrics {
    shards: Sharded<Counters>,
}

impl ModelMetrics {
    /// Counts a finished request: its status and how long it took.
    pub fn observe_request(&self, status: u16, elapsed: Duration) {
        let counters = self.shards.local();
        let index = usize::from(status.clamp(100, 599) - 100);
        counters.requests_by_code[index].fetch_add(1, Ordering::Relaxed);
        let seconds = elapsed.as_secs_f64();
        if let Some(bucket) = LATENCY_BUCKETS.iter().position(|le| seconds <= *le) {
            counters.latency_buckets[bucket].fetch_add(1, Ordering::Relaxed);
        }
        counters.latency_count.fetch_add(1, Ordering::Relaxed);
        let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        counters
            .latency_sum_micros
            .fetch_add(micros, Ordering::Relaxed);
    }

    pub fn count_error(&self, kind: ErrorKind) {
        self.shards.local().errors[kind.index()].fetch_add(1, Ordering::Relaxed);
    }

    pub fn count_tokens(&self, prompt: u64, completion: u64) {
        let counters = self.shards.local();
        counters.prompt_tokens.fetch_add(prompt, Ordering::Relaxed);
        counters
            .completion_tokens
            .fetch_add(completion, Ordering::Relaxed);
    }

    /// A counter summed over the shards.
    fn sum(&self, counter: impl Fn(&Counters) -> &AtomicU64) -> u64 {
        self.shards
            .iter()
            .map(|counters| counter(counters).load(Ordering::Relaxed))
            .sum()
    }

    fn requests(&self, code_index: usize) -> u64 {
        self.sum(|c| &c.requests_by_code[code_index])
    }

    pub(crate) fn errors(&self, kind: ErrorKind) -> u64 {
        self.sum(|c| &c.errors[kind.index()])
    }

    fn latency_bucket(&self, bucket: usize) -> u64 {
        self.sum(|c| &c.latency_buckets[bucket])
    }

    fn latency_count(&self) -> u64 {
        self.sum(|c| &c.latency_count)
    }

    fn latency_sum_micros(&self) -> u64 {
        self.sum(|c| &c.latency_sum_micros)
    }

    fn prompt_tokens(&self) -> u64 {
        self.sum(|c| &c.prompt_tokens)
    }

    fn completion_tokens(&self) -> u64 {
        self.sum(|c| &c.completion_tokens)
    }
}

/// The counters of one target of one route: which target answered how many requests,
/// with the tokens it reported (a provider's own count, for a provider's model).
#[derive(Debug, Default)]
pub struct TargetMetrics {
    /// Requests the target answered (any status), and those that fell through from it
    /// to another target.
    pub answered: AtomicU64,
    pub fell_through: AtomicU64,
    pub prompt_tokens: AtomicU64,
    pub completion_tokens: AtomicU64,
}

/// A route's name and one of its targets' labels.
type RouteTargetKey = (Arc<str>, Arc<str>);

/// Every counter of the gateway.
#[derive(Debug, Default)]
pub struct Metrics {
    by_model: RwLock<HashMap<Arc<str>, Arc<ModelMetrics>>>,
    /// Per (route, target) of defined routes; plain models are their own target and
    /// count in `by_model` only.
    by_target: RwLock<HashMap<RouteTargetKey, Arc<TargetMetrics>>>,
    /// Requests that named no known model (bad requests, unknown models, no key).
    unrouted: Arc<ModelMetrics>,
    /// Requests begun and ended, per shard: a request may end on another thread than
    /// it began on, so one shard's difference means nothing, the sums' does.
    in_flight: Sharded<InFlightCounts>,
}

#[derive(Debug, Default)]
struct InFlightCounts {
    begun: AtomicU64,
    ended: AtomicU64,
}

/// Holds one request in the gateway's in-flight gauge.
#[derive(Debug)]
pub struct InFlight(Arc<Metrics>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0
            .in_flight
            .local()
            .ended
            // Release: a scrape that sees this end sees the request's begin too.
            .fetch_add(1, Ordering::Release);
    }
}

impl Metrics {
    /// The counters of a model that exists (routable, or known to the store). Only
    /// such names become labels, so clients cannot grow the label set at will.
    pub fn model(&self, name: &str) -> Arc<ModelMetrics> {
        if let Some(metrics) = self
            .by_model
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
        {
            return Arc::clone(metrics);
        }
        let mut by_model = self.by_model.write().unwrap_or_else(|e| e.into_inner());
        Arc::clone(by_model.entry(Arc::from(name)).or_default())
    }

    /// The counters of one target of a route (made once per route rebuild, not per
    /// request).
    pub fn target(&self, route: &str, target: &str) -> Arc<TargetMetrics> {
        let mut by_target = self.by_target.write().unwrap_or_else(|e| e.into_inner());
        Arc::clone(
            by_target
                .entry((Arc::from(route), Arc::from(target)))
                .or_default(),
        )
    }

    /// The counters of requests that named no known model.
    pub fn unrouted(&self) -> &Arc<ModelMetrics> {
        &self.unrouted
    }

    /// Counts a request in flight until the guard is dropped.
    pub fn start_request(self: &Arc<Self>) -> InFlight {
        self.in_flight.local().begun.fetch_add(1, Ordering::Relaxed);
        InFlight(Arc::clone(self))
    }

    pub fn in_flight(&self) -> i64 {
        // Ended first: a request that ends between the two reads is then counted as
        // still in flight rather than as ended before it began.
        let ended: u64 = self
            .in_flight
            .iter()
            .map(|c| c.ended.load(Ordering::Acquire))
            .sum();
        let begun: u64 = self
            .in_flight
            .iter()
            .map(|c| c.begun.load(Ordering::Acquire))
            .sum();
        i64::try_from(begun.wrapping_sub(ended)).unwrap_or(0)
    }
}

/// What the store said about the cluster at scrape time.
#[derive(Debug, Default)]
pub struct ClusterCounts {
    pub instances: Option<Vec<(InstanceState, u64)>>,
    pub workers: Option<Vec<(WorkerState, u64)>>,
    /// This process's count of placement records that did not decode.
    pub undecodable_placement_records: u64,
    /// This process's fenced (leader- or lock-only) writes.
    pub fenced_writes: Option<gantry_store::FencedWrites>,
}

const INSTANCE_STATES: [InstanceState; 10] = [
    InstanceState::Pending,
    InstanceState::Analyzing,
    InstanceState::Scheduled,
    InstanceState::Installing,
    InstanceState::Downloading,
    InstanceState::Starting,
    InstanceState::Running,
    InstanceState::Unhealthy,
    InstanceState::Error,
    InstanceState::Unreachable,
];

const WORKER_STATES: [WorkerState; 4] = [
    WorkerState::Ready,
    WorkerState::NotReady,
    WorkerState::Unreachable,
    WorkerState::Maintenance,
];

/// A label value with `\`, `"` and newlines escaped, as the text format requires.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// The Prometheus text exposition (version 0.0.4) of the gateway and cluster.
pub fn render(
    metrics: &Metrics,
    routes: &RoutingTable,
    usage_dropped: u64,
    cluster: &ClusterCounts,
) -> String {
    let mut models: Vec<(String, Arc<ModelMetrics>)> = metrics
        .by_model
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .map(|(name, m)| (escape(name), Arc::clone(m)))
        .collect();
    models.sort_by(|a, b| a.0.cmp(&b.0));
    models.push((String::new(), Arc::clone(&metrics.unrouted)));
    // Writing to a String cannot fail; the results of write! are ignored below.
    let mut out = String::with_capacity(4096);

    header(
        &mut out,
        "gantry_gateway_requests_total",
        "counter",
        "Gateway requests by model and response status code (model is empty when the request named no known model).",
    );
    for (model, m) in &models {
        for index in 0..CODES {
            let n = m.requests(index);
            if n > 0 {
                let _ = writeln!(
                    out,
                    "gantry_gateway_requests_total{{model=\"{model}\",code=\"{}\"}} {n}",
                    index + 100
                );
            }
        }
    }

    header(
        &mut out,
        "gantry_gateway_errors_total",
        "counter",
        "Gateway failures by model and kind (failed tries are counted even when a retry succeeded).",
    );
    for (model, m) in &models {
        for kind in ErrorKind::ALL {
            let n = m.errors(kind);
            if n > 0 {
                let _ = writeln!(
                    out,
                    "gantry_gateway_errors_total{{model=\"{model}\",kind=\"{}\"}} {n}",
                    kind.as_str()
                );
            }
        }
    }

    header(
        &mut out,
        "gantry_gateway_request_duration_seconds",
        "histogram",
        "Time from receiving a gateway request to the end of its response, by model.",
    );
    for (model, m) in &models {
        let count = m.latency_count();
        if count == 0 {
            continue;
        }
        let mut cumulative = 0;
        for (bucket, le) in LATENCY_BUCKETS.iter().enumerate() {
            cumulative += m.latency_bucket(bucket);
            let _ = writeln!(
                out,
                "gantry_gateway_request_duration_seconds_bucket{{model=\"{model}\",le=\"{le}\"}} {cumulative}"
            );
        }
        let _ = writeln!(
            out,
            "gantry_gateway_request_duration_seconds_bucket{{model=\"{model}\",le=\"+Inf\"}} {count}"
        );
        let sum = m.latency_sum_micros() as f64 / 1e6;
        let _ = writeln!(
            out,
            "gantry_gateway_request_duration_seconds_sum{{model=\"{model}\"}} {sum}"
        );
        let _ = writeln!(
            out,
            "gantry_gateway_request_duration_seconds_count{{model=\"{model}\"}} {count}"
        );
    }

    for (name, help, pick) in [
        (
            "gantry_gateway_prompt_tokens_total",
            "Prompt tokens reported by backends, by model.",
            ModelMetrics::prompt_tokens as fn(&ModelMetrics) -> u64,
        ),
        (
            "gantry_gateway_completion_tokens_total",
            "Completion tokens reported by backends, by model.",
            ModelMetrics::completion_tokens,
        ),
    ] {
        header(&mut out, name, "counter", help);
        for (model, m) in models.iter().filter(|(model, _)| !model.is_empty()) {
            let _ = writeln!(out, "{name}{{model=\"{model}\"}} {}", pick(m));
        }
    }

    let mut targets: Vec<((String, String), Arc<TargetMetrics>)> = metrics
        .by_target
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .map(|((route, target), m)| ((escape(route), escape(target)), Arc::clone(m)))
        .collect();
    targets.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, help, pick) in [
        (
            "gantry_gateway_target_requests_total",
            "Requests of a model route answered by each of its targets (model: the route).",
            (|m: &TargetMetrics| m.answered.load(Ordering::Relaxed)) as fn(&TargetMetrics) -> u64,
        ),
        (
            "gantry_gateway_target_fallthroughs_total",
            "Tries of a model route's target that failed before the first byte and went on to another target.",
            |m: &TargetMetrics| m.fell_through.load(Ordering::Relaxed),
        ),
        (
            "gantry_gateway_target_prompt_tokens_total",
            "Prompt tokens reported by each target of a model route (a provider's own count).",
            |m: &TargetMetrics| m.prompt_tokens.load(Ordering::Relaxed),
        ),
        (
            "gantry_gateway_target_completion_tokens_total",
            "Completion tokens reported by each target of a model route.",
            |m: &TargetMetrics| m.completion_tokens.load(Ordering::Relaxed),
        ),
    ] {
        header(&mut out, name, "counter", help);
        for ((route, target), m) in &targets {
            let _ = writeln!(
                out,
                "{name}{{model=\"{route}\",target=\"{target}\"}} {}",
                pick(m)
            );
        }
    }

    header(
        &mut out,
        "gantry_gateway_requests_in_flight",
        "gauge",
        "Gateway requests being served now.",
    );
    let _ = writeln!(
        out,
        "gantry_gateway_requests_in_flight {}",
        metrics.in_flight()
    );

    let routes = routes.all();
    for (name, kind, help, pick) in [
        (
            "gantry_gateway_instance_requests_in_flight",
            "gauge",
            "Requests being proxied to each routable instance now.",
            (|b: &Backend| b.in_flight()) as fn(&Backend) -> u64,
        ),
        (
            "gantry_gateway_instance_connections_opened_total",
            "counter",
            "Connections the gateway opened to each routable instance (keep-alive reuse keeps it low).",
            |b: &Backend| b.connections_opened(),
        ),
        (
            "gantry_gateway_instance_ejections_total",
            "counter",
            "Times each routable instance was ejected from routing after failures in a row (gateway_eject_after).",
            |b: &Backend| b.ejections(),
        ),
        (
            "gantry_gateway_instance_ejected",
            "gauge",
            "Whether each routable instance is ejected now (1) or routed to (0).",
            |b: &Backend| u64::from(b.is_ejected()),
        ),
    ] {
        header(&mut out, name, kind, help);
        // `model_instance`, not `instance`: Prometheus gives every scraped series an
        // `instance` label of its own (the scraped server) and would rename ours.
        for route in &routes {
            for backend in &route.backends {
                let _ = writeln!(
                    out,
                    "{name}{{model=\"{}\",model_instance=\"{}\"}} {}",
                    escape(&route.name),
                    escape(&backend.instance_name),
                    pick(backend)
                );
            }
        }
    }
    header(
        &mut out,
        "gantry_gateway_routable_instances",
        "gauge",
        "Running instances the gateway routes to, by model.",
    );
    for route in &routes {
        let _ = writeln!(
            out,
            "gantry_gateway_routable_instances{{model=\"{}\"}} {}",
            escape(&route.name),
            route.backends.len()
        );
    }

    if let Some(instances) = &cluster.instances {
        let count = |state: InstanceState| {
            instances
                .iter()
                .filter(|(s, _)| *s == state)
                .map(|(_, n)| *n)
                .sum::<u64>()
        };
        header(
            &mut out,
            "gantry_instances",
            "gauge",
            "Model instances by state.",
        );
        for state in INSTANCE_STATES {
            let _ = writeln!(
                out,
                "gantry_instances{{state=\"{}\"}} {}",
                state.as_str(),
                count(state)
            );
        }
        header(
            &mut out,
            "gantry_scheduler_queue_length",
            "gauge",
            "Instances waiting for placement (pending or analyzing).",
        );
        let _ = writeln!(
            out,
            "gantry_scheduler_queue_length {}",
            count(InstanceState::Pending) + count(InstanceState::Analyzing)
        );
    }
    if let Some(workers) = &cluster.workers {
        header(&mut out, "gantry_workers", "gauge", "Workers by state.");
        for state in WORKER_STATES {
            let n: u64 = workers
                .iter()
                .filter(|(s, _)| *s == state)
                .map(|(_, n)| *n)
                .sum();
            let _ = writeln!(out, "gantry_workers{{state=\"{}\"}} {n}", state.as_str());
        }
    }
    header(
        &mut out,
        "gantry_store_undecodable_placement_records_total",
        "counter",
        "Reads of a stored placement record that did not decode (its instance keeps its GPUs booked; see the server log).",
    );
    let _ = writeln!(
        out,
        "gantry_store_undecodable_placement_records_total {}",
        cluster.undecodable_placement_records
    );
    if let Some(fenced) = cluster.fenced_writes {
        header(
            &mut out,
            "gantry_leader_writes_total",
            "counter",
            "Leader-only writes of this server (carrying its fencing token): applied, or refused because another server holds the lease now.",
        );
        let _ = writeln!(
            out,
            "gantry_leader_writes_total{{result=\"applied\"}} {}",
            fenced.applied
        );
        let _ = writeln!(
            out,
            "gantry_leader_writes_total{{result=\"rejected\"}} {}",
            fenced.rejected
        );
        header(
            &mut out,
            "gantry_leader_write_last_applied_start_timestamp_seconds",
            "gauge",
            "When the latest-sent leader-only write that landed was sent, in seconds since the epoch (0: none).",
        );
        let started_ms = fenced.last_applied_started_at.max(0);
        let _ = writeln!(
            out,
            "gantry_leader_write_last_applied_start_timestamp_seconds {}.{:03}",
            started_ms / 1000,
            started_ms % 1000
        );
    }
    header(
        &mut out,
        "gantry_gateway_usage_dropped_total",
        "counter",
        "Requests whose usage this server could not hold for the store (too many distinct callers and models pending while the database did not take them).",
    );
    let _ = writeln!(out, "gantry_gateway_usage_dropped_total {usage_dropped}");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_shows_counters_histogram_and_cluster_gauges() {
        let metrics = Metrics::default();
        let tiny = metrics.model("tiny");
        tiny.observe_request(200, Duration::from_millis(20));
        tiny.observe_request(200, Duration::from_millis(200));
        tiny.count_tokens(7, 3);
        tiny.count_error(ErrorKind::UpstreamConnect);
        metrics
            .unrouted()
            .observe_request(401, Duration::from_millis(1));
        let text = render(
            &metrics,
            &RoutingTable::default(),
            3,
            &ClusterCounts {
                instances: Some(vec![
                    (InstanceState::Pending, 2),
                    (InstanceState::Analyzing, 1),
                    (InstanceState::Running, 4),
                ]),
                workers: Some(vec![(WorkerState::Ready, 3)]),
                undecodable_placement_records: 2,
                fenced_writes: Some(gantry_store::FencedWrites {
                    applied: 5,
                    rejected: 1,
                    last_applied_started_at: 1_700_000_000_000,
                }),
            },
        );
        for line in [
            "gantry_gateway_requests_total{model=\"tiny\",code=\"200\"} 2",
            "gantry_gateway_usage_dropped_total 3",
            "gantry_store_undecodable_placement_records_total 2",
            "gantry_leader_writes_total{result=\"applied\"} 5",
            "gantry_leader_writes_total{result=\"rejected\"} 1",
            "gantry_leader_write_last_applied_start_timestamp_seconds 1700000000.000",
            "gantry_gateway_requests_total{model=\"\",code=\"401\"} 1",
            "gantry_gateway_errors_total{model=\"tiny\",kind=\"upstream_connect\"} 1",
            "gantry_gateway_request_duration_seconds_bucket{model=\"tiny\",le=\"0.025\"} 1",
            "gantry_gateway_request_duration_seconds_bucket{model=\"tiny\",le=\"0.25\"} 2",
            "gantry_gateway_request_duration_seconds_bucket{model=\"tiny\",le=\"+Inf\"} 2",
            "gantry_gateway_request_duration_seconds_count{model=\"tiny\"} 2",
            "gantry_gateway_prompt_tokens_total{model=\"tiny\"} 7",
            "gantry_gateway_completion_tokens_total{model=\"tiny\"} 3",
            "gantry_gateway_requests_in_flight 0",
            "gantry_instances{state=\"running\"} 4",
            "gantry_instances{state=\"error\"} 0",
            "gantry_scheduler_queue_length 3",
            "gantry_workers{state=\"ready\"} 3",
            "gantry_workers{state=\"unreachable\"} 0",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
        // Every sample line belongs to a family announced by a TYPE line.
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let name = line.split(['{', ' ']).next().unwrap_or_default();
            let family = name
                .trim_end_matches("_bucket")
                .trim_end_matches("_sum")
                .trim_end_matches("_count");
            assert!(
                text.contains(&format!("# TYPE {family} ")),
                "no TYPE for {name}"
            );
        }
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
