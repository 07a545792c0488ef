//! llama.cpp's `llama-server`: `llama-server -m <file> --host <bind> --port <port>
//! [--alias <served name>] <args…>`, healthy when `/health` answers 200.
//!
//! The estimate reads `--ctx-size`/`-c`, `--batch-size`/`-b`, `--ubatch-size`/`-ub`,
//! `--n-gpu-layers`/`-ngl`/`--gpu-layers`, `--cache-type-k`/`-ctk`, `--cache-type-v`/`-ctv`
//! and `--parallel`/`-np` ([`estimate_options`]). A placement adds:
//!
//! * `--ctx-size N` when the arguments give none: the context the estimate assumed (the
//!   trained context capped at [`DEFAULT_CONTEXT_CAP`], see [`default_context_size`]), since
//!   llama.cpp's own default may be larger than what was claimed;
//! * `-ngl N` (`N` = layers on GPUs, `blocks + 1` for full offload, `0` for CPU only) unless
//!   the user fixed a count with `-ngl`/`--n-gpu-layers`/`--gpu-layers` (`auto`, `all` or a
//!   negative value are replaced, since the claim assumed the scheduler's choice);
//! * with several GPUs: `--tensor-split a,b,…` (layers per GPU, in the order of the
//!   placement's GPUs, i.e. of `CUDA_VISIBLE_DEVICES`) unless `--tensor-split`/`-ts` is
//!   given, and `--split-mode layer` unless `--split-mode`/`-sm` is given.

use gantry_sched::estimate::DEFAULT_CONTEXT_CAP;
use gantry_sched::{GgufModelFacts, LlamaCppOptions};
use gantry_types::{BackendKind, Placement};

use crate::args::{flag_value, parse_flag, ArgsError};
use crate::command::{serve_argv, BackendError, BackendSettings, LaunchSpec, LaunchTarget};
use crate::load::{self, LoadProbe};
use crate::Backend;

/// `--ctx-size` and its short form.
const CONTEXT_FLAGS: &[&str] = &["--ctx-size", "-c"];
/// The GPU-layer flag's spellings.
const GPU_LAYER_FLAGS: &[&str] = &["--n-gpu-layers", "--gpu-layers", "-ngl"];

/// The program, looked up on `PATH` unless the worker names another.
pub const PROGRAM: &str = "llama-server";

/// llama.cpp's `llama-server`.
#[derive(Debug, Clone, Copy)]
pub struct LlamaCpp;

impl Backend for LlamaCpp {
    fn kind(&self) -> BackendKind {
        BackendKind::LlamaCpp
    }

    fn default_program(&self) -> Vec<String> {
        vec![PROGRAM.to_owned()]
    }

    fn argv(
        &self,
        settings: &BackendSettings,
        spec: &LaunchSpec,
        target: &LaunchTarget<'_>,
    ) -> Result<Vec<String>, BackendError> {
        serve_argv(settings, spec, target, &["-m"], &["--alias", "-a"])
    }

    fn load_probe(&self) -> Option<LoadProbe> {
        Some(load::LLAMA_CPP)
    }

    fn placement_args(
        &self,
        user_args: &[String],
        placement: &Placement,
        context_size: Option<u32>,
    ) -> Vec<String> {
        let given = |names: &[&str]| flag_value(user_args, names).is_some();
        let mut extra = Vec::new();
        if let Some(context) = context_size {
            if !given(CONTEXT_FLAGS) {
                extra.extend(["--ctx-size".to_owned(), context.to_string()]);
            }
        }
        let Some(layout) = &placement.llama else {
            return extra;
        };
        // A count the user fixed was what the estimate assumed; anything else (absent,
        // `auto`, `all`, negative) was replaced by the scheduler's layout.
        let fixed_layers = matches!(gpu_layers(user_args), Ok(Some(_)));
        if !fixed_layers {
            extra.extend(["-ngl".to_owned(), layout.n_gpu_layers.to_string()]);
        }
        if layout.tensor_split.len() > 1 {
            if !given(&["--tensor-split", "-ts"]) {
                let split: Vec<String> = layout.tensor_split.iter().map(u32::to_string).collect();
                extra.extend(["--tensor-split".to_owned(), split.join(",")]);
            }
            if !given(&["--split-mode", "-sm"]) {
                extra.extend(["--split-mode".to_owned(), "layer".to_owned()]);
            }
        }
        extra
    }
}

/// Reads the options that change llama.cpp's memory use from `llama-server` arguments;
/// absent flags keep llama.cpp's defaults. Both `--flag value` and `--flag=value` are
/// understood.
pub fn estimate_options(args: &[String]) -> Result<LlamaCppOptions, ArgsError> {
    let defaults = LlamaCppOptions::default();
    let positive = |value: Option<u32>, flag: &str, default: u32| match value {
        Some(0) => Err(ArgsError::new(flag, "0", "must be at least 1")),
        Some(v) => Ok(v),
        None => Ok(default),
    };
    let present = |names: &[&str]| args.iter().any(|arg| names.contains(&arg.as_str()));
    // `--parallel N` opens N slots with a KV stream each, unless `--kv-unified`; absent or
    // negative is llama-server's "auto": 4 slots sharing one unified cache.
    let parallel: Option<i64> = parse_flag(args, &["--parallel", "-np"])?;
    let (parallel, kv_unified) = match parallel {
        None => (defaults.parallel, defaults.kv_unified),
        Some(n) if n < 0 => (defaults.parallel, defaults.kv_unified),
        Some(0) => return Err(ArgsError::new("--parallel", "0", "must be at least 1")),
        Some(n) => (
            u32::try_from(n)
                .map_err(|_| ArgsError::new("--parallel", &n.to_string(), "is too large"))?,
            present(&["--kv-unified", "-kvu"]),
        ),
    };
    Ok(LlamaCppOptions {
        ctx_size: parse_flag(args, CONTEXT_FLAGS)?,
        batch_size: positive(
            parse_flag(args, &["--batch-size", "-b"])?,
            "--batch-size",
            defaults.batch_size,
        )?,
        ubatch_size: positive(
            parse_flag(args, &["--ubatch-size", "-ub"])?,
            "--ubatch-size",
            defaults.ubatch_size,
        )?,
        gpu_layers: gpu_layers(args)?,
        cache_type_k: parse_flag(args, &["--cache-type-k", "-ctk"])?
            .unwrap_or(defaults.cache_type_k),
        cache_type_v: parse_flag(args, &["--cache-type-v", "-ctv"])?
            .unwrap_or(defaults.cache_type_v),
        parallel,
        kv_unified,
        flash_attention: parse_flag(args, &["--flash-attn", "-fa"])?
            .unwrap_or(defaults.flash_attention),
        embedding: present(&["--embedding", "--embeddings"]),
        swa_full: present(&["--swa-full"]),
    })
}

/// The context to start llama.cpp with when the arguments give none: the model's trained
/// context, capped at [`DEFAULT_CONTEXT_CAP`]. `None` when the arguments set one.
pub fn default_context_size(options: &LlamaCppOptions, facts: &GgufModelFacts) -> Option<u32> {
    options.ctx_size.is_none().then(|| {
        let trained = if facts.context_length == 0 {
            DEFAULT_CONTEXT_CAP
        } else {
            facts.context_length
        };
        trained.min(DEFAULT_CONTEXT_CAP)
    })
}

/// `-ngl` accepts a count, a negative number or the words `auto`/`all`; only a non-negative
/// count fixes the layout.
fn gpu_layers(args: &[String]) -> Result<Option<u32>, ArgsError> {
    let Some((flag, value)) = flag_value(args, GPU_LAYER_FLAGS) else {
        return Ok(None);
    };
    let trimmed = value.trim();
    if trimmed.eq_ignore_ascii_case("auto") || trimmed.eq_ignore_ascii_case("all") {
        return Ok(None);
    }
    match trimmed.parse::<i64>() {
        Ok(n) if n < 0 => Ok(None),
        Ok(n) => Ok(Some(u32::try_from(n).unwrap_or(u32::MAX))),
        Err(e) => Err(ArgsError::new(flag, value, e)),
    }
}

#[cfg(test)]
mod tests {
    use gantry_sched::KvCacheType;
    use gantry_types::fixtures::placement;
    use gantry_types::PlacementKind;

    use super::*;
    use crate::command::backend_command;
    use crate::command::tests::{args, argv, assert_served_name_unless_given, spec, target};

    #[test]
    fn command_line() {
        let mut spec = spec(BackendKind::LlamaCpp, "/models/tiny.gguf");
        spec.args = args(&["--ctx-size", "512"]);
        let command =
            backend_command(&spec, &BackendSettings::default(), &target(&[0, 1])).unwrap();
        assert_eq!(
            argv(&command),
            [
                "llama-server",
                "-m",
                "/models/tiny.gguf",
                "--host",
                "127.0.0.1",
                "--port",
                "40001",
                "--ctx-size",
                "512"
            ]
        );
        assert_eq!(command.health_path, "/health");
        assert_eq!(command.env[crate::CUDA_VISIBLE_DEVICES], "0,1");
    }

    #[test]
    fn the_served_name_is_the_alias_unless_the_arguments_give_one() {
        assert_served_name_unless_given(
            BackendKind::LlamaCpp,
            "/models/tiny.gguf",
            "tiny",
            "--alias",
            &[["-a", "mine"], ["--alias", "mine"]],
        );
    }

    #[test]
    fn a_single_gpu_gets_the_context_and_full_offload() {
        let extra = LlamaCpp.placement_args(
            &[],
            &placement(PlacementKind::SingleGpu, &[0], Some(&[5])),
            Some(4096),
        );
        assert_eq!(extra, args(&["--ctx-size", "4096", "-ngl", "5"]));
    }

    #[test]
    fn a_split_gets_tensor_split_and_split_mode_unless_given() {
        let split = placement(PlacementKind::MultiGpu, &[1, 3], Some(&[2, 3]));
        let extra = LlamaCpp.placement_args(&args(&["-c", "2048"]), &split, None);
        assert_eq!(
            extra,
            args(&[
                "-ngl",
                "5",
                "--tensor-split",
                "2,3",
                "--split-mode",
                "layer"
            ])
        );
        let extra =
            LlamaCpp.placement_args(&args(&["-ts", "1,1", "-sm=row", "-ngl", "4"]), &split, None);
        assert!(extra.is_empty(), "the user's own choices stay: {extra:?}");
    }

    #[test]
    fn partial_offload_and_cpu_only_set_gpu_layers() {
        let partial = placement(PlacementKind::PartialOffload, &[0], Some(&[3]));
        let extra = LlamaCpp.placement_args(&args(&["-ngl", "auto"]), &partial, None);
        assert_eq!(extra, args(&["-ngl", "3"]), "auto is replaced by the plan");
        let cpu = placement(PlacementKind::CpuOnly, &[], Some(&[]));
        assert_eq!(
            LlamaCpp.placement_args(&[], &cpu, None),
            args(&["-ngl", "0"])
        );
    }

    #[test]
    fn arguments_set_context_cache_types_layers_and_slots() {
        let options = estimate_options(&args(&[
            "-c",
            "4096",
            "-ctk",
            "q8_0",
            "--cache-type-v=q8_0",
            "-ngl",
            "20",
            "-np",
            "4",
        ]))
        .expect("valid args");
        assert_eq!(options.ctx_size, Some(4096));
        assert_eq!(options.cache_type_k, KvCacheType::Q8_0);
        assert_eq!(options.cache_type_v, KvCacheType::Q8_0);
        assert_eq!(options.gpu_layers, Some(20));
        assert_eq!(options.parallel, 4);
        assert_eq!(
            estimate_options(&[]).expect("no args"),
            LlamaCppOptions::default()
        );
    }

    #[test]
    fn gpu_layers_words_and_negative_values_leave_the_choice_open() {
        for value in ["-1", "auto", "all", "ALL"] {
            let options = estimate_options(&args(&["-ngl", value])).expect("valid");
            assert_eq!(options.gpu_layers, None, "-ngl {value}");
        }
        let options = estimate_options(&args(&["--n-gpu-layers=0"])).expect("valid");
        assert_eq!(options.gpu_layers, Some(0));
        let options = estimate_options(&args(&["--gpu-layers", "999"])).expect("valid");
        assert_eq!(options.gpu_layers, Some(999));
    }

    #[test]
    fn bad_arguments_name_the_flag() {
        let e = estimate_options(&args(&["-ctk", "q3_k"])).expect_err("bad type");
        assert_eq!(e.flag, "-ctk");
        let e = estimate_options(&args(&["-ngl", "many"])).expect_err("bad count");
        assert_eq!(e.flag, "-ngl");
        let e = estimate_options(&args(&["-np", "0"])).expect_err("zero slots");
        assert_eq!(e.flag, "--parallel");
    }
}
