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
//!   llama.cpp places a copy of the token embedding there, so its bytes count again;
//! * anything else outside the blocks (rope tables, encoder or vision parts) is counted with
//!   the output layer: on the GPU on full offload, in RAM otherwise, so it is never left out.

use gantry_gguf::{GgufError, GgufFile};
use thiserror::Error;

use super::gguf::GgufModelFacts;

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
        Ok(GgufModelFacts {
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
            output_weight_bytes: by_layer
                .output
                .saturating_add(by_layer.other)
                .saturating_add(tied_output),
        })
    }
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
        // Every tensor is counted exactly once, plus the tied embedding copy if any.
        let by_layer = file.tensor_bytes_by_layer();
        let tied = if file.output_is_tied_to_embedding() {
            file.tensor("token_embd.weight").map_or(0, |t| t.n_bytes)
        } else {
            0
        };
        let counted = facts.layer_weight_bytes.iter().sum::<u64>()
            + facts.input_weight_bytes
            + facts.output_weight_bytes;
        assert_eq!(counted, file.total_tensor_bytes() + tied);
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
        assert_eq!(estimate.kv_bytes_per_block, 256 * 4 * 16 * 2 * 2);
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
