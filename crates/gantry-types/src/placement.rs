//! The placement protocol: what the scheduler decides for one instance, stored with the
//! instance as one typed [`PlacementRecord`] and read by the worker that runs it.
//!
//! The record carries everything the worker needs and nothing it must look up elsewhere:
//!
//! * [`LaunchTemplate`]: the launch settings of the model (backend, source, arguments,
//!   environment, …) *as they were when the instance was placed*. The worker runs these, not
//!   the model's current ones, so changing a model does not restart every instance at once;
//!   the scheduler rolls the change instance by instance (see `gantry-server`'s roll
//!   controller).
//! * `placement_args`: the backend flags that make the process match its placement
//!   (`--ctx-size`, `-ngl`, `--tensor-split`, `--tensor-parallel-size`, …), derived by
//!   `gantry-backends` and appended after the template's own arguments.
//! * [`Reservation`]: the estimate ([`ResourceClaim`]) and the scheduler's [`Placement`]:
//!   the bytes the instance holds on each GPU and in RAM, which the next scheduling pass
//!   subtracts. Absent for an instance placed by hand (nothing was estimated).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::backend::BackendName;
use crate::claim::ResourceClaim;
use crate::model::{Model, ModelSource};

/// Bytes claimed on one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
pub struct GpuShare {
    /// Device index on the worker.
    pub index: u32,
    /// Bytes claimed on it.
    pub bytes: u64,
}

/// Where one instance goes, and what it holds there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Placement {
    /// The instance placed.
    pub instance_id: i64,
    /// The chosen worker.
    pub worker_id: i64,
    /// Its name.
    pub worker_name: String,
    /// Chosen GPUs in device-index order, with the bytes claimed on each; empty for CPU-only.
    pub gpus: Vec<GpuShare>,
    /// RAM claimed.
    pub ram_bytes: u64,
    /// Which tier the placement came from.
    pub kind: PlacementKind,
    /// GPUs per replica: pass as `--tensor-parallel-size` (vLLM) / `--tp` (SGLang) when
    /// above 1. For llama.cpp, the number of GPUs the blocks are split over.
    pub tensor_parallel_size: u32,
    /// Replicas of the tensor-parallel group (`--data-parallel-size`); 1 without data
    /// parallelism.
    pub data_parallel_size: u32,
    /// For llama.cpp, the layer layout to start it with.
    pub llama: Option<LlamaLayout>,
}

impl Placement {
    /// Device indexes of the chosen GPUs (for `CUDA_VISIBLE_DEVICES`).
    pub fn gpu_indexes(&self) -> Vec<u32> {
        self.gpus.iter().map(|gpu| gpu.index).collect()
    }
}

/// How llama.cpp must be started to match the placement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct LlamaLayout {
    /// Pass as `--n-gpu-layers`. The output layer counts as one layer here, as in llama.cpp:
    /// `blocks + 1` means full offload.
    pub n_gpu_layers: u32,
    /// Layers per chosen GPU in device-index order, the output layer counted on the last;
    /// pass as `--tensor-split` when there are several GPUs.
    pub tensor_split: Vec<u32>,
}

/// Which tier a placement came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
pub enum PlacementKind {
    /// The whole model on one GPU.
    SingleGpu,
    /// The whole model over several GPUs of one worker.
    MultiGpu,
    /// llama.cpp with some layers on GPUs and the rest in RAM.
    PartialOffload,
    /// Everything in RAM.
    CpuOnly,
}

/// The launch settings of a model: the part of it that decides what process runs. An
/// instance pins the template it was placed with; a model whose template changed rolls its
/// instances onto the new one.
///
/// Fields that only steer placement (`replicas`, selectors, strategy, `cpu_offload`) and
/// descriptive ones (`description`, `labels`) are not part of it: changing them restarts
/// nothing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LaunchTemplate {
    pub backend: BackendName,
    pub backend_version: Option<String>,
    pub source: ModelSource,
    /// The model's own backend arguments, as the user gave them.
    pub backend_args: Vec<String>,
    pub env: BTreeMap<String, String>,
    /// For backend `custom`: the command template.
    pub custom_command: Option<String>,
    /// vLLM-style data parallelism: N child servers, one per GPU group.
    pub data_parallel_size: Option<u32>,
}

impl Model {
    /// The launch settings of this model as it is now.
    pub fn launch_template(&self) -> LaunchTemplate {
        LaunchTemplate {
            backend: self.backend.clone(),
            backend_version: self.backend_version.clone(),
            source: self.source.clone(),
            backend_args: self.backend_args.clone(),
            env: self.env.clone(),
            custom_command: self.custom_command.clone(),
            data_parallel_size: self.data_parallel_size,
        }
    }
}

/// What the scheduler reserved for an instance: the estimate and where it went.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Reservation {
    pub claim: ResourceClaim,
    pub placement: Placement,
    /// What the placement's bytes are for, GPU by GPU and in RAM (computed from `claim` and
    /// `placement` by `gantry_sched::parts`; they add up to the placement's bytes). Absent
    /// from reservations recorded before parts were kept, and from claims that do not
    /// record them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parts: Option<crate::parts::ReservationParts>,
}

/// Everything recorded about how an instance was placed, stored with it (one typed JSON
/// column) and sent to its worker. See the module documentation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PlacementRecord {
    /// What the worker runs.
    pub launch: LaunchTemplate,
    /// Backend flags derived from the placement, appended after `launch.backend_args`.
    pub placement_args: Vec<String>,
    /// The scheduler's estimate and decision; `None` for an instance placed by hand.
    pub reservation: Option<Reservation>,
    /// For a defined backend (`launch.backend` names one): its definition at the version
    /// the instance runs, as it was when the instance was placed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub defined_backend: Option<crate::backend::DefinedBackend>,
}

impl PlacementRecord {
    /// The record of an instance placed by hand: the model's launch settings, no derived
    /// flags and no reservation.
    pub fn by_hand(model: &Model) -> Self {
        PlacementRecord {
            launch: model.launch_template(),
            placement_args: Vec::new(),
            reservation: None,
            defined_backend: None,
        }
    }

    /// The full argument list of the backend: the template's arguments, then the
    /// placement's.
    pub fn backend_args(&self) -> Vec<String> {
        let mut args = self.launch.backend_args.clone();
        args.extend(self.placement_args.iter().cloned());
        args
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::claim::{LayerBreakdown, ModelMemory};

    fn record() -> PlacementRecord {
        PlacementRecord {
            launch: LaunchTemplate {
                backend: crate::model::BackendKind::LlamaCpp.into(),
                backend_version: None,
                source: ModelSource::LocalPath {
                    path: "/m/tiny.gguf".into(),
                },
                backend_args: vec!["-c".into(), "256".into()],
                env: BTreeMap::new(),
                custom_command: None,
                data_parallel_size: None,
            },
            placement_args: vec!["-ngl".into(), "3".into()],
            defined_backend: None,
            reservation: Some(Reservation {
                claim: ResourceClaim {
                    per_gpu_overhead_bytes: 1,
                    base_ram_bytes: 2,
                    memory: ModelMemory::Layers(LayerBreakdown {
                        block_bytes: vec![3, 3],
                        block_kv_bytes: vec![1, 1],
                        output_bytes: 1,
                        host_compute_bytes: 1,
                        per_gpu_compute_bytes: 1,
                        host_embedding_bytes: 1,
                        host_logits_bytes: 0,
                        host_repack_bytes: 0,
                        tied_output_bytes: 0,
                        fixed_gpu_layers: None,
                    }),
                },
                placement: Placement {
                    instance_id: 7,
                    worker_id: 1,
                    worker_name: "w1".into(),
                    gpus: vec![GpuShare { index: 0, bytes: 9 }],
                    ram_bytes: 2,
                    kind: PlacementKind::SingleGpu,
                    tensor_parallel_size: 1,
                    data_parallel_size: 1,
                    llama: Some(LlamaLayout {
                        n_gpu_layers: 3,
                        tensor_split: vec![3],
                    }),
                },
                parts: None,
            }),
        }
    }

    #[test]
    fn a_record_survives_the_round_trip_through_json() {
        let record = record();
        let text = serde_json::to_string(&record).expect("serialisable");
        let back: PlacementRecord = serde_json::from_str(&text).expect("decodable");
        assert_eq!(back, record);
        assert_eq!(back.backend_args(), ["-c", "256", "-ngl", "3"]);
    }

    #[test]
    fn a_reservation_recorded_before_parts_still_decodes() {
        // A llama.cpp reservation as stored before claims recorded their parts.
        let old = r#"{
            "claim": {"per_gpu_overhead_bytes": 5, "base_ram_bytes": 2, "memory": {"Layers": {
                "block_bytes": [3, 3], "output_bytes": 1, "host_compute_bytes": 1,
                "fixed_gpu_layers": null}}},
            "placement": {"instance_id": 7, "worker_id": 1, "worker_name": "w1",
                "gpus": [{"index": 0, "bytes": 12}], "ram_bytes": 2, "kind": "SingleGpu",
                "tensor_parallel_size": 1, "data_parallel_size": 1,
                "llama": {"n_gpu_layers": 3, "tensor_split": [3]}}
        }"#;
        let reservation: Reservation = serde_json::from_str(old).expect("decodable");
        assert_eq!(reservation.parts, None);
        let ModelMemory::Layers(layers) = &reservation.claim.memory else {
            panic!("layered");
        };
        assert!(!layers.has_parts());
        assert_eq!(layers.per_gpu_compute_bytes, 0);
        // Without parts, none are written back.
        let text = serde_json::to_string(&reservation).expect("serialisable");
        assert!(!text.contains("\"parts\""), "{text}");
    }

    #[test]
    fn a_record_of_another_shape_does_not_decode() {
        // The untyped shape stored before records were typed.
        let old = r#"{"claim": null, "placement": null, "extra_backend_args": []}"#;
        assert!(serde_json::from_str::<PlacementRecord>(old).is_err());
    }
}
