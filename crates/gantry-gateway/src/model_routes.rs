//! Model routes: a public model name → targets (deployed models, providers' models)
//! with weights and priorities. A request for a route goes to the targets of the lowest
//! priority number that are available, split by weight; a target that has no running
//! instance, or whose backends are all failing, ejected or already tried by this
//! request, is passed over, and the next priority is tried when a whole priority is.
//!
//! The table is rebuilt from the store (providers and routes are few) when a provider
//! or route changes, and every [`crate::routing::REFRESH_INTERVAL`]. Provider backends
//! are kept across rebuilds while their definition is unchanged, so their keep-alive
//! connections and ejection records survive. A name with no route is served by the
//! deployed model of that name (`routing/`): with no routes defined, a request pays one
//! atomic load here.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use axum::http::HeaderValue;
use gantry_auth::sealed::Sealer;
use gantry_store::{Change, StoreError};
use gantry_types::{ModelRoute as RouteDefinition, RouteTarget};
use tokio::sync::broadcast::error::RecvError;
use tokio::time::Instant;

use crate::metrics::{Metrics, ModelMetrics, TargetMetrics};
use crate::routing::{Backend, RoutingTable, REFRESH_INTERVAL};
use crate::store::GatewayStore;
use crate::GatewayContext;

/// The targets of a route a request has tried, bit `i` for target `i`.
pub(crate) type TargetMask = u64;

// A route may hold at most MAX_ROUTE_TARGETS targets; each must have a bit in the mask.
const _: () = assert!(
    gantry_types::route::MAX_ROUTE_TARGETS <= TargetMask::BITS as usize,
    "a route's targets must fit in the tried-targets mask"
);

/// One route, ready for requests.
#[derive(Debug)]
pub struct RoutePlan {
    pub name: Arc<str>,
    /// The route's creation time, Unix seconds (`/v1/models`).
    pub created: i64,
    /// By priority; within one, in the route's order.
    pub targets: Vec<PlannedTarget>,
    /// The route's counters (as a model's: by the name the client sent).
    pub metrics: Arc<ModelMetrics>,
    /// Counts picks: the weighted choice among the available targets follows it, so
    /// the split is exact over a run of requests (3:1 sends 3 of every 4 to the first).
    cursor: AtomicU64,
}

/// One target of a route.
#[derive(Debug)]
pub struct PlannedTarget {
    /// The model's name, or `provider/model`: usage, metrics and `x-gantry-target`.
    pub label: Arc<str>,
    pub header: HeaderValue,
    pub weight: u32,
    pub priority: u32,
    pub kind: TargetKind,
    pub metrics: Arc<TargetMetrics>,
}

#[derive(Debug)]
pub enum TargetKind {
    /// A model deployed on the cluster, by name.
    Local { model: Arc<str> },
    /// A provider's model; `backend` is `None` while the provider cannot be used (it
    /// was deleted, or its key does not open with this server's secret).
    Provider {
        backend: Option<Arc<Backend>>,
        model: Arc<str>,
    },
}

impl PlannedTarget {
    /// The `model` the target's backend is sent.
    pub fn upstream_model(&self) -> &str {
        match &self.kind {
            TargetKind::Local { model } | TargetKind::Provider { model, .. } => model,
        }
    }

    /// A backend of this target for a request that tried `tried_instances` and the
    /// targets in `tried_targets` (bit i: target i); with `healthy_only`, only one the
    /// balancer would pick without reservation.
    fn candidate(
        &self,
        index: usize,
        instances: &RoutingTable,
        tried_instances: &[i64],
        tried_targets: TargetMask,
        healthy_only: bool,
    ) -> Option<Arc<Backend>> {
        if self.weight == 0 || tried_targets & (1 << index) != 0 {
            return None;
        }
        let backend = match &self.kind {
            TargetKind::Local { model } => instances.get(model)?.pick_untried(tried_instances)?,
            TargetKind::Provider { backend, .. } => Arc::clone(backend.as_ref()?),
        };
        (!healthy_only || backend.is_healthy()).then_some(backend)
    }
}

impl RoutePlan {
    /// The target and backend for the next try: healthy backends of the lowest
    /// priority that has one first, then (when no priority has) any untried backend.
    /// A local target stays a candidate while it has untried instances; a provider
    /// target is tried once per request.
    pub fn pick(
        &self,
        instances: &RoutingTable,
        tried_instances: &[i64],
        tried_targets: TargetMask,
    ) -> Option<(usize, Arc<Backend>)> {
        let mut candidates: Vec<(usize, Arc<Backend>)> = Vec::with_capacity(self.targets.len());
        for healthy_only in [true, false] {
            let mut start = 0;
            while start < self.targets.len() {
                let priority = self.targets[start].priority;
                let end = start
                    + self.targets[start..]
                        .iter()
                        .take_while(|t| t.priority == priority)
                        .count();
                candidates.clear();
                for index in start..end {
                    if let Some(backend) = self.targets[index].candidate(
                        index,
                        instances,
                        tried_instances,
                        tried_targets,
                        healthy_only,
                    ) {
                        candidates.push((index, backend));
                    }
                }
                if let Some(picked) = self.weighted(&mut candidates) {
                    return Some(picked);
                }
                start = end;
            }
        }
        None
    }

    /// Why each target cannot take a request, for the 503 when none can.
    pub fn unavailable_reasons(&self, instances: &RoutingTable) -> String {
        self.targets
            .iter()
            .map(|target| {
                let why = match &target.kind {
                    _ if target.weight == 0 => "weight 0",
                    TargetKind::Local { model } => match instances.get(model) {
                        None => "no running instance",
                        Some(_) => "every instance failing",
                    },
                    TargetKind::Provider { backend: None, .. } => {
                        "provider missing or unusable (see the server log)"
                    }
                    TargetKind::Provider { .. } => "provider failing",
                };
                format!("{}: {why}", target.label)
            })
            .collect::<Vec<_>>()
            .join("; ")
    }

    fn weighted(
        &self,
        candidates: &mut Vec<(usize, Arc<Backend>)>,
    ) -> Option<(usize, Arc<Backend>)> {
        let total: u64 = candidates
            .iter()
            .map(|(index, _)| u64::from(self.targets[*index].weight))
            .sum();
        if total == 0 {
            return None;
        }
        let mut n = self.cursor.fetch_add(1, Ordering::Relaxed) % total;
        let position = candidates
            .iter()
            .position(|(index, _)| {
                let weight = u64::from(self.targets[*index].weight);
                if n < weight {
                    true
                } else {
                    n -= weight;
                    false
                }
            })
            .unwrap_or(0);
        Some(candidates.swap_remove(position))
    }
}

/// Every route by name.
pub struct RouteTable {
    routes: RwLock<HashMap<Arc<str>, Arc<RoutePlan>>>,
    /// Whether any route exists: lets a request for a plain model skip the lookup.
    any: AtomicBool,
    /// Provider backends by provider id, kept while the provider is unchanged.
    providers: Mutex<HashMap<i64, Arc<Backend>>>,
    /// Providers (id, version) already logged as unusable, so the periodic rebuild
    /// logs each problem once.
    warned: Mutex<HashSet<(i64, i64)>>,
    sealer: Arc<Sealer>,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for RouteTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouteTable")
            .field("routes", &self.all().len())
            .finish_non_exhaustive()
    }
}

impl RouteTable {
    pub fn new(sealer: Arc<Sealer>, metrics: Arc<Metrics>) -> Self {
        Self {
            routes: RwLock::default(),
            any: AtomicBool::new(false),
            providers: Mutex::default(),
            warned: Mutex::default(),
            sealer,
            metrics,
        }
    }

    /// The route named `name`, if one is defined.
    pub fn get(&self, name: &str) -> Option<Arc<RoutePlan>> {
        if !self.any.load(Ordering::Relaxed) {
            return None;
        }
        let routes = self.routes.read().unwrap_or_else(|e| e.into_inner());
        routes.get(name).cloned()
    }

    /// Every route, by name.
    pub fn all(&self) -> Vec<Arc<RoutePlan>> {
        let routes = self.routes.read().unwrap_or_else(|e| e.into_inner());
        let mut all: Vec<Arc<RoutePlan>> = routes.values().cloned().collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all
    }

    /// Every usable provider's backend.
    pub fn provider_backends(&self) -> Vec<Arc<Backend>> {
        let providers = self.providers.lock().unwrap_or_else(|e| e.into_inner());
        providers.values().cloned().collect()
    }

    /// Rebuilds the table from the store.
    pub async fn reload(&self, store: &dyn GatewayStore) -> Result<(), StoreError> {
        let providers = store.list_providers().await?;
        let definitions = store.list_routes().await?;
        let mut by_name: HashMap<String, Arc<Backend>> = HashMap::new();
        {
            let mut kept = self.providers.lock().unwrap_or_else(|e| e.into_inner());
            let mut fresh: HashMap<i64, Arc<Backend>> = HashMap::new();
            for stored in &providers {
                let provider = &stored.provider;
                let version = provider.updated_at.as_millis();
                let reused = kept
                    .get(&provider.id)
                    .filter(|b| b.provider.as_ref().is_some_and(|p| p.version == version));
                let backend = match reused {
                    Some(backend) => Some(Arc::clone(backend)),
                    None => self.open(stored),
                };
                if let Some(backend) = backend {
                    by_name.insert(provider.name.clone(), Arc::clone(&backend));
                    fresh.insert(provider.id, backend);
                }
            }
            *kept = fresh;
        }
        let mut routes = HashMap::with_capacity(definitions.len());
        for definition in &definitions {
            let plan = self.plan(definition, &by_name);
            routes.insert(Arc::clone(&plan.name), Arc::new(plan));
        }
        let any = !routes.is_empty();
        *self.routes.write().unwrap_or_else(|e| e.into_inner()) = routes;
        self.any.store(any, Ordering::Relaxed);
        Ok(())
    }

    /// A provider's backend, with its key opened; `None` (logged once per version)
    /// when it cannot be used.
    fn open(&self, stored: &gantry_store::StoredProvider) -> Option<Arc<Backend>> {
        let provider = &stored.provider;
        let warn_once = |reason: &dyn std::fmt::Display| {
            let mut warned = self.warned.lock().unwrap_or_else(|e| e.into_inner());
            if warned.insert((provider.id, provider.updated_at.as_millis())) {
                tracing::warn!(provider = %provider.name, provider_id = provider.id, reason = %reason, "model provider cannot be used; its route targets are passed over");
            }
        };
        let key = match &stored.api_key_sealed {
            None => None,
            Some(sealed) => match self.sealer.open(sealed) {
                Ok(key) => Some(key),
                Err(e) => {
                    warn_once(&e);
                    return None;
                }
            },
        };
        match crate::providers::backend(provider, key.as_deref()) {
            Ok(backend) => Some(backend),
            Err(e) => {
                warn_once(&e.reason);
                None
            }
        }
    }

    fn plan(
        &self,
        definition: &RouteDefinition,
        providers: &HashMap<String, Arc<Backend>>,
    ) -> RoutePlan {
        let name: Arc<str> = Arc::from(definition.name.as_str());
        let mut ordered: Vec<&RouteTarget> = definition.targets.iter().collect();
        ordered.sort_by_key(|t| t.priority);
        let targets = ordered
            .into_iter()
            .map(|target| {
                let label: Arc<str> = Arc::from(target.label().as_str());
                let kind = match &target.provider {
                    None => TargetKind::Local {
                        model: Arc::from(target.model.as_str()),
                    },
                    Some(provider) => TargetKind::Provider {
                        backend: providers.get(provider).cloned(),
                        model: Arc::from(target.model.as_str()),
                    },
                };
                PlannedTarget {
                    header: HeaderValue::from_str(&label)
                        .unwrap_or_else(|_| HeaderValue::from_static("unnamed")),
                    metrics: self.metrics.target(&name, &label),
                    label,
                    weight: target.weight,
                    priority: target.priority,
                    kind,
                }
            })
            .collect();
        RoutePlan {
            metrics: self.metrics.model(&name),
            name,
            created: definition.created_at.as_millis() / 1000,
            targets,
            cursor: AtomicU64::new(0),
        }
    }
}

/// Fills the table, then rebuilds it on every provider or route change and every
/// [`REFRESH_INTERVAL`] until shutdown.
pub async fn start(context: &GatewayContext, table: Arc<RouteTable>) -> Result<(), StoreError> {
    let mut changes = context.store.subscribe();
    table.reload(&*context.store).await?;
    let store = Arc::clone(&context.store);
    let shutdown = context.shutdown.clone();
    context.tasks.spawn(async move {
        let mut tick =
            tokio::time::interval_at(Instant::now() + REFRESH_INTERVAL, REFRESH_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let reload = tokio::select! {
                () = shutdown.cancelled() => return,
                change = changes.recv() => match change {
                    Ok(change) => matches!(*change, Change::Provider(..) | Change::Route(..)),
                    Err(RecvError::Lagged(_)) => true,
                    Err(RecvError::Closed) => return,
                },
                _ = tick.tick() => true,
            };
            if reload {
                if let Err(e) = table.reload(&*store).await {
                    tracing::error!(error = %e, "reload the gateway's model routes");
                }
                // Idle connections to providers are swept here, as the routing task
                // sweeps the instances'.
                for backend in table.provider_backends() {
                    backend.pool.sweep();
                }
            }
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::collections::BTreeMap;

    use gantry_types::{ModelProvider, Timestamp};

    use super::*;

    fn provider_backend(id: i64) -> Arc<Backend> {
        crate::providers::backend(
            &ModelProvider {
                id,
                name: format!("p{id}"),
                description: String::new(),
                base_url: format!("http://127.0.0.1:{}/v1", 9000 + id),
                has_api_key: false,
                headers: BTreeMap::new(),
                timeout_seconds: 30,
                models: vec![],
                created_at: Timestamp::from_millis(0),
                updated_at: Timestamp::from_millis(0),
            },
            None,
        )
        .unwrap()
    }

    fn plan(targets: Vec<(u32, u32, Option<Arc<Backend>>)>) -> RoutePlan {
        let metrics = Metrics::default();
        RoutePlan {
            name: Arc::from("chat"),
            metrics: metrics.model("chat"),
            created: 0,
            targets: targets
                .into_iter()
                .enumerate()
                .map(|(i, (weight, priority, backend))| PlannedTarget {
                    label: Arc::from(format!("t{i}").as_str()),
                    header: HeaderValue::from_static("t"),
                    weight,
                    priority,
                    kind: TargetKind::Provider {
                        backend,
                        model: Arc::from("m"),
                    },
                    metrics: metrics.target("chat", "t"),
                })
                .collect(),
            cursor: AtomicU64::new(0),
        }
    }

    #[test]
    fn targets_of_one_priority_split_by_weight_exactly() {
        let plan = plan(vec![
            (3, 0, Some(provider_backend(1))),
            (1, 0, Some(provider_backend(2))),
        ]);
        let instances = RoutingTable::default();
        let mut counts = [0; 2];
        for _ in 0..400 {
            let (index, _) = plan.pick(&instances, &[], 0).unwrap();
            counts[index] += 1;
        }
        assert_eq!(counts, [300, 100]);
    }

    #[test]
    fn a_lower_priority_serves_only_when_the_higher_one_cannot() {
        let first = provider_backend(1);
        let plan = plan(vec![
            (1, 0, Some(Arc::clone(&first))),
            (1, 1, Some(provider_backend(2))),
            (5, 2, None),
        ]);
        let instances = RoutingTable::default();
        for _ in 0..4 {
            assert_eq!(plan.pick(&instances, &[], 0).unwrap().0, 0);
        }
        // Tried by this request: the next priority.
        assert_eq!(plan.pick(&instances, &[], 0b1).unwrap().0, 1);
        // Both tried, and the last has no usable provider: nothing left.
        assert!(plan.pick(&instances, &[], 0b11).is_none());
        // Failing (refused a connection): passed over while another is healthy ...
        first.mark_failing(std::time::Duration::from_secs(60));
        assert_eq!(plan.pick(&instances, &[], 0).unwrap().0, 1);
        // ... and still used when it is all that is left.
        assert_eq!(plan.pick(&instances, &[], 0b10).unwrap().0, 0);
    }

    #[test]
    fn a_local_target_without_a_running_instance_is_passed_over() {
        let metrics = Metrics::default();
        let plan = RoutePlan {
            name: Arc::from("chat"),
            metrics: metrics.model("chat"),
            created: 0,
            targets: vec![
                PlannedTarget {
                    label: Arc::from("qwen"),
                    header: HeaderValue::from_static("qwen"),
                    weight: 3,
                    priority: 0,
                    kind: TargetKind::Local {
                        model: Arc::from("qwen"),
                    },
                    metrics: metrics.target("chat", "qwen"),
                },
                PlannedTarget {
                    label: Arc::from("p1/m"),
                    header: HeaderValue::from_static("p1/m"),
                    weight: 1,
                    priority: 0,
                    kind: TargetKind::Provider {
                        backend: Some(provider_backend(1)),
                        model: Arc::from("m"),
                    },
                    metrics: metrics.target("chat", "p1/m"),
                },
            ],
            cursor: AtomicU64::new(0),
        };
        let instances = RoutingTable::default();
        for _ in 0..8 {
            assert_eq!(plan.pick(&instances, &[], 0).unwrap().0, 1);
        }
    }
}
