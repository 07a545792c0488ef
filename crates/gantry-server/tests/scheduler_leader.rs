//! The controllers run only while the coordinator says this server leads: driven here with
//! a `LocalCoordinator` whose role the test sets, on SQLite and PostgreSQL. That a follower
//! runs no pass however long it waits is proved in paused time by the loop's own tests
//! (`controllers::run_loop`); here a real store shows that gaining leadership starts the
//! controllers at once.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use gantry_auth::jwt::JwtKeys;
use gantry_auth::{AuthConfig, Authenticator};
use gantry_coord::{Coordinator, Leadership, LocalCoordinator};
use gantry_server::state::{AppState, Shared};
use gantry_server::ServerConfig;
use gantry_store::{InstanceFilter, Page, Store};
use gantry_testkit::{test_both_engines, TestDatabase, TestEngine};
use gantry_types::{GpuDevice, InstanceState, ModelCreate, SystemInfo, WorkerStatus};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

fn worker_status() -> WorkerStatus {
    WorkerStatus {
        gpus: vec![GpuDevice {
            index: 0,
            name: "Simulated GPU".into(),
            uuid: "SIM-0".into(),
            memory_total: 80 << 30,
            memory_used: 0,
            utilization: None,
            temperature: None,
            simulated: true,
        }],
        system: SystemInfo {
            cpu_count: 4,
            memory_total: 64 << 30,
            ..Default::default()
        },
        backends: vec!["llama.cpp".into()],
    }
}

async fn states(store: &Store, model_id: i64) -> Vec<InstanceState> {
    let filter = InstanceFilter {
        model_id: Some(model_id),
        ..Default::default()
    };
    let page = Page {
        page: 1,
        per_page: 100,
    };
    let (instances, _) = store.list_instances(&filter, page).await.unwrap();
    instances.iter().map(|i| i.state).collect()
}

async fn controllers_run_only_while_leading(engine: TestEngine) {
    let db = TestDatabase::new(engine).await;
    let store = db.open().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    gantry_gguf::write_tiny_llama(&path).unwrap();
    store
        .create_worker(
            "w1",
            &BTreeMap::new(),
            "127.0.0.1:1",
            &worker_status(),
            "digest",
        )
        .await
        .unwrap();

    let state = AppState::new(Shared {
        store: store.clone(),
        config: ServerConfig::new(dir.path().join("data")),
        authenticator: Arc::new(Authenticator::new(
            store.clone(),
            JwtKeys::new(
                b"a-test-secret-that-is-long-enough",
                Duration::from_secs(60),
            ),
            AuthConfig::default(),
        )),
        shutdown: CancellationToken::new(),
        tasks: TaskTracker::new(),
        worker_http: gantry_server::state::worker_http_client(),
    });
    let coordinator = Arc::new(LocalCoordinator::new("s1"));
    coordinator.set_leadership(Leadership::Follower);
    gantry_server::controllers::spawn(&state, Arc::clone(&coordinator) as Arc<dyn Coordinator>);

    let create: ModelCreate = serde_json::from_value(serde_json::json!({
        "name": "tiny",
        "source": {"type": "local_path", "path": path.display().to_string()},
        "backend": "llama.cpp",
        "replicas": 2,
    }))
    .unwrap();
    let model = store.create_model(&create).await.unwrap();
    assert!(
        states(&store, model.id).await.is_empty(),
        "instances are the leader's to create"
    );

    coordinator.set_leadership(Leadership::Leader { fencing_token: 2 });
    let mut placed = false;
    for _ in 0..100 {
        if states(&store, model.id).await == [InstanceState::Scheduled; 2] {
            placed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(placed, "the new leader creates and places both instances");

    state.shutdown.cancel();
    state.tasks.close();
    state.tasks.wait().await;
}

test_both_engines!(controllers_run_only_while_leading);
