//! From a [`LaunchSpec`] to the [`BackendCommand`] of each backend process: the program and
//! arguments, the environment and the health path.
//!
//! GPU placement reaches the process only through `CUDA_VISIBLE_DEVICES`: the comma-joined
//! GPU indexes of the process, and **the empty string for CPU-only placement**. An unset
//! variable would let a backend on a GPU host pick up every GPU by itself and use memory the
//! scheduler gave to another instance; the empty string hides them all. The placement wins
//! over a `CUDA_VISIBLE_DEVICES` in the model's environment.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use gantry_types::BackendKind;

use crate::{backend, DEFAULT_HEALTH_PATH};

/// The environment variable that carries GPU placement.
pub const CUDA_VISIBLE_DEVICES: &str = "CUDA_VISIBLE_DEVICES";

/// What to run for one instance, however many processes it takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchSpec {
    pub backend: BackendKind,
    /// The model on local disk: the GGUF file for llama.cpp, a file or directory for the
    /// others.
    pub model_path: PathBuf,
    /// Appended to the command line as given (no shell): the model's arguments, then the
    /// flags its placement adds.
    pub args: Vec<String>,
    /// Extra environment, on top of the worker's own. `CUDA_VISIBLE_DEVICES` is always set
    /// from `gpu_indexes` and wins over this.
    pub env: BTreeMap<String, String>,
    /// The GPUs the instance is placed on; empty for CPU-only.
    pub gpu_indexes: Vec<u32>,
    /// vLLM-style data parallelism: N processes on N consecutive ports, the GPUs split
    /// evenly between them. `None` or `Some(1)`: one process.
    pub data_parallel_size: Option<u32>,
    /// The command template of a `custom` backend (see [`crate::custom::fill_template`]);
    /// the worker's own template when `None`.
    pub custom_command: Option<String>,
    /// The health path to poll, starting with `/`; the backend's default when `None`.
    pub health_path: Option<String>,
    /// The name clients ask for: llama.cpp, vLLM and SGLang are told it (`--alias`,
    /// `--served-model-name`) unless the arguments name one, so their answers carry it
    /// instead of the model's file path (and vLLM accepts requests that name it).
    pub served_name: Option<String>,
}

impl LaunchSpec {
    /// `backend` serving `model_path`, and nothing else: no arguments, environment, GPUs
    /// or served name, the backend's own command template and health path.
    pub fn new(backend: BackendKind, model_path: impl Into<PathBuf>) -> Self {
        Self {
            backend,
            model_path: model_path.into(),
            args: Vec::new(),
            env: BTreeMap::new(),
            gpu_indexes: Vec::new(),
            data_parallel_size: None,
            custom_command: None,
            health_path: None,
            served_name: None,
        }
    }
}

/// How backends are launched on one worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendSettings {
    /// Command prefixes configured for this worker: the program and any leading arguments.
    /// A backend not listed uses its [`crate::Backend::default_program`].
    pub executables: HashMap<BackendKind, Vec<String>>,
    /// The command template of the `custom` backend when the model brings none.
    pub custom_command: Option<String>,
    /// The health path of the `custom` backend unless the model names another.
    pub custom_health_path: String,
}

impl Default for BackendSettings {
    fn default() -> Self {
        Self {
            executables: HashMap::new(),
            custom_command: None,
            custom_health_path: DEFAULT_HEALTH_PATH.to_owned(),
        }
    }
}

impl BackendSettings {
    /// The command prefix of `kind` on this worker.
    pub fn program(&self, kind: BackendKind) -> Vec<String> {
        self.executables
            .get(&kind)
            .cloned()
            .unwrap_or_else(|| backend(kind).default_program())
    }

    /// The prefix of `kind`, which must name a program.
    pub(crate) fn prefix(&self, kind: BackendKind) -> Result<Vec<String>, BackendError> {
        let program = self.program(kind);
        match program.first() {
            Some(first) if !first.is_empty() => Ok(program),
            _ => Err(BackendError::EmptyExecutable {
                backend: kind.as_str(),
            }),
        }
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
        "the custom backend needs a command template (the model's custom_command or the \
         worker's custom command), and none is set"
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
pub fn rank_gpu_indexes(spec: &LaunchSpec) -> Result<Vec<Vec<u32>>, BackendError> {
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
    spec: &LaunchSpec,
    settings: &BackendSettings,
    target: &LaunchTarget<'_>,
) -> Result<BackendCommand, BackendError> {
    let backend = backend(spec.backend);
    let mut argv = backend.argv(settings, spec, target)?;
    argv.extend(spec.args.iter().cloned());
    let health_path = spec
        .health_path
        .clone()
        .unwrap_or_else(|| backend.health_path(settings).to_owned());
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

/// `[0, 1]` → `"0,1"`; `[]` → `""`.
pub fn join_gpu_indexes(indexes: &[u32]) -> String {
    indexes
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// The model path as text, for a command line.
pub(crate) fn path_str(path: &Path) -> Result<&str, BackendError> {
    path.to_str().ok_or_else(|| BackendError::NonUtf8ModelPath {
        path: path.to_string_lossy().into_owned(),
    })
}

/// `<prefix> <model flag…> <path> --host <host> --port <port>`: the shape every built-in
/// backend's command line takes.
/// `<prefix> <model flag> <path> --host <bind> --port <port>`, then the served name after
/// the first of `name_flags` unless the spec's arguments give any of them.
pub(crate) fn serve_argv(
    settings: &BackendSettings,
    spec: &LaunchSpec,
    target: &LaunchTarget<'_>,
    model_flag: &[&str],
    name_flags: &[&str],
) -> Result<Vec<String>, BackendError> {
    let mut argv = settings.prefix(spec.backend)?;
    argv.extend(model_flag.iter().map(|flag| (*flag).to_owned()));
    argv.push(path_str(&spec.model_path)?.to_owned());
    argv.extend([
        "--host".to_owned(),
        target.bind_host.to_string(),
        "--port".to_owned(),
        target.port.to_string(),
    ]);
    if let (Some(name), Some(flag)) = (&spec.served_name, name_flags.first()) {
        if crate::args::flag_value(&spec.args, name_flags).is_none() {
            argv.extend([(*flag).to_owned(), name.clone()]);
        }
    }
    Ok(argv)
}

#[cfg(test)]
pub(crate) mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    pub(crate) fn spec(backend: BackendKind, model_path: &str) -> LaunchSpec {
        LaunchSpec::new(backend, model_path)
    }

    pub(crate) fn target(gpus: &[u32]) -> LaunchTarget<'_> {
        LaunchTarget {
            bind_host: IpAddr::V4(Ipv4Addr::LOCALHOST),
            port: 40001,
            gpu_indexes: gpus,
        }
    }

    /// An argument list from string literals.
    pub(crate) fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    pub(crate) fn argv(command: &BackendCommand) -> Vec<&str> {
        std::iter::once(command.program.as_str())
            .chain(command.args.iter().map(String::as_str))
            .collect()
    }

    /// With a served name `name`, the command ends in `flag name` (after its first seven
    /// words: the program, its subcommand or model flag, the path, host and port) unless
    /// the arguments name one in one of the `given` forms, which then stand alone.
    pub(crate) fn assert_served_name_unless_given(
        backend: BackendKind,
        model_path: &str,
        name: &str,
        flag: &str,
        given: &[[&str; 2]],
    ) {
        let mut spec = spec(backend, model_path);
        spec.served_name = Some(name.into());
        let settings = BackendSettings::default();
        let command = backend_command(&spec, &settings, &target(&[])).unwrap();
        assert_eq!(argv(&command)[7..], [flag, name]);
        for given in given {
            spec.args = args(given);
            let command = backend_command(&spec, &settings, &target(&[])).unwrap();
            assert_eq!(argv(&command)[7..], *given, "the user's name stays alone");
        }
    }

    #[test]
    fn executable_overrides_replace_the_prefix() {
        let spec = spec(BackendKind::Vllm, "/m");
        let mut settings = BackendSettings::default();
        settings
            .executables
            .insert(BackendKind::Vllm, vec!["/opt/vllm/bin/vllm".into()]);
        let command = backend_command(&spec, &settings, &target(&[])).unwrap();
        assert_eq!(command.program, "/opt/vllm/bin/vllm");
        assert_eq!(command.args[0], "serve");
        settings.executables.insert(BackendKind::Vllm, Vec::new());
        assert_eq!(
            backend_command(&spec, &settings, &target(&[])).unwrap_err(),
            BackendError::EmptyExecutable { backend: "vllm" }
        );
    }

    #[test]
    fn cpu_only_placement_hides_every_gpu_even_from_user_env() {
        let mut spec = spec(BackendKind::LlamaCpp, "/m.gguf");
        spec.env.insert(CUDA_VISIBLE_DEVICES.into(), "0".into());
        let command = backend_command(&spec, &BackendSettings::default(), &target(&[])).unwrap();
        assert_eq!(command.env[CUDA_VISIBLE_DEVICES], "");
        let command =
            backend_command(&spec, &BackendSettings::default(), &target(&[2, 3])).unwrap();
        assert_eq!(command.env[CUDA_VISIBLE_DEVICES], "2,3");
    }

    #[test]
    fn a_health_path_must_start_with_a_slash() {
        let mut spec = spec(BackendKind::LlamaCpp, "/m.gguf");
        spec.health_path = Some("ready".into());
        assert!(matches!(
            backend_command(&spec, &BackendSettings::default(), &target(&[])),
            Err(BackendError::BadHealthPath { .. })
        ));
        spec.health_path = Some("/ready".into());
        let command = backend_command(&spec, &BackendSettings::default(), &target(&[])).unwrap();
        assert_eq!(command.health_path, "/ready");
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
