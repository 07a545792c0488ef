//! Downloading a file whose SHA-256 is known: streamed into `<file>.part` while hashing,
//! renamed into place only when the digest matches, so a file at its final name is always
//! complete and verified.

use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;
use tokio_util::sync::CancellationToken;

use crate::process::sleep_or_cancel;
use crate::progress::{phase, Reporter};
use crate::InstallError;

/// Attempts per download (curl's `--retry 3` in the old script): connection errors, cut
/// bodies and 5xx answers are retried, other answers and a wrong digest are not.
const DOWNLOAD_ATTEMPTS: u32 = 3;
const RETRY_DELAY: Duration = Duration::from_secs(2);

/// Downloads `url` to `target`, checking its SHA-256 (lowercase hex) before the rename.
pub(crate) async fn download_verified(
    http: &reqwest::Client,
    url: &str,
    sha256: &str,
    target: &Path,
    reporter: &mut Reporter<'_>,
    cancel: &CancellationToken,
) -> Result<(), InstallError> {
    reporter.phase(phase::DOWNLOADING);
    reporter.note(&format!("downloading {url}"));
    let part = part_path(target);
    let mut attempt = 1;
    loop {
        match download_once(http, url, &part, reporter, cancel).await {
            Ok(actual) => {
                if !actual.eq_ignore_ascii_case(sha256) {
                    let _ = tokio::fs::remove_file(&part).await;
                    return Err(reporter.fail(format!(
                        "sha256 mismatch for {url}: expected {sha256}, got {actual}; the file \
                         on the server is not the one that was pinned (or was corrupted on \
                         the way); nothing was kept"
                    )));
                }
                tokio::fs::rename(&part, target).await.map_err(|error| {
                    InstallError::new(format!(
                        "cannot rename {} to {}: {error}",
                        part.display(),
                        target.display()
                    ))
                })?;
                reporter.note(&format!(
                    "downloaded {} (sha256 {actual})",
                    target.display()
                ));
                return Ok(());
            }
            Err(Failure::Cancelled) => {
                let _ = tokio::fs::remove_file(&part).await;
                return Err(InstallError::cancelled("the download"));
            }
            Err(Failure::Retryable(message)) if attempt < DOWNLOAD_ATTEMPTS => {
                reporter.note(&format!(
                    "{message} (attempt {attempt} of {DOWNLOAD_ATTEMPTS}); retrying"
                ));
                attempt += 1;
                sleep_or_cancel(RETRY_DELAY, cancel, "the download").await?;
            }
            Err(Failure::Retryable(message) | Failure::Permanent(message)) => {
                let _ = tokio::fs::remove_file(&part).await;
                return Err(reporter.fail(message));
            }
        }
    }
}

enum Failure {
    Cancelled,
    Retryable(String),
    Permanent(String),
}

/// One attempt: the whole body into `part`, answering its SHA-256.
async fn download_once(
    http: &reqwest::Client,
    url: &str,
    part: &Path,
    reporter: &mut Reporter<'_>,
    cancel: &CancellationToken,
) -> Result<String, Failure> {
    let response = tokio::select! {
        response = http.get(url).send() => response,
        _ = cancel.cancelled() => return Err(Failure::Cancelled),
    };
    let mut response = response.map_err(|error| {
        Failure::Retryable(format!(
            "cannot download {url}: {error}; check the network connection (and a proxy in \
             HTTPS_PROXY)"
        ))
    })?;
    let status = response.status();
    if !status.is_success() {
        let message = format!("cannot download {url}: the server answered {status}");
        return Err(if status.is_server_error() {
            Failure::Retryable(message)
        } else {
            Failure::Permanent(message)
        });
    }
    let total = response.content_length();
    let mut file = tokio::fs::File::create(part).await.map_err(|error| {
        Failure::Permanent(format!("cannot create {}: {error}", part.display()))
    })?;
    let mut hasher = Sha256::new();
    let mut done = 0u64;
    reporter.bytes(0, total);
    loop {
        let chunk = tokio::select! {
            chunk = response.chunk() => chunk,
            _ = cancel.cancelled() => return Err(Failure::Cancelled),
        };
        let chunk = match chunk {
            Ok(Some(chunk)) => chunk,
            Ok(None) => break,
            Err(error) => {
                return Err(Failure::Retryable(format!(
                    "the download of {url} broke off after {done} bytes: {error}"
                )))
            }
        };
        hasher.update(&chunk);
        file.write_all(&chunk).await.map_err(|error| {
            Failure::Permanent(format!(
                "cannot write {}: {error}; is the disk full?",
                part.display()
            ))
        })?;
        done += chunk.len() as u64;
        reporter.bytes(done, total);
    }
    file.sync_all()
        .await
        .map_err(|error| Failure::Permanent(format!("cannot write {}: {error}", part.display())))?;
    Ok(hex::encode(hasher.finalize()))
}

/// The SHA-256 of a file on disk (lowercase hex), hashed on the blocking pool.
pub(crate) async fn sha256_of_file(path: &Path) -> std::io::Result<String> {
    let path = path.to_owned();
    tokio::task::spawn_blocking(move || {
        let mut file = std::fs::File::open(path)?;
        let mut hasher = Sha256::new();
        std::io::copy(&mut file, &mut hasher)?;
        Ok(hex::encode(hasher.finalize()))
    })
    .await
    .expect("hashing a file does not panic")
}

fn part_path(target: &Path) -> PathBuf {
    let mut name = target.as_os_str().to_owned();
    name.push(".part");
    PathBuf::from(name)
}
