//! Staging: files uploaded to the servers, to deploy as `{"type": "upload", "id": …}`.
//!
//! ```text
//! <data_dir>/uploads/<id>/<name>.part   the bytes received so far (appended by PATCH)
//! <data_dir>/uploads/<id>/<name>        the complete file, its SHA-256 checked
//! ```
//!
//! An upload arrives on one server (its row's `location` is `server:<server id>`); a
//! request for it that reaches another server is redirected there. When
//! `s3_upload_bucket` is set, a complete file is copied to `uploads/<id>/<name>` of that
//! bucket and removed from the disk (`location` `s3:<bucket>/<key>`), so every server
//! (and every worker) reaches it however the cluster changes.
//!
//! Workers download an upload through a URL signed with a key derived from the server
//! secret, valid for a day: the path of the content endpoint (which any server checks,
//! serving the file or redirecting to the server holding it), or a presigned S3 URL.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use gantry_source::{S3Config, SourceError, StagedFiles};
use gantry_store::Store;
use gantry_types::{StagedUpload, Timestamp, Upload, UploadState};
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use crate::error::{ApiError, ApiResult};

/// How long a signed download URL works.
const URL_VALIDITY: Duration = Duration::from_secs(24 * 60 * 60);
/// Space kept free beyond an upload's size.
const FREE_SPACE_MARGIN: u64 = 64 << 20;
/// The prefix of uploads' keys in `s3_upload_bucket`.
const S3_PREFIX: &str = "uploads";

/// Where uploads are kept, and the key that signs their download URLs.
pub struct Staging {
    dir: PathBuf,
    server_id: String,
    /// How this server reaches itself: its bound address (loopback for 0.0.0.0).
    self_url: String,
    key: Vec<u8>,
    s3: S3Config,
    bucket: Option<String>,
    /// The largest upload accepted (`upload_max_size`).
    pub max_size: u64,
    /// Uploads a request is writing now.
    writing: Mutex<HashSet<i64>>,
}

/// Marks an upload as being written until dropped.
pub struct Writing<'a> {
    staging: &'a Staging,
    id: i64,
}

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        lock(&self.staging.writing).remove(&self.id);
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl Staging {
    pub fn new(
        dir: PathBuf,
        server_id: String,
        bound: SocketAddr,
        secret: &[u8],
        s3: S3Config,
        bucket: Option<String>,
        max_size: u64,
    ) -> Self {
        let host = match bound.ip() {
            ip if ip.is_unspecified() && ip.is_ipv6() => "[::1]".to_owned(),
            ip if ip.is_unspecified() => "127.0.0.1".to_owned(),
            std::net::IpAddr::V6(ip) => format!("[{ip}]"),
            ip => ip.to_string(),
        };
        let mut key = Sha256::new();
        key.update(b"gantry upload download URLs\n");
        key.update(secret);
        Self {
            dir,
            server_id,
            self_url: format!("http://{host}:{}", bound.port()),
            key: key.finalize().to_vec(),
            s3,
            bucket,
            max_size,
            writing: Mutex::new(HashSet::new()),
        }
    }

    /// Where a new upload's bytes go: this server's disk.
    pub fn here(&self) -> String {
        format!("server:{}", self.server_id)
    }

    pub fn is_here(&self, upload: &Upload) -> bool {
        upload.location == self.here()
    }

    /// The server holding an upload's bytes, when a server does.
    pub fn holder(upload: &Upload) -> Option<&str> {
        upload.location.strip_prefix("server:")
    }

    fn s3_object(upload: &Upload) -> Option<(&str, &str)> {
        upload.location.strip_prefix("s3:")?.split_once('/')
    }

    fn dir_of(&self, id: i64) -> PathBuf {
        self.dir.join(id.to_string())
    }

    pub fn part_of(&self, upload: &Upload) -> PathBuf {
        self.dir_of(upload.id).join(format!("{}.part", upload.name))
    }

    pub fn file_of(&self, upload: &Upload) -> PathBuf {
        self.dir_of(upload.id).join(&upload.name)
    }

    /// Bytes of an upload held here: its partial file's length, or its size when done.
    pub fn received_here(&self, upload: &Upload) -> u64 {
        if upload.state == UploadState::Ready {
            return upload.size;
        }
        std::fs::metadata(self.part_of(upload)).map_or(0, |m| m.len())
    }

    /// Prepares the place of a new upload; refuses when the disk cannot hold it.
    pub async fn prepare(&self, upload: &Upload) -> ApiResult<()> {
        let dir = self.dir_of(upload.id);
        tokio::fs::create_dir_all(&dir)
            .await
            .map_err(|e| ApiError::internal(format!("cannot create {}: {e}", dir.display())))?;
        tokio::fs::File::create(self.part_of(upload))
            .await
            .map_err(|e| ApiError::internal(format!("cannot create the upload's file: {e}")))?;
        Ok(())
    }

    /// Refuses an upload of `size` bytes the disk cannot hold.
    pub fn check_free_space(&self, size: u64) -> ApiResult<()> {
        std::fs::create_dir_all(&self.dir).map_err(|e| {
            ApiError::internal(format!("cannot create {}: {e}", self.dir.display()))
        })?;
        let stat = nix::sys::statvfs::statvfs(&self.dir).map_err(|e| {
            ApiError::internal(format!(
                "cannot read the free space of {}: {e}",
                self.dir.display()
            ))
        })?;
        #[allow(clippy::useless_conversion)] // the field types differ between platforms
        let free = u64::from(stat.blocks_available()) * u64::from(stat.fragment_size());
        if size.saturating_add(FREE_SPACE_MARGIN) > free {
            return Err(ApiError::new(
                gantry_types::ErrorCode::PayloadTooLarge,
                format!(
                    "the upload needs {size} bytes but {} has {free} bytes free on this server; \
                     free some space (or delete unused uploads) and try again",
                    self.dir.display()
                ),
            ));
        }
        Ok(())
    }

    /// Marks `id` as being written; `None` when a request already is.
    pub fn start_writing(&self, id: i64) -> Option<Writing<'_>> {
        lock(&self.writing)
            .insert(id)
            .then_some(Writing { staging: self, id })
    }

    /// Checks the complete file against the declared digest and puts it in its final
    /// place: the disk, or `s3_upload_bucket`. Returns its digest and location; wrong
    /// bytes are deleted (422 naming both digests).
    pub async fn complete(&self, upload: &Upload) -> ApiResult<gantry_store::UploadDone> {
        let part = self.part_of(upload);
        let path = part.clone();
        let digest = tokio::task::spawn_blocking(move || sha256_of(&path))
            .await
            .map_err(|e| ApiError::internal(format!("hashing the upload failed: {e}")))?
            .map_err(|e| ApiError::internal(format!("cannot read {}: {e}", part.display())))?;
        if let Some(expected) = &upload.sha256 {
            if &digest != expected {
                let _ = tokio::fs::remove_file(&part).await;
                let _ = tokio::fs::File::create(&part).await;
                return Err(ApiError::validation(format!(
                    "upload {} ({}) has SHA-256 {digest}, but {expected} was declared; the \
                     bytes were discarded: upload the file again from offset 0",
                    upload.id, upload.name
                )));
            }
        }
        let file = self.file_of(upload);
        tokio::fs::rename(&part, &file)
            .await
            .map_err(|e| ApiError::internal(format!("cannot rename {}: {e}", part.display())))?;
        let location = match &self.bucket {
            None => self.here(),
            Some(bucket) => {
                let key = format!("{S3_PREFIX}/{}/{}", upload.id, upload.name);
                if let Err(e) = gantry_source::s3::put_file(&self.s3, bucket, &key, &file).await {
                    // Back to a complete `.part`: the next PATCH (of nothing, at the full
                    // offset) tries the copy again.
                    let _ = tokio::fs::rename(&file, &part).await;
                    return Err(ApiError::unavailable(format!(
                        "the upload is complete but cannot be copied to s3_upload_bucket: {e}; \
                         send PATCH with Upload-Offset: {} and an empty body to try again",
                        upload.size
                    )));
                }
                let _ = tokio::fs::remove_dir_all(self.dir_of(upload.id)).await;
                format!("s3:{bucket}/{key}")
            }
        };
        tracing::info!(upload_id = upload.id, name = %upload.name, bytes = upload.size, sha256 = %digest, %location, "upload complete");
        Ok(gantry_store::UploadDone {
            sha256: digest,
            location,
        })
    }

    /// Removes an upload's bytes: its files here, or its S3 object.
    pub async fn remove(&self, upload: &Upload) -> ApiResult<()> {
        if let Some((bucket, key)) = Self::s3_object(upload) {
            gantry_source::s3::delete_object(&self.s3, bucket, key)
                .await
                .map_err(|e| ApiError::unavailable(format!("cannot delete the upload: {e}")))?;
        } else if self.is_here(upload) {
            match tokio::fs::remove_dir_all(self.dir_of(upload.id)).await {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(ApiError::internal(format!(
                        "cannot remove the upload's files: {e}"
                    )))
                }
            }
        }
        Ok(())
    }

    fn signature(&self, id: i64, expires: i64) -> Hmac<Sha256> {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.key)
            .unwrap_or_else(|_| unreachable!("HMAC takes a key of any length"));
        mac.update(format!("{id}\n{expires}").as_bytes());
        mac
    }

    /// The path that downloads `id`, signed until a day from now.
    pub fn content_path(&self, id: i64) -> String {
        let duration_ms = i64::try_from(URL_VALIDITY.as_millis()).unwrap_or(i64::MAX);
        let expires = Timestamp::now().as_millis().saturating_add(duration_ms);
        let signature = hex::encode(self.signature(id, expires).finalize().into_bytes());
        format!("/api/v1/model-files/uploads/{id}/content?expires={expires}&signature={signature}")
    }

    /// Whether a download URL's signature is this cluster's and has not expired.
    pub fn verify(&self, id: i64, expires: i64, signature: &str) -> bool {
        let Ok(signature) = hex::decode(signature) else {
            return false;
        };
        expires >= Timestamp::now().as_millis()
            && self.signature(id, expires).verify_slice(&signature).is_ok()
    }

    /// Where a worker (`base`: the URL it reached a server at, `None` for a path) or
    /// this server (`base`: the holder's) downloads a complete upload.
    pub async fn staged(&self, upload: &Upload, base: Option<&str>) -> ApiResult<StagedUpload> {
        let sha256 = match (&upload.state, &upload.sha256) {
            (UploadState::Ready, Some(sha256)) => sha256.clone(),
            _ => {
                return Err(ApiError::conflict(format!(
                    "upload {} ({}) is not complete: {} of {} bytes received",
                    upload.id, upload.name, upload.bytes_received, upload.size
                )))
            }
        };
        let url = match Self::s3_object(upload) {
            Some((bucket, key)) => gantry_source::s3::presign_get(&self.s3, bucket, key)
                .await
                .map_err(|e| ApiError::unavailable(format!("cannot sign the upload's URL: {e}")))?,
            None => format!(
                "{}{}",
                base.unwrap_or_default(),
                self.content_path(upload.id)
            ),
        };
        Ok(StagedUpload {
            id: upload.id,
            name: upload.name.clone(),
            size: upload.size,
            sha256,
            url,
        })
    }

    /// The URL of the server holding `upload`, from the registry.
    pub async fn holder_url(&self, store: &Store, upload: &Upload) -> ApiResult<String> {
        let holder = Self::holder(upload).unwrap_or_default();
        if holder == self.server_id {
            return Ok(self.self_url.clone());
        }
        let servers = store.list_servers().await?;
        servers
            .into_iter()
            .find(|s| s.server_id == holder)
            .map(|s| s.url)
            .ok_or_else(|| {
                ApiError::unavailable(format!(
                    "upload {} is kept on server {holder}, which is not running; start it again \
                     (set s3_upload_bucket so that uploads outlive the server they reached)",
                    upload.id
                ))
            })
    }
}

/// What the server's own model analysis reads uploads through.
pub struct ServerStaged {
    pub store: Store,
    pub staging: Arc<Staging>,
}

impl StagedFiles for ServerStaged {
    fn describe(&self, id: i64) -> BoxFuture<'_, Result<StagedUpload, SourceError>> {
        Box::pin(async move {
            let failed = |e: ApiError| SourceError::Invalid(e.message);
            let upload = self
                .store
                .get_upload(id)
                .await
                .map_err(|e| SourceError::Invalid(format!("upload {id}: {e}")))?;
            let base = match Staging::holder(&upload) {
                Some(_) => Some(
                    self.staging
                        .holder_url(&self.store, &upload)
                        .await
                        .map_err(|e| SourceError::Unavailable(e.message))?,
                ),
                None => None,
            };
            self.staging
                .staged(&upload, base.as_deref())
                .await
                .map_err(failed)
        })
    }
}

fn sha256_of(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut file = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buffer)?;
        if n == 0 {
            break;
        }
        hasher.update(&buffer[..n]);
    }
    Ok(hex::encode(hasher.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn staging(secret: &[u8]) -> Staging {
        Staging::new(
            PathBuf::from("/nonexistent"),
            "a".into(),
            "0.0.0.0:8080".parse().unwrap_or_else(|_| unreachable!()),
            secret,
            S3Config::default(),
            None,
            1 << 30,
        )
    }

    fn query(path: &str, name: &str) -> String {
        path.split(['?', '&'])
            .find_map(|p| p.strip_prefix(&format!("{name}=")))
            .unwrap_or_default()
            .to_owned()
    }

    #[test]
    fn download_urls_are_signed_per_upload_and_expire() {
        let staging = staging(b"one secret of the cluster, long enough");
        assert_eq!(staging.self_url, "http://127.0.0.1:8080");
        let path = staging.content_path(7);
        assert!(
            path.starts_with("/api/v1/model-files/uploads/7/content?"),
            "{path}"
        );
        let expires: i64 = query(&path, "expires").parse().unwrap_or_default();
        let signature = query(&path, "signature");
        assert!(staging.verify(7, expires, &signature));
        assert!(!staging.verify(8, expires, &signature), "another upload");
        assert!(
            !staging.verify(7, expires + 1, &signature),
            "another expiry"
        );
        assert!(!staging.verify(7, expires, "zz"), "not hex");
        let other = super::tests::staging(b"another cluster's secret, long enough");
        assert!(!other.verify(7, expires, &signature), "another secret");
        let past = Timestamp::now().as_millis() - 1;
        let old = hex::encode(staging.signature(7, past).finalize().into_bytes());
        assert!(!staging.verify(7, past, &old), "expired");
    }
}
