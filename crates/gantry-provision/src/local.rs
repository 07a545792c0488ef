//! `local`: machines that are `gantry worker` processes on the server's own machine, with
//! simulated GPUs of the pool's shape, for trying pools (and their scaling) without a
//! cloud. Each listens on loopback only, keeps its state in `<state dir>/<machine>/` (its
//! log in `worker.log` there, its process id in `pid`), takes a block of ports for its
//! backends from the provider's range, and stops when the server that started it exits
//! (it is sent SIGTERM then, and stops its backends as a worker does).

use std::collections::HashMap;
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::{Machine, MachineRequest, ProviderError};

/// Ports each machine's backends get.
pub const PORTS_PER_MACHINE: u16 = 10;
/// How long a worker has to stop before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(30);

/// The worker processes this server started, shared by every local pool.
#[derive(Debug)]
pub struct LocalProcesses {
    /// The gantry executable to run as `gantry worker`.
    pub program: PathBuf,
    /// Where machines keep their state.
    pub state_dir: PathBuf,
    /// Ports handed out to machines' backends, in blocks of [`PORTS_PER_MACHINE`].
    pub ports: RangeInclusive<u16>,
    children: Mutex<HashMap<String, tokio::process::Child>>,
}

impl LocalProcesses {
    pub fn new(program: PathBuf, state_dir: PathBuf, ports: RangeInclusive<u16>) -> Arc<Self> {
        Arc::new(Self {
            program,
            state_dir,
            ports,
            children: Mutex::new(HashMap::new()),
        })
    }

    fn children(&self) -> std::sync::MutexGuard<'_, HashMap<String, tokio::process::Child>> {
        self.children.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[derive(Debug)]
pub struct Local {
    processes: Arc<LocalProcesses>,
}

/// The process id in `dir/pid`, when that process is alive.
fn running_pid(dir: &Path) -> Option<i32> {
    let pid: i32 = std::fs::read_to_string(dir.join("pid"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    // Signal 0 asks only whether the process exists; a zombie (exited, not reaped) is
    // not running.
    kill(Pid::from_raw(pid), None).ok()?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let state = stat.rsplit_once(") ")?.1.chars().next()?;
    (state != 'Z').then_some(pid)
}

/// The machine's number: what follows the last `-` of its name.
fn number(name: &str) -> u16 {
    name.rsplit_once('-')
        .and_then(|(_, n)| n.parse().ok())
        .unwrap_or(1)
}

impl Local {
    pub fn new(processes: Arc<LocalProcesses>) -> Self {
        Self { processes }
    }

    fn dir(&self, name: &str) -> PathBuf {
        self.processes.state_dir.join(name)
    }

    /// The machine's block of backend ports.
    fn ports(&self, name: &str) -> Result<RangeInclusive<u16>, ProviderError> {
        let range = &self.processes.ports;
        let blocks = (range.end() - range.start() + 1) / PORTS_PER_MACHINE;
        if blocks == 0 {
            return Err(ProviderError(format!(
                "the local pool port range {}-{} holds fewer than {PORTS_PER_MACHINE} ports",
                range.start(),
                range.end()
            )));
        }
        let start = range.start() + (number(name).saturating_sub(1) % blocks) * PORTS_PER_MACHINE;
        Ok(start..=start + PORTS_PER_MACHINE - 1)
    }

    pub async fn find(&self, name: &str) -> Result<Option<Machine>, ProviderError> {
        Ok(running_pid(&self.dir(name)).map(|pid| Machine {
            external_id: pid.to_string(),
            address: Some("127.0.0.1".to_owned()),
        }))
    }

    pub async fn create(&self, request: &MachineRequest) -> Result<Machine, ProviderError> {
        let dir = self.dir(&request.name);
        std::fs::create_dir_all(&dir).map_err(|e| {
            ProviderError(format!(
                "cannot make the machine's directory {}: {e}",
                dir.display()
            ))
        })?;
        let log = std::fs::File::create(dir.join("worker.log")).map_err(|e| {
            ProviderError(format!(
                "cannot write {}: {e}",
                dir.join("worker.log").display()
            ))
        })?;
        let log_err = log
            .try_clone()
            .map_err(|e| ProviderError(format!("cannot write the worker's log: {e}")))?;
        let worker_port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| ProviderError(format!("no free loopback port for the worker: {e}")))?
            .port();
        let ports = self.ports(&request.name)?;
        let mut command = tokio::process::Command::new(&self.processes.program);
        command
            .arg("worker")
            .args(["--server-url", &request.server_urls.join(",")])
            // In the environment, not on the command line, where `ps` would show it.
            .env("GANTRY_TOKEN", &request.cluster_token)
            .args(["--worker-name", &request.name])
            .args(["--simulate-gpus", &request.gpus])
            .arg("--data-dir")
            .arg(&dir)
            .args(["--worker-host", "127.0.0.1"])
            .args(["--worker-port", &worker_port.to_string()])
            .args(["--advertise-host", "127.0.0.1"])
            .args(["--backend-host", "127.0.0.1"])
            .args([
                "--port-range",
                &format!("{}-{}", ports.start(), ports.end()),
            ])
            .stdin(std::process::Stdio::null())
            .stdout(log)
            .stderr(log_err);
        for (key, value) in &request.labels {
            command.args(["--label", &format!("{key}={value}")]);
        }
        let server_pid = nix::unistd::getpid();
        // SAFETY: the closure runs in the forked child before exec and calls only
        // async-signal-safe functions (prctl, getppid).
        unsafe {
            command.pre_exec(move || {
                nix::sys::prctl::set_pdeathsig(Signal::SIGTERM).map_err(std::io::Error::from)?;
                // The server may have died between fork and prctl, leaving the signal
                // unarmed and the worker an orphan.
                if nix::unistd::getppid() != server_pid {
                    return Err(std::io::Error::from(nix::errno::Errno::ESRCH));
                }
                Ok(())
            });
        }
        let child = command.spawn().map_err(|e| {
            ProviderError(format!(
                "cannot start {} worker: {e}",
                self.processes.program.display()
            ))
        })?;
        let pid = child
            .id()
            .ok_or_else(|| ProviderError("the worker exited as soon as it started".into()))?;
        std::fs::write(dir.join("pid"), pid.to_string())
            .map_err(|e| ProviderError(format!("cannot write the worker's pid file: {e}")))?;
        self.processes
            .children()
            .insert(request.name.clone(), child);
        tracing::info!(machine = %request.name, pid, worker_port, backend_ports = ?ports, "started a local pool worker");
        Ok(Machine {
            external_id: pid.to_string(),
            address: Some("127.0.0.1".to_owned()),
        })
    }

    pub async fn delete(
        &self,
        name: &str,
        _external_id: Option<&str>,
    ) -> Result<(), ProviderError> {
        let mut child = self.processes.children().remove(name);
        let dir = self.dir(name);
        if let Some(pid) = running_pid(&dir) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
            let deadline = tokio::time::Instant::now() + STOP_GRACE;
            loop {
                // A child of this server is reaped here; one of an earlier server was
                // reaped by init.
                if let Some(child) = child.as_mut() {
                    let _ = child.try_wait();
                }
                if running_pid(&dir).is_none() {
                    break;
                }
                if tokio::time::Instant::now() >= deadline {
                    let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        if let Some(mut child) = child {
            let _ = child.wait().await;
        }
        let _ = std::fs::remove_file(dir.join("pid"));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn machines_get_blocks_of_ports_in_turn() {
        let local = Local::new(LocalProcesses::new(
            "gantry".into(),
            "/tmp".into(),
            42000..=42019,
        ));
        assert_eq!(local.ports("p-1").unwrap(), 42000..=42009);
        assert_eq!(local.ports("p-2").unwrap(), 42010..=42019);
        assert_eq!(local.ports("p-3").unwrap(), 42000..=42009);
    }
}
