//! Backend specs: turn an instance, its port(s) and its GPUs into the command line,
//! environment and health path of each backend process. Pure functions, no IO.
//!
//! | backend | command | health |
//! |---|---|---|
//! | llama.cpp | `llama-server -m <file> --host <bind> --port <port> <args…>` | `/health` |
//! | vLLM | `vllm serve <path> --host <bind> --port <port> <args…>` | `/health` |
//! | SGLang | `python3 -m sglang.launch_server --model-path <path> --host <bind> --port <port> <args…>` | `/health` |
//! | custom | the command template with placeholders filled in, then `<args…>` | configurable, `/health` |
//!
//! GPU placement is passed only through `CUDA_VISIBLE_DEVICES`: the comma-joined GPU indexes
//! of the process, and **the empty string for CPU-only placement**. An unset variable would
//! let a backend on a GPU host pick up every GPU by itself and use memory the scheduler gave
//! to another instance; the empty string hides them all. Tensor parallelism
//! (`--tensor-parallel-size`, `--n-gpu-layers`, …) is left to the user's backend args. The
//! placement wins over a `CUDA_VISIBLE_DEVICES` in the instance's extra env.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;

use gantry_types::BackendKind;

use crate::supervisor::InstanceSpec;

/// The environment variable that carries GPU placement.
pub const CUDA_VISIBLE_DEVICES: &str = "CUDA_VISIBLE_DEVICES";

/// The health path of llama.cpp, vLLM and SGLang, and the default for custom commands.
pub const DEFAULT_HEALTH_PATH: &str = "/health";

/// The placeholders a custom command template may use.
pub const CUSTOM_PLACEHOLDERS: [&str; 4] = ["model_path", "port", "gpu_ids", "host"];

/// How each backend is launched on this worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendSettings {
    /// The command prefix of each built-in backend: the program and any leading
    /// arguments. Defaults look the program up on `PATH`.
    pub executables: BackendExecutables,
    /// The command template of the `custom` backend (see [`custom_command`]); an instance
    /// may bring its own in [`crate::supervisor::InstanceOverrides::custom_command`].
    pub custom_command: Option<String>,
    /// The health path of the `custom` backend unless the instance overrides it.
    pub custom_health_path: String,
}

impl Default for BackendSettings {
    fn default() -> Self {
        Self {
            executables: BackendExecutables::default(),
            custom_command: None,
            custom_health_path: DEFAULT_HEALTH_PATH.to_owned(),
        }
    }
}

/// The llama.cpp server program, looked up on `PATH` unless configured.
pub const DEFAULT_LLAMA_SERVER: &str = "llama-server";
/// The vLLM program, looked up on `PATH` unless configured.
pub const DEFAULT_VLLM: &str = "vllm";
/// The Python that runs SGLang, looked up on `PATH` unless configured.
pub const DEFAULT_SGLANG_PYTHON: &str = "python3";

/// Command prefixes for the built-in backends. Each is a program (a path, or a name looked
/// up on `PATH`) followed by any arguments that must come before gantry's own, for
/// instance `["/opt/vllm/bin/python", "-m", "vllm.entrypoints.cli.main"]` for vLLM, to which
/// gantry appends `serve <path> …`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendExecutables {
    /// Default `["llama-server"]`.
    pub llama_cpp: Vec<String>,
    /// Default `["vllm"]`; gantry appends `serve <path>`.
    pub vllm: Vec<String>,
    /// Default `["python3", "-m", "sglang.launch_server"]`.
    pub sglang: Vec<String>,
}

impl Default for BackendExecutables {
    fn default() -> Self {
        Self {
            llama_cpp: vec![DEFAULT_LLAMA_SERVER.to_owned()],
            vllm: vec![DEFAULT_VLLM.to_owned()],
            sglang: Self::sglang_with(DEFAULT_SGLANG_PYTHON),
        }
    }
}

impl BackendExecutables {
    /// The command prefix that runs SGLang's server with `python`.
    pub fn sglang_with(python: &str) -> Vec<String> {
        [python, "-m", "sglang.launch_server"]
            .map(str::to_owned)
            .to_vec()
    }
}

/// Where one backend process listens and which GPUs it sees.
#[derive(Debug, Clone, Copy)]
pub struct LaunchTarget<'a> {
    pub bind_host: IpAddr,
    pub port: u16,
    /// GPU indexes of this process; empty for CPU.
    pub gpu_indexes: &'a [u32],
}

/// One backend process, ready to spawn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendCommand {
    pub program: String,
    pub args: Vec<String>,
    /// Added to (and overriding) the worker's own environment.
    pub env: BTreeMap<String, String>,
    /// Polled with `GET http://<bind>:<port><health_path>` until it answers 200.
    pub health_path: String,
}

impl BackendCommand {
    /// The command line as one string, quoted for a shell, for log lines and error messages.
    pub fn display(&self) -> String {
        std::iter::once(&self.program)
            .chain(&self.args)
            .map(|word| quote_word(word))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

fn quote_word(word: &str) -> String {
    shlex::try_quote(word)
        .map(|quoted| quoted.into_owned())
        .unwrap_or_else(|_| format!("{word:?}"))
}

/// Why a backend command cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    #[error("no command prefix is configured for the {backend} backend")]
    EmptyExecutable { backend: &'static str },
    #[error(
        "the custom backend needs a command template (instance override or the worker's \
         custom command), and none is set"
    )]
    MissingCustomCommand,
    #[error("the custom command template cannot be split into words (unbalanced quotes or a trailing backslash): {template}")]
    UnparsableTemplate { template: String },
    #[error("the custom command template is empty")]
    EmptyTemplate,
    #[error("the custom command template uses the unknown placeholder {{{name}}}; known: {{model_path}} {{port}} {{gpu_ids}} {{host}}")]
    UnknownPlaceholder { name: String },
    #[error("the model path is not valid UTF-8: {path}")]
    NonUtf8ModelPath { path: String },
    #[error("data_parallel_size must be at least 1")]
    ZeroDataParallelSize,
    #[error(
        "data_parallel_size {size} does not divide the {gpus} assigned GPU(s); \
         each data-parallel rank needs the same number of GPUs"
    )]
    DataParallelGpuMismatch { size: u32, gpus: usize },
    #[error("health path must start with '/': {path}")]
    BadHealthPath { path: String },
}

/// The GPU indexes of each process of the instance: one entry for an ordinary instance, N
/// for `data_parallel_size: N`. The assigned GPUs are split into N equal consecutive chunks
/// (one GPU per rank in the common case); a CPU-only instance gives every rank no GPU.
pub fn rank_gpu_indexes(spec: &InstanceSpec) -> Result<Vec<Vec<u32>>, BackendError> {
    let size = spec.data_parallel_size.unwrap_or(1);
    if size == 0 {
        return Err(BackendError::ZeroDataParallelSize);
    }
    let ranks = size as usize;
    if spec.gpu_indexes.is_empty() {
        return Ok(vec![Vec::new(); ranks]);
    }
    let per_rank = spec.gpu_indexes.len() / ranks;
    if per_rank == 0 || per_rank * ranks != spec.gpu_indexes.len() {
        return Err(BackendError::DataParallelGpuMismatch {
            size,
            gpus: spec.gpu_indexes.len(),
        });
    }
    Ok(spec
        .gpu_indexes
        .chunks(per_rank)
        .map(<[u32]>::to_vec)
        .collect())
}

/// Builds the command of one backend process of `spec`.
pub fn backend_command(
    spec: &InstanceSpec,
    settings: &BackendSettings,
    target: &LaunchTarget<'_>,
) -> Result<BackendCommand, BackendError> {
    let model_path = path_str(&spec.model_path)?;
    let host = target.bind_host.to_string();
    let port = target.port.to_string();
    let (mut argv, default_health) = match spec.backend {
        BackendKind::LlamaCpp => {
            let mut argv = prefix(&settings.executables.llama_cpp, "llama.cpp")?;
            argv.extend(["-m".to_owned(), model_path.to_owned()]);
            argv.extend(["--host".to_owned(), host, "--port".to_owned(), port]);
            (argv, DEFAULT_HEALTH_PATH.to_owned())
        }
        BackendKind::Vllm => {
            let mut argv = prefix(&settings.executables.vllm, "vllm")?;
            argv.extend(["serve".to_owned(), model_path.to_owned()]);
            argv.extend(["--host".to_owned(), host, "--port".to_owned(), port]);
            (argv, DEFAULT_HEALTH_PATH.to_owned())
        }
        BackendKind::Sglang => {
            let mut argv = prefix(&settings.executables.sglang, "sglang")?;
            argv.extend(["--model-path".to_owned(), model_path.to_owned()]);
            argv.extend(["--host".to_owned(), host, "--port".to_owned(), port]);
            (argv, DEFAULT_HEALTH_PATH.to_owned())
        }
        BackendKind::Custom => {
            let template = spec
                .overrides
                .custom_command
                .as_deref()
                .or(settings.custom_command.as_deref())
                .ok_or(BackendError::MissingCustomCommand)?;
            let values = PlaceholderValues {
                model_path,
                port: &port,
                gpu_ids: &join_gpu_indexes(target.gpu_indexes),
                host: &host,
            };
            (
                custom_command(template, &values)?,
                settings.custom_health_path.clone(),
            )
        }
    };
    argv.extend(spec.backend_args.iter().cloned());
    let health_path = spec.overrides.health_path.clone().unwrap_or(default_health);
    if !health_path.starts_with('/') {
        return Err(BackendError::BadHealthPath { path: health_path });
    }
    let mut env = spec.env.clone();
    env.insert(
        CUDA_VISIBLE_DEVICES.to_owned(),
        join_gpu_indexes(target.gpu_indexes),
    );
    let program = argv.remove(0);
    Ok(BackendCommand {
        program,
        args: argv,
        env,
        health_path,
    })
}

/// The values substituted into a custom command template.
#[derive(Debug, Clone, Copy)]
pub struct PlaceholderValues<'a> {
    pub model_path: &'a str,
    pub port: &'a str,
    /// Comma-joined GPU indexes, empty for CPU.
    pub gpu_ids: &'a str,
    pub host: &'a str,
}

/// Splits `template` into words with POSIX shell quoting rules (no shell runs: no
/// variables, globs, pipes or redirections) and then replaces `{model_path}`, `{port}`,
/// `{gpu_ids}` and `{host}` inside each word. Substituting after splitting keeps a value
/// with spaces or quotes in one word. Any other `{identifier}` is an error, so a typo does
/// not reach the backend; braces that do not enclose an identifier (JSON, say) are kept.
pub fn custom_command(
    template: &str,
    values: &PlaceholderValues<'_>,
) -> Result<Vec<String>, BackendError> {
    let words = shlex::split(template).ok_or_else(|| BackendError::UnparsableTemplate {
        template: template.to_owned(),
    })?;
    if words.is_empty() {
        return Err(BackendError::EmptyTemplate);
    }
    words
        .iter()
        .map(|word| substitute_placeholders(word, values))
        .collect()
}

fn substitute_placeholders(
    word: &str,
    values: &PlaceholderValues<'_>,
) -> Result<String, BackendError> {
    let mut out = String::with_capacity(word.len());
    let mut rest = word;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let name_len = after
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(after.len());
        let name = &after[..name_len];
        let closes = after[name_len..].starts_with('}');
        if closes && !name.is_empty() {
            let value = match name {
                "model_path" => values.model_path,
                "port" => values.port,
                "gpu_ids" => values.gpu_ids,
                "host" => values.host,
                _ => {
                    return Err(BackendError::UnknownPlaceholder {
                        name: name.to_owned(),
                    })
                }
            };
            out.push_str(value);
            rest = &after[name_len + 1..];
        } else {
            out.push('{');
            rest = after;
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// `[0, 1]` → `"0,1"`; `[]` → `""`.
pub fn join_gpu_indexes(indexes: &[u32]) -> String {
    indexes
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

fn prefix(executable: &[String], backend: &'static str) -> Result<Vec<String>, BackendError> {
    match executable.first() {
        Some(program) if !program.is_empty() => Ok(executable.to_vec()),
        _ => Err(BackendError::EmptyExecutable { backend }),
    }
}

fn path_str(path: &Path) -> Result<&str, BackendError> {
    path.to_str().ok_or_else(|| BackendError::NonUtf8ModelPath {
        path: path.to_string_lossy().into_owned(),
    })
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;
    use std::path::PathBuf;

    use super::*;
    use crate::supervisor::InstanceOverrides;

    fn spec(backend: BackendKind, model_path: &str) -> InstanceSpec {
        InstanceSpec {
            instance_id: 7,
            key: "tiny#0".to_owned(),
            backend,
            model_path: PathBuf::from(model_path),
            backend_args: Vec::new(),
            env: BTreeMap::new(),
            gpu_indexes: Vec::new(),
            data_parallel_size: None,
            overrides: InstanceOverrides::default(),
        }
    }

    fn target(gpus: &[u32]) -> LaunchTarget<'_> {
        LaunchTarget {
            bind_host: IpAddr::V4(Ipv4Addr::LOCALHOST),
            port: 40001,
            gpu_indexes: gpus,
        }
    }

    fn argv(command: &BackendCommand) -> Vec<&str> {
        std::iter::once(command.program.as_str())
            .chain(command.args.iter().map(String::as_str))
            .collect()
    }

    #[test]
    fn llama_cpp_command_line() {
        let mut spec = spec(BackendKind::LlamaCpp, "/models/tiny.gguf");
        spec.backend_args = vec!["--ctx-size".into(), "512".into()];
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
        assert_eq!(command.env[CUDA_VISIBLE_DEVICES], "0,1");
    }

    #[test]
    fn vllm_command_line_leaves_tensor_parallelism_to_the_args() {
        let mut spec = spec(BackendKind::Vllm, "/models/qwen");
        spec.backend_args = vec!["--tensor-parallel-size".into(), "2".into()];
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
        assert_eq!(command.env[CUDA_VISIBLE_DEVICES], "2,3");
    }

    #[test]
    fn sglang_command_line() {
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
    fn executable_overrides_replace_the_prefix() {
        let spec = spec(BackendKind::Vllm, "/m");
        let settings = BackendSettings {
            executables: BackendExecutables {
                vllm: vec!["/opt/vllm/bin/vllm".into()],
                ..BackendExecutables::default()
            },
            ..BackendSettings::default()
        };
        let command = backend_command(&spec, &settings, &target(&[])).unwrap();
        assert_eq!(command.program, "/opt/vllm/bin/vllm");
        assert_eq!(command.args[0], "serve");
        let empty = BackendSettings {
            executables: BackendExecutables {
                vllm: Vec::new(),
                ..BackendExecutables::default()
            },
            ..BackendSettings::default()
        };
        assert_eq!(
            backend_command(&spec, &empty, &target(&[])).unwrap_err(),
            BackendError::EmptyExecutable { backend: "vllm" }
        );
    }

    #[test]
    fn cpu_only_placement_hides_every_gpu_even_from_user_env() {
        let mut spec = spec(BackendKind::LlamaCpp, "/m.gguf");
        spec.env.insert(CUDA_VISIBLE_DEVICES.into(), "0".into());
        let command = backend_command(&spec, &BackendSettings::default(), &target(&[])).unwrap();
        assert_eq!(command.env[CUDA_VISIBLE_DEVICES], "");
    }

    #[test]
    fn custom_template_is_split_without_a_shell_and_filled_in() {
        let mut spec = spec(BackendKind::Custom, "/models/my model.bin");
        spec.backend_args = vec!["--extra".into()];
        let settings = BackendSettings {
            custom_command: Some(
                r#"/usr/bin/env python3 "/srv/my server.py" --model={model_path} --listen '{host}:{port}' --gpus {gpu_ids} --json '{"a": 1}' $HOME"#
                    .into(),
            ),
            ..BackendSettings::default()
        };
        let command = backend_command(&spec, &settings, &target(&[0, 2])).unwrap();
        assert_eq!(
            argv(&command),
            [
                "/usr/bin/env",
                "python3",
                "/srv/my server.py",
                "--model=/models/my model.bin",
                "--listen",
                "127.0.0.1:40001",
                "--gpus",
                "0,2",
                "--json",
                r#"{"a": 1}"#,
                "$HOME",
                "--extra"
            ]
        );
        assert_eq!(command.health_path, "/health");
    }

    #[test]
    fn instance_overrides_win_for_custom_command_and_health_path() {
        let mut spec = spec(BackendKind::Custom, "/m");
        spec.overrides.custom_command = Some("serve --port {port}".into());
        spec.overrides.health_path = Some("/ready".into());
        let settings = BackendSettings {
            custom_command: Some("other".into()),
            custom_health_path: "/healthz".into(),
            ..BackendSettings::default()
        };
        let command = backend_command(&spec, &settings, &target(&[])).unwrap();
        assert_eq!(argv(&command), ["serve", "--port", "40001"]);
        assert_eq!(command.health_path, "/ready");
        spec.overrides.health_path = None;
        let command = backend_command(&spec, &settings, &target(&[])).unwrap();
        assert_eq!(command.health_path, "/healthz");
        spec.overrides.health_path = Some("ready".into());
        assert!(matches!(
            backend_command(&spec, &settings, &target(&[])),
            Err(BackendError::BadHealthPath { .. })
        ));
    }

    #[test]
    fn custom_template_errors_name_the_problem() {
        let spec = spec(BackendKind::Custom, "/m");
        let with = |template: &str| BackendSettings {
            custom_command: Some(template.into()),
            ..BackendSettings::default()
        };
        assert_eq!(
            backend_command(&spec, &BackendSettings::default(), &target(&[])).unwrap_err(),
            BackendError::MissingCustomCommand
        );
        assert!(matches!(
            backend_command(&spec, &with("serve 'unbalanced"), &target(&[])),
            Err(BackendError::UnparsableTemplate { .. })
        ));
        assert_eq!(
            backend_command(&spec, &with("  "), &target(&[])).unwrap_err(),
            BackendError::EmptyTemplate
        );
        assert_eq!(
            backend_command(&spec, &with("serve {model}"), &target(&[])).unwrap_err(),
            BackendError::UnknownPlaceholder {
                name: "model".into()
            }
        );
    }

    #[test]
    fn data_parallel_ranks_split_the_gpus() {
        let mut spec = spec(BackendKind::Vllm, "/m");
        assert_eq!(rank_gpu_indexes(&spec).unwrap(), vec![Vec::<u32>::new()]);
        spec.data_parallel_size = Some(2);
        assert_eq!(
            rank_gpu_indexes(&spec).unwrap(),
            vec![Vec::<u32>::new(), Vec::new()]
        );
        spec.gpu_indexes = vec![4, 5];
        assert_eq!(rank_gpu_indexes(&spec).unwrap(), vec![vec![4], vec![5]]);
        spec.gpu_indexes = vec![0, 1, 2, 3];
        assert_eq!(
            rank_gpu_indexes(&spec).unwrap(),
            vec![vec![0, 1], vec![2, 3]]
        );
        spec.gpu_indexes = vec![0, 1, 2];
        assert_eq!(
            rank_gpu_indexes(&spec).unwrap_err(),
            BackendError::DataParallelGpuMismatch { size: 2, gpus: 3 }
        );
        spec.data_parallel_size = Some(0);
        assert_eq!(
            rank_gpu_indexes(&spec).unwrap_err(),
            BackendError::ZeroDataParallelSize
        );
    }

    #[test]
    fn display_quotes_words_for_a_shell() {
        let command = BackendCommand {
            program: "llama-server".into(),
            args: vec!["-m".into(), "/a b/c.gguf".into()],
            env: BTreeMap::new(),
            health_path: "/health".into(),
        };
        assert_eq!(command.display(), "llama-server -m '/a b/c.gguf'");
    }
}
