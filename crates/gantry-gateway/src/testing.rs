//! Test doubles for the gateway's own tests and its integration tests (feature `testing`,
//! which only dev-dependencies enable): [`MemoryStore`], a [`GatewayStore`] that holds
//! everything in memory, so that a gateway runs with no database.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use gantry_store::{
    Change, ChangeKind, InstanceFilter, KeyLoad, ModelFilter, Page, StoreError, StoredProvider,
    UsageIncrement,
};
use gantry_types::{
    ApiKey, InstanceState, ListFilter, Model, ModelInstance, ModelRoute, Timestamp, Worker,
    WorkerState,
};
use tokio::sync::broadcast;

use crate::store::{GatewayStore, StoreFuture};

/// A [`GatewayStore`] in memory. Each write publishes the change the real store would,
/// so a gateway started on it follows writes made while it runs; what the gateway
/// writes (usage, its share of key counts) is kept for the test to read.
#[derive(Debug)]
pub struct MemoryStore {
    state: Mutex<State>,
    changes: broadcast::Sender<Arc<Change>>,
}

#[derive(Debug, Default)]
struct State {
    models: BTreeMap<i64, Model>,
    instances: BTreeMap<i64, ModelInstance>,
    workers: BTreeMap<i64, Worker>,
    providers: BTreeMap<i64, StoredProvider>,
    routes: BTreeMap<i64, ModelRoute>,
    api_keys: BTreeMap<i64, ApiKey>,
    /// Each server's share of the limited keys' counts, and when it was written.
    key_loads: HashMap<String, (Timestamp, Vec<KeyLoad>)>,
    /// Every increment the gateway wrote, in order.
    usage: Vec<UsageIncrement>,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self {
            state: Mutex::default(),
            // As deep as the store's own feed.
            changes: broadcast::channel(4096).0,
        }
    }
}

/// The page `page` of `items` and how many there are, as the store pages.
fn paged<T: Clone>(items: Vec<T>, page: Page) -> (Vec<T>, u64) {
    let total = items.len() as u64;
    let skip = usize::try_from(page.offset()).unwrap_or(usize::MAX);
    let taken = items
        .into_iter()
        .skip(skip)
        .take(page.per_page as usize)
        .collect();
    (taken, total)
}

/// Counts per state, in the order each state is first seen.
fn counts<S: PartialEq + Copy>(states: impl Iterator<Item = S>) -> Vec<(S, u64)> {
    let mut by_state: Vec<(S, u64)> = Vec::new();
    for state in states {
        match by_state.iter_mut().find(|(seen, _)| *seen == state) {
            Some((_, n)) => *n += 1,
            None => by_state.push((state, 1)),
        }
    }
    by_state
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn publish(&self, change: Change) {
        // No receiver yet is fine: a gateway reads the state when it starts.
        let _ = self.changes.send(Arc::new(change));
    }

    /// Creates or replaces `value` under `id` in the table `table` picks, and publishes
    /// it as created or updated, as `change` wraps it.
    fn put<T: Clone>(
        &self,
        id: i64,
        value: T,
        table: impl FnOnce(&mut State) -> &mut BTreeMap<i64, T>,
        change: fn(ChangeKind, T) -> Change,
    ) {
        let existed = table(&mut self.state()).insert(id, value.clone()).is_some();
        self.publish(change(Self::kind(existed), value));
    }

    fn kind(existed: bool) -> ChangeKind {
        if existed {
            ChangeKind::Updated
        } else {
            ChangeKind::Created
        }
    }

    /// Creates or replaces a model.
    pub fn put_model(&self, model: Model) {
        self.put(model.id, model, |state| &mut state.models, Change::Model);
    }

    /// Deletes a model and its instances, as the store's cascade does.
    pub fn delete_model(&self, id: i64) {
        let removed = {
            let mut state = self.state();
            state
                .instances
                .retain(|_, instance| instance.model_id != id);
            state.models.remove(&id)
        };
        if let Some(model) = removed {
            self.publish(Change::Model(ChangeKind::Deleted, model));
        }
    }

    /// Creates or replaces an instance (a worker's state report, a placement).
    pub fn put_instance(&self, instance: ModelInstance) {
        let id = instance.id;
        self.put(id, instance, |state| &mut state.instances, Change::Instance);
    }

    /// An instance as it is now.
    pub fn instance(&self, id: i64) -> Option<ModelInstance> {
        self.state().instances.get(&id).cloned()
    }

    /// Deletes an instance.
    pub fn delete_instance(&self, id: i64) {
        let removed = self.state().instances.remove(&id);
        if let Some(instance) = removed {
            self.publish(Change::Instance(ChangeKind::Deleted, instance));
        }
    }

    /// Creates or replaces a worker (what `/metrics` counts).
    pub fn put_worker(&self, worker: Worker) {
        self.put(
            worker.id,
            worker,
            |state| &mut state.workers,
            Change::Worker,
        );
    }

    /// Creates or replaces a provider (its key sealed, as the store holds it).
    pub fn put_provider(&self, stored: StoredProvider) {
        let provider = stored.provider.clone();
        let existed = self.state().providers.insert(provider.id, stored).is_some();
        self.publish(Change::Provider(Self::kind(existed), provider));
    }

    /// Creates or replaces a route.
    pub fn put_route(&self, route: ModelRoute) {
        self.put(route.id, route, |state| &mut state.routes, Change::Route);
    }

    /// Creates or replaces an API key (what the key limiter reads).
    pub fn put_api_key(&self, key: ApiKey) {
        self.put(key.id, key, |state| &mut state.api_keys, Change::ApiKey);
    }

    /// Writes another server's share of the limited keys' counts.
    pub fn put_key_load(&self, server_id: &str, loads: Vec<KeyLoad>) {
        self.state()
            .key_loads
            .insert(server_id.to_owned(), (Timestamp::now(), loads));
    }

    /// A server's share of the limited keys' counts as it last wrote it.
    pub fn key_load_of(&self, server_id: &str) -> Option<Vec<KeyLoad>> {
        self.state()
            .key_loads
            .get(server_id)
            .map(|(_, loads)| loads.clone())
    }

    /// Every usage increment written so far, in order.
    pub fn usage(&self) -> Vec<UsageIncrement> {
        self.state().usage.clone()
    }
}

fn ready<'a, T: Send + 'a>(value: Result<T, StoreError>) -> StoreFuture<'a, T> {
    Box::pin(std::future::ready(value))
}

impl GatewayStore for MemoryStore {
    fn subscribe(&self) -> broadcast::Receiver<Arc<Change>> {
        self.changes.subscribe()
    }

    fn get_model(&self, id: i64) -> StoreFuture<'_, Model> {
        let found = self.state().models.get(&id).cloned();
        ready(found.ok_or_else(|| StoreError::NotFound {
            resource: "model",
            key: id.to_string(),
        }))
    }

    fn get_model_by_name<'a>(&'a self, name: &'a str) -> StoreFuture<'a, Model> {
        let found = self
            .state()
            .models
            .values()
            .find(|model| model.name == name)
            .cloned();
        ready(found.ok_or_else(|| StoreError::NotFound {
            resource: "model",
            key: name.to_owned(),
        }))
    }

    fn list_models<'a>(
        &'a self,
        filter: &'a ModelFilter,
        page: Page,
    ) -> StoreFuture<'a, (Vec<Model>, u64)> {
        let matching = self
            .state()
            .models
            .values()
            .filter(|model| filter.matches(model))
            .cloned()
            .collect();
        ready(Ok(paged(matching, page)))
    }

    fn list_instances<'a>(
        &'a self,
        filter: &'a InstanceFilter,
        page: Page,
    ) -> StoreFuture<'a, (Vec<ModelInstance>, u64)> {
        let matching = self
            .state()
            .instances
            .values()
            .filter(|instance| filter.matches(instance))
            .cloned()
            .collect();
        ready(Ok(paged(matching, page)))
    }

    fn list_providers(&self) -> StoreFuture<'_, Vec<StoredProvider>> {
        let mut providers: Vec<StoredProvider> = self.state().providers.values().cloned().collect();
        providers.sort_by(|a, b| a.provider.name.cmp(&b.provider.name));
        ready(Ok(providers))
    }

    fn list_routes(&self) -> StoreFuture<'_, Vec<ModelRoute>> {
        let mut routes: Vec<ModelRoute> = self.state().routes.values().cloned().collect();
        routes.sort_by(|a, b| a.name.cmp(&b.name));
        ready(Ok(routes))
    }

    fn limited_api_keys(&self) -> StoreFuture<'_, Vec<ApiKey>> {
        let limited = self
            .state()
            .api_keys
            .values()
            .filter(|key| key.limits.is_limited())
            .cloned()
            .collect();
        ready(Ok(limited))
    }

    fn publish_key_load<'a>(
        &'a self,
        server_id: &'a str,
        loads: &'a [KeyLoad],
    ) -> StoreFuture<'a, ()> {
        self.put_key_load(server_id, loads.to_vec());
        ready(Ok(()))
    }

    fn key_load_of_others<'a>(
        &'a self,
        server_id: &'a str,
        since: Timestamp,
    ) -> StoreFuture<'a, Vec<KeyLoad>> {
        let mut by_key: BTreeMap<i64, KeyLoad> = BTreeMap::new();
        for (server, (at, loads)) in &self.state().key_loads {
            if server == server_id || at.as_millis() < since.as_millis() {
                continue;
            }
            for load in loads {
                let sum = by_key.entry(load.api_key_id).or_insert(KeyLoad {
                    api_key_id: load.api_key_id,
                    requests: 0,
                    tokens: 0,
                });
                sum.requests += load.requests;
                sum.tokens += load.tokens;
            }
        }
        ready(Ok(by_key.into_values().collect()))
    }

    fn add_usage<'a>(&'a self, increments: &'a [UsageIncrement]) -> StoreFuture<'a, ()> {
        self.state().usage.extend_from_slice(increments);
        ready(Ok(()))
    }

    fn count_instances_by_state(&self) -> StoreFuture<'_, Vec<(InstanceState, u64)>> {
        let counted = counts(self.state().instances.values().map(|i| i.state));
        ready(Ok(counted))
    }

    fn count_workers_by_state(&self) -> StoreFuture<'_, Vec<(WorkerState, u64)>> {
        let counted = counts(self.state().workers.values().map(|w| w.state));
        ready(Ok(counted))
    }
}
