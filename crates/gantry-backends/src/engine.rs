//! What vLLM and SGLang have in common: a serving engine run as
//! `<program> <model flag> <path> --host <bind> --port <port> <args…>`, healthy on
//! `/health`, whose memory estimate reads a few options from its arguments (each engine
//! names its own flags), and to which a placement adds its tensor-parallel size.

use gantry_sched::{EngineOptions, ServingEngine};
use gantry_types::{BackendKind, Placement};

use crate::args::{flag_value, parse_flag, ArgsError};
use crate::command::{serve_argv, BackendError, BackendSettings, LaunchSpec, LaunchTarget};
use crate::load::LoadProbe;
use crate::Backend;

/// One serving engine.
#[derive(Debug)]
pub struct Engine {
    pub kind: BackendKind,
    /// The command prefix when the worker names none.
    pub program: fn() -> Vec<String>,
    /// What comes before the model path on the command line.
    pub model_flag: &'static [&'static str],
    /// The flag that names the model in the engine's answers (the served name).
    pub name_flags: &'static [&'static str],
    pub flags: EngineFlags,
    /// Where the engine tells its load.
    pub load: LoadProbe,
}

impl Engine {
    /// Reads the options that change the engine's memory use from its arguments.
    pub fn estimate_options(&self, args: &[String]) -> Result<EngineOptions, ArgsError> {
        self.flags.estimate_options(args)
    }
}

impl Backend for Engine {
    fn kind(&self) -> BackendKind {
        self.kind
    }

    fn default_program(&self) -> Vec<String> {
        (self.program)()
    }

    fn argv(
        &self,
        settings: &BackendSettings,
        spec: &LaunchSpec,
        target: &LaunchTarget<'_>,
    ) -> Result<Vec<String>, BackendError> {
        serve_argv(settings, spec, target, self.model_flag, self.name_flags)
    }

    fn load_probe(&self) -> Option<LoadProbe> {
        Some(self.load)
    }

    fn placement_args(
        &self,
        user_args: &[String],
        placement: &Placement,
        _context_size: Option<u32>,
    ) -> Vec<String> {
        self.flags.placement_args(user_args, placement)
    }
}

/// The flags one engine reads its estimate options from, each with its spellings.
#[derive(Debug)]
pub struct EngineFlags {
    pub engine: ServingEngine,
    /// The fraction of each GPU the engine reserves.
    pub memory_fraction: &'static [&'static str],
    /// The maximum sequence length.
    pub max_model_len: &'static [&'static str],
    /// The tensor-parallel size; the first spelling is the one a placement adds.
    pub tensor_parallel: &'static [&'static str],
    /// The data-parallel size.
    pub data_parallel: &'static [&'static str],
}

impl EngineFlags {
    /// Reads the estimate options from the engine's arguments (`--flag value` or
    /// `--flag=value`); absent flags keep the engine's defaults.
    pub(crate) fn estimate_options(&self, args: &[String]) -> Result<EngineOptions, ArgsError> {
        let memory_fraction = match flag_value(args, self.memory_fraction) {
            None => None,
            Some((flag, value)) => Some(parse_fraction(flag, value)?),
        };
        let max_model_len = match flag_value(args, self.max_model_len) {
            None => None,
            Some((flag, value)) => Some(parse_token_count(flag, value)?),
        };
        let kv_cache_element_bits = match flag_value(args, &["--kv-cache-dtype"]) {
            None => 16,
            Some((flag, value)) => kv_dtype_bits(value)
                .ok_or_else(|| ArgsError::new(flag, value, "unknown KV cache dtype"))?,
        };
        let nonzero = |value: Option<u32>, flag: &str| match value {
            Some(0) => Err(ArgsError::new(flag, "0", "must be at least 1")),
            other => Ok(other),
        };
        Ok(EngineOptions {
            engine: self.engine,
            memory_fraction,
            max_model_len,
            kv_cache_element_bits,
            tensor_parallel_size: nonzero(
                parse_flag(args, self.tensor_parallel)?,
                self.tensor_parallel[0],
            )?,
            data_parallel_size: nonzero(
                parse_flag(args, self.data_parallel)?,
                self.data_parallel[0],
            )?,
        })
    }

    /// The tensor-parallel size of the placement, unless the user gave one.
    pub(crate) fn placement_args(
        &self,
        user_args: &[String],
        placement: &Placement,
    ) -> Vec<String> {
        if flag_value(user_args, self.tensor_parallel).is_some() {
            return Vec::new();
        }
        vec![
            self.tensor_parallel[0].to_owned(),
            placement.tensor_parallel_size.to_string(),
        ]
    }
}

fn parse_fraction(flag: &str, value: &str) -> Result<f64, ArgsError> {
    let error = |reason: &str| ArgsError::new(flag, value, reason);
    let fraction: f64 = value
        .trim()
        .parse::<f64>()
        .map_err(|e| error(&e.to_string()))?;
    if fraction > 0.0 && fraction <= 1.0 {
        Ok(fraction)
    } else {
        Err(error("must be in (0, 1]"))
    }
}

/// A token count, optionally with vLLM's suffixes: `k`/`m` for powers of 1000, `K`/`M` for
/// powers of 1024.
fn parse_token_count(flag: &str, value: &str) -> Result<u64, ArgsError> {
    let trimmed = value.trim();
    let (digits, scale) = match trimmed.chars().last() {
        Some('k') => (&trimmed[..trimmed.len() - 1], 1_000),
        Some('K') => (&trimmed[..trimmed.len() - 1], 1_024),
        Some('m') => (&trimmed[..trimmed.len() - 1], 1_000_000),
        Some('M') => (&trimmed[..trimmed.len() - 1], 1_048_576),
        _ => (trimmed, 1),
    };
    let error = |reason: &str| ArgsError::new(flag, value, reason);
    let count: u64 = digits.parse::<u64>().map_err(|e| error(&e.to_string()))?;
    match count.checked_mul(scale) {
        Some(0) => Err(error("must be at least 1")),
        Some(tokens) => Ok(tokens),
        None => Err(error("too large")),
    }
}

fn kv_dtype_bits(value: &str) -> Option<u32> {
    match value.trim().to_ascii_lowercase().as_str() {
        "auto" | "bfloat16" | "bf16" | "float16" | "fp16" | "half" => Some(16),
        "float32" | "float" | "fp32" => Some(32),
        v if v.starts_with("fp8") => Some(8),
        v if v.starts_with("fp4") => Some(4),
        _ => None,
    }
}
