//! A heartbeat against the health controller marking its worker silent, on a real
//! PostgreSQL: neither may act on what the other is about to commit.

use std::collections::BTreeMap;
use std::time::Duration;

use gantry_store::{Fence, Store};
use gantry_testkit::{TestDatabase, TestEngine};
use gantry_types::fixtures::worker_status;
use gantry_types::{Timestamp, Worker, WorkerState};
use sqlx::Connection;

/// A database with one worker, `ready` and heard from.
async fn ready_worker() -> (TestDatabase, Store, Worker) {
    let db = TestDatabase::new(TestEngine::Postgres).await;
    let store = db.open().await;
    let worker = store
        .create_worker("w1", &BTreeMap::new(), "a:1", &worker_status("w1", 1), "c1")
        .await
        .unwrap();
    assert!(store
        .record_heartbeat_of_ready(worker.id)
        .await
        .unwrap()
        .is_some());
    (db, store, worker)
}

/// A heartbeat that arrives while a marking of its worker is under way waits for it, and
/// then sees the worker no longer `ready` (so the caller sets it `ready` again): it does
/// not write a fresh heartbeat beside a `not_ready` that commits after it.
#[tokio::test]
async fn a_heartbeat_waits_for_a_marking_under_way_and_sees_it() {
    let (db, store, worker) = ready_worker().await;

    // What `mark_silent_workers` does first: lock the row of the worker it will mark.
    let mut marking = sqlx::PgConnection::connect(&db.url).await.unwrap();
    sqlx::query("BEGIN").execute(&mut marking).await.unwrap();
    sqlx::query("SELECT id FROM workers WHERE id = $1 FOR UPDATE")
        .bind(worker.id)
        .fetch_all(&mut marking)
        .await
        .unwrap();

    let heartbeat = tokio::spawn({
        let store = store.clone();
        async move { store.record_heartbeat_of_ready(worker.id).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !heartbeat.is_finished(),
        "the heartbeat waits for the marking"
    );

    sqlx::query("UPDATE workers SET state = 'not_ready', state_message = 'missed 3 heartbeats' WHERE id = $1")
        .bind(worker.id)
        .execute(&mut marking)
        .await
        .unwrap();
    sqlx::query("COMMIT").execute(&mut marking).await.unwrap();

    let written = heartbeat.await.unwrap().unwrap();
    assert!(
        written.is_none(),
        "the heartbeat saw the worker as it was before the marking: {written:?}"
    );
}

/// The marking reads the heartbeats after locking the workers' rows: a heartbeat that
/// committed meanwhile keeps its worker `ready`.
#[tokio::test]
async fn a_marking_does_not_mark_a_worker_whose_heartbeat_landed_first() {
    let (db, store, worker) = ready_worker().await;
    // A heartbeat in progress: its share lock on the worker's row is held.
    let mut beating = sqlx::PgConnection::connect(&db.url).await.unwrap();
    sqlx::query("BEGIN").execute(&mut beating).await.unwrap();
    sqlx::query("SELECT 1 AS ok FROM workers WHERE id = $1 AND state = 'ready' FOR KEY SHARE")
        .bind(worker.id)
        .fetch_all(&mut beating)
        .await
        .unwrap();

    // Everything heard before now is silent to this marking.
    let future = Timestamp::from_millis(Timestamp::now().as_millis() + 60_000);
    let marking = tokio::spawn({
        let store = store.clone();
        async move {
            store
                .mark_silent_workers(future, Timestamp::from_millis(0), &Fence::Unfenced)
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !marking.is_finished(),
        "the marking waits for the heartbeat"
    );
    // The heartbeat lands (later than the marking's cut-off) and commits.
    sqlx::query("UPDATE worker_heartbeats SET at = $2 WHERE worker_id = $1")
        .bind(worker.id)
        .bind(future.as_millis() + 1)
        .execute(&mut beating)
        .await
        .unwrap();
    sqlx::query("COMMIT").execute(&mut beating).await.unwrap();

    let marked = marking.await.unwrap().unwrap();
    assert!(marked.is_empty(), "marked although heard from: {marked:?}");
    let now = store.get_worker(worker.id).await.unwrap();
    assert_eq!(now.state, WorkerState::Ready);
}
