//! Analysis: what one instance of a model needs, as a [`ResourceClaim`], computed from the
//! model's files and its backend arguments.
//!
//! This is the one place the server reads model files, and it reads only headers:
//!
//! * llama.cpp with `source.path` a `.gguf` file: the GGUF header, metadata and tensor
//!   table ([`GgufFile::open`] stops before the weights) → [`GgufModelFacts::from_gguf`] →
//!   [`estimate_llama_cpp`] with the options in `backend_args`;
//! * vLLM / SGLang with `source.path` a Hugging Face model directory: `config.json` and,
//!   of every `*.safetensors` file (those named in `model.safetensors.index.json` when it
//!   exists), the 8-byte header length and the JSON header → [`estimate_engine`];
//! * `custom`: a fixed claim declared in the model's `env`
//!   ([`gantry_backends::custom::declared_claim`]).
//!
//! The estimation itself is pure and lives in `gantry-sched`, and the options it reads from a
//! backend's arguments come from `gantry-backends`; this module does the file IO
//! (the caller runs [`analyze`] on a blocking thread). Remote sources (Hugging Face,
//! ModelScope, S3, URLs) are analysed the same way by [`analyze_remote`] from headers read
//! with range requests. A file the server cannot read is reported as such: it becomes an
//! [`AnalysisError`] whose message names the problem and what to do, and the scheduler
//! leaves the instance `pending` with it. A split GGUF is read part by part (the tensor
//! tables of every part, never the weights).
//!
//! [`AnalysisCache`] keeps one result per model version (id and `updated_at`), so the
//! replicas of a model read its files once.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use gantry_gguf::{GgufError, GgufFile};
use gantry_sched::estimate::safetensors::{header_length, MAX_HEADER_BYTES};
use gantry_sched::{
    estimate_engine, estimate_llama_cpp, EngineOptions, GgufModelFacts, HfModelConfig,
    ResourceClaim, SafetensorsHeader,
};
use gantry_source::{SourceError, Sources};
use gantry_types::{BackendKind, Model, ModelSource, Timestamp};
use tokio::time::Instant;

/// What the scheduler learns from a model's files.
#[derive(Debug, Clone, PartialEq)]
pub struct Analysis {
    /// What one instance needs.
    pub claim: ResourceClaim,
    /// llama.cpp: the context the estimate assumed, whether given in the arguments or not.
    pub context_size: Option<u32>,
    /// llama.cpp when the arguments give no `--ctx-size`: the context the estimate assumed
    /// (see [`gantry_backends::llama_cpp::default_context_size`]). The worker must start the
    /// backend with it, since llama.cpp's own default may be larger than what was claimed.
    pub default_context_size: Option<u32>,
    /// vLLM / SGLang: the data-parallel size given in the backend arguments, if any.
    pub args_data_parallel_size: Option<u32>,
}

/// Why a model could not be analysed: a message for the instance's `state_message`,
/// naming the problem and what to do about it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct AnalysisError(pub String);

/// The parts of a model that analysis reads, owned so they can move to a blocking thread.
#[derive(Debug, Clone)]
pub struct AnalysisInput {
    pub backend: BackendKind,
    pub source: ModelSource,
    pub backend_args: Vec<String>,
    pub env: BTreeMap<String, String>,
}

impl AnalysisInput {
    pub fn of(model: &Model) -> Self {
        AnalysisInput {
            backend: model.backend.kind(),
            source: model.source.clone(),
            backend_args: model.backend_args.clone(),
            env: model.env.clone(),
        }
    }
}

/// Computes the claim of one instance of the model wherever its files are: local files on
/// a blocking thread ([`analyze`]), remote ones from headers read over HTTP
/// ([`analyze_remote`]). The one entry point for the scheduler and for estimates asked
/// through the API, so both read the same files the same way.
pub async fn analyze_model(
    sources: &Sources,
    input: AnalysisInput,
) -> Result<Analysis, AnalysisError> {
    if input.source.is_remote() {
        return analyze_remote(sources, &input).await;
    }
    tokio::task::spawn_blocking(move || analyze(&input))
        .await
        .unwrap_or_else(|e| Err(AnalysisError(format!("model analysis failed: {e}"))))
}

/// Computes the claim of one instance of the model. Blocking: reads file headers.
pub fn analyze(input: &AnalysisInput) -> Result<Analysis, AnalysisError> {
    if input.backend == BackendKind::Custom {
        return custom_claim(&input.env);
    }
    let path = match &input.source {
        ModelSource::LocalPath { path } => PathBuf::from(path),
        remote => {
            return Err(AnalysisError(format!(
                "source {remote:?} is remote: it is analysed from its headers over HTTP \
                 (analyze_remote), not from local files"
            )))
        }
    };
    match input.backend {
        BackendKind::LlamaCpp => analyze_gguf(&path, &input.backend_args),
        BackendKind::Vllm => analyze_model_directory(
            &path,
            gantry_backends::vllm::estimate_options(&input.backend_args).map_err(bad_args)?,
            input,
        ),
        BackendKind::Sglang => analyze_model_directory(
            &path,
            gantry_backends::sglang::estimate_options(&input.backend_args).map_err(bad_args)?,
            input,
        ),
        BackendKind::Custom => custom_claim(&input.env),
    }
}

/// The hint appended to every message about a file the server cannot read. It names no
/// field and promises no retry: the same words answer an estimate, where nothing exists
/// yet, and explain a pending instance.
const READABLE_HINT: &str = "the server reads the model's header to estimate its memory, \
     so the file must be readable on the server as well as on the workers: correct the \
     model's path, or make the file available there";

fn unreadable(path: &Path, error: &std::io::Error) -> AnalysisError {
    let problem = match error.kind() {
        std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory => {
            format!("model file {} does not exist on the server", path.display())
        }
        _ => format!(
            "the server cannot read model file {} ({})",
            path.display(),
            io_reason(error)
        ),
    };
    AnalysisError(format!("{problem}; {READABLE_HINT}"))
}

/// An IO error in words, without the operating system's error number, which means
/// nothing to the person reading the message.
pub fn io_reason(error: &std::io::Error) -> String {
    use std::io::ErrorKind;
    match error.kind() {
        ErrorKind::NotFound => "it does not exist".to_owned(),
        ErrorKind::PermissionDenied => "permission denied".to_owned(),
        ErrorKind::IsADirectory => "it is a directory".to_owned(),
        ErrorKind::NotADirectory => "a part of its path is not a directory".to_owned(),
        ErrorKind::UnexpectedEof => "it ends before its header does".to_owned(),
        _ => {
            let text = error.to_string();
            match text.find(" (os error ") {
                Some(at) => text[..at].to_owned(),
                None => text,
            }
        }
    }
}

fn bad_args(error: impl std::fmt::Display) -> AnalysisError {
    AnalysisError(format!(
        "backend_args: {error}; fix the model's backend_args"
    ))
}

fn analyze_gguf(path: &Path, args: &[String]) -> Result<Analysis, AnalysisError> {
    if path.is_dir() {
        return Err(AnalysisError(format!(
            "{} is a directory; llama.cpp needs the model's path to name the .gguf file",
            path.display()
        )));
    }
    let options = gantry_backends::llama_cpp::estimate_options(args).map_err(bad_args)?;
    let open = |path: &Path| {
        GgufFile::open(path).map_err(|e| match e {
            GgufError::Open { source, .. } => unreadable(path, &source),
            other => AnalysisError(format!(
                "model file {} is not a usable GGUF file: {other}",
                path.display()
            )),
        })
    };
    let mut file = open(path)?;
    // A split model (`…-00001-of-0000N.gguf`): its other parts lie beside the first.
    if file.split_count() > 1 {
        let parts = gantry_gguf::split_paths(path).ok_or_else(|| {
            AnalysisError(format!(
                "{} is part of a split model ({} parts): give the path of its first part, \
                 …-00001-of-…gguf, as the model's path",
                path.display(),
                file.split_count()
            ))
        })?;
        for part in parts.iter().skip(1) {
            file.absorb_split_part(open(part)?).map_err(|e| {
                AnalysisError(format!(
                    "{} does not fit {}: {e}",
                    part.display(),
                    path.display()
                ))
            })?;
        }
    }
    estimate_gguf(&file, &path.display().to_string(), &options)
}

/// The claim of a llama.cpp model from its GGUF header; `name` names it in messages.
fn estimate_gguf(
    file: &GgufFile,
    name: &str,
    options: &gantry_sched::LlamaCppOptions,
) -> Result<Analysis, AnalysisError> {
    let facts = GgufModelFacts::from_gguf(file).map_err(|e| {
        AnalysisError(format!(
            "model file {name} lacks what the memory estimate needs: {e}"
        ))
    })?;
    let estimate = estimate_llama_cpp(&facts, options)
        .map_err(|e| AnalysisError(format!("cannot estimate the memory of {name}: {e}")))?;
    let default_context_size = gantry_backends::llama_cpp::default_context_size(options, &facts);
    Ok(Analysis {
        claim: estimate.claim,
        context_size: Some(estimate.context_size),
        default_context_size,
        args_data_parallel_size: None,
    })
}

/// Computes the claim of a model whose files are remote (Hugging Face, URL) from their
/// headers, read with range requests: the GGUF header of the first (or only) GGUF file,
/// or `config.json` and every safetensors header. Nothing else is downloaded.
pub async fn analyze_remote(
    sources: &Sources,
    input: &AnalysisInput,
) -> Result<Analysis, AnalysisError> {
    if input.backend == BackendKind::Custom {
        return custom_claim(&input.env);
    }
    let remote = |e: SourceError| match e {
        // What a person can act on is that this server must reach the host: said so,
        // rather than in a resolver's or socket's words.
        SourceError::Unreachable { host, reason, .. } => AnalysisError(format!(
            "the server cannot reach {host} ({reason}), so it cannot read the model's \
             headers to estimate its memory: check the server's network and proxy settings \
             (and hf_endpoint or modelscope_endpoint for a hub)"
        )),
        other => AnalysisError(format!(
            "the server cannot read the model's headers: {other}"
        )),
    };
    let resolved = sources
        .resolve(&input.source, input.backend)
        .await
        .map_err(remote)?;
    match input.backend {
        BackendKind::LlamaCpp => {
            let options = gantry_backends::llama_cpp::estimate_options(&input.backend_args)
                .map_err(bad_args)?;
            let file = resolved.first_gguf().ok_or_else(|| {
                AnalysisError("the source holds no .gguf file, which llama.cpp loads".to_owned())
            })?;
            let mut header = sources.gguf_header(file).await.map_err(remote)?;
            // A split model's tensors are spread over its parts: the following GGUF files
            // of the source, as many as the first part says.
            let first = resolved.first_gguf_index().unwrap_or(0);
            let more = usize::try_from(header.split_count() - 1).unwrap_or(usize::MAX);
            let parts: Vec<_> = resolved.files[first + 1..]
                .iter()
                .filter(|f| f.path.ends_with(".gguf"))
                .take(more)
                .collect();
            if parts.len() < more {
                return Err(AnalysisError(format!(
                    "{} is part 1 of {} but the source has only {} of its parts",
                    file.path,
                    more + 1,
                    parts.len() + 1
                )));
            }
            for part in parts {
                let part_header = sources.gguf_header(part).await.map_err(remote)?;
                header.absorb_split_part(part_header).map_err(|e| {
                    AnalysisError(format!("{} does not fit {}: {e}", part.path, file.path))
                })?;
            }
            estimate_gguf(&header, &file.path, &options)
        }
        BackendKind::Vllm | BackendKind::Sglang => {
            let options = if input.backend == BackendKind::Vllm {
                gantry_backends::vllm::estimate_options(&input.backend_args)
            } else {
                gantry_backends::sglang::estimate_options(&input.backend_args)
            }
            .map_err(bad_args)?;
            let named = |name: &str| resolved.files.iter().find(|f| f.path == name);
            let config_file = named("config.json").ok_or_else(|| {
                AnalysisError(format!(
                    "the source has no config.json, which {} needs",
                    input.backend.as_str()
                ))
            })?;
            let config_bytes = sources.read_small(config_file).await.map_err(remote)?;
            let config = HfModelConfig::parse(&config_bytes)
                .map_err(|e| AnalysisError(format!("config.json: {e}")))?;
            // The index names the weight files when there is one (some repositories also
            // carry a consolidated copy the engines do not load).
            let weights: Vec<&gantry_source::RemoteFile> =
                match named("model.safetensors.index.json") {
                    Some(index) => {
                        let raw = sources.read_small(index).await.map_err(remote)?;
                        let names = weight_map_names(&raw, &index.path)?;
                        names
                            .iter()
                            .map(|n| {
                                named(n).ok_or_else(|| {
                                    AnalysisError(format!(
                                        "{} names {n}, which the source does not have",
                                        index.path
                                    ))
                                })
                            })
                            .collect::<Result<_, _>>()?
                    }
                    None => resolved
                        .files
                        .iter()
                        .filter(|f| f.path.ends_with(".safetensors"))
                        .collect(),
                };
            let mut weight_bytes = 0u64;
            for file in weights {
                let header = sources.safetensors_header(file).await.map_err(remote)?;
                let mut bytes = Vec::with_capacity(8 + header.len());
                bytes.extend_from_slice(&(header.len() as u64).to_le_bytes());
                bytes.extend_from_slice(&header);
                let parsed = SafetensorsHeader::parse(&bytes)
                    .map_err(|e| AnalysisError(format!("{}: {e}", file.path)))?;
                weight_bytes = weight_bytes.saturating_add(parsed.total_bytes());
            }
            let claim = estimate_engine(weight_bytes, &config, &options)
                .map_err(|e| AnalysisError(format!("cannot estimate the memory: {e}")))?;
            Ok(Analysis {
                claim,
                context_size: None,
                default_context_size: None,
                args_data_parallel_size: options.data_parallel_size,
            })
        }
        BackendKind::Custom => custom_claim(&input.env),
    }
}

/// The file names of a `model.safetensors.index.json`'s `weight_map`, sorted and unique;
/// refuses names that leave the model's directory.
fn weight_map_names(raw: &[u8], what: &str) -> Result<BTreeSet<String>, AnalysisError> {
    let index: serde_json::Value =
        serde_json::from_slice(raw).map_err(|e| AnalysisError(format!("{what}: {e}")))?;
    let names: BTreeSet<String> = index
        .get("weight_map")
        .and_then(serde_json::Value::as_object)
        .map(|map| {
            map.values()
                .filter_map(serde_json::Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    if names.is_empty() {
        return Err(AnalysisError(format!(
            "{what} has no weight_map naming the weight files"
        )));
    }
    if let Some(bad) = names
        .iter()
        .find(|n| n.contains("..") || n.starts_with('/'))
    {
        return Err(AnalysisError(format!(
            "{what} names {bad:?}, which is outside the model directory"
        )));
    }
    Ok(names)
}

fn analyze_model_directory(
    dir: &Path,
    options: EngineOptions,
    input: &AnalysisInput,
) -> Result<Analysis, AnalysisError> {
    if !dir.is_dir() {
        let what = if dir.exists() {
            "is not a directory".to_owned()
        } else {
            "does not exist".to_owned()
        };
        return Err(AnalysisError(format!(
            "model directory {} {what} on the server; {} needs the model's path to name a \
             Hugging Face model directory (config.json and *.safetensors); {READABLE_HINT}",
            dir.display(),
            input.backend.as_str()
        )));
    }
    let config_path = dir.join("config.json");
    let config_bytes = std::fs::read(&config_path).map_err(|e| unreadable(&config_path, &e))?;
    let config = HfModelConfig::parse(&config_bytes)
        .map_err(|e| AnalysisError(format!("{}: {e}", config_path.display())))?;
    let files = safetensors_files(dir)?;
    let mut weight_bytes = 0u64;
    for file in &files {
        weight_bytes = weight_bytes.saturating_add(read_safetensors_header(file)?.total_bytes());
    }
    let claim = estimate_engine(weight_bytes, &config, &options).map_err(|e| {
        AnalysisError(format!(
            "cannot estimate the memory of {}: {e}",
            dir.display()
        ))
    })?;
    Ok(Analysis {
        claim,
        context_size: None,
        default_context_size: None,
        args_data_parallel_size: options.data_parallel_size,
    })
}

/// The weight files of a model directory, sorted: those the index names when
/// `model.safetensors.index.json` exists (some repositories also carry a consolidated copy
/// the engines do not load), else every `*.safetensors`.
fn safetensors_files(dir: &Path) -> Result<Vec<PathBuf>, AnalysisError> {
    let index_path = dir.join("model.safetensors.index.json");
    if index_path.is_file() {
        let raw = std::fs::read(&index_path).map_err(|e| unreadable(&index_path, &e))?;
        let names = weight_map_names(&raw, &index_path.display().to_string())?;
        return Ok(names.iter().map(|name| dir.join(name)).collect());
    }
    let entries = std::fs::read_dir(dir).map_err(|e| unreadable(dir, &e))?;
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| unreadable(dir, &e))?;
        let path = entry.path();
        if path.extension().is_some_and(|ext| ext == "safetensors") {
            files.push(path);
        }
    }
    if files.is_empty() {
        return Err(AnalysisError(format!(
            "model directory {} has no *.safetensors files; vLLM and SGLang models are \
             scheduled from their safetensors headers",
            dir.display()
        )));
    }
    files.sort();
    Ok(files)
}

/// Reads one safetensors header: the 8-byte little-endian length and that many bytes of
/// JSON, never the tensor data after it.
pub fn read_safetensors_header(path: &Path) -> Result<SafetensorsHeader, AnalysisError> {
    let file = File::open(path).map_err(|e| unreadable(path, &e))?;
    let mut reader = BufReader::new(file);
    let mut prefix = [0u8; 8];
    reader
        .read_exact(&mut prefix)
        .map_err(|e| unreadable(path, &e))?;
    let invalid = |e: &dyn std::fmt::Display| AnalysisError(format!("{}: {e}", path.display()));
    let length = header_length(&prefix).map_err(|e| invalid(&e))?;
    debug_assert!(
        length <= MAX_HEADER_BYTES,
        "header_length enforces the limit"
    );
    let mut bytes = Vec::with_capacity(8 + usize::try_from(length).unwrap_or(0));
    bytes.extend_from_slice(&prefix);
    reader
        .take(length)
        .read_to_end(&mut bytes)
        .map_err(|e| unreadable(path, &e))?;
    SafetensorsHeader::parse(&bytes).map_err(|e| invalid(&e))
}

/// The claim a `custom` model declares in its environment.
fn custom_claim(env: &BTreeMap<String, String>) -> Result<Analysis, AnalysisError> {
    Ok(Analysis {
        claim: gantry_backends::custom::declared_claim(env).map_err(AnalysisError)?,
        context_size: None,
        default_context_size: None,
        args_data_parallel_size: None,
    })
}

/// One analysis result per model version.
///
/// A success is kept until the model changes (`updated_at` moves) or is deleted. A failure
/// is also retried after `retry_failures_after`, because its cause (a missing file, an
/// unmounted share) is usually fixed outside gantry.
#[derive(Debug)]
pub struct AnalysisCache {
    entries: HashMap<i64, CacheEntry>,
    retry_failures_after: Duration,
}

#[derive(Debug)]
struct CacheEntry {
    model_updated_at: Timestamp,
    result: Result<Arc<Analysis>, AnalysisError>,
    analyzed_at: Instant,
}

/// What the cache knows about a model version.
#[derive(Debug, Clone, PartialEq)]
pub enum Cached {
    /// Nothing: the model was never analysed, changed since, or its failure is due for a
    /// retry. `retry` says whether an older failure of this same version exists.
    Miss { retry: bool },
    /// The result to use.
    Hit(Result<Arc<Analysis>, AnalysisError>),
}

impl AnalysisCache {
    pub fn new(retry_failures_after: Duration) -> Self {
        AnalysisCache {
            entries: HashMap::new(),
            retry_failures_after,
        }
    }

    /// The result for the model version, if still good at `now`.
    pub fn get(&self, model_id: i64, model_updated_at: Timestamp, now: Instant) -> Cached {
        match self.entries.get(&model_id) {
            Some(entry) if entry.model_updated_at == model_updated_at => match &entry.result {
                Ok(analysis) => Cached::Hit(Ok(Arc::clone(analysis))),
                Err(_) if now >= entry.analyzed_at + self.retry_failures_after => {
                    Cached::Miss { retry: true }
                }
                Err(e) => Cached::Hit(Err(e.clone())),
            },
            _ => Cached::Miss { retry: false },
        }
    }

    pub fn insert(
        &mut self,
        model_id: i64,
        model_updated_at: Timestamp,
        result: Result<Arc<Analysis>, AnalysisError>,
        now: Instant,
    ) {
        self.entries.insert(
            model_id,
            CacheEntry {
                model_updated_at,
                result,
                analyzed_at: now,
            },
        );
    }

    /// The earliest time a cached failure is due for a retry.
    pub fn next_retry(&self) -> Option<Instant> {
        self.entries
            .values()
            .filter(|entry| entry.result.is_err())
            .map(|entry| entry.analyzed_at + self.retry_failures_after)
            .min()
    }

    /// Drops the entries of models that no longer exist.
    pub fn retain_models(&mut self, model_ids: &HashSet<i64>) {
        self.entries.retain(|id, _| model_ids.contains(id));
    }

    /// Forgets everything (a new leadership term starts from the files).
    pub fn clear(&mut self) {
        self.entries.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gantry_sched::units::GIB;
    use gantry_sched::ModelMemory;

    fn input(backend: BackendKind, path: &Path, args: &[&str]) -> AnalysisInput {
        AnalysisInput {
            backend,
            source: ModelSource::LocalPath {
                path: path.display().to_string(),
            },
            backend_args: args.iter().map(|a| (*a).to_owned()).collect(),
            env: BTreeMap::new(),
        }
    }

    fn safetensors_file(path: &Path, json: &str) {
        let mut bytes = (json.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(json.as_bytes());
        std::fs::write(path, bytes).expect("write safetensors header");
    }

    const CONFIG: &str = r#"{"hidden_size": 4096, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8,
        "max_position_embeddings": 8192}"#;

    #[test]
    fn tiny_gguf_gives_a_layered_claim_and_the_default_context() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("tiny.gguf");
        gantry_gguf::write_tiny_llama(&path).expect("write the tiny model");
        let analysis = analyze(&input(BackendKind::LlamaCpp, &path, &[])).expect("analysable");
        let ModelMemory::Layers(layers) = &analysis.claim.memory else {
            panic!("llama.cpp claims are layered: {:?}", analysis.claim);
        };
        assert_eq!(layers.block_bytes.len(), 2);
        assert_eq!(layers.fixed_gpu_layers, None);
        assert_eq!(
            analysis.default_context_size,
            Some(256),
            "the trained context"
        );

        let analysis = analyze(&input(
            BackendKind::LlamaCpp,
            &path,
            &["-c", "128", "-ngl", "1"],
        ))
        .expect("analysable");
        assert_eq!(analysis.default_context_size, None, "the user chose one");
        let ModelMemory::Layers(layers) = &analysis.claim.memory else {
            panic!("layered");
        };
        assert_eq!(layers.fixed_gpu_layers, Some(1));
    }

    #[test]
    fn missing_files_and_bad_arguments_say_what_to_fix() {
        let dir = tempfile::tempdir().expect("temp dir");
        let missing = dir.path().join("nowhere.gguf");
        let e = analyze(&input(BackendKind::LlamaCpp, &missing, &[])).expect_err("missing");
        assert!(e.0.contains(&missing.display().to_string()), "{e}");
        assert!(e.0.contains("does not exist on the server"), "{e}");
        assert!(e.0.contains("readable on the server"), "{e}");
        // Words for people: no field path, no error number, no promise of a retry
        // (an estimate reads files for a model that does not exist yet).
        for backend_text in ["source.path", "os error", "retried"] {
            assert!(!e.0.contains(backend_text), "{e}");
        }

        let e = analyze(&input(BackendKind::LlamaCpp, dir.path(), &[])).expect_err("a dir");
        assert!(e.0.contains("is a directory"), "{e}");

        let not_gguf = dir.path().join("notes.gguf");
        std::fs::write(&not_gguf, b"hello world, not a model").expect("write");
        let e = analyze(&input(BackendKind::LlamaCpp, &not_gguf, &[])).expect_err("bad");
        assert!(e.0.contains("not a usable GGUF file"), "{e}");

        let path = dir.path().join("tiny.gguf");
        gantry_gguf::write_tiny_llama(&path).expect("write the tiny model");
        let e = analyze(&input(
            BackendKind::LlamaCpp,
            &path,
            &["--ctx-size", "many"],
        ))
        .expect_err("bad args");
        assert!(
            e.0.starts_with("backend_args:") && e.0.contains("--ctx-size"),
            "{e}"
        );

        let mut remote = input(BackendKind::Vllm, &path, &[]);
        remote.source = ModelSource::Huggingface {
            repo_id: "org/model".into(),
            file: None,
            revision: None,
        };
        let e = analyze(&remote).expect_err("not local");
        assert!(e.0.contains("org/model") && e.0.contains("remote"), "{e}");
    }

    #[test]
    fn model_directory_reads_config_and_every_safetensors_header() {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("config.json"), CONFIG).expect("write config");
        // Two shards of 8 GiB each in BF16 (4 Gi elements × 2 bytes), headers only.
        let shard = |name: &str| {
            safetensors_file(
                &dir.path().join(name),
                r#"{"w": {"dtype": "BF16", "shape": [65536, 65536], "data_offsets": [0, 8589934592]}}"#,
            );
        };
        shard("model-00001-of-00002.safetensors");
        shard("model-00002-of-00002.safetensors");
        let analysis = analyze(&input(
            BackendKind::Vllm,
            dir.path(),
            &["-tp", "2", "-dp", "2"],
        ))
        .expect("analysable");
        let ModelMemory::Engine(engine) = &analysis.claim.memory else {
            panic!("engine claim: {:?}", analysis.claim);
        };
        assert_eq!(engine.weight_bytes, 16 * GIB);
        assert_eq!(engine.fixed_tensor_parallel_size, Some(2));
        assert_eq!(analysis.args_data_parallel_size, Some(2));

        // With an index, only the files it names count.
        safetensors_file(
            &dir.path().join("consolidated.safetensors"),
            r#"{"w": {"dtype": "BF16", "shape": [65536, 65536], "data_offsets": [0, 8589934592]}}"#,
        );
        std::fs::write(
            dir.path().join("model.safetensors.index.json"),
            r#"{"weight_map": {"a": "model-00001-of-00002.safetensors",
                               "b": "model-00002-of-00002.safetensors"}}"#,
        )
        .expect("write index");
        let analysis = analyze(&input(BackendKind::Sglang, dir.path(), &[])).expect("ok");
        let ModelMemory::Engine(engine) = &analysis.claim.memory else {
            panic!("engine claim");
        };
        assert_eq!(
            engine.weight_bytes,
            16 * GIB,
            "the consolidated copy is skipped"
        );
    }

    #[test]
    fn io_errors_read_without_their_number() {
        let unreadable = std::io::Error::from_raw_os_error(13);
        assert_eq!(io_reason(&unreadable), "permission denied");
        let busy = std::io::Error::from_raw_os_error(16);
        let reason = io_reason(&busy);
        assert!(
            !reason.contains("os error") && !reason.is_empty(),
            "{reason}"
        );
    }

    #[test]
    fn model_directory_problems_name_the_file() {
        let dir = tempfile::tempdir().expect("temp dir");
        let e = analyze(&input(BackendKind::Vllm, dir.path(), &[])).expect_err("no config");
        assert!(e.0.contains("config.json"), "{e}");
        std::fs::write(dir.path().join("config.json"), CONFIG).expect("write config");
        let e = analyze(&input(BackendKind::Vllm, dir.path(), &[])).expect_err("no weights");
        assert!(e.0.contains("no *.safetensors"), "{e}");
        let broken = dir.path().join("model.safetensors");
        std::fs::write(&broken, [1u8, 2, 3]).expect("write");
        let e = analyze(&input(BackendKind::Vllm, dir.path(), &[])).expect_err("truncated");
        assert!(e.0.contains("model.safetensors"), "{e}");
        let e = analyze(&input(BackendKind::Vllm, &dir.path().join("gone"), &[]))
            .expect_err("missing dir");
        assert!(e.0.contains("does not exist"), "{e}");
    }

    #[tokio::test(start_paused = true)]
    async fn cache_keeps_successes_per_version_and_retries_failures() {
        let mut cache = AnalysisCache::new(Duration::from_secs(10));
        let v1 = Timestamp::from_millis(1);
        let v2 = Timestamp::from_millis(2);
        let now = Instant::now();
        assert_eq!(cache.get(7, v1, now), Cached::Miss { retry: false });
        let analysis = Arc::new(custom_claim(&BTreeMap::new()).expect("claim"));
        cache.insert(7, v1, Ok(Arc::clone(&analysis)), now);
        let later = now + Duration::from_secs(3600);
        assert_eq!(cache.get(7, v1, later), Cached::Hit(Ok(analysis)));
        assert_eq!(cache.get(7, v2, now), Cached::Miss { retry: false });
        assert_eq!(cache.next_retry(), None);

        let failure = AnalysisError("gone".into());
        cache.insert(8, v1, Err(failure.clone()), now);
        assert_eq!(cache.get(8, v1, now), Cached::Hit(Err(failure)));
        assert_eq!(cache.next_retry(), Some(now + Duration::from_secs(10)));
        assert_eq!(
            cache.get(8, v1, now + Duration::from_secs(10)),
            Cached::Miss { retry: true }
        );
        cache.retain_models(&HashSet::from([8]));
        assert_eq!(cache.get(7, v1, now), Cached::Miss { retry: false });
    }
}
