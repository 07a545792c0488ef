//! The scheduler's store statements (`gantry-store/src/scheduling.rs`) on SQLite and
//! PostgreSQL: every write applies only to the state it was decided from, so a deleted
//! instance is never resurrected and a newer decision is never overwritten.

use crate::common;

use gantry_store::{
    Change, ChangeKind, Fence, ManualPlacement, NewPlacement, PendingReason, Store, StoreError,
    StoredPlacement,
};
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
    }
}

/// Writes one placement as a batch of one.
async fn place_one(store: &Store, placement: NewPlacement<'_>) -> Option<ModelInstance> {
    let mut written = store
        .record_placements(&[placement], &UNFENCED)
        .await
        .unwrap();
    assert_eq!(written.len(), 1, "one outcome per placement");
    written.pop().unwrap()
}

/// Writes one pending reason as a batch of one.
async fn set_reason(store: &Store, instance_id: i64, message: &str) -> Option<ModelInstance> {
    let mut written = store
        .set_pending_reasons(
            &[PendingReason {
                instance_id,
                message,
            }],
            &UNFENCED,
        )
        .await
        .unwrap();
    assert_eq!(written.len(), 1, "one outcome per reason");
    written.pop().unwrap()
}

async fn placements_apply_only_to_unplaced_instances_of_the_same_model_version(engine: TestEngine) {
    let db = TestDatabase::new(engine).await;
    let store = db.open().await;
    let (model, instances, worker_id) = setup(&store, 3).await;
    let record = record(&model);
    let mut changes = store.subscribe();

    // Pending → scheduled, with worker, GPUs, message and claim, published.
    let placed = place_one(&store, placement(&instances[0], &model, worker_id, &record))
        .await
        .expect("a pending instance is placed");
    assert_eq!(placed.state, InstanceState::Scheduled);
    assert_eq!(placed.worker_id, Some(worker_id));
    assert_eq!(placed.gpu_indexes, vec![0]);
    assert_eq!(placed.state_message, "scheduled on w1");
    assert_eq!(placed.placement, Some(record.clone()));
    let change = changes.try_recv().unwrap();
    assert!(matches!(&*change, gantry_store::Change::Instance(_, i) if i.id == placed.id));

    // Placed already: a second placement changes nothing.
    assert!(
        place_one(&store, placement(&instances[0], &model, worker_id, &record))
            .await
            .is_none()
    );

    // Deleted meanwhile: not resurrected.
    store.delete_instance(instances[1].id).await.unwrap();
    assert!(
        place_one(&store, placement(&instances[1], &model, worker_id, &record))
            .await
            .is_none()
    );
    assert!(store.get_instance(instances[1].id).await.is_err());

    // The worker is not ready, or does not exist: refused.
    store
        .set_worker_state(worker_id, WorkerState::Maintenance, "by hand")
        .await
        .unwrap();
    assert!(
        place_one(&store, placement(&instances[2], &model, worker_id, &record))
            .await
            .is_none()
    );
    store
        .set_worker_state(worker_id, WorkerState::Ready, "")
        .await
        .unwrap();
    assert!(place_one(
        &store,
        placement(&instances[2], &model, worker_id + 100, &record)
    )
    .await
    .is_none());

    // The model changed since the claim was computed: refused.
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    let mut changed = model.clone();
    changed.backend_args = vec!["-c".into(), "64".into()];
    let changed = store.update_model(&changed).await.unwrap();
    assert!(
        place_one(&store, placement(&instances[2], &model, worker_id, &record))
            .await
            .is_none()
    );
    let placed = place_one(
        &store,
        placement(&instances[2], &changed, worker_id, &record),
    )
    .await
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

    let pending = set_reason(&store, id, "no ready worker")
        .await
        .expect("analyzing → pending");
    assert_eq!(pending.state, InstanceState::Pending);
    assert_eq!(pending.state_message, "no ready worker");
    assert!(
        set_reason(&store, id, "no ready worker").await.is_none(),
        "the same reason again writes nothing"
    );
    assert!(set_reason(&store, id, "another reason").await.is_some());

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
    assert!(set_reason(&store, instances[1].id, "no ready worker")
        .await
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
    place_one(&store, placement(&instances[0], &model, worker_id, &record))
        .await
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

async fn a_batch_of_placements_writes_those_that_still_apply_and_publishes_only_them(
    engine: TestEngine,
) {
    let db = TestDatabase::new(engine).await;
    let store = db.open().await;
    let (model, instances, ready) = setup(&store, 5).await;
    let record = record(&model);
    let not_ready = common::stored_worker(&store, "w2", "digest-w2").await.id;
    store
        .set_worker_state(not_ready, WorkerState::NotReady, "missed 3 heartbeats")
        .await
        .unwrap();
    let other = store
        .create_model(&common::tiny_model("other", 1))
        .await
        .unwrap();
    let other_instances = store
        .create_instances(&other, &[0], &UNFENCED)
        .await
        .unwrap();

    // Between the snapshot and the write: one instance is deleted, one placed by hand,
    // the other model changes.
    store.delete_instance(instances[1].id).await.unwrap();
    let by_hand = PlacementRecord::by_hand(&model);
    store
        .place_instance_manually(
            instances[2].id,
            Some(ManualPlacement {
                worker_id: ready,
                gpu_indexes: &[0],
                state_message: "placed by hand",
                record: &by_hand,
            }),
        )
        .await
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    let mut changed = other.clone();
    changed.backend_args = vec!["-c".into(), "64".into()];
    store.update_model(&changed).await.unwrap();

    let mut changes = store.subscribe();
    let batch = [
        placement(&instances[0], &model, ready, &record),
        placement(&instances[1], &model, ready, &record),
        placement(&instances[2], &model, ready, &record),
        placement(&other_instances[0], &other, ready, &record),
        placement(&instances[3], &model, not_ready, &record),
        placement(&instances[4], &model, ready, &record),
        // The same instance twice: the first placement wins.
        placement(&instances[0], &model, ready, &record),
    ];
    let written = store.record_placements(&batch, &UNFENCED).await.unwrap();
    let outcome: Vec<Option<i64>> = written.iter().map(|w| w.as_ref().map(|i| i.id)).collect();
    assert_eq!(
        outcome,
        [
            Some(instances[0].id),
            None,
            None,
            None,
            None,
            Some(instances[4].id),
            None
        ]
    );
    for placed in written.iter().flatten() {
        assert_eq!(placed.state, InstanceState::Scheduled);
        assert_eq!(placed.worker_id, Some(ready));
        assert_eq!(placed.worker_name.as_deref(), Some("w1"));
        assert_eq!(placed.model_name, "m");
        assert_eq!(placed.state_message, "scheduled on w1");
        assert_eq!(placed.placement, Some(record.clone()));
        assert_eq!(&store.get_instance(placed.id).await.unwrap(), placed);
    }

    // One change per written instance, carrying it as written; nothing for the others.
    let mut published = Vec::new();
    while let Ok(change) = changes.try_recv() {
        match &*change {
            Change::Instance(ChangeKind::Updated, instance) => published.push(instance.clone()),
            other => panic!("unexpected change {other:?}"),
        }
    }
    let expected: Vec<ModelInstance> = written.into_iter().flatten().collect();
    assert_eq!(published, expected);

    // The refused ones are as they were.
    assert!(store.get_instance(instances[1].id).await.is_err());
    let by_hand_now = store.get_instance(instances[2].id).await.unwrap();
    assert_eq!(by_hand_now.state_message, "placed by hand");
    assert_eq!(by_hand_now.placement, Some(by_hand));
    for id in [other_instances[0].id, instances[3].id] {
        let unplaced = store.get_instance(id).await.unwrap();
        assert_eq!(
            (unplaced.state, unplaced.worker_id),
            (InstanceState::Pending, None)
        );
    }
    // An empty batch is no transaction and no change.
    assert!(store
        .record_placements(&[], &UNFENCED)
        .await
        .unwrap()
        .is_empty());
    assert!(changes.try_recv().is_err());
}

async fn a_stale_fence_writes_nothing_of_a_batch(engine: TestEngine) {
    let db = TestDatabase::new(engine).await;
    let store = db.open().await;
    let (model, instances, worker_id) = setup(&store, 3).await;
    let record = record(&model);
    // A fresh database's lease is at token 0: term 0 is current, term 1 not yet issued.
    let current = Fence::Leader(0);
    let stale = Fence::Leader(1);
    let mut changes = store.subscribe();
    let before = gantry_store::fenced_writes();

    let batch = [
        placement(&instances[0], &model, worker_id, &record),
        placement(&instances[1], &model, worker_id, &record),
    ];
    let refused = store.record_placements(&batch, &stale).await;
    assert!(
        matches!(refused, Err(StoreError::Fenced { .. })),
        "{refused:?}"
    );
    let reasons = [PendingReason {
        instance_id: instances[2].id,
        message: "no ready worker",
    }];
    let refused = store.set_pending_reasons(&reasons, &stale).await;
    assert!(
        matches!(refused, Err(StoreError::Fenced { .. })),
        "{refused:?}"
    );
    for instance in &instances {
        let now = store.get_instance(instance.id).await.unwrap();
        assert_eq!(&now, instance, "nothing written");
    }
    assert!(changes.try_recv().is_err(), "nothing published");
    let after = gantry_store::fenced_writes();
    assert!(
        after.rejected >= before.rejected + 2,
        "{before:?} {after:?}"
    );

    // The current term writes the same batch.
    let written = store.record_placements(&batch, &current).await.unwrap();
    assert!(written.iter().all(Option::is_some), "{written:?}");
    let written = store.set_pending_reasons(&reasons, &current).await.unwrap();
    assert_eq!(
        written[0].as_ref().map(|i| i.state_message.as_str()),
        Some("no ready worker")
    );
}

async fn a_batch_larger_than_one_statement_writes_every_instance(engine: TestEngine) {
    // 501 instances: two statements of one transaction, for the reasons and the placements
    // (the placements under the leader's fence).
    let db = TestDatabase::new(engine).await;
    let store = db.open().await;
    let model = store
        .create_model(&common::tiny_model("m", 501))
        .await
        .unwrap();
    let numbers: Vec<u32> = (0..501).collect();
    let instances = store
        .create_instances(&model, &numbers, &UNFENCED)
        .await
        .unwrap();
    assert_eq!(instances.len(), 501);
    let worker_id = common::stored_worker(&store, "w1", "digest-w1").await.id;
    let record = record(&model);

    let reasons: Vec<PendingReason<'_>> = instances
        .iter()
        .map(|instance| PendingReason {
            instance_id: instance.id,
            message: "no ready worker",
        })
        .collect();
    let written = store
        .set_pending_reasons(&reasons, &UNFENCED)
        .await
        .unwrap();
    assert_eq!(written.len(), 501);
    assert!(written.iter().zip(&instances).all(|(w, i)| w
        .as_ref()
        .map(|w| (w.id, w.state_message.as_str()))
        == Some((i.id, "no ready worker"))));

    let placements: Vec<NewPlacement<'_>> = instances
        .iter()
        .map(|instance| placement(instance, &model, worker_id, &record))
        .collect();
    // A stale fence stops the transaction of two statements at its first.
    let refused = store
        .record_placements(&placements, &Fence::Leader(1))
        .await;
    assert!(
        matches!(refused, Err(StoreError::Fenced { .. })),
        "{refused:?}"
    );
    assert!(store.placed_instance_claims().await.unwrap().is_empty());
    let written = store
        .record_placements(&placements, &Fence::Leader(0))
        .await
        .unwrap();
    assert_eq!(written.len(), 501);
    assert!(written.iter().zip(&instances).all(
        |(w, i)| w.as_ref().map(|w| (w.id, w.state)) == Some((i.id, InstanceState::Scheduled))
    ));
    assert_eq!(store.placed_instance_claims().await.unwrap().len(), 501);
}

test_both_engines!(
    placements_apply_only_to_unplaced_instances_of_the_same_model_version,
    pending_reasons_are_written_only_when_they_change,
    unplacing_applies_only_to_the_lost_state_on_the_same_worker,
    a_batch_of_placements_writes_those_that_still_apply_and_publishes_only_them,
    a_stale_fence_writes_nothing_of_a_batch,
    a_batch_larger_than_one_statement_writes_every_instance,
);
