//! The scheduler's store statements (`gantry-store/src/scheduling.rs`) on SQLite and
//! PostgreSQL: every write applies only to the state it was decided from, so a deleted
//! instance is never resurrected and a newer decision is never overwritten.

#![allow(clippy::unwrap_used)]

mod common;

use gantry_store::{Fence, ManualPlacement, NewPlacement, Store, StoredPlacement};
use gantry_testkit::{test_both_engines, TestDatabase, TestEngine};
use gantry_types::{
    InstanceState, InstanceStateReport, Model, ModelInstance, PlacementRecord, WorkerState,
};

/// One server: nothing to fence off.
const UNFENCED: Fence = Fence::Unfenced;

async fn setup(store: &Store, replicas: u32) -> (Model, Vec<ModelInstance>, i64) {
    let model = store
        .create_model(&common::tiny_model("m", replicas))
        .await
        .unwrap();
    let numbers: Vec<u32> = (0..replicas).collect();
    store
        .create_instances(&model, &numbers, &UNFENCED)
        .await
        .unwrap();
    let worker = common::stored_worker(store, "w1", "digest-w1").await;
    let (instances, _) = store
        .list_instances(
            &gantry_store::InstanceFilter {
                model_id: Some(model.id),
                ..Default::default()
            },
            gantry_store::Page {
                page: 1,
                per_page: 100,
            },
        )
        .await
        .unwrap();
    (model, instances, worker.id)
}

fn record(model: &Model) -> PlacementRecord {
    let mut record = PlacementRecord::by_hand(model);
    record.placement_args = vec!["-ngl".into(), "3".into()];
    record
}

fn placement<'a>(
    instance: &ModelInstance,
    model: &Model,
    worker_id: i64,
    record: &'a PlacementRecord,
) -> NewPlacement<'a> {
    NewPlacement {
        instance_id: instance.id,
        model_updated_at: model.updated_at,
        worker_id,
        gpu_indexes: &[0],
        state_message: "scheduled on w1",
        record,
        fence: &UNFENCED,
    }
}

async fn placements_apply_only_to_unplaced_instances_of_the_same_model_version(engine: TestEngine) {
    let db = TestDatabase::new(engine).await;
    let store = db.open().await;
    let (model, instances, worker_id) = setup(&store, 3).await;
    let record = record(&model);
    let mut changes = store.subscribe();

    // Pending → scheduled, with worker, GPUs, message and claim, published.
    let placed = store
        .record_placement(&placement(&instances[0], &model, worker_id, &record))
        .await
        .unwrap()
        .expect("a pending instance is placed");
    assert_eq!(placed.state, InstanceState::Scheduled);
    assert_eq!(placed.worker_id, Some(worker_id));
    assert_eq!(placed.gpu_indexes, vec![0]);
    assert_eq!(placed.state_message, "scheduled on w1");
    assert_eq!(placed.placement, Some(record.clone()));
    let change = changes.try_recv().unwrap();
    assert!(matches!(&*change, gantry_store::Change::Instance(_, i) if i.id == placed.id));

    // Placed already: a second placement changes nothing.
    assert!(store
        .record_placement(&placement(&instances[0], &model, worker_id, &record))
        .await
        .unwrap()
        .is_none());

    // Deleted meanwhile: not resurrected.
    store.delete_instance(instances[1].id).await.unwrap();
    assert!(store
        .record_placement(&placement(&instances[1], &model, worker_id, &record))
        .await
        .unwrap()
        .is_none());
    assert!(store.get_instance(instances[1].id).await.is_err());

    // The worker is not ready, or does not exist: refused.
    store
        .set_worker_state(worker_id, WorkerState::Maintenance, "by hand")
        .await
        .unwrap();
    assert!(store
        .record_placement(&placement(&instances[2], &model, worker_id, &record))
        .await
        .unwrap()
        .is_none());
    store
        .set_worker_state(worker_id, WorkerState::Ready, "")
        .await
        .unwrap();
    assert!(store
        .record_placement(&placement(&instances[2], &model, worker_id + 100, &record))
        .await
        .unwrap()
        .is_none());

    // The model changed since the claim was computed: refused.
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    let mut changed = model.clone();
    changed.backend_args = vec!["-c".into(), "64".into()];
    let changed = store.update_model(&changed).await.unwrap();
    assert!(store
        .record_placement(&placement(&instances[2], &model, worker_id, &record))
        .await
        .unwrap()
        .is_none());
    let placed = store
        .record_placement(&placement(&instances[2], &changed, worker_id, &record))
        .await
        .unwrap()
        .expect("placed with the current version");
    assert_eq!(placed.state, InstanceState::Scheduled);

    let claims = store.placed_instance_claims().await.unwrap();
    let ids: Vec<i64> = claims.iter().map(|c| c.instance_id).collect();
    assert_eq!(ids, vec![instances[0].id, instances[2].id]);
    assert_eq!(claims[0].worker_id, worker_id);
    assert_eq!(claims[0].gpu_indexes, vec![0]);
    assert_eq!(
        claims[0].placement,
        StoredPlacement::Record(Box::new(record))
    );
}

async fn pending_reasons_are_written_only_when_they_change(engine: TestEngine) {
    let db = TestDatabase::new(engine).await;
    let store = db.open().await;
    let (model, instances, worker_id) = setup(&store, 2).await;
    let id = instances[0].id;

    let analyzing = store
        .mark_instances_analyzing(model.id, "reading headers", &UNFENCED)
        .await
        .unwrap();
    assert_eq!(analyzing.len(), 2);
    assert!(analyzing
        .iter()
        .all(|i| i.state == InstanceState::Analyzing && i.state_message == "reading headers"));

    let pending = store
        .set_pending_reason(id, "no ready worker", &UNFENCED)
        .await
        .unwrap()
        .expect("analyzing → pending");
    assert_eq!(pending.state, InstanceState::Pending);
    assert_eq!(pending.state_message, "no ready worker");
    assert!(
        store
            .set_pending_reason(id, "no ready worker", &UNFENCED)
            .await
            .unwrap()
            .is_none(),
        "the same reason again writes nothing"
    );
    assert!(store
        .set_pending_reason(id, "another reason", &UNFENCED)
        .await
        .unwrap()
        .is_some());

    // Placed by hand meanwhile: the scheduler's reason does not overwrite it.
    let by_hand = PlacementRecord::by_hand(&model);
    store
        .place_instance_manually(
            instances[1].id,
            Some(ManualPlacement {
                worker_id,
                gpu_indexes: &[0],
                state_message: "placed by hand",
                record: &by_hand,
            }),
        )
        .await
        .unwrap();
    assert!(store
        .set_pending_reason(instances[1].id, "no ready worker", &UNFENCED)
        .await
        .unwrap()
        .is_none());
    assert!(store
        .mark_instances_analyzing(model.id, "again", &UNFENCED)
        .await
        .unwrap()
        .iter()
        .all(|i| i.id != instances[1].id));
}

async fn unplacing_applies_only_to_the_lost_state_on_the_same_worker(engine: TestEngine) {
    let db = TestDatabase::new(engine).await;
    let store = db.open().await;
    let (model, instances, worker_id) = setup(&store, 1).await;
    let id = instances[0].id;
    let record = record(&model);
    store
        .record_placement(&placement(&instances[0], &model, worker_id, &record))
        .await
        .unwrap()
        .unwrap();
    store
        .report_instance_state(
            id,
            worker_id,
            &InstanceStateReport {
                state: InstanceState::Error,
                state_message: "exited 5 times".into(),
                port: Some(40000),
                address: None,
                restart_count: 5,
                download: None,
                install: None,
                backend_version: None,
            },
        )
        .await
        .unwrap();

    // Wrong expected state or worker: nothing happens.
    assert!(store
        .unplace_instance(id, InstanceState::Unreachable, worker_id, "x", &UNFENCED)
        .await
        .unwrap()
        .is_none());
    assert!(store
        .unplace_instance(id, InstanceState::Error, worker_id + 1, "x", &UNFENCED)
        .await
        .unwrap()
        .is_none());

    let unplaced = store
        .unplace_instance(
            id,
            InstanceState::Error,
            worker_id,
            "rescheduling after: exited 5 times",
            &UNFENCED,
        )
        .await
        .unwrap()
        .expect("unplaced");
    assert_eq!(unplaced.state, InstanceState::Pending);
    assert_eq!(unplaced.worker_id, None);
    assert!(unplaced.gpu_indexes.is_empty());
    assert_eq!(unplaced.port, None);
    assert_eq!(unplaced.placement, None);
    assert_eq!(unplaced.restart_count, 0);
    assert_eq!(unplaced.state_message, "rescheduling after: exited 5 times");
    assert!(store.placed_instance_claims().await.unwrap().is_empty());

    // Deleted: nothing to unplace.
    store.delete_instance(id).await.unwrap();
    assert!(store
        .unplace_instance(id, InstanceState::Pending, worker_id, "x", &UNFENCED)
        .await
        .unwrap()
        .is_none());
}

test_both_engines!(
    placements_apply_only_to_unplaced_instances_of_the_same_model_version,
    pending_reasons_are_written_only_when_they_change,
    unplacing_applies_only_to_the_lost_state_on_the_same_worker,
);
