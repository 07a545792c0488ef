//! What a worker's model cache holds, and keeping it in bounds: the list of its files
//! (complete, downloading, interrupted or failed, with the names they have in model
//! directories and the models that use them), holds that keep a file in use from being
//! removed, eviction of the least recently used files under a size cap
//! (`model_cache_max`), and deletion of a file nobody uses.
//!
//! "Used" is when an instance last fetched the file: its blob's modification time is set
//! then, so the order survives restarts. Holds live in memory: an instance holds its
//! files from before its download starts until it stops.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use gantry_types::{CachedModelFile, ModelFileState, Timestamp};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::cache::{blob_name, Fetched, ModelCache, Progress};
use crate::parallel::{is_ranges_file, partial_bytes, ranges_path};
use crate::{RemoteFile, Resolved, SourceError};

/// The cache's bookkeeping beside the files themselves.
#[derive(Debug, Default)]
pub(crate) struct Books {
    /// Bytes of files the cache may keep; `None`: no cap.
    pub(crate) max_bytes: Option<u64>,
    next_hold: AtomicU64,
    /// Hold id → (owner, blobs).
    holds: Mutex<HashMap<u64, (String, Vec<String>)>>,
    /// Blob → why its last download failed.
    errors: Mutex<HashMap<String, String>>,
    /// Blob → its size and name, from the sources that asked for it (for files not
    /// complete yet, which have no name on disk).
    planned: Mutex<HashMap<String, Planned>>,
}

#[derive(Debug, Clone)]
struct Planned {
    size: Option<u64>,
    name: String,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl Books {
    /// The blob is complete: forget an earlier failure and mark it used now.
    pub(crate) async fn succeeded(&self, name: &str, blob: &Path) {
        lock(&self.errors).remove(name);
        touch(blob).await;
    }

    /// Its download failed (a cancellation is not a failure).
    pub(crate) fn failed(&self, name: &str, error: &SourceError) {
        if !matches!(error, SourceError::Cancelled) {
            lock(&self.errors).insert(name.to_owned(), error.to_string());
        }
    }

    fn holders(&self) -> HashMap<String, BTreeSet<String>> {
        let mut by_blob: HashMap<String, BTreeSet<String>> = HashMap::new();
        for (owner, blobs) in lock(&self.holds).values() {
            for blob in blobs {
                by_blob
                    .entry(blob.clone())
                    .or_default()
                    .insert(owner.clone());
            }
        }
        by_blob
    }

    fn plan(&self, resolved: &Resolved) {
        let mut planned = lock(&self.planned);
        for file in &resolved.files {
            planned.insert(
                blob_name(file),
                Planned {
                    size: file.size,
                    name: format!("{}/{}", resolved.key, file.path),
                },
            );
        }
    }
}

/// The name of a blob from its path in `blobs/` or `partial/`.
pub(crate) fn blob_file_name(path: &Path) -> String {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    name.strip_suffix(".part")
        .map_or(name.clone(), str::to_owned)
}

/// Marks a file used now (its modification time is the "last used" of eviction).
async fn touch(path: &Path) {
    let path = path.to_owned();
    let _ = tokio::task::spawn_blocking(move || {
        std::fs::File::options()
            .write(true)
            .open(&path)
            .and_then(|f| f.set_modified(SystemTime::now()))
    })
    .await;
}

/// Keeps a model's files from eviction and deletion while it lives.
#[derive(Debug)]
pub struct Hold {
    cache: Arc<ModelCache>,
    id: u64,
}

impl Drop for Hold {
    fn drop(&mut self) {
        lock(&self.cache.books.holds).remove(&self.id);
    }
}

/// Why a file cannot be deleted.
#[derive(Debug, thiserror::Error)]
pub enum DeleteError {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    InUse(String),
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Disk(String),
}

impl ModelCache {
    /// Like [`ModelCache::fetch`], for `owner` (an instance): its files are held from
    /// before the download starts until the returned [`Hold`] is dropped, so neither
    /// eviction nor deletion removes them under it.
    pub async fn fetch_held(
        self: &Arc<Self>,
        owner: &str,
        resolved: &Resolved,
        progress: &watch::Sender<Progress>,
        cancel: &CancellationToken,
    ) -> Result<(Fetched, Hold), SourceError> {
        let hold = self.hold(owner, resolved.files.iter().map(blob_name).collect());
        let fetched = self.fetch(resolved, progress, cancel).await?;
        Ok((fetched, hold))
    }

    /// Holds `blobs` for `owner` until the [`Hold`] is dropped.
    pub fn hold(self: &Arc<Self>, owner: &str, blobs: Vec<String>) -> Hold {
        let id = self.books.next_hold.fetch_add(1, Ordering::Relaxed);
        lock(&self.books.holds).insert(id, (owner.to_owned(), blobs));
        Hold {
            cache: Arc::clone(self),
            id,
        }
    }

    /// Whether a download of `blob` is running now.
    fn downloading(&self, blob: &str) -> bool {
        let key = self.root.join("blobs").join(blob).display().to_string();
        let lock = lock(&self.locks).get(&key).cloned();
        lock.is_some_and(|l| l.try_lock().is_err())
    }

    /// Every file of the cache, most recently used first.
    pub async fn list(&self) -> Vec<CachedModelFile> {
        let root = self.root.clone();
        let on_disk = tokio::task::spawn_blocking(move || scan(&root))
            .await
            .unwrap_or_default();
        let holders = self.books.holders();
        let errors = lock(&self.books.errors).clone();
        let planned = lock(&self.books.planned).clone();

        let mut files: HashMap<String, CachedModelFile> = HashMap::new();
        let entry = |blob: &str| -> CachedModelFile {
            CachedModelFile {
                blob: blob.to_owned(),
                names: Vec::new(),
                state: ModelFileState::Error,
                size: 0,
                bytes_done: 0,
                error: None,
                models: Vec::new(),
                last_used_at: None,
            }
        };
        for (blob, meta) in &on_disk.blobs {
            let mut file = entry(blob);
            file.state = ModelFileState::Ready;
            file.size = meta.len;
            file.bytes_done = meta.len;
            file.last_used_at = meta.modified;
            files.insert(blob.clone(), file);
        }
        for (blob, meta) in &on_disk.partial {
            if files.contains_key(blob) {
                continue;
            }
            let mut file = entry(blob);
            file.state = if self.downloading(blob) {
                ModelFileState::Downloading
            } else if errors.contains_key(blob) {
                ModelFileState::Error
            } else {
                ModelFileState::Partial
            };
            file.bytes_done = meta.len;
            file.size = planned.get(blob).and_then(|p| p.size).unwrap_or(meta.len);
            file.last_used_at = meta.modified;
            files.insert(blob.clone(), file);
        }
        for blob in errors.keys() {
            files.entry(blob.clone()).or_insert_with(|| {
                let mut file = entry(blob);
                file.size = planned.get(blob).and_then(|p| p.size).unwrap_or(0);
                file
            });
        }
        for (blob, file) in &mut files {
            file.error = errors.get(blob).cloned();
            if file.state == ModelFileState::Ready {
                file.error = None;
            }
            let mut names: BTreeSet<String> = on_disk.names.get(blob).cloned().unwrap_or_default();
            if names.is_empty() {
                names.extend(planned.get(blob).map(|p| p.name.clone()));
            }
            file.names = names.into_iter().collect();
            file.models = holders
                .get(blob)
                .map(|owners| {
                    owners
                        .iter()
                        .map(|o| o.split('#').next().unwrap_or(o).to_owned())
                        .collect::<BTreeSet<_>>()
                        .into_iter()
                        .collect()
                })
                .unwrap_or_default();
        }
        let mut files: Vec<CachedModelFile> = files.into_values().collect();
        files.sort_by(|a, b| {
            b.last_used_at
                .cmp(&a.last_used_at)
                .then_with(|| a.blob.cmp(&b.blob))
        });
        files
    }

    /// Removes a file nobody uses: its blob or partial download, and its names in model
    /// directories.
    pub async fn delete(&self, blob: &str) -> Result<(), DeleteError> {
        let well_formed = !blob.is_empty()
            && blob.len() <= 200
            && blob
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            && !blob.starts_with('.');
        if !well_formed {
            return Err(DeleteError::Invalid(format!(
                "{blob:?} is not the name of a cached file (see the `blob` of GET /api/v1/model-files)"
            )));
        }
        if let Some(owners) = self.books.holders().get(blob) {
            return Err(DeleteError::InUse(format!(
                "model file {blob} is used by {}; delete or move those instances first",
                owners.iter().cloned().collect::<Vec<_>>().join(", ")
            )));
        }
        if self.downloading(blob) {
            return Err(DeleteError::InUse(format!(
                "model file {blob} is being downloaded; delete the models that need it first"
            )));
        }
        let complete = self.root.join("blobs").join(blob);
        let part = self.root.join("partial").join(format!("{blob}.part"));
        let had_error = lock(&self.books.errors).remove(blob).is_some();
        let mut removed = had_error;
        let record = ranges_path(&part);
        for path in [&complete, &part, &record] {
            match tokio::fs::remove_file(path).await {
                Ok(()) => removed = true,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(DeleteError::Disk(format!(
                        "cannot remove {}: {e}",
                        path.display()
                    )))
                }
            }
        }
        if !removed {
            return Err(DeleteError::NotFound(format!(
                "this worker has no cached file {blob}"
            )));
        }
        self.unlink_names(&[blob.to_owned()]).await;
        tracing::info!(blob, "deleted model file");
        Ok(())
    }

    /// Before fetching `plan`: when a size cap is set, evicts the least recently used
    /// complete files that no instance holds until what is kept plus what is missing
    /// fits. What cannot be made to fit is downloaded anyway, with a warning: files in
    /// use are never removed.
    pub(crate) async fn make_room(
        &self,
        resolved: &Resolved,
        plan: &[(RemoteFile, PathBuf, PathBuf)],
    ) -> Result<(), SourceError> {
        self.books.plan(resolved);
        let Some(max) = self.books.max_bytes else {
            return Ok(());
        };
        let wanted: BTreeSet<String> = plan.iter().map(|(f, _, _)| blob_name(f)).collect();
        let mut missing = 0u64;
        for (file, blob, part) in plan {
            if tokio::fs::metadata(blob).await.is_ok() {
                continue;
            }
            let have = partial_bytes(part);
            missing = missing.saturating_add(file.size.unwrap_or(0).saturating_sub(have));
        }
        let root = self.root.clone();
        let on_disk = tokio::task::spawn_blocking(move || scan(&root))
            .await
            .unwrap_or_default();
        let kept: u64 = on_disk.blobs.values().map(|m| m.len).sum::<u64>()
            + on_disk.partial.values().map(|m| m.len).sum::<u64>();
        if kept.saturating_add(missing) <= max {
            return Ok(());
        }
        let held = self.books.holders();
        let mut candidates: Vec<(&String, &FileMeta)> = on_disk
            .blobs
            .iter()
            .filter(|(blob, _)| !wanted.contains(*blob) && !held.contains_key(*blob))
            .collect();
        candidates.sort_by_key(|(_, meta)| meta.modified);
        let mut total = kept;
        let mut evicted = Vec::new();
        for (blob, meta) in candidates {
            if total.saturating_add(missing) <= max {
                break;
            }
            let path = self.root.join("blobs").join(blob);
            if let Err(e) = tokio::fs::remove_file(&path).await {
                tracing::warn!(blob = %blob, error = %e, "cannot evict model file");
                continue;
            }
            tracing::info!(blob = %blob, bytes = meta.len, "evicted least recently used model file (model_cache_max)");
            total -= meta.len;
            evicted.push(blob.clone());
        }
        self.unlink_names(&evicted).await;
        if total.saturating_add(missing) > max {
            tracing::warn!(
                kept = total,
                missing,
                max,
                "the model cache exceeds model_cache_max: the files left are in use or needed now"
            );
        }
        Ok(())
    }

    /// Removes the links in `snapshots/` that point to `blobs`, and directories left
    /// empty.
    async fn unlink_names(&self, blobs: &[String]) {
        if blobs.is_empty() {
            return;
        }
        let snapshots = self.root.join("snapshots");
        let blobs: BTreeSet<String> = blobs.iter().cloned().collect();
        let _ = tokio::task::spawn_blocking(move || unlink_in(&snapshots, &blobs)).await;
    }
}

/// Removes links under `dir` whose target's file name is one of `blobs`; true when
/// `dir` is left empty (and was removed).
fn unlink_in(dir: &Path, blobs: &BTreeSet<String>) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    let mut left = 0usize;
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(kind) = entry.file_type() else {
            left += 1;
            continue;
        };
        if kind.is_symlink() {
            let target = std::fs::read_link(&path).ok();
            let points_to_blob = target
                .as_deref()
                .is_some_and(|t| blobs.contains(&blob_file_name(t)));
            if points_to_blob && std::fs::remove_file(&path).is_ok() {
                continue;
            }
            left += 1;
        } else if kind.is_dir() {
            if !unlink_in(&path, blobs) {
                left += 1;
            }
        } else {
            left += 1;
        }
    }
    left == 0 && std::fs::remove_dir(dir).is_ok()
}

#[derive(Debug, Clone, Copy)]
struct FileMeta {
    len: u64,
    modified: Option<Timestamp>,
}

/// What is on disk: complete blobs, partial downloads, and the names (snapshot paths)
/// that point to each blob.
#[derive(Debug, Default)]
struct Scan {
    blobs: HashMap<String, FileMeta>,
    partial: HashMap<String, FileMeta>,
    names: HashMap<String, BTreeSet<String>>,
}

fn scan(root: &Path) -> Scan {
    let mut found = Scan::default();
    let meta = |entry: &std::fs::DirEntry| {
        entry.metadata().ok().map(|m| FileMeta {
            len: m.len(),
            modified: m.modified().ok().map(Timestamp::from),
        })
    };
    for (dir, into) in [("blobs", &mut found.blobs), ("partial", &mut found.partial)] {
        for entry in std::fs::read_dir(root.join(dir))
            .into_iter()
            .flatten()
            .flatten()
        {
            let path = entry.path();
            if is_ranges_file(&path) || path.extension().is_some_and(|e| e == "tmp") {
                continue;
            }
            if let Some(mut m) = meta(&entry) {
                if dir == "partial" {
                    // A file fetched in ranges has its full length from the start.
                    m.len = partial_bytes(&path);
                }
                into.insert(blob_file_name(&path), m);
            }
        }
    }
    let snapshots = root.join("snapshots");
    collect_names(&snapshots, &snapshots, &mut found.names);
    found
}

fn collect_names(base: &Path, dir: &Path, names: &mut HashMap<String, BTreeSet<String>>) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_dir() {
            collect_names(base, &path, names);
        } else if kind.is_symlink() {
            if let (Ok(target), Ok(name)) = (std::fs::read_link(&path), path.strip_prefix(base)) {
                names
                    .entry(blob_file_name(&target))
                    .or_default()
                    .insert(name.display().to_string());
            }
        }
    }
}
