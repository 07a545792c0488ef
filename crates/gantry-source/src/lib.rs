//! Model sources: where a model's files are, reading their headers without downloading
//! them, and downloading them into a worker's cache.
//!
//! - [`Sources::resolve`] turns a [`ModelSource`] into the list of files it stands for
//!   ([`Resolved`]): for Hugging Face through the hub's API (`hub.rs`: the revision's
//!   commit, the file tree with sizes and LFS SHA-256s, globs and split GGUF parts), for
//!   URLs with a `HEAD` per file (`url.rs`), for S3 by listing a prefix and presigning a
//!   URL per object (`s3.rs`).
//! - [`Sources::gguf_header`] and [`Sources::read_range`] read what the scheduler needs to
//!   estimate memory with HTTP range requests (`remote.rs`): the GGUF header, the
//!   safetensors headers, `config.json` — a few megabytes, never the weights.
//! - [`cache::ModelCache`] downloads the files a worker was given into a content-addressed
//!   cache (`cache.rs`): resumable from the bytes on disk, verified against the SHA-256
//!   before a file is renamed into place, retried with backoff, one download per file
//!   however many instances want it, with the free space checked first; large files
//!   in parallel ranges (`parallel.rs`).
//!
//! `upload` sources are files staged on the servers: [`StagedFiles`] (set with
//! [`Sources::set_staged`]) says where to download one — the worker asks its server, a
//! server looks in the database.
//!
//! `local_path` sources are not handled here: their files are already on the worker.

pub mod cache;
mod error;
pub mod files;
pub mod glob;
mod hub;
mod modelscope;
pub mod parallel;
mod remote;
pub mod s3;
mod url;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures_util::future::BoxFuture;
use gantry_types::{BackendKind, ModelSource, StagedUpload};

pub use error::SourceError;

/// The public Hugging Face Hub.
pub const DEFAULT_HF_ENDPOINT: &str = "https://huggingface.co";

/// The public ModelScope hub.
pub const DEFAULT_MODELSCOPE_ENDPOINT: &str = "https://www.modelscope.cn";

/// The S3 region when none is configured.
pub const DEFAULT_S3_REGION: &str = "us-east-1";

/// How to reach the places models come from.
#[derive(Clone)]
pub struct SourceConfig {
    /// Base URL of the Hugging Face Hub (or a mirror speaking its API).
    pub hf_endpoint: String,
    /// Sent to the hub as a bearer token (gated and private repositories). A secret:
    /// never logged.
    pub hf_token: Option<String>,
    /// Base URL of the ModelScope hub.
    pub modelscope_endpoint: String,
    pub s3: S3Config,
}

/// The S3-compatible store of `s3` sources.
#[derive(Clone, Default)]
pub struct S3Config {
    /// The store's URL (path-style addressing); AWS S3 of `region` when absent.
    pub endpoint: Option<String>,
    pub region: String,
    pub access_key: Option<String>,
    /// A secret: never logged.
    pub secret_key: Option<String>,
}

/// Shows a secret's presence, never its value.
fn secret(value: &Option<String>) -> Option<&'static str> {
    value.as_ref().map(|_| "<secret>")
}

impl std::fmt::Debug for SourceConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SourceConfig")
            .field("hf_endpoint", &self.hf_endpoint)
            .field("hf_token", &secret(&self.hf_token))
            .field("modelscope_endpoint", &self.modelscope_endpoint)
            .field("s3", &self.s3)
            .finish()
    }
}

impl std::fmt::Debug for S3Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Config")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("access_key", &self.access_key)
            .field("secret_key", &secret(&self.secret_key))
            .finish()
    }
}

impl Default for SourceConfig {
    fn default() -> Self {
        Self {
            hf_endpoint: DEFAULT_HF_ENDPOINT.to_owned(),
            hf_token: None,
            modelscope_endpoint: DEFAULT_MODELSCOPE_ENDPOINT.to_owned(),
            s3: S3Config {
                region: DEFAULT_S3_REGION.to_owned(),
                ..S3Config::default()
            },
        }
    }
}

/// One file of a model, where to get it, and what it must be.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RemoteFile {
    /// Its path inside the model's directory (the repository path, or the URL's file
    /// name).
    pub path: String,
    pub url: String,
    /// Its size, when the source says.
    pub size: Option<u64>,
    /// Its SHA-256 (lowercase hex), when the source says: the hub's LFS metadata, or the
    /// model's `sha256`.
    pub sha256: Option<String>,
    /// Whether requests for it carry the hub token.
    pub hub_auth: bool,
    /// Its MD5 (lowercase hex), when the source says: an S3 object's ETag, when that is
    /// one (a single-part upload without SSE-KMS or SSE-C). Checked like `sha256`.
    pub md5: Option<String>,
    /// Names the file in the cache when it has no SHA-256 and its URL is not stable (a
    /// presigned S3 URL changes at every signing): the store, bucket, key and ETag of an
    /// S3 object. `None`: the URL names it.
    pub cache_id: Option<String>,
}

/// What a source stands for: its files, in order (the first GGUF part first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// Names the set of files in the cache: `hf/<repo>/<commit>`, `url/<digest>` or
    /// `s3/<bucket>/<key>/<digest of the objects' ETags>`.
    pub key: String,
    /// The hub's commit of the revision asked for.
    pub commit: Option<String>,
    pub files: Vec<RemoteFile>,
}

impl Resolved {
    /// Bytes of every file, when all sizes are known.
    pub fn total_size(&self) -> Option<u64> {
        self.files.iter().map(|f| f.size).sum()
    }

    /// The position of the first GGUF file (the first part of a split one).
    pub fn first_gguf_index(&self) -> Option<usize> {
        self.files.iter().position(|f| f.path.ends_with(".gguf"))
    }

    /// The first GGUF file (the first part of a split one).
    pub fn first_gguf(&self) -> Option<&RemoteFile> {
        self.first_gguf_index().map(|i| &self.files[i])
    }
}

/// Where the files uploaded to the servers (`upload` sources) are downloaded from.
pub trait StagedFiles: Send + Sync {
    /// The upload's name, size, SHA-256 and an absolute URL to `GET` it from.
    fn describe(&self, id: i64) -> BoxFuture<'_, Result<StagedUpload, SourceError>>;
}

/// How long one request for metadata or a header may take.
const META_TIMEOUT: Duration = Duration::from_secs(30);

/// A client of the model sources. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Sources {
    config: SourceConfig,
    http: reqwest::Client,
    /// Set once, by whoever knows where uploads are (shared by every clone).
    staged: Arc<OnceLock<Arc<dyn StagedFiles>>>,
}

impl std::fmt::Debug for dyn StagedFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StagedFiles")
    }
}

impl Sources {
    pub fn new(config: SourceConfig) -> Self {
        let http = reqwest::Client::builder()
            .user_agent(concat!("gantry/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(Duration::from_secs(10))
            .build()
            .unwrap_or_default();
        Self {
            config,
            http,
            staged: Arc::default(),
        }
    }

    /// Says where `upload` sources are; the first call wins (clones share it).
    pub fn set_staged(&self, staged: Arc<dyn StagedFiles>) {
        let _ = self.staged.set(staged);
    }

    pub fn config(&self) -> &SourceConfig {
        &self.config
    }

    /// The files `source` stands for, for `backend`. `local_path` is refused: its files
    /// are read where they are.
    pub async fn resolve(
        &self,
        source: &ModelSource,
        backend: BackendKind,
    ) -> Result<Resolved, SourceError> {
        match source {
            ModelSource::Huggingface {
                repo_id,
                file,
                revision,
            } => {
                hub::resolve(
                    self,
                    repo_id,
                    file.as_deref(),
                    revision.as_deref().unwrap_or("main"),
                    backend,
                )
                .await
            }
            ModelSource::Modelscope {
                repo_id,
                file,
                revision,
            } => {
                modelscope::resolve(
                    self,
                    repo_id,
                    file.as_deref(),
                    revision.as_deref().unwrap_or("master"),
                    backend,
                )
                .await
            }
            ModelSource::S3 { bucket, key } => s3::resolve(self, bucket, key, backend).await,
            ModelSource::Url { url, sha256 } => {
                let digests = sha256.as_ref().map(|d| d.items());
                url::resolve(self, &url.items(), digests.as_deref()).await
            }
            ModelSource::Upload { id } => self.resolve_upload(*id).await,
            ModelSource::LocalPath { path } => Err(SourceError::Invalid(format!(
                "source local_path ({path}) has nothing to download"
            ))),
        }
    }

    /// An uploaded file: one file, named by its SHA-256 in the cache.
    async fn resolve_upload(&self, id: i64) -> Result<Resolved, SourceError> {
        let staged = self.staged.get().ok_or_else(|| {
            SourceError::Invalid(format!(
                "upload {id} cannot be fetched here: nothing says where uploads are"
            ))
        })?;
        let upload = staged.describe(id).await?;
        Ok(Resolved {
            key: format!("upload/{id}"),
            commit: None,
            files: vec![RemoteFile {
                path: upload.name,
                url: upload.url,
                size: Some(upload.size),
                sha256: Some(upload.sha256),
                ..Default::default()
            }],
        })
    }

    /// A request for `file`, with the hub token when it needs one.
    fn get(&self, url: &str, hub_auth: bool) -> reqwest::RequestBuilder {
        let request = self.http.get(url);
        self.authorize(request, hub_auth)
    }

    /// Passes a successful answer for `file`; turns an error answer into the error of its
    /// kind of source (the hub's codes for a hub file, the plain status for a URL).
    async fn check_file_status(
        &self,
        response: reqwest::Response,
        file: &RemoteFile,
    ) -> Result<reqwest::Response, SourceError> {
        if file.hub_auth {
            let has_token = self.config.hf_token.is_some();
            return hub::check_status(response, &file.url, &file.path, has_token).await;
        }
        let shown = error::shown_url(&file.url);
        if file.cache_id.is_some() && matches!(response.status().as_u16(), 401 | 403) {
            // An S3 object's presigned URL: refused when it expired or the keys changed.
            return Err(SourceError::Unauthorized(format!(
                "{shown} answered {}: the store refused the signed URL (it expires after \
                 12 h, or s3_access_key/s3_secret_key changed); the download is signed again \
                 when the instance is retried",
                response.status()
            )));
        }
        url::check_status(response, &shown)
    }

    fn authorize(
        &self,
        request: reqwest::RequestBuilder,
        hub_auth: bool,
    ) -> reqwest::RequestBuilder {
        match (&self.config.hf_token, hub_auth) {
            (Some(token), true) => request.bearer_auth(token),
            _ => request,
        }
    }
}
