//! Model facts a memory estimator needs, read from a parsed [`GgufFile`]: the architecture,
//! its hyperparameters under `<arch>.*` keys, and tensor bytes split into transformer blocks
//! (`blk.N.*`), the input layer, the output layer and the rest.

use std::collections::BTreeMap;

use crate::error::GgufError;
use crate::reader::GgufFile;
use crate::value::{MetadataArray, MetadataValue};

/// The key naming the architecture, e.g. `llama`; other keys are prefixed by its value.
pub const ARCHITECTURE_KEY: &str = "general.architecture";
/// The vocabulary of llama.cpp's tokenizer, whose length is the vocabulary size.
pub const TOKENIZER_TOKENS_KEY: &str = "tokenizer.ggml.tokens";

/// The shape of a transformer model as its GGUF metadata states it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelDimensions {
    /// `general.architecture`.
    pub architecture: String,
    /// `<arch>.block_count`: number of transformer blocks.
    pub block_count: u64,
    /// `<arch>.context_length`: the context the model was trained for.
    pub context_length: u64,
    /// `<arch>.embedding_length` (`n_embd`).
    pub embedding_length: u64,
    /// `<arch>.attention.head_count` (the largest, when given per layer).
    pub head_count: u64,
    /// `<arch>.attention.head_count_kv` (the largest, when given per layer); equal to
    /// `head_count` when absent, as llama.cpp assumes.
    pub head_count_kv: u64,
    /// `<arch>.attention.key_length`, when present; llama.cpp's default otherwise is
    /// `embedding_length / head_count`.
    pub key_length: Option<u64>,
    /// `<arch>.attention.value_length`, when present; same default as `key_length`.
    pub value_length: Option<u64>,
    /// `<arch>.vocab_size`, else the length of `tokenizer.ggml.tokens`; `None` if neither.
    pub vocab_size: Option<u64>,
}

/// Tensor bytes by where llama.cpp puts them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TensorBytesByLayer {
    /// Bytes of the tensors named `blk.N.*`, indexed by `N`. Its length is one more than the
    /// highest block number present; blocks with no tensors count 0.
    pub blocks: Vec<u64>,
    /// The input layer: `token_embd.*`, `position_embd.*`, `token_types.*`,
    /// `per_layer_token_embd.*`. llama.cpp keeps these in host memory whatever the offload.
    pub input: u64,
    /// The output layer: `output.*` and `output_norm.*`.
    pub output: u64,
    /// Every other tensor outside the blocks (encoder or vision parts, rope tables, ...).
    pub other: u64,
}

impl TensorBytesByLayer {
    /// Bytes outside the transformer blocks.
    pub fn non_block(&self) -> u64 {
        self.input
            .saturating_add(self.output)
            .saturating_add(self.other)
    }

    /// Bytes of all tensors.
    pub fn total(&self) -> u64 {
        self.blocks
            .iter()
            .fold(self.non_block(), |sum, &b| sum.saturating_add(b))
    }
}

/// Whether a non-block tensor belongs to the input layer.
fn is_input_tensor(name: &str) -> bool {
    [
        "token_embd.",
        "position_embd.",
        "token_types.",
        "per_layer_token_embd.",
    ]
    .iter()
    .any(|prefix| name.starts_with(prefix))
}

/// Whether a non-block tensor belongs to the output layer.
fn is_output_tensor(name: &str) -> bool {
    name.starts_with("output.") || name.starts_with("output_norm.")
}

impl GgufFile {
    /// `general.architecture`.
    pub fn architecture(&self) -> Result<&str, GgufError> {
        match self.get(ARCHITECTURE_KEY) {
            None => Err(GgufError::MissingKey {
                key: ARCHITECTURE_KEY.to_owned(),
            }),
            Some(MetadataValue::String(s)) => Ok(s),
            Some(other) => Err(GgufError::WrongType {
                key: ARCHITECTURE_KEY.to_owned(),
                found: other.value_type(),
                expected: "a string",
            }),
        }
    }

    /// The string value of `key`; `None` when absent, an error when not a string.
    pub fn get_str(&self, key: &str) -> Result<Option<&str>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(MetadataValue::String(s)) => Ok(Some(s)),
            Some(other) => Err(GgufError::WrongType {
                key: key.to_owned(),
                found: other.value_type(),
                expected: "a string",
            }),
        }
    }

    /// The unsigned value of `key`, which may be stored as any integer type; `None` when
    /// absent. A per-layer array of integers (some models give head counts per layer) yields
    /// its largest element, the figure that bounds memory. Negative values and other types
    /// are errors.
    pub fn get_u64(&self, key: &str) -> Result<Option<u64>, GgufError> {
        let Some(value) = self.get(key) else {
            return Ok(None);
        };
        let invalid = || GgufError::InvalidValue {
            key: key.to_owned(),
            value: value.to_string(),
            reason: "expected a non-negative integer",
        };
        match value {
            MetadataValue::Array(array) => match array.to_u64_vec() {
                Some(values) => Ok(Some(values.into_iter().max().unwrap_or(0))),
                None if is_integer_array(array) => Err(invalid()),
                None => Err(GgufError::WrongType {
                    key: key.to_owned(),
                    found: value.value_type(),
                    expected: "an integer or an array of integers",
                }),
            },
            scalar if is_integer(scalar) => scalar.as_u64().map(Some).ok_or_else(invalid),
            _ => Err(GgufError::WrongType {
                key: key.to_owned(),
                found: value.value_type(),
                expected: "an integer",
            }),
        }
    }

    /// Like [`GgufFile::get_u64`] but the key must be present.
    pub fn require_u64(&self, key: &str) -> Result<u64, GgufError> {
        self.get_u64(key)?.ok_or_else(|| GgufError::MissingKey {
            key: key.to_owned(),
        })
    }

    /// The key `<arch>.<suffix>` for this file's architecture, e.g. `llama.block_count`.
    pub fn arch_key(&self, suffix: &str) -> Result<String, GgufError> {
        Ok(format!("{}.{suffix}", self.architecture()?))
    }

    /// `<arch>.block_count`.
    pub fn block_count(&self) -> Result<u64, GgufError> {
        self.require_u64(&self.arch_key("block_count")?)
    }

    /// `<arch>.context_length`.
    pub fn context_length(&self) -> Result<u64, GgufError> {
        self.require_u64(&self.arch_key("context_length")?)
    }

    /// `<arch>.embedding_length`.
    pub fn embedding_length(&self) -> Result<u64, GgufError> {
        self.require_u64(&self.arch_key("embedding_length")?)
    }

    /// `<arch>.attention.head_count`.
    pub fn head_count(&self) -> Result<u64, GgufError> {
        self.require_u64(&self.arch_key("attention.head_count")?)
    }

    /// `<arch>.attention.head_count_kv`, or `head_count` when absent.
    pub fn head_count_kv(&self) -> Result<u64, GgufError> {
        match self.get_u64(&self.arch_key("attention.head_count_kv")?)? {
            Some(n) => Ok(n),
            None => self.head_count(),
        }
    }

    /// `<arch>.attention.key_length`, when present.
    pub fn key_length(&self) -> Result<Option<u64>, GgufError> {
        self.get_u64(&self.arch_key("attention.key_length")?)
    }

    /// `<arch>.attention.value_length`, when present.
    pub fn value_length(&self) -> Result<Option<u64>, GgufError> {
        self.get_u64(&self.arch_key("attention.value_length")?)
    }

    /// `<arch>.vocab_size`, else the number of entries of `tokenizer.ggml.tokens`.
    pub fn vocab_size(&self) -> Result<Option<u64>, GgufError> {
        if let Some(n) = self.get_u64(&self.arch_key("vocab_size")?)? {
            return Ok(Some(n));
        }
        Ok(self
            .get(TOKENIZER_TOKENS_KEY)
            .and_then(MetadataValue::as_array)
            .map(|tokens| tokens.len() as u64))
    }

    /// All of the above at once.
    pub fn model_dimensions(&self) -> Result<ModelDimensions, GgufError> {
        Ok(ModelDimensions {
            architecture: self.architecture()?.to_owned(),
            block_count: self.block_count()?,
            context_length: self.context_length()?,
            embedding_length: self.embedding_length()?,
            head_count: self.head_count()?,
            head_count_kv: self.head_count_kv()?,
            key_length: self.key_length()?,
            value_length: self.value_length()?,
            vocab_size: self.vocab_size()?,
        })
    }

    /// Bytes of all tensors (the size of the data section without padding).
    pub fn total_tensor_bytes(&self) -> u64 {
        self.tensors
            .iter()
            .fold(0u64, |sum, t| sum.saturating_add(t.n_bytes))
    }

    /// Tensor bytes grouped by transformer block, input layer, output layer and the rest.
    pub fn tensor_bytes_by_layer(&self) -> TensorBytesByLayer {
        let mut blocks: BTreeMap<u64, u64> = BTreeMap::new();
        let mut result = TensorBytesByLayer::default();
        for tensor in &self.tensors {
            let bytes = tensor.n_bytes;
            let slot = match tensor.block_index() {
                Some(index) => blocks.entry(index).or_default(),
                None if is_input_tensor(&tensor.name) => &mut result.input,
                None if is_output_tensor(&tensor.name) => &mut result.output,
                None => &mut result.other,
            };
            *slot = slot.saturating_add(bytes);
        }
        // Block numbers come from tensor names and are bounded by the tensor count in any
        // sane file; a forged `blk.999999999.x` is folded into `other` rather than allocated.
        let limit = self.tensors.len() as u64;
        if let Some(&highest) = blocks.keys().next_back() {
            let len = highest.min(limit) + 1;
            result.blocks = vec![0; len as usize];
        }
        for (index, bytes) in blocks {
            match result.blocks.get_mut(index as usize) {
                Some(slot) if index <= limit => *slot = bytes,
                _ => result.other = result.other.saturating_add(bytes),
            }
        }
        result
    }

    /// Whether the model has no `output.weight` and reuses the token embedding as its output
    /// layer (llama.cpp then places a copy of the embedding with the output layer).
    pub fn output_is_tied_to_embedding(&self) -> bool {
        self.tensor("output.weight").is_none() && self.tensor("token_embd.weight").is_some()
    }
}

fn is_integer(value: &MetadataValue) -> bool {
    matches!(
        value,
        MetadataValue::U8(_)
            | MetadataValue::I8(_)
            | MetadataValue::U16(_)
            | MetadataValue::I16(_)
            | MetadataValue::U32(_)
            | MetadataValue::I32(_)
            | MetadataValue::U64(_)
            | MetadataValue::I64(_)
    )
}

fn is_integer_array(array: &MetadataArray) -> bool {
    matches!(
        array,
        MetadataArray::U8(_)
            | MetadataArray::I8(_)
            | MetadataArray::U16(_)
            | MetadataArray::I16(_)
            | MetadataArray::U32(_)
            | MetadataArray::I32(_)
            | MetadataArray::U64(_)
            | MetadataArray::I64(_)
    )
}
