//! llama.cpp estimation: how much GPU memory and RAM `llama-server` needs for a GGUF model.
//!
//! The estimate is the sum of four parts:
//!
//! * **weights**: per block from [`GgufModelFacts::layer_weight_bytes`], plus the input
//!   embedding (always on the host) and the output layer (on the GPU only on full offload);
//! * **KV cache**, per block: `n_ctx × (row(K) + row(V))` where a row holds
//!   `head_count_kv × key_length` (resp. `value_length`) elements of the cache type; with f16
//!   and equal lengths this is the familiar `2 × n_ctx × n_head_kv × head_dim × 2` bytes per
//!   block. The cache follows its block onto whatever device holds it. `--parallel` slots
//!   share the one context (`llama-server` divides `n_ctx` between them), so they do not
//!   multiply the cache;
//! * **compute buffer**, once per device: `4 × n_ubatch × (max(n_ctx × n_head, n_vocab) +
//!   3 × n_embd)` bytes. Without flash attention the largest intermediate of a layer is the
//!   f32 attention score matrix `n_ctx × n_ubatch × n_head`; the output layer's logits are
//!   `n_vocab × n_ubatch`; ggml's graph allocator reuses memory between them, so the larger
//!   of the two counts, plus a few `n_embd × n_ubatch` residual and normalised hidden states
//!   alive at the same time. For a Llama-3-8B at 8192 context and ubatch 512 this gives
//!   536 MiB where llama.cpp reports about 560 MiB. With flash attention llama.cpp needs less,
//!   so the figure is an upper bound;
//! * **fixed overhead**: [`CUDA_CONTEXT_BYTES`] per GPU, [`LLAMA_CPP_PROCESS_RAM_BYTES`] of
//!   RAM per process, and the host logits buffer `4 × n_vocab × parallel`.
//!
//! Context: `--ctx-size`/`-c` when given (`0` means the trained context, as in llama.cpp),
//! else the trained context capped at [`DEFAULT_CONTEXT_CAP`]; then padded up to
//! [`CONTEXT_PADDING`]. The caller should pass the resolved
//! [`LlamaCppEstimate::context_size`] to `llama-server` when the user gave none, so that the
//! process allocates what was estimated.

use serde::{Deserialize, Serialize};

use super::kv_type::KvCacheType;
use super::{
    EstimateError, CONTEXT_PADDING, CUDA_CONTEXT_BYTES, DEFAULT_CONTEXT_CAP,
    LLAMA_CPP_PROCESS_RAM_BYTES,
};
use gantry_types::claim::{LayerBreakdown, ModelMemory, ResourceClaim};

/// llama.cpp's default logical batch size (`--batch-size`).
pub const DEFAULT_BATCH_SIZE: u32 = 2048;
/// llama.cpp's default physical batch size (`--ubatch-size`).
pub const DEFAULT_UBATCH_SIZE: u32 = 512;

/// Bytes of an f32, the type of activations and logits.
const F32_BYTES: u64 = 4;

/// The facts about a GGUF model that the estimate needs, independent of how they were read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GgufModelFacts {
    /// `general.architecture`, e.g. `llama`.
    pub architecture: String,
    /// `{arch}.block_count`: number of transformer blocks.
    pub block_count: u32,
    /// `{arch}.context_length`: the trained context; 0 when unknown.
    pub context_length: u32,
    /// `{arch}.embedding_length` (`n_embd`).
    pub embedding_length: u32,
    /// `{arch}.attention.head_count`.
    pub head_count: u32,
    /// `{arch}.attention.head_count_kv`; equal to `head_count` for models without GQA.
    pub head_count_kv: u32,
    /// `{arch}.attention.key_length`; `None` means `embedding_length / head_count`.
    pub key_length: Option<u32>,
    /// `{arch}.attention.value_length`; `None` means `embedding_length / head_count`.
    pub value_length: Option<u32>,
    /// Number of tokens in the vocabulary.
    pub vocab_size: u32,
    /// Bytes of the tensors of each block (`blk.{i}.*`); exactly `block_count` entries.
    pub layer_weight_bytes: Vec<u64>,
    /// Bytes of the input layer (`token_embd.*`, position embeddings): kept on the host by
    /// llama.cpp whatever the offload, so counted in RAM.
    pub input_weight_bytes: u64,
    /// Bytes of the output layer (`output_norm.*`, `output.*`). When the model ties its
    /// output to the token embedding (no `output.weight`), llama.cpp places a copy of the
    /// embedding on the output device, so this is the embedding's size then.
    pub output_weight_bytes: u64,
}

/// The llama.cpp runtime options that change memory use.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LlamaCppOptions {
    /// `--ctx-size` / `-c`; `None` when absent, `Some(0)` for "the trained context".
    pub ctx_size: Option<u32>,
    /// `--batch-size` / `-b`.
    pub batch_size: u32,
    /// `--ubatch-size` / `-ub`.
    pub ubatch_size: u32,
    /// `--n-gpu-layers` / `-ngl` / `--gpu-layers`; `None` when absent or "all"/"auto"/negative,
    /// which leaves the choice to the scheduler.
    pub gpu_layers: Option<u32>,
    /// `--cache-type-k` / `-ctk`.
    pub cache_type_k: KvCacheType,
    /// `--cache-type-v` / `-ctv`.
    pub cache_type_v: KvCacheType,
    /// `--parallel` / `-np`: server slots.
    pub parallel: u32,
}

impl Default for LlamaCppOptions {
    fn default() -> Self {
        LlamaCppOptions {
            ctx_size: None,
            batch_size: DEFAULT_BATCH_SIZE,
            ubatch_size: DEFAULT_UBATCH_SIZE,
            gpu_layers: None,
            cache_type_k: KvCacheType::F16,
            cache_type_v: KvCacheType::F16,
            parallel: 1,
        }
    }
}

/// The result of a llama.cpp estimate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LlamaCppEstimate {
    /// What placement needs.
    pub claim: ResourceClaim,
    /// The context the estimate assumed, after defaulting and padding; pass it as
    /// `--ctx-size` when the user gave none.
    pub context_size: u32,
    /// The physical batch the estimate assumed.
    pub ubatch_size: u32,
    /// KV cache bytes of one block (all blocks are the same).
    pub kv_bytes_per_block: u64,
    /// Compute buffer bytes per device.
    pub compute_buffer_bytes: u64,
}

/// Estimates what `llama-server` needs for `facts` run with `options`. See the module
/// documentation for the formulas.
pub fn estimate_llama_cpp(
    facts: &GgufModelFacts,
    options: &LlamaCppOptions,
) -> Result<LlamaCppEstimate, EstimateError> {
    validate(facts)?;
    let trained = if facts.context_length == 0 {
        DEFAULT_CONTEXT_CAP
    } else {
        facts.context_length
    };
    let requested = match options.ctx_size {
        None => trained.min(DEFAULT_CONTEXT_CAP),
        Some(0) => trained,
        Some(ctx) => ctx,
    };
    let context_size = requested
        .checked_next_multiple_of(CONTEXT_PADDING)
        .unwrap_or(u32::MAX - u32::MAX % CONTEXT_PADDING);
    let n_ctx = u64::from(context_size);
    let n_ubatch = u64::from(
        options
            .ubatch_size
            .min(options.batch_size)
            .min(context_size)
            .max(1),
    );

    let n_embd = u64::from(facts.embedding_length);
    let n_head = u64::from(facts.head_count);
    let n_head_kv = u64::from(facts.head_count_kv);
    let default_head_dim = n_embd / n_head;
    let key_length = facts.key_length.map_or(default_head_dim, u64::from);
    let value_length = facts.value_length.map_or(default_head_dim, u64::from);
    let k_row = options.cache_type_k.row_bytes(n_head_kv * key_length);
    let v_row = options.cache_type_v.row_bytes(n_head_kv * value_length);
    let kv_bytes_per_block = n_ctx.saturating_mul(k_row + v_row);

    let n_vocab = u64::from(facts.vocab_size);
    let widest = n_ctx.saturating_mul(n_head).max(n_vocab);
    let compute_buffer_bytes = F32_BYTES
        .saturating_mul(n_ubatch)
        .saturating_mul(widest.saturating_add(3 * n_embd));

    let block_bytes = facts
        .layer_weight_bytes
        .iter()
        .map(|weights| weights.saturating_add(kv_bytes_per_block))
        .collect();
    let logits_buffer = F32_BYTES * n_vocab * u64::from(options.parallel.max(1));
    let claim = ResourceClaim {
        per_gpu_overhead_bytes: CUDA_CONTEXT_BYTES + compute_buffer_bytes,
        base_ram_bytes: LLAMA_CPP_PROCESS_RAM_BYTES
            .saturating_add(facts.input_weight_bytes)
            .saturating_add(logits_buffer),
        memory: ModelMemory::Layers(LayerBreakdown {
            block_bytes,
            output_bytes: facts.output_weight_bytes,
            host_compute_bytes: compute_buffer_bytes,
            fixed_gpu_layers: options.gpu_layers,
        }),
    };
    Ok(LlamaCppEstimate {
        claim,
        context_size,
        ubatch_size: u32::try_from(n_ubatch).unwrap_or(u32::MAX),
        kv_bytes_per_block,
        compute_buffer_bytes,
    })
}

fn validate(facts: &GgufModelFacts) -> Result<(), EstimateError> {
    let invalid = |field, reason: String| Err(EstimateError::InvalidModel { field, reason });
    if facts.block_count == 0 {
        return invalid("block_count", "must be at least 1".to_owned());
    }
    if facts.layer_weight_bytes.len() != facts.block_count as usize {
        return invalid(
            "layer_weight_bytes",
            format!(
                "has {} entries for {} blocks",
                facts.layer_weight_bytes.len(),
                facts.block_count
            ),
        );
    }
    if facts.head_count == 0 {
        return invalid("head_count", "must be at least 1".to_owned());
    }
    if facts.head_count_kv == 0 || facts.head_count_kv > facts.head_count {
        return invalid(
            "head_count_kv",
            format!("{} is not in 1..={}", facts.head_count_kv, facts.head_count),
        );
    }
    if facts.embedding_length == 0 {
        return invalid("embedding_length", "must be at least 1".to_owned());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::units::MIB;

    /// Shaped like Llama-3-8B: 32 blocks, n_embd 4096, 32 heads, 8 KV heads of 128,
    /// 128256 tokens, trained on 8192 tokens; block weights 208 MiB, embedding and output
    /// 501 MiB each.
    fn llama3_8b() -> GgufModelFacts {
        GgufModelFacts {
            architecture: "llama".to_owned(),
            block_count: 32,
            context_length: 8192,
            embedding_length: 4096,
            head_count: 32,
            head_count_kv: 8,
            key_length: None,
            value_length: None,
            vocab_size: 128_256,
            layer_weight_bytes: vec![208 * MIB; 32],
            input_weight_bytes: 501 * MIB,
            output_weight_bytes: 501 * MIB,
        }
    }

    fn layers(claim: &ResourceClaim) -> &LayerBreakdown {
        match &claim.memory {
            ModelMemory::Layers(layers) => layers,
            other => panic!("expected a layered claim, got {other:?}"),
        }
    }

    #[test]
    fn default_options_estimate_llama3_8b() {
        let estimate =
            estimate_llama_cpp(&llama3_8b(), &LlamaCppOptions::default()).expect("valid model");
        // Context: trained 8192, capped at 8192, already a multiple of 256.
        assert_eq!(estimate.context_size, 8192);
        assert_eq!(estimate.ubatch_size, 512);
        // KV per block: 8192 tokens × (K row 8 × 128 × 2 B + V row 8 × 128 × 2 B)
        //             = 8192 × 4096 = 33_554_432 B = 32 MiB (1 GiB over 32 blocks).
        assert_eq!(estimate.kv_bytes_per_block, 8192 * 4096);
        assert_eq!(estimate.kv_bytes_per_block, 32 * MIB);
        // Compute: 4 × 512 × (max(8192 × 32, 128256) + 3 × 4096)
        //        = 2048 × (262_144 + 12_288) = 2048 × 274_432 = 562_036_736 B.
        assert_eq!(estimate.compute_buffer_bytes, 562_036_736);
        let claim = &estimate.claim;
        // Per GPU: 512 MiB CUDA context + compute buffer.
        assert_eq!(claim.per_gpu_overhead_bytes, 536_870_912 + 562_036_736);
        // RAM: 256 MiB process + 501 MiB embedding + logits 4 × 128256 × 1 slot.
        assert_eq!(claim.base_ram_bytes, 256 * MIB + 501 * MIB + 513_024);
        let layers = layers(claim);
        assert_eq!(layers.block_bytes, vec![(208 + 32) * MIB; 32]);
        assert_eq!(layers.output_bytes, 501 * MIB);
        assert_eq!(layers.host_compute_bytes, 562_036_736);
        assert_eq!(layers.fixed_gpu_layers, None);
        // On one GPU: 1_098_907_648 + 32 × 240 MiB + 501 MiB = 9_677_307_904 B (≈ 9.0 GiB).
        assert_eq!(claim.single_gpu_bytes(), Some(9_677_307_904));
    }

    #[test]
    fn arguments_change_context_cache_types_layers_and_slots() {
        // `-c 4096 -ctk q8_0 --cache-type-v=q8_0 -ngl 20 -np 4`
        let options = LlamaCppOptions {
            ctx_size: Some(4096),
            cache_type_k: KvCacheType::Q8_0,
            cache_type_v: KvCacheType::Q8_0,
            gpu_layers: Some(20),
            parallel: 4,
            ..LlamaCppOptions::default()
        };
        let estimate = estimate_llama_cpp(&llama3_8b(), &options).expect("valid model");
        assert_eq!(estimate.context_size, 4096);
        // q8_0 row of 1024 elements: 32 blocks × 34 B = 1088 B; K and V: 2176 B per token.
        // KV per block: 4096 × 2176 = 8_912_896 B; slots share the context.
        assert_eq!(estimate.kv_bytes_per_block, 8_912_896);
        // Compute: 4 × 512 × (max(4096 × 32, 128256) + 12288) = 2048 × 143_360 = 293_601_280.
        assert_eq!(estimate.compute_buffer_bytes, 293_601_280);
        // Logits for 4 slots: 4 × 128256 × 4 = 2_052_096 B.
        assert_eq!(estimate.claim.base_ram_bytes, 757 * MIB + 2_052_096);
        assert_eq!(layers(&estimate.claim).fixed_gpu_layers, Some(20));
    }

    #[test]
    fn context_defaults_to_trained_capped_and_pads_to_256() {
        let mut facts = llama3_8b();
        facts.context_length = 131_072;
        let capped = estimate_llama_cpp(&facts, &LlamaCppOptions::default()).expect("valid");
        assert_eq!(capped.context_size, 8192);
        let options = LlamaCppOptions {
            ctx_size: Some(0),
            ..LlamaCppOptions::default()
        };
        let trained = estimate_llama_cpp(&facts, &options).expect("valid");
        assert_eq!(
            trained.context_size, 131_072,
            "-c 0 means the trained context"
        );
        let options = LlamaCppOptions {
            ctx_size: Some(1000),
            ..LlamaCppOptions::default()
        };
        let padded = estimate_llama_cpp(&facts, &options).expect("valid");
        assert_eq!(padded.context_size, 1024);
        // A context smaller than the ubatch shrinks the ubatch.
        let options = LlamaCppOptions {
            ctx_size: Some(256),
            ..LlamaCppOptions::default()
        };
        assert_eq!(
            estimate_llama_cpp(&facts, &options)
                .expect("valid")
                .ubatch_size,
            256
        );
    }

    #[test]
    fn inconsistent_facts_are_rejected_with_the_field() {
        let mut facts = llama3_8b();
        facts.layer_weight_bytes.pop();
        let e = estimate_llama_cpp(&facts, &LlamaCppOptions::default()).expect_err("31 of 32");
        assert!(matches!(
            e,
            EstimateError::InvalidModel {
                field: "layer_weight_bytes",
                ..
            }
        ));
        let mut facts = llama3_8b();
        facts.head_count_kv = 0;
        assert!(estimate_llama_cpp(&facts, &LlamaCppOptions::default()).is_err());
    }
}
