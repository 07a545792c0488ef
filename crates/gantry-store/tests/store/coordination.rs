//! The coordination tables on both engines: distributed locks (`locks.rs`) and the server
//! registry (`servers.rs`). Every time is the caller's clock, so expiry is tested by
//! passing a later `now`, never by sleeping.

use std::time::Duration;

use gantry_store::{
    Engine, LockRelease, RegistryConflict, ServerRecord, ServerRegistration, Store,
};
use gantry_testkit::{test_both_engines, TestDatabase, TestEngine};
use gantry_types::{LockInfo, ServerLoad, ServerRole, Timestamp};

/// An arbitrary fixed clock reading the tests count from.
const T0: i64 = 1_700_000_000_000;

fn at(offset_ms: i64) -> Timestamp {
    Timestamp::from_millis(T0 + offset_ms)
}

const TEN_SECONDS: Duration = Duration::from_secs(10);

/// Takes `name` for `owner`, expecting it to be free (or lapsed, or `owner`'s own).
async fn acquire(store: &Store, name: &str, owner: &str, now: Timestamp) -> LockInfo {
    store
        .acquire_lock(name, owner, TEN_SECONDS, now)
        .await
        .unwrap()
        .unwrap_or_else(|holder| panic!("{owner} could not take {name:?}: held by {holder:?}"))
}

/// Tries to take `name` for `owner`, expecting another owner to hold it; returns the holder.
async fn refused(store: &Store, name: &str, owner: &str, now: Timestamp) -> LockInfo {
    match store
        .acquire_lock(name, owner, TEN_SECONDS, now)
        .await
        .unwrap()
    {
        Ok(lock) => panic!("{owner} took {name:?}, which should be held: {lock:?}"),
        Err(holder) => holder,
    }
}

/// `(name, owner, token)` of every lock held at `now`.
async fn held(store: &Store, now: Timestamp) -> Vec<(String, String, u64)> {
    store
        .held_locks(now)
        .await
        .unwrap()
        .into_iter()
        .map(|lock| (lock.name, lock.owner, lock.token))
        .collect()
}

fn entry(name: &str, owner: &str, token: u64) -> (String, String, u64) {
    (name.to_string(), owner.to_string(), token)
}

async fn a_lock_is_held_by_one_owner_and_renewed_only_by_it(engine: TestEngine) {
    let db = TestDatabase::new(engine).await;
    let store = db.open().await;

    let first = acquire(&store, "deploy", "alice", at(0)).await;
    assert_eq!(
        first,
        LockInfo {
            name: "deploy".into(),
            owner: "alice".into(),
            token: 1,
            acquired_at: at(0),
            expires_at: at(10_000),
        }
    );

    // Another owner is refused and told who holds it, and the refusal changes nothing.
    let holder = refused(&store, "deploy", "bob", at(1)).await;
    assert_eq!(holder, first);
    assert_eq!(held(&store, at(2)).await, vec![entry("deploy", "alice", 1)]);

    // The owner taking it again renews it: a later expiry and a larger token.
    let renewed = acquire(&store, "deploy", "alice", at(5_000)).await;
    assert_eq!(renewed.token, 2);
    assert_eq!(renewed.acquired_at, at(5_000));
    assert_eq!(renewed.expires_at, at(15_000));
    // Still held past the first expiry, because it was renewed.
    assert_eq!(
        refused(&store, "deploy", "bob", at(14_999)).await.owner,
        "alice"
    );
    assert_eq!(
        held(&store, at(14_999)).await,
        vec![entry("deploy", "alice", 2)]
    );

    // Names are independent: another name starts at token 1.
    let other = acquire(&store, "backup", "bob", at(6_000)).await;
    assert_eq!(other.token, 1);
    // Listed by name.
    assert_eq!(
        held(&store, at(6_001)).await,
        vec![entry("backup", "bob", 1), entry("deploy", "alice", 2)]
    );
}

async fn a_lapsed_lock_is_taken_over_with_a_larger_token(engine: TestEngine) {
    let db = TestDatabase::new(engine).await;
    let store = db.open().await;
    let alice = acquire(&store, "deploy", "alice", at(0)).await;

    // At its expiry the lock is no longer held, and another owner takes it.
    assert_eq!(held(&store, at(9_999)).await.len(), 1);
    assert_eq!(held(&store, alice.expires_at).await, vec![]);
    let bob = acquire(&store, "deploy", "bob", alice.expires_at).await;
    assert_eq!(bob.owner, "bob");
    assert!(bob.token > alice.token, "{bob:?} after {alice:?}");
    assert_eq!(bob.expires_at, alice.expires_at.plus(TEN_SECONDS));

    // The previous owner is now refused, and may not release the new owner's lock.
    assert_eq!(
        refused(&store, "deploy", "alice", at(10_001)).await.owner,
        "bob"
    );
    assert_eq!(
        store
            .release_lock("deploy", "alice", at(10_001))
            .await
            .unwrap(),
        LockRelease::NotOwner {
            owner: "bob".into()
        }
    );
    assert_eq!(
        held(&store, at(10_002)).await,
        vec![entry("deploy", "bob", bob.token)]
    );
}

async fn only_the_owner_releases_and_tokens_grow_across_releases(engine: TestEngine) {
    let db = TestDatabase::new(engine).await;
    let store = db.open().await;
    assert_eq!(
        store
            .release_lock("never-taken", "alice", at(0))
            .await
            .unwrap(),
        LockRelease::NotHeld
    );

    let first = acquire(&store, "deploy", "alice", at(0)).await;
    assert_eq!(
        store.release_lock("deploy", "bob", at(1)).await.unwrap(),
        LockRelease::NotOwner {
            owner: "alice".into()
        }
    );
    assert_eq!(
        held(&store, at(1)).await,
        vec![entry("deploy", "alice", first.token)]
    );

    assert_eq!(
        store.release_lock("deploy", "alice", at(1)).await.unwrap(),
        LockRelease::Released
    );
    assert_eq!(held(&store, at(2)).await, vec![]);
    // A second release finds nothing held, for the owner and for anyone else.
    assert_eq!(
        store.release_lock("deploy", "alice", at(2)).await.unwrap(),
        LockRelease::NotHeld
    );
    assert_eq!(
        store.release_lock("deploy", "bob", at(2)).await.unwrap(),
        LockRelease::NotHeld
    );

    // Free again before its expiry, and the next acquisition's token is larger than any
    // before, whoever takes it: a write fenced by the old token stays refused.
    let second = acquire(&store, "deploy", "bob", at(3)).await;
    assert_eq!(second.token, first.token + 1);
    store.release_lock("deploy", "bob", at(3)).await.unwrap();
    let third = acquire(&store, "deploy", "alice", at(4)).await;
    assert_eq!(third.token, second.token + 1);

    // Once lapsed, a lock is held by no one: its release is "not held", for the owner
    // whose name it still carries too, and another may take it.
    let lapsed = at(4).plus(TEN_SECONDS);
    assert_eq!(held(&store, lapsed).await, vec![]);
    for who in ["alice", "bob"] {
        assert_eq!(
            store.release_lock("deploy", who, lapsed).await.unwrap(),
            LockRelease::NotHeld,
            "{who}"
        );
    }
    let fourth = acquire(&store, "deploy", "bob", lapsed).await;
    assert_eq!(fourth.token, third.token + 1);
}

async fn release_locks_of_frees_every_lock_of_one_owner(engine: TestEngine) {
    let db = TestDatabase::new(engine).await;
    let store = db.open().await;
    acquire(&store, "a", "server-1", at(0)).await;
    acquire(&store, "b", "server-1", at(0)).await;
    acquire(&store, "c", "server-2", at(0)).await;

    assert_eq!(store.release_locks_of("server-1").await.unwrap(), 2);
    assert_eq!(held(&store, at(1)).await, vec![entry("c", "server-2", 1)]);
    // Nothing left to release; the other owner's lock is untouched.
    assert_eq!(store.release_locks_of("server-1").await.unwrap(), 0);
    assert_eq!(store.release_locks_of("nobody").await.unwrap(), 0);
    assert_eq!(
        store.release_lock("a", "server-1", at(1)).await.unwrap(),
        LockRelease::NotHeld
    );
    // The freed names are free for others, with grown tokens.
    assert_eq!(acquire(&store, "a", "server-2", at(2)).await.token, 2);
}

fn registration<'a>(
    server_id: &'a str,
    url: &'a str,
    incarnation: &'a str,
) -> ServerRegistration<'a> {
    ServerRegistration {
        server_id,
        url,
        version: "1.2.3",
        incarnation,
        session_pid: None,
    }
}

/// The registry's liveness window in these tests: a row is live while its last heartbeat
/// is less than a minute old.
const WINDOW_MS: i64 = 60_000;

async fn register(
    store: &Store,
    registration: &ServerRegistration<'_>,
    now: Timestamp,
) -> Result<ServerRecord, RegistryConflict> {
    store
        .register_server(
            registration,
            now,
            Timestamp::from_millis(now.as_millis() - WINDOW_MS),
        )
        .await
        .unwrap()
}

async fn a_server_id_is_refused_to_a_second_process_while_the_first_is_live(engine: TestEngine) {
    let db = TestDatabase::new(engine).await;
    let store = db.open().await;

    let first = register(
        &store,
        &registration("s1", "http://10.0.0.1:80", "first"),
        at(0),
    )
    .await
    .unwrap();
    assert_eq!(
        first,
        ServerRecord {
            server_id: "s1".into(),
            url: "http://10.0.0.1:80".into(),
            version: "1.2.3".into(),
            role: ServerRole::Standby,
            started_at: at(0),
            last_heartbeat_at: at(0),
            load: ServerLoad::default(),
            incarnation: "first".into(),
        }
    );

    // Another process with the same id, while the first heartbeats: refused, and told
    // which one holds the id. The stored row is the first's still.
    let Err(RegistryConflict::Duplicate(holder)) = register(
        &store,
        &registration("s1", "http://10.0.0.2:80", "second"),
        at(1_000),
    )
    .await
    else {
        panic!("a second process took a live server's id");
    };
    assert_eq!(holder, first);
    store
        .server_heartbeat(
            "s1",
            Some("first"),
            None,
            ServerLoad::default(),
            None,
            at(30_000),
        )
        .await
        .unwrap()
        .unwrap();
    assert!(
        register(
            &store,
            &registration("s1", "http://10.0.0.2:80", "second"),
            at(60_000)
        )
        .await
        .is_err(),
        "the heartbeat at +30 s keeps the first live until +90 s"
    );

    // The same process registering again (a restart of its registry task) replaces its
    // own row.
    let again = register(
        &store,
        &registration("s1", "http://10.0.0.1:81", "first"),
        at(61_000),
    )
    .await
    .unwrap();
    assert_eq!(again.url, "http://10.0.0.1:81");
    assert_eq!(again.started_at, at(61_000));

    // Once its heartbeat is older than the window, another process takes the id over.
    let takeover_at = Timestamp::from_millis(again.last_heartbeat_at.as_millis() + WINDOW_MS);
    let just_before = Timestamp::from_millis(takeover_at.as_millis() - 1);
    assert!(
        register(
            &store,
            &registration("s1", "http://10.0.0.2:80", "second"),
            just_before
        )
        .await
        .is_err(),
        "taken over before the window passed"
    );
    let second = register(
        &store,
        &registration("s1", "http://10.0.0.2:80", "second"),
        takeover_at,
    )
    .await
    .unwrap();
    assert_eq!(second.incarnation, "second");
    assert_eq!(second.url, "http://10.0.0.2:80");
    assert_eq!(second.last_heartbeat_at, takeover_at);
    assert_eq!(store.list_servers().await.unwrap(), vec![second]);
}

async fn on_postgres_a_server_whose_session_is_gone_does_not_hold_its_id(engine: TestEngine) {
    let db = TestDatabase::new(engine).await;
    let store = db.open().await;
    if store.engine() != Engine::Postgres {
        // SQLite has no sessions: a row is live by its heartbeat alone.
        assert_eq!(engine, TestEngine::Sqlite);
        let mut with_pid = registration("s1", "http://10.0.0.1:80", "first");
        with_pid.session_pid = Some(2_000_000_000);
        register(&store, &with_pid, at(0)).await.unwrap();
        let second = register(
            &store,
            &registration("s1", "http://10.0.0.2:80", "second"),
            at(1),
        )
        .await;
        assert!(second.is_err(), "{second:?}");
        return;
    }

    // A live session (the leader session of a running server) keeps the id.
    let mut session = store.leader_session().await.unwrap();
    let live_pid = session.backend_pid().await.unwrap();
    let mut live = registration("s1", "http://10.0.0.1:80", "first");
    live.session_pid = Some(live_pid);
    register(&store, &live, at(0)).await.unwrap();
    let refused = register(
        &store,
        &registration("s1", "http://10.0.0.2:80", "second"),
        at(1),
    )
    .await;
    assert!(refused.is_err(), "{refused:?}");

    // A session no backend has (Linux pids stay far below two billion): the process was
    // killed, so its id is free at once, heartbeat or not.
    let mut dead = registration("s2", "http://10.0.0.3:80", "first");
    dead.session_pid = Some(2_000_000_000);
    register(&store, &dead, at(0)).await.unwrap();
    let taken = register(
        &store,
        &registration("s2", "http://10.0.0.4:80", "second"),
        at(1),
    )
    .await
    .unwrap();
    assert_eq!(taken.incarnation, "second");
    drop(session);
}

async fn heartbeats_refresh_only_the_registered_incarnation(engine: TestEngine) {
    let db = TestDatabase::new(engine).await;
    let store = db.open().await;
    let registered = register(
        &store,
        &registration("s1", "http://10.0.0.1:80", "mine"),
        at(0),
    )
    .await
    .unwrap();
    let load = ServerLoad {
        inflight_requests: 7,
        connected_workers: 3,
    };

    // Another incarnation's heartbeat finds no row of its own and changes nothing.
    assert_eq!(
        store
            .server_heartbeat(
                "s1",
                Some("not-mine"),
                Some(ServerRole::Leader),
                load,
                None,
                at(5_000)
            )
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        store.list_servers().await.unwrap(),
        vec![registered.clone()]
    );
    // Nor does a heartbeat of an id nobody registered.
    assert_eq!(
        store
            .server_heartbeat("ghost", None, None, load, None, at(5_000))
            .await
            .unwrap(),
        None
    );

    let beat = store
        .server_heartbeat(
            "s1",
            Some("mine"),
            Some(ServerRole::Leader),
            load,
            Some(42),
            at(5_000),
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        beat,
        ServerRecord {
            role: ServerRole::Leader,
            last_heartbeat_at: at(5_000),
            load,
            ..registered.clone()
        }
    );

    // Without an incarnation (the API's heartbeat) any row of the id is refreshed; without
    // a role the role stays.
    let idle = ServerLoad::default();
    let beat = store
        .server_heartbeat("s1", None, None, idle, None, at(6_000))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(beat.role, ServerRole::Leader);
    assert_eq!(beat.load, idle);
    assert_eq!(beat.last_heartbeat_at, at(6_000));
    assert_eq!(beat.started_at, at(0));
}

async fn servers_are_listed_by_id_and_unregistered_by_incarnation(engine: TestEngine) {
    let db = TestDatabase::new(engine).await;
    let store = db.open().await;
    for (id, incarnation) in [("s3", "c"), ("s1", "a"), ("s2", "b")] {
        register(
            &store,
            &registration(id, "http://10.0.0.1:80", incarnation),
            at(0),
        )
        .await
        .unwrap();
    }
    let ids = |servers: Vec<ServerRecord>| -> Vec<String> {
        servers.into_iter().map(|s| s.server_id).collect()
    };
    assert_eq!(ids(store.list_servers().await.unwrap()), ["s1", "s2", "s3"]);

    // Another incarnation may not remove a row (a restarted server's shutdown must not
    // remove its successor's).
    assert!(!store.unregister_server("s2", Some("a")).await.unwrap());
    assert!(store.unregister_server("s2", Some("b")).await.unwrap());
    assert!(!store.unregister_server("s2", Some("b")).await.unwrap());
    // Without an incarnation (an admin), any row of the id.
    assert!(store.unregister_server("s3", None).await.unwrap());
    assert!(!store.unregister_server("s3", None).await.unwrap());
    assert!(!store.unregister_server("never", None).await.unwrap());
    assert_eq!(ids(store.list_servers().await.unwrap()), ["s1"]);

    // An unregistered id is free at once for another process.
    register(
        &store,
        &registration("s2", "http://10.0.0.9:80", "new"),
        at(1),
    )
    .await
    .unwrap();

    // Long-silent rows are forgotten; recent ones stay.
    store
        .server_heartbeat("s2", None, None, ServerLoad::default(), None, at(10_000))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        store.forget_servers_silent_since(at(5_000)).await.unwrap(),
        1
    );
    assert_eq!(ids(store.list_servers().await.unwrap()), ["s2"]);
}

/// Processes registering one id at the same moment: exactly one gets it, on PostgreSQL
/// (which several servers share; SQLite serves one server, and its writers queue).
async fn one_of_several_simultaneous_registrations_of_an_id_wins(engine: TestEngine) {
    let db = TestDatabase::new(engine).await;
    let store = db.open().await;
    if store.engine() != Engine::Postgres {
        return;
    }
    // One store (and connection, opened beforehand) per process, all let go at once.
    let start = std::sync::Arc::new(tokio::sync::Barrier::new(8));
    let mut attempts = tokio::task::JoinSet::new();
    for i in 0..8 {
        let store = db.open().await;
        store.list_servers().await.unwrap();
        let start = std::sync::Arc::clone(&start);
        attempts.spawn(async move {
            start.wait().await;
            let incarnation = format!("process-{i}");
            register(
                &store,
                &registration("contested", "http://10.0.0.1:80", &incarnation),
                at(0),
            )
            .await
        });
    }
    let results = attempts.join_all().await;
    let winners: Vec<&ServerRecord> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
    assert_eq!(winners.len(), 1, "{results:?}");
    for result in &results {
        if let Err(RegistryConflict::Duplicate(holder)) = result {
            assert_eq!(holder.incarnation, winners[0].incarnation);
        }
    }
    let stored = store.list_servers().await.unwrap();
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].incarnation, winners[0].incarnation);
}

test_both_engines!(
    one_of_several_simultaneous_registrations_of_an_id_wins,
    a_lock_is_held_by_one_owner_and_renewed_only_by_it,
    a_lapsed_lock_is_taken_over_with_a_larger_token,
    only_the_owner_releases_and_tokens_grow_across_releases,
    release_locks_of_frees_every_lock_of_one_owner,
    a_server_id_is_refused_to_a_second_process_while_the_first_is_live,
    on_postgres_a_server_whose_session_is_gone_does_not_hold_its_id,
    heartbeats_refresh_only_the_registered_incarnation,
    servers_are_listed_by_id_and_unregistered_by_incarnation,
);
