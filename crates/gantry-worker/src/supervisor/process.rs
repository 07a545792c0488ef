//! Backend processes: spawning each in its own process group tied to the worker's life,
//! pumping its output into the log file and the stderr tail, and stopping the whole group.
//!
//! **Spawn from an async task, never from `spawn_blocking`.** Children get
//! `PR_SET_PDEATHSIG(SIGKILL)`, so the kernel kills them when the worker dies, even by
//! `kill -9`. But the kernel ties that signal to the *thread* that forked the child, not to
//! the process: a child forked from a blocking-pool thread would be killed as soon as that
//! thread idles out (tokio ends idle blocking threads after 10 s). Runtime worker threads live
//! as long as the runtime, so the supervisor spawns only from its instance tasks.
//!
//! Every backend is the leader of a new process group (`process_group(0)`), so signals reach
//! whatever it forks too (vLLM and SGLang fork worker processes). A [`ProcessSet`] that is
//! dropped without [`ProcessSet::terminate`] (a panic, a runtime shutting down) sends SIGKILL
//! to every group it still owns, so no backend outlives the supervisor that started it.

use std::fs;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::{Child, Command};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::task::TaskTracker;

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
/// A line longer than this is written in pieces, so memory stays bounded.
const MAX_LINE_BYTES: usize = 16 * 1024;

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

    fn line(&mut self, prefix: &str, line: &[u8], from_stderr: bool) {
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
    child: Child,
    /// Set once the leader has been reaped.
    exit: Option<Result<ExitStatus, String>>,
}

impl BackendProcess {
    fn pgid(&self) -> Pid {
        Pid::from_raw(i32::try_from(self.pid).expect("pids fit in pid_t"))
    }
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

    /// Spawns `command` as rank `rank` in a new process group, its stdout and stderr pumped
    /// into `sink` with `prefix` on every line. Must run on a runtime worker thread (see the
    /// module docs).
    pub(crate) fn spawn(
        &mut self,
        command: &BackendCommand,
        rank: usize,
        prefix: String,
        sink: &SharedSink,
        tracker: &TaskTracker,
    ) -> io::Result<u32> {
        let mut cmd = Command::new(&command.program);
        cmd.args(&command.args)
            .envs(&command.env)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        let worker_pid = nix::unistd::getpid();
        // SAFETY: the closure runs in the forked child before exec and calls only
        // async-signal-safe functions (prctl, getppid) and builds errors without allocating.
        unsafe {
            cmd.pre_exec(move || {
                nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(io::Error::from)?;
                // The worker may have died between fork and prctl; then the death signal
                // was never armed and the child would live on as an orphan.
                if nix::unistd::getppid() != worker_pid {
                    return Err(io::Error::from(Errno::ESRCH));
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn()?;
        let pid = child
            .id()
            .expect("a child that was just spawned has not been reaped");
        if let Some(stdout) = child.stdout.take() {
            self.pumps.push(tracker.spawn(pump_lines(
                stdout,
                prefix.clone(),
                Arc::clone(sink),
                false,
            )));
        }
        if let Some(stderr) = child.stderr.take() {
            self.pumps
                .push(tracker.spawn(pump_lines(stderr, prefix, Arc::clone(sink), true)));
        }
        self.processes.push(BackendProcess {
            rank,
            pid,
            child,
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
                    let result = p.child.wait().await.map_err(|e| format!("{e:#}"));
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
            signal_group(process.pgid(), Signal::SIGTERM);
            // A stopped (frozen) group acts on SIGTERM only once it runs again.
            signal_group(process.pgid(), Signal::SIGCONT);
        }
        let graceful = Instant::now() + grace;
        if !self.wait_gone(graceful).await {
            for process in &self.processes {
                tracing::debug!(
                    pid = process.pid,
                    "backend group still alive after the grace period; sending SIGKILL"
                );
                signal_group(process.pgid(), Signal::SIGKILL);
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
                        Err(e) => process.exit = Some(Err(format!("{e:#}"))),
                    }
                }
                if process.exit.is_some() && group_has_live_members(process.pgid()) {
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
            signal_group(process.pgid(), Signal::SIGKILL);
        }
    }
}

/// Sends `signal` to the process group `pgid`; a group that is already gone is fine.
fn signal_group(pgid: Pid, signal: Signal) {
    match killpg(pgid, signal) {
        Ok(()) | Err(Errno::ESRCH) => {}
        Err(e) => tracing::warn!(pgid = pgid.as_raw(), "cannot send {signal} to group: {e}"),
    }
}

/// Whether the process group has a member that is not a zombie. A zombie still counts for
/// `kill(-pgid, 0)`, and an orphaned grandchild that died stays a zombie until whoever
/// adopted it (init, or a container's PID 1 that may never reap) collects it; it holds no
/// resources, so it does not count as alive.
pub(crate) fn group_has_live_members(pgid: Pid) -> bool {
    if let Err(Errno::ESRCH) = killpg(pgid, None) {
        return false;
    }
    let Ok(entries) = fs::read_dir("/proc") else {
        // Without /proc, trust kill(2).
        return true;
    };
    entries.flatten().any(|entry| {
        let name = entry.file_name();
        let Some(pid) = name.to_str().filter(|n| n.bytes().all(|b| b.is_ascii_digit())) else {
            return false;
        };
        let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
            return false;
        };
        matches!(parse_stat(&stat), Some((state, pgrp)) if pgrp == pgid.as_raw() && state != 'Z' && state != 'X')
    })
}

/// The state and process group of a `/proc/<pid>/stat` line. The command name is in
/// parentheses and may itself contain spaces and parentheses, so fields are counted from
/// the last `)`.
fn parse_stat(stat: &str) -> Option<(char, i32)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let _ppid = fields.next()?;
    let pgrp = fields.next()?.parse().ok()?;
    Some((state, pgrp))
}

/// Reads `reader` to its end, line by line, into `sink`.
async fn pump_lines<R: AsyncRead + Unpin>(
    mut reader: R,
    prefix: String,
    sink: SharedSink,
    from_stderr: bool,
) {
    let mut buffer = vec![0u8; 8 * 1024];
    let mut pending: Vec<u8> = Vec::new();
    loop {
        let read = match reader.read(&mut buffer).await {
            Ok(0) => break,
            Ok(read) => read,
            Err(e) => {
                tracing::debug!("backend output pipe failed: {e:#}");
                break;
            }
        };
        pending.extend_from_slice(&buffer[..read]);
        let mut sink = lock_sink(&sink);
        let mut consumed = 0;
        while let Some(newline) = pending[consumed..].iter().position(|b| *b == b'\n') {
            let end = consumed + newline + 1;
            sink.line(&prefix, &pending[consumed..end], from_stderr);
            consumed = end;
        }
        pending.drain(..consumed);
        if pending.len() > MAX_LINE_BYTES {
            sink.line(&prefix, &pending, from_stderr);
            pending.clear();
        }
    }
    if !pending.is_empty() {
        lock_sink(&sink).line(&prefix, &pending, from_stderr);
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
    fn parse_stat_counts_fields_after_the_command_name() {
        let stat = "1234 (python3 (x) y) S 1 1230 1230 0 -1 4194560";
        assert_eq!(parse_stat(stat), Some(('S', 1230)));
        assert_eq!(parse_stat("garbage"), None);
    }

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
