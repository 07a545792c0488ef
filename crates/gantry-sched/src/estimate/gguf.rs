//! llama.cpp estimation: how much GPU memory and RAM `llama-server` needs for a GGUF model.
//!
//! The formulas follow what llama.cpp allocates (the version gantry installs by default),
//! and `crates/gantry-backends/tests/llama_cpp_accuracy.rs` holds them to the buffers a real
//! `llama-server` reports over a corpus of architectures and settings. The estimate has
//! four parts, the four buffers llama.cpp prints:
//!
//! * **weights**: per block from [`GgufModelFacts::layer_weight_bytes`], plus the input
//!   embedding (always on the host) and the output layer (on the GPU only on full offload).
//!   A model that ties its output to the token embedding gets a second copy of the
//!   embedding on the output's device when that is a GPU ([`GgufModelFacts::tied_output_bytes`]);
//!   on the host both are the one tensor.
//! * **KV cache**, per block: `cells × (row(K) + row(V))`, a row holding `head_count_kv ×
//!   key_length` (resp. `value_length`) elements of the cache type. `cells` is the context
//!   for a full-attention block; for a sliding-window block it is the window plus one
//!   ubatch (times the slots when the cache is unified), padded to 256 and at most the
//!   context, unless `--swa-full`. With `--parallel N` and no `--kv-unified` every slot has
//!   a stream of its own of `context / N` cells (padded to 256), which is why llama.cpp
//!   rounds such a context to a multiple of `256 × N`. Encoder-only models (BERT) have no
//!   KV cache.
//! * **compute buffer**, once per device: the largest set of intermediate tensors alive at
//!   once while llama.cpp runs one ubatch of `n_tokens = min(context, ubatch)` tokens (see
//!   [`compute_buffer_bytes`]).
//! * **output buffer**, on the host: `4 × (n_vocab [+ n_embd with --embedding]) × slots`.
//!
//! Plus fixed overheads: [`CUDA_CONTEXT_BYTES`] per GPU and
//! [`LLAMA_CPP_PROCESS_RAM_BYTES`] of RAM per process.
//!
//! Defaults are `llama-server`'s: 4 slots sharing one unified KV cache when `--parallel`
//! is absent (its "auto"), flash attention on ("auto" turns it on wherever the device has
//! it, and the CPU and CUDA do), ubatch 512, batch 2048.
//!
//! Context: `--ctx-size`/`-c` when given (`0` means the trained context, as in llama.cpp),
//! else the trained context capped at [`DEFAULT_CONTEXT_CAP`]; then padded up to
//! [`CONTEXT_PADDING`]. The caller should pass the resolved
//! [`LlamaCppEstimate::context_size`] to `llama-server` when the user gave none, so that the
//! process allocates what was estimated.

use std::fmt;
use std::str::FromStr;

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
/// Slots `llama-server` opens when `--parallel` is absent (or negative, its "auto"); they
/// share one unified KV cache.
pub const DEFAULT_PARALLEL: u32 = 4;

/// Bytes of an f32, the type of activations and logits.
const F32_BYTES: u64 = 4;
/// Bytes of an f16, the type of the attention mask with flash attention.
const F16_BYTES: u64 = 2;

/// The facts about a GGUF model that the estimate needs, independent of how they were read.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
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
    /// Bytes of the output layer (`output_norm.*`, `output.*`) and anything else outside
    /// the blocks.
    pub output_weight_bytes: u64,
    /// When the model ties its output to the token embedding (no `output.weight`): the
    /// embedding's bytes, which llama.cpp loads a second time onto the output layer's
    /// device when that is a GPU. 0 for a model with its own output layer.
    #[serde(default)]
    pub tied_output_bytes: u64,
    /// What llama.cpp maps of the files when the weights run on the CPU: each file's span
    /// from its first to its last tensor that is not repacked. 0 when not known, then the
    /// tensor bytes stand in.
    #[serde(default)]
    pub host_mapped_bytes: u64,
    /// The copies llama.cpp makes of the matrices it repacks for the CPU (see
    /// [`LayerBreakdown::host_repack_bytes`]).
    #[serde(default)]
    pub host_repack_bytes: u64,
    /// `{arch}.feed_forward_length` (`n_ff`) of a dense model; 0 when unknown.
    #[serde(default)]
    pub feed_forward_length: u32,
    /// `{arch}.expert_count`: experts per feed-forward; 0 for a dense model.
    #[serde(default)]
    pub expert_count: u32,
    /// `{arch}.expert_used_count`: experts each token is routed to.
    #[serde(default)]
    pub expert_used_count: u32,
    /// `{arch}.expert_feed_forward_length`: width of one expert.
    #[serde(default)]
    pub expert_feed_forward_length: u32,
    /// Tokens a sliding-window block attends to, as llama.cpp applies it; 0 when no block
    /// has a window.
    #[serde(default)]
    pub sliding_window: u32,
    /// Which blocks use the sliding window (`block_count` entries); empty when none does.
    #[serde(default)]
    pub sliding_window_blocks: Vec<bool>,
    /// An encoder that attends over its whole input at once (BERT-style embedding models):
    /// no KV cache.
    #[serde(default)]
    pub encoder_only: bool,
}

impl GgufModelFacts {
    /// Whether block `index` uses the sliding window.
    pub fn is_sliding_window_block(&self, index: usize) -> bool {
        self.sliding_window > 0 && self.sliding_window_blocks.get(index) == Some(&true)
    }
}

/// `--flash-attn` / `-fa`: `on`, `off` or `auto` (the default).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum FlashAttention {
    /// llama.cpp turns it on where the device supports it (the CPU and CUDA do).
    #[default]
    Auto,
    /// Always on.
    On,
    /// Always off (incompatible with a quantized V cache).
    Off,
}

impl FlashAttention {
    /// Whether flash attention runs: `auto` resolves to on, as on the CPU and CUDA.
    pub fn enabled(self) -> bool {
        self != FlashAttention::Off
    }
}

impl FromStr for FlashAttention {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(FlashAttention::Auto),
            "on" | "1" | "true" | "enabled" => Ok(FlashAttention::On),
            "off" | "0" | "false" | "disabled" => Ok(FlashAttention::Off),
            other => Err(format!("{other:?} is not one of on, off, auto")),
        }
    }
}

impl fmt::Display for FlashAttention {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FlashAttention::Auto => "auto",
            FlashAttention::On => "on",
            FlashAttention::Off => "off",
        })
    }
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
    /// `--parallel` / `-np`: server slots ([`DEFAULT_PARALLEL`] when absent).
    pub parallel: u32,
    /// One KV cache shared by all slots (`--kv-unified`, and llama-server's choice when
    /// `--parallel` is absent) rather than a stream of `context / parallel` cells per slot.
    pub kv_unified: bool,
    /// `--flash-attn` / `-fa`.
    pub flash_attention: FlashAttention,
    /// `--embedding` / `--embeddings`: the server returns embeddings.
    pub embedding: bool,
    /// `--swa-full`: sliding-window blocks keep a full-context cache.
    pub swa_full: bool,
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
            parallel: DEFAULT_PARALLEL,
            kv_unified: true,
            flash_attention: FlashAttention::Auto,
            embedding: false,
            swa_full: false,
        }
    }
}

/// The four buffers of a llama.cpp process with everything on the CPU, as llama.cpp prints
/// them (`model`, `KV`, `compute`, `output` buffer sizes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LlamaCppParts {
    /// The weights as the CPU holds them: the mapped files plus the repacked copies (a tied
    /// output is the token embedding itself).
    pub weights_bytes: u64,
    /// The KV cache of all blocks.
    pub kv_cache_bytes: u64,
    /// The compute buffer of one device.
    pub compute_bytes: u64,
    /// The host output buffer (logits, embeddings).
    pub output_bytes: u64,
}

impl LlamaCppParts {
    /// The sum of the parts.
    pub fn total_bytes(&self) -> u64 {
        self.weights_bytes
            .saturating_add(self.kv_cache_bytes)
            .saturating_add(self.compute_bytes)
            .saturating_add(self.output_bytes)
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
    /// KV cache bytes of each block.
    pub kv_bytes_per_block: Vec<u64>,
    /// Compute buffer bytes per device.
    pub compute_buffer_bytes: u64,
    /// The buffers with everything on the CPU, for comparison with what llama.cpp
    /// reports.
    pub parts: LlamaCppParts,
}

/// The shape of one ubatch run, derived from the model and the options.
struct Run {
    /// Tokens of the worst-case ubatch.
    n_tokens: u64,
    /// Rows of the output (logits) the server asks for per ubatch: one per slot.
    n_outputs: u64,
    /// KV streams (one per slot unless the cache is unified).
    streams: u64,
    /// Cells of each stream of a full-attention block.
    cells: u64,
    /// Cells of each stream of a sliding-window block.
    swa_cells: u64,
    /// Whether flash attention runs.
    flash_attention: bool,
}

/// Estimates what `llama-server` needs for `facts` run with `options`. See the module
/// documentation for the formulas.
pub fn estimate_llama_cpp(
    facts: &GgufModelFacts,
    options: &LlamaCppOptions,
) -> Result<LlamaCppEstimate, EstimateError> {
    validate(facts)?;
    if options.cache_type_v.is_quantized() && options.flash_attention == FlashAttention::Off {
        return Err(EstimateError::InvalidOption {
            option: "cache type v",
            value: options.cache_type_v.name().to_owned(),
            reason: "llama.cpp needs flash attention for a quantized V cache; remove \
                     --flash-attn off or use --cache-type-v f16"
                .to_owned(),
        });
    }
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
    let pad = |n: u64| n.next_multiple_of(u64::from(CONTEXT_PADDING));
    let slots = u64::from(options.parallel.max(1));
    let mut n_ctx = pad(u64::from(requested));
    let (streams, cells) = if options.kv_unified {
        (1, n_ctx)
    } else {
        let per_slot = pad(n_ctx / slots);
        if per_slot == 0 {
            return Err(EstimateError::InvalidOption {
                option: "context size",
                value: requested.to_string(),
                reason: format!("leaves no cells for each of the {slots} slots"),
            });
        }
        n_ctx = per_slot * slots;
        (slots, per_slot)
    };
    let context_size = u32::try_from(n_ctx).unwrap_or(u32::MAX - u32::MAX % CONTEXT_PADDING);
    // Embeddings are computed over a whole input in one ubatch: the server makes the batch
    // the ubatch.
    let batch = if options.embedding {
        options.ubatch_size
    } else {
        options.batch_size
    };
    let n_ubatch = u64::from(options.ubatch_size.min(batch).max(1));
    let n_tokens = n_ubatch.min(n_ctx).max(1);
    let window_slots = if options.kv_unified { slots } else { 1 };
    let swa_cells = if options.swa_full {
        cells
    } else {
        pad((u64::from(facts.sliding_window) * window_slots + n_ubatch).min(cells))
    };
    let run = Run {
        n_tokens,
        n_outputs: if options.embedding {
            n_tokens
        } else {
            slots.min(n_tokens)
        },
        streams,
        cells,
        swa_cells,
        flash_attention: options.flash_attention.enabled(),
    };

    let n_embd = u64::from(facts.embedding_length);
    let (key_length, value_length) = head_lengths(facts);
    let n_head_kv = u64::from(facts.head_count_kv);
    let k_row = options.cache_type_k.row_bytes(n_head_kv * key_length);
    let v_row = options.cache_type_v.row_bytes(n_head_kv * value_length);
    let kv_bytes_per_block: Vec<u64> = (0..facts.layer_weight_bytes.len())
        .map(|block| {
            if facts.encoder_only {
                return 0;
            }
            let cells = if facts.is_sliding_window_block(block) {
                run.swa_cells
            } else {
                run.cells
            };
            run.streams
                .saturating_mul(cells)
                .saturating_mul(k_row + v_row)
        })
        .collect();
    let compute_buffer_bytes = compute_buffer_bytes(facts, &run);

    let n_vocab = u64::from(facts.vocab_size);
    let embedding_width = if options.embedding { n_embd } else { 0 };
    let output_buffer = F32_BYTES * (n_vocab + embedding_width) * slots;
    let block_bytes = facts
        .layer_weight_bytes
        .iter()
        .zip(&kv_bytes_per_block)
        .map(|(weights, kv)| weights.saturating_add(*kv))
        .collect();
    let claim = ResourceClaim {
        per_gpu_overhead_bytes: CUDA_CONTEXT_BYTES + compute_buffer_bytes,
        base_ram_bytes: LLAMA_CPP_PROCESS_RAM_BYTES
            .saturating_add(facts.input_weight_bytes)
            .saturating_add(output_buffer),
        memory: ModelMemory::Layers(LayerBreakdown {
            block_bytes,
            block_kv_bytes: kv_bytes_per_block.clone(),
            output_bytes: facts
                .output_weight_bytes
                .saturating_add(facts.tied_output_bytes),
            host_compute_bytes: compute_buffer_bytes,
            per_gpu_compute_bytes: compute_buffer_bytes,
            host_embedding_bytes: facts.input_weight_bytes,
            host_logits_bytes: output_buffer,
            host_repack_bytes: facts.host_repack_bytes,
            tied_output_bytes: facts.tied_output_bytes,
            fixed_gpu_layers: options.gpu_layers,
        }),
    };
    let tensor_bytes = facts
        .layer_weight_bytes
        .iter()
        .sum::<u64>()
        .saturating_add(facts.input_weight_bytes)
        .saturating_add(facts.output_weight_bytes);
    let host_mapped = if facts.host_mapped_bytes == 0 {
        tensor_bytes
    } else {
        facts.host_mapped_bytes
    };
    let parts = LlamaCppParts {
        weights_bytes: host_mapped.saturating_add(facts.host_repack_bytes),
        kv_cache_bytes: kv_bytes_per_block.iter().sum(),
        compute_bytes: compute_buffer_bytes,
        output_bytes: output_buffer,
    };
    Ok(LlamaCppEstimate {
        claim,
        context_size,
        ubatch_size: u32::try_from(n_ubatch).unwrap_or(u32::MAX),
        kv_bytes_per_block,
        compute_buffer_bytes,
        parts,
    })
}

/// `(key_length, value_length)`: the model's, else `n_embd / n_head`.
fn head_lengths(facts: &GgufModelFacts) -> (u64, u64) {
    let default = u64::from(facts.embedding_length) / u64::from(facts.head_count);
    (
        facts.key_length.map_or(default, u64::from),
        facts.value_length.map_or(default, u64::from),
    )
}

/// The compute buffer of one device: the peak of ggml's graph allocator over one ubatch of
/// `n_tokens` tokens.
///
/// The allocator frees a tensor after its last use and runs element-wise operations in
/// place, so the peak is the attention masks (inputs, alive throughout) plus the largest
/// stage, in f32 elements per token of the ubatch:
///
/// * **attention**: `4 × q_width + 3 × n_embd` (queries, attention output, residual
///   stream and normalised input), plus without flash attention the score matrix of
///   `cells × n_head` (softmax and soft-capping work in place on it);
/// * **gated feed-forward** (SwiGLU/GeGLU): `3 × n_ff + 5 × n_embd` (gate, up and their
///   product beside the residual stream); a mixture of experts has `n_expert_used ×
///   n_ff_exp` for `n_ff` and its router's `n_expert` logits; an encoder's plain
///   feed-forward `2 × n_ff + 2 × n_embd`;
/// * **logits** of the rows the server asks for: `n_vocab × n_outputs` in all.
///
/// A mask is `cells × n_tokens` per kind of block (full, sliding window), f16 with flash
/// attention and f32 without. Fitted on `llama_cpp_accuracy`'s corpus, which holds it to
/// what llama.cpp reports (the errors per architecture are in docs/benchmarks.md).
fn compute_buffer_bytes(facts: &GgufModelFacts, run: &Run) -> u64 {
    let t = run.n_tokens;
    let n_embd = u64::from(facts.embedding_length);
    let n_head = u64::from(facts.head_count);
    let (key_length, value_length) = head_lengths(facts);
    let q_width = n_head * key_length.max(value_length);
    let blocks = facts.layer_weight_bytes.len();
    let any_swa = (0..blocks).any(|b| facts.is_sliding_window_block(b));
    let any_full = (0..blocks).any(|b| !facts.is_sliding_window_block(b));
    // Cells one token attends to, for each kind of block present.
    let (full_kv, swa_kv) = if facts.encoder_only {
        (t, 0)
    } else {
        (
            if any_full { run.cells } else { 0 },
            if any_swa { run.swa_cells } else { 0 },
        )
    };
    let mask_element = if run.flash_attention {
        F16_BYTES
    } else {
        F32_BYTES
    };
    let masks = mask_element * (full_kv + swa_kv) * t;

    let scores = if run.flash_attention {
        0
    } else {
        full_kv.max(swa_kv) * n_head
    };
    let attention = 4 * q_width + 3 * n_embd + scores;
    let feed_forward = if facts.expert_count > 0 {
        let used = u64::from(facts.expert_used_count);
        let width = u64::from(facts.expert_feed_forward_length);
        3 * used * width + u64::from(facts.expert_count) + 5 * n_embd
    } else if facts.encoder_only {
        2 * u64::from(facts.feed_forward_length) + 2 * n_embd
    } else {
        3 * u64::from(facts.feed_forward_length) + 5 * n_embd
    };
    let logits = if facts.encoder_only {
        0
    } else {
        run.n_outputs * u64::from(facts.vocab_size)
    };
    let peak = (attention.max(feed_forward) * t).max(logits);
    F32_BYTES.saturating_mul(peak).saturating_add(masks)
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
    use crate::units::{GIB, MIB};

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
            feed_forward_length: 14_336,
            ..GgufModelFacts::default()
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
        // Context: trained 8192, capped at 8192, already a multiple of 256; 4 slots share
        // one unified cache of 8192 cells.
        assert_eq!(estimate.context_size, 8192);
        assert_eq!(estimate.ubatch_size, 512);
        // KV per block: 8192 cells × (K row 8 × 128 × 2 B + V row 8 × 128 × 2 B)
        //             = 8192 × 4096 = 32 MiB (1 GiB over 32 blocks).
        assert_eq!(estimate.kv_bytes_per_block, vec![32 * MIB; 32]);
        // Compute, flash attention on: the f16 mask 8192 × 512 × 2 = 8 MiB, plus the
        // feed-forward stage (3 × 14336 + 5 × 4096 = 63488 f32 per token) × 512 tokens × 4.
        assert_eq!(estimate.compute_buffer_bytes, 8 * MIB + 63_488 * 512 * 4);
        let claim = &estimate.claim;
        // Per GPU: 512 MiB CUDA context + compute buffer.
        assert_eq!(
            claim.per_gpu_overhead_bytes,
            512 * MIB + estimate.compute_buffer_bytes
        );
        // RAM: 256 MiB process + 501 MiB embedding + logits 4 B × 128256 × 4 slots.
        assert_eq!(claim.base_ram_bytes, 256 * MIB + 501 * MIB + 2_052_096);
        let layers = layers(claim);
        assert_eq!(layers.block_bytes, vec![(208 + 32) * MIB; 32]);
        assert_eq!(layers.block_kv_bytes, vec![32 * MIB; 32]);
        assert_eq!(layers.output_bytes, 501 * MIB);
        assert_eq!(layers.host_compute_bytes, estimate.compute_buffer_bytes);
        assert_eq!(layers.fixed_gpu_layers, None);
        // The parts as the CPU would hold them.
        assert_eq!(
            estimate.parts,
            LlamaCppParts {
                weights_bytes: (32 * 208 + 501 + 501) * MIB,
                kv_cache_bytes: GIB,
                compute_bytes: estimate.compute_buffer_bytes,
                output_bytes: 2_052_096,
            }
        );
    }

    #[test]
    fn slots_with_their_own_streams_round_the_context_and_quantised_caches_shrink() {
        // `-c 3000 -ctk q8_0 -ctv q8_0 -ngl 20 -np 3`: 3000 pads to 3072, 1024 cells for each
        // of 3 streams.
        let options = LlamaCppOptions {
            ctx_size: Some(3000),
            cache_type_k: KvCacheType::Q8_0,
            cache_type_v: KvCacheType::Q8_0,
            gpu_layers: Some(20),
            parallel: 3,
            kv_unified: false,
            ..LlamaCppOptions::default()
        };
        let estimate = estimate_llama_cpp(&llama3_8b(), &options).expect("valid model");
        assert_eq!(estimate.context_size, 3072);
        // q8_0 row of 1024 elements: 32 blocks × 34 B = 1088 B; K and V: 2176 B per cell.
        assert_eq!(estimate.kv_bytes_per_block, vec![3 * 1024 * 2176; 32]);
        // `-c 2000 -np 3` would give 667 per slot, padded to 768: 2304 cells in all.
        let options = LlamaCppOptions {
            ctx_size: Some(2000),
            ..options
        };
        let estimate = estimate_llama_cpp(&llama3_8b(), &options).expect("valid model");
        assert_eq!(estimate.context_size, 2304);
        // Logits for 3 slots.
        assert_eq!(estimate.parts.output_bytes, 3 * 128_256 * 4);
        assert_eq!(layers(&estimate.claim).fixed_gpu_layers, Some(20));
    }

    #[test]
    fn without_flash_attention_the_score_matrix_dominates_the_compute_buffer() {
        let options = LlamaCppOptions {
            ctx_size: Some(4096),
            flash_attention: FlashAttention::Off,
            ..LlamaCppOptions::default()
        };
        let estimate = estimate_llama_cpp(&llama3_8b(), &options).expect("valid model");
        // f32 mask 4096 × 512 × 4 = 8 MiB; attention stage per token: 4 × 4096 + 3 × 4096
        // + 4096 cells × 32 heads = 159744 f32, above the feed-forward's 63488.
        assert_eq!(estimate.compute_buffer_bytes, 8 * MIB + 159_744 * 512 * 4);
        // A quantised V cache needs flash attention.
        let options = LlamaCppOptions {
            cache_type_v: KvCacheType::Q4_0,
            ..options
        };
        let e = estimate_llama_cpp(&llama3_8b(), &options).expect_err("q4_0 V without FA");
        assert!(e.to_string().contains("flash attention"), "{e}");
    }

    #[test]
    fn sliding_window_blocks_keep_the_window_plus_a_ubatch() {
        // Gemma-3-like: every sixth block has full attention, the others a 1024 window.
        let mut facts = llama3_8b();
        facts.sliding_window = 1024;
        facts.sliding_window_blocks = (0..32).map(|i| i % 6 != 5).collect();
        let estimate = estimate_llama_cpp(&facts, &LlamaCppOptions::default()).expect("valid");
        // 4 unified slots: 1024 × 4 + 512 = 4608 cells (a multiple of 256) of the 8192.
        let per_cell = 4096;
        assert_eq!(estimate.kv_bytes_per_block[0], 4608 * per_cell);
        assert_eq!(estimate.kv_bytes_per_block[5], 8192 * per_cell);
        // `--swa-full` keeps the whole context everywhere.
        let options = LlamaCppOptions {
            swa_full: true,
            ..LlamaCppOptions::default()
        };
        let full = estimate_llama_cpp(&facts, &options).expect("valid");
        assert_eq!(full.kv_bytes_per_block, vec![8192 * per_cell; 32]);
    }

    #[test]
    fn encoders_have_no_kv_cache_and_no_logits_stage() {
        let mut facts = llama3_8b();
        facts.encoder_only = true;
        let options = LlamaCppOptions {
            embedding: true,
            ..LlamaCppOptions::default()
        };
        let estimate = estimate_llama_cpp(&facts, &options).expect("valid");
        assert_eq!(estimate.parts.kv_cache_bytes, 0);
        // Output buffer: logits and embeddings, 4 B × (128256 + 4096) × 4 slots.
        assert_eq!(estimate.parts.output_bytes, 4 * (128_256 + 4096) * 4);
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
