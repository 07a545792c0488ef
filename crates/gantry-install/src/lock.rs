//! Exclusive `flock(2)` locks on files, shared with other processes (the old
//! `build-llama-server.sh` took the same lock on the same file), taken without blocking a
//! thread: while another holder has it the installation reports `waiting` and polls, so
//! cancellation stays immediate.

use std::fs::{File, OpenOptions};
use std::path::Path;
use std::time::Duration;

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};
use tokio_util::sync::CancellationToken;

use crate::process::sleep_or_cancel;
use crate::progress::{phase, Reporter};
use crate::InstallError;

/// How often a waiting installation tries the lock again.
const LOCK_POLL_INTERVAL: Duration = Duration::from_millis(250);

/// A held lock; dropping it releases the lock (closing the file does).
#[derive(Debug)]
pub(crate) struct FileLock {
    _lock: Flock<File>,
}

/// Takes the exclusive lock on `path` (created when missing). `what` says what the holder
/// is doing, for the `waiting` note: "a build of llama-server 11434.0.0".
pub(crate) async fn lock_exclusive(
    path: &Path,
    what: &str,
    reporter: &mut Reporter<'_>,
    cancel: &CancellationToken,
) -> Result<FileLock, InstallError> {
    let mut file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|error| {
            InstallError::new(format!("cannot open lock file {}: {error}", path.display()))
        })?;
    let mut announced = false;
    loop {
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => return Ok(FileLock { _lock: lock }),
            Err((returned, Errno::EWOULDBLOCK)) => {
                file = returned;
                if !announced {
                    reporter.phase(phase::WAITING);
                    reporter.note(&format!(
                        "{what} is already running (lock {}); waiting for it",
                        path.display()
                    ));
                    announced = true;
                }
                sleep_or_cancel(LOCK_POLL_INTERVAL, cancel, "waiting for a lock").await?;
            }
            Err((_, errno)) => {
                return Err(InstallError::new(format!(
                    "cannot lock {}: {errno}",
                    path.display()
                )))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gantry_types::InstallProgress;
    use tokio::sync::watch;

    #[tokio::test]
    async fn a_second_locker_waits_and_reports_it() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join(".lock");
        let (sender, receiver) = watch::channel(InstallProgress::default());
        let mut first_reporter = Reporter::new(&sender, "a", "1");
        let cancel = CancellationToken::new();
        let first = lock_exclusive(&path, "first", &mut first_reporter, &cancel)
            .await
            .expect("first lock");
        assert_eq!(receiver.borrow().phase, "");

        let (second_sender, mut second_receiver) = watch::channel(InstallProgress::default());
        let second_path = path.clone();
        let second_cancel = cancel.clone();
        let second = tokio::spawn(async move {
            let mut reporter = Reporter::new(&second_sender, "b", "1");
            lock_exclusive(&second_path, "a build", &mut reporter, &second_cancel)
                .await
                .map(drop)
        });
        second_receiver
            .wait_for(|progress| progress.phase == "waiting")
            .await
            .expect("the second locker reports waiting");
        assert!(!second.is_finished());
        drop(first);
        second
            .await
            .expect("task")
            .expect("the second locker gets the lock once the first lets go");
    }

    #[tokio::test]
    async fn waiting_for_a_lock_ends_on_cancel() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join(".lock");
        let (sender, _receiver) = watch::channel(InstallProgress::default());
        let mut reporter = Reporter::new(&sender, "a", "1");
        let _held = lock_exclusive(&path, "first", &mut reporter, &CancellationToken::new())
            .await
            .expect("first lock");
        let cancel = CancellationToken::new();
        cancel.cancel();
        let error = lock_exclusive(&path, "second", &mut reporter, &cancel)
            .await
            .expect_err("cancelled");
        assert_eq!(error.message, "waiting for a lock was cancelled");
    }
}
