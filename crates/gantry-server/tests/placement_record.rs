//! A stored placement record that does not decode keeps the GPUs of its instance booked:
//! the real server and its controllers on SQLite and PostgreSQL, driven through the typed
//! client, with one record damaged in the store.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::TestServer;
use gantry_client::Client;
use gantry_testkit::{test_both_engines, TestEngine};
use gantry_types::{
    BackendKind, GpuDevice, InstanceQuery, InstanceState, InstanceStateReport, ModelCreate,
    ModelInstance, SystemInfo, WorkerRegister, WorkerStatus,
};

const GIB: u64 = 1 << 30;

/// A `custom` model that declares one GPU with `gib` GiB, `replicas` times.
fn declared(name: &str, gib: u64, replicas: u32) -> ModelCreate {
    serde_json::from_value(serde_json::json!({
        "name": name,
        "source": {"type": "local_path", "path": "/models/declared"},
        "backend": BackendKind::Custom,
        "custom_command": "serve --port {port}",
        "env": {"GANTRY_GPU_COUNT": "1", "GANTRY_GPU_MEMORY": format!("{gib}GiB")},
        "replicas": replicas,
    }))
    .unwrap()
}

async fn instances(client: &Client, model_id: i64) -> Vec<ModelInstance> {
    let query = InstanceQuery {
        model_id: Some(model_id),
        ..InstanceQuery::default()
    };
    client.list_instances(&query).await.unwrap().items
}

/// Polls the model's instances until `done` holds (10 s at most).
async fn wait(
    client: &Client,
    model_id: i64,
    what: &str,
    done: impl Fn(&[ModelInstance]) -> bool,
) -> Vec<ModelInstance> {
    let mut last = Vec::new();
    for _ in 0..200 {
        last = instances(client, model_id).await;
        if done(&last) {
            return last;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("instances never {what}: {last:#?}");
}

async fn an_undecodable_record_keeps_its_gpu_booked(engine: TestEngine) {
    let server = TestServer::start(engine).await;
    let admin = Client::new(&server.base).with_token(server.admin_token().await);

    // One worker with one simulated 80 GiB GPU.
    let registration = WorkerRegister {
        name: "w1".into(),
        labels: BTreeMap::new(),
        address: "127.0.0.1:1".into(),
        status: WorkerStatus {
            gpus: vec![GpuDevice {
                index: 0,
                name: "Simulated GPU".into(),
                uuid: "SIM-w1-0".into(),
                memory_total: 80 * GIB,
                memory_used: 0,
                utilization: None,
                temperature: None,
                simulated: true,
            }],
            system: SystemInfo {
                cpu_count: 8,
                memory_total: 64 * GIB,
                ..SystemInfo::default()
            },
            backends: vec!["custom".into()],
        },
    };
    let (registered, _) = Client::new(&server.base)
        .register_worker(&server.registration_token(), &registration)
        .await
        .unwrap();
    let worker = Client::new(&server.base).with_token(registered.credential.unwrap());

    // Two instances of 30 GiB share the GPU: 20 GiB stay free.
    let a = admin.create_model(&declared("a", 30, 2)).await.unwrap();
    let placed = wait(&admin, a.id, "both scheduled", |list| {
        list.len() == 2 && list.iter().all(|i| i.state == InstanceState::Scheduled)
    })
    .await;
    let report = |state: InstanceState| InstanceStateReport {
        state,
        state_message: String::new(),
        port: Some(40000),
        address: (state == InstanceState::Running).then(|| "127.0.0.1:40000".to_owned()),
        restart_count: 0,
    };
    // One serves; the other is still starting, so a roll keeps the serving one in place.
    let damaged = &placed[0];
    worker
        .report_state(damaged.id, &report(InstanceState::Running))
        .await
        .unwrap();
    worker
        .report_state(placed[1].id, &report(InstanceState::Starting))
        .await
        .unwrap();

    server
        .state()
        .store
        .overwrite_placement_record_for_tests(damaged.id, r#"{"claim": "lost"}"#)
        .await
        .unwrap();
    let before = gantry_store::undecodable_placement_records();

    // 15 GiB would fit beside two 30 GiB instances; not when the one whose record cannot
    // be read keeps the whole GPU booked.
    let b = admin.create_model(&declared("b", 15, 1)).await.unwrap();
    let pending = wait(&admin, b.id, "pending with a reason", |list| {
        list.len() == 1
            && list[0].state == InstanceState::Pending
            && !list[0].state_message.is_empty()
    })
    .await;
    assert!(
        pending[0].state_message.contains("GPU"),
        "{}",
        pending[0].state_message
    );
    assert!(
        gantry_store::undecodable_placement_records() > before,
        "the unreadable record is counted"
    );
    let metrics = reqwest::get(format!("{}/metrics", server.base))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let counted = metrics
        .lines()
        .find_map(|l| l.strip_prefix("gantry_store_undecodable_placement_records_total "))
        .and_then(|n| n.parse::<u64>().ok());
    assert!(counted.is_some_and(|n| n > 0), "{metrics}");
    let shown = admin.get_instance(damaged.id).await.unwrap();
    assert_eq!(
        shown.placement, None,
        "the API shows no record it cannot read"
    );
    assert_eq!(shown.worker_id, Some(registered.worker.id), "still placed");
    assert_eq!(shown.state, InstanceState::Running);

    // Once the other instance serves, the roll moves the unreadable one through the
    // scheduler: it gets a record again, and the GPU's bytes are counted for what they are.
    worker
        .report_state(placed[1].id, &report(InstanceState::Running))
        .await
        .unwrap();
    let healed = wait(&admin, a.id, "placed with a readable record", |list| {
        list.iter()
            .any(|i| i.id == damaged.id && i.placement.is_some())
    })
    .await;
    let healed = healed.iter().find(|i| i.id == damaged.id).unwrap();
    assert_eq!(healed.state, InstanceState::Scheduled);
    server.shutdown().await;
}

test_both_engines!(an_undecodable_record_keeps_its_gpu_booked);
