//! Change notifications published after each committed write.

use gantry_types::{ApiKey, Model, ModelInstance, User, Worker};
use serde::{Deserialize, Serialize};

/// What happened to the object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ChangeKind {
    Created,
    Updated,
    Deleted,
}

/// One committed change, carrying the object as it is after the write (as it was
/// before, for deletions). Serialisable so it can travel to other servers.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Change {
    User(ChangeKind, User),
    ApiKey(ChangeKind, ApiKey),
    Worker(ChangeKind, Worker),
    Model(ChangeKind, Model),
    Instance(ChangeKind, ModelInstance),
}
