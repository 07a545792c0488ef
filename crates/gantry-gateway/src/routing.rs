//! The routing table: model name → the running instances that serve it, with a
//! request-in-flight counter per instance.
//!
//! It is built from the store at start-up and kept current by one task that applies
//! the store's change feed (`Change::Instance`, `Change::Model`). The feed carries
//! every server's writes: on PostgreSQL the store republishes the changes other
//! servers announce with `pg_notify` (`gantry-store/src/notify.rs`). What it can miss
//! — changes sent while this server's listener was reconnecting, a deletion too large
//! to announce, a full cross-server queue, a local feed that lagged — is healed by a
//! rebuild from the store every [`REFRESH_INTERVAL`] (and at once on a lag). The same
//! task does both, in order, so a refresh never overwrites a newer event with an older
//! read (events queued during a refresh are applied after it, and applying an event
//! twice is harmless because it carries the object's state after the write).
//!
//! Requests read the table under a short read lock and keep `Arc`s to what they use:
//! an instance removed while requests are in flight keeps its counter (and its
//! connections) until they end. The same task sweeps idle connections on each refresh.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::http::uri::Authority;
use axum::http::HeaderValue;
use gantry_store::{Change, ChangeKind, InstanceFilter, ModelFilter, Page, Store, StoreError};
use gantry_types::{InstanceState, Model, ModelInstance};
use tokio::sync::broadcast::error::RecvError;
use tokio::time::Instant;

use crate::balance::{pick_least_loaded, UNHEALTHY_PENALTY};
use crate::upstream::{ConnectError, ConnectionPool, UpstreamConnection};
use crate::GatewayContext;

/// How often the whole table is re-read from the store.
pub const REFRESH_INTERVAL: Duration = Duration::from_secs(5);

/// Page size of the refresh reads.
const REFRESH_PAGE: u32 = 1000;

/// One running instance as the gateway sees it.
#[derive(Debug)]
pub struct Backend {
    pub instance_id: i64,
    pub instance_name: String,
    /// `instance_name` as the `x-gantry-instance` response header.
    pub header_value: HeaderValue,
    /// `address` as the `Host` request header.
    pub host_header: HeaderValue,
    /// `host:port` as the worker reported it.
    pub address: String,
    pub authority: Authority,
    in_flight: AtomicU64,
    /// Milliseconds after [`clock_origin`] until which this instance counts as failing
    /// (it refused a connection); 0 when healthy.
    unhealthy_until_ms: AtomicU64,
    /// Idle keep-alive connections to the instance.
    pub pool: ConnectionPool,
    /// Connections opened to the instance so far.
    connections_opened: AtomicU64,
}

/// A fixed point the millisecond deadlines above count from.
fn clock_origin() -> Instant {
    static ORIGIN: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

fn now_ms() -> u64 {
    u64::try_from(clock_origin().elapsed().as_millis()).unwrap_or(u64::MAX)
}

impl Backend {
    /// `None` when the instance cannot be routed to (no address, or one that is not
    /// `host:port`).
    fn from_instance(instance: &ModelInstance) -> Option<Self> {
        if instance.state != InstanceState::Running {
            return None;
        }
        let address = instance.address.as_deref()?;
        let authority = match address.parse::<Authority>() {
            Ok(authority) if authority.port_u16().is_some() => authority,
            _ => {
                tracing::warn!(instance = %instance.name, address, "running instance has an address that is not host:port; not routing to it");
                return None;
            }
        };
        let header_value = HeaderValue::from_str(&instance.name).ok()?;
        let host_header = HeaderValue::from_str(address).ok()?;
        Some(Self {
            instance_id: instance.id,
            instance_name: instance.name.clone(),
            header_value,
            host_header,
            address: address.to_string(),
            authority,
            in_flight: AtomicU64::new(0),
            unhealthy_until_ms: AtomicU64::new(0),
            pool: ConnectionPool::default(),
            connections_opened: AtomicU64::new(0),
        })
    }

    /// An idle keep-alive connection, or a new one.
    pub async fn connection(&self) -> Result<UpstreamConnection, ConnectError> {
        match self.pool.take() {
            Some(connection) => Ok(connection),
            None => self.connect().await,
        }
    }

    /// A new connection.
    pub async fn connect(&self) -> Result<UpstreamConnection, ConnectError> {
        let connection = UpstreamConnection::connect(&self.address).await?;
        self.connections_opened.fetch_add(1, Ordering::Relaxed);
        Ok(connection)
    }

    /// Connections opened to the instance so far (reuse keeps this low).
    pub fn connections_opened(&self) -> u64 {
        self.connections_opened.load(Ordering::Relaxed)
    }

    /// Requests being proxied to this instance now.
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Counts a request until the guard is dropped (also when its future is
    /// cancelled).
    pub fn start_request(self: &Arc<Self>) -> InFlightGuard {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlightGuard(Arc::clone(self))
    }

    /// Makes the balancer avoid this instance for a while.
    pub fn mark_failing(&self, duration: Duration) {
        let until = now_ms().saturating_add(u64::try_from(duration.as_millis()).unwrap_or(0));
        self.unhealthy_until_ms.store(until, Ordering::Relaxed);
    }

    /// The instance answered: forget an earlier failure.
    pub fn mark_healthy(&self) {
        if self.unhealthy_until_ms.load(Ordering::Relaxed) != 0 {
            self.unhealthy_until_ms.store(0, Ordering::Relaxed);
        }
    }

    fn load(&self, now: u64) -> u64 {
        let penalty = if self.unhealthy_until_ms.load(Ordering::Relaxed) > now {
            UNHEALTHY_PENALTY
        } else {
            0
        };
        self.in_flight() + penalty
    }
}

/// Holds one request in an instance's in-flight count.
#[derive(Debug)]
pub struct InFlightGuard(Arc<Backend>);

impl InFlightGuard {
    pub fn backend(&self) -> &Arc<Backend> {
        &self.0
    }
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The running instances of one model.
#[derive(Debug)]
pub struct ModelRoute {
    pub name: Arc<str>,
    /// The model's creation time, Unix seconds (`/v1/models` shows it).
    pub created: i64,
    /// Ordered by instance id; never empty in the table.
    pub backends: Vec<Arc<Backend>>,
    /// Where the next pick starts its scan: rotates so that ties take turns.
    cursor: AtomicUsize,
}

impl ModelRoute {
    /// The least-loaded instance not among `tried`; when every instance has been
    /// tried, the least-loaded of all (a model with one instance retries that one).
    pub fn pick(&self, tried: &[i64]) -> Option<Arc<Backend>> {
        let start = self.cursor.fetch_add(1, Ordering::Relaxed);
        let now = now_ms();
        let len = self.backends.len();
        let index = pick_least_loaded(len, start, |i| {
            let backend = &self.backends[i];
            (!tried.contains(&backend.instance_id)).then(|| backend.load(now))
        })
        .or_else(|| pick_least_loaded(len, start, |i| Some(self.backends[i].load(now))))?;
        Some(Arc::clone(&self.backends[index]))
    }
}

/// Model name → running instances, plus the names of every model (routable or not).
/// Shared by every request of this server.
#[derive(Debug, Default)]
pub struct RoutingTable {
    inner: RwLock<Tables>,
}

#[derive(Debug, Default)]
struct Tables {
    routes: HashMap<Arc<str>, Arc<ModelRoute>>,
    /// Every model's name: tells "no running instance" (503) from "no such model"
    /// (404) without a database read.
    known: HashSet<Arc<str>>,
}

impl RoutingTable {
    /// The route of a model with at least one running instance.
    pub fn get(&self, model: &str) -> Option<Arc<ModelRoute>> {
        let tables = self.inner.read().unwrap_or_else(|e| e.into_inner());
        tables.routes.get(model).cloned()
    }

    /// Whether a model of that name exists (as of the last change seen).
    pub fn knows(&self, model: &str) -> bool {
        let tables = self.inner.read().unwrap_or_else(|e| e.into_inner());
        tables.known.contains(model)
    }

    /// Every routable model, ordered by name.
    pub fn all(&self) -> Vec<Arc<ModelRoute>> {
        let tables = self.inner.read().unwrap_or_else(|e| e.into_inner());
        let mut all: Vec<Arc<ModelRoute>> = tables.routes.values().cloned().collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all
    }

    fn replace_all(&self, routes: HashMap<Arc<str>, Arc<ModelRoute>>, known: HashSet<Arc<str>>) {
        let mut tables = self.inner.write().unwrap_or_else(|e| e.into_inner());
        *tables = Tables { routes, known };
    }

    fn set(&self, name: Arc<str>, route: Option<Arc<ModelRoute>>) {
        let mut tables = self.inner.write().unwrap_or_else(|e| e.into_inner());
        match route {
            Some(route) => tables.routes.insert(name, route),
            None => tables.routes.remove(&name),
        };
    }

    fn set_known(&self, name: Arc<str>, exists: bool) {
        let mut tables = self.inner.write().unwrap_or_else(|e| e.into_inner());
        if exists {
            tables.known.insert(name);
        } else {
            tables.known.remove(&name);
        }
    }
}

/// A routable instance as the maintenance task tracks it.
#[derive(Debug)]
struct Tracked {
    model_id: i64,
    model_name: Arc<str>,
    backend: Arc<Backend>,
}

/// A model as the maintenance task tracks it.
#[derive(Debug, Clone)]
struct KnownModel {
    name: Arc<str>,
    /// Unix seconds.
    created: i64,
}

impl KnownModel {
    fn of(model: &Model) -> Self {
        Self {
            name: Arc::from(model.name.as_str()),
            created: model.created_at.as_millis() / 1000,
        }
    }
}

/// The maintenance task's own view, from which it rebuilds the routes it changes.
#[derive(Debug, Default)]
struct Tracker {
    /// Routable instances by id.
    instances: HashMap<i64, Tracked>,
    /// Every model by id.
    models: HashMap<i64, KnownModel>,
}

impl Tracker {
    fn route_of(&self, model_id: i64, name: &Arc<str>) -> Option<Arc<ModelRoute>> {
        let mut backends: Vec<Arc<Backend>> = self
            .instances
            .values()
            .filter(|t| t.model_name == *name)
            .map(|t| Arc::clone(&t.backend))
            .collect();
        if backends.is_empty() {
            return None;
        }
        backends.sort_by_key(|b| b.instance_id);
        Some(Arc::new(ModelRoute {
            name: Arc::clone(name),
            created: self.models.get(&model_id).map_or(0, |m| m.created),
            backends,
            cursor: AtomicUsize::new(0),
        }))
    }

    /// The tracked backend of an instance if its address is unchanged, else a new
    /// one (a restarted backend on a new port starts with a fresh counter).
    fn reuse_or_new(&self, instance: &ModelInstance) -> Option<Arc<Backend>> {
        let fresh = Backend::from_instance(instance)?;
        match self.instances.get(&instance.id) {
            Some(t) if t.backend.address == fresh.address => Some(Arc::clone(&t.backend)),
            _ => Some(Arc::new(fresh)),
        }
    }

    fn know(&mut self, model: &Model, table: &RoutingTable) {
        let known = KnownModel::of(model);
        table.set_known(Arc::clone(&known.name), true);
        self.models.insert(model.id, known);
    }

    async fn apply(&mut self, change: &Change, store: &Store, table: &RoutingTable) {
        match change {
            Change::Instance(kind, instance) => {
                let backend = match kind {
                    ChangeKind::Deleted => None,
                    _ => self.reuse_or_new(instance),
                };
                let name: Arc<str> = match self.instances.get(&instance.id) {
                    Some(t) => Arc::clone(&t.model_name),
                    None => Arc::from(instance.model_name.as_str()),
                };
                match backend {
                    Some(backend) => {
                        if !self.models.contains_key(&instance.model_id) {
                            // An instance of a model this server has not seen yet (it
                            // was created elsewhere): read it for its creation time.
                            if let Ok(model) = store.get_model(instance.model_id).await {
                                self.know(&model, table);
                            }
                        }
                        self.instances.insert(
                            instance.id,
                            Tracked {
                                model_id: instance.model_id,
                                model_name: Arc::clone(&name),
                                backend,
                            },
                        );
                    }
                    None => {
                        if self.instances.remove(&instance.id).is_none() {
                            return;
                        }
                    }
                }
                table.set(Arc::clone(&name), self.route_of(instance.model_id, &name));
            }
            Change::Model(ChangeKind::Deleted, model) => {
                self.models.remove(&model.id);
                self.instances.retain(|_, t| t.model_id != model.id);
                let name: Arc<str> = Arc::from(model.name.as_str());
                table.set(Arc::clone(&name), None);
                table.set_known(name, false);
            }
            Change::Model(_, model) => self.know(model, table),
            _ => {}
        }
    }

    /// Re-reads every model and running instance and replaces the whole table.
    async fn refresh(&mut self, store: &Store, table: &RoutingTable) -> Result<(), StoreError> {
        let mut models = HashMap::new();
        for number in 1.. {
            let page = Page {
                page: number,
                per_page: REFRESH_PAGE,
            };
            let (listed, _) = store.list_models(&ModelFilter::default(), page).await?;
            let done = listed.len() < REFRESH_PAGE as usize;
            for model in &listed {
                models.insert(model.id, KnownModel::of(model));
            }
            if done {
                break;
            }
        }
        let filter = InstanceFilter {
            state: Some(InstanceState::Running),
            ..Default::default()
        };
        let mut instances = HashMap::new();
        for number in 1.. {
            let page = Page {
                page: number,
                per_page: REFRESH_PAGE,
            };
            let (running, _) = store.list_instances(&filter, page).await?;
            let done = running.len() < REFRESH_PAGE as usize;
            for instance in running {
                if let Some(backend) = self.reuse_or_new(&instance) {
                    instances.insert(
                        instance.id,
                        Tracked {
                            model_id: instance.model_id,
                            model_name: Arc::from(instance.model_name.as_str()),
                            backend,
                        },
                    );
                }
            }
            if done {
                break;
            }
        }
        self.instances = instances;
        self.models = models;
        let mut routed: HashMap<i64, Arc<str>> = HashMap::new();
        for tracked in self.instances.values() {
            routed
                .entry(tracked.model_id)
                .or_insert_with(|| Arc::clone(&tracked.model_name));
        }
        let routes = routed
            .iter()
            .filter_map(|(id, name)| {
                self.route_of(*id, name)
                    .map(|route| (Arc::clone(name), route))
            })
            .collect();
        let known = self.models.values().map(|m| Arc::clone(&m.name)).collect();
        table.replace_all(routes, known);
        Ok(())
    }
}

/// Fills the table from the store, then keeps it current until shutdown.
pub async fn start(context: &GatewayContext, table: Arc<RoutingTable>) -> Result<(), StoreError> {
    // Subscribe before the first read so that no change between the two is lost.
    let mut changes = context.store.subscribe();
    let mut tracker = Tracker::default();
    tracker.refresh(&context.store, &table).await?;
    let store = context.store.clone();
    let shutdown = context.shutdown.clone();
    context.tasks.spawn(async move {
        let mut tick = tokio::time::interval_at(Instant::now() + REFRESH_INTERVAL, REFRESH_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                change = changes.recv() => match change {
                    Ok(change) => tracker.apply(&change, &store, &table).await,
                    Err(RecvError::Lagged(missed)) => {
                        tracing::warn!(missed, "gateway routing fell behind the change feed; re-reading the store");
                        if let Err(e) = tracker.refresh(&store, &table).await {
                            tracing::error!(error = %e, "refresh the gateway routing table");
                        }
                    }
                    Err(RecvError::Closed) => return,
                },
                _ = tick.tick() => {
                    if let Err(e) = tracker.refresh(&store, &table).await {
                        tracing::error!(error = %e, "refresh the gateway routing table");
                    }
                    for route in table.all() {
                        for backend in &route.backends {
                            backend.pool.sweep();
                        }
                    }
                }
            }
        }
    });
    Ok(())
}
