//! End-to-end tests of the backend supervisor with real child processes: a `custom` backend
//! that is a tiny Python HTTP server written by the test, whose behaviour (healthy, crash at
//! once, never healthy, crash after ready, ignore SIGTERM, fork a grandchild) is chosen by a
//! `--mode` backend arg.
use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use gantry_backends::LaunchSpec;
use gantry_types::BackendKind;
use gantry_worker::supervisor::{
    BackendState, EnsureOutcome, InstanceEvent, InstanceSpec, RestartPolicy, Supervisor,
    SupervisorConfig, SupervisorError,
};
use nix::errno::Errno;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// The backend: `--mode` picks the behaviour. It answers `/health` (200, or 503 in
/// `never-healthy`) and `/env` (its pid, `CUDA_VISIBLE_DEVICES`, its grandchild's pid).
const TEST_SERVER: &str = r#"
import argparse, http.server, json, os, signal, subprocess, sys, threading

parser = argparse.ArgumentParser()
parser.add_argument("--host", required=True)
parser.add_argument("--port", type=int, required=True)
parser.add_argument("--model", required=True)
parser.add_argument("--mode", default="ok")
args = parser.parse_args()

def log(message):
    print(message, file=sys.stderr, flush=True)

if args.mode == "boom":
    log("loading model " + args.model)
    log("boom: the model file is corrupt")
    sys.exit(3)
if args.mode == "ignore-term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
grandchild = None
if args.mode == "grandchild":
    grandchild = subprocess.Popen(["sleep", "1000"])

crash_armed = threading.Lock()

def crash():
    log("crashing now")
    os._exit(1)

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        status, body = 404, b""
        if self.path == "/health":
            status, body = (503, b"loading") if args.mode == "never-healthy" else (200, b"ok")
            if args.mode == "crash-after-ready" and crash_armed.acquire(blocking=False):
                threading.Timer(0.3, crash).start()
        elif self.path == "/env":
            status = 200
            body = json.dumps({
                "pid": os.getpid(),
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                "grandchild": grandchild.pid if grandchild else None,
            }).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format, *log_args):
        log("request: " + format % log_args)

server = http.server.ThreadingHTTPServer((args.host, args.port), Handler)
log(f"listening on {args.host}:{args.port} mode={args.mode}")
print("stdout works too", flush=True)
server.serve_forever()
"#;

/// Every event is awaited at most this long, so a broken supervisor fails the test
/// instead of hanging it.
const EVENT_TIMEOUT: Duration = Duration::from_secs(20);

/// Tests in this binary run in parallel, each with its own supervisor and so its own port
/// allocator: give each a range of its own so two never race for one port.
/// A port block no other test process uses at the same time.
fn port_range() -> std::ops::RangeInclusive<u16> {
    gantry_testkit::reserve_ports(20)
}

struct Harness {
    supervisor: Supervisor,
    events: mpsc::Receiver<InstanceEvent>,
    script: PathBuf,
    model: PathBuf,
    _temp: tempfile::TempDir,
}

impl Harness {
    fn new(configure: impl FnOnce(&mut SupervisorConfig)) -> Self {
        let temp = tempfile::tempdir().unwrap();
        let script = temp.path().join("test_server.py");
        std::fs::write(&script, TEST_SERVER).unwrap();
        let model = temp.path().join("model.bin");
        std::fs::write(&model, b"weights").unwrap();
        let mut config = SupervisorConfig::new(temp.path().join("data"));
        config.port_range = port_range();
        config.stop_grace_period = Duration::from_secs(5);
        config.restart = RestartPolicy {
            initial_backoff: Duration::from_millis(100),
            ..RestartPolicy::default()
        };
        configure(&mut config);
        let (events_tx, events) = mpsc::channel(256);
        let supervisor = Supervisor::new(config, events_tx).unwrap();
        Self {
            supervisor,
            events,
            script,
            model,
            _temp: temp,
        }
    }

    /// A custom-backend spec running the test server in `mode`.
    fn spec(&self, instance_id: i64, mode: &str) -> InstanceSpec {
        let launch = LaunchSpec {
            args: vec!["--mode".into(), mode.into()],
            custom_command: Some(format!(
                "python3 {} --host {{host}} --port {{port}} --model {{model_path}}",
                self.script.display()
            )),
            ..LaunchSpec::new(BackendKind::Custom, self.model.clone())
        };
        InstanceSpec::new(instance_id, format!("test-model#{instance_id}"), launch)
    }

    async fn next_event(&mut self) -> InstanceEvent {
        match tokio::time::timeout(EVENT_TIMEOUT, self.events.recv()).await {
            Ok(Some(event)) => event,
            Ok(None) => panic!("the event channel closed"),
            Err(_) => panic!("no event within {EVENT_TIMEOUT:?}"),
        }
    }

    /// The next event, which must be for `instance_id`; returns its state.
    async fn next_state(&mut self, instance_id: i64) -> BackendState {
        let event = self.next_event().await;
        assert_eq!(event.instance_id, instance_id, "{event:?}");
        event.state
    }

    async fn expect_starting(&mut self, instance_id: i64) -> u16 {
        match self.next_state(instance_id).await {
            BackendState::Starting { port } => port,
            other => panic!("expected Starting, got {other:?}"),
        }
    }

    /// Expects Starting then Running; returns (address, ports, pids).
    async fn expect_start(&mut self, instance_id: i64) -> (String, Vec<u16>, Vec<u32>) {
        let port = self.expect_starting(instance_id).await;
        match self.next_state(instance_id).await {
            BackendState::Running {
                address,
                ports,
                pid,
                pids,
            } => {
                assert_eq!(ports[0], port);
                assert_eq!(pids[0], pid);
                (address, ports, pids)
            }
            other => panic!("expected Running, got {other:?}"),
        }
    }

    async fn expect_error(&mut self, instance_id: i64) -> String {
        match self.next_state(instance_id).await {
            BackendState::Error { message } => message,
            other => panic!("expected Error, got {other:?}"),
        }
    }

    async fn stop(&mut self, instance_id: i64) {
        let stopped = tokio::time::timeout(EVENT_TIMEOUT, self.supervisor.stop(instance_id))
            .await
            .expect("stop returns");
        assert!(stopped, "instance {instance_id} was supervised");
        assert_eq!(self.next_state(instance_id).await, BackendState::Stopped);
    }
}

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

async fn get_env(port: u16) -> serde_json::Value {
    gantry_testkit::answer_json(http().get(format!("http://127.0.0.1:{port}/env"))).await
}

/// Gone: no such process, or a zombie nobody reaped yet (an orphan adopted by a PID 1 that
/// does not reap; it holds nothing).
fn process_is_gone(pid: u32) -> bool {
    match kill(Pid::from_raw(pid as i32), None) {
        Err(Errno::ESRCH) => true,
        _ => std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|stat| {
                let after_name = &stat[stat.rfind(')').unwrap() + 1..];
                after_name.split_whitespace().next() == Some("Z")
            })
            .unwrap_or(true),
    }
}

/// Waits a little for `pid` to be gone: an orphan's death is asynchronous to our stop.
async fn assert_gone_soon(pid: u32, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !process_is_gone(pid) {
        assert!(
            Instant::now() < deadline,
            "{what} (pid {pid}) is still alive"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn port_is_bindable(port: u16) -> bool {
    TcpListener::bind(("127.0.0.1", port)).is_ok()
}

fn sigkill(pid: u32) {
    kill(Pid::from_raw(pid as i32), Signal::SIGKILL).unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn starts_restarts_after_kill_9_and_stops_cleanly() {
    let mut h = Harness::new(|_| {});
    let spec = h.spec(1, "ok");
    assert_eq!(
        h.supervisor.ensure(spec.clone()).await.unwrap(),
        EnsureOutcome::Started
    );
    let (address, ports, pids) = h.expect_start(1).await;
    assert_eq!(address, format!("127.0.0.1:{}", ports[0]));
    assert_eq!(ports.len(), 1);
    let env = get_env(ports[0]).await;
    assert_eq!(env["pid"], pids[0]);
    assert_eq!(
        env["cuda_visible_devices"], "",
        "CPU-only placement hides every GPU"
    );
    assert_eq!(h.supervisor.leased_ports(), ports);

    // The same spec again changes nothing.
    assert_eq!(
        h.supervisor.ensure(spec.clone()).await.unwrap(),
        EnsureOutcome::Unchanged
    );

    // kill -9 → Restarting → Running again, new pid, same port.
    sigkill(pids[0]);
    match h.next_state(1).await {
        BackendState::Restarting {
            attempt,
            backoff,
            reason,
        } => {
            assert_eq!(attempt, 1);
            assert_eq!(backoff, Duration::from_millis(100));
            assert!(reason.contains("SIGKILL"), "{reason}");
        }
        other => panic!("expected Restarting, got {other:?}"),
    }
    let (_, ports_after, pids_after) = h.expect_start(1).await;
    assert_ne!(pids_after[0], pids[0]);
    assert_eq!(ports_after, ports, "a restart keeps its ports");
    assert_eq!(get_env(ports[0]).await["pid"], pids_after[0]);
    let status = h.supervisor.status(1).unwrap();
    assert_eq!(status.restart_count, 1);
    assert_eq!(status.pids, pids_after);

    // Logs: one file per start, the current one has the backend's output.
    let files = h.supervisor.log_files(1).unwrap();
    assert_eq!(
        files.iter().map(|f| f.start).collect::<Vec<_>>(),
        [1, 2],
        "{files:?}"
    );
    assert!(files[0]
        .path
        .ends_with(Path::new("logs/test-model_1/1.log")));
    assert_eq!(
        h.supervisor.current_log_file(1).unwrap().unwrap(),
        files[1].path
    );
    let log = h.supervisor.read_log(1, 100).await.unwrap();
    assert!(log.contains("listening on 127.0.0.1"), "{log}");
    assert!(log.contains("stdout works too"), "{log}");
    assert!(log.contains("[gantry] start"), "{log}");

    // stop → the process group is gone and the port is free.
    h.stop(1).await;
    assert!(process_is_gone(pids_after[0]));
    assert!(port_is_bindable(ports[0]));
    assert!(h.supervisor.leased_ports().is_empty());
    assert!(h.supervisor.status(1).is_none());
    assert!(!h.supervisor.stop(1).await, "a second stop finds nothing");
    // Logs stay readable after a stop.
    assert!(h
        .supervisor
        .read_log(1, 5)
        .await
        .unwrap()
        .contains("stopping"));
    h.supervisor.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_backend_that_exits_at_once_reports_its_stderr() {
    let mut h = Harness::new(|_| {});
    h.supervisor.ensure(h.spec(2, "boom")).await.unwrap();
    let port = h.expect_starting(2).await;
    let message = h.expect_error(2).await;
    assert!(
        message.contains("boom: the model file is corrupt"),
        "{message}"
    );
    assert!(message.contains("exited with status 3"), "{message}");
    assert!(message.contains("before it became ready"), "{message}");
    // No restart after a failure before the first readiness, and nothing is held.
    assert!(matches!(
        h.supervisor.status(2).unwrap().state,
        BackendState::Error { .. }
    ));
    assert!(h.supervisor.leased_ports().is_empty());
    assert!(port_is_bindable(port));
    assert_eq!(
        h.supervisor.ensure(h.spec(2, "boom")).await.unwrap(),
        EnsureOutcome::Unchanged,
        "an instance in Error stays there for the same spec"
    );
    h.stop(2).await;
    h.supervisor.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_backend_that_never_gets_healthy_fails_at_the_deadline() {
    let mut h = Harness::new(|_| {});
    let mut spec = h.spec(3, "never-healthy");
    spec.ready_deadline = Some(Duration::from_secs(2));
    let started = Instant::now();
    h.supervisor.ensure(spec).await.unwrap();
    h.expect_starting(3).await;
    let message = h.expect_error(3).await;
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(10),
        "{took:?}"
    );
    assert!(message.contains("readiness deadline of 2s"), "{message}");
    assert!(message.contains("503"), "{message}");
    assert!(message.contains("listening on"), "{message}");
    h.stop(3).await;
    h.supervisor.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_backend_ignoring_sigterm_is_killed_after_the_grace_period() {
    let mut h = Harness::new(|config| config.stop_grace_period = Duration::from_secs(1));
    h.supervisor.ensure(h.spec(5, "ignore-term")).await.unwrap();
    let (_, ports, pids) = h.expect_start(5).await;
    let started = Instant::now();
    h.stop(5).await;
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(5),
        "stop took {took:?}"
    );
    assert!(process_is_gone(pids[0]));
    assert!(port_is_bindable(ports[0]));
    h.supervisor.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_grandchild_dies_with_the_group() {
    let mut h = Harness::new(|_| {});
    h.supervisor.ensure(h.spec(6, "grandchild")).await.unwrap();
    let (_, ports, pids) = h.expect_start(6).await;
    let grandchild = get_env(ports[0]).await["grandchild"].as_u64().unwrap() as u32;
    assert!(!process_is_gone(grandchild), "the grandchild runs");
    h.stop(6).await;
    assert!(process_is_gone(pids[0]));
    // stop returns only once the whole group is gone, grandchildren included.
    assert!(process_is_gone(grandchild), "the grandchild outlived stop");
    h.supervisor.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_data_parallel_group_runs_one_child_per_gpu_and_restarts_together() {
    let mut h = Harness::new(|_| {});
    let mut spec = h.spec(7, "ok");
    spec.launch.gpu_indexes = vec![0, 1];
    spec.launch.data_parallel_size = Some(2);
    h.supervisor.ensure(spec).await.unwrap();
    let (address, ports, pids) = h.expect_start(7).await;
    assert_eq!(ports.len(), 2);
    assert_eq!(ports[1], ports[0] + 1, "consecutive ports");
    assert_eq!(address, format!("127.0.0.1:{}", ports[0]));
    assert_ne!(pids[0], pids[1]);
    for (rank, port) in ports.iter().enumerate() {
        let env = get_env(*port).await;
        assert_eq!(env["cuda_visible_devices"], rank.to_string());
        assert_eq!(env["pid"], pids[rank]);
    }
    let log = h.supervisor.read_log(7, 100).await.unwrap();
    assert!(log.contains("[rank 0] listening on"), "{log}");
    assert!(log.contains("[rank 1] listening on"), "{log}");

    // Losing one child restarts the whole group.
    sigkill(pids[1]);
    match h.next_state(7).await {
        BackendState::Restarting { reason, .. } => {
            assert!(reason.contains("rank 1"), "{reason}");
            assert!(reason.contains("whole data-parallel group"), "{reason}");
        }
        other => panic!("expected Restarting, got {other:?}"),
    }
    assert!(
        process_is_gone(pids[0]),
        "rank 0 was stopped with the group"
    );
    let (_, ports_after, pids_after) = h.expect_start(7).await;
    assert_eq!(ports_after, ports);
    assert!(pids_after.iter().all(|pid| !pids.contains(pid)));
    for (rank, port) in ports.iter().enumerate() {
        assert_eq!(
            get_env(*port).await["cuda_visible_devices"],
            rank.to_string()
        );
    }
    h.stop(7).await;
    assert!(pids_after.iter().all(|pid| process_is_gone(*pid)));
    assert!(ports.iter().all(|port| port_is_bindable(*port)));
    h.supervisor.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_changed_spec_restarts_the_instance() {
    let mut h = Harness::new(|_| {});
    h.supervisor.ensure(h.spec(8, "ok")).await.unwrap();
    let (_, _, pids) = h.expect_start(8).await;
    let mut changed = h.spec(8, "ok");
    changed.launch.env.insert("EXTRA".into(), "1".into());
    assert_eq!(
        h.supervisor.ensure(changed).await.unwrap(),
        EnsureOutcome::Restarted
    );
    assert_eq!(h.next_state(8).await, BackendState::Stopped);
    assert!(process_is_gone(pids[0]));
    let (_, _, new_pids) = h.expect_start(8).await;
    assert_ne!(new_pids, pids);
    h.stop(8).await;
    h.supervisor.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_missing_executable_is_an_error_naming_it() {
    let mut h = Harness::new(|config| {
        config
            .backends
            .executables
            .insert(BackendKind::Vllm, vec!["/nonexistent/bin/vllm".into()]);
    });
    let mut spec = h.spec(9, "ok");
    spec.launch.backend = BackendKind::Vllm;
    spec.launch.args.clear();
    h.supervisor.ensure(spec).await.unwrap();
    h.expect_starting(9).await;
    let message = h.expect_error(9).await;
    assert!(
        message.contains("cannot start `/nonexistent/bin/vllm`"),
        "{message}"
    );
    assert!(h.supervisor.leased_ports().is_empty());
    h.supervisor.shutdown().await;
    assert_eq!(h.next_state(9).await, BackendState::Stopped);
}

#[tokio::test(flavor = "multi_thread")]
async fn shutdown_leaves_no_child_behind() {
    let mut h = Harness::new(|_| {});
    h.supervisor.ensure(h.spec(10, "ok")).await.unwrap();
    h.supervisor.ensure(h.spec(11, "grandchild")).await.unwrap();
    let mut running = BTreeMap::new();
    while running.len() < 2 {
        let event = h.next_event().await;
        if let BackendState::Running { ports, pids, .. } = event.state {
            running.insert(event.instance_id, (ports, pids));
        }
    }
    let grandchild = get_env(running[&11].0[0]).await["grandchild"]
        .as_u64()
        .unwrap() as u32;
    tokio::time::timeout(EVENT_TIMEOUT, h.supervisor.shutdown())
        .await
        .expect("shutdown returns");
    let mut stopped = Vec::new();
    while let Ok(event) = h.events.try_recv() {
        if event.state == BackendState::Stopped {
            stopped.push(event.instance_id);
        }
    }
    stopped.sort_unstable();
    assert_eq!(stopped, [10, 11]);
    for (ports, pids) in running.values() {
        assert!(pids.iter().all(|pid| process_is_gone(*pid)));
        assert!(ports.iter().all(|port| port_is_bindable(*port)));
    }
    assert!(
        process_is_gone(grandchild),
        "the grandchild outlived shutdown"
    );
    assert!(matches!(
        h.supervisor.ensure(h.spec(12, "ok")).await,
        Err(SupervisorError::ShuttingDown)
    ));
}

/// Set in the re-executed test binary that plays the worker to be killed.
const DOOMED_WORKER_ENV: &str = "GANTRY_TEST_DOOMED_WORKER_PORTS";

/// PR_SET_PDEATHSIG: the test binary re-executes itself running only this test, with
/// [`DOOMED_WORKER_ENV`] set; that copy starts a backend through a supervisor, prints its
/// pid and waits. This copy `kill -9`s it and checks the backend dies too, though nobody
/// stopped it.
#[tokio::test(flavor = "multi_thread")]
async fn backends_die_with_the_worker_even_on_kill_9() {
    if let Ok(start) = std::env::var(DOOMED_WORKER_ENV) {
        run_doomed_worker(start.parse().unwrap()).await;
        return;
    }
    let ports = port_range();
    // libtest names a test by its path below the test binary's crate root.
    let this_test = format!(
        "{}::backends_die_with_the_worker_even_on_kill_9",
        module_path!()
            .split_once("::")
            .map_or("", |(_, module)| module)
    );
    let mut worker = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", &this_test, "--nocapture", "--test-threads=1"])
        .env(DOOMED_WORKER_ENV, ports.start().to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(worker.stdout.take().unwrap()).lines();
    let read_pid = async move {
        while let Some(line) = lines.next_line().await.unwrap() {
            // libtest prints "test <name> ... " on the same line first.
            if let Some((_, pid)) = line.split_once("BACKEND_PID=") {
                return pid.trim().parse::<u32>().unwrap();
            }
        }
        panic!("the doomed worker ended without printing BACKEND_PID");
    };
    let backend = tokio::time::timeout(EVENT_TIMEOUT, read_pid)
        .await
        .expect("the doomed worker reports its backend");
    assert!(!process_is_gone(backend));
    worker.start_kill().unwrap();
    worker.wait().await.unwrap();
    assert_gone_soon(backend, "the backend of a worker killed with SIGKILL").await;
}

async fn run_doomed_worker(port_start: u16) {
    let mut h = Harness::new(|config| config.port_range = port_start..=port_start + 19);
    h.supervisor.ensure(h.spec(13, "ok")).await.unwrap();
    let (_, _, pids) = h.expect_start(13).await;
    println!("BACKEND_PID={}", pids[0]);
    // Wait to be killed; the parent test gives up after its own timeout.
    tokio::time::sleep(Duration::from_secs(60)).await;
    panic!("the doomed worker was not killed");
}
