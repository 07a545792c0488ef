//! On PostgreSQL the store vacuums the instance table soon after a burst of writes, so
//! that the lists' index-only scans do not visit dead rows until autovacuum comes by.

use std::time::Duration;

use gantry_store::Fence;
use gantry_testkit::{TestDatabase, TestEngine};
use sqlx::{Connection, Row};

use crate::model_create;

const INSTANCES: u32 = 300;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_instance_writes_is_vacuumed_within_seconds() {
    let db = TestDatabase::new(TestEngine::Postgres).await;
    let store = db.open().await;
    let outside = sqlx::PgPool::connect(&db.url).await.unwrap();
    // Only the store's vacuum may set `last_vacuum` (autovacuum sets `last_autovacuum`
    // and, vacuuming first, would leave the store nothing to do).
    sqlx::query("ALTER TABLE model_instances SET (autovacuum_enabled = false)")
        .execute(&outside)
        .await
        .unwrap();
    let model = store
        .create_model(&model_create("burst", INSTANCES))
        .await
        .unwrap();
    let numbers: Vec<u32> = (0..INSTANCES).collect();
    store
        .create_instances(&model, &numbers, &Fence::Unfenced)
        .await
        .unwrap();
    // Every row rewritten five times (as a deploy's reports would, here from outside
    // the store): 1,500 dead rows beside 300 live ones. A snapshot held meanwhile keeps
    // PostgreSQL from pruning the old versions as it goes (which it does on a page it
    // finds nearly full, and which left fewer than 1,000 in a busy test run).
    let mut holder = sqlx::PgConnection::connect(&db.url).await.unwrap();
    sqlx::query("BEGIN ISOLATION LEVEL REPEATABLE READ")
        .execute(&mut holder)
        .await
        .unwrap();
    sqlx::query("SELECT COUNT(*) FROM model_instances")
        .execute(&mut holder)
        .await
        .unwrap();
    for _ in 0..5 {
        sqlx::query("UPDATE model_instances SET restart_count = restart_count + 1")
            .execute(&outside)
            .await
            .unwrap();
    }
    sqlx::query("COMMIT").execute(&mut holder).await.unwrap();
    holder.close().await.unwrap();
    // A session that ends sends its statistics at once.
    outside.close().await;

    let stats = sqlx::PgPool::connect(&db.url).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let row = sqlx::query(
            "SELECT last_vacuum IS NOT NULL AS vacuumed, n_dead_tup AS dead \
             FROM pg_stat_user_tables WHERE relname = 'model_instances'",
        )
        .fetch_one(&stats)
        .await
        .unwrap();
        let (vacuumed, dead): (bool, i64) = (row.get("vacuumed"), row.get("dead"));
        if vacuumed && dead < 1_000 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "model_instances not vacuumed within 20 s ({dead} dead rows)"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stats.close().await;
    store.close().await;
}
