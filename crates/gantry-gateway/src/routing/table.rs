//! The table requests read: model name → the running instances that serve it
//! ([`ModelRoute`]), one copy per shard, and the pick of the least-loaded instance.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Duration;

use axum::http::HeaderValue;
use tokio::time::Instant;

use crate::balance::pick_least_loaded;
use crate::metrics::ModelMetrics;
use crate::shard::Sharded;

use super::backend::{Backend, LazyNow};

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
    pub(super) cursor: Arc<AtomicUsize>,
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
pub(super) const MISS_RECHECK: Duration = Duration::from_millis(250);

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

    pub(super) fn replace_all(
        &self,
        routes: HashMap<Arc<str>, Arc<ModelRoute>>,
        known: HashSet<Arc<str>>,
    ) {
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

    pub(super) fn set(&self, name: Arc<str>, route: Option<Arc<ModelRoute>>) {
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

    pub(super) fn set_known(&self, name: Arc<str>, exists: bool) {
        let mut tables = self.inner.write().unwrap_or_else(|e| e.into_inner());
        if exists {
            tables.known.insert(name);
        } else {
            tables.known.remove(&name);
        }
    }
}
