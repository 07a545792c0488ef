//! What one model instance needs: the [`ResourceClaim`] that estimation (in `gantry-sched`)
//! produces and placement consumes, stored with every placement the scheduler makes.
//!
//! A claim is not a single number because the backends divide a model differently:
//!
//! * llama.cpp keeps whole transformer blocks on a device, so a model can be split by blocks
//!   between several GPUs and the host ([`ModelMemory::Layers`]);
//! * vLLM and SGLang shard every layer evenly across a tensor-parallel group and reserve a
//!   fixed fraction of each GPU they use ([`ModelMemory::Engine`]);
//! * a custom backend states what it needs ([`ModelMemory::Fixed`]).
//!
//! Placement turns a claim into concrete bytes per chosen GPU and bytes of RAM.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The memory one model instance needs, before it is placed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ResourceClaim {
    /// Bytes every GPU used by the instance needs on top of its share of the model: the CUDA
    /// context of the process, and for llama.cpp the per-device compute buffer.
    pub per_gpu_overhead_bytes: u64,
    /// Host RAM the process needs wherever its layers run (runtime, tokenizer, host-side
    /// buffers, and for llama.cpp the input embedding, which never leaves the host).
    pub base_ram_bytes: u64,
    /// How the model's own memory divides between GPUs and the host.
    pub memory: ModelMemory,
}

/// How a model's memory divides between devices.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub enum ModelMemory {
    /// llama.cpp: whole blocks live on one device each; see [`LayerBreakdown`].
    Layers(LayerBreakdown),
    /// vLLM / SGLang: every layer sharded evenly over a tensor-parallel group; see
    /// [`EngineMemory`].
    Engine(EngineMemory),
    /// A backend that states its needs directly.
    Fixed(FixedMemory),
}

/// llama.cpp's per-block breakdown, so the scheduler can split blocks between GPUs and the
/// host.
///
/// The device rule follows llama.cpp: with `--n-gpu-layers N` the *last* `min(N, blocks)`
/// blocks go to the GPUs and the rest stay on the host; the output layer (output norm and
/// projection) goes to the GPU holding the last block only when `N > blocks`, i.e. only on
/// full offload; the input token embedding always stays on the host (it is counted in
/// [`ResourceClaim::base_ram_bytes`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct LayerBreakdown {
    /// Bytes of each transformer block on whatever device holds it: its weights plus its
    /// share of the KV cache. Index `i` is block `i`.
    pub block_bytes: Vec<u64>,
    /// The KV cache's share of each block's bytes: `block_kv_bytes[i] <= block_bytes[i]`, and
    /// the rest of block `i` is its weights. Empty in claims recorded before the split was
    /// kept; such a claim places the same, but cannot say which bytes are weights.
    #[serde(default)]
    pub block_kv_bytes: Vec<u64>,
    /// Bytes of the output layer; on the last GPU on full offload, otherwise in RAM.
    pub output_bytes: u64,
    /// Host compute buffer, paid in RAM whenever anything (a block or the output layer) runs
    /// on the host, i.e. on anything but full offload.
    pub host_compute_bytes: u64,
    /// The compute buffer each GPU holds: the part of
    /// [`ResourceClaim::per_gpu_overhead_bytes`] that is not the CUDA context. Zero in claims
    /// recorded before the split was kept.
    #[serde(default)]
    pub per_gpu_compute_bytes: u64,
    /// The input token embedding, which llama.cpp keeps on the host: part of
    /// [`ResourceClaim::base_ram_bytes`]. Zero in claims recorded before the split was kept.
    #[serde(default)]
    pub host_embedding_bytes: u64,
    /// The host buffer of output logits (`4 × n_vocab × slots`): part of
    /// [`ResourceClaim::base_ram_bytes`]. Zero in claims recorded before the split was kept.
    #[serde(default)]
    pub host_logits_bytes: u64,
    /// Second copies llama.cpp makes in RAM of the quantised matrices it repacks for the
    /// CPU (x86-64 with AVX2 repacks Q4_0, Q4_K and IQ4_NL) when they run on the host; paid
    /// in RAM on anything but full offload. Zero in claims recorded before it was counted.
    #[serde(default)]
    pub host_repack_bytes: u64,
    /// The part of [`Self::output_bytes`] that is a copy of the token embedding, which
    /// llama.cpp makes for a model that ties its output to the embedding only when the
    /// output layer is on a GPU: on the host the two are one tensor, already counted in
    /// [`ResourceClaim::base_ram_bytes`]. Zero for an untied model and in claims recorded
    /// before it was kept apart.
    #[serde(default)]
    pub tied_output_bytes: u64,
    /// `--n-gpu-layers` from the user's arguments, when given; `None` lets the scheduler choose
    /// (full offload when it fits, else partial offload where allowed).
    pub fixed_gpu_layers: Option<u32>,
}

impl LayerBreakdown {
    /// Number of transformer blocks.
    pub fn block_count(&self) -> u32 {
        u32::try_from(self.block_bytes.len()).unwrap_or(u32::MAX)
    }

    /// Bytes of the output layer when it stays on the host: without the tied copy of the
    /// embedding (see [`Self::tied_output_bytes`]).
    pub fn host_output_bytes(&self) -> u64 {
        self.output_bytes.saturating_sub(self.tied_output_bytes)
    }

    /// Sum of all block bytes.
    pub fn total_block_bytes(&self) -> u64 {
        self.block_bytes.iter().sum()
    }

    /// Whether the claim records how its bytes divide into weights, KV cache and buffers
    /// (claims estimated before that was kept do not).
    pub fn has_parts(&self) -> bool {
        self.block_kv_bytes.len() == self.block_bytes.len()
    }
}

/// vLLM / SGLang memory: the engine reserves a fraction of each GPU it uses, and that
/// fraction must at least hold its share of the weights and of the KV cache for one
/// full-length sequence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct EngineMemory {
    /// Bytes of all weights (sum over the safetensors tensors).
    pub weight_bytes: u64,
    /// KV cache bytes for one token and one KV head across all layers: `2 (K and V) ×
    /// layers × head_dim × bytes per element`.
    pub kv_bytes_per_token_per_kv_head: u64,
    /// Number of KV heads (`num_key_value_heads`).
    pub kv_head_count: u32,
    /// Number of attention heads; a tensor-parallel size must divide it.
    pub attention_head_count: u32,
    /// Tokens of KV cache the engine insists on at start-up: the maximum model length.
    pub minimum_kv_tokens: u64,
    /// Fraction of each GPU's total memory the engine takes.
    pub memory_fraction: MemoryFraction,
    /// `--tensor-parallel-size` / `--tp` from the user's arguments, when given.
    pub fixed_tensor_parallel_size: Option<u32>,
}

impl EngineMemory {
    /// Whether `tp` is a tensor-parallel size the engine accepts for this model: it divides the
    /// attention heads, and the KV heads either divide evenly or are replicated evenly (both
    /// vLLM and SGLang check these two conditions).
    pub fn accepts_tensor_parallel(&self, tp: u32) -> bool {
        if tp == 0 || self.attention_head_count % tp != 0 {
            return false;
        }
        let kv = self.kv_head_count.max(1);
        kv % tp == 0 || tp % kv == 0
    }

    /// The least memory one GPU of a `tp`-way group must reserve: its shard of the weights,
    /// its KV heads for [`Self::minimum_kv_tokens`], plus `per_gpu_overhead`.
    ///
    /// KV heads are split across the group, but when `tp` exceeds the KV head count every GPU
    /// holds one (replicated) head.
    pub fn minimum_per_gpu(&self, tp: u32, per_gpu_overhead: u64) -> u64 {
        let (weights, kv) = self.per_gpu_shares(tp);
        weights.saturating_add(kv).saturating_add(per_gpu_overhead)
    }

    /// What one GPU of a `tp`-way group holds of the model: its shard of the weights, and
    /// the KV cache of its KV heads for [`Self::minimum_kv_tokens`] (see
    /// [`Self::minimum_per_gpu`]).
    pub fn per_gpu_shares(&self, tp: u32) -> (u64, u64) {
        let tp = u64::from(tp.max(1));
        let kv_heads_per_gpu = u64::from(self.kv_head_count.max(1)).div_ceil(tp).max(1);
        let weights = self.weight_bytes.div_ceil(tp);
        let kv = self
            .kv_bytes_per_token_per_kv_head
            .saturating_mul(kv_heads_per_gpu)
            .saturating_mul(self.minimum_kv_tokens);
        (weights, kv)
    }
}

/// The fraction of each GPU's total memory an engine reserves.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, ToSchema)]
pub enum MemoryFraction {
    /// A fraction given by the user or the engine's fixed default, in `(0, 1]`.
    Fixed(f64),
    /// SGLang's default when `--mem-fraction-static` is absent, which depends on the
    /// tensor-parallel size; see [`MemoryFraction::at_tensor_parallel`].
    SglangDefault,
}

impl MemoryFraction {
    /// The fraction for a `tp`-way group.
    ///
    /// SGLang's documented defaults shrink as the group grows, leaving room for the larger
    /// communication buffers: 0.88 for one GPU, 0.87 for 2, 0.85 for 4, 0.81 for 8, 0.79 for 16
    /// or more.
    pub fn at_tensor_parallel(self, tp: u32) -> f64 {
        match self {
            MemoryFraction::Fixed(fraction) => fraction,
            MemoryFraction::SglangDefault => match tp {
                0 | 1 => 0.88,
                2..=3 => 0.87,
                4..=7 => 0.85,
                8..=15 => 0.81,
                _ => 0.79,
            },
        }
    }
}

/// What a custom backend declares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct FixedMemory {
    /// GPUs it needs on one worker; zero for a CPU-only backend.
    pub gpu_count: u32,
    /// Bytes it needs on each of them, on top of [`ResourceClaim::per_gpu_overhead_bytes`].
    pub bytes_per_gpu: u64,
}

impl ResourceClaim {
    /// GPU bytes needed to run the whole model on one GPU (llama.cpp full offload, or a fixed
    /// claim's per-GPU bytes). `None` for engine claims, whose per-GPU reservation depends on
    /// the GPU's size.
    pub fn single_gpu_bytes(&self) -> Option<u64> {
        match &self.memory {
            ModelMemory::Layers(layers) => Some(
                self.per_gpu_overhead_bytes
                    .saturating_add(layers.total_block_bytes())
                    .saturating_add(layers.output_bytes),
            ),
            ModelMemory::Engine(_) => None,
            ModelMemory::Fixed(fixed) => Some(
                self.per_gpu_overhead_bytes
                    .saturating_add(fixed.bytes_per_gpu),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    const GIB: u64 = 1 << 30;

    fn engine(heads: u32, kv_heads: u32) -> EngineMemory {
        EngineMemory {
            weight_bytes: 16 * GIB,
            kv_bytes_per_token_per_kv_head: 2 * 32 * 128 * 2,
            kv_head_count: kv_heads,
            attention_head_count: heads,
            minimum_kv_tokens: 8192,
            memory_fraction: MemoryFraction::Fixed(0.9),
            fixed_tensor_parallel_size: None,
        }
    }

    #[test]
    fn tensor_parallel_size_must_divide_heads_and_fit_kv_heads() {
        let e = engine(32, 8);
        assert!(e.accepts_tensor_parallel(1));
        assert!(e.accepts_tensor_parallel(2));
        assert!(e.accepts_tensor_parallel(8));
        // 16 divides 32 heads and 8 KV heads are replicated twice.
        assert!(e.accepts_tensor_parallel(16));
        assert!(!e.accepts_tensor_parallel(3));
        assert!(!e.accepts_tensor_parallel(0));
        let odd = engine(12, 3);
        assert!(odd.accepts_tensor_parallel(3));
        assert!(
            !odd.accepts_tensor_parallel(2),
            "3 KV heads cannot split in 2"
        );
    }

    #[test]
    fn minimum_per_gpu_shards_weights_and_kv_heads() {
        let e = engine(32, 8);
        // KV for one head over all layers and 8192 tokens: 2 × 32 × 128 × 2 × 8192 = 128 MiB.
        let kv_per_head = 2 * 32 * 128 * 2 * 8192;
        assert_eq!(kv_per_head, 128 * 1024 * 1024);
        // tp 1: 16 GiB weights + 8 heads × 128 MiB = 17 GiB, plus 1 GiB overhead.
        assert_eq!(e.minimum_per_gpu(1, GIB), 18 * GIB);
        // tp 2: 8 GiB + 4 heads × 128 MiB + 1 GiB = 9.5 GiB.
        assert_eq!(e.minimum_per_gpu(2, GIB), 9 * GIB + GIB / 2);
        // tp 16: 1 GiB + 1 replicated head (128 MiB) + 1 GiB.
        assert_eq!(e.minimum_per_gpu(16, GIB), 2 * GIB + 128 * 1024 * 1024);
    }

    #[test]
    fn sglang_default_fraction_shrinks_with_tensor_parallel_size() {
        let f = MemoryFraction::SglangDefault;
        assert_eq!(f.at_tensor_parallel(1), 0.88);
        assert_eq!(f.at_tensor_parallel(2), 0.87);
        assert_eq!(f.at_tensor_parallel(4), 0.85);
        assert_eq!(f.at_tensor_parallel(8), 0.81);
        assert_eq!(f.at_tensor_parallel(16), 0.79);
        assert_eq!(MemoryFraction::Fixed(0.5).at_tensor_parallel(8), 0.5);
    }
}
