//! Change notifications published after each committed write.

use gantry_types::{ApiKey, Model, ModelInstance, ModelProvider, ModelRoute, User, Worker};
use serde::{Deserialize, Serialize};

pub use gantry_types::ChangeKind;

/// One committed change, carrying the object as it is after the write (as it was
/// before, for deletions). Serialisable so it can travel to other servers.
// Each change is allocated once and shared by every receiver as an `Arc<Change>`, so the
// size of the largest variant costs one allocation, not a copy per receiver.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Change {
    User(ChangeKind, User),
    ApiKey(ChangeKind, ApiKey),
    Worker(ChangeKind, Worker),
    Model(ChangeKind, Model),
    Instance(ChangeKind, ModelInstance),
    /// A model provider (without its key, which never travels).
    Provider(ChangeKind, ModelProvider),
    Route(ChangeKind, ModelRoute),
}

impl Change {
    /// The model of a model change.
    pub fn model(&self) -> Option<(ChangeKind, &Model)> {
        match self {
            Change::Model(kind, model) => Some((*kind, model)),
            _ => None,
        }
    }

    /// The instance of an instance change.
    pub fn instance(&self) -> Option<(ChangeKind, &ModelInstance)> {
        match self {
            Change::Instance(kind, instance) => Some((*kind, instance)),
            _ => None,
        }
    }

    /// The worker of a worker change.
    pub fn worker(&self) -> Option<(ChangeKind, &Worker)> {
        match self {
            Change::Worker(kind, worker) => Some((*kind, worker)),
            _ => None,
        }
    }

    /// The user of a user change.
    pub fn user(&self) -> Option<(ChangeKind, &User)> {
        match self {
            Change::User(kind, user) => Some((*kind, user)),
            _ => None,
        }
    }

    /// The key of an API-key change.
    pub fn api_key(&self) -> Option<(ChangeKind, &ApiKey)> {
        match self {
            Change::ApiKey(kind, key) => Some((*kind, key)),
            _ => None,
        }
    }
}
