//! Backend processes: the output of one start (its log file and stderr tail), and the
//! group(s) of one start, stopped as one.
//!
//! A [`ProcessSet`] holds the leaders the [`Host`](super::host::Host) started. Stopping
//! escalates: SIGTERM (and SIGCONT, so a frozen group acts on it) to every group, up to the
//! grace period for the leaders to exit and the groups to empty, then SIGKILL. A set that
//! is dropped without [`ProcessSet::terminate`] (a panic, a runtime shutting down) sends
//! SIGKILL to every group it still owns, so no backend outlives the supervisor that
//! started it.

use std::io;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::task::TaskTracker;

use super::host::{Child, Host};
use crate::logs::{CappedLog, StderrTail};
use gantry_backends::BackendCommand;

/// How often a stopping group is checked for exit.
const STOP_POLL_INTERVAL: Duration = Duration::from_millis(25);
/// How long SIGKILL gets to take effect before the supervisor gives up waiting (a process
/// in uninterruptible sleep, say a GPU driver call, cannot be killed until it returns).
const KILL_WAIT: Duration = Duration::from_secs(10);
/// How long the output pumps get to drain once a group is gone. A process that left the
/// group (`setsid`) may hold the pipes open forever; its output is then cut off.
const PUMP_DRAIN: Duration = Duration::from_secs(2);

/// Where the output of one start goes: the start's log file and the stderr tail.
#[derive(Debug)]
pub(crate) struct OutputSink {
    log: Option<CappedLog>,
    tail: StderrTail,
    /// Whether a failed log write was already reported (reported once per start).
    log_error_reported: bool,
}

pub(crate) type SharedSink = Arc<Mutex<OutputSink>>;

impl OutputSink {
    pub(crate) fn new(log: Option<CappedLog>, tail_lines: usize) -> SharedSink {
        Arc::new(Mutex::new(Self {
            log,
            tail: StderrTail::new(tail_lines),
            log_error_reported: false,
        }))
    }

    pub(crate) fn line(&mut self, prefix: &str, line: &[u8], from_stderr: bool) {
        let mut owned;
        let line = if prefix.is_empty() {
            line
        } else {
            owned = Vec::with_capacity(prefix.len() + line.len());
            owned.extend_from_slice(prefix.as_bytes());
            owned.extend_from_slice(line);
            &owned[..]
        };
        if from_stderr {
            self.tail.push(line);
        }
        self.write_log(line);
    }

    /// A line from gantry itself (what was started, how it ended), marked as such.
    pub(crate) fn note(&mut self, text: &str) {
        self.write_log(format!("[gantry] {text}").as_bytes());
    }

    fn write_log(&mut self, line: &[u8]) {
        let Some(log) = self.log.as_mut() else {
            return;
        };
        if let Err(e) = log.write_line(line) {
            if !self.log_error_reported {
                self.log_error_reported = true;
                tracing::warn!(path = %log.path().display(), "cannot write backend log: {e:#}");
            }
        }
    }

    pub(crate) fn stderr_tail(&self) -> &StderrTail {
        &self.tail
    }
}

pub(crate) fn lock_sink(sink: &SharedSink) -> MutexGuard<'_, OutputSink> {
    // The sink holds no invariant a panicking writer could break halfway.
    sink.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// One backend process, leader of its own process group (its pid is the group id).
#[derive(Debug)]
pub(crate) struct BackendProcess {
    pub(crate) rank: usize,
    pub(crate) pid: u32,
    child: Box<dyn Child>,
    /// Set once the leader has been reaped.
    exit: Option<Result<ExitStatus, String>>,
}

/// The processes of one start of an instance (one, or N for data parallelism), and the
/// tasks pumping their output.
#[derive(Debug)]
pub(crate) struct ProcessSet {
    processes: Vec<BackendProcess>,
    pumps: Vec<JoinHandle<()>>,
    /// Whether every group is known to be gone; the drop guard does nothing then.
    terminated: bool,
}

impl ProcessSet {
    pub(crate) fn new() -> Self {
        Self {
            processes: Vec::new(),
            pumps: Vec::new(),
            terminated: false,
        }
    }

    pub(crate) fn pids(&self) -> Vec<u32> {
        self.processes.iter().map(|p| p.pid).collect()
    }

    /// Starts `command` on `host` as rank `rank` in a new process group, its stdout and
    /// stderr pumped into `sink` with `prefix` on every line. Must run on a runtime worker
    /// thread (see [`super::host::system`]).
    pub(crate) fn spawn(
        &mut self,
        host: &dyn Host,
        command: &BackendCommand,
        rank: usize,
        prefix: String,
        sink: &SharedSink,
        tracker: &TaskTracker,
    ) -> io::Result<u32> {
        let spawned = host.spawn(command, prefix, sink, tracker)?;
        let pid = spawned.child.pid();
        self.pumps.extend(spawned.pumps);
        self.processes.push(BackendProcess {
            rank,
            pid,
            child: spawned.child,
            exit: None,
        });
        Ok(pid)
    }

    /// Waits until any process of the set exits and says which, and how. Cancel-safe.
    /// Never completes when no process is left running.
    pub(crate) async fn wait_any_exit(&mut self) -> (usize, u32, Result<ExitStatus, String>) {
        let waits: Vec<_> = self
            .processes
            .iter_mut()
            .filter(|p| p.exit.is_none())
            .map(|p| {
                Box::pin(async move {
                    let result = p.child.wait().await;
                    p.exit = Some(result.clone());
                    (p.rank, p.pid, result)
                })
            })
            .collect();
        if waits.is_empty() {
            return std::future::pending().await;
        }
        futures_util::future::select_all(waits).await.0
    }

    /// Stops every group: SIGTERM to each, up to `grace` for the leaders to exit and the
    /// groups to empty, then SIGKILL to whatever is left; reaps the leaders and lets the
    /// output pumps drain. When this returns, no process of the set is alive (short of one
    /// the kernel cannot kill, which is logged).
    pub(crate) async fn terminate(&mut self, grace: Duration) {
        for process in &self.processes {
            process.child.signal_group(Signal::SIGTERM);
            // A stopped (frozen) group acts on SIGTERM only once it runs again.
            process.child.signal_group(Signal::SIGCONT);
        }
        let graceful = Instant::now() + grace;
        if !self.wait_gone(graceful).await {
            for process in &self.processes {
                tracing::debug!(
                    pid = process.pid,
                    "backend group still alive after the grace period; sending SIGKILL"
                );
                process.child.signal_group(Signal::SIGKILL);
            }
            if !self.wait_gone(Instant::now() + KILL_WAIT).await {
                tracing::error!(
                    pids = ?self.pids(),
                    "backend process group(s) survived SIGKILL for {KILL_WAIT:?}; giving up on them"
                );
            }
        }
        self.terminated = true;
        self.drain_pumps().await;
    }

    /// Polls until every leader is reaped and every group is empty, or `deadline`.
    async fn wait_gone(&mut self, deadline: Instant) -> bool {
        loop {
            let mut all_gone = true;
            for process in &mut self.processes {
                if process.exit.is_none() {
                    match process.child.try_wait() {
                        Ok(Some(status)) => process.exit = Some(Ok(status)),
                        Ok(None) => all_gone = false,
                        Err(e) => process.exit = Some(Err(e)),
                    }
                }
                if process.exit.is_some() && process.child.group_alive() {
                    all_gone = false;
                }
            }
            if all_gone {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(STOP_POLL_INTERVAL).await;
        }
    }

    async fn drain_pumps(&mut self) {
        let drain_until = Instant::now() + PUMP_DRAIN;
        for mut pump in self.pumps.drain(..) {
            if tokio::time::timeout_at(drain_until, &mut pump)
                .await
                .is_err()
            {
                // Something outside the group still holds the pipe; stop reading it.
                pump.abort();
            }
        }
    }
}

impl Drop for ProcessSet {
    fn drop(&mut self) {
        if self.terminated {
            return;
        }
        // Dropped while processes may run: kill_on_drop would reach the leaders only.
        for process in &self.processes {
            process.child.signal_group(Signal::SIGKILL);
        }
    }
}

/// "exited with status 1", "killed by signal 9 (SIGKILL)".
pub(crate) fn describe_exit(exit: &Result<ExitStatus, String>) -> String {
    match exit {
        Err(e) => format!("could not be waited for ({e})"),
        Ok(status) => {
            if let Some(code) = status.code() {
                format!("exited with status {code}")
            } else if let Some(signal) = status.signal() {
                match Signal::try_from(signal) {
                    Ok(name) => format!("was killed by signal {signal} ({name})"),
                    Err(_) => format!("was killed by signal {signal}"),
                }
            } else {
                format!("ended ({status})")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describe_exit_names_codes_and_signals() {
        assert_eq!(
            describe_exit(&Ok(ExitStatus::from_raw(1 << 8))),
            "exited with status 1"
        );
        assert_eq!(
            describe_exit(&Ok(ExitStatus::from_raw(9))),
            "was killed by signal 9 (SIGKILL)"
        );
    }
}
