//! Model files: what the workers' caches hold (`GET /api/v1/model-files`), and files
//! uploaded to the servers (`/api/v1/model-files/uploads`).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::validate::check_text;
use crate::{FieldError, Timestamp, Validate};

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

/// Where an upload stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum UploadState {
    /// Receiving bytes: `PATCH` continues it from `bytes_received`.
    Uploading,
    /// Complete, its SHA-256 checked: models may use it as `{"type": "upload", "id": …}`.
    Ready,
}

/// A file uploaded to the servers, to deploy as a model's source.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Upload {
    pub id: i64,
    /// The file's name (what the worker calls it; `.gguf` for llama.cpp).
    pub name: String,
    /// Its size in bytes, declared when the upload was created.
    pub size: u64,
    /// Bytes received so far: where the next `PATCH` starts (`Upload-Offset`).
    pub bytes_received: u64,
    pub state: UploadState,
    /// The SHA-256 (lowercase hex): the one declared, checked when the last byte
    /// arrives; computed then when none was declared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// Where the bytes are kept: `server:<server id>` (its data directory) or
    /// `s3:<bucket>/<key>` (shared by every server).
    pub location: String,
    /// Who created it.
    pub created_by: i64,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

/// `POST /api/v1/model-files/uploads`: a file to be uploaded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UploadCreate {
    /// A file name: 1 to 250 bytes (file systems count a name's bytes, and the server
    /// keeps a partial upload as `<name>.part`), no '/', not starting with '.'.
    #[schema(
        min_length = 1,
        max_length = 250,
        pattern = r"^[^./\\\x00-\x08\x0B-\x1F\x7F-\x9F][^/\\\x00-\x08\x0B-\x1F\x7F-\x9F]*$"
    )]
    pub name: String,
    /// Its size in bytes (at most the server's `upload_max_size`).
    #[schema(value_type = i64, minimum = 1)]
    pub size: u64,
    /// Its SHA-256 (64 hexadecimal characters), checked when the last byte arrives.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^[0-9a-fA-F]{64}$")]
    pub sha256: Option<String>,
}

impl Validate for UploadCreate {
    fn validate(&self) -> Result<(), FieldError> {
        check_text("name", &self.name, 250)?;
        if self.name.len() > 250 {
            return Err(FieldError::new(
                "name",
                format!(
                    "is {} bytes long; a file name may have at most 250 (file systems count \
                     bytes, not characters)",
                    self.name.len()
                ),
            ));
        }
        if self.name.is_empty()
            || self.name.starts_with('.')
            || self.name.contains(['/', '\\', '\0'])
        {
            return Err(FieldError::new(
                "name",
                "must be a file name: not empty, no '/', not starting with '.'",
            ));
        }
        if self.size == 0 {
            return Err(FieldError::new("size", "must be at least 1 byte"));
        }
        if i64::try_from(self.size).is_err() {
            return Err(FieldError::new(
                "size",
                "must be at most 9223372036854775807",
            ));
        }
        if let Some(digest) = &self.sha256 {
            if digest.len() != 64 || !digest.chars().all(|c| c.is_ascii_hexdigit()) {
                return Err(FieldError::new(
                    "sha256",
                    "must be 64 hexadecimal characters",
                ));
            }
        }
        Ok(())
    }
}

/// Uploads, newest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct UploadList {
    pub items: Vec<Upload>,
}

/// What a worker needs to download an upload (`GET /api/v1/worker/uploads/{id}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct StagedUpload {
    pub id: i64,
    pub name: String,
    pub size: u64,
    pub sha256: String,
    /// Where to `GET` it (ranges honoured), signed and valid for a day: a path on the
    /// server that answered (join it with that server's URL), or an absolute URL (a
    /// presigned S3 URL).
    pub url: String,
}
