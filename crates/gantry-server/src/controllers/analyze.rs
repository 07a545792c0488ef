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
//! * `custom`: a fixed claim declared in the model's `env` (see [`custom_claim`]).
//!
//! The estimation itself is pure and lives in `gantry-sched`; this module does the file IO
//! (the caller runs [`analyze`] on a blocking thread). Sources that would have to be
//! downloaded (Hugging Face, URL) are not supported yet, and a file the server cannot
//! read is reported as such: both become an [`AnalysisError`] whose message names the
//! problem and what to do, and the scheduler leaves the instance `pending` with it.
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
use gantry_sched::estimate::DEFAULT_CONTEXT_CAP;
use gantry_sched::{
    estimate_engine, estimate_llama_cpp, EngineOptions, FixedMemory, GgufModelFacts, HfModelConfig,
    LlamaCppOptions, ModelMemory, ResourceClaim, SafetensorsHeader, ServingEngine,
};
use gantry_types::{BackendKind, Model, ModelSource, Timestamp};
use tokio::time::Instant;

/// Environment variable of a `custom` model: GPUs one instance needs on one worker
/// (default 1; 0 for a CPU-only command).
pub const CUSTOM_GPU_COUNT_ENV: &str = "GANTRY_GPU_COUNT";
/// Environment variable of a `custom` model: memory the process needs on each of its GPUs,
/// everything included, e.g. `20GiB`, `512MiB`, `16G`, or bytes (default 0).
pub const CUSTOM_GPU_MEMORY_ENV: &str = "GANTRY_GPU_MEMORY";
/// Environment variable of a `custom` model: host RAM the process needs (default 0).
pub const CUSTOM_RAM_ENV: &str = "GANTRY_RAM";

/// What the scheduler learns from a model's files.
#[derive(Debug, Clone, PartialEq)]
pub struct Analysis {
    /// What one instance needs.
    pub claim: ResourceClaim,
    /// llama.cpp when the arguments give no `--ctx-size`: the context the estimate assumed
    /// (the trained context, capped at [`DEFAULT_CONTEXT_CAP`]). The worker must start the
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
            backend: model.backend,
            source: model.source.clone(),
            backend_args: model.backend_args.clone(),
            env: model.env.clone(),
        }
    }
}

/// Computes the claim of one instance of the model. Blocking: reads file headers.
pub fn analyze(input: &AnalysisInput) -> Result<Analysis, AnalysisError> {
    if input.backend == BackendKind::Custom {
        return custom_claim(&input.env);
    }
    let path = match &input.source {
        ModelSource::LocalPath { path } => PathBuf::from(path),
        ModelSource::Huggingface { repo_id, .. } => {
            return Err(AnalysisError(format!(
                "source huggingface ({repo_id}) cannot be scheduled yet: downloading models is \
                 not built; put the files on storage the server and the workers share and use \
                 source type local_path"
            )))
        }
        ModelSource::Url { url } => {
            return Err(AnalysisError(format!(
                "source url ({url}) cannot be scheduled yet: downloading models is not built; \
                 put the file on storage the server and the workers share and use source type \
                 local_path"
            )))
        }
    };
    match input.backend {
        BackendKind::LlamaCpp => analyze_gguf(&path, &input.backend_args),
        BackendKind::Vllm => analyze_model_directory(&path, ServingEngine::Vllm, input),
        BackendKind::Sglang => analyze_model_directory(&path, ServingEngine::Sglang, input),
        BackendKind::Custom => custom_claim(&input.env),
    }
}

/// The hint appended to every message about a file the server cannot read.
const READABLE_HINT: &str = "the server reads model headers to estimate memory, so \
     source.path must be readable on the server as well as on the workers; fix the path or \
     make the file available there, and the instance is retried automatically";

fn unreadable(path: &Path, error: impl std::fmt::Display) -> AnalysisError {
    AnalysisError(format!(
        "cannot read model file {}: {error}; {READABLE_HINT}",
        path.display()
    ))
}

fn bad_args(error: impl std::fmt::Display) -> AnalysisError {
    AnalysisError(format!(
        "backend_args: {error}; fix the model's backend_args"
    ))
}

fn analyze_gguf(path: &Path, args: &[String]) -> Result<Analysis, AnalysisError> {
    if path.is_dir() {
        return Err(AnalysisError(format!(
            "source.path {} is a directory; llama.cpp needs source.path to name the .gguf file",
            path.display()
        )));
    }
    let options = LlamaCppOptions::from_args(args).map_err(bad_args)?;
    let file = GgufFile::open(path).map_err(|e| match e {
        GgufError::Open { source, .. } => unreadable(path, source),
        other => AnalysisError(format!(
            "model file {} is not a usable GGUF file: {other}",
            path.display()
        )),
    })?;
    let facts = GgufModelFacts::from_gguf(&file).map_err(|e| {
        AnalysisError(format!(
            "model file {} lacks what the memory estimate needs: {e}",
            path.display()
        ))
    })?;
    let estimate = estimate_llama_cpp(&facts, &options).map_err(|e| {
        AnalysisError(format!(
            "cannot estimate the memory of {}: {e}",
            path.display()
        ))
    })?;
    let default_context_size = options.ctx_size.is_none().then(|| {
        let trained = if facts.context_length == 0 {
            DEFAULT_CONTEXT_CAP
        } else {
            facts.context_length
        };
        trained.min(DEFAULT_CONTEXT_CAP)
    });
    Ok(Analysis {
        claim: estimate.claim,
        default_context_size,
        args_data_parallel_size: None,
    })
}

fn analyze_model_directory(
    dir: &Path,
    engine: ServingEngine,
    input: &AnalysisInput,
) -> Result<Analysis, AnalysisError> {
    let options = EngineOptions::from_args(engine, &input.backend_args).map_err(bad_args)?;
    if !dir.is_dir() {
        let what = if dir.exists() {
            "is not a directory".to_owned()
        } else {
            "does not exist".to_owned()
        };
        return Err(AnalysisError(format!(
            "model directory {} {what}; {} needs source.path to name a Hugging Face model \
             directory (config.json and *.safetensors); {READABLE_HINT}",
            dir.display(),
            input.backend.as_str()
        )));
    }
    let config_path = dir.join("config.json");
    let config_bytes = std::fs::read(&config_path).map_err(|e| unreadable(&config_path, e))?;
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
        let raw = std::fs::read(&index_path).map_err(|e| unreadable(&index_path, e))?;
        let index: serde_json::Value = serde_json::from_slice(&raw)
            .map_err(|e| AnalysisError(format!("{}: {e}", index_path.display())))?;
        let names: BTreeSet<&str> = index
            .get("weight_map")
            .and_then(serde_json::Value::as_object)
            .map(|map| map.values().filter_map(serde_json::Value::as_str).collect())
            .unwrap_or_default();
        if names.is_empty() {
            return Err(AnalysisError(format!(
                "{} has no weight_map naming the weight files",
                index_path.display()
            )));
        }
        // Names are relative to the directory; refuse anything that leaves it.
        if let Some(bad) = names
            .iter()
            .find(|n| n.contains("..") || n.starts_with('/'))
        {
            return Err(AnalysisError(format!(
                "{} names {bad:?}, which is outside the model directory",
                index_path.display()
            )));
        }
        return Ok(names.iter().map(|name| dir.join(name)).collect());
    }
    let entries = std::fs::read_dir(dir).map_err(|e| unreadable(dir, e))?;
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| unreadable(dir, e))?;
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
    let file = File::open(path).map_err(|e| unreadable(path, e))?;
    let mut reader = BufReader::new(file);
    let mut prefix = [0u8; 8];
    reader
        .read_exact(&mut prefix)
        .map_err(|e| unreadable(path, e))?;
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
        .map_err(|e| unreadable(path, e))?;
    SafetensorsHeader::parse(&bytes).map_err(|e| invalid(&e))
}

/// The claim of a `custom` model, from its environment: [`CUSTOM_GPU_COUNT_ENV`] GPUs
/// (default 1) with [`CUSTOM_GPU_MEMORY_ENV`] each (default 0: the scheduler then only
/// checks that the GPUs exist), and [`CUSTOM_RAM_ENV`] of RAM (default 0). A custom command
/// is opaque to gantry, so it cannot estimate anything itself.
pub fn custom_claim(env: &BTreeMap<String, String>) -> Result<Analysis, AnalysisError> {
    let gpu_count = match env.get(CUSTOM_GPU_COUNT_ENV) {
        None => 1,
        Some(text) => text.trim().parse::<u32>().map_err(|_| {
            AnalysisError(format!(
                "env.{CUSTOM_GPU_COUNT_ENV}: {text:?} is not a GPU count"
            ))
        })?,
    };
    let size = |key: &str| -> Result<u64, AnalysisError> {
        match env.get(key) {
            None => Ok(0),
            Some(text) => gantry_types::units::parse_size(text)
                .map_err(|e| AnalysisError(format!("env.{key}: {e}"))),
        }
    };
    Ok(Analysis {
        claim: ResourceClaim {
            per_gpu_overhead_bytes: 0,
            base_ram_bytes: size(CUSTOM_RAM_ENV)?,
            memory: ModelMemory::Fixed(FixedMemory {
                gpu_count,
                bytes_per_gpu: size(CUSTOM_GPU_MEMORY_ENV)?,
            }),
        },
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
        assert!(e.0.contains("readable on the server"), "{e}");

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
        };
        let e = analyze(&remote).expect_err("not local");
        assert!(
            e.0.contains("org/model") && e.0.contains("local_path"),
            "{e}"
        );
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

    #[test]
    fn custom_claims_come_from_the_environment() {
        let mut env = BTreeMap::new();
        let analysis = custom_claim(&env).expect("defaults");
        assert_eq!(
            analysis.claim.memory,
            ModelMemory::Fixed(FixedMemory {
                gpu_count: 1,
                bytes_per_gpu: 0
            })
        );
        env.insert(CUSTOM_GPU_COUNT_ENV.to_owned(), "2".to_owned());
        env.insert(CUSTOM_GPU_MEMORY_ENV.to_owned(), "20G".to_owned());
        env.insert(CUSTOM_RAM_ENV.to_owned(), "512 MiB".to_owned());
        let analysis = custom_claim(&env).expect("declared");
        assert_eq!(
            analysis.claim.memory,
            ModelMemory::Fixed(FixedMemory {
                gpu_count: 2,
                bytes_per_gpu: 20 * GIB
            })
        );
        assert_eq!(analysis.claim.base_ram_bytes, 512 * 1024 * 1024);
        env.insert(CUSTOM_GPU_MEMORY_ENV.to_owned(), "lots".to_owned());
        let e = custom_claim(&env).expect_err("not a size");
        assert!(e.0.contains(CUSTOM_GPU_MEMORY_ENV), "{e}");
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
