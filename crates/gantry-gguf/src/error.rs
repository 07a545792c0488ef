//! The one error type of this crate: every way a GGUF prefix can be unreadable, a tensor
//! shape can be invalid, or a metadata lookup can fail, each variant naming what is wrong.

use std::io;

use crate::ggml_type::GgmlType;
use crate::value::ValueType;

/// Everything that can go wrong reading, writing or querying a GGUF file.
///
/// [`GgufError::Truncated`] is the one a caller reading a prefix of a large file branches
/// on: it means "read more bytes and try again", every other variant means the file is bad.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// The input ended before the header, metadata and tensor table were complete.
    #[error("GGUF data truncated at byte {offset} while reading {what}; supply a longer prefix of the file")]
    Truncated {
        /// Absolute offset (from the start of the file) at which more bytes were needed.
        offset: u64,
        /// What was being read, e.g. "metadata key".
        what: &'static str,
    },

    /// An IO error other than end of input.
    #[error("reading GGUF data at byte {offset}: {source}")]
    Io {
        /// Absolute offset at which the read failed.
        offset: u64,
        /// The underlying error.
        #[source]
        source: io::Error,
    },

    /// The first four bytes are not `GGUF`.
    #[error("not a GGUF file: magic bytes are {found:02x?}, expected \"GGUF\" [47, 47, 55, 46]")]
    BadMagic {
        /// The four bytes found.
        found: [u8; 4],
    },

    /// A version this reader does not understand (only 2 and 3 are supported).
    #[error("unsupported GGUF version {version} (supported: 2 and 3){hint}")]
    UnsupportedVersion {
        /// The version field as read (little-endian).
        version: u32,
        /// An explanation for well-known cases (GGUF v1, big-endian files); may be empty.
        hint: &'static str,
    },

    /// A count read from the file is larger than this reader accepts.
    #[error("{what} is {count}, over the limit of {limit}")]
    LimitExceeded {
        /// What was counted, e.g. "tensor count" or "string length".
        what: &'static str,
        /// The count read from the file.
        count: u64,
        /// The largest accepted value.
        limit: u64,
    },

    /// A metadata value type id outside the GGUF specification.
    #[error("unknown GGUF metadata value type {id} for key '{key}'")]
    UnknownValueType {
        /// The key whose value could not be read.
        key: String,
        /// The type id read from the file.
        id: u32,
    },

    /// A tensor type id that is not in ggml's table.
    #[error("unknown ggml tensor type id {id}")]
    UnknownGgmlType {
        /// The type id read from the file.
        id: u32,
    },

    /// The same metadata key appears twice.
    #[error("duplicate GGUF metadata key '{key}'")]
    DuplicateKey {
        /// The repeated key.
        key: String,
    },

    /// The same tensor name appears twice.
    #[error("duplicate GGUF tensor name '{name}'")]
    DuplicateTensor {
        /// The repeated name.
        name: String,
    },

    /// The file could not be opened.
    #[error("opening GGUF file {path}: {source}")]
    Open {
        /// The path given.
        path: std::path::PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },

    /// A tensor's offset into the data section is not a multiple of the alignment.
    #[error("offset {offset} is not a multiple of the alignment {alignment}")]
    MisalignedOffset {
        /// The tensor's offset, relative to the data section.
        offset: u64,
        /// The file's alignment.
        alignment: u64,
    },

    /// Arrays nested deeper than this reader accepts.
    #[error("arrays nested more than {limit} deep in the value of key '{key}'")]
    NestingTooDeep {
        /// The key whose value nests too deeply.
        key: String,
        /// The deepest nesting accepted.
        limit: usize,
    },

    /// A metadata key is empty.
    #[error("GGUF metadata key number {index} is empty")]
    EmptyKey {
        /// Position of the key in the metadata table.
        index: u64,
    },

    /// `general.alignment` is not a non-zero power of two stored as a u32.
    #[error("general.alignment must be a non-zero power of two of type u32, found {found}")]
    InvalidAlignment {
        /// The offending value, rendered for the message.
        found: String,
    },

    /// A tensor's shape or size is invalid; `source` says how.
    #[error("tensor '{name}': {source}")]
    InvalidTensor {
        /// The tensor's name.
        name: String,
        /// What is wrong with it.
        #[source]
        source: Box<GgufError>,
    },

    /// More dimensions than ggml supports.
    #[error("{n_dims} dimensions, but ggml supports at most {max}")]
    TooManyDimensions {
        /// Number of dimensions given.
        n_dims: u64,
        /// ggml's `GGML_MAX_DIMS`.
        max: usize,
    },

    /// The first dimension of a block-quantized tensor is not a multiple of the block size.
    #[error(
        "first dimension {first_dim} is not a multiple of the {ggml_type} block size {block_size}"
    )]
    NotBlockAligned {
        /// The tensor type.
        ggml_type: GgmlType,
        /// `ne[0]` of the tensor.
        first_dim: u64,
        /// Elements per block of `ggml_type`.
        block_size: u64,
    },

    /// The byte size of a tensor does not fit in 64 bits.
    #[error("size of a {ggml_type} tensor with dimensions {dims:?} overflows 64 bits")]
    SizeOverflow {
        /// The tensor type.
        ggml_type: GgmlType,
        /// The dimensions, `ne[0]` first.
        dims: Vec<u64>,
    },

    /// Data handed to the writer does not match the tensor's dimensions and type.
    #[error("tensor '{name}' has {actual} bytes of data, but its dimensions and type {ggml_type} need {expected}")]
    TensorDataSize {
        /// The tensor's name.
        name: String,
        /// The tensor type.
        ggml_type: GgmlType,
        /// Bytes the dimensions and type require.
        expected: u64,
        /// Bytes given.
        actual: u64,
    },

    /// A metadata key the caller asked for is absent.
    #[error("GGUF metadata key '{key}' is missing")]
    MissingKey {
        /// The key looked up.
        key: String,
    },

    /// A metadata key holds a value of the wrong type for the accessor used.
    #[error("GGUF metadata key '{key}' holds a {found}, expected {expected}")]
    WrongType {
        /// The key looked up.
        key: String,
        /// The type found in the file.
        found: ValueType,
        /// What the accessor accepts, e.g. "an unsigned integer".
        expected: &'static str,
    },

    /// A metadata value is present and well-typed but meaningless (negative count, ...).
    #[error("GGUF metadata key '{key}' has invalid value {value}: {reason}")]
    InvalidValue {
        /// The key looked up.
        key: String,
        /// The value, rendered for the message.
        value: String,
        /// Why it is invalid.
        reason: &'static str,
    },

    /// A [`crate::tiny_llama::TinyLlamaConfig`] that cannot describe a llama model.
    #[error("invalid tiny llama configuration: {0}")]
    InvalidTinyLlamaConfig(String),
}
