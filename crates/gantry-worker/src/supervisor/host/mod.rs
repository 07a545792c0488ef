//! The seam between an instance task and the world outside it. Everything the task does
//! to a backend goes through one [`Host`]: start a process group, signal it, wait for it,
//! ask it for its health or load over HTTP, count the connections open to it.
//!
//! The production host ([`system::SystemHost`]) forks real processes and speaks HTTP with
//! `reqwest`. The test double ([`fake::FakeHost`], tests only) plays scripted processes on
//! tokio's clock, so the task's rules (backoff, crash loops, readiness deadlines, health
//! thresholds, drains, stop grace) are tested in paused time, in milliseconds; the tests
//! in `tests/supervisor` keep checking the real processes.
//!
//! The task holds the host as `Arc<dyn Host>`: a boxed future per probe costs nothing
//! beside an HTTP request, and keeps the instance task free of type parameters.

#[cfg(test)]
pub(crate) mod fake;
pub(crate) mod system;

use std::io;
use std::process::ExitStatus;
use std::time::Duration;

use futures_util::future::BoxFuture;
use gantry_backends::BackendCommand;
use nix::sys::signal::Signal;
use tokio::task::JoinHandle;
use tokio_util::task::TaskTracker;

use super::process::SharedSink;

/// What an instance task needs from the machine it runs on.
pub(crate) trait Host: Send + Sync + 'static {
    /// Starts `command` as the leader of a new process group, its stdout and stderr written
    /// into `sink` line by line with `prefix` in front, by tasks tracked by `tracker`. Must
    /// be called from an async task on a runtime worker thread (see [`system`]).
    fn spawn(
        &self,
        command: &BackendCommand,
        prefix: String,
        sink: &SharedSink,
        tracker: &TaskTracker,
    ) -> io::Result<Spawned>;

    /// `GET url`, answered (status and body) within `timeout`.
    fn get<'a>(
        &'a self,
        url: &'a str,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Answer, GetError>>;

    /// The established TCP connections whose local end is one of `ports`: what a drain
    /// waits on for a backend that does not tell its load.
    fn open_connections(&self, ports: &[u16]) -> Result<u64, String>;
}

/// A started process group: its leader, and the tasks pumping its output (they end when
/// every holder of the pipes is gone).
pub(crate) struct Spawned {
    pub(crate) child: Box<dyn Child>,
    pub(crate) pumps: Vec<JoinHandle<()>>,
}

/// The leader of one backend's process group.
pub(crate) trait Child: Send + std::fmt::Debug {
    /// The leader's pid, which is also the group's id.
    fn pid(&self) -> u32;

    /// Waits until the leader exits and reaps it. Cancel-safe: dropping the future loses
    /// nothing, and a later call waits again.
    fn wait(&mut self) -> BoxFuture<'_, Result<ExitStatus, String>>;

    /// The leader's exit, if it has exited; reaps it.
    fn try_wait(&mut self) -> Result<Option<ExitStatus>, String>;

    /// Sends `signal` to every process of the group; a group that is gone is fine.
    fn signal_group(&self, signal: Signal);

    /// Whether any process of the group is still alive (zombies do not count).
    fn group_alive(&self) -> bool;
}

/// An HTTP answer: its status and body.
#[derive(Debug, Clone)]
pub(crate) struct Answer {
    pub(crate) status: reqwest::StatusCode,
    pub(crate) body: String,
}

/// Why a `GET` got no answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum GetError {
    /// Nothing answered within the time allowed.
    Timeout,
    /// Nothing listens there (yet, or any more).
    Refused,
    /// Anything else, as the client says it.
    Other(String),
}
