//! End-to-end harness: `gantry server` and `gantry worker` as real processes on
//! loopback ports, a real `llama-server` (from `GANTRY_LLAMA_SERVER`), and the tiny
//! GGUF model.

#![allow(clippy::unwrap_used, dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};

pub const ADMIN_PASSWORD: &str = "admin-password-1";

/// The llama-server binary the test script built; fails loudly without it.
pub fn llama_server() -> String {
    std::env::var("GANTRY_LLAMA_SERVER").unwrap_or_else(|_| {
        panic!(
            "GANTRY_LLAMA_SERVER is not set: run the tests with scripts/test.sh, which builds \
             llama-server (scripts/build-llama-server.sh) and exports its path"
        )
    })
}

/// A free loopback port (bound and released; good enough for tests).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A child process killed (with its process group) when dropped.
pub struct Process {
    pub child: Option<Child>,
    pub name: String,
    pub log: PathBuf,
}

impl Process {
    pub fn spawn(name: &str, args: &[String], log: &Path, env: &[(&str, String)]) -> Self {
        let out = std::fs::File::create(log).unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_gantry"));
        command
            .args(args)
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .stdin(Stdio::null())
            .env("GANTRY_LOG_LEVEL", "info");
        for (k, v) in env {
            command.env(k, v);
        }
        let child = command.spawn().unwrap();
        Self {
            child: Some(child),
            name: name.to_string(),
            log: log.to_path_buf(),
        }
    }

    pub fn pid(&self) -> i32 {
        i32::try_from(self.child.as_ref().unwrap().id()).unwrap()
    }

    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid()), signal).unwrap();
    }

    /// Sends SIGTERM and waits for the exit status.
    pub fn terminate(&mut self, within: Duration) -> std::process::ExitStatus {
        self.signal(nix::sys::signal::Signal::SIGTERM);
        let mut child = self.child.take().unwrap();
        let deadline = std::time::Instant::now() + within;
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                panic!(
                    "{} did not exit within {within:?}; log:\n{}",
                    self.name,
                    self.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// `gantry start` (server and embedded worker) on a free port, with the test
/// llama-server and a reserved block of backend ports, plus `extra` arguments; returns
/// the process and its base URL once `/healthz` answers.
pub async fn start_gantry(dir: &Path, extra: &[&str]) -> (Process, String) {
    let port = free_port();
    let ports = gantry_testkit::reserve_ports(20);
    let mut args: Vec<String> = vec![
        "start".into(),
        "--data-dir".into(),
        dir.join("data").display().to_string(),
        "--host".into(),
        "127.0.0.1".into(),
        "--port".into(),
        port.to_string(),
        "--llama-server-path".into(),
        llama_server(),
        "--port-range".into(),
        format!("{}-{}", ports.start(), ports.end()),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let gantry = Process::spawn("gantry start", &args, &dir.join("start.log"), &[]);
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    for _ in 0..300 {
        let healthy = http
            .get(format!("{base}/healthz"))
            .send()
            .await
            .is_ok_and(|r| r.status() == 200);
        if healthy {
            return (gantry, base);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "gantry start never served /healthz; log:\n{}",
        gantry.log_text()
    );
}

/// A server process and an admin session.
pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub server: Process,
    pub base: String,
    pub token: String,
    pub http: reqwest::Client,
}

impl Cluster {
    /// Starts `gantry server` on a free port with the given extra arguments.
    pub async fn start(extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        Self::start_in(dir, extra, &[]).await
    }

    pub async fn start_in(dir: tempfile::TempDir, extra: &[&str], env: &[(&str, String)]) -> Self {
        let port = free_port();
        let mut args: Vec<String> = vec![
            "server".into(),
            "--data-dir".into(),
            dir.path().join("server").display().to_string(),
            "--host".into(),
            "127.0.0.1".into(),
            "--port".into(),
            port.to_string(),
            "--bootstrap-password".into(),
            ADMIN_PASSWORD.into(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let server = Process::spawn("server", &args, &dir.path().join("server.log"), env);
        let base = format!("http://127.0.0.1:{port}");
        let http = reqwest::Client::new();
        wait_healthy(&http, &base, &server).await;
        let login: Value = http
            .post(format!("{base}/auth/login"))
            .json(&json!({"username": "admin", "password": ADMIN_PASSWORD}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let token = login["token"].as_str().unwrap().to_string();
        Self {
            dir,
            server,
            base,
            token,
            http,
        }
    }

    pub fn registration_token(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server/registration_token"))
            .unwrap()
            .trim()
            .to_string()
    }

    /// Starts `gantry worker` joining `server_urls` (this server's by default).
    pub fn worker(&self, name: &str, extra: &[&str]) -> Process {
        self.worker_for(&self.base, name, extra)
    }

    pub fn worker_for(&self, server_urls: &str, name: &str, extra: &[&str]) -> Process {
        let mut args: Vec<String> = vec![
            "worker".into(),
            "--data-dir".into(),
            self.dir.path().join(name).display().to_string(),
            "--server-url".into(),
            server_urls.into(),
            "--token".into(),
            self.registration_token(),
            "--name".into(),
            name.into(),
            "--worker-host".into(),
            "127.0.0.1".into(),
            "--worker-port".into(),
            free_port().to_string(),
            "--advertise-host".into(),
            "127.0.0.1".into(),
            "--backend-host".into(),
            "127.0.0.1".into(),
            "--llama-server-path".into(),
            llama_server(),
            "--port-range".into(),
            // Each worker gets its own block so parallel tests do not collide.
            {
                let ports = gantry_testkit::reserve_ports(20);
                format!("{}-{}", ports.start(), ports.end())
            },
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        Process::spawn(
            &format!("worker {name}"),
            &args,
            &self.dir.path().join(format!("{name}.log")),
            &[],
        )
    }

    pub async fn call(&self, method: Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(&self.token);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    pub async fn get(&self, path: &str) -> Value {
        let (status, body) = self.call(Method::GET, path, None).await;
        assert_eq!(status, 200, "GET {path}: {body}");
        body
    }

    /// Polls `path` until `check` holds, with the server's and workers' logs on failure.
    pub async fn wait_for(
        &self,
        what: &str,
        path: &str,
        within: Duration,
        check: impl Fn(&Value) -> bool,
    ) -> Value {
        let deadline = tokio::time::Instant::now() + within;
        let mut last = Value::Null;
        while tokio::time::Instant::now() < deadline {
            let (status, body) = self.call(Method::GET, path, None).await;
            if status == 200 && check(&body) {
                return body;
            }
            last = body;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!(
            "timed out waiting for {what}; last {path}: {last}\nserver log tail:\n{}",
            tail(&self.server.log_text(), 40)
        );
    }

    /// Waits until the worker with this name is registered and returns its id.
    pub async fn worker_id(&self, name: &str, worker: &Process) -> i64 {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while tokio::time::Instant::now() < deadline {
            let list = self.get(&format!("/api/v1/workers?name={name}")).await;
            if let Some(id) = list["items"][0]["id"].as_i64() {
                return id;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!(
            "worker {name} never registered; its log:\n{}",
            tail(&worker.log_text(), 40)
        );
    }

    /// Creates a model and returns (model id, instance ids) once the model controller
    /// has created its `replicas` instances.
    pub async fn create_model(&self, body: Value) -> (i64, Vec<i64>) {
        let (status, model) = self.call(Method::POST, "/api/v1/models", Some(body)).await;
        assert_eq!(status, 201, "{model}");
        let id = model["id"].as_i64().unwrap();
        let replicas = model["replicas"].as_u64().unwrap();
        let instances = self
            .wait_for(
                &format!("model {id}'s {replicas} instances"),
                &format!("/api/v1/model-instances?model_id={id}"),
                Duration::from_secs(10),
                |list| list["pagination"]["total"] == replicas,
            )
            .await;
        let ids = instances["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["id"].as_i64().unwrap())
            .collect();
        (id, ids)
    }

    pub async fn place(&self, instance: i64, worker: i64, gpus: &[u32]) {
        let (status, body) = self
            .call(
                Method::PATCH,
                &format!("/api/v1/model-instances/{instance}"),
                Some(json!({"worker_id": worker, "gpu_indexes": gpus})),
            )
            .await;
        assert_eq!(status, 200, "{body}");
    }

    pub async fn wait_instance(&self, instance: i64, state: &str, within: Duration) -> Value {
        self.wait_for(
            &format!("instance {instance} to be {state}"),
            &format!("/api/v1/model-instances/{instance}"),
            within,
            |i| i["state"] == state,
        )
        .await
    }
}

async fn wait_healthy(http: &reqwest::Client, base: &str, process: &Process) {
    for _ in 0..300 {
        if let Ok(response) = http.get(format!("{base}/readyz")).send().await {
            if response.status().is_success() {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "{} never became ready; log:\n{}",
        process.name,
        process.log_text()
    );
}

/// The tiny llama model, written into `dir`.
pub fn tiny_model(dir: &Path) -> PathBuf {
    let path = dir.join("tiny.gguf");
    gantry_gguf::write_tiny_llama(&path).unwrap();
    path
}

/// A model body for the tiny GGUF on llama.cpp, tuned for a small shared CPU, that the
/// scheduler places on its own.
pub fn tiny_model_body(name: &str, path: &Path, replicas: u32) -> Value {
    json!({
        "name": name,
        "source": {"type": "local_path", "path": path.display().to_string()},
        "backend": "llama.cpp",
        "replicas": replicas,
        "backend_args": ["-c", "256", "-t", "1", "-tb", "1", "-np", "1"],
    })
}

/// Like [`tiny_model_body`], for tests that place instances by hand: the model selects
/// a label no worker has, so the scheduler leaves its instances alone.
pub fn manual_model_body(name: &str, path: &Path, replicas: u32) -> Value {
    let mut body = tiny_model_body(name, path, replicas);
    body["worker_selector"] = json!({"placement": "by-hand"});
    body
}

/// Sends a chat completion straight to a backend address.
pub async fn chat(http: &reqwest::Client, address: &str) -> Value {
    let response = http
        .post(format!("http://{address}/v1/chat/completions"))
        .json(&json!({"messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    response.json().await.unwrap()
}

/// True when a process with this pid exists (and is not a zombie we own).
pub fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name, which may hold spaces: read after ')'.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_none_or(|state| state != "Z"),
        Err(_) => false,
    }
}

/// Pids of llama-server processes listening on `port` (by command line).
pub fn llama_pids_on(port: u16) -> Vec<i32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).to_string())
            .collect();
        let is_llama = args.first().is_some_and(|a| a.ends_with("llama-server"));
        let on_port = args
            .windows(2)
            .any(|w| w[0] == "--port" && w[1] == port.to_string());
        if is_llama && on_port && alive(pid) {
            pids.push(pid);
        }
    }
    pids
}

/// Children of a process, recursively (from /proc).
pub fn descendants(root: i32) -> Vec<i32> {
    let mut parents = std::collections::HashMap::<i32, Vec<i32>>::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // The fields after the command name (which may hold spaces) start after ')'.
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.first() == Some(&"Z") {
            continue;
        }
        if let Some(ppid) = fields.get(1).and_then(|p| p.parse::<i32>().ok()) {
            parents.entry(ppid).or_default().push(pid);
        }
    }
    let mut out = Vec::new();
    let mut stack = vec![root];
    while let Some(pid) = stack.pop() {
        for child in parents.get(&pid).cloned().unwrap_or_default() {
            out.push(child);
            stack.push(child);
        }
    }
    out
}

pub fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
