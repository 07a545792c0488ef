//! Resource estimation: from model facts and backend arguments to a [`ResourceClaim`].
//!
//! * [`gguf`]: llama.cpp serving a GGUF file, from [`GgufModelFacts`], which [`from_gguf`]
//!   fills from a parsed `gantry_gguf::GgufFile`;
//! * [`safetensors`] and [`hf_config`]: the pieces of a Hugging Face model directory that
//!   vLLM and SGLang need, parsed from bytes the caller has read;
//! * [`engine`]: vLLM and SGLang claims from those pieces.
//!
//! Every function here takes values and returns values; reading the files is the caller's
//! job.
//!
//! [`ResourceClaim`]: crate::ResourceClaim
//! [`GgufModelFacts`]: gguf::GgufModelFacts

pub mod engine;
pub mod from_gguf;
pub mod gguf;
pub mod hf_config;
pub mod kv_type;
pub mod safetensors;

use thiserror::Error;

use crate::units::{GIB, MIB};

/// Memory a CUDA context takes on each GPU a process touches (driver state, cuBLAS
/// workspaces, kernel images): about 300 MiB to 500 MiB depending on driver and GPU; the
/// estimate takes the upper end, as overbooking a GPU costs more than leaving some idle.
pub const CUDA_CONTEXT_BYTES: u64 = 512 * MIB;

/// Host RAM of a `llama-server` process apart from model data: binary, tokenizer tables,
/// ggml contexts, HTTP server.
pub const LLAMA_CPP_PROCESS_RAM_BYTES: u64 = 256 * MIB;

/// Context size used when the arguments give none: the model's trained context, capped here
/// so that a 128k-context model does not claim a 128k KV cache by default.
pub const DEFAULT_CONTEXT_CAP: u32 = 8192;

/// llama.cpp rounds the context up to a multiple of this (its KV cache padding with flash
/// attention; the largest padding it uses, so the estimate never undercounts).
pub const CONTEXT_PADDING: u32 = 256;

/// Per-GPU memory of a vLLM / SGLang worker process outside weights and KV cache: CUDA
/// context, the activation peak of the start-up profiling run, CUDA graphs. It is counted
/// inside the engine's memory fraction.
pub const ENGINE_GPU_OVERHEAD_BYTES: u64 = 2 * GIB;

/// Host RAM of a vLLM / SGLang process: Python, PyTorch, tokenizer, pinned staging buffers.
pub const ENGINE_PROCESS_RAM_BYTES: u64 = 4 * GIB;

/// Why an estimate could not be made.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EstimateError {
    /// An option (read from the backend's arguments) does not fit the model.
    #[error("invalid {option} {value}: {reason}")]
    InvalidOption {
        /// The option, in words, e.g. `tensor parallel size`.
        option: &'static str,
        /// Its value.
        value: String,
        /// Why it does not fit.
        reason: String,
    },
    /// The model facts are inconsistent or incomplete.
    #[error("invalid model {field}: {reason}")]
    InvalidModel {
        /// The field at fault, e.g. `block_count`.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
}
