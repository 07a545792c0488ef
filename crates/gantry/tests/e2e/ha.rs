//! High availability with real processes and a real PostgreSQL: three `gantry server`
//! processes and two workers with simulated GPUs.
//!
//! * `kill -9` of the leader, ten times (`GANTRY_HA_KILLS`), under create/scale/delete churn through every
//!   server: another server leads and places a new model's instance (the time from the
//!   kill is printed), no GPU is ever over-committed, no model is lost, and everything
//!   converges to its replicas.
//! * A leader stopped with SIGSTOP past its lease: another takes over with a higher token;
//!   resumed, the old leader steps down and none of its leader-only writes sent after the
//!   take-over landed.

use crate::common;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{tail, tiny_model, Cluster};
use gantry_client::Client;
use gantry_testkit::{TestDatabase, TestEngine};
use gantry_types::{ClusterStatus, ModelCreate, ModelInstance, ModelUpdate};
use nix::sys::signal::Signal;
use serde_json::json;

/// Each instance claims 6 GiB of one 16 GiB GPU: two fit on a GPU, a third would not.
const PER_GPU: usize = 2;

async fn start_server(db: &TestDatabase) -> Cluster {
    let args = common::ha_server_args(&db.url);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Cluster::start(&args).await
}

/// A model that needs one GPU with 6 GiB and runs `sleep` (placement is what is tested).
fn gpu_model(name: &str, path: &std::path::Path, replicas: u32) -> ModelCreate {
    serde_json::from_value(json!({
        "name": name,
        "source": {"type": "local_path", "path": path.display().to_string()},
        "backend": "custom",
        "custom_command": "sleep 600",
        "env": {"GANTRY_GPU_COUNT": "1", "GANTRY_GPU_MEMORY": "6GiB"},
        "replicas": replicas,
    }))
    .unwrap()
}

async fn cluster_status(http: &reqwest::Client, base: &str, token: &str) -> Option<ClusterStatus> {
    let response = http
        .get(format!("{base}/api/v1/coordinator/cluster"))
        .bearer_auth(token)
        .timeout(Duration::from_secs(2))
        .send()
        .await
        .ok()?;
    response.json().await.ok()
}

/// The model called `name`, if the list answers and has it.
async fn model_named(
    client: &Client,
    name: &str,
) -> Result<gantry_types::Model, gantry_client::ClientError> {
    let query = gantry_types::ModelQuery {
        name: Some(name.to_string()),
        ..Default::default()
    };
    let mut list = client.list_models(&query).await?.items;
    list.pop().ok_or(gantry_client::ClientError::Unreachable {
        tried: 0,
        last: format!("no model {name}"),
    })
}

async fn all_instances(client: &Client) -> Vec<ModelInstance> {
    client
        .list_instances(&gantry_types::InstanceQuery {
            per_page: Some(1000),
            ..Default::default()
        })
        .await
        .map(|l| l.items)
        .unwrap_or_default()
}

/// No GPU holds more instances than fit on it.
fn check_no_overcommit(instances: &[ModelInstance]) {
    let mut per_gpu: HashMap<(i64, u32), Vec<&str>> = HashMap::new();
    for i in instances {
        if let Some(worker) = i.worker_id {
            for gpu in &i.gpu_indexes {
                per_gpu.entry((worker, *gpu)).or_default().push(&i.name);
            }
        }
    }
    for ((worker, gpu), names) in per_gpu {
        assert!(
            names.len() <= PER_GPU,
            "GPU {gpu} of worker {worker} is over-committed: {names:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killing_the_leader_hands_over_under_churn_without_overcommit() {
    let db = TestDatabase::new(TestEngine::Postgres).await;
    let mut servers = Vec::new();
    for _ in 0..3 {
        servers.push(start_server(&db).await);
    }
    let urls = servers.iter().map(|s| s.base.clone()).collect::<Vec<_>>();
    let worker_args = [
        "--simulate-gpus",
        "2x16GiB",
        "--heartbeat-interval",
        "300ms",
    ];
    let w1 = servers[0].worker_for(&urls.join(","), "w1", &worker_args);
    let w2 = servers[0].worker_for(&urls.join(","), "w2", &worker_args);
    servers[0].worker_id("w1", &w1).await;
    servers[0].worker_id("w2", &w2).await;
    let token = servers[0].client().token().unwrap();
    let model_path = tiny_model(servers[0].dir.path());
    let http = reqwest::Client::new();

    // Churn: creates, scales and deletes through every server (the client fails over).
    let live_urls = Arc::new(std::sync::Mutex::new(urls.clone()));
    let stop = Arc::new(AtomicBool::new(false));
    let churn = {
        let client = Client::with_servers(urls.clone()).with_token(token.clone());
        let live_urls = Arc::clone(&live_urls);
        let stop = Arc::clone(&stop);
        let path = model_path.clone();
        tokio::spawn(async move {
            let mut step = 0u32;
            let mut ops = 0u32;
            while !stop.load(Ordering::Relaxed) {
                client.set_servers(live_urls.lock().unwrap().clone());
                let name = format!("churn-{}", step % 3);
                let result = match step % 4 {
                    0 => client
                        .create_model(&gpu_model(&name, &path, 1))
                        .await
                        .map(drop),
                    1 | 2 => match model_named(&client, &name).await {
                        Ok(model) => client
                            .update_model(
                                model.id,
                                &ModelUpdate {
                                    replicas: Some(1 + step % 2),
                                    ..Default::default()
                                },
                            )
                            .await
                            .map(drop),
                        Err(e) => Err(e),
                    },
                    _ => match model_named(&client, &name).await {
                        Ok(model) => client.delete_model(model.id).await,
                        Err(e) => Err(e),
                    },
                };
                ops += u32::from(result.is_ok());
                check_no_overcommit(&all_instances(&client).await);
                step += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            ops
        })
    };

    // Ten kills in the test suite; the failover benchmark (scripts/bench-failover.sh)
    // asks for more.
    let kills: usize = std::env::var("GANTRY_HA_KILLS")
        .ok()
        .map(|v| v.parse().expect("GANTRY_HA_KILLS is a number"))
        .unwrap_or(10);
    let mut failovers = Vec::new();
    for round in 0..kills {
        let status = cluster_status(&http, &servers[0].base, &token)
            .await
            .unwrap();
        let leader_id = status.leader.server_id.clone().expect("someone leads");
        let old_token = status.leader.fencing_token;
        let index = servers
            .iter()
            .position(|s| format!("server-{}", s.base.rsplit(':').next().unwrap()) == leader_id)
            .expect("the leader is one of ours");
        let mut leader = servers.remove(index);
        leader.server.signal(Signal::SIGKILL);
        let _ = &leader.dir;
        let killed = Instant::now();
        let _ = leader.server.child.take().map(|mut c| c.wait());
        *live_urls.lock().unwrap() = servers.iter().map(|s| s.base.clone()).collect();

        // A new model through a surviving server: its instance needs the new leader (the
        // replica controller) and a placement.
        let survivor = &servers[round % servers.len()];
        let probe = format!("probe-{round}");
        let client = Client::with_servers(servers.iter().map(|s| s.base.clone()).collect())
            .with_token(token.clone());
        let model = client
            .create_model(&gpu_model(&probe, &model_path, 1))
            .await
            .unwrap();
        let placed_after = loop {
            let placed = all_instances(&client)
                .await
                .iter()
                .any(|i| i.model_id == model.id && i.worker_id.is_some());
            if placed {
                break killed.elapsed();
            }
            assert!(
                killed.elapsed() < Duration::from_secs(30),
                "round {round}: no placement 30 s after killing the leader; survivor log:\n{}",
                tail(&survivor.server.log_text(), 40)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let status = cluster_status(&http, &survivor.base, &token).await.unwrap();
        assert!(
            status.leader.fencing_token > old_token,
            "round {round}: {status:?}"
        );
        assert_ne!(status.leader.server_id.as_deref(), Some(leader_id.as_str()));
        failovers.push(placed_after);
        println!(
            "round {round}: killed leader {leader_id} (token {old_token}); new leader {:?} (token {}); new model placed {:.0} ms after the kill",
            status.leader.server_id,
            status.leader.fencing_token,
            placed_after.as_secs_f64() * 1000.0
        );
        client.delete_model(model.id).await.unwrap();
        // A replacement server joins (a new id; the killed one's row goes inactive).
        servers.push(start_server(&db).await);
        *live_urls.lock().unwrap() = servers.iter().map(|s| s.base.clone()).collect();
    }
    stop.store(true, Ordering::Relaxed);
    let ops = churn.await.unwrap();
    assert!(ops > 20, "the churn made progress: {ops} operations");

    // Convergence: every model has its replicas, all placed, nothing over-committed.
    let client = Client::with_servers(servers.iter().map(|s| s.base.clone()).collect())
        .with_token(token.clone());
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let models = client.list_models(&Default::default()).await.unwrap().items;
        let instances = all_instances(&client).await;
        check_no_overcommit(&instances);
        let mut count: BTreeMap<i64, (u32, usize)> =
            models.iter().map(|m| (m.id, (m.replicas, 0))).collect();
        let mut orphans = 0;
        for i in &instances {
            match count.get_mut(&i.model_id) {
                Some(entry) if i.worker_id.is_some() => entry.1 += 1,
                Some(_) => {}
                None => orphans += 1,
            }
        }
        let converged = orphans == 0
            && count
                .values()
                .all(|(replicas, placed)| *replicas as usize == *placed);
        if converged {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not converged: {count:?}, {orphans} orphans; a server log:\n{}",
            tail(&servers[0].server.log_text(), 40)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    failovers.sort();
    println!(
        "failover (kill -9 → new model placed) over {} kills: p50 {:.0} ms, max {:.0} ms; {ops} churn operations",
        failovers.len(),
        failovers[failovers.len() / 2].as_secs_f64() * 1000.0,
        failovers.last().unwrap().as_secs_f64() * 1000.0
    );
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name).map(|v| v.trim().parse().unwrap()))
        .unwrap_or_else(|| panic!("{name} missing from /metrics"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_leader_is_replaced_fenced_and_steps_down() {
    let db = TestDatabase::new(TestEngine::Postgres).await;
    let mut servers = Vec::new();
    for _ in 0..3 {
        servers.push(start_server(&db).await);
    }
    let urls = servers.iter().map(|s| s.base.clone()).collect::<Vec<_>>();
    let w1 = servers[0].worker_for(
        &urls.join(","),
        "w1",
        &[
            "--simulate-gpus",
            "1x16GiB",
            "--heartbeat-interval",
            "300ms",
        ],
    );
    servers[0].worker_id("w1", &w1).await;
    let token = servers[0].client().token().unwrap();
    let http = reqwest::Client::new();
    let status = cluster_status(&http, &urls[0], &token).await.unwrap();
    let leader_id = status.leader.server_id.clone().unwrap();
    let leader = servers
        .iter()
        .find(|s| format!("server-{}", s.base.rsplit(':').next().unwrap()) == leader_id)
        .unwrap();
    let other = servers.iter().find(|s| s.base != leader.base).unwrap();

    leader.server.signal(Signal::SIGSTOP);
    let paused = Instant::now();
    // Another server takes over once the lease (3 s) lapses.
    // A busy machine may make one status call time out; the next one is asked again.
    let taken = loop {
        let now = cluster_status(&http, &other.base, &token).await;
        if let Some(now) = now.as_ref().filter(|now| {
            now.leader.fencing_token > status.leader.fencing_token && now.leader.server_id.is_some()
        }) {
            break now.clone();
        }
        assert!(
            paused.elapsed() < Duration::from_secs(30),
            "no take-over: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_ne!(taken.leader.server_id, Some(leader_id.clone()));
    println!(
        "paused leader {leader_id} (token {}) replaced by {:?} (token {}) {:.1} s after SIGSTOP",
        status.leader.fencing_token,
        taken.leader.server_id,
        taken.leader.fencing_token,
        paused.elapsed().as_secs_f64()
    );
    // Work for a leader while the old one is stopped: a model to create instances for.
    let model_path = tiny_model(other.dir.path());
    other
        .client()
        .create_model(&gpu_model("after-pause", &model_path, 1))
        .await
        .unwrap();
    leader.server.signal(Signal::SIGCONT);
    leader
        .server
        .wait_for_log("stepped down", Duration::from_secs(30))
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await;

    let metrics = gantry_testkit::answer_text(http.get(format!("{}/metrics", leader.base))).await;
    let last_applied = metric(
        &metrics,
        "gantry_leader_write_last_applied_start_timestamp_seconds",
    );
    let applied = metric(&metrics, "gantry_leader_writes_total{result=\"applied\"}");
    let rejected = metric(&metrics, "gantry_leader_writes_total{result=\"rejected\"}");
    println!(
        "old leader after resuming: {applied} fenced writes applied (the last sent at {last_applied}), {rejected} refused; new term began at {}",
        taken.leader.acquired_at.as_millis()
    );
    assert!(applied > 0.0, "the old leader did write while it led");
    assert!(
        last_applied < taken.leader.acquired_at.as_millis() as f64 / 1000.0,
        "a write the old leader sent after the new token was issued landed"
    );
    // The resumed server does not take its old term back. (On a machine busy enough for
    // the new leader to miss its own renewals, a later election may legitimately happen:
    // then it is a new term with a higher token, whoever wins it.)
    let mut after = None;
    for _ in 0..10 {
        after = cluster_status(&http, &other.base, &token).await;
        if after.is_some() {
            break;
        }
    }
    let after = after.expect("the new leader's server answers its cluster status");
    assert!(after.leader.fencing_token >= taken.leader.fencing_token);
    assert!(
        after.leader.server_id == taken.leader.server_id
            || after.leader.fencing_token > taken.leader.fencing_token,
        "the lease changed hands without a new token: {taken:?} then {after:?}"
    );
    let health: gantry_types::CoordinatorHealth = gantry_testkit::answer_json(
        http.get(format!("{}/api/v1/coordinator/health", leader.base))
            .bearer_auth(&token),
    )
    .await;
    assert!(
        health.role == gantry_types::ServerRole::Standby
            || health.fencing_token > Some(taken.leader.fencing_token),
        "the resumed server leads again with its old term: {health:?}"
    );
}
