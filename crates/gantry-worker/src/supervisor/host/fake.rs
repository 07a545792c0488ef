//! A TEST DOUBLE of [`Host`]: scripted backend processes on tokio's clock, so the instance
//! task's timing rules are tested in paused time.
//!
//! Each spawn takes the next [`Script`] queued with [`FakeHost::then`] (the default one when
//! none is queued). A fake process "listens" on the port after `--port` in its command; a
//! `GET` to that port is refused while nothing runs there, answered 503 until the script
//! says the process is ready, 200 after, and never answered (a timeout) once it froze.
//! Signals follow POSIX defaults: SIGTERM ends it unless the script ignores it, SIGKILL
//! always does, SIGCONT does nothing. Every spawn and signal is recorded with its time.

use std::collections::VecDeque;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::future::BoxFuture;
use gantry_backends::BackendCommand;
use nix::sys::signal::Signal;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::task::TaskTracker;

use super::{Answer, Child, GetError, Host, Spawned};
use crate::supervisor::process::{lock_sink, SharedSink};

/// How one fake process behaves, from its spawn.
#[derive(Debug, Clone, Default)]
pub(crate) struct Script {
    /// Its health path answers 200 this long after the spawn; never when `None`.
    pub(crate) ready_after: Option<Duration>,
    /// It exits on its own this long after the spawn, with this status code.
    pub(crate) exits_after: Option<(Duration, i32)>,
    /// It stops answering (probes time out) this long after the spawn.
    pub(crate) freezes_after: Option<Duration>,
    /// SIGTERM does nothing; only SIGKILL ends it.
    pub(crate) ignores_sigterm: bool,
    /// Lines it writes to stderr as it starts.
    pub(crate) stderr: Vec<String>,
    /// The spawn itself fails with this error (no such program, say).
    pub(crate) spawn_error: Option<io::ErrorKind>,
}

impl Script {
    /// A backend that is ready `after` its spawn and runs until signalled.
    pub(crate) fn ready_after(after: Duration) -> Self {
        Self {
            ready_after: Some(after),
            ..Self::default()
        }
    }

    pub(crate) fn exits_after(mut self, after: Duration, code: i32) -> Self {
        self.exits_after = Some((after, code));
        self
    }

    pub(crate) fn freezes_after(mut self, after: Duration) -> Self {
        self.freezes_after = Some(after);
        self
    }

    pub(crate) fn ignoring_sigterm(mut self) -> Self {
        self.ignores_sigterm = true;
        self
    }

    pub(crate) fn stderr(mut self, line: &str) -> Self {
        self.stderr.push(line.to_owned());
        self
    }
}

/// One spawn, as recorded.
#[derive(Debug, Clone)]
pub(crate) struct SpawnRecord {
    pub(crate) pid: u32,
    pub(crate) at: Instant,
    pub(crate) program: String,
    pub(crate) port: Option<u16>,
}

/// The fake machine.
#[derive(Debug)]
pub(crate) struct FakeHost {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    default: Script,
    queued: VecDeque<Script>,
    processes: Vec<Arc<Process>>,
    spawns: Vec<SpawnRecord>,
    next_pid: u32,
    /// `open_connections` answers 1 until then.
    busy_until: Option<Instant>,
}

impl FakeHost {
    /// A host whose processes follow `default` unless a script is queued.
    pub(crate) fn new(default: Script) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State {
                default,
                queued: VecDeque::new(),
                processes: Vec::new(),
                spawns: Vec::new(),
                next_pid: 1000,
                busy_until: None,
            }),
        })
    }

    /// The next spawn follows `script` (scripts queue up in order).
    pub(crate) fn then(&self, script: Script) -> &Self {
        self.state().queued.push_back(script);
        self
    }

    /// Every spawn so far, in order.
    pub(crate) fn spawns(&self) -> Vec<SpawnRecord> {
        self.state().spawns.clone()
    }

    /// The signals sent to the group of `pid`, with when.
    pub(crate) fn signals(&self, pid: u32) -> Vec<(Signal, Instant)> {
        self.process(pid)
            .map(|p| lock(&p.signals).clone())
            .unwrap_or_default()
    }

    /// When the process `pid` ended, and how; `None` while it runs.
    pub(crate) fn ended(&self, pid: u32) -> Option<(Instant, ExitStatus)> {
        self.process(pid).and_then(|p| p.ended())
    }

    /// Whether any fake process still runs.
    pub(crate) fn any_running(&self) -> bool {
        self.state().processes.iter().any(|p| p.ended().is_none())
    }

    /// The backend reports a connection open until `until` (a request in progress).
    pub(crate) fn busy_until(&self, until: Instant) {
        self.state().busy_until = Some(until);
    }

    fn process(&self, pid: u32) -> Option<Arc<Process>> {
        self.state()
            .processes
            .iter()
            .find(|p| p.pid == pid)
            .cloned()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }
}

impl Host for FakeHost {
    fn spawn(
        &self,
        command: &BackendCommand,
        prefix: String,
        sink: &SharedSink,
        _tracker: &TaskTracker,
    ) -> io::Result<Spawned> {
        let mut state = self.state();
        let script = state
            .queued
            .pop_front()
            .unwrap_or_else(|| state.default.clone());
        if let Some(kind) = script.spawn_error {
            return Err(io::Error::from(kind));
        }
        let pid = state.next_pid;
        state.next_pid += 1;
        let port = command
            .args
            .iter()
            .position(|arg| arg == "--port")
            .and_then(|i| command.args.get(i + 1))
            .and_then(|port| port.parse().ok());
        let now = Instant::now();
        {
            let mut sink = lock_sink(sink);
            for line in &script.stderr {
                sink.line(&prefix, format!("{line}\n").as_bytes(), true);
            }
        }
        let (exit, _) = watch::channel(None);
        let process = Arc::new(Process {
            pid,
            port,
            spawned_at: now,
            script,
            exit,
            signals: Mutex::new(Vec::new()),
        });
        state.processes.push(Arc::clone(&process));
        state.spawns.push(SpawnRecord {
            pid,
            at: now,
            program: command.program.clone(),
            port,
        });
        Ok(Spawned {
            child: Box::new(FakeChild { process }),
            pumps: Vec::new(),
        })
    }

    fn get<'a>(
        &'a self,
        url: &'a str,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Answer, GetError>> {
        Box::pin(async move {
            let port: Option<u16> = url
                .strip_prefix("http://")
                .and_then(|rest| rest.split('/').next())
                .and_then(|authority| authority.rsplit_once(':'))
                .and_then(|(_, port)| port.parse().ok());
            let listening = self
                .state()
                .processes
                .iter()
                .rev()
                .find(|p| p.port == port && p.port.is_some() && p.ended().is_none())
                .cloned();
            let Some(process) = listening else {
                return Err(GetError::Refused);
            };
            let now = Instant::now();
            let at = |after: Option<Duration>| after.map(|after| process.spawned_at + after);
            if at(process.script.freezes_after).is_some_and(|frozen| now >= frozen) {
                tokio::time::sleep(timeout).await;
                return Err(GetError::Timeout);
            }
            let ready = at(process.script.ready_after).is_some_and(|ready| now >= ready);
            Ok(Answer {
                status: if ready {
                    reqwest::StatusCode::OK
                } else {
                    reqwest::StatusCode::SERVICE_UNAVAILABLE
                },
                body: if ready { "ok" } else { "loading" }.to_owned(),
            })
        })
    }

    fn open_connections(&self, _ports: &[u16]) -> Result<u64, String> {
        let busy = self
            .state()
            .busy_until
            .is_some_and(|until| Instant::now() < until);
        Ok(u64::from(busy))
    }
}

#[derive(Debug)]
struct Process {
    pid: u32,
    port: Option<u16>,
    spawned_at: Instant,
    script: Script,
    /// Set when a signal ended it.
    exit: watch::Sender<Option<(Instant, ExitStatus)>>,
    signals: Mutex<Vec<(Signal, Instant)>>,
}

impl Process {
    /// When and how it ended: by a signal, or on its own at the scripted time.
    fn ended(&self) -> Option<(Instant, ExitStatus)> {
        let by_signal = *self.exit.borrow();
        let on_its_own = self
            .script
            .exits_after
            .map(|(after, code)| (self.spawned_at + after, ExitStatus::from_raw(code << 8)))
            .filter(|(at, _)| Instant::now() >= *at);
        match (by_signal, on_its_own) {
            (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
            (a, b) => a.or(b),
        }
    }
}

#[derive(Debug)]
struct FakeChild {
    process: Arc<Process>,
}

impl Child for FakeChild {
    fn pid(&self) -> u32 {
        self.process.pid
    }

    fn wait(&mut self) -> BoxFuture<'_, Result<ExitStatus, String>> {
        Box::pin(async move {
            let mut exit = self.process.exit.subscribe();
            loop {
                if let Some((_, status)) = self.process.ended() {
                    return Ok(status);
                }
                let natural = self
                    .process
                    .script
                    .exits_after
                    .map(|(after, _)| self.process.spawned_at + after);
                tokio::select! {
                    _ = exit.changed() => {}
                    () = sleep_until(natural) => {}
                }
            }
        })
    }

    fn try_wait(&mut self) -> Result<Option<ExitStatus>, String> {
        Ok(self.process.ended().map(|(_, status)| status))
    }

    fn signal_group(&self, signal: Signal) {
        let now = Instant::now();
        lock(&self.process.signals).push((signal, now));
        if self.process.ended().is_some() {
            return;
        }
        let ends = match signal {
            Signal::SIGKILL => true,
            Signal::SIGTERM => !self.process.script.ignores_sigterm,
            _ => false,
        };
        if ends {
            let status = ExitStatus::from_raw(signal as i32);
            self.process.exit.send_replace(Some((now, status)));
        }
    }

    fn group_alive(&self) -> bool {
        self.process.ended().is_none()
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
