//! A corpus of small zero-weight GGUF models of several architectures that real llama.cpp
//! (`llama-server`) loads, for tests that compare a memory estimate with what llama.cpp
//! reports allocating.
//!
//! A [`CorpusModel`] holds every figure the memory of a loaded model depends on: the
//! architecture, the weight type, the transformer shape, the vocabulary size, the trained
//! context, the sliding window and the experts. [`CorpusModel::preset`] gives a small model
//! of realistic proportions for each [`CorpusArch`]; change its public fields to vary it.
//! [`CorpusModel::build`] lays the model out as llama.cpp's loader for that architecture
//! expects it (the tensor names, shapes and metadata keys of build 11434's `src/models/*.cpp`
//! and `src/llama-arch.cpp`), and [`CorpusModel::write`] writes it as one file or as the
//! parts `gguf-split` would write.
//!
//! Tensor data is all zeros, which is a valid value of every type (a quantized block of
//! zeros has scale 0), so the models compute nonsense but cost exactly the memory of a real
//! model of their shape. As in real files, one-dimensional tensors (norms, biases) are F32,
//! and so are the few matrices that llama.cpp's converter and quantizer keep in F32 (the
//! expert router `ffn_gate_inp`, BERT's `position_embd` and `token_types`); every other
//! matrix has the model's weight type.

mod layout;
mod metadata;
#[cfg(test)]
mod tests;

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use crate::error::GgufError;
use crate::ggml_type::GgmlType;
use crate::value::MetadataValue;
use crate::writer::GgufWriter;

/// `split.no`: which part of a split model a file is, from 0 (a `u16`, as `gguf-split`
/// writes it and llama.cpp's loader requires).
pub const SPLIT_NO_KEY: &str = "split.no";
/// `split.tensors.count`: how many tensors all parts hold together (an `i32`).
pub const SPLIT_TENSORS_COUNT_KEY: &str = "split.tensors.count";

/// The architectures of the corpus, each as llama.cpp names it in `general.architecture`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CorpusArch {
    /// Llama 2/3: grouped-query attention, SwiGLU feed-forward, RMS norm.
    Llama,
    /// Qwen 2 / 2.5: llama with biases on the query, key and value projections.
    Qwen2,
    /// Qwen 3: llama with RMS norms on queries and keys, head size independent of width.
    Qwen3,
    /// Gemma 2: alternating sliding-window and full attention layers, norms after attention
    /// and feed-forward, logit soft-capping, output always tied to the token embedding.
    Gemma2,
    /// Gemma 3: five sliding-window layers for each full attention layer, query/key norms.
    Gemma3,
    /// Phi 3: fused query-key-value projection and fused gate-up feed-forward.
    Phi3,
    /// Qwen 3 mixture of experts: every feed-forward is a set of experts and a router.
    Qwen3Moe,
    /// BERT: a bidirectional encoder with learned positions, served with `--embedding`.
    Bert,
}

impl CorpusArch {
    /// Every architecture of the corpus.
    pub const ALL: [CorpusArch; 8] = [
        CorpusArch::Llama,
        CorpusArch::Qwen2,
        CorpusArch::Qwen3,
        CorpusArch::Gemma2,
        CorpusArch::Gemma3,
        CorpusArch::Phi3,
        CorpusArch::Qwen3Moe,
        CorpusArch::Bert,
    ];

    /// The value of `general.architecture` and the prefix of the architecture's keys.
    pub fn name(self) -> &'static str {
        match self {
            CorpusArch::Llama => "llama",
            CorpusArch::Qwen2 => "qwen2",
            CorpusArch::Qwen3 => "qwen3",
            CorpusArch::Gemma2 => "gemma2",
            CorpusArch::Gemma3 => "gemma3",
            CorpusArch::Phi3 => "phi3",
            CorpusArch::Qwen3Moe => "qwen3moe",
            CorpusArch::Bert => "bert",
        }
    }

    /// Whether the model computes embeddings rather than generating text: llama-server must
    /// be started with `--embedding`, and there is no KV cache and no output layer.
    pub fn is_embedding_model(self) -> bool {
        self == CorpusArch::Bert
    }

    /// Whether the architecture has a mixture-of-experts feed-forward.
    pub fn is_mixture_of_experts(self) -> bool {
        self == CorpusArch::Qwen3Moe
    }
}

impl fmt::Display for CorpusArch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One model of the corpus: everything llama.cpp's memory use depends on.
///
/// The shape rules llama.cpp imposes are checked by [`CorpusModel::build`], which names the
/// field at fault.
#[derive(Debug, Clone, PartialEq)]
pub struct CorpusModel {
    /// The architecture.
    pub arch: CorpusArch,
    /// Type of the weight matrices: one of [`CorpusModel::WEIGHT_TYPES`]. Written as the
    /// matching `general.file_type` (all F32, mostly F16, mostly Q8_0, mostly Q4_K_S).
    pub weight_type: GgmlType,
    /// No `output.weight`: llama.cpp reuses `token_embd.weight` as the output layer (and
    /// places a second copy of it with the output layer). Always true for Gemma 2, whose
    /// loader never reads `output.weight`; always false for BERT, which has no output layer.
    pub tied_embeddings: bool,
    /// Transformer blocks (`<arch>.block_count`).
    pub block_count: u32,
    /// Width of the residual stream (`<arch>.embedding_length`, `n_embd`).
    pub embedding_length: u32,
    /// Query heads (`<arch>.attention.head_count`).
    pub head_count: u32,
    /// Key/value heads (`<arch>.attention.head_count_kv`); divides `head_count`.
    pub head_count_kv: u32,
    /// Size of one head, written as both `key_length` and `value_length` (and as
    /// `rope.dimension_count` for the architectures with rotary embeddings). Qwen 2, Phi 3
    /// and BERT shape their query projection as `n_embd` wide, so for them
    /// `head_count * head_dim` must equal `embedding_length`.
    pub head_dim: u32,
    /// Feed-forward width (`<arch>.feed_forward_length`). Phi 3's fused `ffn_up` is twice
    /// this wide; Qwen 3 MoE writes it but sizes its experts by
    /// `expert_feed_forward_length`.
    pub feed_forward_length: u32,
    /// Tokens in the vocabulary, and so rows of the token embedding and of the output
    /// layer: a small real vocabulary padded with unused tokens.
    pub vocab_size: u32,
    /// The trained context (`<arch>.context_length`); BERT has one learned position
    /// embedding per position of it.
    pub context_length: u32,
    /// `<arch>.attention.sliding_window`. Gemma 2 and Gemma 3 honour it (Gemma 2 with the
    /// window on every other layer, and 4096 when the key is absent; Gemma 3 on five layers
    /// of every six, and on none when absent); Phi 3 files carry it but llama.cpp turns it
    /// off with a warning. Other architectures have no sliding window.
    pub sliding_window: Option<u32>,
    /// Experts per feed-forward (`<arch>.expert_count`); 0 for dense models.
    pub expert_count: u32,
    /// Experts each token is routed to (`<arch>.expert_used_count`); 0 for dense models.
    pub expert_used_count: u32,
    /// Width of one expert (`<arch>.expert_feed_forward_length`); 0 for dense models.
    pub expert_feed_forward_length: u32,
}

impl CorpusModel {
    /// The weight types the corpus is meant to be built with.
    pub const WEIGHT_TYPES: [GgmlType; 4] =
        [GgmlType::F32, GgmlType::F16, GgmlType::Q8_0, GgmlType::Q4_K];

    /// A small model of `arch` with the proportions of a real one (grouped-query attention,
    /// a feed-forward a few times the width, a 30k-token vocabulary, a trained context of
    /// thousands), F32 weights. Every row length is a multiple of 256 so that every type of
    /// [`CorpusModel::WEIGHT_TYPES`] fits; llama-server loads each on a CPU in about a
    /// second. Qwen 2 and the Gemmas tie their output to the embedding as the real small
    /// models do; the others have an output layer.
    pub fn preset(arch: CorpusArch) -> CorpusModel {
        let base = CorpusModel {
            arch,
            weight_type: GgmlType::F32,
            tied_embeddings: false,
            block_count: 4,
            embedding_length: 256,
            head_count: 4,
            head_count_kv: 2,
            head_dim: 64,
            feed_forward_length: 768,
            vocab_size: 32000,
            context_length: 4096,
            sliding_window: None,
            expert_count: 0,
            expert_used_count: 0,
            expert_feed_forward_length: 0,
        };
        match arch {
            CorpusArch::Llama => base,
            // Like Qwen2.5-0.5B: a wide feed-forward and a tied output.
            CorpusArch::Qwen2 => CorpusModel {
                tied_embeddings: true,
                feed_forward_length: 1280,
                vocab_size: 32768,
                context_length: 8192,
                ..base
            },
            // Like Qwen3-0.6B: heads of 128, so the attention is wider than the stream.
            CorpusArch::Qwen3 => CorpusModel {
                head_dim: 128,
                context_length: 8192,
                ..base
            },
            // Like gemma-2-2b: heads of 128 (256 in the real model), window on alternate
            // layers, a window much smaller than the context (4096 in the real model).
            CorpusArch::Gemma2 => CorpusModel {
                tied_embeddings: true,
                head_dim: 128,
                feed_forward_length: 1024,
                context_length: 8192,
                sliding_window: Some(512),
                ..base
            },
            // Like gemma-3-270m: one key/value head, six blocks so that exactly one has
            // full attention, and a window half that of the real model so that it bounds
            // the cache of llama-server's four unified slots (window * 4 + batch) already
            // at a context of 2048.
            CorpusArch::Gemma3 => CorpusModel {
                tied_embeddings: true,
                block_count: 6,
                head_count_kv: 1,
                head_dim: 128,
                feed_forward_length: 1024,
                context_length: 8192,
                sliding_window: Some(256),
                ..base
            },
            // Like Phi-3-mini: multi-head attention (no grouping) and its 32064-token
            // vocabulary.
            CorpusArch::Phi3 => CorpusModel {
                head_count_kv: 4,
                vocab_size: 32064,
                ..base
            },
            // Like Qwen3-30B-A3B: heads of 128, eight experts of which two are used.
            CorpusArch::Qwen3Moe => CorpusModel {
                head_dim: 128,
                context_length: 8192,
                expert_count: 8,
                expert_used_count: 2,
                expert_feed_forward_length: 256,
                ..base
            },
            // Like all-MiniLM / bge-small: multi-head attention, BERT's 30522-token
            // WordPiece vocabulary and 512 learned positions.
            CorpusArch::Bert => CorpusModel {
                head_count_kv: 4,
                feed_forward_length: 1024,
                vocab_size: 30522,
                context_length: 512,
                ..base
            },
        }
    }

    /// The model as a [`GgufWriter`] holding metadata and zero-filled tensors.
    pub fn build(&self) -> Result<GgufWriter, CorpusError> {
        Ok(self.build_parts(1)?.remove(0))
    }

    /// The model as `parts` writers, split as llama.cpp's `gguf-split` splits it: the first
    /// holds all metadata, every one holds a consecutive share of the tensors and its own
    /// `split.no` (u16), `split.count` (u16) and `split.tensors.count` (i32, all tensors).
    /// One part is the plain model, with no `split.*` keys.
    pub fn build_parts(&self, parts: u32) -> Result<Vec<GgufWriter>, CorpusError> {
        self.validate()?;
        let tensors = layout::tensors(self);
        if parts == 0 || parts as usize > tensors.len() || parts > u32::from(u16::MAX) {
            return Err(CorpusError::InvalidSplit {
                parts,
                tensors: tensors.len(),
            });
        }
        let mut writers: Vec<GgufWriter> = (0..parts).map(|_| GgufWriter::new()).collect();
        metadata::add_metadata(self, &mut writers[0])?;
        if parts > 1 {
            let tensors_count = i32::try_from(tensors.len())
                .expect("a model that fits in memory has far fewer than 2^31 tensors");
            let count = u16::try_from(parts).expect("parts fit in a u16, checked above");
            for (index, writer) in writers.iter_mut().enumerate() {
                let index = u16::try_from(index).expect("parts fit in a u16, checked above");
                writer
                    .add_metadata(SPLIT_NO_KEY, MetadataValue::U16(index))?
                    .add_metadata(crate::split::SPLIT_COUNT_KEY, MetadataValue::U16(count))?
                    .add_metadata(SPLIT_TENSORS_COUNT_KEY, MetadataValue::I32(tensors_count))?;
            }
        }
        // Consecutive, nearly equal shares by count, as `gguf-split --split-max-tensors`.
        let n = tensors.len();
        for (index, tensor) in tensors.into_iter().enumerate() {
            let part = index * parts as usize / n;
            let bytes = tensor
                .ggml_type
                .tensor_bytes(&tensor.dims)
                .map_err(|source| GgufError::InvalidTensor {
                    name: tensor.name.clone(),
                    source: Box::new(source),
                })?;
            let zeros = vec![0u8; usize::try_from(bytes).expect("corpus tensors fit in memory")];
            writers[part].add_tensor(tensor.name, &tensor.dims, tensor.ggml_type, zeros)?;
        }
        Ok(writers)
    }

    /// Writes the model into `dir` as `<stem>.gguf` when `parts` is 1, else as the `parts`
    /// files `<stem>-00001-of-0000N.gguf` … that llama.cpp finds from the first. Returns the
    /// paths in order; the first is the one to give llama-server.
    pub fn write(&self, dir: &Path, stem: &str, parts: u32) -> Result<Vec<PathBuf>, CorpusError> {
        let writers = self.build_parts(parts)?;
        let paths = part_paths(dir, stem, parts);
        for (writer, path) in writers.iter().zip(&paths) {
            writer
                .write_file(path)
                .map_err(|source| CorpusError::Write {
                    path: path.clone(),
                    source,
                })?;
        }
        Ok(paths)
    }

    /// `general.file_type` for the weight type: llama.cpp's `LLAMA_FTYPE_*`.
    pub fn file_type(&self) -> Option<u32> {
        match self.weight_type {
            GgmlType::F32 => Some(0),
            GgmlType::F16 => Some(1),
            GgmlType::Q8_0 => Some(7),
            GgmlType::Q4_K => Some(14),
            _ => None,
        }
    }

    /// Width of all query heads together.
    pub fn query_width(&self) -> u32 {
        self.head_count * self.head_dim
    }

    /// Width of all key (or value) heads together.
    pub fn key_value_width(&self) -> u32 {
        self.head_count_kv * self.head_dim
    }

    /// Checks the rules llama.cpp's loader and graph impose on the shape.
    fn validate(&self) -> Result<(), CorpusError> {
        let arch = self.arch;
        let invalid = |reason: String| Err(CorpusError::InvalidModel { arch, reason });
        if self.file_type().is_none() {
            return invalid(format!(
                "weight_type {} is not one of F32, F16, Q8_0, Q4_K",
                self.weight_type
            ));
        }
        let sizes = [
            ("block_count", self.block_count),
            ("embedding_length", self.embedding_length),
            ("head_count", self.head_count),
            ("head_count_kv", self.head_count_kv),
            ("head_dim", self.head_dim),
            ("feed_forward_length", self.feed_forward_length),
            ("vocab_size", self.vocab_size),
            ("context_length", self.context_length),
        ];
        if let Some((field, _)) = sizes.iter().find(|(_, size)| *size == 0) {
            return invalid(format!("{field} must be positive"));
        }
        if self.head_count % self.head_count_kv != 0 {
            return invalid(format!(
                "head_count {} is not a multiple of head_count_kv {}",
                self.head_count, self.head_count_kv
            ));
        }
        let query_width = u64::from(self.head_count) * u64::from(self.head_dim);
        if matches!(
            arch,
            CorpusArch::Qwen2 | CorpusArch::Phi3 | CorpusArch::Bert
        ) && query_width != u64::from(self.embedding_length)
        {
            return invalid(format!(
                "head_count * head_dim is {query_width}, but {arch} needs it equal to \
                 embedding_length {}",
                self.embedding_length
            ));
        }
        if arch != CorpusArch::Bert && self.head_dim % 2 != 0 {
            return invalid(format!(
                "head_dim {} must be even for rotary embeddings",
                self.head_dim
            ));
        }
        match (arch, self.tied_embeddings) {
            (CorpusArch::Gemma2, false) => {
                return invalid("gemma2 always ties its output to the token embedding".into())
            }
            (CorpusArch::Bert, true) => {
                return invalid("bert has no output layer to tie to the token embedding".into())
            }
            _ => {}
        }
        if self.sliding_window.is_some()
            && !matches!(
                arch,
                CorpusArch::Gemma2 | CorpusArch::Gemma3 | CorpusArch::Phi3
            )
        {
            return invalid(format!("{arch} has no sliding window attention"));
        }
        if self.sliding_window == Some(0) {
            return invalid("sliding_window must be positive when set".into());
        }
        let experts = [
            self.expert_count,
            self.expert_used_count,
            self.expert_feed_forward_length,
        ];
        if arch.is_mixture_of_experts() {
            if experts.contains(&0) {
                return invalid(
                    "expert_count, expert_used_count and expert_feed_forward_length must be \
                     positive"
                        .into(),
                );
            }
            if self.expert_used_count > self.expert_count {
                return invalid(format!(
                    "expert_used_count {} exceeds expert_count {}",
                    self.expert_used_count, self.expert_count
                ));
            }
        } else if experts != [0, 0, 0] {
            return invalid(format!(
                "{arch} is dense: expert_count, expert_used_count and \
                 expert_feed_forward_length must be 0"
            ));
        }
        let minimum_vocab = metadata::minimum_vocab_size(arch);
        if self.vocab_size < minimum_vocab {
            return invalid(format!(
                "vocab_size {} is smaller than the {minimum_vocab} tokens of the base vocabulary",
                self.vocab_size
            ));
        }
        // Blocks of a quantized type run along ne[0], the input width of each matrix.
        let block = self.weight_type.block_size();
        let mut row_lengths = vec![
            ("embedding_length", self.embedding_length),
            ("head_count * head_dim", self.head_count * self.head_dim),
            ("feed_forward_length", self.feed_forward_length),
        ];
        if arch.is_mixture_of_experts() {
            row_lengths.push((
                "expert_feed_forward_length",
                self.expert_feed_forward_length,
            ));
        }
        if let Some((field, length)) = row_lengths
            .iter()
            .find(|(_, length)| u64::from(*length) % block != 0)
        {
            return invalid(format!(
                "{field} {length} is not a multiple of the {} block size {block}",
                self.weight_type
            ));
        }
        Ok(())
    }
}

/// The paths [`CorpusModel::write`] writes: `<stem>.gguf`, or llama.cpp's split names.
pub fn part_paths(dir: &Path, stem: &str, parts: u32) -> Vec<PathBuf> {
    if parts == 1 {
        return vec![dir.join(format!("{stem}.gguf"))];
    }
    (1..=parts)
        .map(|i| dir.join(format!("{stem}-{i:05}-of-{parts:05}.gguf")))
        .collect()
}

/// Why a corpus model could not be built or written.
#[derive(Debug, thiserror::Error)]
pub enum CorpusError {
    /// The shape breaks a rule of llama.cpp for the architecture; `reason` names the field.
    #[error("invalid {arch} corpus model: {reason}")]
    InvalidModel {
        /// The model's architecture.
        arch: CorpusArch,
        /// What is wrong, naming the field.
        reason: String,
    },

    /// A split into no parts, more parts than tensors, or more than `u16::MAX` parts.
    #[error("cannot split a model of {tensors} tensors into {parts} files")]
    InvalidSplit {
        /// Parts asked for.
        parts: u32,
        /// Tensors of the model.
        tensors: usize,
    },

    /// The GGUF writer refused a tensor or a key.
    #[error(transparent)]
    Gguf(#[from] GgufError),

    /// A file could not be written.
    #[error("writing {path}: {source}")]
    Write {
        /// The file being written.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
}
