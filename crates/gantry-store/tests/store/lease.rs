//! The leader lease and fencing on a real PostgreSQL: who may take the lease, and that a
//! write carrying a replaced leader's token never lands.

use std::time::Duration;

use gantry_store::{Fence, NewPlacement, StoreError};
use gantry_testkit::{TestDatabase, TestEngine};
use sqlx::Connection;

use crate::model_create;

const TTL: Duration = Duration::from_secs(30);

#[tokio::test]
async fn the_lease_changes_hands_only_when_free_lapsed_or_its_holder_is_gone() {
    let db = TestDatabase::new(TestEngine::Postgres).await;
    let store = db.open().await;
    let mut a = store.leader_session().await.unwrap();
    let mut b = store.leader_session().await.unwrap();

    // Free: the first taker gets token 1 and the advisory lock.
    assert!(a.try_lock().await.unwrap());
    let first = a
        .acquire("a", TTL, true)
        .await
        .unwrap()
        .expect("a free lease");
    assert_eq!(first, 1);
    // Held, unexpired, its holder alive (b cannot get the lock): refused.
    assert!(!b.try_lock().await.unwrap());
    assert_eq!(b.acquire("b", TTL, false).await.unwrap(), None);
    assert!(a.renew("a", first, TTL, true).await.unwrap());
    assert!(!b.renew("b", first, TTL, false).await.unwrap(), "not b's");

    // The holder's session dies (kill -9): the lock comes free and b takes over at once,
    // long before the TTL.
    a.close().await;
    let second = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            if b.try_lock().await.unwrap() {
                if let Some(token) = b.acquire("b", TTL, true).await.unwrap() {
                    return token;
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("b takes over within 5 s of a's session closing");
    assert_eq!(second, first + 1);
    let lease = store.leader_lease().await.unwrap();
    assert_eq!(lease.server_id.as_deref(), Some("b"));
    assert_eq!(lease.fencing_token, second);

    // A holder that is alive but silent (paused): a standby waits for the lease to lapse.
    let mut c = store.leader_session().await.unwrap();
    assert!(!c.try_lock().await.unwrap(), "b holds the lock");
    assert_eq!(c.acquire("c", TTL, false).await.unwrap(), None);
    assert!(b
        .renew("b", second, Duration::from_millis(200), true)
        .await
        .unwrap());
    tokio::time::sleep(Duration::from_millis(400)).await;
    let third = c
        .acquire("c", TTL, false)
        .await
        .unwrap()
        .expect("a lapsed lease");
    assert_eq!(third, second + 1);
    // b wakes up: its renewal fails.
    assert!(!b.renew("b", second, TTL, true).await.unwrap());
    // Releasing keeps the token; the next taker bumps it.
    assert!(c.release("c", third).await.unwrap());
    assert!(!c.release("c", third).await.unwrap(), "released once");
    b.unlock().await.unwrap();
    assert!(c.try_lock().await.unwrap());
    assert_eq!(c.acquire("c", TTL, true).await.unwrap(), Some(third + 1));
}

#[tokio::test]
async fn a_replaced_leaders_writes_are_refused() {
    let db = TestDatabase::new(TestEngine::Postgres).await;
    let store = db.open().await;
    let mut a = store.leader_session().await.unwrap();
    let old = a
        .acquire("a", Duration::from_millis(100), false)
        .await
        .unwrap()
        .unwrap();
    let model = store.create_model(&model_create("m", 1)).await.unwrap();
    let created = store
        .create_instances(&model, &[0], &Fence::Leader(old))
        .await
        .unwrap();
    assert_eq!(created.len(), 1, "the current leader writes");
    let before = gantry_store::fenced_writes();

    // b takes over once a's lease lapses; a wakes up and writes with its old token.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut b = store.leader_session().await.unwrap();
    let new = b.acquire("b", TTL, false).await.unwrap().unwrap();
    assert_eq!(new, old + 1);
    let stale = Fence::Leader(old);
    let refused = store.create_instances(&model, &[1], &stale).await;
    assert!(
        matches!(refused, Err(StoreError::Fenced { .. })),
        "{refused:?}"
    );
    let refused = store
        .delete_instance_if_unchanged(&created[0], &stale)
        .await;
    assert!(matches!(refused, Err(StoreError::Fenced { .. })));
    let refused = store
        .mark_silent_workers(
            gantry_types::Timestamp::now(),
            gantry_types::Timestamp::now(),
            &stale,
        )
        .await;
    assert!(matches!(refused, Err(StoreError::Fenced { .. })));
    let after = gantry_store::fenced_writes();
    assert_eq!(after.applied, before.applied, "no stale write landed");
    assert_eq!(after.rejected, before.rejected + 3);
    assert!(
        after.last_applied_started_at
            <= store.leader_lease().await.unwrap().acquired_at.as_millis()
    );

    // Nothing changed: one instance, as the old leader left it.
    let (instances, _) = store
        .list_instances(
            &gantry_store::InstanceFilter::default(),
            gantry_store::Page {
                page: 1,
                per_page: 10,
            },
        )
        .await
        .unwrap();
    assert_eq!(instances.len(), 1);
    assert_eq!(instances[0].id, created[0].id);

    // The new leader's token works; a write whose row moved on is `None`, not Fenced.
    let current = Fence::Leader(new);
    assert!(store
        .delete_instance_if_unchanged(&created[0], &current)
        .await
        .unwrap()
        .is_some());
    assert!(store
        .delete_instance_if_unchanged(&created[0], &current)
        .await
        .unwrap()
        .is_none());
}

#[tokio::test]
async fn a_fenced_write_waits_for_a_takeover_in_progress_and_then_fails() {
    // A take-over holds the lease row while its transaction is open; a write carrying the
    // old token that comes meanwhile waits (FOR SHARE), then sees the new token.
    let db = TestDatabase::new(TestEngine::Postgres).await;
    let store = db.open().await;
    let mut a = store.leader_session().await.unwrap();
    let old = a.acquire("a", TTL, false).await.unwrap().unwrap();
    let model = store.create_model(&model_create("m", 1)).await.unwrap();

    let mut takeover = takeover_in_progress(&db.url).await;
    let writer = {
        let store = store.clone();
        let model = model.clone();
        tokio::spawn(async move {
            store
                .create_instances(&model, &[0], &Fence::Leader(old))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!writer.is_finished(), "the write waits for the take-over");
    sqlx::query("COMMIT").execute(&mut takeover).await.unwrap();
    let outcome = writer.await.unwrap();
    assert!(
        matches!(outcome, Err(StoreError::Fenced { .. })),
        "{outcome:?}"
    );
}

/// A connection in the middle of a take-over by "b": the lease's token moved on, not yet
/// committed (send `COMMIT` on it to finish).
async fn takeover_in_progress(url: &str) -> sqlx::PgConnection {
    let mut raw = sqlx::PgConnection::connect(url).await.unwrap();
    sqlx::query("BEGIN").execute(&mut raw).await.unwrap();
    sqlx::query(
        "UPDATE leader_lease SET fencing_token = fencing_token + 1, holder = 'b' WHERE id = 1",
    )
    .execute(&mut raw)
    .await
    .unwrap();
    raw
}

#[tokio::test]
async fn a_batch_of_placements_from_a_replaced_leader_waits_for_the_takeover_and_writes_nothing() {
    // The batch checks the fence once, first in its transaction: it waits for a take-over
    // in progress (FOR SHARE), then fails whole; none of its placements lands.
    let db = TestDatabase::new(TestEngine::Postgres).await;
    let store = db.open().await;
    let mut a = store.leader_session().await.unwrap();
    let old = a.acquire("a", TTL, false).await.unwrap().unwrap();
    let model = store.create_model(&model_create("m", 1)).await.unwrap();
    let created = store
        .create_instances(&model, &[0, 1], &Fence::Leader(old))
        .await
        .unwrap();
    let worker = store
        .create_worker(
            "w1",
            &std::collections::BTreeMap::new(),
            "127.0.0.1:1",
            &gantry_types::fixtures::worker_status("w1", 2),
            "cred",
        )
        .await
        .unwrap();
    let record = gantry_types::PlacementRecord::by_hand(&model);

    let mut takeover = takeover_in_progress(&db.url).await;
    let writer = {
        let store = store.clone();
        let ids: Vec<i64> = created.iter().map(|i| i.id).collect();
        let model_updated_at = model.updated_at;
        tokio::spawn(async move {
            let placements: Vec<NewPlacement<'_>> = ids
                .iter()
                .map(|&instance_id| NewPlacement {
                    instance_id,
                    model_updated_at,
                    worker_id: worker.id,
                    gpu_indexes: &[0],
                    state_message: "scheduled on w1",
                    record: &record,
                })
                .collect();
            store
                .record_placements(&placements, &Fence::Leader(old))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!writer.is_finished(), "the batch waits for the take-over");
    sqlx::query("COMMIT").execute(&mut takeover).await.unwrap();
    let outcome = writer.await.unwrap();
    assert!(
        matches!(outcome, Err(StoreError::Fenced { .. })),
        "{outcome:?}"
    );
    for instance in &created {
        let now = store.get_instance(instance.id).await.unwrap();
        assert_eq!(now.worker_id, None, "nothing placed");
        assert_eq!(now.updated_at, instance.updated_at);
    }
}
