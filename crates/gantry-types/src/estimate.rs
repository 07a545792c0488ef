//! `POST /api/v1/models/estimate`: what a model would need and where it would go, asked
//! before the model exists. The request body is a [`ModelCreate`](crate::ModelCreate);
//! the answer is a [`ModelEstimate`]. Nothing is stored.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::backend::BackendName;
use crate::claim::ResourceClaim;
use crate::parts::{ClaimParts, ReservationParts};
use crate::placement::Placement;
use crate::worker::WorkerState;

/// The answer of `POST /api/v1/models/estimate`: the estimate, where the scheduler would
/// place the model's replicas now, and the verdict of every worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ModelEstimate {
    /// The backend the estimate is for.
    pub backend: BackendName,
    /// llama.cpp: the context (tokens) the estimate assumed: `--ctx-size` when given (padded
    /// up to a multiple of 256), else the trained context capped at 8192, which is then
    /// passed to `llama-server`. `None` for other backends.
    pub context_size: Option<u32>,
    /// What one instance needs, in total and by part.
    pub parts: ClaimParts,
    /// The claim the scheduler places, exactly as it would be stored with an instance.
    pub claim: ResourceClaim,
    /// The model's `replicas`, placed one after another on the cluster as it is now (each
    /// booked before the next, as the scheduler does), in replica order.
    pub replicas: Vec<PlacementVerdict>,
    /// Every registered worker, in id order: whether one instance would fit there now.
    pub workers: Vec<WorkerVerdict>,
}

/// Whether one instance can be placed, where and with which parts, or why not.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PlacementVerdict {
    /// Whether it fits.
    pub fits: bool,
    /// Where it would go (worker, GPUs and the bytes on each, RAM, layout), when it fits;
    /// its `instance_id` is 0, since no instance exists.
    pub placement: Option<Placement>,
    /// What those bytes are for, when it fits.
    pub parts: Option<ReservationParts>,
    /// Why it does not fit, in the words a pending instance of the model would show.
    pub reason: Option<String>,
}

/// One worker's verdict on one instance of the model, against what is placed on it now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct WorkerVerdict {
    pub worker_id: i64,
    pub worker_name: String,
    /// The worker's state; only `ready` workers receive instances.
    pub worker_state: WorkerState,
    /// Whether the worker's GPUs are simulated (declared by its configuration, not detected).
    pub simulated_gpus: bool,
    /// Whether one instance fits on this worker.
    pub fits: bool,
    /// Where it would go on this worker, when it fits.
    pub placement: Option<Placement>,
    /// What those bytes are for, when it fits.
    pub parts: Option<ReservationParts>,
    /// Why it does not fit here, in the scheduler's words.
    pub reason: Option<String>,
}
