//! Writing one scheduler pass's placements: 10,000 pending instances recorded with
//! `Store::record_placements` one instance per call (a statement and a commit each, as
//! every placement used to be written) and in batches of 500 (as the scheduler writes
//! them now: one statement each), on SQLite and, when `GANTRY_TEST_POSTGRES_URL` is set, on PostgreSQL with
//! the leader's fence. Each run places a model's instances on one ready worker, on a fresh
//! database. Run with `cargo bench -p gantry-store --bench record_placements`.

use std::time::{Duration, Instant};

use gantry_store::{Fence, NewPlacement, Store};
use gantry_testkit::{TestDatabase, TestEngine};
use gantry_types::{ModelCreate, ModelInstance, PlacementRecord};

const INSTANCES: u32 = 10_000;
const BATCH: usize = 500;

fn model_create(name: &str) -> ModelCreate {
    serde_json::from_value(serde_json::json!({
        "name": name,
        "source": {"type": "local_path", "path": "/models/tiny.gguf"},
        "backend": "llama.cpp",
        "replicas": INSTANCES,
    }))
    .expect("a valid model")
}

/// A fresh store with one ready worker and a model of `INSTANCES` pending instances.
async fn pending_instances(
    engine: TestEngine,
) -> (
    TestDatabase,
    Store,
    i64,
    gantry_types::Model,
    Vec<ModelInstance>,
) {
    let db = TestDatabase::new(engine).await;
    let store = db.open().await;
    let worker = store
        .create_worker(
            "w1",
            &std::collections::BTreeMap::new(),
            "127.0.0.1:1",
            &gantry_types::fixtures::worker_status("w1", 8),
            "cred",
        )
        .await
        .expect("create the worker");
    let model = store
        .create_model(&model_create("m"))
        .await
        .expect("create the model");
    let replicas: Vec<u32> = (0..INSTANCES).collect();
    let instances = store
        .create_instances(&model, &replicas, &Fence::Unfenced)
        .await
        .expect("create the instances");
    (db, store, worker.id, model, instances)
}

/// Places every instance in calls of `per_call`; returns the time taken.
async fn place_all(engine: TestEngine, fence: &Fence, per_call: usize) -> Duration {
    let (_db, store, worker_id, model, instances) = pending_instances(engine).await;
    let record = PlacementRecord::by_hand(&model);
    let placements: Vec<NewPlacement<'_>> = instances
        .iter()
        .map(|instance| NewPlacement {
            instance_id: instance.id,
            model_updated_at: model.updated_at,
            worker_id,
            gpu_indexes: &[0],
            state_message: "scheduled on w1: GPU 0 (1.0 GiB), 0.5 GiB RAM; whole model on one GPU",
            record: &record,
        })
        .collect();
    let started = Instant::now();
    let mut written = 0;
    for chunk in placements.chunks(per_call) {
        let outcomes = store
            .record_placements(chunk, fence)
            .await
            .expect("record the placements");
        written += outcomes.iter().flatten().count();
    }
    let elapsed = started.elapsed();
    assert_eq!(written, instances.len(), "every placement applies");
    store.close().await;
    elapsed
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mut engines = vec![("SQLite", TestEngine::Sqlite, Fence::Unfenced)];
    if std::env::var_os("GANTRY_TEST_POSTGRES_URL").is_some() {
        // A fresh database's lease is at token 0: the leader of term 0 writes.
        engines.push(("PostgreSQL", TestEngine::Postgres, Fence::Leader(0)));
    } else {
        println!("PostgreSQL: not run (set GANTRY_TEST_POSTGRES_URL)");
    }
    for (name, engine, fence) in engines {
        for per_call in [1, BATCH] {
            let elapsed = place_all(engine, &fence, per_call).await;
            println!(
                "{name}: {INSTANCES} placements, {per_call} per transaction: {:.2} s ({:.0} µs each)",
                elapsed.as_secs_f64(),
                elapsed.as_secs_f64() * 1e6 / f64::from(INSTANCES)
            );
        }
    }
}
