//! Chaos under load: `gantry server` (SQLite) with two workers running three replicas of
//! the tiny model in real `llama-server`s, steady gateway traffic (plain and streamed),
//! while in turn a backend is killed with SIGKILL, a backend is frozen with SIGSTOP, a
//! worker is killed with SIGKILL and started again, and the server is restarted. After
//! each fault the cluster converges to three running replicas again; at the end no
//! backend is left without its worker and no request failed.
//!
//! What counts as a failed request: every error status, every broken connection and every
//! incomplete answer, with two exceptions no proxy can do anything about, both counted and
//! printed:
//! - a stream whose answer had begun (status and headers sent) on the very instance a
//!   fault then killed is cut mid-answer: the gateway cannot take back what the client
//!   already has. Plain requests in that position are retried by the gateway, as nothing
//!   has reached the client before the whole answer is there;
//! - while the server itself restarts, the gateway is not there to send to. The load
//!   clients do what a load balancer does: they follow `/readyz` every 100 ms and send
//!   only while it is ready (a stopping server says it is not ready before it stops
//!   accepting), and a refused connection (nothing was sent) is counted and sent again.
//!
//! `GANTRY_CHAOS_ROUNDS=N` runs the whole sequence of faults N times (default 1);
//! `scripts/chaos.sh` runs it longer and prints the figures.

use crate::common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::{
    descendants, llama_pids_on, llama_pids_with, tail, tiny_model, Cluster, Process,
};
use gantry_types::{InstanceState, ModelCreate, ModelInstance, Timestamp, WorkerState};
use nix::sys::signal::Signal;
use serde_json::json;

/// Load clients; half of them stream.
const CLIENTS: usize = 4;

/// What the load clients saw, and what the faults hit.
#[derive(Default)]
struct Tally {
    ok: AtomicU64,
    /// Connections refused while the server restarted (nothing was sent).
    refused: AtomicU64,
    /// Streams cut mid-answer by the death of the instance that was answering.
    cut: Mutex<Vec<String>>,
    failures: Mutex<Vec<String>>,
    /// Names of the instances the fault under way has hit (until the cluster has
    /// converged again).
    victims: Mutex<HashSet<String>>,
}

enum Outcome {
    Ok,
    /// Connection refused: nothing was sent.
    Refused,
    /// The answer began on `instance`, then broke.
    Broken {
        instance: String,
        why: String,
    },
    Failed(String),
}

async fn one_request(http: &reqwest::Client, base: &str, token: &str, stream: bool) -> Outcome {
    let response = http
        .post(format!("{base}/v1/chat/completions"))
        .bearer_auth(token)
        .json(&json!({
            "model": "tiny",
            "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 4,
            "stream": stream,
        }))
        .send()
        .await;
    let response = match response {
        Ok(response) => response,
        Err(e) if e.is_connect() => return Outcome::Refused,
        Err(e) => return Outcome::Failed(format!("(stream {stream}) {e:?}")),
    };
    let status = response.status();
    let instance = response
        .headers()
        .get("x-gantry-instance")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let body = match response.text().await {
        Ok(body) => body,
        Err(e) => {
            return Outcome::Broken {
                instance,
                why: format!("(stream {stream}) body: {e:?}"),
            }
        }
    };
    if !status.is_success() {
        return Outcome::Failed(format!("(stream {stream}) {status}: {body}"));
    }
    let complete = if stream {
        body.trim_end().ends_with("data: [DONE]")
    } else {
        serde_json::from_str::<serde_json::Value>(&body).is_ok_and(|v| v["choices"].is_array())
    };
    if complete {
        Outcome::Ok
    } else if stream {
        Outcome::Broken {
            instance,
            why: format!("(stream {stream}) incomplete: {body}"),
        }
    } else {
        Outcome::Failed(format!("(stream {stream}) incomplete: {body}"))
    }
}

/// Steady traffic: [`CLIENTS`] clients, each sending one short chat after another while
/// the server says it is ready.
struct Load {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(base: &str, token: &str, tally: &Arc<Tally>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let ready = Arc::new(AtomicBool::new(true));
        let mut tasks = Vec::new();
        {
            let (stop, ready, base) = (stop.clone(), ready.clone(), base.to_owned());
            tasks.push(tokio::spawn(async move {
                let http = reqwest::Client::new();
                while !stop.load(Ordering::Relaxed) {
                    let up = http
                        .get(format!("{base}/readyz"))
                        .timeout(Duration::from_millis(500))
                        .send()
                        .await
                        .is_ok_and(|r| r.status().is_success());
                    ready.store(up, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }));
        }
        for client in 0..CLIENTS {
            let (stop, ready, tally) = (stop.clone(), ready.clone(), tally.clone());
            let (base, token) = (base.to_owned(), token.to_owned());
            tasks.push(tokio::spawn(async move {
                let http = reqwest::Client::builder()
                    .timeout(Duration::from_secs(60))
                    .build()
                    .unwrap();
                let stream = client % 2 == 1;
                let began = Instant::now();
                while !stop.load(Ordering::Relaxed) {
                    if !ready.load(Ordering::Relaxed) {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                    let sent = began.elapsed();
                    match one_request(&http, &base, &token, stream).await {
                        Outcome::Ok => {
                            tally.ok.fetch_add(1, Ordering::Relaxed);
                        }
                        Outcome::Refused => {
                            tally.refused.fetch_add(1, Ordering::Relaxed);
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                        Outcome::Broken { instance, why }
                            if stream && tally.victims.lock().unwrap().contains(&instance) =>
                        {
                            tally
                                .cut
                                .lock()
                                .unwrap()
                                .push(format!("{sent:?} on {instance}: {why}"));
                        }
                        Outcome::Broken { instance, why } => tally.failures.lock().unwrap().push(
                            format!("sent {sent:?} after the load began, on {instance}: {why}"),
                        ),
                        Outcome::Failed(why) => tally
                            .failures
                            .lock()
                            .unwrap()
                            .push(format!("sent {sent:?} after the load began: {why}")),
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }));
        }
        Self { stop, tasks }
    }

    async fn finish(self) {
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks {
            task.await.unwrap();
        }
    }
}

fn rounds() -> usize {
    std::env::var("GANTRY_CHAOS_ROUNDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1)
}

/// The single llama-server process of a running instance.
fn backend_pid(instance: &ModelInstance) -> i32 {
    let pids = llama_pids_on(instance.port.unwrap());
    assert_eq!(
        pids.len(),
        1,
        "one llama-server for {} on port {:?}",
        instance.name,
        instance.port
    );
    pids[0]
}

/// Three instances, each `running` as the server sees it and with its llama-server up
/// on its port (the server's view lags behind a backend that just died).
fn all_serving(instances: &[ModelInstance]) -> bool {
    instances.len() == 3
        && instances.iter().all(|i| {
            i.state == InstanceState::Running
                && i.port.is_some_and(|port| llama_pids_on(port).len() == 1)
        })
}

struct Chaos {
    cluster: Cluster,
    workers: Vec<Process>,
    model_id: i64,
    model_path: String,
    tally: Arc<Tally>,
    /// (fault, seconds to converge, requests answered meanwhile), for the summary.
    figures: Vec<(String, f64, u64)>,
}

impl Chaos {
    fn logs(&self) -> Vec<&Process> {
        std::iter::once(&self.cluster.server)
            .chain(self.workers.iter())
            .collect()
    }

    /// Waits until the model has three running instances that pass `also`; returns them
    /// and records how long it took since `since`.
    async fn converge(
        &mut self,
        fault: &str,
        since: Instant,
        answered_before: u64,
        also: impl Fn(&[ModelInstance]) -> bool,
    ) -> Vec<ModelInstance> {
        let running = common::instances_of(
            self.cluster.client(),
            self.model_id,
            &format!("3 running after: {fault}"),
            Duration::from_secs(120),
            &self.logs(),
            |i| all_serving(i) && also(i),
        )
        .await;
        let took = since.elapsed().as_secs_f64();
        // From here on a cut stream is a failure again, whichever instance it was on.
        self.tally.victims.lock().unwrap().clear();
        let answered = self.tally.ok.load(Ordering::Relaxed) - answered_before;
        println!("chaos: {fault}: 3 replicas running again after {took:.1} s; {answered} requests answered meanwhile");
        self.figures.push((fault.to_owned(), took, answered));
        running
    }

    async fn running(&self) -> Vec<ModelInstance> {
        common::instances_of(
            self.cluster.client(),
            self.model_id,
            "3 running",
            Duration::from_secs(120),
            &self.logs(),
            all_serving,
        )
        .await
    }

    fn hit(&self, instances: impl IntoIterator<Item = String>) {
        self.tally.victims.lock().unwrap().extend(instances);
    }

    fn answered(&self) -> u64 {
        self.tally.ok.load(Ordering::Relaxed)
    }

    async fn kill_a_backend(&mut self) {
        let running = self.running().await;
        let victim = running[0].clone();
        let pid = backend_pid(&victim);
        self.hit([victim.name.clone()]);
        let (at, before) = (Instant::now(), self.answered());
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL).unwrap();
        self.converge("backend killed (SIGKILL)", at, before, |i| {
            i.iter()
                .all(|i| i.id != victim.id || llama_pids_on(i.port.unwrap()) != [pid])
        })
        .await;
    }

    async fn freeze_a_backend(&mut self) {
        let running = self.running().await;
        let victim = running[1].clone();
        let pid = backend_pid(&victim);
        self.hit([victim.name.clone()]);
        let (at, before) = (Instant::now(), self.answered());
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGSTOP).unwrap();
        // Found unhealthy by its worker's probes, killed and started again.
        common::wait_gone(
            &[pid],
            "the frozen backend to be killed",
            Duration::from_secs(60),
        )
        .await;
        self.converge("backend frozen (SIGSTOP)", at, before, |_| true)
            .await;
    }

    async fn kill_a_worker(&mut self) {
        let running = self.running().await;
        // The worker with the most replicas, so the fault takes the most away.
        let on = |name: &str| {
            running
                .iter()
                .filter(|i| i.worker_name.as_deref() == Some(name))
                .count()
        };
        let index = if on("w1") >= on("w2") { 0 } else { 1 };
        let name = ["w1", "w2"][index];
        let backends: Vec<i32> = running
            .iter()
            .filter(|i| i.worker_name.as_deref() == Some(name))
            .map(backend_pid)
            .collect();
        self.hit(
            running
                .iter()
                .filter(|i| i.worker_name.as_deref() == Some(name))
                .map(|i| i.name.clone()),
        );
        let (at, before) = (Instant::now(), self.answered());
        self.workers[index].signal(Signal::SIGKILL);
        // Its backends die with it (the kernel kills them: PR_SET_PDEATHSIG).
        common::wait_gone(
            &backends,
            "the killed worker's backends to die with it",
            Duration::from_secs(10),
        )
        .await;
        // Down for a while, as a machine that reboots would be.
        tokio::time::sleep(Duration::from_secs(2)).await;
        self.workers[index].respawn();
        self.converge(
            &format!("worker {name} killed (SIGKILL) and started again 2 s later"),
            at,
            before,
            |_| true,
        )
        .await;
    }

    async fn restart_the_server(&mut self) {
        let running = self.running().await;
        let pids: Vec<i32> = running.iter().map(backend_pid).collect();
        let (at, before) = (Instant::now(), self.answered());
        self.cluster.restart(Duration::from_secs(30)).await;
        let restarted = Timestamp::now();
        println!(
            "chaos: server stopped and ready again after {:.1} s",
            at.elapsed().as_secs_f64()
        );
        // The workers reconnect; their backends went on serving, and keep their processes.
        for name in ["w1", "w2"] {
            let id = self.cluster.worker_id(name, &self.workers[0]).await;
            self.cluster
                .wait_worker(
                    id,
                    "heard from since the restart",
                    Duration::from_secs(30),
                    |w| {
                        w.state == WorkerState::Ready
                            && w.last_heartbeat_at.is_some_and(|t| t > restarted)
                    },
                )
                .await;
        }
        let after = self
            .converge(
                "server restarted (SIGTERM, started again), workers back",
                at,
                before,
                |_| true,
            )
            .await;
        let now: Vec<i32> = after.iter().map(backend_pid).collect();
        assert_eq!(now, pids, "a server restart restarts no backend");
    }

    /// Every backend of the model is a child of a live worker, and there are three.
    fn no_orphans(&self) {
        let backends = llama_pids_with(&self.model_path);
        let supervised: HashSet<i32> = self
            .workers
            .iter()
            .flat_map(|w| descendants(w.pid()))
            .collect();
        let orphans: Vec<i32> = backends
            .iter()
            .copied()
            .filter(|p| !supervised.contains(p))
            .collect();
        assert!(
            orphans.is_empty(),
            "backends without their worker: {orphans:?} (all: {backends:?})"
        );
        assert_eq!(backends.len(), 3, "three backends: {backends:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_cluster_serves_through_backend_worker_and_server_failures() {
    let cluster = Cluster::start(&["--heartbeat-interval", "300ms"]).await;
    let health = [
        "--heartbeat-interval",
        "300ms",
        "--health-interval",
        "1s",
        "--health-timeout",
        "500ms",
        "--health-failure-threshold",
        "3",
        "--simulate-gpus",
        "1x8GiB",
    ];
    let workers = vec![cluster.worker("w1", &health), cluster.worker("w2", &health)];
    cluster.worker_id("w1", &workers[0]).await;
    cluster.worker_id("w2", &workers[1]).await;
    let path = tiny_model(cluster.dir.path());
    let create: ModelCreate =
        serde_json::from_value(common::tiny_model_body("tiny", &path, 3)).unwrap();
    let (model_id, _) = cluster.create_model(&create).await;
    let token = cluster.client().token().unwrap().to_owned();
    let base = cluster.base.clone();
    let mut chaos = Chaos {
        cluster,
        workers,
        model_id,
        model_path: path.display().to_string(),
        tally: Arc::new(Tally::default()),
        figures: Vec::new(),
    };
    chaos.running().await;

    let load = Load::start(&base, &token, &chaos.tally);
    let began = Instant::now();
    tokio::time::sleep(Duration::from_secs(2)).await;
    for round in 0..rounds() {
        println!("chaos: round {}", round + 1);
        chaos.kill_a_backend().await;
        chaos.freeze_a_backend().await;
        chaos.kill_a_worker().await;
        chaos.restart_the_server().await;
        chaos.no_orphans();
    }
    // Steady again: traffic flows on the converged cluster.
    let before = chaos.answered();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let settled = chaos.answered() - before;
    load.finish().await;

    let tally = &chaos.tally;
    let ok = tally.ok.load(Ordering::Relaxed);
    let failures = tally.failures.lock().unwrap().clone();
    let cut = tally.cut.lock().unwrap().clone();
    println!(
        "chaos: {} round(s) in {:.0} s: {ok} requests answered, {} failed, {} streams cut \
         mid-answer by their instance's death, {} refused connections while the server \
         restarted (sent again)",
        rounds(),
        began.elapsed().as_secs_f64(),
        failures.len(),
        cut.len(),
        tally.refused.load(Ordering::Relaxed),
    );
    for (fault, took, answered) in &chaos.figures {
        println!("chaos:   {fault}: converged in {took:.1} s, {answered} answered meanwhile");
    }
    for c in &cut {
        println!("chaos:   cut: {c}");
    }
    assert!(
        failures.is_empty(),
        "{} requests failed, the first: {:#?}\nserver log:\n{}",
        failures.len(),
        &failures[..failures.len().min(5)],
        tail(&chaos.cluster.server.log_text(), 30)
    );
    // Each fault that kills backends can cut at most the streams then under way: one
    // per streaming client. The server restart cuts none (it drains).
    let streaming = CLIENTS / 2;
    assert!(
        cut.len() <= 3 * streaming * rounds(),
        "more streams cut than were under way: {cut:#?}"
    );
    assert!(settled > 10, "traffic flows after the faults: {settled}");
    for (fault, _, answered) in &chaos.figures {
        assert!(*answered > 0, "requests were answered during: {fault}");
    }
}
