//! The operations of the management plane: what the API's handlers ask for, decided here
//! and stored through `gantry-store`.
//!
//! Handlers in `api/` parse, authorise and answer; the store persists and keeps each write
//! consistent; the rules in between live here, one module per resource: which GPUs a
//! placement by hand may use ([`instances`]), what a worker's heartbeat does to its state
//! and how it registers ([`workers`]), which replicas a model keeps when it shrinks
//! ([`replicas`]), what a change of a model does ([`models`]), that the cluster always
//! keeps an admin ([`users`]), and how a server calls a worker's own API ([`worker_api`]). Rules that are pure
//! functions are kept pure and unit-tested; the rest is a short sequence of store calls.
//!
//! Errors are [`ApiError`](crate::error::ApiError)s: a code from `gantry_types::ErrorCode`
//! and a message that says what to do; `error.rs` turns them into responses.

pub mod backends;
pub mod clusters;
pub mod instances;
pub mod models;
pub mod pools;
pub mod providers;
pub mod replicas;
pub mod routes;
pub mod users;
pub mod worker_api;
pub mod workers;
