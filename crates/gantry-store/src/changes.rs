//! Change notifications published after each committed write.

use gantry_types::{ApiKey, Model, ModelInstance, User, Worker};

/// What happened to the object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    Created,
    Updated,
    Deleted,
}

/// One committed change, carrying the object as it is after the write (as it was
/// before, for deletions).
#[derive(Debug, Clone)]
pub enum Change {
    User(ChangeKind, User),
    ApiKey(ChangeKind, ApiKey),
    Worker(ChangeKind, Worker),
    Model(ChangeKind, Model),
    Instance(ChangeKind, ModelInstance),
}
