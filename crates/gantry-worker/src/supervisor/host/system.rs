//! The production [`Host`]: real process groups and real HTTP.
//!
//! **Spawn from an async task, never from `spawn_blocking`.** Children get
//! `PR_SET_PDEATHSIG(SIGKILL)`, so the kernel kills them when the worker dies, even by
//! `kill -9`. But the kernel ties that signal to the *thread* that forked the child, not to
//! the process: a child forked from a blocking-pool thread would be killed as soon as that
//! thread idles out (tokio ends idle blocking threads after 10 s). Runtime worker threads live
//! as long as the runtime, so the supervisor spawns only from its instance tasks.
//!
//! Every backend is the leader of a new process group (`process_group(0)`), so signals reach
//! whatever it forks too (vLLM and SGLang fork worker processes).

use std::fs;
use std::io;
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use gantry_backends::BackendCommand;
use nix::errno::Errno;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::Command;
use tokio_util::task::TaskTracker;

use super::{Answer, Child, GetError, Host, Spawned};
use crate::supervisor::drain::open_connections;
use crate::supervisor::process::{lock_sink, SharedSink};

/// A line longer than this is written in pieces, so memory stays bounded.
const MAX_LINE_BYTES: usize = 16 * 1024;

/// Real processes, and HTTP through one client (see `readiness::probe_client`).
pub(crate) struct SystemHost {
    http: reqwest::Client,
}

impl SystemHost {
    pub(crate) fn new(http: reqwest::Client) -> Self {
        Self { http }
    }
}

impl Host for SystemHost {
    fn spawn(
        &self,
        command: &BackendCommand,
        prefix: String,
        sink: &SharedSink,
        tracker: &TaskTracker,
    ) -> io::Result<Spawned> {
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
        let mut pumps = Vec::with_capacity(2);
        if let Some(stdout) = child.stdout.take() {
            pumps.push(tracker.spawn(pump_lines(stdout, prefix.clone(), Arc::clone(sink), false)));
        }
        if let Some(stderr) = child.stderr.take() {
            pumps.push(tracker.spawn(pump_lines(stderr, prefix, Arc::clone(sink), true)));
        }
        Ok(Spawned {
            child: Box::new(SystemChild { pid, child }),
            pumps,
        })
    }

    fn get<'a>(
        &'a self,
        url: &'a str,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Answer, GetError>> {
        Box::pin(async move {
            let answer = async {
                let response = self.http.get(url).send().await?;
                let status = response.status();
                let body = response.text().await?;
                Ok::<_, reqwest::Error>(Answer { status, body })
            };
            match tokio::time::timeout(timeout, answer).await {
                Err(_) => Err(GetError::Timeout),
                Ok(Ok(answer)) => Ok(answer),
                Ok(Err(e)) if e.is_connect() => Err(GetError::Refused),
                Ok(Err(e)) if e.is_timeout() => Err(GetError::Timeout),
                Ok(Err(e)) => Err(GetError::Other(e.to_string())),
            }
        })
    }

    fn open_connections(&self, ports: &[u16]) -> Result<u64, String> {
        open_connections(ports)
    }
}

/// A real process group's leader.
#[derive(Debug)]
struct SystemChild {
    pid: u32,
    child: tokio::process::Child,
}

impl SystemChild {
    fn pgid(&self) -> Pid {
        Pid::from_raw(i32::try_from(self.pid).expect("pids fit in pid_t"))
    }
}

impl Child for SystemChild {
    fn pid(&self) -> u32 {
        self.pid
    }

    fn wait(&mut self) -> BoxFuture<'_, Result<ExitStatus, String>> {
        Box::pin(async move { self.child.wait().await.map_err(|e| format!("{e:#}")) })
    }

    fn try_wait(&mut self) -> Result<Option<ExitStatus>, String> {
        self.child.try_wait().map_err(|e| format!("{e:#}"))
    }

    fn signal_group(&self, signal: Signal) {
        match killpg(self.pgid(), signal) {
            Ok(()) | Err(Errno::ESRCH) => {}
            Err(e) => tracing::warn!(pgid = self.pid, "cannot send {signal} to group: {e}"),
        }
    }

    fn group_alive(&self) -> bool {
        group_has_live_members(self.pgid())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_stat_counts_fields_after_the_command_name() {
        let stat = "1234 (python3 (x) y) S 1 1230 1230 0 -1 4194560";
        assert_eq!(parse_stat(stat), Some(('S', 1230)));
        assert_eq!(parse_stat("garbage"), None);
    }
}
