//! Models: the desired state an admin declares (what to serve, with which backend, how
//! many replicas, where).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::backend::BackendName;
use crate::time::Timestamp;
use crate::validate::{check_labels, check_name, check_text, FieldError, Validate};

/// Most replicas one model may ask for; a guard against typos that would flood the store.
pub const MAX_REPLICAS: u32 = 1000;
/// Most backend arguments; each at most 4096 bytes.
pub const MAX_BACKEND_ARGS: usize = 256;

/// The inference server that runs a model.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, ToSchema,
)]
pub enum BackendKind {
    #[serde(rename = "llama.cpp")]
    LlamaCpp,
    #[serde(rename = "vllm")]
    Vllm,
    #[serde(rename = "sglang")]
    Sglang,
    #[serde(rename = "custom")]
    Custom,
}

impl BackendKind {
    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::LlamaCpp => "llama.cpp",
            BackendKind::Vllm => "vllm",
            BackendKind::Sglang => "sglang",
            BackendKind::Custom => "custom",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "llama.cpp" => Some(BackendKind::LlamaCpp),
            "vllm" => Some(BackendKind::Vllm),
            "sglang" => Some(BackendKind::Sglang),
            "custom" => Some(BackendKind::Custom),
            _ => None,
        }
    }
}

/// Where the model's weights come from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ModelSource {
    /// A file or directory already present on the workers.
    LocalPath { path: String },
    /// A Hugging Face repository: one file of it, or the files a glob matches (a split
    /// GGUF brings all its parts); without `file`, the files the backend needs.
    Huggingface {
        repo_id: String,
        /// A path in the repository, or a glob of file names (`*Q4_K_M.gguf`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        file: Option<String>,
        /// A branch, tag or commit; `main` when absent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        revision: Option<String>,
    },
    /// A ModelScope repository, chosen as for Hugging Face; `master` when no revision.
    Modelscope {
        repo_id: String,
        /// A path in the repository, or a glob of file names.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        file: Option<String>,
        /// A branch, tag or commit; `master` when absent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        revision: Option<String>,
    },
    /// An object, or every object under a prefix, of an S3-compatible store (`s3_*` keys).
    S3 {
        bucket: String,
        /// An object's key, or a prefix ending in `/` for a directory of files.
        key: String,
    },
    /// A file downloadable over HTTP(S), or the parts of a split file in order.
    Url {
        url: OneOrMany,
        /// The SHA-256 of the file (of each part, in order), checked after download.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sha256: Option<OneOrMany>,
    },
    /// A file uploaded to the servers (`POST /api/v1/model-files/uploads`), once its
    /// upload is complete: one file, such as a GGUF model.
    Upload {
        /// The upload's id.
        id: i64,
    },
}

/// One string or a list of them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    /// The strings, in order.
    pub fn items(&self) -> Vec<&str> {
        match self {
            OneOrMany::One(one) => vec![one.as_str()],
            OneOrMany::Many(many) => many.iter().map(String::as_str).collect(),
        }
    }
}

impl ModelSource {
    /// The revision of a hub source: the one asked for, else the hub's default branch
    /// (`main` on Hugging Face, `master` on ModelScope).
    pub fn revision(&self) -> Option<&str> {
        match self {
            ModelSource::Huggingface { revision, .. } => {
                Some(revision.as_deref().unwrap_or("main"))
            }
            ModelSource::Modelscope { revision, .. } => {
                Some(revision.as_deref().unwrap_or("master"))
            }
            _ => None,
        }
    }

    /// Whether the worker has to download the files (they are not on its disk).
    pub fn is_remote(&self) -> bool {
        !matches!(self, ModelSource::LocalPath { .. })
    }

    fn validate(&self) -> Result<(), FieldError> {
        match self {
            ModelSource::LocalPath { path } => {
                if !path.starts_with('/') {
                    return Err(FieldError::new("source.path", "must be an absolute path"));
                }
                if path.split('/').any(|part| part == "..") {
                    return Err(FieldError::new(
                        "source.path",
                        "must not contain '..'; give the path itself",
                    ));
                }
                check_text("source.path", path, 4096)
            }
            ModelSource::Huggingface {
                repo_id,
                file,
                revision,
            }
            | ModelSource::Modelscope {
                repo_id,
                file,
                revision,
            } => {
                let parts: Vec<&str> = repo_id.split('/').collect();
                let well_formed = parts.len() == 2
                    && parts.iter().all(|p| {
                        !p.is_empty()
                            && !p.chars().all(|c| c == '.')
                            && p.chars()
                                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
                    });
                if !well_formed {
                    return Err(FieldError::new(
                        "source.repo_id",
                        "must look like owner/name (letters, digits, '-', '_', '.')",
                    ));
                }
                if let Some(file) = file {
                    if file.is_empty()
                        || file.starts_with('/')
                        || file.split('/').any(|part| part == "..")
                    {
                        return Err(FieldError::new(
                            "source.file",
                            "must be a relative path or glob inside the repository",
                        ));
                    }
                    check_text("source.file", file, 1024)?;
                }
                if let Some(revision) = revision {
                    let plain = !revision.is_empty()
                        && revision.len() <= 255
                        && !revision
                            .split('/')
                            .any(|p| p.is_empty() || p.chars().all(|c| c == '.'))
                        && revision.chars().all(|c| {
                            c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/')
                        });
                    if !plain {
                        return Err(FieldError::new(
                            "source.revision",
                            "must be a branch, tag or commit (letters, digits, '-', '_', '.', '/')",
                        ));
                    }
                }
                Ok(())
            }
            ModelSource::S3 { bucket, key } => {
                // S3's own bucket naming rules: 3-63 of lowercase letters, digits, '.' and
                // '-', starting and ending with a letter or digit.
                let edges_ok = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
                let well_formed = (3..=63).contains(&bucket.len())
                    && bucket
                        .chars()
                        .all(|c| edges_ok(c) || matches!(c, '.' | '-'))
                    && bucket.starts_with(edges_ok)
                    && bucket.ends_with(edges_ok);
                if !well_formed {
                    return Err(FieldError::new(
                        "source.bucket",
                        "must be an S3 bucket name: 3 to 63 lowercase letters, digits, '.' \
                         and '-', starting and ending with a letter or digit",
                    ));
                }
                if key.is_empty() || key.starts_with('/') || key.split('/').any(|p| p == "..") {
                    return Err(FieldError::new(
                        "source.key",
                        "must be an object key or a prefix ending in '/', without a leading \
                         '/' or '..'",
                    ));
                }
                check_text("source.key", key, 1024)
            }
            ModelSource::Upload { id } => {
                if *id <= 0 {
                    return Err(FieldError::new(
                        "source.id",
                        "must be the id of an upload (GET /api/v1/model-files/uploads)",
                    ));
                }
                Ok(())
            }
            ModelSource::Url { url, sha256 } => {
                let urls = url.items();
                if urls.is_empty() {
                    return Err(FieldError::new("source.url", "give at least one URL"));
                }
                for url in &urls {
                    if !(url.starts_with("http://") || url.starts_with("https://")) {
                        return Err(FieldError::new(
                            "source.url",
                            "must start with http:// or https://",
                        ));
                    }
                    check_text("source.url", url, 4096)?;
                }
                if let Some(sha256) = sha256 {
                    let digests = sha256.items();
                    if digests.len() != urls.len() {
                        return Err(FieldError::new(
                            "source.sha256",
                            format!(
                                "give one digest per URL ({} URLs, {} digests)",
                                urls.len(),
                                digests.len()
                            ),
                        ));
                    }
                    if !digests
                        .iter()
                        .all(|d| d.len() == 64 && d.chars().all(|c| c.is_ascii_hexdigit()))
                    {
                        return Err(FieldError::new(
                            "source.sha256",
                            "must be 64 hexadecimal characters",
                        ));
                    }
                }
                Ok(())
            }
        }
    }
}

/// How the scheduler ranks workers that fit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum PlacementStrategy {
    /// Prefer the emptiest worker: spreads load and failure domains.
    #[default]
    Spread,
    /// Prefer the fullest worker that still fits: keeps whole GPUs free for big models.
    Binpack,
}

/// A manual placement: run on this worker, on these GPUs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GpuSelector {
    pub worker_name: String,
    pub gpu_indexes: Vec<u32>,
}

/// A model as the API shows it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct Model {
    pub id: i64,
    pub name: String,
    /// The cluster the model is deployed into: only its workers run the model's instances.
    #[serde(default = "crate::cluster::default_cluster_id")]
    pub cluster_id: i64,
    pub description: String,
    pub source: ModelSource,
    /// `llama.cpp`, `vllm`, `sglang`, `custom`, or a defined backend's name.
    pub backend: BackendName,
    /// The backend version to run; without it, the newest version installed on the worker
    /// (else the backend's default, installed on demand).
    pub backend_version: Option<String>,
    pub backend_args: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub replicas: u32,
    pub worker_selector: BTreeMap<String, String>,
    pub gpu_selector: Option<GpuSelector>,
    pub placement_strategy: PlacementStrategy,
    /// vLLM-style data parallelism: N child servers, one per GPU, per instance.
    pub data_parallel_size: Option<u32>,
    /// Allow placing some or all layers in system memory (llama.cpp only).
    pub cpu_offload: bool,
    /// For backend `custom`: the command template, with the placeholders
    /// `{model_path}`, `{port}`, `{gpu_ids}` and `{host}`; split like a shell would,
    /// but run without one.
    pub custom_command: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

/// `POST /api/v1/models`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelCreate {
    #[schema(min_length = 1, max_length = 63, pattern = r"^[a-z0-9][a-z0-9._-]*$")]
    pub name: String,
    #[serde(default)]
    #[schema(max_length = 2000, pattern = r"^[^\x00-\x08\x0B-\x1F\x7F-\x9F]*$")]
    pub description: String,
    /// The cluster to deploy into (default: the default cluster, id 1). The model's
    /// instances run on that cluster's workers only; its name stays unique across
    /// clusters, so the gateway and routes reach it by name alone.
    #[serde(
        default,
        deserialize_with = "crate::validate::not_null",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(nullable = false, minimum = 1)]
    pub cluster_id: Option<i64>,
    /// Where the model's files come from. A `local_path` must exist on the server, which
    /// reads the model's header to estimate its memory (422 otherwise; `custom` models'
    /// files are never read there), and lie under the `model_dirs` of the workers that run it.
    pub source: ModelSource,
    /// `llama.cpp`, `vllm`, `sglang`, `custom` (with `custom_command`), or the name of a
    /// backend defined with `POST /api/v1/inference-backends`.
    pub backend: BackendName,
    /// Pins the backend version (installed on demand); changing it rolls the instances.
    #[serde(default)]
    pub backend_version: Option<String>,
    #[serde(default)]
    #[schema(max_items = 256)]
    pub backend_args: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default = "default_replicas")]
    #[schema(maximum = 1000)]
    pub replicas: u32,
    #[serde(default)]
    #[schema(schema_with = crate::validate::labels_schema)]
    pub worker_selector: BTreeMap<String, String>,
    #[serde(default)]
    pub gpu_selector: Option<GpuSelector>,
    #[serde(default)]
    pub placement_strategy: PlacementStrategy,
    #[serde(default)]
    #[schema(minimum = 1, maximum = 64)]
    pub data_parallel_size: Option<u32>,
    #[serde(default = "default_cpu_offload")]
    pub cpu_offload: bool,
    #[serde(default)]
    pub custom_command: Option<String>,
    #[serde(default)]
    #[schema(schema_with = crate::validate::labels_schema)]
    pub labels: BTreeMap<String, String>,
}

impl ModelCreate {
    /// The model this request declares, with `id` and both timestamps `now`: what the
    /// store writes, and what an estimate (`POST /api/v1/models/estimate`) reads without
    /// writing anything.
    pub fn to_model(&self, id: i64, now: Timestamp) -> Model {
        Model {
            id,
            name: self.name.clone(),
            cluster_id: self
                .cluster_id
                .unwrap_or(crate::cluster::DEFAULT_CLUSTER_ID),
            description: self.description.clone(),
            source: self.source.clone(),
            backend: self.backend.clone(),
            backend_version: self.backend_version.clone(),
            backend_args: self.backend_args.clone(),
            env: self.env.clone(),
            replicas: self.replicas,
            worker_selector: self.worker_selector.clone(),
            gpu_selector: self.gpu_selector.clone(),
            placement_strategy: self.placement_strategy,
            data_parallel_size: self.data_parallel_size,
            cpu_offload: self.cpu_offload,
            custom_command: self.custom_command.clone(),
            labels: self.labels.clone(),
            created_at: now,
            updated_at: now,
        }
    }
}

fn default_replicas() -> u32 {
    1
}

fn default_cpu_offload() -> bool {
    true
}

impl Validate for ModelCreate {
    fn validate(&self) -> Result<(), FieldError> {
        check_name("name", &self.name)?;
        check_text("description", &self.description, 2000)?;
        crate::cluster::check_cluster_id("cluster_id", self.cluster_id)?;
        self.source.validate()?;
        check_replicas(self.replicas)?;
        check_backend_args(&self.backend_args)?;
        check_env(&self.env)?;
        check_labels("worker_selector", &self.worker_selector)?;
        check_labels("labels", &self.labels)?;
        if let Some(selector) = &self.gpu_selector {
            check_gpu_selector(selector)?;
        }
        check_data_parallel(self.data_parallel_size)?;
        self.backend.check("backend")?;
        if let Some(version) = &self.backend_version {
            crate::backend::check_version("backend_version", version)?;
        }
        if let Some(command) = &self.custom_command {
            check_custom_command(command)?;
        }
        if self.custom_command.is_some() && self.backend != BackendKind::Custom {
            return Err(FieldError::new(
                "custom_command",
                "only backend custom takes a command template",
            ));
        }
        Ok(())
    }
}

/// `PATCH /api/v1/models/{id}`: absent fields stay as they are; `null` clears an
/// optional field. An unset field (`None`) is left out when the update is serialised, so a
/// client that sets one field changes that field only.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelUpdate {
    /// A model stays in the cluster it was deployed into: this may only name that
    /// cluster (to delete and deploy again elsewhere is how a model moves).
    #[serde(
        default,
        deserialize_with = "crate::validate::not_null",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(nullable = false, minimum = 1)]
    pub cluster_id: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 2000, pattern = r"^[^\x00-\x08\x0B-\x1F\x7F-\x9F]*$")]
    pub description: Option<String>,
    /// Where the model's files come from, as a whole new source (any type). A change rolls
    /// the instances onto it one at a time, as a change of `backend_args` does. The same
    /// checks as on creation apply: a `local_path` the server cannot find (every backend but
    /// `custom`) or an upload that is not complete is refused with 422.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<ModelSource>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backend_version: Option<Option<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backend_args: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub env: Option<BTreeMap<String, String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(maximum = 1000)]
    pub replicas: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worker_selector: Option<BTreeMap<String, String>>,
    #[serde(
        default,
        with = "double_option",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<GpuSelector>)]
    pub gpu_selector: Option<Option<GpuSelector>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub placement_strategy: Option<PlacementStrategy>,
    #[serde(
        default,
        with = "double_option",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<u32>, minimum = 1, maximum = 64)]
    pub data_parallel_size: Option<Option<u32>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_offload: Option<bool>,
    #[serde(
        default,
        with = "double_option",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<String>)]
    pub custom_command: Option<Option<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
}

impl Validate for ModelUpdate {
    fn validate(&self) -> Result<(), FieldError> {
        crate::cluster::check_cluster_id("cluster_id", self.cluster_id)?;
        if let Some(description) = &self.description {
            check_text("description", description, 2000)?;
        }
        if let Some(source) = &self.source {
            source.validate()?;
        }
        if let Some(replicas) = self.replicas {
            check_replicas(replicas)?;
        }
        if let Some(args) = &self.backend_args {
            check_backend_args(args)?;
        }
        if let Some(env) = &self.env {
            check_env(env)?;
        }
        if let Some(selector) = &self.worker_selector {
            check_labels("worker_selector", selector)?;
        }
        if let Some(labels) = &self.labels {
            check_labels("labels", labels)?;
        }
        if let Some(Some(selector)) = &self.gpu_selector {
            check_gpu_selector(selector)?;
        }
        if let Some(dp) = self.data_parallel_size {
            check_data_parallel(dp)?;
        }
        if let Some(Some(command)) = &self.custom_command {
            check_custom_command(command)?;
        }
        if let Some(Some(version)) = &self.backend_version {
            crate::backend::check_version("backend_version", version)?;
        }
        Ok(())
    }
}

impl Model {
    /// Applies a validated update in place.
    pub fn apply(&mut self, update: ModelUpdate) {
        let ModelUpdate {
            // A model's cluster does not change; the service refuses an update naming
            // another one before applying it.
            cluster_id: _,
            description,
            source,
            backend_version,
            backend_args,
            env,
            replicas,
            worker_selector,
            gpu_selector,
            placement_strategy,
            data_parallel_size,
            cpu_offload,
            custom_command,
            labels,
        } = update;
        if let Some(v) = description {
            self.description = v;
        }
        if let Some(v) = source {
            self.source = v;
        }
        if let Some(v) = backend_version {
            self.backend_version = v;
        }
        if let Some(v) = backend_args {
            self.backend_args = v;
        }
        if let Some(v) = env {
            self.env = v;
        }
        if let Some(v) = replicas {
            self.replicas = v;
        }
        if let Some(v) = worker_selector {
            self.worker_selector = v;
        }
        if let Some(v) = gpu_selector {
            self.gpu_selector = v;
        }
        if let Some(v) = placement_strategy {
            self.placement_strategy = v;
        }
        if let Some(v) = data_parallel_size {
            self.data_parallel_size = v;
        }
        if let Some(v) = cpu_offload {
            self.cpu_offload = v;
        }
        if let Some(v) = custom_command {
            self.custom_command = v;
        }
        if let Some(v) = labels {
            self.labels = v;
        }
    }
}

fn check_replicas(replicas: u32) -> Result<(), FieldError> {
    if replicas > MAX_REPLICAS {
        return Err(FieldError::new(
            "replicas",
            format!("must be between 0 and {MAX_REPLICAS}"),
        ));
    }
    Ok(())
}

fn check_backend_args(args: &[String]) -> Result<(), FieldError> {
    if args.len() > MAX_BACKEND_ARGS {
        return Err(FieldError::new(
            "backend_args",
            format!("at most {MAX_BACKEND_ARGS} arguments"),
        ));
    }
    for (i, arg) in args.iter().enumerate() {
        if arg.len() > 4096 || arg.contains('\0') {
            return Err(FieldError::new(
                format!("backend_args[{i}]"),
                "must be at most 4096 bytes without NUL characters",
            ));
        }
    }
    Ok(())
}

pub(crate) fn check_env(env: &BTreeMap<String, String>) -> Result<(), FieldError> {
    for (key, value) in env {
        let key_ok = !key.is_empty()
            && key.len() <= 128
            && !key.as_bytes()[0].is_ascii_digit()
            && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !key_ok {
            return Err(FieldError::new(
                format!("env.{key}"),
                "environment variable names are letters, digits and '_', not starting with a digit",
            ));
        }
        if value.len() > 4096 || value.contains('\0') {
            return Err(FieldError::new(
                format!("env.{key}"),
                "values are at most 4096 bytes without NUL characters",
            ));
        }
    }
    Ok(())
}

fn check_gpu_selector(selector: &GpuSelector) -> Result<(), FieldError> {
    check_name("gpu_selector.worker_name", &selector.worker_name)?;
    if selector.gpu_indexes.is_empty() || selector.gpu_indexes.len() > 64 {
        return Err(FieldError::new(
            "gpu_selector.gpu_indexes",
            "must list 1 to 64 GPU indexes",
        ));
    }
    let mut sorted = selector.gpu_indexes.clone();
    sorted.sort_unstable();
    sorted.dedup();
    if sorted.len() != selector.gpu_indexes.len() {
        return Err(FieldError::new(
            "gpu_selector.gpu_indexes",
            "must not repeat an index",
        ));
    }
    Ok(())
}

fn check_custom_command(command: &str) -> Result<(), FieldError> {
    check_command_template("custom_command", command)
}

/// A command template: not blank, at most 4096 bytes, no NUL.
pub(crate) fn check_command_template(field: &str, command: &str) -> Result<(), FieldError> {
    if command.trim().is_empty() {
        return Err(FieldError::new(field, "must not be empty"));
    }
    if command.len() > 4096 || command.contains('\0') {
        return Err(FieldError::new(
            field,
            "must be at most 4096 bytes without NUL characters",
        ));
    }
    Ok(())
}

fn check_data_parallel(size: Option<u32>) -> Result<(), FieldError> {
    if let Some(size) = size {
        if !(1..=64).contains(&size) {
            return Err(FieldError::new(
                "data_parallel_size",
                "must be between 1 and 64",
            ));
        }
    }
    Ok(())
}

/// Serde helper telling "field absent" (`None`) from "field is null" (`Some(None)`).
pub(crate) mod double_option {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<T: Serialize, S: Serializer>(
        value: &Option<Option<T>>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match value {
            None | Some(None) => serializer.serialize_none(),
            Some(Some(v)) => v.serialize(serializer),
        }
    }

    pub fn deserialize<'de, T: Deserialize<'de>, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<Option<T>>, D::Error> {
        Option::<T>::deserialize(deserializer).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn create(json: &str) -> Result<ModelCreate, serde_json::Error> {
        serde_json::from_str(json)
    }

    #[test]
    fn minimal_model_gets_defaults() {
        let m = create(
            r#"{"name":"tiny","source":{"type":"local_path","path":"/m/tiny.gguf"},"backend":"llama.cpp"}"#,
        )
        .unwrap();
        assert_eq!(m.replicas, 1);
        assert_eq!(m.placement_strategy, PlacementStrategy::Spread);
        assert!(m.validate().is_ok());
    }

    /// The field a source's validation names, or `None` when the source is valid.
    fn source_error(json: serde_json::Value) -> Option<String> {
        let source: ModelSource = serde_json::from_value(json).unwrap();
        source.validate().err().map(|e| e.field.to_string())
    }

    #[test]
    fn sources_are_checked_field_by_field() {
        use serde_json::json;
        let valid = [
            json!({"type": "local_path", "path": "/m/tiny.gguf"}),
            json!({"type": "huggingface", "repo_id": "Qwen/Qwen2.5-0.5B-Instruct-GGUF",
                   "file": "*q4_k_m.gguf", "revision": "v1.0"}),
            json!({"type": "modelscope", "repo_id": "qwen/Qwen2.5-0.5B-Instruct-GGUF"}),
            json!({"type": "s3", "bucket": "models.example-1", "key": "qwen/tiny.gguf"}),
            json!({"type": "s3", "bucket": "models", "key": "qwen/"}),
            json!({"type": "url", "url": ["https://x/a-00001-of-00002.gguf",
                   "https://x/a-00002-of-00002.gguf"]}),
        ];
        for source in valid {
            assert_eq!(source_error(source.clone()), None, "{source}");
        }
        #[rustfmt::skip]
        let invalid = [
            ("source.path",     json!({"type": "local_path", "path": "m/tiny.gguf"})),
            ("source.path",     json!({"type": "local_path", "path": "/m/../etc"})),
            ("source.repo_id",  json!({"type": "huggingface", "repo_id": "no-owner"})),
            ("source.repo_id",  json!({"type": "modelscope", "repo_id": "a/b/c"})),
            ("source.repo_id",  json!({"type": "huggingface", "repo_id": "../b"})),
            ("source.repo_id",  json!({"type": "modelscope", "repo_id": "a/.."})),
            ("source.revision", json!({"type": "huggingface", "repo_id": "a/b", "revision": "x/./y"})),
            ("source.revision", json!({"type": "huggingface", "repo_id": "a/b", "revision": ".."})),
            ("source.file",     json!({"type": "modelscope", "repo_id": "a/b", "file": "../x"})),
            ("source.revision", json!({"type": "huggingface", "repo_id": "a/b", "revision": "a b"})),
            ("source.bucket",   json!({"type": "s3", "bucket": "Models", "key": "x"})),
            ("source.bucket",   json!({"type": "s3", "bucket": "ab", "key": "x"})),
            ("source.bucket",   json!({"type": "s3", "bucket": "-models", "key": "x"})),
            ("source.key",      json!({"type": "s3", "bucket": "models", "key": ""})),
            ("source.key",      json!({"type": "s3", "bucket": "models", "key": "/abs"})),
            ("source.key",      json!({"type": "s3", "bucket": "models", "key": "a/../b"})),
            ("source.url",      json!({"type": "url", "url": "ftp://x/a.gguf"})),
            ("source.sha256",   json!({"type": "url", "url": "https://x/a", "sha256": ["00"]})),
        ];
        for (field, source) in invalid {
            assert_eq!(
                source_error(source.clone()).as_deref(),
                Some(field),
                "{source}"
            );
        }
        let revision = |json| serde_json::from_value::<ModelSource>(json).unwrap();
        assert_eq!(
            revision(json!({"type": "modelscope", "repo_id": "a/b"})).revision(),
            Some("master")
        );
        assert_eq!(
            revision(json!({"type": "huggingface", "repo_id": "a/b"})).revision(),
            Some("main")
        );
    }

    #[test]
    fn unknown_fields_are_rejected_by_name() {
        let err = create(
            r#"{"name":"t","source":{"type":"url","url":"https://x"},"backend":"vllm","replica":2}"#,
        )
        .unwrap_err();
        assert!(err.to_string().contains("unknown field `replica`"), "{err}");
    }

    #[test]
    fn out_of_range_replicas_name_the_field() {
        let m = create(
            r#"{"name":"t","source":{"type":"url","url":"https://x"},"backend":"vllm","replicas":5000}"#,
        )
        .unwrap();
        assert_eq!(m.validate().unwrap_err().field, "replicas");
    }

    #[test]
    fn update_distinguishes_absent_from_null() {
        let u: ModelUpdate = serde_json::from_str(r#"{"gpu_selector":null}"#).unwrap();
        assert_eq!(u.gpu_selector, Some(None));
        let u: ModelUpdate = serde_json::from_str(r#"{}"#).unwrap();
        assert_eq!(u.gpu_selector, None);
    }

    #[test]
    fn an_update_that_sets_one_field_clears_no_other_on_the_wire() {
        let update = ModelUpdate {
            replicas: Some(3),
            ..ModelUpdate::default()
        };
        let json = serde_json::to_string(&update).unwrap();
        assert_eq!(json, r#"{"replicas":3}"#);
        let read: ModelUpdate = serde_json::from_str(&json).unwrap();
        assert_eq!(
            (
                read.gpu_selector,
                read.data_parallel_size,
                read.custom_command
            ),
            (None, None, None)
        );
        let clear = ModelUpdate {
            gpu_selector: Some(None),
            ..ModelUpdate::default()
        };
        let json = serde_json::to_string(&clear).unwrap();
        assert_eq!(json, r#"{"gpu_selector":null}"#);
        let read: ModelUpdate = serde_json::from_str(&json).unwrap();
        assert_eq!(read.gpu_selector, Some(None));
    }
}
