//! Large files in parallel ranges: one connection per segment, each writing at its own
//! offset of one preallocated file, so a file arrives as fast as several connections
//! carry it (a hub's CDN caps the speed of one).
//!
//! ```text
//! <root>/partial/<blob>.part          the file at its full length (sparse until filled)
//! <root>/partial/<blob>.part.ranges   JSON: each segment's start, end and next byte
//! ```
//!
//! The `.ranges` file is rewritten (atomically) four times a second and when the download
//! stops, so a restart — even after a `kill -9` — resumes every segment from the bytes
//! it had. A segment's bytes are written before its progress is counted, and the whole
//! file is hashed before it is renamed into place, so a `.ranges` file that claims more
//! than was written (a power cut) costs a fetch again, never a corrupt model. A server
//! that ignores `Range` (answers 200) makes the file fall back to one sequential
//! download.

use std::io::SeekFrom;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncSeekExt, AsyncWriteExt};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::cache::STALL_TIMEOUT;
use crate::error::{shown_url, unavailable};
use crate::{RemoteFile, SourceError, Sources};

/// Connections per file when the worker's `download_connections` is not set.
pub const DEFAULT_CONNECTIONS: usize = 4;
/// The smallest segment: a file is split only when every segment gets at least this.
pub const DEFAULT_MIN_SEGMENT: u64 = 32 << 20;
/// How often each segment's progress is saved.
const SAVE_EVERY: Duration = Duration::from_millis(250);
/// Bytes a segment gathers before writing them (and then counting them as done).
const WRITE_BATCH: usize = 256 << 10;

/// How many connections a file may use, and how small its segments may get.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parallel {
    pub connections: usize,
    pub min_segment: u64,
}

impl Default for Parallel {
    fn default() -> Self {
        Self {
            connections: DEFAULT_CONNECTIONS,
            min_segment: DEFAULT_MIN_SEGMENT,
        }
    }
}

impl Parallel {
    /// The segments of a file of `size` bytes; `None` when it is fetched in one piece
    /// (one connection allowed, or too small to split).
    fn split(&self, size: u64) -> Option<Vec<Segment>> {
        let by_size = size / self.min_segment.max(1);
        let count = u64::try_from(self.connections)
            .unwrap_or(u64::MAX)
            .min(by_size);
        if count < 2 {
            return None;
        }
        let step = size.div_ceil(count);
        Some(
            (0..count)
                .map(|i| {
                    let start = i * step;
                    Segment {
                        start,
                        end: ((i + 1) * step).min(size),
                        next: start,
                    }
                })
                .collect(),
        )
    }

    /// Whether `file` goes in parallel ranges now: its size is known and large enough,
    /// and it is not already half-fetched sequentially (a `.part` without `.ranges`).
    pub(crate) async fn applies(&self, file: &RemoteFile, part: &Path) -> Option<u64> {
        let size = file.size?;
        self.split(size)?;
        if tokio::fs::metadata(ranges_path(part)).await.is_ok() {
            return Some(size);
        }
        match tokio::fs::metadata(part).await {
            Ok(meta) if meta.len() > 0 => None,
            _ => Some(size),
        }
    }
}

/// One range of the file: `start..end`, fetched up to `next`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Segment {
    start: u64,
    end: u64,
    next: u64,
}

/// What the `.ranges` file holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Ranges {
    size: u64,
    segments: Vec<Segment>,
}

impl Ranges {
    fn done(&self) -> u64 {
        self.segments
            .iter()
            .map(|s| s.next.saturating_sub(s.start))
            .sum()
    }

    /// Whether it describes a file of `size`: segments in order, covering it exactly.
    fn fits(&self, size: u64) -> bool {
        let mut at = 0;
        for s in &self.segments {
            if s.start != at || s.end < s.start || s.next < s.start || s.next > s.end {
                return false;
            }
            at = s.end;
        }
        self.size == size && at == size
    }
}

/// Where a partial file's segments are recorded.
pub(crate) fn ranges_path(part: &Path) -> PathBuf {
    let mut name = part.as_os_str().to_owned();
    name.push(".ranges");
    PathBuf::from(name)
}

/// Whether `path` is a `.ranges` record rather than a partial file.
pub(crate) fn is_ranges_file(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "ranges")
}

/// Bytes a partial file has: what its segments record when it is fetched in ranges
/// (its length is the whole file's), else its length.
pub(crate) fn partial_bytes(part: &Path) -> u64 {
    if let Some(ranges) = std::fs::read(ranges_path(part))
        .ok()
        .and_then(|bytes| serde_json::from_slice::<Ranges>(&bytes).ok())
    {
        return ranges.done();
    }
    std::fs::metadata(part).map_or(0, |m| m.len())
}

/// How a parallel fetch ended.
#[derive(Debug)]
pub(crate) enum Fetched {
    /// Every segment is on disk; the file still has to be verified.
    Complete,
    /// The server sent the whole file for a range request: nothing was kept, fetch it
    /// in one piece.
    NoRanges,
}

/// Why one segment stopped.
enum SegmentError {
    Source(SourceError),
    NoRanges,
}

impl From<SourceError> for SegmentError {
    fn from(error: SourceError) -> Self {
        Self::Source(error)
    }
}

/// Fetches what is missing of `file` (of `size` bytes) into `part`, one connection per
/// segment, resuming the segments recorded beside it.
pub(crate) async fn fetch(
    sources: &Sources,
    parallel: Parallel,
    file: &RemoteFile,
    size: u64,
    part: &Path,
    cancel: &CancellationToken,
) -> Result<Fetched, SourceError> {
    let disk = |e: std::io::Error| SourceError::Disk(format!("{}: {e}", part.display()));
    let record = ranges_path(part);
    let resumed = match tokio::fs::read(&record).await {
        Ok(bytes) => serde_json::from_slice::<Ranges>(&bytes)
            .ok()
            .filter(|r| r.fits(size)),
        Err(_) => None,
    };
    let part_len = tokio::fs::metadata(part).await.map_or(0, |m| m.len());
    let ranges = match resumed {
        Some(ranges) if part_len == size => ranges,
        _ => {
            let segments = parallel.split(size).unwrap_or_else(|| {
                vec![Segment {
                    start: 0,
                    end: size,
                    next: 0,
                }]
            });
            let file = tokio::fs::File::create(part).await.map_err(disk)?;
            file.set_len(size).await.map_err(disk)?;
            let ranges = Ranges { size, segments };
            save(&record, &ranges).await.map_err(disk)?;
            ranges
        }
    };
    tracing::info!(
        file = %file.path,
        segments = ranges.segments.len(),
        resumed_at = ranges.done(),
        bytes = size,
        "downloading in parallel ranges"
    );

    let next: Arc<Vec<AtomicU64>> = Arc::new(
        ranges
            .segments
            .iter()
            .map(|s| AtomicU64::new(s.next))
            .collect(),
    );
    let snapshot = {
        let next = Arc::clone(&next);
        let ranges = ranges.clone();
        move || Ranges {
            size: ranges.size,
            segments: ranges
                .segments
                .iter()
                .zip(next.iter())
                .map(|(s, n)| Segment {
                    next: n.load(Ordering::Acquire),
                    ..*s
                })
                .collect(),
        }
    };

    // Stops the segments and the saver however this future ends, dropped included.
    let stop = cancel.child_token();
    let _stop_on_drop = stop.clone().drop_guard();
    let mut segments = JoinSet::new();
    for (index, segment) in ranges.segments.iter().enumerate() {
        if segment.next < segment.end {
            segments.spawn(fetch_segment(
                sources.clone(),
                file.clone(),
                part.to_owned(),
                segment.end,
                Arc::clone(&next),
                index,
                stop.clone(),
            ));
        }
    }
    let saver = {
        let record = record.clone();
        let snapshot = snapshot.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(SAVE_EVERY) => {}
                }
                if let Err(e) = save(&record, &snapshot()).await {
                    tracing::warn!(path = %record.display(), error = %e, "cannot record download progress");
                }
            }
        })
    };

    let mut outcome: Result<(), SegmentError> = Ok(());
    while let Some(joined) = segments.join_next().await {
        let failed = match joined {
            Ok(Ok(())) => continue,
            Ok(Err(e)) => e,
            Err(e) => SegmentError::Source(SourceError::Disk(format!(
                "a download task of {} stopped: {e}",
                file.path
            ))),
        };
        outcome = Err(failed);
        break;
    }
    stop.cancel();
    segments.shutdown().await;
    let _ = saver.await;

    match outcome {
        Ok(()) => {
            tokio::fs::remove_file(&record).await.map_err(disk)?;
            Ok(Fetched::Complete)
        }
        Err(SegmentError::NoRanges) => {
            tracing::info!(file = %file.path, "the server ignores range requests; downloading in one piece");
            let _ = tokio::fs::remove_file(&record).await;
            let _ = tokio::fs::remove_file(part).await;
            Ok(Fetched::NoRanges)
        }
        Err(SegmentError::Source(e)) => {
            save(&record, &snapshot()).await.map_err(disk)?;
            Err(e)
        }
    }
}

/// Fetches segment `index` (up to `end`) from where `next` says, writing at its offset.
async fn fetch_segment(
    sources: Sources,
    file: RemoteFile,
    part: PathBuf,
    end: u64,
    next: Arc<Vec<AtomicU64>>,
    index: usize,
    stop: CancellationToken,
) -> Result<(), SegmentError> {
    let disk = |e: std::io::Error| SourceError::Disk(format!("{}: {e}", part.display()));
    let mut at = next[index].load(Ordering::Acquire);
    let response = tokio::select! {
        () = stop.cancelled() => return Err(SourceError::Cancelled.into()),
        sent = sources
            .get(&file.url, file.hub_auth)
            .header(reqwest::header::RANGE, format!("bytes={at}-{}", end - 1))
            .send() => sent.map_err(|e| unavailable(&file.url, &e))?,
    };
    let mut response = match response.status().as_u16() {
        206 => response,
        200 => return Err(SegmentError::NoRanges),
        _ => {
            let status = response.status();
            sources.check_file_status(response, &file).await?;
            return Err(SourceError::Unavailable(format!(
                "{} answered {status} to a range request",
                shown_url(&file.url)
            ))
            .into());
        }
    };
    let start = crate::cache::content_range_start(response.headers());
    if start != Some(at) {
        return Err(SourceError::Unavailable(format!(
            "{} answered a range request at byte {start:?}, not {at}",
            shown_url(&file.url)
        ))
        .into());
    }
    let mut out = tokio::fs::OpenOptions::new()
        .write(true)
        .open(&part)
        .await
        .map_err(disk)?;
    out.seek(SeekFrom::Start(at)).await.map_err(disk)?;
    let mut batch: Vec<u8> = Vec::with_capacity(WRITE_BATCH);
    loop {
        let chunk = tokio::select! {
            () = stop.cancelled() => None,
            chunk = tokio::time::timeout(STALL_TIMEOUT, response.chunk()) => Some(chunk),
        };
        let chunk = match chunk {
            None => Err(SourceError::Cancelled),
            Some(Err(_)) => Err(SourceError::Unavailable(format!(
                "{}: nothing received for {STALL_TIMEOUT:?}",
                shown_url(&file.url)
            ))),
            Some(Ok(Err(e))) => Err(unavailable(&file.url, &e)),
            Some(Ok(Ok(chunk))) => Ok(chunk),
        };
        let finished = match &chunk {
            Ok(Some(bytes)) => {
                let room = usize::try_from(end - at - batch.len() as u64).unwrap_or(usize::MAX);
                batch.extend_from_slice(&bytes[..bytes.len().min(room)]);
                at + batch.len() as u64 >= end
            }
            _ => true,
        };
        if batch.len() >= WRITE_BATCH || finished {
            out.write_all(&batch).await.map_err(disk)?;
            out.flush().await.map_err(disk)?;
            at += batch.len() as u64;
            next[index].store(at, Ordering::Release);
            batch.clear();
        }
        match chunk {
            Err(e) => return Err(e.into()),
            Ok(None) => break,
            Ok(Some(_)) if at >= end => break,
            Ok(Some(_)) => {}
        }
    }
    if at < end {
        return Err(SourceError::Unavailable(format!(
            "{} ended a range after byte {at}, before {end}",
            shown_url(&file.url)
        ))
        .into());
    }
    Ok(())
}

/// Writes the record next to the file, then renames it over the old one.
async fn save(record: &Path, ranges: &Ranges) -> std::io::Result<()> {
    let mut temporary = record.as_os_str().to_owned();
    temporary.push(".tmp");
    let bytes = serde_json::to_vec(ranges).map_err(std::io::Error::other)?;
    tokio::fs::write(&temporary, bytes).await?;
    tokio::fs::rename(&temporary, record).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_split_into_segments_no_smaller_than_the_minimum() {
        let parallel = Parallel {
            connections: 4,
            min_segment: 10,
        };
        assert_eq!(parallel.split(19), None, "one segment's worth");
        let two = parallel.split(25).unwrap_or_default();
        assert_eq!(two.len(), 2);
        assert_eq!((two[0].start, two[0].end, two[1].end), (0, 13, 25));
        let four = parallel.split(1000).unwrap_or_default();
        assert_eq!(four.len(), 4);
        assert_eq!(four.last().map(|s| s.end), Some(1000));
        let ranges = Ranges {
            size: 1000,
            segments: four,
        };
        assert!(ranges.fits(1000));
        assert!(!ranges.fits(999));
        let single = Parallel {
            connections: 1,
            ..parallel
        };
        assert_eq!(single.split(1000), None);
    }

    #[test]
    fn progress_is_the_sum_of_what_each_segment_has() {
        let ranges = Ranges {
            size: 30,
            segments: vec![
                Segment {
                    start: 0,
                    end: 10,
                    next: 10,
                },
                Segment {
                    start: 10,
                    end: 20,
                    next: 14,
                },
                Segment {
                    start: 20,
                    end: 30,
                    next: 20,
                },
            ],
        };
        assert_eq!(ranges.done(), 14);
        assert!(ranges.fits(30));
        let gap = Ranges {
            segments: vec![ranges.segments[0], ranges.segments[2]],
            ..ranges.clone()
        };
        assert!(!gap.fits(30));
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let part = dir.path().join("sha256-ab.part");
        std::fs::write(&part, vec![0u8; 30]).unwrap_or_default();
        assert_eq!(partial_bytes(&part), 30, "no record: its length");
        std::fs::write(
            ranges_path(&part),
            serde_json::to_vec(&ranges).unwrap_or_default(),
        )
        .unwrap_or_default();
        assert_eq!(partial_bytes(&part), 14);
        assert!(is_ranges_file(&ranges_path(&part)));
        assert!(!is_ranges_file(&part));
    }
}
