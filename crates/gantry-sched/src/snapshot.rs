//! The scheduler's input: a [`ClusterSnapshot`] of workers, their GPUs, and what is already
//! placed on them.
//!
//! The server builds a snapshot from the store; the scheduler never reads anything else.
//! Allocatable memory is derived, never stored: `total − system reserve − claims of placed
//! instances`, per GPU and for RAM.

use std::collections::{BTreeMap, BTreeSet};

use gantry_types::placement::{GpuShare, Placement};
use serde::{Deserialize, Serialize};

/// Every worker and every placed claim at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterSnapshot {
    /// Workers; ids are unique.
    pub workers: Vec<WorkerView>,
    /// Claims of instances already placed (scheduled, starting or running).
    pub placed: Vec<PlacedClaim>,
}

/// One worker as the scheduler sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerView {
    /// Store id.
    pub id: i64,
    /// Unique name, as used in manual GPU selection and messages.
    pub name: String,
    /// Whether the worker is `ready`; any other state (not ready, unreachable, maintenance)
    /// receives no new instances.
    pub ready: bool,
    /// Labels matched by placement selectors.
    pub labels: BTreeMap<String, String>,
    /// Backends the worker can run, e.g. `llama.cpp`, `vllm`, `sglang`.
    pub backends: BTreeSet<String>,
    /// Backends installed on the worker, as `name` and as `name@version` for each version.
    #[serde(default)]
    pub installed: BTreeSet<String>,
    /// GPUs; indexes are unique within the worker.
    pub gpus: Vec<GpuView>,
    /// Total system memory.
    pub system_memory_bytes: u64,
    /// CPU cores.
    pub cpu_count: u32,
    /// Memory kept back for the system and never allocated to instances.
    pub reserve: SystemReserve,
}

/// One GPU of a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuView {
    /// Device index on the worker (what `CUDA_VISIBLE_DEVICES` names).
    pub index: u32,
    /// Total device memory.
    pub total_memory_bytes: u64,
    /// A simulated device (declared by worker configuration, not detected); scheduled like a
    /// real one, and reported as simulated by the API.
    pub simulated: bool,
}

/// Memory the system keeps back on a worker.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SystemReserve {
    /// Bytes kept back on every GPU (display server, other tenants, fragmentation).
    pub gpu_bytes_per_gpu: u64,
    /// Bytes of system RAM kept back (OS, the worker agent itself).
    pub ram_bytes: u64,
}

/// What one placed instance holds on its worker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlacedClaim {
    /// The instance holding the claim.
    pub instance_id: i64,
    /// The worker it is placed on.
    pub worker_id: i64,
    /// Bytes held on each of its GPUs; empty for a CPU-only instance.
    pub gpus: Vec<GpuShare>,
    /// Bytes of system RAM held.
    pub ram_bytes: u64,
}

impl PlacedClaim {
    /// A claim of the same bytes on each of `gpu_indexes`.
    pub fn uniform(
        instance_id: i64,
        worker_id: i64,
        gpu_indexes: &[u32],
        bytes_per_gpu: u64,
        ram_bytes: u64,
    ) -> Self {
        PlacedClaim {
            instance_id,
            worker_id,
            gpus: gpu_indexes
                .iter()
                .map(|&index| GpuShare {
                    index,
                    bytes: bytes_per_gpu,
                })
                .collect(),
            ram_bytes,
        }
    }
}

impl From<&Placement> for PlacedClaim {
    /// The claim a placement holds, as the next snapshot will list it.
    fn from(placement: &Placement) -> Self {
        PlacedClaim {
            instance_id: placement.instance_id,
            worker_id: placement.worker_id,
            gpus: placement.gpus.clone(),
            ram_bytes: placement.ram_bytes,
        }
    }
}
