//! The supervisor with the real llama.cpp `llama-server`: the tiny random-weight model from
//! `gantry-gguf` runs under the `llama.cpp` backend and answers a chat completion, a
//! corrupt model ends in `Error` carrying llama-server's own stderr, and a stop lets the
//! requests in progress finish — read from llama.cpp's slots, or for the same server run
//! as a custom command, from its open connections.
//!
//! The binary comes from `GANTRY_LLAMA_SERVER`; build it (cached after the first time) with
//! `scripts/build-llama-server.sh`, which prints its path:
//!
//! ```text
//! GANTRY_LLAMA_SERVER=$(scripts/build-llama-server.sh) cargo test -p gantry-worker
//! ```
//!
//! Without the variable these tests fail; they never skip.

use std::path::PathBuf;
use std::time::Duration;

use gantry_backends::LaunchSpec;
use gantry_testkit::llama_server;
use gantry_types::BackendKind;
use gantry_worker::supervisor::{
    BackendState, InstanceEvent, InstanceSpec, Supervisor, SupervisorConfig,
};
use nix::errno::Errno;
use nix::sys::signal::kill;
use nix::unistd::Pid;
use tokio::sync::mpsc;

const EVENT_TIMEOUT: Duration = Duration::from_secs(25);

/// A port range of its own: nextest runs each test in its own process, at the same time
/// as the others.
fn port_range() -> std::ops::RangeInclusive<u16> {
    gantry_testkit::reserve_ports(20)
}

struct Harness {
    supervisor: Supervisor,
    events: mpsc::Receiver<InstanceEvent>,
    temp: tempfile::TempDir,
}

impl Harness {
    fn new() -> Self {
        let binary = llama_server();
        let temp = tempfile::tempdir().unwrap();
        let mut config = SupervisorConfig::new(temp.path().join("data"));
        config.port_range = port_range();
        config.backends.executables.insert(
            BackendKind::LlamaCpp,
            vec![binary.to_str().unwrap().to_owned()],
        );
        config.stop_grace_period = Duration::from_secs(5);
        let (events_tx, events) = mpsc::channel(64);
        let supervisor = Supervisor::new(config, events_tx).unwrap();
        Self {
            supervisor,
            events,
            temp,
        }
    }

    fn spec(&self, instance_id: i64, model_path: PathBuf) -> InstanceSpec {
        let launch = LaunchSpec {
            // One slot over the model's whole context, one thread: on a small shared
            // machine spinning OpenMP threads make every token far slower.
            args: [
                "--ctx-size",
                "256",
                "--parallel",
                "1",
                "--threads",
                "1",
                "--threads-batch",
                "1",
            ]
            .map(str::to_owned)
            .to_vec(),
            served_name: Some("tiny-llama".to_owned()),
            ..LaunchSpec::new(BackendKind::LlamaCpp, model_path)
        };
        InstanceSpec {
            ready_deadline: Some(Duration::from_secs(20)),
            ..InstanceSpec::new(instance_id, format!("tiny-llama#{instance_id}"), launch)
        }
    }

    /// Runs the tiny model as `instance_id` until it is ready: its port, address and pid.
    async fn run_tiny_model(&mut self, instance_id: i64) -> (u16, String, u32) {
        let model = self.temp.path().join("tiny-llama.gguf");
        gantry_gguf::write_tiny_llama(&model).unwrap();
        self.supervisor
            .ensure(self.spec(instance_id, model))
            .await
            .unwrap();
        let port = match self.next_state(instance_id).await {
            BackendState::Starting { port } => port,
            other => panic!("expected Starting, got {other:?}"),
        };
        match self.next_state(instance_id).await {
            BackendState::Running { address, pid, .. } => (port, address, pid),
            other => panic!(
                "expected Running, got {other:?}; log:\n{}",
                self.supervisor.read_log(instance_id, 40).await.unwrap()
            ),
        }
    }

    async fn next_state(&mut self, instance_id: i64) -> BackendState {
        let event = tokio::time::timeout(EVENT_TIMEOUT, self.events.recv())
            .await
            .unwrap_or_else(|_| panic!("no event within {EVENT_TIMEOUT:?}"))
            .expect("the event channel is open");
        assert_eq!(event.instance_id, instance_id, "{event:?}");
        event.state
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_tiny_model_runs_under_llama_cpp_and_answers_chat_completions() {
    let mut h = Harness::new();
    let (port, address, pid) = h.run_tiny_model(1).await;
    assert_eq!(address, format!("127.0.0.1:{port}"));

    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let response = client
        .post(format!("http://{address}/v1/chat/completions"))
        .json(&serde_json::json!({
            "messages": [{"role": "user", "content": "Hello"}],
            "max_tokens": 8,
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), reqwest::StatusCode::OK);
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["object"], "chat.completion", "{body}");
    // Answered with the name clients know it by, not the model file's path.
    assert_eq!(body["model"], "tiny-llama", "{body}");
    assert!(
        body["choices"][0]["message"]["content"].is_string(),
        "{body}"
    );

    let log = h.supervisor.read_log(1, 200).await.unwrap();
    assert!(log.contains("llama-server") || log.contains("srv"), "{log}");

    assert!(h.supervisor.stop(1).await);
    assert_eq!(h.next_state(1).await, BackendState::Stopped);
    assert_eq!(kill(Pid::from_raw(pid as i32), None), Err(Errno::ESRCH));
    assert!(std::net::TcpListener::bind(("127.0.0.1", port)).is_ok());
    h.supervisor.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_corrupt_model_is_an_error_with_llama_servers_stderr() {
    let mut h = Harness::new();
    let model = h.temp.path().join("corrupt.gguf");
    let noise = gantry_testkit::pseudo_random(1, 64 * 1024);
    assert!(!noise.starts_with(b"GGUF"), "noise, not a GGUF header");
    std::fs::write(&model, noise).unwrap();
    h.supervisor.ensure(h.spec(2, model)).await.unwrap();
    assert!(matches!(
        h.next_state(2).await,
        BackendState::Starting { .. }
    ));
    let message = match h.next_state(2).await {
        BackendState::Error { message } => message,
        other => panic!("expected Error, got {other:?}"),
    };
    assert!(message.contains("before it became ready"), "{message}");
    assert!(message.contains("last stderr lines:"), "{message}");
    // llama-server's own words about the file.
    assert!(message.contains("failed to load model"), "{message}");
    assert!(message.contains("corrupt.gguf"), "{message}");
    assert!(h.supervisor.leased_ports().is_empty());
    h.supervisor.shutdown().await;
    assert_eq!(h.next_state(2).await, BackendState::Stopped);
}

#[tokio::test(flavor = "multi_thread")]
async fn stopping_a_serving_instance_lets_the_requests_in_progress_finish() {
    let mut h = Harness::new();
    let (_, address, _) = h.run_tiny_model(3).await;
    stop_while_busy(
        &mut h,
        3,
        &address,
        "draining: no request in progress after",
    )
    .await;
}

/// A custom command does not tell its load: the stop waits until no connection is open
/// to it (a gateway keeps one only while a request on it is under way).
#[tokio::test(flavor = "multi_thread")]
async fn stopping_a_custom_command_waits_for_its_open_connections() {
    let mut h = Harness::new();
    let model = h.temp.path().join("tiny-llama.gguf");
    gantry_gguf::write_tiny_llama(&model).unwrap();
    let mut spec = h.spec(4, model);
    spec.launch.backend = BackendKind::Custom;
    spec.launch.custom_command = Some(format!(
        "{} -m {{model_path}} --host {{host}} --port {{port}}",
        llama_server().display()
    ));
    spec.launch.health_path = Some("/health".into());
    h.supervisor.ensure(spec).await.unwrap();
    assert!(matches!(
        h.next_state(4).await,
        BackendState::Starting { .. }
    ));
    let address = match h.next_state(4).await {
        BackendState::Running { address, .. } => address,
        other => panic!(
            "expected Running, got {other:?}; log:\n{}",
            h.supervisor.read_log(4, 40).await.unwrap()
        ),
    };
    stop_while_busy(&mut h, 4, &address, "draining: no connection open after").await;
}

/// Sends completions to the instance at `address`, stops it once it is busy, and requires
/// every completion to finish and the log to show the drain ended with `drained`.
async fn stop_while_busy(h: &mut Harness, instance_id: i64, address: &str, drained: &str) {
    // Eight completions queue up on the one slot; each generates until the context is full.
    // No idle keep-alive connections: llama-server gives each open connection one of its
    // few HTTP threads.
    let client = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let requests: Vec<_> = (0..8)
        .map(|i| {
            let request = client
                .post(format!("http://{address}/v1/completions"))
                .json(&serde_json::json!({
                    "prompt": format!("request {i}"),
                    "max_tokens": 200,
                    "ignore_eos": true,
                }))
                .send();
            tokio::spawn(async move {
                let response = request.await.map_err(|e| format!("sending: {e}"))?;
                let status = response.status();
                let body: serde_json::Value = response
                    .json()
                    .await
                    .map_err(|e| format!("reading the answer ({status}): {e}"))?;
                Ok::<_, String>(body["usage"]["completion_tokens"].as_u64().unwrap_or(0))
            })
        })
        .collect();
    // Stop once the backend is busy.
    let slots = format!("http://{address}/slots");
    let busy = async {
        loop {
            let answer: serde_json::Value = gantry_testkit::answer_json(client.get(&slots)).await;
            if answer[0]["is_processing"] == true {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(20), busy)
        .await
        .expect("the backend starts processing the requests");
    assert!(h.supervisor.stop(instance_id).await);
    assert_eq!(h.next_state(instance_id).await, BackendState::Stopped);

    let log = h.supervisor.read_log(instance_id, 50).await.unwrap();
    for request in requests {
        let generated = request
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("a request was cut by the stop: {e}; log:\n{log}"));
        assert!(generated > 0);
    }
    assert!(log.contains(drained), "{log}");
    h.supervisor.shutdown().await;
}
