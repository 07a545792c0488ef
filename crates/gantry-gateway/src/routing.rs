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
//! connections) until they end. Removing an instance also fires its
//! [`Backend::left_routing`] signal, on which requests still waiting for its response
//! head give up and go to another instance (a frozen backend reported `unhealthy` by
//! its worker must not keep them). The same task sweeps idle connections on each
//! refresh.
//!
//! Each instance also carries its passive-ejection record (`eject.rs`): the balancer
//! passes over an ejected instance while the model has another one.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Duration;

use axum::http::uri::Authority;
use axum::http::HeaderValue;
use gantry_store::{Change, ChangeKind, InstanceFilter, ModelFilter, Page, Store, StoreError};
use gantry_types::{units, InstanceState, Model, ModelInstance};
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::balance::{pick_least_loaded, EJECTED_PENALTY, UNHEALTHY_PENALTY};
use crate::eject::{Ejected, Ejection, EjectionPolicy, Recovered};
use crate::metrics::ModelMetrics;
use crate::providers::ProviderEndpoint;
use crate::shard::Sharded;
use crate::upstream::{ConnectError, ConnectionPool, UpstreamConnection};
use crate::GatewayContext;

/// How often the whole table is re-read from the store.
pub const REFRESH_INTERVAL: Duration = Duration::from_secs(5);

/// Page size of the refresh reads.
const REFRESH_PAGE: u32 = 1000;

/// One running instance as the gateway sees it — or a model provider
/// (`providers.rs`), which is reached the same way.
#[derive(Debug)]
pub struct Backend {
    /// The instance's id; for a provider, minus the provider's id.
    pub instance_id: i64,
    pub instance_name: String,
    /// The instance's model, for logs.
    pub model_name: String,
    /// Set for a model provider: how its requests differ from an instance's.
    pub provider: Option<Arc<ProviderEndpoint>>,
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
    /// Its failures in a row and ejection; taken only by failures and by the first
    /// success after them (see `failing`).
    ejection: Mutex<Ejection>,
    /// Whether `ejection` records any failure: a success takes the lock only then.
    failing: AtomicBool,
    /// `ejection`'s end of ejection as the balancer reads it without the lock:
    /// milliseconds after [`clock_origin`], 0 when not ejected (or back already).
    ejected_until_ms: AtomicU64,
    /// Times this instance was ejected.
    ejections: AtomicU64,
    /// Set when the routing table drops the instance (not `running` any more, deleted,
    /// moved to another address); never reset: a later return to routing makes a new
    /// `Backend`. What the balancer reads for every candidate of every request.
    left: AtomicBool,
    /// Tries waiting for a response head, woken when `left` is set: one wait list per
    /// shard (`shard.rs`), so a try joins and leaves a list only its own thread uses,
    /// not one that every request to the instance takes the lock of.
    left_waiters: Sharded<Notify>,
}

/// A fixed point the millisecond deadlines above count from.
fn clock_origin() -> Instant {
    static ORIGIN: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

fn now_ms() -> u64 {
    u64::try_from(clock_origin().elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// [`now_ms`], read the first time it is asked for and not at all when nothing asks:
/// a pick reads the clock only when an instance is refusing or ejected.
#[derive(Default)]
struct LazyNow(std::cell::OnceCell<u64>);

impl LazyNow {
    fn get(&self) -> u64 {
        *self.0.get_or_init(now_ms)
    }
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
        Some(Self::new(
            instance.id,
            instance.name.clone(),
            instance.model_name.clone(),
            None,
            header_value,
            host_header,
            address.to_string(),
            authority,
        ))
    }

    /// The backend of a model provider: `address` is where to connect (`host:port`),
    /// `host_header` what the `Host` header says.
    pub fn for_provider(
        endpoint: Arc<ProviderEndpoint>,
        address: String,
        authority: Authority,
        host_header: HeaderValue,
    ) -> Result<Self, String> {
        let header_value = HeaderValue::from_str(&endpoint.name)
            .map_err(|_| format!("name {:?} is not a header value", endpoint.name))?;
        Ok(Self::new(
            -endpoint.id,
            endpoint.name.to_string(),
            endpoint.name.to_string(),
            Some(endpoint),
            header_value,
            host_header,
            address,
            authority,
        ))
    }

    #[allow(clippy::too_many_arguments)]
    fn new(
        instance_id: i64,
        instance_name: String,
        model_name: String,
        provider: Option<Arc<ProviderEndpoint>>,
        header_value: HeaderValue,
        host_header: HeaderValue,
        address: String,
        authority: Authority,
    ) -> Self {
        Self {
            instance_id,
            instance_name,
            model_name,
            provider,
            header_value,
            host_header,
            address,
            authority,
            in_flight: AtomicU64::new(0),
            unhealthy_until_ms: AtomicU64::new(0),
            pool: ConnectionPool::default(),
            connections_opened: AtomicU64::new(0),
            ejection: Mutex::default(),
            failing: AtomicBool::new(false),
            ejected_until_ms: AtomicU64::new(0),
            ejections: AtomicU64::new(0),
            left: AtomicBool::new(false),
            left_waiters: Sharded::default(),
        }
    }

    /// An idle keep-alive connection, or a new one; `now` is the caller's reading of
    /// the clock.
    pub async fn connection(&self, now: Instant) -> Result<UpstreamConnection, ConnectError> {
        match self.pool.take(now) {
            Some(connection) => Ok(connection),
            // Boxed: connecting (a TLS handshake's state included) is most of a
            // request's future by size, and that future is moved on every request;
            // a pooled connection, the usual case, needs none of it.
            None => Box::pin(self.connect()).await,
        }
    }

    /// Keeps a connection whose response ended cleanly for the next request — unless the
    /// instance has left routing: then no request will take it, and an open connection
    /// would tell the instance's worker, draining it before a stop, that a request is
    /// still under way (`gantry-worker`'s `drain.rs`). `now` is the caller's reading of
    /// the clock.
    pub fn give_back(&self, connection: UpstreamConnection, now: Instant) {
        if self.has_left_routing() {
            return;
        }
        self.pool.give_back(connection, now);
        // Left while it was given back: the removal may have closed the idle connections
        // before this one arrived (the pool's lock orders the two).
        if self.has_left_routing() {
            self.pool.close_idle();
        }
    }

    /// A new connection.
    pub async fn connect(&self) -> Result<UpstreamConnection, ConnectError> {
        let tls_name = self.provider.as_ref().and_then(|p| p.tls_name.as_ref());
        let connection = UpstreamConnection::connect_with(&self.address, tls_name).await?;
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

    /// Counts a failed try (connection error, 5xx answer, no response head in time)
    /// towards ejection; `Some` when it ejects the instance (the caller logs it).
    pub fn record_failure(&self, policy: &EjectionPolicy) -> Option<Ejected> {
        let mut ejection = self.ejection.lock().unwrap_or_else(|e| e.into_inner());
        self.failing.store(true, Ordering::Relaxed);
        let ejected = ejection.record_failure(now_ms(), policy)?;
        self.ejected_until_ms
            .store(ejected.until_ms, Ordering::Relaxed);
        self.ejections.fetch_add(1, Ordering::Relaxed);
        Some(ejected)
    }

    /// Counts an answer: forgets the failures in a row and ends an ejection. `Some`
    /// when there was something to forget (the caller logs an ended ejection). Takes
    /// no lock unless the instance has been failing.
    pub fn record_success(&self) -> Option<Recovered> {
        if !self.failing.load(Ordering::Relaxed) {
            return None;
        }
        let mut ejection = self.ejection.lock().unwrap_or_else(|e| e.into_inner());
        self.failing.store(false, Ordering::Relaxed);
        self.ejected_until_ms.store(0, Ordering::Relaxed);
        ejection.record_success(now_ms())
    }

    /// Whether the instance is ejected now. The first call after its cooldown ended
    /// logs its return to routing (still counting as failing: one more failure ejects
    /// it again).
    pub fn is_ejected(&self) -> bool {
        self.ejected_at(&LazyNow::default())
    }

    fn ejected_at(&self, now: &LazyNow) -> bool {
        let until = self.ejected_until_ms.load(Ordering::Relaxed);
        if until == 0 {
            return false;
        }
        if until > now.get() {
            return true;
        }
        // Only the caller that clears the deadline logs; a new ejection stored in
        // between makes the exchange fail.
        if self
            .ejected_until_ms
            .compare_exchange(until, 0, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            let (failures, cooldown) = {
                let ejection = self.ejection.lock().unwrap_or_else(|e| e.into_inner());
                (ejection.consecutive_failures(), ejection.cooldown())
            };
            tracing::info!(
                model = %self.model_name,
                instance = %self.instance_name,
                instance_id = self.instance_id,
                failures,
                cooldown = %units::format_duration(cooldown),
                "ejection cooldown ended; instance is back in routing (its next failure ejects it again)"
            );
        }
        false
    }

    /// Times this instance was ejected (`/metrics`).
    pub fn ejections(&self) -> u64 {
        self.ejections.load(Ordering::Relaxed)
    }

    /// Completes when the routing table drops this instance; at once if it has.
    pub async fn left_routing(&self) {
        let notified = self.left_waiters.local().notified();
        let mut notified = std::pin::pin!(notified);
        // On the list before `left` is read: a removal after the read wakes it.
        notified.as_mut().enable();
        if self.has_left_routing() {
            return;
        }
        notified.await;
    }

    /// Whether the routing table has dropped this instance.
    pub fn has_left_routing(&self) -> bool {
        self.left.load(Ordering::Acquire)
    }

    /// Called by the routing task when it drops the instance (and by the route table
    /// when a provider changes): requests waiting for its response head give up on it,
    /// and its idle connections are closed (the requests under way keep theirs).
    pub(crate) fn leave_routing(&self) {
        if !self.left.swap(true, Ordering::AcqRel) {
            tracing::debug!(instance = %self.instance_name, instance_id = self.instance_id, in_flight = self.in_flight(), "instance left routing");
            for waiters in self.left_waiters.iter() {
                waiters.notify_waiters();
            }
            self.pool.close_idle();
        }
    }

    /// Whether the balancer would pick this backend without reservation: in routing,
    /// not ejected and not recently refusing connections.
    pub fn is_healthy(&self) -> bool {
        !self.has_left_routing() && self.load(&LazyNow::default()) < UNHEALTHY_PENALTY
    }

    fn load(&self, now: &LazyNow) -> u64 {
        let refused_until = self.unhealthy_until_ms.load(Ordering::Relaxed);
        let refused = if refused_until != 0 && refused_until > now.get() {
            UNHEALTHY_PENALTY
        } else {
            0
        };
        let ejected = if self.ejected_at(now) {
            EJECTED_PENALTY
        } else {
            0
        };
        self.in_flight() + refused + ejected
    }
}

/// Holds one request in an instance's in-flight count.
#[derive(Debug)]
pub struct InFlightGuard(Arc<Backend>);

impl InFlightGuard {
    /// Counts a request to `backend` until the guard is dropped.
    pub fn start(backend: Arc<Backend>) -> Self {
        backend.in_flight.fetch_add(1, Ordering::Relaxed);
        Self(backend)
    }

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
    /// `name` as the `x-gantry-target` response header.
    pub name_header: HeaderValue,
    /// The model's creation time, Unix seconds (`/v1/models` shows it).
    pub created: i64,
    /// Ordered by instance id; never empty in the table.
    pub backends: Vec<Arc<Backend>>,
    /// Where the next pick starts its scan: rotates so that ties take turns.
    cursor: Arc<AtomicUsize>,
    /// The model's counters, looked up by the first request through this route rather
    /// than by name (a lock and a hash) on every request.
    pub metrics: OnceLock<Arc<ModelMetrics>>,
}

impl ModelRoute {
    /// The same route for another shard of the table: the same instances, name and
    /// counters and the same cursor (ties take turns over every shard), a reference count
    /// of its own.
    fn copy(&self) -> Self {
        Self {
            name: Arc::clone(&self.name),
            name_header: self.name_header.clone(),
            created: self.created,
            backends: self.backends.clone(),
            cursor: Arc::clone(&self.cursor),
            metrics: self.metrics.clone(),
        }
    }

    /// The least-loaded instance not among `tried`; when every instance has been
    /// tried, the least-loaded of all (a model with one instance retries that one).
    /// Ejected instances count as loaded beyond any other, so one is picked only when
    /// nothing else is left; instances that left routing (a stale route) never are.
    pub fn pick(&self, tried: &[i64]) -> Option<Arc<Backend>> {
        let len = self.backends.len();
        // One instance has no ties to break: the cursor, which every request would
        // write, is left alone.
        let start = if len > 1 {
            self.cursor.fetch_add(1, Ordering::Relaxed)
        } else {
            0
        };
        let now = LazyNow::default();
        let load = |i: usize| {
            let backend = &self.backends[i];
            (!backend.has_left_routing()).then(|| backend.load(&now))
        };
        let index = pick_least_loaded(len, start, |i| {
            if tried.contains(&self.backends[i].instance_id) {
                None
            } else {
                load(i)
            }
        })
        .or_else(|| pick_least_loaded(len, start, load))?;
        Some(Arc::clone(&self.backends[index]))
    }

    /// Like [`ModelRoute::pick`], but never an instance among `tried`.
    pub fn pick_untried(&self, tried: &[i64]) -> Option<Arc<Backend>> {
        self.pick(tried)
            .filter(|backend| !tried.contains(&backend.instance_id))
    }
}

/// Model name → running instances, plus the names of every model (routable or not).
/// Shared by every request of this server.
#[derive(Debug, Default)]
pub struct RoutingTable {
    inner: RwLock<Tables>,
    /// The routes again, one copy per shard (`shard.rs`), for [`RoutingTable::get`]:
    /// every request reads a route, and a read lock that every request takes is a
    /// cache line the CPUs pass back and forth. Each copy's routes are its own
    /// ([`ModelRoute::copy`]: same instances), so that holding one — its reference
    /// count — stays on the shard too. Written with `inner`, under its write lock.
    by_shard: Sharded<RwLock<HashMap<Arc<str>, Arc<ModelRoute>>>>,
    /// Woken whenever a route is set, for requests that wait for one to arrive.
    changed: tokio::sync::Notify,
    /// When the store last said a model (by name) had no running instance: requests
    /// for a model that is not up yet ask the store at most once per
    /// [`MISS_RECHECK`], not once each. Only names of existing models go in.
    misses: Mutex<HashMap<Arc<str>, Instant>>,
}

/// How long "the store has no running instance of this model" is believed.
const MISS_RECHECK: Duration = Duration::from_millis(250);

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
        let routes = self
            .by_shard
            .local()
            .read()
            .unwrap_or_else(|e| e.into_inner());
        routes.get(model).cloned()
    }

    /// The route of `model` once it has one, waiting at most `within` for the change
    /// that brings it: the store may already say an instance runs (a worker reported it
    /// to another server) a moment before this server's table hears of it.
    pub async fn wait_for(&self, model: &str, within: Duration) -> Option<Arc<ModelRoute>> {
        let deadline = Instant::now() + within;
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if let Some(route) = self.get(model) {
                return Some(route);
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return self.get(model);
            }
        }
    }

    /// Whether the store said, less than [`MISS_RECHECK`] ago, that `model` has no
    /// running instance.
    pub fn recently_missed(&self, model: &str) -> bool {
        let misses = self.misses.lock().unwrap_or_else(|e| e.into_inner());
        misses
            .get(model)
            .is_some_and(|at| at.elapsed() < MISS_RECHECK)
    }

    /// Remembers that the store has no running instance of `model` (an existing model).
    pub fn missed(&self, model: &str) {
        let mut misses = self.misses.lock().unwrap_or_else(|e| e.into_inner());
        match misses.get_mut(model) {
            Some(at) => *at = Instant::now(),
            None => {
                misses.insert(Arc::from(model), Instant::now());
            }
        }
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
        for shard in self.by_shard.iter() {
            let copies = routes
                .iter()
                .map(|(name, route)| (Arc::clone(name), Arc::new(route.copy())))
                .collect();
            *shard.write().unwrap_or_else(|e| e.into_inner()) = copies;
        }
        *tables = Tables { routes, known };
        drop(tables);
        self.changed.notify_waiters();
    }

    fn set(&self, name: Arc<str>, route: Option<Arc<ModelRoute>>) {
        let mut tables = self.inner.write().unwrap_or_else(|e| e.into_inner());
        for shard in self.by_shard.iter() {
            let mut copies = shard.write().unwrap_or_else(|e| e.into_inner());
            match &route {
                Some(route) => copies.insert(Arc::clone(&name), Arc::new(route.copy())),
                None => copies.remove(&name),
            };
        }
        match route {
            Some(route) => tables.routes.insert(name, route),
            None => tables.routes.remove(&name),
        };
        drop(tables);
        self.changed.notify_waiters();
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
            name_header: HeaderValue::from_str(name).ok()?,
            created: self.models.get(&model_id).map_or(0, |m| m.created),
            backends,
            cursor: Arc::default(),
            metrics: OnceLock::new(),
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
                        let replaced = self.instances.insert(
                            instance.id,
                            Tracked {
                                model_id: instance.model_id,
                                model_name: Arc::clone(&name),
                                backend: Arc::clone(&backend),
                            },
                        );
                        if let Some(old) = replaced {
                            if !Arc::ptr_eq(&old.backend, &backend) {
                                // Restarted on another address: the old one is gone.
                                old.backend.leave_routing();
                            }
                        }
                    }
                    None => match self.instances.remove(&instance.id) {
                        Some(removed) => removed.backend.leave_routing(),
                        None => return,
                    },
                }
                table.set(Arc::clone(&name), self.route_of(instance.model_id, &name));
            }
            Change::Model(ChangeKind::Deleted, model) => {
                self.models.remove(&model.id);
                self.instances.retain(|_, t| {
                    let keep = t.model_id != model.id;
                    if !keep {
                        t.backend.leave_routing();
                    }
                    keep
                });
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
        for (id, old) in &self.instances {
            let kept = instances
                .get(id)
                .is_some_and(|new| Arc::ptr_eq(&new.backend, &old.backend));
            if !kept {
                old.backend.leave_routing();
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use gantry_store::StoreConfig;
    use gantry_types::fixtures;

    use super::*;

    fn running(id: i64, model: &Model, port: u16) -> ModelInstance {
        let mut instance = fixtures::instance(
            id,
            model,
            u32::try_from(id).unwrap(),
            InstanceState::Running,
        );
        instance.port = Some(port);
        instance.address = Some(format!("127.0.0.1:{port}"));
        instance
    }

    fn route_of(backends: &[&Arc<Backend>]) -> ModelRoute {
        ModelRoute {
            name: Arc::from("tiny"),
            name_header: HeaderValue::from_static("tiny"),
            created: 0,
            backends: backends.iter().map(|b| Arc::clone(b)).collect(),
            cursor: Arc::default(),
            metrics: OnceLock::new(),
        }
    }

    fn backend(id: i64, port: u16) -> Arc<Backend> {
        let model = fixtures::model(1, "tiny");
        Arc::new(Backend::from_instance(&running(id, &model, port)).unwrap())
    }

    /// Connections to an instance that answers every request on them with `ok`, taken
    /// one request each and given back.
    async fn used_connections(backend: &Backend, listener: tokio::net::TcpListener, n: usize) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        tokio::spawn(async move {
            loop {
                let (mut socket, _) = listener.accept().await.unwrap();
                tokio::spawn(async move {
                    let mut buffer = vec![0u8; 4096];
                    while let Ok(read) = socket.read(&mut buffer).await {
                        if read == 0 {
                            return;
                        }
                        let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                        if socket.write_all(answer).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        let request = crate::upstream::Outgoing {
            method: "POST",
            path: "/v1/completions",
            query: None,
            host: b"instance",
            headers: b"",
            body: b"",
        };
        let mut connections = Vec::new();
        for _ in 0..n {
            let mut connection = backend.connect().await.unwrap();
            connection.send(request).await.unwrap();
            while let Some(data) = std::future::poll_fn(|cx| connection.poll_body(cx)).await {
                data.unwrap();
            }
            connections.push(connection);
        }
        for connection in connections {
            backend.give_back(connection, Instant::now());
        }
    }

    #[tokio::test]
    async fn an_instance_that_leaves_routing_keeps_no_idle_connection() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let routed = backend(1, port);
        used_connections(&routed, listener, 2).await;
        assert_eq!(routed.pool.idle_count(), 2, "kept while it is routed");
        routed.leave_routing();
        assert_eq!(routed.pool.idle_count(), 0, "closed when it leaves");
        // A request under way when it left ends: its connection is closed, not kept.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let left = backend(2, listener.local_addr().unwrap().port());
        left.leave_routing();
        used_connections(&left, listener, 1).await;
        assert_eq!(left.pool.idle_count(), 0);
    }

    const EJECT_AT_ONCE: EjectionPolicy = EjectionPolicy {
        eject_after: 1,
        cooldown: Duration::from_secs(60),
    };

    #[test]
    fn an_ejected_instance_is_not_picked_while_its_model_has_another() {
        let (first, second) = (backend(1, 9001), backend(2, 9002));
        let route = route_of(&[&first, &second]);
        assert!(first.record_failure(&EJECT_AT_ONCE).is_some());
        assert!(first.is_ejected());
        for _ in 0..6 {
            assert_eq!(route.pick(&[]).unwrap().instance_id, 2);
        }
        // The other instance failed this request already: the ejected one, untried,
        // is what is left.
        assert_eq!(route.pick(&[2]).unwrap().instance_id, 1);
        // A success brings it back at once.
        assert!(first.record_success().is_some());
        let picked: HashSet<i64> = (0..4)
            .map(|_| route.pick(&[]).unwrap().instance_id)
            .collect();
        assert_eq!(picked, HashSet::from([1, 2]));
    }

    #[test]
    fn with_every_instance_ejected_the_least_bad_one_still_serves() {
        let (first, second) = (backend(1, 9001), backend(2, 9002));
        let route = route_of(&[&first, &second]);
        first.record_failure(&EJECT_AT_ONCE).unwrap();
        second.record_failure(&EJECT_AT_ONCE).unwrap();
        // The first is also stuck with a request.
        let _stuck = InFlightGuard::start(Arc::clone(&first));
        for _ in 0..4 {
            assert_eq!(route.pick(&[]).unwrap().instance_id, 2);
        }
    }

    #[test]
    fn an_instance_that_left_routing_is_never_picked_from_a_stale_route() {
        let (first, second) = (backend(1, 9001), backend(2, 9002));
        let route = route_of(&[&first, &second]);
        first.leave_routing();
        for _ in 0..4 {
            assert_eq!(route.pick(&[]).unwrap().instance_id, 2);
        }
        assert_eq!(route.pick(&[2]).unwrap().instance_id, 2);
        second.leave_routing();
        assert!(route.pick(&[]).is_none());
    }

    #[tokio::test]
    async fn a_request_waits_for_a_route_that_is_on_its_way_and_no_longer() {
        let table = Arc::new(RoutingTable::default());
        let name: Arc<str> = Arc::from("tiny");
        // Nothing comes: the wait ends at its limit with no route.
        let began = Instant::now();
        assert!(table
            .wait_for("tiny", Duration::from_millis(50))
            .await
            .is_none());
        assert!(began.elapsed() >= Duration::from_millis(50));

        // The route arrives while the request waits (the change reached this server
        // after the store already said the instance runs).
        let setter = Arc::clone(&table);
        let set_name = Arc::clone(&name);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(30)).await;
            // Another model's route first: the waiter must keep waiting for its own.
            setter.set(
                Arc::from("other"),
                Some(Arc::new(route_of(&[&backend(9, 9009)]))),
            );
            tokio::time::sleep(Duration::from_millis(30)).await;
            setter.set(set_name, Some(Arc::new(route_of(&[&backend(1, 9001)]))));
        });
        let route = table
            .wait_for("tiny", Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(route.backends[0].instance_id, 1);

        // A miss is remembered briefly, then forgotten.
        assert!(!table.recently_missed("gone"));
        table.missed("gone");
        assert!(table.recently_missed("gone"));
        tokio::time::sleep(MISS_RECHECK).await;
        assert!(!table.recently_missed("gone"));
    }

    #[tokio::test]
    async fn the_table_signals_requests_when_an_instance_stops_running_or_moves() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&StoreConfig {
            url: format!("sqlite://{}/gantry.db", dir.path().display()),
            max_connections: 1,
        })
        .await
        .unwrap();
        let table = RoutingTable::default();
        let mut tracker = Tracker::default();
        let model = fixtures::model(1, "tiny");
        tracker
            .apply(
                &Change::Model(ChangeKind::Created, model.clone()),
                &store,
                &table,
            )
            .await;
        let instance = running(1, &model, 9001);
        tracker
            .apply(
                &Change::Instance(ChangeKind::Updated, instance.clone()),
                &store,
                &table,
            )
            .await;
        let routed = Arc::clone(&table.get("tiny").unwrap().backends[0]);

        // Reported running again at the same address: the same backend, no signal.
        tracker
            .apply(
                &Change::Instance(ChangeKind::Updated, instance.clone()),
                &store,
                &table,
            )
            .await;
        assert!(Arc::ptr_eq(
            &routed,
            &table.get("tiny").unwrap().backends[0]
        ));
        assert!(!routed.has_left_routing());

        // Restarted on another port: the old backend is signalled.
        let moved = running(1, &model, 9002);
        tracker
            .apply(
                &Change::Instance(ChangeKind::Updated, moved.clone()),
                &store,
                &table,
            )
            .await;
        assert!(routed.has_left_routing());
        let current = Arc::clone(&table.get("tiny").unwrap().backends[0]);
        assert_eq!(current.address, "127.0.0.1:9002");

        // Failing its health probe: out of the table, and a request waiting on it wakes.
        let waiter = tokio::spawn({
            let current = Arc::clone(&current);
            async move { current.left_routing().await }
        });
        let unhealthy = ModelInstance {
            state: InstanceState::Unhealthy,
            ..moved
        };
        tracker
            .apply(
                &Change::Instance(ChangeKind::Updated, unhealthy),
                &store,
                &table,
            )
            .await;
        assert!(table.get("tiny").is_none());
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .unwrap()
            .unwrap();

        // A deletion signals too.
        let other = running(2, &model, 9003);
        tracker
            .apply(
                &Change::Instance(ChangeKind::Updated, other.clone()),
                &store,
                &table,
            )
            .await;
        let routed = Arc::clone(&table.get("tiny").unwrap().backends[0]);
        tracker
            .apply(
                &Change::Instance(ChangeKind::Deleted, other),
                &store,
                &table,
            )
            .await;
        assert!(routed.has_left_routing());

        // The periodic re-read signals what it no longer finds (the store holds no
        // running instance here).
        let unseen = running(3, &model, 9004);
        tracker
            .apply(
                &Change::Instance(ChangeKind::Updated, unseen),
                &store,
                &table,
            )
            .await;
        let routed = Arc::clone(&table.get("tiny").unwrap().backends[0]);
        tracker.refresh(&store, &table).await.unwrap();
        assert!(table.get("tiny").is_none());
        assert!(routed.has_left_routing());
    }
}
