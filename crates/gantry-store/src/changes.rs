//! Change notifications published after each committed write.

use gantry_types::{ApiKey, Model, ModelInstance, User, Worker};
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
}
