//! The worker's model cache: downloads the files of a [`Resolved`] source, resumably and
//! verified, and lays them out as a directory the backend can load.
//!
//! ```text
//! <root>/blobs/sha256-<hex>          a complete file, its SHA-256 checked
//! <root>/blobs/url-<hex>             a complete file whose digest nobody gave (size checked)
//! <root>/blobs/id-<hex>              a complete file named by its source, not its URL
//!                                    (an S3 object: store, bucket, key, ETag); size and
//!                                    MD5 (the ETag) checked when known
//! <root>/partial/<blob>.part         a download in progress: resumed from its length
//! <root>/snapshots/<key>/<path>      symlinks to the blobs, as the model's directory
//! ```
//!
//! A file is written under `partial/`, hashed as it arrives, and renamed into `blobs/`
//! only when its size and digest are right; wrong bytes are deleted and fetched again
//! (at most [`CORRUPT_RETRIES`] times), then the download fails naming both digests. An
//! interrupted download — a network error, a restart, a `kill -9` — continues from the
//! bytes on disk with a range request; network errors are retried with backoff. Two
//! instances that need one file share one download (a lock per blob), and a file already
//! in `blobs/` is never fetched again, whichever model asked for it. Before anything is
//! fetched the free space is checked against what is still missing.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use md5::Md5;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::error::{shown_url, unavailable};
use crate::files::{blob_file_name, Books};
use crate::parallel::{self, partial_bytes, Parallel};
use crate::{RemoteFile, Resolved, SourceError, Sources};

/// How often wrong bytes are fetched again before the download fails.
pub const CORRUPT_RETRIES: u32 = 2;
/// How often a network failure is retried (each try resumes) before the download fails.
pub const NETWORK_RETRIES: u32 = 6;
const BACKOFF_START: Duration = Duration::from_millis(500);
const BACKOFF_MAX: Duration = Duration::from_secs(15);
/// A download that receives nothing for this long is treated as broken (and resumed).
pub(crate) const STALL_TIMEOUT: Duration = Duration::from_secs(60);
/// How often progress is measured.
const PROGRESS_TICK: Duration = Duration::from_millis(500);
/// Space kept free beyond what the files need.
const FREE_SPACE_MARGIN: u64 = 64 << 20;

/// How far a fetch is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Progress {
    /// Bytes on disk across every file, complete or partial.
    pub bytes_done: u64,
    /// Bytes of every file, when every size is known.
    pub bytes_total: Option<u64>,
    /// Speed over the last few seconds.
    pub bytes_per_second: u64,
}

/// A fetched model: its directory and its files, in the order of the source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetched {
    pub dir: PathBuf,
    pub files: Vec<PathBuf>,
    /// The blobs behind the files (what [`ModelCache::hold`] keeps from eviction).
    pub blobs: Vec<String>,
}

/// The cache of one worker. Cheap to share (`Arc`).
#[derive(Debug)]
pub struct ModelCache {
    pub(crate) root: PathBuf,
    sources: Sources,
    /// One lock per blob, so one download serves every instance that wants the file.
    pub(crate) locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Who uses which blob, failed downloads, the size cap (`files.rs`).
    pub(crate) books: Books,
    /// How large files are split over several connections (`parallel.rs`).
    parallel: Parallel,
}

impl ModelCache {
    pub fn new(root: PathBuf, sources: Sources) -> Self {
        Self {
            root,
            sources,
            locks: Mutex::new(HashMap::new()),
            books: Books::default(),
            parallel: Parallel::default(),
        }
    }

    /// Sets how many connections one file may use and how small its segments may get.
    pub fn with_parallel(mut self, parallel: Parallel) -> Self {
        self.parallel = parallel;
        self
    }

    /// Caps the bytes of complete files kept: before a download, the least recently used
    /// files that no instance holds are evicted to make room.
    pub fn with_max_bytes(mut self, max: Option<u64>) -> Self {
        self.books.max_bytes = max;
        self
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The client the cache downloads with (to resolve sources, too).
    pub fn sources(&self) -> &Sources {
        &self.sources
    }

    /// Downloads what is missing of `resolved` and returns its directory; `progress`
    /// is updated every half second while it works.
    pub async fn fetch(
        &self,
        resolved: &Resolved,
        progress: &watch::Sender<Progress>,
        cancel: &CancellationToken,
    ) -> Result<Fetched, SourceError> {
        for dir in ["blobs", "partial", "snapshots"] {
            create_dir(&self.root.join(dir)).await?;
        }
        let plan: Vec<(RemoteFile, PathBuf, PathBuf)> = resolved
            .files
            .iter()
            .map(|f| {
                let blob = blob_name(f);
                let part = self.root.join("partial").join(format!("{blob}.part"));
                (f.clone(), self.root.join("blobs").join(&blob), part)
            })
            .collect();
        self.make_room(resolved, &plan).await?;
        self.check_free_space(&plan).await?;

        let ticker = {
            let total = resolved.total_size();
            let plan: Vec<(Option<u64>, PathBuf, PathBuf)> = plan
                .iter()
                .map(|(f, blob, part)| (f.size, blob.clone(), part.clone()))
                .collect();
            let progress = progress.clone();
            let stop = cancel.child_token();
            let guard = stop.clone().drop_guard();
            tokio::spawn(async move {
                let mut samples: Vec<(Instant, u64)> = Vec::new();
                loop {
                    let done = bytes_on_disk(&plan).await;
                    let now = Instant::now();
                    samples.push((now, done));
                    samples.retain(|(at, _)| now.duration_since(*at) <= Duration::from_secs(5));
                    let speed = match (samples.first(), samples.last()) {
                        (Some((t0, b0)), Some((t1, b1))) if t1 > t0 => {
                            let seconds = t1.duration_since(*t0).as_secs_f64();
                            (b1.saturating_sub(*b0) as f64 / seconds) as u64
                        }
                        _ => 0,
                    };
                    progress.send_replace(Progress {
                        bytes_done: done,
                        bytes_total: total,
                        bytes_per_second: speed,
                    });
                    tokio::select! {
                        () = stop.cancelled() => return,
                        () = tokio::time::sleep(PROGRESS_TICK) => {}
                    }
                }
            });
            guard
        };

        for (file, blob, part) in &plan {
            let name = blob_file_name(blob);
            match self.ensure_blob(file, blob, part, cancel).await {
                Ok(()) => self.books.succeeded(&name, blob).await,
                Err(e) => {
                    self.books.failed(&name, &e);
                    return Err(e);
                }
            }
        }
        drop(ticker);
        let done = plan.iter().map(|(f, _, _)| f.size.unwrap_or(0)).sum();
        progress.send_replace(Progress {
            bytes_done: done,
            bytes_total: Some(done),
            bytes_per_second: 0,
        });

        let dir = self.root.join("snapshots").join(&resolved.key);
        let mut files = Vec::with_capacity(plan.len());
        for (file, blob, _) in &plan {
            let link = dir.join(&file.path);
            if let Some(parent) = link.parent() {
                create_dir(parent).await?;
            }
            link_to(blob, &link).await?;
            files.push(link);
        }
        let blobs = plan
            .iter()
            .map(|(_, blob, _)| blob_file_name(blob))
            .collect();
        Ok(Fetched { dir, files, blobs })
    }

    /// Refuses to start when the disk cannot hold what is still missing.
    async fn check_free_space(
        &self,
        plan: &[(RemoteFile, PathBuf, PathBuf)],
    ) -> Result<(), SourceError> {
        let mut needed = 0u64;
        for (file, blob, part) in plan {
            if tokio::fs::metadata(blob).await.is_ok() {
                continue;
            }
            let have = partial_bytes(part);
            needed = needed.saturating_add(file.size.unwrap_or(0).saturating_sub(have));
        }
        if needed == 0 {
            return Ok(());
        }
        let stat = nix::sys::statvfs::statvfs(&self.root).map_err(|e| {
            SourceError::Disk(format!(
                "cannot read the free space of {}: {e}",
                self.root.display()
            ))
        })?;
        #[allow(clippy::useless_conversion)] // the field types differ between platforms
        let free = u64::from(stat.blocks_available()) * u64::from(stat.fragment_size());
        if needed.saturating_add(FREE_SPACE_MARGIN) > free {
            return Err(SourceError::Disk(format!(
                "the model needs {needed} more bytes but {} has {free} bytes free; free some \
                 space (or delete unused model files) and the instance is retried",
                self.root.display()
            )));
        }
        Ok(())
    }

    /// Makes `blob` exist with the right bytes, downloading it when missing.
    async fn ensure_blob(
        &self,
        file: &RemoteFile,
        blob: &Path,
        part: &Path,
        cancel: &CancellationToken,
    ) -> Result<(), SourceError> {
        if complete(blob, file.size).await {
            return Ok(());
        }
        let lock = {
            let mut locks = self.locks.lock().unwrap_or_else(|e| e.into_inner());
            Arc::clone(locks.entry(blob.display().to_string()).or_default())
        };
        let _held = tokio::select! {
            held = lock.lock() => held,
            () = cancel.cancelled() => return Err(SourceError::Cancelled),
        };
        // Another instance may have fetched it while this one waited.
        if complete(blob, file.size).await {
            return Ok(());
        }
        let mut backoff = BACKOFF_START;
        let (mut network_failures, mut corrupt) = (0u32, 0u32);
        loop {
            let attempt = match self.parallel.applies(file, part).await {
                Some(size) => self.download_ranges(file, size, blob, part, cancel).await,
                None => self.download_once(file, blob, part, cancel).await,
            };
            match attempt {
                Ok(()) => return Ok(()),
                Err(SourceError::Corrupt(message)) if corrupt < CORRUPT_RETRIES => {
                    corrupt += 1;
                    tracing::warn!(file = %file.path, attempt = corrupt, %message, "downloaded bytes are wrong; fetching again");
                }
                Err(e) if e.is_transient() && network_failures < NETWORK_RETRIES => {
                    network_failures += 1;
                    tracing::warn!(file = %file.path, error = %e, retry_in = ?backoff, "download interrupted; resuming");
                    tokio::select! {
                        () = tokio::time::sleep(backoff) => {}
                        () = cancel.cancelled() => return Err(SourceError::Cancelled),
                    }
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// One try: continues `part` from its length, checks size and digest, renames it to
    /// `blob`.
    async fn download_once(
        &self,
        file: &RemoteFile,
        blob: &Path,
        part: &Path,
        cancel: &CancellationToken,
    ) -> Result<(), SourceError> {
        let disk = |e: std::io::Error| SourceError::Disk(format!("{}: {e}", part.display()));
        let mut have = tokio::fs::metadata(part).await.map_or(0, |m| m.len());
        if file.size.is_some_and(|size| have > size) {
            have = 0;
        }
        let mut hasher = Hashers::new(file);
        if have > 0 {
            hash_prefix(part, have, &mut hasher).await.map_err(disk)?;
        }
        let mut request = self.sources.get(&file.url, file.hub_auth);
        if have > 0 {
            request = request.header(reqwest::header::RANGE, format!("bytes={have}-"));
        }
        let mut response = request
            .send()
            .await
            .map_err(|e| unavailable(&file.url, &e))?;
        let status = response.status();
        let append = match status.as_u16() {
            206 => {
                let start = content_range_start(response.headers());
                if start != Some(have) {
                    return Err(SourceError::Unavailable(format!(
                        "{} resumed at byte {start:?}, not {have}",
                        shown_url(&file.url)
                    )));
                }
                true
            }
            200 => false,
            416 if file.size == Some(have) => true,
            416 => {
                tokio::fs::remove_file(part).await.map_err(disk)?;
                return Err(SourceError::Unavailable(format!(
                    "{} refused to resume at byte {have}; starting over",
                    shown_url(&file.url)
                )));
            }
            _ => {
                self.sources.check_file_status(response, file).await?;
                return Err(SourceError::Unavailable(format!(
                    "{} answered {status}",
                    shown_url(&file.url)
                )));
            }
        };
        if !append {
            have = 0;
            hasher = Hashers::new(file);
        }
        let mut out = tokio::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .append(append)
            .truncate(!append)
            .open(part)
            .await
            .map_err(disk)?;
        if status.as_u16() != 416 {
            loop {
                let chunk = tokio::select! {
                    () = cancel.cancelled() => {
                        out.flush().await.map_err(disk)?;
                        return Err(SourceError::Cancelled);
                    }
                    chunk = tokio::time::timeout(STALL_TIMEOUT, response.chunk()) => chunk,
                };
                let chunk = match chunk {
                    Err(_) => {
                        out.flush().await.map_err(disk)?;
                        return Err(SourceError::Unavailable(format!(
                            "{}: nothing received for {STALL_TIMEOUT:?}",
                            shown_url(&file.url)
                        )));
                    }
                    Ok(Err(e)) => {
                        out.flush().await.map_err(disk)?;
                        return Err(unavailable(&file.url, &e));
                    }
                    Ok(Ok(None)) => break,
                    Ok(Ok(Some(chunk))) => chunk,
                };
                out.write_all(&chunk).await.map_err(disk)?;
                hasher.update(&chunk);
                have += chunk.len() as u64;
            }
        }
        out.flush().await.map_err(disk)?;
        out.sync_all().await.map_err(disk)?;
        drop(out);
        commit(file, part, blob, have, hasher).await
    }

    /// One try in parallel ranges (`parallel.rs`), then the whole file hashed and
    /// checked; in one piece when the server ignores ranges.
    async fn download_ranges(
        &self,
        file: &RemoteFile,
        size: u64,
        blob: &Path,
        part: &Path,
        cancel: &CancellationToken,
    ) -> Result<(), SourceError> {
        let fetched =
            parallel::fetch(&self.sources, self.parallel, file, size, part, cancel).await?;
        if let parallel::Fetched::NoRanges = fetched {
            return self.download_once(file, blob, part, cancel).await;
        }
        let disk = |e: std::io::Error| SourceError::Disk(format!("{}: {e}", part.display()));
        let mut hasher = Hashers::new(file);
        hash_prefix(part, size, &mut hasher).await.map_err(disk)?;
        let part_file = tokio::fs::File::open(part).await.map_err(disk)?;
        part_file.sync_all().await.map_err(disk)?;
        commit(file, part, blob, size, hasher).await
    }
}

/// Checks a downloaded file — its size (`have` bytes), MD5 and SHA-256 against what the
/// source lists — and renames it from `part` to `blob`; wrong bytes are deleted.
async fn commit(
    file: &RemoteFile,
    part: &Path,
    blob: &Path,
    have: u64,
    hasher: Hashers,
) -> Result<(), SourceError> {
    let disk = |e: std::io::Error| SourceError::Disk(format!("{}: {e}", part.display()));
    if let Some(size) = file.size {
        if have < size {
            return Err(SourceError::Unavailable(format!(
                "{} ended after {have} of {size} bytes",
                shown_url(&file.url)
            )));
        }
        if have > size {
            tokio::fs::remove_file(part).await.map_err(disk)?;
            return Err(SourceError::Corrupt(format!(
                "{}: received {have} bytes where the source lists {size}",
                file.path
            )));
        }
    }
    let (digest, md5) = hasher.finalize();
    if let (Some(expected), Some(md5)) = (&file.md5, &md5) {
        if md5 != expected {
            tokio::fs::remove_file(part).await.map_err(disk)?;
            return Err(SourceError::Corrupt(format!(
                "{}: the downloaded bytes have MD5 {md5}, but the source lists {expected} \
                     (its ETag); the file was deleted",
                file.path
            )));
        }
    }
    if let Some(expected) = &file.sha256 {
        if &digest != expected {
            tokio::fs::remove_file(part).await.map_err(disk)?;
            return Err(SourceError::Corrupt(format!(
                "{}: the downloaded bytes have SHA-256 {digest}, but the source lists \
                     {expected}; the file was deleted",
                file.path
            )));
        }
    }
    tokio::fs::rename(part, blob).await.map_err(disk)?;
    tracing::info!(file = %file.path, bytes = have, sha256 = %digest, "downloaded model file");
    Ok(())
}

/// The blob a file is kept as: by SHA-256 when known, else by the identity its source
/// gave (an S3 object's, whose presigned URL changes at every signing), else by URL.
pub(crate) fn blob_name(file: &RemoteFile) -> String {
    match (&file.sha256, &file.cache_id) {
        (Some(digest), _) => format!("sha256-{digest}"),
        (None, Some(id)) => format!("id-{}", hex::encode(Sha256::digest(id.as_bytes()))),
        (None, None) => format!("url-{}", hex::encode(Sha256::digest(file.url.as_bytes()))),
    }
}

/// The digests of a download, computed as its bytes arrive: always SHA-256 (logged, and
/// checked when the source gives one), MD5 only when the source gives one to check.
struct Hashers {
    sha256: Sha256,
    md5: Option<Md5>,
}

impl Hashers {
    fn new(file: &RemoteFile) -> Self {
        Self {
            sha256: Sha256::new(),
            md5: file.md5.as_ref().map(|_| Md5::new()),
        }
    }

    fn update(&mut self, bytes: &[u8]) {
        self.sha256.update(bytes);
        if let Some(md5) = &mut self.md5 {
            md5.update(bytes);
        }
    }

    /// The SHA-256 and (when computed) the MD5, lowercase hex.
    fn finalize(self) -> (String, Option<String>) {
        let md5 = self.md5.map(|md5| hex::encode(md5.finalize()));
        (hex::encode(self.sha256.finalize()), md5)
    }
}

async fn complete(blob: &Path, size: Option<u64>) -> bool {
    match tokio::fs::metadata(blob).await {
        Ok(meta) => size.is_none_or(|s| meta.len() == s),
        Err(_) => false,
    }
}

/// Bytes on disk: complete blobs, and partial files.
async fn bytes_on_disk(plan: &[(Option<u64>, PathBuf, PathBuf)]) -> u64 {
    let mut done = 0u64;
    for (_, blob, part) in plan {
        done += match tokio::fs::metadata(blob).await {
            Ok(meta) => meta.len(),
            Err(_) => partial_bytes(part),
        };
    }
    done
}

/// Feeds the first `len` bytes of `path` to `hasher` (a resumed download's digest).
async fn hash_prefix(path: &Path, len: u64, hasher: &mut Hashers) -> std::io::Result<()> {
    let mut file = tokio::fs::File::open(path).await?;
    let mut buffer = vec![0u8; 1 << 20];
    let mut left = len;
    while left > 0 {
        let want = usize::try_from(left.min(buffer.len() as u64)).unwrap_or(buffer.len());
        let n = file.read(&mut buffer[..want]).await?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the partial file shrank",
            ));
        }
        hasher.update(&buffer[..n]);
        left -= n as u64;
    }
    Ok(())
}

/// The first byte of a `Content-Range: bytes a-b/n` answer.
pub(crate) fn content_range_start(headers: &reqwest::header::HeaderMap) -> Option<u64> {
    let value = headers.get(reqwest::header::CONTENT_RANGE)?.to_str().ok()?;
    let range = value.strip_prefix("bytes ")?;
    range.split('-').next()?.trim().parse().ok()
}

async fn create_dir(dir: &Path) -> Result<(), SourceError> {
    tokio::fs::create_dir_all(dir)
        .await
        .map_err(|e| SourceError::Disk(format!("cannot create {}: {e}", dir.display())))
}

/// Points `link` at `blob`, replacing whatever was there.
async fn link_to(blob: &Path, link: &Path) -> Result<(), SourceError> {
    if tokio::fs::read_link(link)
        .await
        .is_ok_and(|target| target == blob)
    {
        return Ok(());
    }
    let _ = tokio::fs::remove_file(link).await;
    tokio::fs::symlink(blob, link).await.map_err(|e| {
        SourceError::Disk(format!(
            "cannot link {} to {}: {e}",
            link.display(),
            blob.display()
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_ranges_and_blob_names_are_read_as_sent() {
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(
            reqwest::header::CONTENT_RANGE,
            "bytes 100-199/200"
                .parse()
                .unwrap_or_else(|_| unreachable!()),
        );
        assert_eq!(content_range_start(&headers), Some(100));
        let file = RemoteFile {
            path: "a.gguf".into(),
            url: "http://h/a.gguf".into(),
            size: Some(1),
            sha256: Some("ab".repeat(32)),
            hub_auth: false,
            ..Default::default()
        };
        assert_eq!(blob_name(&file), format!("sha256-{}", "ab".repeat(32)));
        let unverified = RemoteFile {
            sha256: None,
            ..file.clone()
        };
        assert!(blob_name(&unverified).starts_with("url-"));
        // A presigned URL changes at every signing; the source's identity does not.
        let signed = |url: &str| RemoteFile {
            sha256: None,
            url: url.into(),
            cache_id: Some("s3 http://s3 models/a.gguf 0123 1".into()),
            ..file.clone()
        };
        let first = blob_name(&signed("http://s3/models/a.gguf?X-Amz-Signature=1"));
        assert!(first.starts_with("id-"), "{first}");
        assert_eq!(
            first,
            blob_name(&signed("http://s3/models/a.gguf?X-Amz-Signature=2"))
        );
    }
}
