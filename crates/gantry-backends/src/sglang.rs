//! SGLang: `python3 -m sglang.launch_server --model-path <path> --host <bind> --port <port>
//! [--served-model-name <name>] <args…>`, healthy when `/health` answers 200.
//!
//! The estimate reads `--mem-fraction-static`, `--context-length`, `--kv-cache-dtype`,
//! `--tp-size`/`--tensor-parallel-size`/`--tp` and `--dp-size`/`--data-parallel-size`/`--dp`
//! ([`estimate_options`]); `--tp`/`--dp` are argparse abbreviations of the short forms that
//! SGLang's documentation uses. A placement adds `--tp-size N` unless the arguments give a
//! tensor-parallel size.

use gantry_sched::{EngineOptions, ServingEngine};
use gantry_types::BackendKind;

use crate::args::ArgsError;
use crate::engine::{Engine, EngineFlags};
use crate::load;

/// The Python that runs SGLang, looked up on `PATH` unless the worker names another.
pub const PYTHON: &str = "python3";

/// The command prefix that runs SGLang's server with `python`.
pub fn program_with(python: &str) -> Vec<String> {
    [python, "-m", "sglang.launch_server"]
        .map(str::to_owned)
        .to_vec()
}

/// SGLang's server, run as a Python module.
pub const SGLANG: Engine = Engine {
    kind: BackendKind::Sglang,
    program: || program_with(PYTHON),
    model_flag: &["--model-path"],
    name_flags: &["--served-model-name"],
    flags: EngineFlags {
        engine: ServingEngine::Sglang,
        memory_fraction: &["--mem-fraction-static"],
        max_model_len: &["--context-length"],
        tensor_parallel: &["--tp-size", "--tensor-parallel-size", "--tp"],
        data_parallel: &["--dp-size", "--data-parallel-size", "--dp"],
    },
    load: load::SGLANG,
};

/// Reads the options that change SGLang's memory use from its arguments.
pub fn estimate_options(args: &[String]) -> Result<EngineOptions, ArgsError> {
    SGLANG.estimate_options(args)
}

#[cfg(test)]
mod tests {
    use gantry_types::fixtures::placement;
    use gantry_types::PlacementKind;

    use super::*;
    use crate::command::backend_command;
    use crate::command::tests::{args, argv, spec, target};
    use crate::{Backend, BackendSettings};

    #[test]
    fn command_line() {
        let spec = spec(BackendKind::Sglang, "/models/qwen");
        let command = backend_command(&spec, &BackendSettings::default(), &target(&[1])).unwrap();
        assert_eq!(
            argv(&command),
            [
                "python3",
                "-m",
                "sglang.launch_server",
                "--model-path",
                "/models/qwen",
                "--host",
                "127.0.0.1",
                "--port",
                "40001"
            ]
        );
        assert_eq!(command.health_path, "/health");
    }

    #[test]
    fn a_placement_adds_tp_size_unless_any_spelling_is_given() {
        let two = placement(PlacementKind::MultiGpu, &[0, 1], None);
        assert_eq!(
            SGLANG.placement_args(&[], &two, None),
            args(&["--tp-size", "2"])
        );
        for given in ["--tp", "--tp-size", "--tensor-parallel-size"] {
            assert!(SGLANG
                .placement_args(&args(&[given, "2"]), &two, None)
                .is_empty());
        }
    }

    #[test]
    fn its_own_flags_are_read_and_vllms_are_not() {
        let options =
            estimate_options(&args(&["--context-length", "4096", "--tp", "4"])).expect("valid");
        assert_eq!(options.engine, ServingEngine::Sglang);
        assert_eq!(options.max_model_len, Some(4096));
        assert_eq!(options.tensor_parallel_size, Some(4));
        let options = estimate_options(&args(&["--mem-fraction-static", "0.7"])).expect("valid");
        assert_eq!(options.memory_fraction, Some(0.7));
        let options = estimate_options(&args(&["--gpu-memory-utilization", "0.5"])).expect("valid");
        assert_eq!(options.memory_fraction, None);
        let options = estimate_options(&args(&[
            "--tensor-parallel-size",
            "2",
            "--data-parallel-size=3",
        ]))
        .expect("valid");
        assert_eq!(options.tensor_parallel_size, Some(2));
        assert_eq!(options.data_parallel_size, Some(3));
    }
}
