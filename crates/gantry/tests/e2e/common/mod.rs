//! End-to-end harness: `gantry server` and `gantry worker` as real processes on
//! loopback ports, a real `llama-server` (from `GANTRY_LLAMA_SERVER`), and the tiny
//! GGUF model.
//!
//! The tests call the management API through the typed client, `gantry_client::Client`
//! ([`Cluster::client`] for the admin, [`Cluster::client_for`] for another token,
//! [`admin_client`] for `gantry start`), and wait for what the cluster does in one place,
//! [`poll`] (with [`Cluster::wait_for`] and its instance and worker forms on top). Raw HTTP
//! is left for the probes and for the OpenAI-compatible API of the backends and the
//! gateway ([`chat`], `Cluster::http`), which the client does not cover.

#![allow(clippy::unwrap_used, dead_code)]

use std::convert::Infallible;
use std::fmt::Debug;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use gantry_client::{Client, ClientError};
use gantry_types::{
    InstancePatch, InstanceQuery, InstanceState, ModelCreate, ModelInstance, Worker, WorkerQuery,
};
use serde_json::{json, Value};

pub const ADMIN_PASSWORD: &str = "admin-password-1";

pub use gantry_testkit::{free_port, llama_server};

/// A child process killed (with its process group) when dropped.
pub struct Process {
    pub child: Option<Child>,
    pub name: String,
    pub log: PathBuf,
    /// How it was started, for [`Process::respawn`].
    args: Vec<String>,
    env: Vec<(String, String)>,
}

impl Process {
    pub fn spawn(name: &str, args: &[String], log: &Path, env: &[(&str, String)]) -> Self {
        let out = std::fs::File::create(log).unwrap();
        let child = Self::start(args, out, env);
        Self {
            child: Some(child),
            name: name.to_string(),
            log: log.to_path_buf(),
            args: args.to_vec(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
        }
    }

    /// Starts the process again with the same arguments and environment, its output
    /// appended to the same log, after the previous run has ended (it was killed, or
    /// exited): waits for that run so no zombie is left.
    pub fn respawn(&mut self) {
        if let Some(mut previous) = self.child.take() {
            let _ = previous.kill();
            let _ = previous.wait();
        }
        let out = std::fs::OpenOptions::new()
            .append(true)
            .open(&self.log)
            .unwrap();
        let env: Vec<(&str, String)> = self
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.clone()))
            .collect();
        self.child = Some(Self::start(&self.args, out, &env));
    }

    fn start(args: &[String], out: std::fs::File, env: &[(&str, String)]) -> Child {
        let mut command = Command::new(env!("CARGO_BIN_EXE_gantry"));
        command
            .args(args)
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .stdin(Stdio::null())
            // GANTRY_TEST_LOG_LEVEL (a filter, e.g. `info,gantry_gateway=debug`) while
            // investigating a test.
            .env(
                "GANTRY_LOG_LEVEL",
                std::env::var("GANTRY_TEST_LOG_LEVEL").unwrap_or_else(|_| "info".into()),
            );
        for (k, v) in env {
            command.env(k, v);
        }
        command.spawn().unwrap()
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
        wait_exit(&mut child, within).unwrap_or_else(|| {
            panic!(
                "{} did not exit within {within:?}; log:\n{}",
                self.name,
                self.log_text()
            )
        })
    }

    /// Sends SIGTERM and asserts that the process exits 0 within `within`.
    pub fn terminate_cleanly(&mut self, within: Duration) {
        let status = self.terminate(within);
        assert!(
            status.success(),
            "{} exited with {status:?}; log tail:\n{}",
            self.name,
            tail(&self.log_text(), 30)
        );
    }

    /// Copies the whole log of a process whose test failed to `GANTRY_TEST_KEEP_LOGS`
    /// (default `target/failed-test-logs`), since the test's own directory is removed: a
    /// failure message carries only a tail.
    fn keep_log(&self) {
        let dir = std::env::var_os("GANTRY_TEST_KEEP_LOGS").map_or_else(
            || {
                std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("../../target/failed-test-logs")
            },
            PathBuf::from,
        );
        let name = format!(
            "{}-{}-{}.log",
            std::thread::current()
                .name()
                .unwrap_or("test")
                .replace("::", "-"),
            self.name.replace(' ', "-"),
            self.child.as_ref().map_or(0, std::process::Child::id)
        );
        if std::fs::create_dir_all(&dir).is_ok()
            && std::fs::copy(&self.log, dir.join(&name)).is_ok()
        {
            eprintln!(
                "kept the log of {} in {}",
                self.name,
                dir.join(name).display()
            );
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the log holds `text`; fails with its tail after `within`.
    pub async fn wait_for_log(&self, text: &str, within: Duration) {
        gantry_testkit::eventually(
            &format!("{} to log {text:?}", self.name),
            within,
            Duration::from_millis(50),
            || async { Ok::<_, Infallible>(self.log_text().contains(text)) },
            |logged| *logged,
            || format!("log tail:\n{}", tail(&self.log_text(), 40)),
        )
        .await;
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.keep_log();
        }
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A model catalog entry (YAML) for the tiny model at `model_path`, on this machine, with
/// the arguments that keep its llama-server small.
pub fn tiny_catalog_entry(model_path: &Path) -> String {
    format!(
        "- name: tiny-catalog\n  title: Tiny test model\n  description: Random weights, for tests.\n  \
         tags: [chat, tiny]\n  parameters: 1M\n  size: 0.5 MB\n  \
         source: {{type: local_path, path: {}}}\n  backend: llama.cpp\n  \
         backend_args: [-c, \"256\", -t, \"1\", -tb, \"1\", -np, \"1\"]\n",
        model_path.display()
    )
}

/// A worker's arguments that keep it on this machine's loopback: its API on a free port,
/// what it advertises and where its backends listen, and a block of backend ports of its
/// own, so that parallel tests do not collide.
pub fn loopback_worker_args() -> Vec<String> {
    let ports = gantry_testkit::reserve_ports(20);
    vec![
        "--worker-host".into(),
        "127.0.0.1".into(),
        "--worker-port".into(),
        free_port().to_string(),
        "--advertise-host".into(),
        "127.0.0.1".into(),
        "--backend-host".into(),
        "127.0.0.1".into(),
        "--port-range".into(),
        format!("{}-{}", ports.start(), ports.end()),
    ]
}

/// Drives the console of `gantry` (started by [`start_gantry`] in `dir`) in chromium with
/// `tests/<script>`: passes it the server's URL, the generated admin password and a new
/// one, a screenshot path for each of `names` (`<prefix><name>.png`, `_` as `-`, under the
/// test target's `ui-screenshots/`) and the fields of `extra`; fails when the script does,
/// or when it takes over 5 minutes (with the tail of gantry's log).
pub async fn console_checks(
    gantry: &Process,
    dir: &Path,
    base: &str,
    script: &str,
    prefix: &str,
    names: &[&str],
    extra: Value,
) {
    let initial = std::fs::read_to_string(dir.join("data/initial_admin_password")).unwrap();
    let files: Vec<String> = names
        .iter()
        .map(|name| format!("{prefix}{}", name.replace('_', "-")))
        .collect();
    let paths =
        gantry_testkit::browser::screenshot_paths(Path::new(env!("CARGO_TARGET_TMPDIR")), &files);
    let screenshots: serde_json::Map<String, Value> = names
        .iter()
        .zip(&paths)
        .map(|(name, path)| (name.to_string(), json!(path)))
        .collect();
    let mut expected = json!({
        "base": base,
        "chromium": gantry_testkit::browser::chromium(),
        "initial_password": initial.trim(),
        "new_password": "a-console-password",
        "screenshots": screenshots,
    });
    if let (Some(fields), Value::Object(extra)) = (expected.as_object_mut(), extra) {
        fields.extend(extra);
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join(script);
    let checked = tokio::time::timeout(
        Duration::from_secs(300),
        gantry_testkit::browser::run_checks(&script, &expected, &paths),
    )
    .await;
    assert!(
        checked.is_ok(),
        "the browser checks took over 5 minutes\n{}",
        tail(&gantry.log_text(), 40)
    );
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
        llama_server().display().to_string(),
        "--port-range".into(),
        format!("{}-{}", ports.start(), ports.end()),
    ];
    args.extend(model_dirs_unless_given(dir, extra));
    args.extend(extra.iter().map(|s| s.to_string()));
    let gantry = Process::spawn("gantry start", &args, &dir.join("start.log"), &[]);
    let base = format!("http://127.0.0.1:{port}");
    wait_until_served(&format!("{base}/healthz"), &gantry).await;
    (gantry, base)
}

/// `--model-dirs dir`, unless the test gives its own.
fn model_dirs_unless_given(dir: &Path, extra: &[&str]) -> Vec<String> {
    if extra.contains(&"--model-dirs") {
        return Vec::new();
    }
    vec!["--model-dirs".into(), dir.display().to_string()]
}

/// Waits up to `within` for `child` to exit; `None` (and the child killed) when it did
/// not.
pub fn wait_exit(
    child: &mut std::process::Child,
    within: Duration,
) -> Option<std::process::ExitStatus> {
    let deadline = std::time::Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A client of the server at `base`, logged in as the admin.
pub async fn admin_client(base: &str, password: &str) -> Client {
    let anonymous = Client::new(base);
    let login = anonymous.login("admin", password).await.unwrap();
    anonymous.for_token(login.token)
}

/// Creates an API key named `name`, without limits, for the user `client` acts for;
/// returns the key.
pub async fn create_api_key(client: &Client, name: &str) -> String {
    let create = gantry_types::ApiKeyCreate {
        name: name.into(),
        ..Default::default()
    };
    client.create_api_key(&create).await.unwrap().key
}

/// Polls `probe` every 100 ms until its answer satisfies `check` and returns that answer;
/// after `within`, fails naming `what`, with the last answer and the tail of each log.
pub async fn poll<T, F, Fut>(
    what: &str,
    within: Duration,
    logs: &[&Process],
    probe: F,
    check: impl Fn(&T) -> bool,
) -> T
where
    T: Debug,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, ClientError>>,
{
    let context = || {
        logs.iter()
            .map(|p| format!("{} log tail:\n{}", p.name, tail(&p.log_text(), 40)))
            .collect::<Vec<_>>()
            .join("\n")
    };
    gantry_testkit::eventually(
        what,
        within,
        Duration::from_millis(100),
        probe,
        check,
        context,
    )
    .await
}

/// The JWT secret every server of a multi-server test shares.
pub const SHARED_SECRET: &str = "a-shared-jwt-secret-for-every-server-0123456789";

/// Arguments for one of several servers on the database at `database_url`, with fast
/// timings (heartbeat 300 ms, server timeout 3 s, lease 3 s renewed every second) so
/// failovers happen within a test's patience.
pub fn ha_server_args(database_url: &str) -> Vec<String> {
    [
        "--database-url",
        database_url,
        "--jwt-secret",
        SHARED_SECRET,
        "--heartbeat-interval",
        "300ms",
        "--server-timeout",
        "3s",
        "--lease-ttl",
        "3s",
        "--lease-renew-interval",
        "1s",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// A server process and an admin session.
pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub server: Process,
    pub base: String,
    /// Plain HTTP, for the backends' OpenAI API ([`chat`]).
    pub http: reqwest::Client,
    /// The admin's client.
    client: Client,
    /// How the server was started, for [`Cluster::restart`].
    args: Vec<String>,
    env: Vec<(String, String)>,
    restarts: u32,
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
        if !extra.contains(&"--server-id") {
            // Servers sharing a database need distinct ids.
            args.extend(["--server-id".into(), format!("server-{port}")]);
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        let server = Process::spawn("server", &args, &dir.path().join("server.log"), env);
        let base = format!("http://127.0.0.1:{port}");
        wait_until_served(&format!("{base}/readyz"), &server).await;
        let client = admin_client(&base, ADMIN_PASSWORD).await;
        Self {
            dir,
            server,
            base,
            http: reqwest::Client::new(),
            client,
            args,
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
            restarts: 0,
        }
    }

    /// Stops the server with SIGTERM, asserting that it exits 0 within `grace`, and starts
    /// it again with the same arguments (port, id, data directory); returns once it is
    /// ready. The previous run's log is kept as `server.<n>.log`. Blocks its thread while
    /// the server stops (other tasks of a multi-threaded runtime go on).
    pub async fn restart(&mut self, grace: Duration) {
        self.restart_with(grace, || {}).await;
    }

    /// [`Cluster::restart`], running `between` while the server is stopped.
    pub async fn restart_with(&mut self, grace: Duration, between: impl FnOnce()) {
        tokio::task::block_in_place(|| self.server.terminate_cleanly(grace));
        between();
        self.restarts += 1;
        let log = self.dir.path().join("server.log");
        let kept = self
            .dir
            .path()
            .join(format!("server.{}.log", self.restarts));
        std::fs::rename(&log, kept).unwrap();
        let env: Vec<(&str, String)> = self
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.clone()))
            .collect();
        self.server = Process::spawn("server", &self.args, &log, &env);
        wait_until_served(&format!("{}/readyz", self.base), &self.server).await;
    }

    /// The admin's client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// A client of this server that sends `token`.
    pub fn client_for(&self, token: &str) -> Client {
        self.client.for_token(token)
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

    /// [`Cluster::worker`] with extra environment variables for the process.
    pub fn worker_with_env(&self, name: &str, extra: &[&str], env: &[(&str, String)]) -> Process {
        self.worker_spawn(&self.base, name, None, extra, env)
    }

    pub fn worker_for(&self, server_urls: &str, name: &str, extra: &[&str]) -> Process {
        self.worker_spawn(server_urls, name, None, extra, &[])
    }

    /// [`Cluster::worker`] joining with `token`: another cluster's registration token.
    pub fn worker_with_token(&self, name: &str, token: &str, extra: &[&str]) -> Process {
        self.worker_spawn(&self.base, name, Some(token), extra, &[])
    }

    /// `gantry worker` joining `server_urls` with `token` (the default cluster's
    /// registration token when none).
    fn worker_spawn(
        &self,
        server_urls: &str,
        name: &str,
        token: Option<&str>,
        extra: &[&str],
        env: &[(&str, String)],
    ) -> Process {
        let token = token.map_or_else(|| self.registration_token(), str::to_owned);
        let mut args: Vec<String> = vec![
            "worker".into(),
            "--data-dir".into(),
            self.dir.path().join(name).display().to_string(),
            "--server-url".into(),
            server_urls.into(),
            "--token".into(),
            token,
            "--name".into(),
            name.into(),
        ];
        args.extend(loopback_worker_args());
        if !extra.contains(&"--llama-server-path") {
            args.extend([
                "--llama-server-path".into(),
                llama_server().display().to_string(),
            ]);
        }
        // Tests write models into their own temporary directories, some into another
        // cluster's: every one of them is allowed.
        args.extend(model_dirs_unless_given(&std::env::temp_dir(), extra));
        args.extend(extra.iter().map(|s| s.to_string()));
        Process::spawn(
            &format!("worker {name}"),
            &args,
            &self.dir.path().join(format!("{name}.log")),
            env,
        )
    }

    /// Polls `probe` until its answer satisfies `check` (see [`poll`]), with the server's
    /// log on failure.
    pub async fn wait_for<T, F, Fut>(
        &self,
        what: &str,
        within: Duration,
        probe: F,
        check: impl Fn(&T) -> bool,
    ) -> T
    where
        T: Debug,
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, ClientError>>,
    {
        poll(what, within, &[&self.server], probe, check).await
    }

    /// Waits until the worker with this name is registered and returns its id.
    pub async fn worker_id(&self, name: &str, worker: &Process) -> i64 {
        let query = WorkerQuery {
            name: Some(name.to_string()),
            ..WorkerQuery::default()
        };
        let workers = poll(
            &format!("worker {name} to register"),
            Duration::from_secs(30),
            &[worker, &self.server],
            || self.client.list_workers(&query),
            |list| !list.items.is_empty(),
        )
        .await;
        workers.items[0].id
    }

    /// A worker once it satisfies `check`.
    pub async fn wait_worker(
        &self,
        id: i64,
        what: &str,
        within: Duration,
        check: impl Fn(&Worker) -> bool,
    ) -> Worker {
        self.wait_for(
            &format!("worker {id} to be {what}"),
            within,
            || self.client.get_worker(id),
            check,
        )
        .await
    }

    /// Creates a model and returns (model id, instance ids) once the model controller
    /// has created its `replicas` instances.
    pub async fn create_model(&self, model: &ModelCreate) -> (i64, Vec<i64>) {
        let created = self.client.create_model(model).await.unwrap();
        let replicas = created.replicas as usize;
        let instances = self
            .wait_instances(
                created.id,
                &format!("{replicas} in number"),
                Duration::from_secs(10),
                |instances| instances.len() == replicas,
            )
            .await;
        (created.id, instances.iter().map(|i| i.id).collect())
    }

    /// The instances of a model (in id order) once they satisfy `check`.
    pub async fn wait_instances(
        &self,
        model_id: i64,
        what: &str,
        within: Duration,
        check: impl Fn(&[ModelInstance]) -> bool,
    ) -> Vec<ModelInstance> {
        instances_of(&self.client, model_id, what, within, &[&self.server], check).await
    }

    /// Places an instance on a worker's GPUs by hand.
    pub async fn place(&self, instance: i64, worker: i64, gpus: &[u32]) {
        let patch = InstancePatch {
            worker_id: Some(Some(worker)),
            gpu_indexes: Some(gpus.to_vec()),
        };
        self.client.place_instance(instance, &patch).await.unwrap();
    }

    /// An instance once it is in `state`.
    pub async fn wait_instance(
        &self,
        instance: i64,
        state: InstanceState,
        within: Duration,
    ) -> ModelInstance {
        self.wait_for(
            &format!("instance {instance} to be {state:?}"),
            within,
            || self.client.get_instance(instance),
            |i| i.state == state,
        )
        .await
    }

    /// Waits until the model's first instance satisfies `check` and returns it; fails
    /// after `within` naming `what`, with the log tails of `workers` and the server.
    pub async fn wait_for_first_instance(
        &self,
        model_id: i64,
        what: &str,
        within: Duration,
        workers: &[&Process],
        check: impl Fn(&ModelInstance) -> bool,
    ) -> ModelInstance {
        let logs: Vec<&Process> = workers.iter().copied().chain([&self.server]).collect();
        poll(
            what,
            within,
            &logs,
            || async { Ok(self.first_instance(model_id).await) },
            |instance: &Option<ModelInstance>| instance.as_ref().is_some_and(&check),
        )
        .await
        .expect("the check holds only for an instance")
    }

    /// The model's first instance, when the list answers and has one.
    pub async fn first_instance(&self, model_id: i64) -> Option<ModelInstance> {
        let query = InstanceQuery {
            model_id: Some(model_id),
            ..InstanceQuery::default()
        };
        let list = self.client.list_instances(&query).await.ok()?;
        list.items.into_iter().next()
    }

    /// A short chat with `model` through this server's gateway, as the admin: the
    /// answer's JSON, whatever its status.
    pub async fn chat_via_gateway(&self, model: &str) -> Value {
        gantry_testkit::answer_json(self.http.post(format!("{}/v1/chat/completions", self.base)).bearer_auth(self.client.token().unwrap()).json(&json!({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}))).await
    }
}

/// The instances of a model (in id order), through `client`, once they satisfy `check`.
pub async fn instances_of(
    client: &Client,
    model_id: i64,
    what: &str,
    within: Duration,
    logs: &[&Process],
    check: impl Fn(&[ModelInstance]) -> bool,
) -> Vec<ModelInstance> {
    let query = InstanceQuery {
        model_id: Some(model_id),
        ..InstanceQuery::default()
    };
    poll(
        &format!("the instances of model {model_id} to be {what}"),
        within,
        logs,
        || async { Ok(client.list_instances(&query).await?.items) },
        |items: &Vec<ModelInstance>| check(items),
    )
    .await
}

/// Waits until `url` answers 2xx (a probe), or fails with the process's log.
async fn wait_until_served(url: &str, process: &Process) {
    let http = reqwest::Client::new();
    gantry_testkit::eventually(
        &format!("{} to serve {url}", process.name),
        Duration::from_secs(30),
        Duration::from_millis(100),
        || async { Ok::<_, reqwest::Error>(http.get(url).send().await?.status()) },
        |status| status.is_success(),
        || format!("log:\n{}", process.log_text()),
    )
    .await;
}

/// Waits until none of these processes is alive (within `within`).
pub async fn wait_gone(pids: &[i32], what: &str, within: Duration) {
    gantry_testkit::eventually(
        what,
        within,
        Duration::from_millis(100),
        || async { Ok::<_, Infallible>(pids.iter().copied().filter(|p| alive(*p)).collect()) },
        |alive: &Vec<i32>| alive.is_empty(),
        String::new,
    )
    .await;
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
    let source = json!({"type": "local_path", "path": path.display().to_string()});
    tiny_model_body_from(name, source, replicas)
}

/// Like [`tiny_model_body`], for a tiny GGUF from any `source` (a hub, S3, an upload).
pub fn tiny_model_body_from(name: &str, source: Value, replicas: u32) -> Value {
    json!({
        "name": name,
        "source": source,
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

/// [`tiny_model_body`] as the typed request (the API's defaults for the rest).
pub fn tiny_model_create(name: &str, path: &Path, replicas: u32) -> ModelCreate {
    serde_json::from_value(tiny_model_body(name, path, replicas)).unwrap()
}

/// [`tiny_model_body_from`] as the typed request.
pub fn tiny_model_create_from(name: &str, source: Value, replicas: u32) -> ModelCreate {
    serde_json::from_value(tiny_model_body_from(name, source, replicas)).unwrap()
}

/// [`manual_model_body`] as the typed request.
pub fn manual_model_create(name: &str, path: &Path, replicas: u32) -> ModelCreate {
    serde_json::from_value(manual_model_body(name, path, replicas)).unwrap()
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

/// Pids of live llama-server processes with `arg` among their arguments (a model's
/// path finds every backend of that model, whichever worker started it).
pub fn llama_pids_with(arg: &str) -> Vec<i32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let mut args = cmdline.split(|b| *b == 0).map(String::from_utf8_lossy);
        let is_llama = args.next().is_some_and(|a| a.ends_with("llama-server"));
        if is_llama && args.any(|a| a == arg) && alive(pid) {
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
