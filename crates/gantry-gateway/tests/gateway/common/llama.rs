//! A real llama.cpp `llama-server` serving the tiny model this project writes, for the
//! tests about what real backends send.
//!
//! Needs `GANTRY_LLAMA_SERVER` (scripts/build-llama-server.sh prints it; scripts/test.sh
//! sets it). Without it the tests fail with a message saying so; they never skip.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use reqwest::StatusCode;

use super::{free_port, TestGateway};

/// How long llama-server may take to load the tiny model.
const READY_DEADLINE: Duration = Duration::from_secs(60);

/// A real llama-server serving the tiny model; killed when dropped.
pub struct LlamaServer {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl LlamaServer {
    /// Starts one and waits for `/health`. A port free a moment ago can be taken
    /// before the server binds it, so a few ports are tried.
    async fn start(dir: &Path, model: &Path) -> Self {
        let binary = gantry_testkit::llama_server();
        let mut failures = Vec::new();
        for _ in 0..3 {
            let port = free_port();
            let log = dir.join(format!("llama-server-{port}.log"));
            let child = Command::new(&binary)
                .arg("-m")
                .arg(model)
                .args(["-c", "256", "-t", "1", "-tb", "1", "-np", "1"])
                .args(["--host", "127.0.0.1", "--port", &port.to_string()])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).unwrap())
                .spawn()
                .unwrap_or_else(|e| panic!("spawn {}: {e}", binary.display()));
            let mut server = Self { child, port, log };
            match server.wait_healthy().await {
                Ok(()) => return server,
                Err(e) => failures.push(e),
            }
        }
        panic!("llama-server did not start: {failures:#?}");
    }

    async fn wait_healthy(&mut self) -> Result<(), String> {
        let client = reqwest::Client::new();
        let url = format!("http://127.0.0.1:{}/health", self.port);
        let deadline = tokio::time::Instant::now() + READY_DEADLINE;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Err(format!("exited with {status}: {}", self.log_tail()));
            }
            if let Ok(response) = client.get(&url).send().await {
                if response.status() == StatusCode::OK {
                    return Ok(());
                }
            }
            if tokio::time::Instant::now() > deadline {
                return Err(format!(
                    "not healthy after {READY_DEADLINE:?}: {}",
                    self.log_tail()
                ));
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// SIGSTOP: the process keeps its socket, so connections are still accepted (by
    /// the kernel), but nothing is answered: a hung backend.
    pub fn freeze(&self) {
        self.signal(nix::sys::signal::Signal::SIGSTOP);
    }

    /// SIGCONT after [`LlamaServer::freeze`].
    pub fn thaw(&self) {
        self.signal(nix::sys::signal::Signal::SIGCONT);
    }

    fn signal(&self, signal: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).unwrap());
        nix::sys::signal::kill(pid, signal).unwrap_or_else(|e| panic!("{signal} {pid}: {e}"));
    }

    /// SIGKILL, and wait until the process is gone.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for LlamaServer {
    fn drop(&mut self) {
        self.kill();
    }
}

impl TestGateway {
    /// A real llama-server serving the tiny model (written on first use).
    pub async fn llama_server(&self) -> LlamaServer {
        let model = self.dir().join("tiny-llama.gguf");
        if !model.exists() {
            gantry_gguf::write_tiny_llama(&model).unwrap();
        }
        LlamaServer::start(self.dir(), &model).await
    }
}
