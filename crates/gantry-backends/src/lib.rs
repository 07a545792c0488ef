//! What each inference backend needs to run one model instance: the one place in gantry that
//! knows a backend's command line, its flags, its health path and how long it may take to
//! start.
//!
//! * [`Backend`], one implementation per backend ([`llama_cpp`], [`vllm`], [`sglang`],
//!   [`custom`]): the program and the arguments before the user's, the health path, the
//!   readiness deadline, and the flags a placement adds (`--ctx-size`, `-ngl`,
//!   `--tensor-split`, `--tensor-parallel-size`, …);
//! * the options the memory estimate reads from a backend's arguments
//!   ([`llama_cpp::estimate_options`], [`vllm::estimate_options`],
//!   [`sglang::estimate_options`], [`custom::declared_claim`]);
//! * where a running backend tells its load ([`load`]), so a stop can drain it first;
//! * what `llama-server` says it allocated, read from its log ([`llama_cpp_memory`]), to
//!   hold the estimate to it;
//! * [`command`](mod@command): turning a [`LaunchSpec`] into the [`BackendCommand`] of each
//!   process (data-parallel ranks, `CUDA_VISIBLE_DEVICES`).
//!
//! Adding a backend is one file here implementing [`Backend`], plus its variant in
//! `gantry_types::BackendKind` and its arm in [`backend`].
//!
//! *Architecture Invariant:* this crate does no IO. The server calls it to estimate and to
//! derive the flags it stores with a placement; the worker calls it to build the command it
//! spawns.

pub mod args;
pub mod command;
pub mod custom;
pub mod engine;
pub mod llama_cpp;
pub mod llama_cpp_memory;
pub mod load;
pub mod sglang;
pub mod vllm;

use std::time::Duration;

use gantry_types::{BackendKind, Placement};

pub use args::{flag_value, parse_flag, ArgsError};
pub use command::{
    backend_command, join_gpu_indexes, rank_gpu_indexes, BackendCommand, BackendError,
    BackendSettings, LaunchSpec, LaunchTarget, CUDA_VISIBLE_DEVICES,
};
pub use load::LoadProbe;

/// The health path of llama.cpp, vLLM and SGLang, and the default for custom commands.
pub const DEFAULT_HEALTH_PATH: &str = "/health";

/// How long a backend may take to answer its health path by default: large models load for
/// minutes.
pub const DEFAULT_READINESS_DEADLINE: Duration = Duration::from_secs(10 * 60);

/// One inference backend.
pub trait Backend: Sync {
    /// Which backend this is.
    fn kind(&self) -> BackendKind;

    /// The command prefix when the worker's configuration names none: the program (looked up
    /// on `PATH`) and any arguments that must come before gantry's own.
    fn default_program(&self) -> Vec<String>;

    /// The whole command line before the user's arguments: the configured prefix, then the
    /// model and the address to listen on.
    fn argv(
        &self,
        settings: &BackendSettings,
        spec: &LaunchSpec,
        target: &LaunchTarget<'_>,
    ) -> Result<Vec<String>, BackendError>;

    /// The path polled until it answers 200, unless the instance names another.
    fn health_path<'a>(&self, _settings: &'a BackendSettings) -> &'a str {
        DEFAULT_HEALTH_PATH
    }

    /// Where the running backend tells how many requests it is answering, so that a stop
    /// can wait for them; `None` when it does not say.
    fn load_probe(&self) -> Option<LoadProbe> {
        None
    }

    /// How long the backend may take to become healthy, unless configured otherwise.
    fn readiness_deadline(&self) -> Duration {
        DEFAULT_READINESS_DEADLINE
    }

    /// The flags that make the process match `placement`, appended after `user_args` (the
    /// model's own arguments). Appended last, they would win over the user's, so each is
    /// added only when the user did not give that flag, unless the estimate assumed the
    /// scheduler's choice (see the implementations). `context_size` is the context the
    /// estimate assumed when the arguments give none.
    fn placement_args(
        &self,
        _user_args: &[String],
        _placement: &Placement,
        _context_size: Option<u32>,
    ) -> Vec<String> {
        Vec::new()
    }
}

/// The implementation of `kind`.
pub fn backend(kind: BackendKind) -> &'static dyn Backend {
    match kind {
        BackendKind::LlamaCpp => &llama_cpp::LlamaCpp,
        BackendKind::Vllm => &vllm::VLLM,
        BackendKind::Sglang => &sglang::SGLANG,
        BackendKind::Custom => &custom::Custom,
    }
}

/// Every backend, for listing what a worker can run.
pub fn all() -> [&'static dyn Backend; 4] {
    [
        &llama_cpp::LlamaCpp,
        &vllm::VLLM,
        &sglang::SGLANG,
        &custom::Custom,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_its_backend() {
        for backend in all() {
            assert_eq!(super::backend(backend.kind()).kind(), backend.kind());
        }
    }
}
