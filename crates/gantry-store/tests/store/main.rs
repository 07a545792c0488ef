//! The store against real databases: every test runs on SQLite and on the PostgreSQL that
//! `scripts/with-postgres.sh` provides. One test binary; each module is one area.

#![allow(clippy::unwrap_used)]

mod clusters;
mod coordination;
mod heartbeats;
mod lease;
mod notify;
mod reachability;
mod routes;
mod store;
mod usage;
mod vacuum;

use gantry_types::ModelCreate;

/// A request for a model of `replicas` replicas of a local GGUF on llama.cpp: what the
/// store tests create models from.
fn model_create(name: &str, replicas: u32) -> ModelCreate {
    serde_json::from_value(serde_json::json!({
        "name": name,
        "source": {"type": "local_path", "path": "/models/tiny.gguf"},
        "backend": "llama.cpp",
        "replicas": replicas,
    }))
    .expect("valid model create")
}
