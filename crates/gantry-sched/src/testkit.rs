//! Fixture builders for the unit and property tests: small workers, requests and claims in
//! one line each.

use std::collections::{BTreeMap, BTreeSet};

use crate::request::PlacementRequest;
use crate::snapshot::{GpuView, SystemReserve, WorkerView};
use crate::units::GIB;
use gantry_types::claim::{
    EngineMemory, FixedMemory, LayerBreakdown, MemoryFraction, ModelMemory, ResourceClaim,
};

/// Builds a [`WorkerView`]: ready, 256 GiB of RAM, 32 CPUs, no GPUs, no reserve, running
/// every backend the tests use.
pub(crate) struct WorkerBuilder {
    view: WorkerView,
}

pub(crate) fn worker(id: i64, name: &str) -> WorkerBuilder {
    WorkerBuilder {
        view: WorkerView {
            id,
            name: name.to_owned(),
            ready: true,
            labels: BTreeMap::new(),
            backends: ["llama.cpp", "vllm", "sglang", "custom"]
                .into_iter()
                .map(str::to_owned)
                .collect::<BTreeSet<_>>(),
            installed: BTreeSet::new(),
            gpus: Vec::new(),
            system_memory_bytes: 256 * GIB,
            cpu_count: 32,
            reserve: SystemReserve::default(),
        },
    }
}

impl WorkerBuilder {
    /// Adds `count` GPUs of `bytes` each, numbered after the existing ones.
    pub(crate) fn gpus(mut self, count: u32, bytes: u64) -> Self {
        for _ in 0..count {
            let index = u32::try_from(self.view.gpus.len()).expect("few GPUs in tests");
            self.view.gpus.push(GpuView {
                index,
                total_memory_bytes: bytes,
                simulated: true,
            });
        }
        self
    }

    pub(crate) fn label(mut self, key: &str, value: &str) -> Self {
        self.view.labels.insert(key.to_owned(), value.to_owned());
        self
    }

    pub(crate) fn not_ready(mut self) -> Self {
        self.view.ready = false;
        self
    }

    pub(crate) fn backends(mut self, backends: &[&str]) -> Self {
        self.view.backends = backends.iter().map(|b| (*b).to_owned()).collect();
        self
    }

    pub(crate) fn installed(mut self, installed: &[&str]) -> Self {
        self.view.installed = installed.iter().map(|b| (*b).to_owned()).collect();
        self
    }

    pub(crate) fn ram(mut self, bytes: u64) -> Self {
        self.view.system_memory_bytes = bytes;
        self
    }

    pub(crate) fn reserve(mut self, gpu_bytes_per_gpu: u64, ram_bytes: u64) -> Self {
        self.view.reserve = SystemReserve {
            gpu_bytes_per_gpu,
            ram_bytes,
        };
        self
    }

    pub(crate) fn build(self) -> WorkerView {
        self.view
    }
}

/// A custom-backend request for `gpu_count` GPUs of `bytes_per_gpu` each and no RAM.
pub(crate) fn fixed_request(
    instance_id: i64,
    gpu_count: u32,
    bytes_per_gpu: u64,
) -> PlacementRequest {
    let claim = ResourceClaim {
        per_gpu_overhead_bytes: 0,
        base_ram_bytes: 0,
        memory: ModelMemory::Fixed(FixedMemory {
            gpu_count,
            bytes_per_gpu,
        }),
    };
    PlacementRequest::new(instance_id, format!("model-{instance_id}"), "custom", claim)
}

/// A llama.cpp request with `blocks` blocks of `block_bytes`, output `output_bytes`, GPU
/// overhead `overhead`, base RAM `base_ram`, host compute `host_compute`.
pub(crate) fn layered_request(
    instance_id: i64,
    blocks: usize,
    block_bytes: u64,
    output_bytes: u64,
    overhead: u64,
    base_ram: u64,
    host_compute: u64,
) -> PlacementRequest {
    let claim = ResourceClaim {
        per_gpu_overhead_bytes: overhead,
        base_ram_bytes: base_ram,
        memory: ModelMemory::Layers(LayerBreakdown {
            block_bytes: vec![block_bytes; blocks],
            block_kv_bytes: vec![block_bytes / 4; blocks],
            output_bytes,
            host_compute_bytes: host_compute,
            per_gpu_compute_bytes: overhead / 2,
            host_embedding_bytes: base_ram / 2,
            host_logits_bytes: base_ram / 8,
            host_repack_bytes: 0,
            tied_output_bytes: 0,
            fixed_gpu_layers: None,
        }),
    };
    PlacementRequest::new(
        instance_id,
        format!("model-{instance_id}"),
        "llama.cpp",
        claim,
    )
}

/// A llama.cpp request of 4 blocks of `block_bytes` and nothing else.
pub(crate) fn llama_request(instance_id: i64, block_bytes: u64) -> PlacementRequest {
    layered_request(instance_id, 4, block_bytes, 0, 0, 0, 0)
}

/// A vLLM request with `weight_bytes` of weights, no KV minimum, 1 GiB per-GPU overhead,
/// 32 heads and 8 KV heads, `fraction` of each GPU, and 4 GiB of RAM.
pub(crate) fn engine_request(
    instance_id: i64,
    weight_bytes: u64,
    fraction: f64,
) -> PlacementRequest {
    let claim = ResourceClaim {
        per_gpu_overhead_bytes: GIB,
        base_ram_bytes: 4 * GIB,
        memory: ModelMemory::Engine(EngineMemory {
            weight_bytes,
            kv_bytes_per_token_per_kv_head: 0,
            kv_head_count: 8,
            attention_head_count: 32,
            minimum_kv_tokens: 0,
            memory_fraction: MemoryFraction::Fixed(fraction),
            fixed_tensor_parallel_size: None,
        }),
    };
    PlacementRequest::new(instance_id, format!("model-{instance_id}"), "vllm", claim)
}
