//! vLLM: `vllm serve <path> --host <bind> --port <port> [--served-model-name <name>]
//! <args…>`, healthy when `/health` answers 200.
//!
//! The estimate reads `--gpu-memory-utilization`, `--max-model-len`, `--kv-cache-dtype`,
//! `--tensor-parallel-size`/`-tp` and `--data-parallel-size`/`-dp` ([`estimate_options`]). A
//! placement adds `--tensor-parallel-size N` unless the arguments give it.

use gantry_sched::{EngineOptions, ServingEngine};
use gantry_types::BackendKind;

use crate::args::ArgsError;
use crate::engine::{Engine, EngineFlags};
use crate::load;

/// The program, looked up on `PATH` unless the worker names another.
pub const PROGRAM: &str = "vllm";

/// vLLM's OpenAI-compatible server.
pub const VLLM: Engine = Engine {
    kind: BackendKind::Vllm,
    program: || vec![PROGRAM.to_owned()],
    model_flag: &["serve"],
    name_flags: &["--served-model-name"],
    flags: EngineFlags {
        engine: ServingEngine::Vllm,
        memory_fraction: &["--gpu-memory-utilization"],
        max_model_len: &["--max-model-len"],
        tensor_parallel: &["--tensor-parallel-size", "-tp"],
        data_parallel: &["--data-parallel-size", "-dp"],
    },
    load: load::VLLM,
};

/// Reads the options that change vLLM's memory use from its arguments.
pub fn estimate_options(args: &[String]) -> Result<EngineOptions, ArgsError> {
    VLLM.estimate_options(args)
}

#[cfg(test)]
mod tests {
    use gantry_types::fixtures::placement;
    use gantry_types::PlacementKind;

    use super::*;
    use crate::command::backend_command;
    use crate::command::tests::{args, argv, assert_served_name_unless_given, spec, target};
    use crate::{Backend, BackendSettings};

    #[test]
    fn command_line_leaves_tensor_parallelism_to_the_args() {
        let mut spec = spec(BackendKind::Vllm, "/models/qwen");
        spec.args = args(&["--tensor-parallel-size", "2"]);
        spec.env.insert("HF_HOME".into(), "/cache".into());
        let command =
            backend_command(&spec, &BackendSettings::default(), &target(&[2, 3])).unwrap();
        assert_eq!(
            argv(&command),
            [
                "vllm",
                "serve",
                "/models/qwen",
                "--host",
                "127.0.0.1",
                "--port",
                "40001",
                "--tensor-parallel-size",
                "2"
            ]
        );
        assert_eq!(command.health_path, "/health");
        assert_eq!(command.env["HF_HOME"], "/cache");
    }

    #[test]
    fn the_served_name_is_passed_unless_the_arguments_give_one() {
        assert_served_name_unless_given(
            BackendKind::Vllm,
            "/models/qwen",
            "qwen",
            "--served-model-name",
            &[["--served-model-name", "mine"]],
        );
    }

    #[test]
    fn a_placement_adds_its_tensor_parallel_size_unless_given() {
        let two = placement(PlacementKind::MultiGpu, &[0, 1], None);
        assert_eq!(
            VLLM.placement_args(&[], &two, None),
            args(&["--tensor-parallel-size", "2"])
        );
        assert!(VLLM
            .placement_args(&args(&["-tp", "2"]), &two, None)
            .is_empty());
    }

    #[test]
    fn arguments_set_fraction_length_dtype_and_parallelism() {
        let options = estimate_options(&args(&[
            "--gpu-memory-utilization=0.8",
            "--max-model-len",
            "8k",
            "--kv-cache-dtype",
            "fp8",
            "-tp",
            "2",
            "--data-parallel-size=2",
        ]))
        .expect("valid args");
        assert_eq!(options.engine, ServingEngine::Vllm);
        assert_eq!(options.memory_fraction, Some(0.8));
        assert_eq!(options.max_model_len, Some(8000));
        assert_eq!(options.kv_cache_element_bits, 8);
        assert_eq!(options.tensor_parallel_size, Some(2));
        assert_eq!(options.data_parallel_size, Some(2));
        assert_eq!(
            estimate_options(&[]).expect("no args"),
            EngineOptions::defaults(ServingEngine::Vllm)
        );
    }

    #[test]
    fn invalid_arguments_are_rejected_naming_the_flag() {
        let vllm = |list: &[&str]| estimate_options(&args(list));
        assert!(vllm(&["--gpu-memory-utilization", "1.5"]).is_err());
        assert!(vllm(&["--gpu-memory-utilization", "0"]).is_err());
        assert!(vllm(&["--max-model-len", "lots"]).is_err());
        assert!(vllm(&["--kv-cache-dtype", "int3"]).is_err());
        let e = vllm(&["-tp", "0"]).expect_err("zero");
        assert_eq!(e.flag, "--tensor-parallel-size");
    }
}
