//! Two servers on one PostgreSQL see each other's changes.

use std::sync::Arc;
use std::time::Duration;

use gantry_store::{Change, ChangeKind, Fence};
use gantry_testkit::{TestDatabase, TestEngine};
use gantry_types::ModelUpdate;
use tokio::sync::broadcast;

use crate::model_create;

async fn next(changes: &mut broadcast::Receiver<Arc<Change>>) -> Arc<Change> {
    tokio::time::timeout(Duration::from_secs(10), changes.recv())
        .await
        .expect("a change within 10 s")
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_made_through_one_store_reach_the_other() {
    let db = TestDatabase::new(TestEngine::Postgres).await;
    let a = db.open().await;
    let b = db.open().await;
    let mut seen_by_b = b.subscribe();
    let mut seen_by_a = a.subscribe();

    let created = a.create_model(&model_create("tiny", 1)).await.unwrap();
    a.create_instances(&created, &[0], &Fence::Unfenced)
        .await
        .unwrap();
    match &*next(&mut seen_by_b).await {
        Change::Model(ChangeKind::Created, m) => assert_eq!(m.id, created.id),
        other => panic!("unexpected {other:?}"),
    }
    match &*next(&mut seen_by_b).await {
        Change::Instance(ChangeKind::Created, i) => assert_eq!(i.model_id, created.id),
        other => panic!("unexpected {other:?}"),
    }

    // A change too large for a notification payload is re-read by the receiver.
    let mut big = created.clone();
    big.apply(ModelUpdate {
        backend_args: Some(vec!["x".repeat(4000), "y".repeat(4000)]),
        ..Default::default()
    });
    a.update_model(&big).await.unwrap();
    match &*next(&mut seen_by_b).await {
        Change::Model(ChangeKind::Updated, m) => assert_eq!(m.backend_args[1].len(), 4000),
        other => panic!("unexpected {other:?}"),
    }

    a.delete_model(created.id).await.unwrap();
    let mut kinds = Vec::new();
    for _ in 0..2 {
        kinds.push(match &*next(&mut seen_by_b).await {
            Change::Instance(kind, _) => format!("instance {kind:?}"),
            Change::Model(kind, _) => format!("model {kind:?}"),
            other => panic!("unexpected {other:?}"),
        });
    }
    assert_eq!(kinds, ["instance Deleted", "model Deleted"]);

    // A sees each of its own changes once: no echo from the database.
    let mut own = 0;
    while let Ok(Ok(_)) = tokio::time::timeout(Duration::from_millis(500), seen_by_a.recv()).await {
        own += 1;
    }
    assert_eq!(
        own, 5,
        "model created, instance created, model updated, instance and model deleted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_changes_reaches_the_other_store_whole_and_in_order() {
    let db = TestDatabase::new(TestEngine::Postgres).await;
    let a = db.open().await;
    let b = db.open().await;
    let mut seen_by_b = b.subscribe();

    // 300 instances in one write: 300 changes queued at once, sent in batches.
    let created = a.create_model(&model_create("burst", 1)).await.unwrap();
    let replicas: Vec<u32> = (0..300).collect();
    let instances = a
        .create_instances(&created, &replicas, &Fence::Unfenced)
        .await
        .unwrap();
    match &*next(&mut seen_by_b).await {
        Change::Model(ChangeKind::Created, m) => assert_eq!(m.id, created.id),
        other => panic!("unexpected {other:?}"),
    }
    let mut received = Vec::new();
    for _ in 0..instances.len() {
        match &*next(&mut seen_by_b).await {
            Change::Instance(ChangeKind::Created, i) => received.push(i.id),
            other => panic!("unexpected {other:?}"),
        }
    }
    let sent: Vec<i64> = instances.iter().map(|i| i.id).collect();
    assert_eq!(received, sent, "every change, in the order it was made");
}
