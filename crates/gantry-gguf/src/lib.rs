//! GGUF format: read the header, metadata and tensor table; write GGUF files (used to make the tiny test model).
//!
//! * [`GgufFile`] parses a v2/v3 file from any `Read` or byte prefix, stopping before the
//!   tensor data, so a 100 GB model costs a few megabytes of reading; a prefix that is too
//!   short gives [`GgufError::Truncated`].
//! * [`GgmlType`] is ggml's table of tensor types with their block layout, and
//!   [`tensor_bytes`] the size of a tensor of given dimensions.
//! * [`GgufFile::model_dimensions`] and [`GgufFile::tensor_bytes_by_layer`] give what a
//!   memory estimator needs.
//! * [`GgufWriter`] writes v3 files; [`tiny_llama`] builds a tiny random-weight llama model
//!   that real `llama-server` loads.
//! * [`corpus`] builds small zero-weight models of several architectures (llama, qwen2,
//!   qwen3, gemma2, gemma3, phi3, qwen3moe, bert), whole or split, that `llama-server` loads.

pub mod corpus;
mod error;
mod ggml_type;
mod model;
mod reader;
mod split;
pub mod tiny_llama;
mod value;
mod writer;

#[cfg(test)]
mod tests;

pub use error::GgufError;
pub use ggml_type::{tensor_bytes, GgmlType, GGML_MAX_DIMS};
pub use model::{ModelDimensions, TensorBytesByLayer, ARCHITECTURE_KEY, TOKENIZER_TOKENS_KEY};
pub use reader::{
    GgufFile, TensorInfo, ALIGNMENT_KEY, DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_ARRAY_LENGTH,
    MAX_ARRAY_NESTING, MAX_METADATA_COUNT, MAX_STRING_LENGTH, MAX_TENSOR_COUNT,
};
pub use split::{split_paths, SPLIT_COUNT_KEY};
pub use tiny_llama::write_tiny_llama;
pub use value::{MetadataArray, MetadataValue, ValueType};
pub use writer::{GgufWriter, GGML_MAX_NAME, GGUF_WRITE_VERSION};
