//! What the scheduler is asked to place: a [`PlacementRequest`] for one model instance.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use gantry_types::claim::ResourceClaim;

/// How to choose among workers and GPUs that all fit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Strategy {
    /// Prefer the emptiest worker, then the emptiest GPUs: spreads load and failure domains.
    #[default]
    Spread,
    /// Prefer the fullest worker that still fits, then the GPUs left fullest: keeps whole
    /// workers and GPUs free for large models.
    Binpack,
}

/// A user's choice of exact GPUs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManualGpuSelection {
    /// The worker, by name.
    pub worker_name: String,
    /// The GPUs on it, by device index; at least one, no repeats.
    pub gpu_indexes: Vec<u32>,
}

/// One model instance to place.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlacementRequest {
    /// The instance being placed.
    pub instance_id: i64,
    /// The model it serves (for messages).
    pub model_name: String,
    /// The backend that will run it; only workers listing it are eligible.
    pub backend: String,
    /// What it needs, from estimation.
    pub claim: ResourceClaim,
    /// Labels an eligible worker must carry, all of them with these exact values.
    pub selector: BTreeMap<String, String>,
    /// Exact GPUs chosen by the user; the other filters still apply.
    pub manual: Option<ManualGpuSelection>,
    /// How to choose among fitting candidates.
    pub strategy: Strategy,
    /// Whether the model may be split over several GPUs of one worker (tensor parallelism for
    /// vLLM and SGLang, a layer split for llama.cpp).
    pub allow_tensor_parallel: bool,
    /// Whether part or all of the model may run on the CPU (llama.cpp only).
    pub allow_cpu_offload: bool,
    /// vLLM / SGLang data parallelism: this many replicas of the tensor-parallel group, all on
    /// one worker. `None` means 1.
    pub data_parallel_size: Option<u32>,
    /// Prefer workers that have this installed (`name` or `name@version`, as in
    /// [`crate::WorkerView::installed`]): they are tried first, the others (which install it
    /// on demand) only when none of them fits.
    #[serde(default)]
    pub prefer_installed: Option<String>,
    /// Only workers with this installed are eligible (the first pass of a preference).
    #[serde(skip)]
    pub(crate) only_installed: Option<String>,
}

impl PlacementRequest {
    /// A request with no selector, no manual selection, the `Spread` strategy, tensor
    /// parallelism allowed, CPU offload not allowed, and no data parallelism.
    pub fn new(
        instance_id: i64,
        model_name: impl Into<String>,
        backend: impl Into<String>,
        claim: ResourceClaim,
    ) -> Self {
        PlacementRequest {
            instance_id,
            model_name: model_name.into(),
            backend: backend.into(),
            claim,
            selector: BTreeMap::new(),
            manual: None,
            strategy: Strategy::Spread,
            allow_tensor_parallel: true,
            allow_cpu_offload: false,
            data_parallel_size: None,
            prefer_installed: None,
            only_installed: None,
        }
    }
}
