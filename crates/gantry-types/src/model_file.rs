//! Model files: what the workers' caches hold (`GET /api/v1/model-files`).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::Timestamp;

/// Where a cached file stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ModelFileState {
    /// Complete and verified.
    Ready,
    /// Being downloaded now.
    Downloading,
    /// An interrupted download, resumed when a model needs the file again.
    Partial,
    /// Its last download failed (`error` says why).
    Error,
}

/// One file in a worker's model cache, as the worker reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CachedModelFile {
    /// The file's name in the cache: `sha256-<hex>` (verified by its SHA-256) or another
    /// content name; what `DELETE` takes.
    pub blob: String,
    /// Its paths in model directories: `<source key>/<path in the model>`, such as
    /// `hf/Qwen/Qwen2.5-0.5B-Instruct-GGUF/<commit>/qwen2.5-0.5b-instruct-q4_k_m.gguf`.
    pub names: Vec<String>,
    pub state: ModelFileState,
    /// Its full size in bytes (when known; for a partial file, the bytes on disk
    /// otherwise).
    pub size: u64,
    /// Bytes on disk.
    pub bytes_done: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Models with an instance on this worker that uses the file.
    pub models: Vec<String>,
    /// When an instance last fetched it (what eviction under `model_cache_max` goes by).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_used_at: Option<Timestamp>,
}

/// A cached file and the worker that holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ModelFile {
    /// `<worker id>/<blob>`: what `DELETE /api/v1/model-files/{worker_id}/{blob}` names.
    pub id: String,
    pub worker_id: i64,
    pub worker_name: String,
    #[serde(flatten)]
    pub file: CachedModelFile,
}

/// `GET /api/v1/model-files`: every ready worker's files, and the workers that did not
/// answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ModelFileList {
    pub items: Vec<ModelFile>,
    /// Workers asked that did not answer, with why.
    pub unreachable: Vec<UnreachableWorker>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct UnreachableWorker {
    pub worker_id: i64,
    pub worker_name: String,
    pub error: String,
}
