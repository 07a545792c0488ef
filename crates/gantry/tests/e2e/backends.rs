//! Inference backends end to end, with real processes: a worker with no llama-server
//! installs it on demand (from the machine-wide build cache) and serves; a backend frozen
//! with SIGSTOP is found unhealthy, leaves routing and is restarted while gateway traffic
//! keeps succeeding; a custom backend defined through the API runs a model, cannot be
//! deleted while used, and a version change rolls a 2-replica model with no failed request;
//! backends installed ahead of need and removed through the server's API.

use crate::common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::{llama_pids_on, llama_server, tiny_model, tiny_model_create, Cluster};
use gantry_types::{InstanceQuery, InstanceState, ModelCreate, WatchEvent};
use reqwest::Method;
use serde_json::{json, Value};

/// Gateway traffic in the background: `loops` clients each sending one short chat after
/// another, counting answers and failures.
struct Load {
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicU64>,
    failures: Arc<Mutex<Vec<String>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(cluster: &Cluster, model: &str, loops: usize) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let ok = Arc::new(AtomicU64::new(0));
        let failures = Arc::new(Mutex::new(Vec::new()));
        let token = cluster.client().token().unwrap().to_owned();
        let tasks = (0..loops)
            .map(|i| {
                let (stop, ok, failures) = (stop.clone(), ok.clone(), failures.clone());
                let url = format!("{}/v1/chat/completions", cluster.base);
                let (token, model) = (token.clone(), model.to_owned());
                let stream = i % 2 == 1;
                tokio::spawn(async move {
                    let http = reqwest::Client::builder()
                        .timeout(Duration::from_secs(60))
                        .build()
                        .unwrap();
                    while !stop.load(Ordering::SeqCst) {
                        let body = json!({"model": model, "max_tokens": 4, "stream": stream,
                            "messages": [{"role": "user", "content": "hi"}]});
                        let outcome =
                            match http.post(&url).bearer_auth(&token).json(&body).send().await {
                                Ok(response) if response.status().is_success() => response
                                    .bytes()
                                    .await
                                    .map(|_| ())
                                    .map_err(|e| e.to_string()),
                                Ok(response) => Err(format!(
                                    "{}: {}",
                                    response.status(),
                                    response.text().await.unwrap_or_default()
                                )),
                                Err(e) => Err(e.to_string()),
                            };
                        match outcome {
                            Ok(()) => {
                                ok.fetch_add(1, Ordering::SeqCst);
                            }
                            Err(e) => failures.lock().unwrap().push(e),
                        }
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                })
            })
            .collect();
        Self {
            stop,
            ok,
            failures,
            tasks,
        }
    }

    /// Stops the clients; returns (answered, failures).
    async fn finish(self) -> (u64, Vec<String>) {
        self.stop.store(true, Ordering::SeqCst);
        for task in self.tasks {
            task.await.unwrap();
        }
        let failures = self.failures.lock().unwrap().clone();
        (self.ok.load(Ordering::SeqCst), failures)
    }
}

/// The cluster-wide inference backends.
const BACKENDS: &str = "/api/v1/inference-backends";

async fn api(cluster: &Cluster, method: Method, path: &str, body: Option<Value>) -> (u16, Value) {
    let mut request = cluster
        .http
        .request(method, format!("{}{path}", cluster.base))
        .bearer_auth(cluster.client().token().unwrap());
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

/// A worker named `bare` with no llama-server anywhere. The machine-wide cache it installs
/// from holds the binary the test script built (the installer's own cache layout), so an
/// install links it instead of building for ten minutes.
async fn bare_worker(cluster: &Cluster) -> (common::Process, i64) {
    let cache = cluster.dir.path().join("backend-cache");
    let cached = gantry_install::cache_version_dir(
        &cache,
        gantry_install::DEFAULT_LLAMA_CPP_VERSION,
        gantry_install::LlamaCppVariant::Cpu,
    );
    std::fs::create_dir_all(&cached).unwrap();
    std::fs::copy(llama_server(), cached.join("llama-server")).unwrap();
    let cache_arg = cache.display().to_string();
    let worker = cluster.worker(
        "bare",
        &[
            "--llama-server-path",
            "/nonexistent/llama-server",
            "--backend-cache-dir",
            &cache_arg,
        ],
    );
    let worker_id = cluster.worker_id("bare", &worker).await;
    (worker, worker_id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_without_llama_server_installs_it_on_demand_once() {
    let cluster = Cluster::start(&[]).await;
    let (worker, worker_id) = bare_worker(&cluster).await;
    let registered = cluster
        .wait_worker(
            worker_id,
            "listing llama.cpp",
            Duration::from_secs(20),
            |w| w.status.backends.iter().any(|b| b == "llama.cpp"),
        )
        .await;
    assert!(registered.status.installed_backends.is_empty());

    let dir = tempfile::tempdir().unwrap();
    let path = tiny_model(dir.path());
    let mut watch = cluster
        .client()
        .watch_instances(&InstanceQuery::default())
        .await
        .unwrap();
    let mut create = tiny_model_create("first", &path, 1);
    let started = Instant::now();
    cluster.client().create_model(&create).await.unwrap();
    // Every state the instance passes through, from the watch stream.
    let mut states = Vec::new();
    let mut install_progress = None;
    tokio::time::timeout(Duration::from_secs(120), async {
        while let Some(event) = watch.next().await {
            if let Ok(WatchEvent::Created { object } | WatchEvent::Updated { object }) = event {
                if states.last() != Some(&object.state) {
                    states.push(object.state);
                }
                if object.install.is_some() {
                    install_progress = object.install.clone();
                }
                if object.state == InstanceState::Running {
                    return;
                }
                assert_ne!(
                    object.state,
                    InstanceState::Error,
                    "{}",
                    object.state_message
                );
            }
        }
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "not running within 120 s; states {states:?}\n{}",
            worker.log_text()
        )
    });
    let took = started.elapsed();
    assert!(
        states.contains(&InstanceState::Installing),
        "states: {states:?}"
    );
    let progress = install_progress.expect("install progress was shown");
    assert_eq!(progress.backend, "llama.cpp");
    assert_eq!(progress.version, gantry_install::DEFAULT_LLAMA_CPP_VERSION);
    eprintln!(
        "deployed on a bare worker in {took:?}: states {states:?}, last progress {progress:?}"
    );
    let answer = cluster.chat_via_gateway("first").await;
    assert!(answer["choices"][0]["message"].is_object(), "{answer}");

    // The worker reports the version installed; the instance records it.
    let worker_now = cluster
        .wait_worker(
            worker_id,
            "reporting its install",
            Duration::from_secs(20),
            |w| !w.status.installed_backends.is_empty(),
        )
        .await;
    assert_eq!(worker_now.status.installed_backends.len(), 1);
    assert_eq!(
        worker_now.status.installed_backends[0].version,
        gantry_install::DEFAULT_LLAMA_CPP_VERSION
    );
    let first = cluster
        .first_instance(
            cluster
                .client()
                .list_models(&Default::default())
                .await
                .unwrap()
                .items[0]
                .id,
        )
        .await
        .unwrap();
    assert_eq!(
        first.backend_version.as_deref(),
        Some(gantry_install::DEFAULT_LLAMA_CPP_VERSION)
    );

    // A second model on the same backend does not install again.
    create.name = "second".into();
    let (second, _) = cluster.create_model(&create).await;
    let running = cluster
        .wait_instances(second, "running", Duration::from_secs(60), |i| {
            i.iter().all(|i| i.state == InstanceState::Running)
        })
        .await;
    assert_eq!(
        running[0].backend_version.as_deref(),
        Some(gantry_install::DEFAULT_LLAMA_CPP_VERSION)
    );
    let log = worker.log_text();
    assert_eq!(
        log.matches("installing the backend").count(),
        1,
        "one install for both models:\n{log}"
    );
    let (status, listed) = api(
        &cluster,
        Method::GET,
        "/api/v1/inference-backends/llama.cpp",
        None,
    )
    .await;
    assert_eq!(status, 200, "{listed}");
    assert_eq!(listed["installed"][0]["worker_name"], "bare");
    assert_eq!(listed["models"], json!(["first", "second"]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_backend_is_found_unhealthy_taken_out_of_routing_and_restarted() {
    let cluster = Cluster::start(&[]).await;
    let worker = cluster.worker(
        "w1",
        &[
            "--health-interval",
            "1s",
            "--health-timeout",
            "500ms",
            "--health-failure-threshold",
            "3",
        ],
    );
    cluster.worker_id("w1", &worker).await;
    let dir = tempfile::tempdir().unwrap();
    let path = tiny_model(dir.path());
    let create = tiny_model_create("pair", &path, 2);
    let (model_id, _) = cluster.create_model(&create).await;
    let running = cluster
        .wait_instances(model_id, "running", Duration::from_secs(60), |i| {
            i.len() == 2 && i.iter().all(|i| i.state == InstanceState::Running)
        })
        .await;
    let load = Load::start(&cluster, "pair", 4);
    tokio::time::sleep(Duration::from_secs(2)).await;

    let victim = &running[0];
    let pids = llama_pids_on(victim.port.unwrap());
    assert_eq!(pids.len(), 1, "one llama-server on port {:?}", victim.port);
    let frozen_at = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pids[0]),
        nix::sys::signal::Signal::SIGSTOP,
    )
    .unwrap();
    // Unhealthy within interval × threshold + 2 s (3 s + 2 s); polled every 100 ms.
    let bound = Duration::from_secs(5);
    let mut unhealthy_after = None;
    while frozen_at.elapsed() < Duration::from_secs(30) {
        let now = cluster.client().get_instance(victim.id).await.unwrap();
        if now.state != InstanceState::Running {
            unhealthy_after = Some((frozen_at.elapsed(), now.state, now.state_message));
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (after, state, message) = unhealthy_after.expect("the frozen backend left running");
    eprintln!("frozen backend reported {state:?} after {after:?}: {message}");
    // Seen unhealthy, or already restarting because of it: on a busy machine the
    // restart one second later can come before a poll sees the unhealthy state.
    assert!(
        state == InstanceState::Unhealthy
            || (state == InstanceState::Starting && message.contains("unhealthy after")),
        "{state:?}: {message}"
    );
    assert!(
        after <= bound + Duration::from_millis(500),
        "took {after:?}"
    );

    // Restarted: running again on a new process, and the frozen one is gone.
    cluster
        .wait_instance(victim.id, InstanceState::Running, Duration::from_secs(60))
        .await;
    let restarted = cluster.client().get_instance(victim.id).await.unwrap();
    assert!(restarted.restart_count >= 1);
    assert!(!common::alive(pids[0]), "the frozen process was killed");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (answered, failures) = load.finish().await;
    eprintln!(
        "gateway during the freeze: {answered} answered, {} failed",
        failures.len()
    );
    assert!(answered > 20, "{answered} answered");
    // A response already under way when the backend froze is cut when the frozen process
    // is killed: its head was sent, so the gateway cannot retry it. At most one per load
    // connection can be caught like that; every other request must succeed.
    let (cut, other): (Vec<_>, Vec<_>) = failures
        .iter()
        .partition(|f| f.contains("error decoding response body"));
    assert!(other.is_empty(), "failed requests: {failures:?}");
    assert!(
        cut.len() <= 4,
        "more responses cut than requests in flight: {cut:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_custom_backend_runs_a_model_refuses_deletion_in_use_and_rolls_versions() {
    let cluster = Cluster::start(&[]).await;
    let worker = cluster.worker("w1", &[]);
    cluster.worker_id("w1", &worker).await;
    let command = format!(
        "{} -m {{model_path}} --host {{host}} --port {{port}} -c 256 -t 1 -tb 1 -np 1",
        llama_server().display()
    );
    let definition = json!({
        "name": "tiny-runner",
        "description": "llama-server by hand",
        "command": command,
        "health_path": "/health",
        "env": {"TINY_RUNNER": "1"},
        "readiness_timeout_seconds": 120,
        "versions": [{"version": "1"}, {"version": "2", "command": format!("{command} --alias v2")}],
    });
    // Bad input is refused and names the field; nothing is stored.
    let mut bad = definition.clone();
    bad["versions"] = json!([]);
    let (status, body) = api(&cluster, Method::POST, BACKENDS, Some(bad)).await;
    assert_eq!(status, 422, "{body}");
    assert!(body.to_string().contains("versions"), "{body}");
    let mut builtin = definition.clone();
    builtin["name"] = json!("vllm");
    let (status, _) = api(&cluster, Method::POST, BACKENDS, Some(builtin)).await;
    assert_eq!(status, 422);
    let (status, body) = api(&cluster, Method::POST, BACKENDS, Some(definition.clone())).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["default_version"], "2");
    let (status, _) = api(&cluster, Method::POST, BACKENDS, Some(definition)).await;
    assert_eq!(status, 409);
    let (status, _) = api(
        &cluster,
        Method::DELETE,
        "/api/v1/inference-backends/llama.cpp",
        None,
    )
    .await;
    assert_eq!(status, 409);

    let dir = tempfile::tempdir().unwrap();
    let path = tiny_model(dir.path());
    let mut create: ModelCreate = serde_json::from_value(json!({
        "name": "custom", "backend": "tiny-runner", "backend_version": "7", "replicas": 2,
        "source": {"type": "local_path", "path": path.display().to_string()},
        "env": {"GANTRY_GPU_COUNT": "0", "GANTRY_RAM": "256 MiB"},
    }))
    .unwrap();
    let refused = cluster.client().create_model(&create).await.unwrap_err();
    assert!(refused.to_string().contains("no version 7"), "{refused}");
    create.backend_version = Some("1".into());
    let (model_id, _) = cluster.create_model(&create).await;
    let running = cluster
        .wait_instances(model_id, "running", Duration::from_secs(60), |i| {
            i.len() == 2 && i.iter().all(|i| i.state == InstanceState::Running)
        })
        .await;
    assert!(
        running
            .iter()
            .all(|i| i.backend_version.as_deref() == Some("1")),
        "{running:?}"
    );
    let answer = cluster.chat_via_gateway("custom").await;
    assert!(answer["choices"][0]["message"].is_object(), "{answer}");

    let (status, body) = api(
        &cluster,
        Method::DELETE,
        "/api/v1/inference-backends/tiny-runner",
        None,
    )
    .await;
    assert_eq!(status, 409, "{body}");
    assert!(
        body.to_string().contains("custom"),
        "the message names the model: {body}"
    );

    // Version 1 → 2 under load: rolled one instance at a time, no request fails.
    let load = Load::start(&cluster, "custom", 4);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rolled_at = Instant::now();
    let (status, body) = api(
        &cluster,
        Method::PATCH,
        &format!("/api/v1/models/{model_id}"),
        Some(json!({"backend_version": "2"})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    cluster
        .wait_instances(
            model_id,
            "running version 2",
            Duration::from_secs(120),
            |i| {
                i.len() == 2
                    && i.iter().all(|i| {
                        i.state == InstanceState::Running
                            && i.backend_version.as_deref() == Some("2")
                    })
            },
        )
        .await;
    let rolled_in = rolled_at.elapsed();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (answered, failures) = load.finish().await;
    eprintln!(
        "rolled 2 replicas 1 → 2 in {rolled_in:?}: {answered} requests answered, {} failed",
        failures.len()
    );
    assert!(answered > 10);
    assert!(failures.is_empty(), "failed requests: {failures:?}");
    // A custom command does not tell its load: each old process was stopped once no
    // connection was open to it (the gateway closes its idle ones when the instance
    // leaves routing), not after waiting out half the stop grace period. Each process
    // run writes a log file of its own on the worker.
    let mut logs = Vec::new();
    let mut dirs = vec![cluster.dir.path().join("w1")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "log") {
                logs.push(std::fs::read_to_string(&path).unwrap_or_default());
            }
        }
    }
    let drained = logs
        .iter()
        .filter(|log| log.contains("draining: no connection open after"))
        .count();
    assert_eq!(drained, 2, "each old process drained: {logs:#?}");
    for log in &logs {
        for line in log.lines().filter(|l| l.contains("draining")) {
            eprintln!("{line}");
        }
    }

    // Unused once the model is gone: deleted.
    cluster.client().delete_model(model_id).await.unwrap();
    let (status, body) = api(
        &cluster,
        Method::DELETE,
        "/api/v1/inference-backends/tiny-runner",
        None,
    )
    .await;
    assert_eq!(status, 204, "{body}");
}

/// Polls a worker's backend list until `done` holds for it.
async fn wait_backends(
    cluster: &Cluster,
    worker_id: i64,
    what: &str,
    done: impl Fn(&[Value]) -> bool,
) -> Vec<Value> {
    let path = format!("/api/v1/workers/{worker_id}/backends");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (status, body) = api(cluster, Method::GET, &path, None).await;
        assert_eq!(status, 200, "{body}");
        let list = body.as_array().unwrap().clone();
        if done(&list) {
            return list;
        }
        assert!(Instant::now() < deadline, "backends never {what}: {body:#}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backends_are_installed_ahead_of_need_and_removed_when_unused_through_the_server() {
    let cluster = Cluster::start(&[]).await;
    let default = gantry_install::DEFAULT_LLAMA_CPP_VERSION;
    let (worker, worker_id) = bare_worker(&cluster).await;
    let backends = format!("/api/v1/workers/{worker_id}/backends");
    let (status, body) = api(&cluster, Method::GET, &backends, None).await;
    assert_eq!((status, body.clone()), (200, json!([])), "{body}");

    // Bad input is refused naming what is wrong; nothing is installed.
    for (request, field) in [
        (json!({"name": "custom"}), "name"),
        (
            json!({"name": "llama.cpp", "version": "not a version"}),
            "version",
        ),
        (json!({"name": "no-such-backend"}), "no-such-backend"),
        (json!({"name": "llama.cpp", "colour": "red"}), "colour"),
    ] {
        let (status, body) = api(&cluster, Method::POST, &backends, Some(request.clone())).await;
        assert!(
            status == 400 || status == 422,
            "{request} answered {status}: {body}"
        );
        assert!(body.to_string().contains(field), "{request}: {body}");
    }
    let (status, _) = api(
        &cluster,
        Method::POST,
        "/api/v1/workers/999999/backends",
        Some(json!({"name": "llama.cpp"})),
    )
    .await;
    assert_eq!(status, 404);
    let anonymous = cluster
        .http
        .post(format!("{}{backends}", cluster.base))
        .json(&json!({"name": "llama.cpp"}))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), 401);

    // Installed ahead of need: 202 while it runs, then listed as installed and reported.
    let (status, body) = api(
        &cluster,
        Method::POST,
        &backends,
        Some(json!({"name": "llama.cpp"})),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["state"], "installing", "{body}");
    assert_eq!(body["version"], default, "{body}");
    let listed = wait_backends(&cluster, worker_id, "installed", |list| {
        list.iter().any(|b| b["state"] == "installed")
    })
    .await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["name"], "llama.cpp");
    assert_eq!(listed[0]["message"], "cpu");
    let (status, body) = api(
        &cluster,
        Method::POST,
        &backends,
        Some(json!({"name": "llama.cpp", "version": default})),
    )
    .await;
    assert_eq!((status, body["state"].clone()), (200, json!("installed")));
    cluster
        .wait_worker(
            worker_id,
            "reporting the install",
            Duration::from_secs(20),
            |w| w.status.installed_backends.len() == 1,
        )
        .await;

    // A model then starts without installing anything.
    let dir = tempfile::tempdir().unwrap();
    let path = tiny_model(dir.path());
    let create = tiny_model_create("ahead", &path, 1);
    let (model_id, _) = cluster.create_model(&create).await;
    let running = cluster
        .wait_instances(model_id, "running", Duration::from_secs(60), |i| {
            i.iter().all(|i| i.state == InstanceState::Running)
        })
        .await;
    assert_eq!(running[0].backend_version.as_deref(), Some(default));
    assert_eq!(
        worker.log_text().matches("installing the backend").count(),
        0,
        "the instance installed nothing"
    );
    let listed = wait_backends(&cluster, worker_id, "used", |list| {
        list.iter().any(|b| !b["used_by"].is_null())
    })
    .await;
    assert_eq!(listed[0]["used_by"], json!(["ahead#0"]), "{listed:?}");

    // In use: refused, naming the instance; nothing removed.
    let remove = format!("{backends}/llama.cpp/{default}");
    let (status, body) = api(&cluster, Method::DELETE, &remove, None).await;
    assert_eq!(status, 409, "{body}");
    assert!(body.to_string().contains(&running[0].name), "{body}");
    let (status, body) = api(
        &cluster,
        Method::DELETE,
        &format!("{backends}/llama.cpp/bad%20version"),
        None,
    )
    .await;
    assert_eq!(status, 422, "{body}");
    assert!(body.to_string().contains("version"), "{body}");
    assert_eq!(
        cluster.chat_via_gateway("ahead").await["object"],
        "chat.completion"
    );

    // Unused: removed, no longer listed or reported; a second removal finds nothing.
    cluster.client().delete_model(model_id).await.unwrap();
    wait_backends(&cluster, worker_id, "unused", |list| {
        list.iter().all(|b| b["used_by"].is_null())
    })
    .await;
    let (status, body) = api(&cluster, Method::DELETE, &remove, None).await;
    assert_eq!(status, 204, "{body}");
    let (status, body) = api(&cluster, Method::GET, &backends, None).await;
    assert_eq!((status, body.clone()), (200, json!([])), "{body}");
    cluster
        .wait_worker(
            worker_id,
            "reporting the removal",
            Duration::from_secs(20),
            |w| w.status.installed_backends.is_empty(),
        )
        .await;
    let (status, body) = api(&cluster, Method::DELETE, &remove, None).await;
    assert_eq!(status, 404, "{body}");

    // A defined backend's requirements that cannot be installed: the install fails with
    // pip's own words, and the failure can be cleared.
    let (status, body) = api(
        &cluster,
        Method::POST,
        BACKENDS,
        Some(json!({
            "name": "unobtainable",
            "command": "true {model_path} {port}",
            "health_path": "/health",
            "versions": [{"version": "1", "requirements": ["gantry-no-such-package==1"],
                "pip_args": ["--no-index"]}],
        })),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = api(
        &cluster,
        Method::POST,
        &backends,
        Some(json!({"name": "unobtainable"})),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    let listed = wait_backends(&cluster, worker_id, "failed", |list| {
        list.iter().any(|b| b["state"] == "failed")
    })
    .await;
    let message = listed[0]["message"].as_str().unwrap();
    assert!(
        message.contains("gantry-no-such-package"),
        "the failure names the requirement: {message}"
    );
    let (status, body) = api(
        &cluster,
        Method::DELETE,
        &format!("{backends}/unobtainable/1"),
        None,
    )
    .await;
    assert_eq!(status, 204, "{body}");
    let (status, body) = api(&cluster, Method::GET, &backends, None).await;
    assert_eq!((status, body.clone()), (200, json!([])), "{body}");
}
