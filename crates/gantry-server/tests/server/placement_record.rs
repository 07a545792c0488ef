//! A stored placement record that does not decode keeps the GPUs of its instance booked:
//! the real server and its controllers on SQLite and PostgreSQL, driven through the typed
//! client, with one record damaged in the store.

use crate::common::{simulated_worker, TestServer};
use gantry_testkit::{test_both_engines, TestEngine};
use gantry_types::{BackendKind, InstanceState, InstanceStateReport, ModelCreate};

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

async fn an_undecodable_record_keeps_its_gpu_booked(engine: TestEngine) {
    let server = TestServer::start(engine).await;
    let admin = server.client();

    // One worker with one simulated 80 GiB GPU that runs custom commands.
    let mut registration = simulated_worker("w1", 1);
    registration.status.backends = vec!["custom".into()];
    let (registered, worker) = server.register(&registration).await;

    // Two instances of 30 GiB share the GPU: 20 GiB stay free.
    let a = admin.create_model(&declared("a", 30, 2)).await.unwrap();
    let placed = server
        .wait_for_instances(a.id, "both scheduled", |list| {
            list.len() == 2 && list.iter().all(|i| i.state == InstanceState::Scheduled)
        })
        .await;
    let report = |state: InstanceState| InstanceStateReport {
        state,
        state_message: String::new(),
        port: Some(40000),
        address: (state == InstanceState::Running).then(|| "127.0.0.1:40000".to_owned()),
        restart_count: 0,
        download: None,
        install: None,
        backend_version: None,
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
    let pending = server
        .wait_for_instances(b.id, "pending with a reason", |list| {
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
    assert_eq!(shown.worker_id, Some(registered.id), "still placed");
    assert_eq!(shown.state, InstanceState::Running);

    // Once the other instance serves, the roll moves the unreadable one through the
    // scheduler: it gets a record again, and the GPU's bytes are counted for what they are.
    worker
        .report_state(placed[1].id, &report(InstanceState::Running))
        .await
        .unwrap();
    let healed = server
        .wait_for_instances(a.id, "placed with a readable record", |list| {
            list.iter()
                .any(|i| i.id == damaged.id && i.placement.is_some())
        })
        .await;
    let healed = healed.iter().find(|i| i.id == damaged.id).unwrap();
    assert_eq!(healed.state, InstanceState::Scheduled);
    server.shutdown().await;
}

test_both_engines!(an_undecodable_record_keeps_its_gpu_booked);
