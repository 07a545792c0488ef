//! vLLM and SGLang estimation from a Hugging Face model directory's facts.
//!
//! # How the engines size their KV cache
//!
//! Neither engine is told how much KV cache to allocate; each takes a fraction of the GPU and
//! gives the KV cache whatever its other needs leave of it:
//!
//! * **vLLM** (`--gpu-memory-utilization`, default 0.9) reserves `fraction × total GPU
//!   memory` per GPU and refuses to start when less than that is free. After loading the
//!   weights it runs one profiling forward pass and sets
//!   `KV = fraction × total − (weights + activation peak + memory outside PyTorch: CUDA
//!   context, NCCL, …)`, less an estimate of the CUDA graphs in versions that count them. It
//!   refuses to start when `KV` cannot hold one sequence of `--max-model-len` tokens.
//! * **SGLang** (`--mem-fraction-static`) counts weights and the KV pool inside the
//!   fraction; activations and CUDA graph buffers use the other `1 − fraction`. The pool is
//!   `free after loading − (1 − fraction) × free before loading`, about
//!   `fraction × total − weights` on an otherwise empty GPU. SGLang refuses to start only
//!   when not even one token fits. With a smaller pool it caps request lengths instead.
//!
//! So the KV budget grows by `Δfraction × total` for every step of the fraction: the weights
//! and overheads stay the same, and everything else goes to the KV cache.
//!
//! # What gantry claims
//!
//! Gantry does not predict how large the KV cache will be. On each GPU of a `tp`-way group,
//! the claim ([`ModelMemory::Engine`], with [`EngineMemory`]) reserves the whole fraction.
//! Placement records `floor(fraction × total_memory_bytes)` against that GPU, and the GPU
//! must have that much allocatable: its total, less the system reserve, less other claims.
//! The GPU also qualifies only if that reservation holds the weights, the KV cache for
//! `max_len` tokens and the overhead (`EngineMemory::minimum_per_gpu`):
//!
//! ```text
//! floor(fraction × total) ≥ ceil(weight_bytes / tp)
//!                          + kv_bytes_per_token_per_kv_head × max(1, ceil(kv_heads / tp)) × max_len
//!                          + ENGINE_GPU_OVERHEAD_BYTES (2 GiB)
//! kv_bytes_per_token_per_kv_head = ceil(2 (K, V) × num_hidden_layers × head_dim × kv_bits / 8)
//! ```
//!
//! * `fraction`: the flag's value; when it is absent, vLLM's 0.9
//!   ([`VLLM_DEFAULT_GPU_MEMORY_UTILIZATION`]) or SGLang's default for the group size,
//!   [`MemoryFraction::SglangDefault`] (0.88 for one GPU, 0.87 for 2, 0.85 for 4, 0.81 for
//!   8, 0.79 for 16). Those are SGLang's older fixed defaults. Newer releases derive the
//!   default from the GPU's size and their chunked-prefill and CUDA graph settings, so give
//!   `--mem-fraction-static` to get a reservation that matches the engine exactly.
//! * `weight_bytes`: measured. It is the sum of the data sections of the safetensors files
//!   the engines load (see [`super::safetensors`]), at the checkpoint's dtypes. That is what
//!   the engines hold for 16-bit and quantized checkpoints. An F32 checkpoint, which both
//!   engines run in 16 bits by default, is counted at twice what it occupies.
//! * `max_len`: `--max-model-len` (vLLM) / `--context-length` (SGLang), else the model's
//!   `max_position_embeddings`, else [`DEFAULT_CONTEXT_CAP`]. For vLLM this check mirrors the
//!   engine's own start-up check. For SGLang it is gantry's policy: a request of the full
//!   context must fit, although SGLang itself would start with less.
//! * `kv_bits`: `--kv-cache-dtype`. `auto` and the 16-bit names give 16, because both
//!   engines run F32 checkpoints in 16 bits. The `fp8*` variants give 8, `fp4*` gives 4, and
//!   `float32` gives 32.
//! * `kv_heads` are split over the group. When `tp` exceeds them, every GPU holds one
//!   replicated head.
//! * [`ENGINE_GPU_OVERHEAD_BYTES`] is an engine-independent allowance for the CUDA context,
//!   the activation peak and CUDA graphs, and it is counted inside the fraction. That
//!   matches vLLM. For SGLang, activations and graphs actually live outside the fraction, so
//!   the check is stricter than it needs to be. Conversely, the recorded reservation does not
//!   cover the activations and graphs SGLang keeps in the other `1 − fraction`.
//!
//! Host RAM is [`ENGINE_PROCESS_RAM_BYTES`] per replica. `weight_bytes` is exact, and the KV
//! figure follows the model's config and flags. The fraction defaults, the 2 GiB overhead and
//! the 4 GiB of RAM are engine defaults or allowances, not measured.

use serde::{Deserialize, Serialize};

use super::hf_config::HfModelConfig;
use super::{
    EstimateError, DEFAULT_CONTEXT_CAP, ENGINE_GPU_OVERHEAD_BYTES, ENGINE_PROCESS_RAM_BYTES,
};
use gantry_types::claim::{EngineMemory, MemoryFraction, ModelMemory, ResourceClaim};

/// vLLM's default `--gpu-memory-utilization`.
pub const VLLM_DEFAULT_GPU_MEMORY_UTILIZATION: f64 = 0.9;

/// The serving engines estimated here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ServingEngine {
    /// vLLM.
    Vllm,
    /// SGLang.
    Sglang,
}

/// The engine options that change memory use.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EngineOptions {
    /// Which engine.
    pub engine: ServingEngine,
    /// `--gpu-memory-utilization` (vLLM) / `--mem-fraction-static` (SGLang), when given.
    pub memory_fraction: Option<f64>,
    /// `--max-model-len` (vLLM) / `--context-length` (SGLang), when given.
    pub max_model_len: Option<u64>,
    /// Bits per KV cache element from `--kv-cache-dtype`; 16 for `auto`.
    pub kv_cache_element_bits: u32,
    /// `--tensor-parallel-size`/`-tp` (vLLM) / `--tp-size`/`--tensor-parallel-size`/`--tp`
    /// (SGLang), when given.
    pub tensor_parallel_size: Option<u32>,
    /// `--data-parallel-size`/`-dp` (vLLM) / `--dp-size`/`--data-parallel-size`/`--dp`
    /// (SGLang), when given; the caller puts it in the placement request.
    pub data_parallel_size: Option<u32>,
}

impl EngineOptions {
    /// Options with the engine's defaults.
    pub fn defaults(engine: ServingEngine) -> Self {
        EngineOptions {
            engine,
            memory_fraction: None,
            max_model_len: None,
            kv_cache_element_bits: 16,
            tensor_parallel_size: None,
            data_parallel_size: None,
        }
    }
}

/// Estimates what vLLM or SGLang needs for a model with `weight_bytes` of weights (the sum
/// over its safetensors headers) and `config`. See the module documentation for the rule.
pub fn estimate_engine(
    weight_bytes: u64,
    config: &HfModelConfig,
    options: &EngineOptions,
) -> Result<ResourceClaim, EstimateError> {
    let memory_fraction = match (options.memory_fraction, options.engine) {
        (Some(fraction), _) => MemoryFraction::Fixed(fraction),
        (None, ServingEngine::Vllm) => MemoryFraction::Fixed(VLLM_DEFAULT_GPU_MEMORY_UTILIZATION),
        (None, ServingEngine::Sglang) => MemoryFraction::SglangDefault,
    };
    let kv_bits_per_token_per_head = 2
        * u64::from(config.num_hidden_layers)
        * config.head_dim
        * u64::from(options.kv_cache_element_bits);
    let minimum_kv_tokens = options
        .max_model_len
        .or(config.max_position_embeddings)
        .unwrap_or(u64::from(DEFAULT_CONTEXT_CAP));
    let memory = EngineMemory {
        weight_bytes,
        kv_bytes_per_token_per_kv_head: kv_bits_per_token_per_head.div_ceil(8),
        kv_head_count: config.num_key_value_heads,
        attention_head_count: config.num_attention_heads,
        minimum_kv_tokens,
        memory_fraction,
        fixed_tensor_parallel_size: options.tensor_parallel_size,
    };
    if let Some(tp) = options.tensor_parallel_size {
        if !memory.accepts_tensor_parallel(tp) {
            return Err(EstimateError::InvalidOption {
                option: "tensor parallel size",
                value: tp.to_string(),
                reason: format!(
                    "must divide {} attention heads and divide or be a multiple of {} KV heads",
                    config.num_attention_heads, config.num_key_value_heads
                ),
            });
        }
    }
    Ok(ResourceClaim {
        per_gpu_overhead_bytes: ENGINE_GPU_OVERHEAD_BYTES,
        base_ram_bytes: ENGINE_PROCESS_RAM_BYTES,
        memory: ModelMemory::Engine(memory),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::units::GIB;

    fn llama3_8b_config() -> HfModelConfig {
        HfModelConfig {
            num_hidden_layers: 32,
            num_attention_heads: 32,
            num_key_value_heads: 8,
            hidden_size: 4096,
            head_dim: 128,
            torch_dtype: Some("bfloat16".to_owned()),
            max_position_embeddings: Some(131_072),
        }
    }

    fn engine_memory(claim: &ResourceClaim) -> &EngineMemory {
        match &claim.memory {
            ModelMemory::Engine(memory) => memory,
            other => panic!("expected an engine claim, got {other:?}"),
        }
    }

    #[test]
    fn vllm_defaults_to_ninety_percent_and_the_trained_length() {
        let weights = 16_060_522_496; // Llama-3.1-8B in bf16
        let options = EngineOptions::defaults(ServingEngine::Vllm);
        let claim = estimate_engine(weights, &llama3_8b_config(), &options).expect("valid");
        let memory = engine_memory(&claim);
        assert_eq!(memory.memory_fraction, MemoryFraction::Fixed(0.9));
        // KV per token and KV head: 2 × 32 layers × 128 × 2 B = 16_384 B.
        assert_eq!(memory.kv_bytes_per_token_per_kv_head, 16_384);
        assert_eq!(memory.minimum_kv_tokens, 131_072);
        // One GPU: weights + 131072 tokens × 8 heads × 16 KiB (= 16 GiB) + 2 GiB overhead.
        assert_eq!(
            memory.minimum_per_gpu(1, claim.per_gpu_overhead_bytes),
            weights + 16 * GIB + 2 * GIB
        );
        assert_eq!(claim.base_ram_bytes, 4 * GIB);
    }

    #[test]
    fn fraction_length_dtype_and_parallelism_change_the_claim() {
        // vLLM `--gpu-memory-utilization=0.8 --max-model-len 8k --kv-cache-dtype fp8 -tp 2
        // --data-parallel-size=2`
        let options = EngineOptions {
            memory_fraction: Some(0.8),
            max_model_len: Some(8000),
            kv_cache_element_bits: 8,
            tensor_parallel_size: Some(2),
            data_parallel_size: Some(2),
            ..EngineOptions::defaults(ServingEngine::Vllm)
        };
        let claim = estimate_engine(16 * GIB, &llama3_8b_config(), &options).expect("valid");
        let memory = engine_memory(&claim);
        // fp8: 2 × 32 × 128 × 1 B = 8192 B per token and KV head.
        assert_eq!(memory.kv_bytes_per_token_per_kv_head, 8192);
        // tp 2: 8 GiB weights + 8000 × 4 heads × 8192 B (= 262_144_000 B) + 2 GiB.
        assert_eq!(memory.minimum_per_gpu(2, 2 * GIB), 10 * GIB + 262_144_000);
        assert_eq!(memory.fixed_tensor_parallel_size, Some(2));
        assert_eq!(memory.memory_fraction, MemoryFraction::Fixed(0.8));
    }

    #[test]
    fn sglang_defaults_its_fraction_by_group_size() {
        let options = EngineOptions {
            max_model_len: Some(4096),
            tensor_parallel_size: Some(4),
            ..EngineOptions::defaults(ServingEngine::Sglang)
        };
        let claim = estimate_engine(16 * GIB, &llama3_8b_config(), &options).expect("valid");
        let memory = engine_memory(&claim);
        assert_eq!(memory.memory_fraction, MemoryFraction::SglangDefault);
        assert_eq!(memory.minimum_kv_tokens, 4096);
    }

    #[test]
    fn a_tensor_parallel_size_must_divide_the_heads() {
        let options = EngineOptions {
            tensor_parallel_size: Some(3),
            ..EngineOptions::defaults(ServingEngine::Vllm)
        };
        let e = estimate_engine(GIB, &llama3_8b_config(), &options).expect_err("3 ∤ 32");
        assert!(e.to_string().contains("32 attention heads"), "{e}");
    }
}
