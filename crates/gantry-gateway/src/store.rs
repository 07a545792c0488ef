//! What the gateway reads from and writes to the store, behind one trait: the production
//! implementation is `gantry_store::Store` itself; tests hand the gateway
//! `testing::MemoryStore` instead, and need no database.
//!
//! Every method is one of the store's own, with the same meaning (each is documented
//! there), so the store-backed implementation only forwards. Nothing here is on a routed
//! request's path: the routing tracker, the route table, the key limiter, the usage
//! flusher and `/metrics` call it from their own tasks, and a request calls it only when
//! its model is not in the routing table (to tell "no such model" from "not running").
//!
//! Authentication is not here: the shared `gantry_auth::Authenticator` reads users, API
//! keys and workers itself, for the management API and the gateway alike.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use gantry_store::{
    Change, InstanceFilter, KeyLoad, ModelFilter, Page, Store, StoreError, StoredProvider,
    UsageIncrement,
};
use gantry_types::{
    ApiKey, InstanceState, Model, ModelInstance, ModelRoute, Timestamp, WorkerState,
};
use tokio::sync::broadcast;

/// What a [`GatewayStore`] method returns: a boxed future, so that the trait can be held
/// as `Arc<dyn GatewayStore>` without making the gateway generic.
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// The part of the store the gateway uses.
pub trait GatewayStore: std::fmt::Debug + Send + Sync + 'static {
    /// The committed changes, from now on (subscribe before reading, so that nothing
    /// between the two is lost).
    fn subscribe(&self) -> broadcast::Receiver<Arc<Change>>;

    /// A model by id (the routing tracker, for an instance of a model it has not seen).
    fn get_model(&self, id: i64) -> StoreFuture<'_, Model>;

    /// A model by name (a request whose model is not in the routing table).
    fn get_model_by_name<'a>(&'a self, name: &'a str) -> StoreFuture<'a, Model>;

    /// A page of models and how many there are.
    fn list_models<'a>(
        &'a self,
        filter: &'a ModelFilter,
        page: Page,
    ) -> StoreFuture<'a, (Vec<Model>, u64)>;

    /// A page of instances and how many there are.
    fn list_instances<'a>(
        &'a self,
        filter: &'a InstanceFilter,
        page: Page,
    ) -> StoreFuture<'a, (Vec<ModelInstance>, u64)>;

    /// Every model provider, with its key sealed.
    fn list_providers(&self) -> StoreFuture<'_, Vec<StoredProvider>>;

    /// Every model route.
    fn list_routes(&self) -> StoreFuture<'_, Vec<ModelRoute>>;

    /// The API keys with any limit (routes, requests or tokens per minute).
    fn limited_api_keys(&self) -> StoreFuture<'_, Vec<ApiKey>>;

    /// Replaces this server's share of the limited keys' counts.
    fn publish_key_load<'a>(
        &'a self,
        server_id: &'a str,
        loads: &'a [KeyLoad],
    ) -> StoreFuture<'a, ()>;

    /// The other servers' counts, summed per key, written since `since`.
    fn key_load_of_others<'a>(
        &'a self,
        server_id: &'a str,
        since: Timestamp,
    ) -> StoreFuture<'a, Vec<KeyLoad>>;

    /// Adds usage to the per-minute sums.
    fn add_usage<'a>(&'a self, increments: &'a [UsageIncrement]) -> StoreFuture<'a, ()>;

    /// How many instances are in each state (`/metrics`).
    fn count_instances_by_state(&self) -> StoreFuture<'_, Vec<(InstanceState, u64)>>;

    /// How many workers are in each state (`/metrics`).
    fn count_workers_by_state(&self) -> StoreFuture<'_, Vec<(WorkerState, u64)>>;
}

/// The production implementation: each method is the store's own.
impl GatewayStore for Store {
    fn subscribe(&self) -> broadcast::Receiver<Arc<Change>> {
        Store::subscribe(self)
    }

    fn get_model(&self, id: i64) -> StoreFuture<'_, Model> {
        Box::pin(Store::get_model(self, id))
    }

    fn get_model_by_name<'a>(&'a self, name: &'a str) -> StoreFuture<'a, Model> {
        Box::pin(Store::get_model_by_name(self, name))
    }

    fn list_models<'a>(
        &'a self,
        filter: &'a ModelFilter,
        page: Page,
    ) -> StoreFuture<'a, (Vec<Model>, u64)> {
        Box::pin(Store::list_models(self, filter, page))
    }

    fn list_instances<'a>(
        &'a self,
        filter: &'a InstanceFilter,
        page: Page,
    ) -> StoreFuture<'a, (Vec<ModelInstance>, u64)> {
        Box::pin(Store::list_instances(self, filter, page))
    }

    fn list_providers(&self) -> StoreFuture<'_, Vec<StoredProvider>> {
        Box::pin(Store::list_providers(self))
    }

    fn list_routes(&self) -> StoreFuture<'_, Vec<ModelRoute>> {
        Box::pin(Store::list_routes(self))
    }

    fn limited_api_keys(&self) -> StoreFuture<'_, Vec<ApiKey>> {
        Box::pin(Store::limited_api_keys(self))
    }

    fn publish_key_load<'a>(
        &'a self,
        server_id: &'a str,
        loads: &'a [KeyLoad],
    ) -> StoreFuture<'a, ()> {
        Box::pin(Store::publish_key_load(self, server_id, loads))
    }

    fn key_load_of_others<'a>(
        &'a self,
        server_id: &'a str,
        since: Timestamp,
    ) -> StoreFuture<'a, Vec<KeyLoad>> {
        Box::pin(Store::key_load_of_others(self, server_id, since))
    }

    fn add_usage<'a>(&'a self, increments: &'a [UsageIncrement]) -> StoreFuture<'a, ()> {
        Box::pin(Store::add_usage(self, increments))
    }

    fn count_instances_by_state(&self) -> StoreFuture<'_, Vec<(InstanceState, u64)>> {
        Box::pin(Store::count_instances_by_state(self))
    }

    fn count_workers_by_state(&self) -> StoreFuture<'_, Vec<(WorkerState, u64)>> {
        Box::pin(Store::count_workers_by_state(self))
    }
}
