//! From a parsed GGUF file (`gantry_gguf::GgufFile`) to the [`GgufModelFacts`] the llama.cpp
//! estimate needs.
//!
//! Tensor bytes are assigned the way llama.cpp places them:
//!
//! * `blk.N.*` → block `N`;
//! * the input layer (`token_embd.*`, `position_embd.*`, …) → host RAM
//!   ([`GgufModelFacts::input_weight_bytes`]);
//! * the output layer (`output.*`, `output_norm.*`) → with the last block on full offload
//!   ([`GgufModelFacts::output_weight_bytes`]); when the model has no `output.weight`,
//!   llama.cpp places a copy of the token embedding there
//!   ([`GgufModelFacts::tied_output_bytes`]);
//! * anything else outside the blocks (rope tables, encoder or vision parts) is counted with
//!   the output layer: on the GPU on full offload, in RAM otherwise, so it is never left out.
//!
//! Which blocks use a sliding window follows llama.cpp's loader: the pattern of
//! `{arch}.attention.sliding_window_pattern` when the file has one (an array of flags, or
//! `n` for "every `n`-th block is full"), else the architecture's own ([`SWA_PATTERNS`]).
//! Architectures not listed there get no window, which can only overestimate the KV cache.

use gantry_gguf::{GgmlType, GgufError, GgufFile, MetadataArray, MetadataValue};
use thiserror::Error;

use super::gguf::GgufModelFacts;

/// The sliding-window layouts llama.cpp gives architectures by default: `(architecture,
/// pattern n, window when the file names none)`. With pattern `n`, block `i` uses the
/// window unless `i % n == n - 1`. An architecture whose default window is `None` has
/// windows only when the file sets `{arch}.attention.sliding_window`.
pub const SWA_PATTERNS: &[(&str, u32, Option<u32>)] = &[
    ("gemma2", 2, Some(4096)),
    ("gemma3", 6, None),
    ("gemma-embedding", 6, None),
    ("gemma3n", 5, None),
    ("cohere2", 4, None),
    ("llama4", 4, None),
];

/// Architectures llama.cpp runs without a KV cache: encoders that attend over the whole
/// input at once.
pub const ENCODER_ONLY: &[&str] = &[
    "bert",
    "jina-bert-v2",
    "jina-bert-v3",
    "nomic-bert",
    "nomic-bert-moe",
    "neo-bert",
    "eurobert",
    "modern-bert",
    "gemma-embedding",
];

/// Why a GGUF file could not be turned into model facts.
#[derive(Debug, Error)]
pub enum FromGgufError {
    /// A metadata key is missing or of the wrong type.
    #[error(transparent)]
    Gguf(#[from] GgufError),
    /// A value is out of range or contradicts the tensor table.
    #[error("GGUF {field}: {reason}")]
    Invalid {
        /// What is at fault, e.g. `block_count`.
        field: &'static str,
        /// Why.
        reason: String,
    },
}

impl GgufModelFacts {
    /// Reads the facts from a parsed GGUF header and tensor table.
    pub fn from_gguf(file: &GgufFile) -> Result<Self, FromGgufError> {
        let dimensions = file.model_dimensions()?;
        let small = |field: &'static str, value: u64| {
            u32::try_from(value).map_err(|_| FromGgufError::Invalid {
                field,
                reason: format!("{value} is out of range"),
            })
        };
        let block_count = small("block_count", dimensions.block_count)?;
        let vocab_size = dimensions.vocab_size.ok_or(FromGgufError::Invalid {
            field: "vocab_size",
            reason: "neither <arch>.vocab_size nor tokenizer.ggml.tokens is present".to_owned(),
        })?;

        let by_layer = file.tensor_bytes_by_layer();
        if by_layer.blocks.len() > block_count as usize {
            return Err(FromGgufError::Invalid {
                field: "block_count",
                reason: format!(
                    "{block_count} blocks declared but tensors name block {}",
                    by_layer.blocks.len() - 1
                ),
            });
        }
        let mut layer_weight_bytes = by_layer.blocks.clone();
        // Blocks without tensors of their own (rare, e.g. shared layers) weigh nothing.
        layer_weight_bytes.resize(block_count as usize, 0);

        let tied_output = if file.output_is_tied_to_embedding() {
            file.tensor("token_embd.weight").map_or(0, |t| t.n_bytes)
        } else {
            0
        };
        let architecture = dimensions.architecture.clone();
        let arch_u32 = |suffix: &'static str| -> Result<u32, FromGgufError> {
            let value = file
                .get_u64(&format!("{architecture}.{suffix}"))?
                .unwrap_or(0);
            small(suffix, value)
        };
        let (sliding_window, sliding_window_blocks) =
            sliding_window(file, &architecture, block_count)?;
        let host = host_weights(file);
        Ok(GgufModelFacts {
            feed_forward_length: arch_u32("feed_forward_length")?,
            expert_count: arch_u32("expert_count")?,
            expert_used_count: arch_u32("expert_used_count")?,
            expert_feed_forward_length: arch_u32("expert_feed_forward_length")?,
            sliding_window,
            sliding_window_blocks,
            encoder_only: ENCODER_ONLY.contains(&architecture.as_str()),
            tied_output_bytes: tied_output,
            host_mapped_bytes: host.mapped_bytes,
            host_repack_bytes: host.repack_bytes,
            architecture: dimensions.architecture,
            block_count,
            context_length: small("context_length", dimensions.context_length)?,
            embedding_length: small("embedding_length", dimensions.embedding_length)?,
            head_count: small("head_count", dimensions.head_count)?,
            head_count_kv: small("head_count_kv", dimensions.head_count_kv)?,
            key_length: dimensions
                .key_length
                .map(|n| small("key_length", n))
                .transpose()?,
            value_length: dimensions
                .value_length
                .map(|n| small("value_length", n))
                .transpose()?,
            vocab_size: small("vocab_size", vocab_size)?,
            layer_weight_bytes,
            input_weight_bytes: by_layer.input,
            output_weight_bytes: by_layer.output.saturating_add(by_layer.other),
        })
    }
}

/// Weight types llama.cpp repacks for the CPU on x86-64 with AVX2 (`ggml-cpu/repack.cpp`),
/// when a matrix's rows come in multiples of 8. ARM builds repack some more (Q5_K, Q6_K),
/// AVX-512 builds Q2_K; their host estimate is low by those copies.
const REPACKED_TYPES: &[GgmlType] = &[GgmlType::Q4_0, GgmlType::Q4_K, GgmlType::IQ4_NL];

/// What the weights take in RAM when llama.cpp runs them on the CPU.
struct HostWeights {
    mapped_bytes: u64,
    repack_bytes: u64,
}

/// llama.cpp maps each file and copies the matrices it repacks into a buffer of their own:
/// a file's mapped buffer spans its tensors from the first to the last one not repacked,
/// and the repacked ones (every block matrix and the output projection of a repacked type,
/// and for a tied output a repacked copy of the token embedding) count again. The tensors
/// of each part of a split model follow one another in the table, each part's data
/// starting at offset 0.
fn host_weights(file: &GgufFile) -> HostWeights {
    let repacked = |tensor: &gantry_gguf::TensorInfo| {
        let matrix = tensor.name == "output.weight"
            || (tensor.name.starts_with("blk.") && tensor.name.ends_with(".weight"));
        matrix
            && REPACKED_TYPES.contains(&tensor.ggml_type)
            && tensor.dims.len() >= 2
            && tensor.dims[1] % 8 == 0
    };
    let mut mapped_bytes = 0u64;
    let mut repack_bytes = 0u64;
    let mut span: Option<(u64, u64)> = None;
    for (index, tensor) in file.tensors.iter().enumerate() {
        if index > 0 && tensor.offset == 0 {
            mapped_bytes += span.take().map_or(0, |(start, end)| end - start);
        }
        if repacked(tensor) {
            repack_bytes = repack_bytes.saturating_add(tensor.n_bytes);
            continue;
        }
        let end = tensor.offset.saturating_add(tensor.n_bytes);
        span = Some(match span {
            None => (tensor.offset, end),
            Some((start, last)) => (start.min(tensor.offset), last.max(end)),
        });
    }
    mapped_bytes += span.map_or(0, |(start, end)| end - start);
    if file.output_is_tied_to_embedding() {
        if let Some(embedding) = file.tensor("token_embd.weight") {
            let mut copy = embedding.clone();
            copy.name = "output.weight".to_owned();
            if repacked(&copy) {
                repack_bytes = repack_bytes.saturating_add(copy.n_bytes);
            }
        }
    }
    HostWeights {
        mapped_bytes,
        repack_bytes,
    }
}

/// The window and which of `blocks` blocks use it, as llama.cpp's loader decides.
fn sliding_window(
    file: &GgufFile,
    architecture: &str,
    blocks: u32,
) -> Result<(u32, Vec<bool>), FromGgufError> {
    let Some(&(_, default_pattern, default_window)) = SWA_PATTERNS
        .iter()
        .find(|(arch, _, _)| *arch == architecture)
    else {
        return Ok((0, Vec::new()));
    };
    let window = match file.get_u64(&format!("{architecture}.attention.sliding_window"))? {
        Some(window) => u32::try_from(window).map_err(|_| FromGgufError::Invalid {
            field: "attention.sliding_window",
            reason: format!("{window} is out of range"),
        })?,
        None => default_window.unwrap_or(0),
    };
    if window == 0 {
        return Ok((0, Vec::new()));
    }
    let key = format!("{architecture}.attention.sliding_window_pattern");
    let mut flags = match file.get(&key) {
        Some(MetadataValue::Array(MetadataArray::Bool(flags))) => flags.clone(),
        Some(_) => pattern_flags(small_pattern(file.get_u64(&key)?)?, blocks),
        None => pattern_flags(default_pattern, blocks),
    };
    flags.resize(blocks as usize, false);
    Ok((window, flags))
}

fn small_pattern(value: Option<u64>) -> Result<u32, FromGgufError> {
    let value = value.unwrap_or(0);
    u32::try_from(value).map_err(|_| FromGgufError::Invalid {
        field: "attention.sliding_window_pattern",
        reason: format!("{value} is out of range"),
    })
}

/// llama.cpp's `set_swa_pattern(n)`: block `i` uses the window unless `i % n == n - 1`;
/// `n == 0` puts every block on the window.
fn pattern_flags(pattern: u32, blocks: u32) -> Vec<bool> {
    (0..blocks)
        .map(|i| pattern == 0 || i % pattern < pattern - 1)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::estimate::gguf::{estimate_llama_cpp, LlamaCppOptions};
    use crate::units::{GIB, MIB};
    use crate::{place, ClusterSnapshot, GpuView, SystemReserve, WorkerView};

    /// The tiny llama model of `gantry-gguf`: 2 blocks, n_embd 64, 4 heads (4 KV heads),
    /// n_ff 128, trained context 256, all tensors f32.
    fn tiny() -> GgufFile {
        GgufFile::parse(&gantry_gguf::tiny_llama::tiny_llama_bytes()).expect("tiny model parses")
    }

    #[test]
    fn tiny_llama_facts_match_its_configuration() {
        let file = tiny();
        let facts = GgufModelFacts::from_gguf(&file).expect("complete facts");
        assert_eq!(facts.architecture, "llama");
        assert_eq!(facts.block_count, 2);
        assert_eq!(facts.context_length, 256);
        assert_eq!(facts.embedding_length, 64);
        assert_eq!((facts.head_count, facts.head_count_kv), (4, 4));
        assert_eq!(facts.layer_weight_bytes.len(), 2);
        // Every tensor is counted exactly once; the tied embedding copy is apart.
        let by_layer = file.tensor_bytes_by_layer();
        let tied = if file.output_is_tied_to_embedding() {
            file.tensor("token_embd.weight").map_or(0, |t| t.n_bytes)
        } else {
            0
        };
        let counted = facts.layer_weight_bytes.iter().sum::<u64>()
            + facts.input_weight_bytes
            + facts.output_weight_bytes;
        assert_eq!(counted, file.total_tensor_bytes());
        assert_eq!(facts.tied_output_bytes, tied);
        // F32 weights are never repacked: the CPU maps the whole file's tensors.
        assert_eq!(facts.host_repack_bytes, 0);
        assert_eq!(facts.host_mapped_bytes, file.total_tensor_bytes());
        assert!(!facts.encoder_only);
        assert_eq!(facts.sliding_window, 0);
        assert_eq!(facts.input_weight_bytes, by_layer.input);
        // A block of f32 tensors: 4 attention matrices 64 × 64 and 3 feed-forward matrices
        // 64 × 128, plus two norms of 64, all 4 bytes each: (4 × 4096 + 3 × 8192 + 128) × 4.
        assert_eq!(
            facts.layer_weight_bytes,
            vec![(4 * 4096 + 3 * 8192 + 128) * 4; 2]
        );
        assert_eq!(
            facts.vocab_size as usize,
            gantry_gguf::tiny_llama::tiny_llama_vocabulary().len()
        );
    }

    #[test]
    fn tiny_llama_estimates_and_places_on_one_small_gpu() {
        let facts = GgufModelFacts::from_gguf(&tiny()).expect("complete facts");
        let estimate =
            estimate_llama_cpp(&facts, &LlamaCppOptions::default()).expect("valid model");
        // Trained context 256 is below the cap and already padded.
        assert_eq!(estimate.context_size, 256);
        // KV per block: 256 tokens × (4 heads × 16 × 2 B) × 2 (K and V) = 32 KiB.
        assert_eq!(estimate.kv_bytes_per_block, vec![256 * 4 * 16 * 2 * 2; 2]);
        let snapshot = ClusterSnapshot {
            workers: vec![WorkerView {
                id: 1,
                name: "w1".to_owned(),
                ready: true,
                labels: Default::default(),
                backends: ["llama.cpp".to_owned()].into(),
                installed: Default::default(),
                gpus: vec![GpuView {
                    index: 0,
                    total_memory_bytes: GIB,
                    simulated: true,
                }],
                system_memory_bytes: 4 * GIB,
                cpu_count: 2,
                reserve: SystemReserve::default(),
            }],
            placed: vec![],
        };
        let request = crate::PlacementRequest::new(1, "tiny", "llama.cpp", estimate.claim);
        let placement = place(&snapshot, &request).expect("a tiny model fits 1 GiB");
        assert!(placement.gpus[0].bytes < 600 * MIB, "{:?}", placement.gpus);
        assert_eq!(placement.llama.map(|l| l.n_gpu_layers), Some(3));
    }
}
