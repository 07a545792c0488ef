//! What the bytes of a reservation are for: [`ReservationParts`] splits the bytes a
//! [`Placement`](crate::placement::Placement) reserves on each GPU and in RAM into weights,
//! KV cache, compute buffers and fixed overhead, so a person can see why a model fits or
//! does not; [`ClaimParts`] does the same for a claim before it is placed.
//!
//! The parts are computed by `gantry_sched::parts` from the claim and the placement; on
//! every GPU and in RAM they add up exactly to the bytes the placement reserves
//! (`total_bytes`).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The bytes of one placement, part by part.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ReservationParts {
    /// One entry per GPU of the placement, in device-index order.
    pub gpus: Vec<GpuParts>,
    /// The worker's system memory.
    pub ram: RamParts,
}

/// What one GPU holds for an instance. Every byte is in exactly one part:
/// `weights + kv_cache + extra_kv_cache + compute_buffer + overhead + declared = total`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct GpuParts {
    /// Device index on the worker.
    pub index: u32,
    /// Bytes reserved on the GPU: the placement's figure for it.
    pub total_bytes: u64,
    /// Model weights: llama.cpp the weights of the blocks on this GPU (and the output layer
    /// on the last GPU of a full offload); vLLM / SGLang this GPU's shard of every layer.
    pub weights_bytes: u64,
    /// KV cache: llama.cpp the cache of the blocks on this GPU for the whole context;
    /// vLLM / SGLang this GPU's KV heads for the minimum tokens the engine insists on (its
    /// maximum model length).
    pub kv_cache_bytes: u64,
    /// vLLM / SGLang: the rest of the reserved fraction, which the engine fills with more KV
    /// cache (more sequences at once). Zero for llama.cpp and custom backends.
    pub extra_kv_cache_bytes: u64,
    /// llama.cpp: the compute buffer (activations of one micro-batch) every GPU holds.
    pub compute_buffer_bytes: u64,
    /// Fixed overhead: the CUDA context for llama.cpp; for vLLM / SGLang the CUDA context,
    /// the activation peak of the start-up profiling run and CUDA graphs; for a custom
    /// backend the per-GPU overhead it declares.
    pub overhead_bytes: u64,
    /// A custom backend: the bytes per GPU it declares for itself.
    pub declared_bytes: u64,
    /// vLLM / SGLang: the fraction of the GPU's total memory the engine takes
    /// (`--gpu-memory-utilization`, `--mem-fraction-static`); `total_bytes` is this fraction
    /// of the GPU.
    pub reserved_fraction: Option<f64>,
    /// llama.cpp: which layers run on this GPU.
    pub layers: Option<LayerRange>,
}

/// What an instance holds in the worker's system memory. Every byte is in exactly one
/// part: `weights + embedding + kv_cache + compute_buffer + logits + process = total`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RamParts {
    /// Bytes reserved in RAM: the placement's figure.
    pub total_bytes: u64,
    /// llama.cpp: the weights of the blocks on the host, and the output layer unless it is
    /// on a GPU.
    pub weights_bytes: u64,
    /// llama.cpp: the input token embedding, always on the host.
    pub embedding_bytes: u64,
    /// llama.cpp: the KV cache of the blocks on the host.
    pub kv_cache_bytes: u64,
    /// llama.cpp: the host compute buffer, needed whenever any layer runs on the CPU.
    pub compute_buffer_bytes: u64,
    /// llama.cpp: the output logits buffer.
    pub logits_bytes: u64,
    /// The process itself (runtime, tokenizer, buffers); for vLLM / SGLang one process per
    /// data-parallel replica; for a custom backend what it declares.
    pub process_bytes: u64,
    /// llama.cpp: which layers run on the CPU; `None` when none do.
    pub layers: Option<LayerRange>,
}

/// A run of llama.cpp layers on one device: `blocks` transformer blocks from
/// `first_block`, and whether the output layer is there too.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct LayerRange {
    /// Index of the first block; meaningless when `blocks` is 0.
    pub first_block: u32,
    /// Number of consecutive blocks.
    pub blocks: u32,
    /// Whether the output layer (output norm and projection) is on this device.
    pub output_layer: bool,
}

/// The parts of a claim before placement: what the model needs in total, whatever the
/// layout. Per-GPU figures are paid on every GPU the instance uses.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ClaimParts {
    /// All weights of the model: llama.cpp blocks, output layer and input embedding;
    /// vLLM / SGLang the sum of the safetensors tensors; zero for a custom backend.
    pub weights_bytes: u64,
    /// KV cache: llama.cpp for the whole context over all blocks; vLLM / SGLang for the
    /// minimum tokens over all KV heads (one GPU's worth; more GPUs may replicate heads).
    pub kv_cache_bytes: u64,
    /// llama.cpp: the compute buffer on each GPU used.
    pub per_gpu_compute_buffer_bytes: u64,
    /// Fixed overhead on each GPU used (see [`GpuParts::overhead_bytes`]).
    pub per_gpu_overhead_bytes: u64,
    /// llama.cpp: the host compute buffer, needed unless every layer is on GPUs.
    pub host_compute_buffer_bytes: u64,
    /// RAM the process needs wherever its layers run: for llama.cpp the embedding, the
    /// logits buffer and the process; for vLLM / SGLang per data-parallel replica.
    pub base_ram_bytes: u64,
    /// A custom backend: GPUs it declares and bytes on each, on top of the overhead.
    pub declared_gpu_count: Option<u32>,
    /// A custom backend: bytes per GPU it declares.
    pub declared_bytes_per_gpu: Option<u64>,
    /// vLLM / SGLang: the fraction of each GPU the engine takes on one GPU.
    pub reserved_fraction: Option<f64>,
    /// GPU bytes to hold the whole model on one GPU (llama.cpp full offload, a custom
    /// backend's per-GPU bytes); `None` for vLLM / SGLang, whose reservation depends on the
    /// GPU's size.
    pub single_gpu_bytes: Option<u64>,
}
