//! The store knows, without asking, whether its PostgreSQL server can be reached: a
//! server stopped is found unreachable within a probe or two, queries then fail as
//! unavailable, and the store recovers by itself when the server is back.

use std::time::{Duration, Instant};

use gantry_store::{Store, StoreConfig};
use gantry_testkit::postgres::OwnPostgres;

async fn until(what: &str, within: Duration, check: impl Fn() -> bool) -> Duration {
    let began = Instant::now();
    while !check() {
        assert!(began.elapsed() < within, "{what} within {within:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    began.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_server_is_known_unreachable_and_the_store_recovers_when_it_is_back() {
    let mut postgres = tokio::task::block_in_place(OwnPostgres::start);
    let store = Store::open(&StoreConfig {
        url: postgres.url(),
        max_connections: 4,
    })
    .await
    .unwrap();
    store.ping().await.unwrap();
    assert_eq!(store.unreachable(), None);

    tokio::task::block_in_place(|| postgres.stop());
    let noticed = until("unreachable", Duration::from_secs(5), || {
        store.unreachable().is_some()
    })
    .await;
    let why = store.unreachable().unwrap();
    println!("stopped server found unreachable after {noticed:?}: {why}");
    let error = store.ping().await.unwrap_err();
    assert!(error.is_unavailable(), "{error}");

    tokio::task::block_in_place(|| postgres.start_again());
    let back = until("reachable", Duration::from_secs(5), || {
        store.unreachable().is_none()
    })
    .await;
    println!("restarted server found reachable after {back:?}");
    store.ping().await.unwrap();
    assert!(store.migrations_done().await.unwrap());
}
