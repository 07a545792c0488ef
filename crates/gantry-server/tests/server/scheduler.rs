//! The scheduler loop and the controllers against a real server, on SQLite and
//! PostgreSQL: workers with simulated GPUs register through the API, models are created
//! through the API, and the instances must reach `scheduled` (or stay `pending` with a
//! reason) without any manual placement.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::{huge_safetensors_dir, labels, model, simulated_worker, Options, TestServer};
use gantry_client::{Client, ClientError};
use gantry_testkit::{test_both_engines, TestEngine};
use gantry_types::query::MAX_PER_PAGE;
use gantry_types::{
    BackendKind, InstanceQuery, InstanceState, InstanceStateReport, ModelCreate, ModelInstance,
    ModelMemory, ModelUpdate, PlacementKind, PlacementStrategy,
};

/// Registers a worker with `gpus` simulated 80 GiB GPUs and these labels; returns its
/// client.
async fn register(server: &TestServer, name: &str, gpus: u32, pairs: &[(&str, &str)]) -> Client {
    let mut registration = simulated_worker(name, gpus);
    registration.labels = labels(pairs);
    server.register(&registration).await.1
}

/// Sends heartbeats for the workers every 100 ms until dropped.
struct KeepAlive(tokio::task::JoinHandle<()>);

impl Drop for KeepAlive {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn keep_alive(workers: &[&Client]) -> KeepAlive {
    let workers: Vec<Client> = workers.iter().map(|w| (*w).clone()).collect();
    KeepAlive(tokio::spawn(async move {
        loop {
            for worker in &workers {
                let _ = worker.heartbeat().await;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }))
}

/// Writes the tiny GGUF model into the test's data directory.
fn tiny_gguf(server: &TestServer) -> PathBuf {
    let path = server.data_dir.path().join("tiny.gguf");
    gantry_gguf::write_tiny_llama(&path).unwrap();
    path
}

async fn create_model(server: &TestServer, body: &ModelCreate) -> i64 {
    server.client().create_model(body).await.unwrap().id
}

fn llama_model(name: &str, path: &Path, replicas: u32) -> ModelCreate {
    model(name, &path.display().to_string(), replicas)
}

fn all_in(state: InstanceState, count: usize) -> impl Fn(&[ModelInstance]) -> bool {
    move |instances| instances.len() == count && instances.iter().all(|i| i.state == state)
}

/// Waits until every instance is pending with a non-empty reason.
async fn wait_pending_with_reason(
    server: &TestServer,
    model_id: i64,
    count: usize,
) -> Vec<ModelInstance> {
    server
        .wait_for_instances(model_id, "pending with a reason", |instances| {
            instances.len() == count
                && instances
                    .iter()
                    .all(|i| i.state == InstanceState::Pending && !i.state_message.is_empty())
        })
        .await
}

/// Waits until the model has `count` instances, all scheduled.
async fn wait_scheduled(server: &TestServer, model_id: i64, count: usize) -> Vec<ModelInstance> {
    server
        .wait_for_instances(
            model_id,
            &format!("{count} scheduled"),
            all_in(InstanceState::Scheduled, count),
        )
        .await
}

fn worker_names(instances: &[ModelInstance]) -> Vec<String> {
    instances
        .iter()
        .map(|i| i.worker_name.clone().unwrap_or_else(|| "-".into()))
        .collect()
}

async fn replicas_are_scheduled_on_simulated_gpus_spread_over_workers(engine: TestEngine) {
    let server = TestServer::start(engine).await;
    register(&server, "w1", 2, &[]).await;
    register(&server, "w2", 2, &[]).await;
    let path = tiny_gguf(&server);
    let model_id = create_model(&server, &llama_model("tiny", &path, 2)).await;

    let instances = wait_scheduled(&server, model_id, 2).await;
    let mut names = worker_names(&instances);
    names.sort();
    assert_eq!(names, ["w1", "w2"], "spread puts one on each worker");
    for instance in &instances {
        assert_eq!(instance.gpu_indexes, [0], "{instance:?}");
        let message = &instance.state_message;
        assert!(
            message.contains("simulated GPU 0"),
            "the message says where, and that the GPU is simulated: {message}"
        );
        let record = instance.placement.as_ref().unwrap();
        let reservation = record.reservation.as_ref().unwrap();
        assert!(
            matches!(reservation.claim.memory, ModelMemory::Layers(_)),
            "{record:?}"
        );
        assert_eq!(
            Some(&reservation.placement.worker_name),
            instance.worker_name.as_ref()
        );
        assert_eq!(reservation.placement.kind, PlacementKind::SingleGpu);
        assert_eq!(record.launch.backend, BackendKind::LlamaCpp);
        // The tiny model has 2 blocks (3 layers with the output) and a 256-token context.
        assert_eq!(
            record.placement_args,
            ["--ctx-size", "256", "-ngl", "3"],
            "{record:?}"
        );
    }
    server.shutdown().await;
}

async fn binpack_packs_replicas_onto_one_worker(engine: TestEngine) {
    let server = TestServer::start(engine).await;
    register(&server, "w1", 2, &[]).await;
    register(&server, "w2", 2, &[]).await;
    let path = tiny_gguf(&server);
    let packed = ModelCreate {
        placement_strategy: PlacementStrategy::Binpack,
        ..llama_model("packed", &path, 2)
    };
    let model_id = create_model(&server, &packed).await;
    let instances = wait_scheduled(&server, model_id, 2).await;
    assert_eq!(worker_names(&instances), ["w1", "w1"]);
    server.shutdown().await;
}

async fn models_too_large_for_any_worker_stay_pending_with_the_shortfall(engine: TestEngine) {
    let server = TestServer::start(engine).await;
    register(&server, "w1", 2, &[]).await;

    // vLLM with 500 GB of weights: not even both 80 GiB GPUs together hold it.
    let dir = huge_safetensors_dir(&server);
    let huge = ModelCreate {
        backend: BackendKind::Vllm.into(),
        ..llama_model("huge", &dir, 1)
    };
    let huge = create_model(&server, &huge).await;
    let instances = wait_pending_with_reason(&server, huge, 1).await;
    let message = &instances[0].state_message;
    assert!(
        message.starts_with("no ready worker has 1 GPU with 90% of memory free")
            && message.contains("2 GPUs")
            && message.contains("best: w1"),
        "the reason names what was needed and the closest worker: {message}"
    );
    assert!(instances[0].worker_id.is_none());
    assert!(
        instances[0].placement.is_none(),
        "nothing is reserved for an instance that does not fit"
    );

    // llama.cpp with a 16M-token context, no flash attention and no CPU offload: the KV
    // cache and the attention scores of one ubatch exceed any GPU.
    let path = tiny_gguf(&server);
    let long = ModelCreate {
        backend_args: ["--ctx-size", "16777216", "--flash-attn", "off"]
            .map(String::from)
            .to_vec(),
        cpu_offload: false,
        ..llama_model("long", &path, 1)
    };
    let long = create_model(&server, &long).await;
    let instances = wait_pending_with_reason(&server, long, 1).await;
    let message = &instances[0].state_message;
    assert!(
        message.starts_with("no ready worker has 1 GPU with") && message.contains("best: w1"),
        "{message}"
    );
    server.shutdown().await;
}

async fn a_model_file_gone_from_the_server_leaves_instances_pending_naming_the_path(
    engine: TestEngine,
) {
    let server = TestServer::start(engine).await;
    register(&server, "w1", 1, &[]).await;
    // Creation refuses a path the server cannot find, so the file goes after it.
    let path = server.data_dir.path().join("not-there.gguf");
    gantry_gguf::write_tiny_llama(&path).unwrap();
    let model_id = create_model(&server, &llama_model("ghost", &path, 0)).await;
    std::fs::remove_file(&path).unwrap();
    let scale = ModelUpdate {
        replicas: Some(2),
        ..ModelUpdate::default()
    };
    server
        .client()
        .update_model(model_id, &scale)
        .await
        .unwrap();
    let instances = wait_pending_with_reason(&server, model_id, 2).await;
    for instance in &instances {
        let message = &instance.state_message;
        assert!(
            message.contains(&path.display().to_string())
                && message.contains("does not exist on the server")
                && message.contains("correct the model's path"),
            "the message names the path and what to fix: {message}"
        );
        assert!(!message.contains("os error"), "{message}");
    }

    // Once the file appears (and the model is touched, or the retry comes round), the
    // instances are placed.
    gantry_gguf::write_tiny_llama(&path).unwrap();
    let touch = ModelUpdate {
        description: Some("the file is there now".into()),
        ..ModelUpdate::default()
    };
    server
        .client()
        .update_model(model_id, &touch)
        .await
        .unwrap();
    wait_scheduled(&server, model_id, 2).await;
    server.shutdown().await;
}

async fn worker_selectors_are_respected(engine: TestEngine) {
    let server = TestServer::start(engine).await;
    register(&server, "wa", 1, &[("zone", "a")]).await;
    register(&server, "wb", 1, &[("zone", "b")]).await;
    let path = tiny_gguf(&server);

    let in_b = ModelCreate {
        worker_selector: labels(&[("zone", "b")]),
        ..llama_model("in-b", &path, 2)
    };
    let in_b = create_model(&server, &in_b).await;
    let instances = wait_scheduled(&server, in_b, 2).await;
    assert_eq!(worker_names(&instances), ["wb", "wb"]);

    let in_c = ModelCreate {
        worker_selector: labels(&[("zone", "c")]),
        ..llama_model("in-c", &path, 1)
    };
    let in_c = create_model(&server, &in_c).await;
    let instances = wait_pending_with_reason(&server, in_c, 1).await;
    assert_eq!(
        instances[0].state_message,
        "no worker matches selector zone=c"
    );

    // A worker relabelled to match: the passes read the workers again (they keep what
    // they read only while no worker changes).
    let wa = server
        .client()
        .list_workers(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|w| w.name == "wa")
        .unwrap();
    let relabelled = std::time::Instant::now();
    server
        .client()
        .set_worker_labels(
            wa.id,
            &gantry_types::WorkerLabelsUpdate {
                labels: labels(&[("zone", "c")]),
            },
        )
        .await
        .unwrap();
    let instances = wait_scheduled(&server, in_c, 1).await;
    assert_eq!(worker_names(&instances), ["wa"]);
    // Well before the 10 s after which a pass reads the workers again regardless.
    assert!(
        relabelled.elapsed() < Duration::from_secs(8),
        "placed only {:?} after the relabelling",
        relabelled.elapsed()
    );
    server.shutdown().await;
}

async fn replicas_follow_the_model_and_deleted_instances_are_replaced(engine: TestEngine) {
    let server = TestServer::start(engine).await;
    let admin = server.client();
    register(&server, "w1", 2, &[]).await;
    let path = tiny_gguf(&server);
    let model_id = create_model(&server, &llama_model("scaled", &path, 2)).await;
    wait_scheduled(&server, model_id, 2).await;

    let scale = |replicas: u32| async move {
        let update = ModelUpdate {
            replicas: Some(replicas),
            ..ModelUpdate::default()
        };
        admin.update_model(model_id, &update).await.unwrap();
    };
    scale(3).await;
    wait_scheduled(&server, model_id, 3).await;
    scale(1).await;
    let instances = server
        .wait_for_instances(model_id, "scaled down", all_in(InstanceState::Scheduled, 1))
        .await;

    // An instance deleted on its own is replaced and placed again.
    let old = instances[0].id;
    admin.delete_instance(old).await.unwrap();
    let instances = server
        .wait_for_instances(model_id, "replaced", |instances| {
            all_in(InstanceState::Scheduled, 1)(instances) && instances[0].id != old
        })
        .await;
    assert_eq!(instances[0].worker_name.as_deref(), Some("w1"));

    scale(0).await;
    server
        .wait_for_instances(model_id, "gone", |instances| instances.is_empty())
        .await;
    server.shutdown().await;
}

/// Short heartbeats so that a silent worker is unreachable within 1.5 s, and the
/// reschedule delay (a third of that) is half a second.
fn fast_health() -> Options {
    Options {
        heartbeat_interval: Duration::from_millis(200),
        server_timeout: Duration::from_millis(1500),
        ..Default::default()
    }
}

/// One instance, scheduled on `worker`.
fn alone_on(worker: &'static str) -> impl Fn(&[ModelInstance]) -> bool {
    move |instances| {
        instances.len() == 1
            && instances[0].state == InstanceState::Scheduled
            && instances[0].worker_name.as_deref() == Some(worker)
    }
}

async fn instances_of_an_unreachable_worker_move_to_another(engine: TestEngine) {
    let server = TestServer::start_with(engine, fast_health()).await;
    let w1 = register(&server, "w1", 1, &[]).await;
    let w2 = register(&server, "w2", 1, &[]).await;
    let both = keep_alive(&[&w1, &w2]);
    let path = tiny_gguf(&server);
    let model_id = create_model(&server, &llama_model("mobile", &path, 1)).await;
    let instances = wait_scheduled(&server, model_id, 1).await;
    assert_eq!(
        worker_names(&instances),
        ["w1"],
        "spread breaks ties by worker id"
    );

    // w1 goes silent; only w2 keeps sending heartbeats.
    drop(both);
    let _w2 = keep_alive(&[&w2]);
    let instances = server
        .wait_for_instances(model_id, "moved to w2", alone_on("w2"))
        .await;
    let message = &instances[0].state_message;
    assert!(
        message.contains("rescheduling after: worker w1 is unreachable"),
        "{message}"
    );
    let record = instances[0].placement.as_ref().unwrap();
    assert_eq!(
        record.reservation.as_ref().unwrap().placement.worker_name,
        "w2"
    );
    server.shutdown().await;
}

async fn errored_instances_are_rescheduled_on_another_worker(engine: TestEngine) {
    let server = TestServer::start_with(engine, fast_health()).await;
    let w1 = register(&server, "w1", 1, &[]).await;
    let w2 = register(&server, "w2", 1, &[]).await;
    let _alive = keep_alive(&[&w1, &w2]);
    let path = tiny_gguf(&server);
    let model_id = create_model(&server, &llama_model("flaky", &path, 1)).await;
    let instances = wait_scheduled(&server, model_id, 1).await;
    assert_eq!(worker_names(&instances), ["w1"]);
    let id = instances[0].id;

    // w1 gives up on it after its restart budget.
    let gave_up = InstanceStateReport::new(InstanceState::Error, "llama-server exited 5 times");
    w1.report_state(id, &gave_up).await.unwrap();
    // Both workers are ready and equally empty, so spread alone would pick w1 again; the
    // rescheduled instance prefers the worker that did not give up on it.
    let instances = server
        .wait_for_instances(model_id, "moved to w2", alone_on("w2"))
        .await;
    assert_eq!(instances[0].id, id, "the same instance moved");
    let message = &instances[0].state_message;
    assert!(
        message.contains("rescheduling after: llama-server exited 5 times"),
        "{message}"
    );
    assert_eq!(instances[0].restart_count, 0);
    server.shutdown().await;
}

/// Every instance, over as many pages as it takes.
async fn all_instances(server: &TestServer) -> Vec<ModelInstance> {
    let mut instances = Vec::new();
    for page in 1.. {
        let query = InstanceQuery {
            page: Some(page),
            per_page: Some(MAX_PER_PAGE),
            ..InstanceQuery::default()
        };
        let items = server.client().list_instances(&query).await.unwrap().items;
        let last = items.len() < MAX_PER_PAGE as usize;
        instances.extend(items);
        if last {
            break;
        }
    }
    instances
}

/// How many instances show each state (and, when pending, message): what a wait over
/// thousands of instances looks at and prints.
async fn tally(server: &TestServer) -> Result<BTreeMap<String, usize>, ClientError> {
    let mut tally = BTreeMap::new();
    for instance in all_instances(server).await {
        let key = match instance.state {
            InstanceState::Pending => format!("pending: {}", instance.state_message),
            state => state.as_str().to_owned(),
        };
        *tally.entry(key).or_default() += 1;
    }
    Ok(tally)
}

/// A pass with more decisions than several batches writes a few batches at once while it
/// decides the next: instances are placed on every GPU, the rest stay pending with the
/// reason, and no GPU is booked beyond its memory.
async fn a_backlog_of_several_batches_fills_the_gpus_without_overbooking(engine: TestEngine) {
    const GIB: u64 = 1 << 30;
    const GPUS: u32 = 8;
    const REPLICAS: u32 = 800;
    // Thousands of instances on a test machine running the rest of the suite.
    const WITHIN: Duration = Duration::from_secs(60);
    const EVERY: Duration = Duration::from_millis(250);
    let server = TestServer::start(engine).await;
    let path = tiny_gguf(&server);
    // 1,600 instances wait for a worker; its registration makes one pass decide them all,
    // four batches (more than the 8 GPUs hold: each claims about 0.5 GiB).
    for name in ["backlog-a", "backlog-b"] {
        create_model(&server, &llama_model(name, &path, REPLICAS)).await;
    }
    let total = 2 * REPLICAS as usize;
    let waiting = gantry_testkit::eventually(
        &format!("{total} instances pending for want of a worker"),
        WITHIN,
        EVERY,
        || tally(&server),
        |tally| tally.len() == 1 && tally.values().sum::<usize>() == total,
        String::new,
    )
    .await;
    let before = waiting.into_keys().next().unwrap();
    assert!(before.starts_with("pending: no ready worker"), "{before}");

    let worker = register(&server, "w1", GPUS, &[]).await;
    let _alive = keep_alive(&[&worker]);
    gantry_testkit::eventually(
        &format!("{total} instances placed or pending with a new reason"),
        WITHIN,
        EVERY,
        || tally(&server),
        |tally| {
            tally.values().sum::<usize>() == total
                && tally.keys().all(|key| {
                    *key != before && (key == "scheduled" || key.starts_with("pending: "))
                })
        },
        String::new,
    )
    .await;
    let instances = all_instances(&server).await;

    let mut booked: BTreeMap<u32, u64> = BTreeMap::new();
    for instance in &instances {
        let Some(record) = &instance.placement else {
            continue;
        };
        for gpu in &record.reservation.as_ref().unwrap().placement.gpus {
            *booked.entry(gpu.index).or_default() += gpu.bytes;
        }
    }
    assert_eq!(booked.len(), GPUS as usize, "every GPU is used: {booked:?}");
    for (gpu, bytes) in &booked {
        assert!(
            *bytes <= 80 * GIB,
            "GPU {gpu} is booked {bytes} bytes of 80 GiB"
        );
    }
    let placed = instances.iter().filter(|i| i.worker_id.is_some()).count();
    let pending: Vec<&ModelInstance> = instances.iter().filter(|i| i.worker_id.is_none()).collect();
    assert!(
        placed > 0 && !pending.is_empty(),
        "the GPUs fill up: {placed} placed, {} pending",
        pending.len()
    );
    for instance in pending {
        assert!(
            instance.state_message.starts_with("no ready worker has"),
            "{}: {}",
            instance.name,
            instance.state_message
        );
    }
    server.shutdown().await;
}

test_both_engines!(
    a_backlog_of_several_batches_fills_the_gpus_without_overbooking,
    replicas_are_scheduled_on_simulated_gpus_spread_over_workers,
    binpack_packs_replicas_onto_one_worker,
    models_too_large_for_any_worker_stay_pending_with_the_shortfall,
    a_model_file_gone_from_the_server_leaves_instances_pending_naming_the_path,
    worker_selectors_are_respected,
    replicas_follow_the_model_and_deleted_instances_are_replaced,
    instances_of_an_unreachable_worker_move_to_another,
    errored_instances_are_rescheduled_on_another_worker,
);
