//! The store-facing part of routing: the task that builds the table from the store at
//! start-up and keeps it current from the change feed and a periodic re-read.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::http::HeaderValue;
use gantry_store::{Change, ChangeKind, InstanceFilter, ModelFilter, Page, StoreError};
use gantry_types::{InstanceState, Model, ModelInstance};
use tokio::sync::broadcast::error::RecvError;
use tokio::time::Instant;

use crate::store::GatewayStore;
use crate::GatewayContext;

use super::backend::Backend;
use super::table::{ModelRoute, RoutingTable};

/// How often the whole table is re-read from the store.
pub const REFRESH_INTERVAL: Duration = Duration::from_secs(5);

/// Page size of the refresh reads.
const REFRESH_PAGE: u32 = 1000;

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
pub(super) struct Tracker {
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

    pub(super) async fn apply(
        &mut self,
        change: &Change,
        store: &dyn GatewayStore,
        table: &RoutingTable,
    ) {
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
    pub(super) async fn refresh(
        &mut self,
        store: &dyn GatewayStore,
        table: &RoutingTable,
    ) -> Result<(), StoreError> {
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
    tracker.refresh(&*context.store, &table).await?;
    let store = Arc::clone(&context.store);
    let shutdown = context.shutdown.clone();
    context.tasks.spawn(async move {
        let mut tick = tokio::time::interval_at(Instant::now() + REFRESH_INTERVAL, REFRESH_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                change = changes.recv() => match change {
                    Ok(change) => tracker.apply(&change, &*store, &table).await,
                    Err(RecvError::Lagged(missed)) => {
                        tracing::warn!(missed, "gateway routing fell behind the change feed; re-reading the store");
                        if let Err(e) = tracker.refresh(&*store, &table).await {
                            tracing::error!(error = %e, "refresh the gateway routing table");
                        }
                    }
                    Err(RecvError::Closed) => return,
                },
                _ = tick.tick() => {
                    if let Err(e) = tracker.refresh(&*store, &table).await {
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
