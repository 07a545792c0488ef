//! The store's behaviour, run against both SQLite and PostgreSQL.

use std::collections::BTreeMap;

use gantry_store::testing::PagedList;
use gantry_store::{
    ApiKeyFilter, Change, ChangeKind, InstanceFilter, ModelFilter, NewApiKey, NewUser, Page,
    StoreError, UserChanges, UserFilter, WorkerFilter,
};
use gantry_store::{Fence, Listed, UploadDone};
use gantry_testkit::{test_both_engines, TestDatabase, TestEngine};
use gantry_types::fixtures::worker_status;

use crate::model_create;
use gantry_types::{
    BackendKind, InstanceState, InstanceStateReport, Role, UploadCreate, UploadState,
};

fn new_user(name: &str, role: Role) -> NewUser {
    NewUser {
        cluster_admin_of: Vec::new(),
        username: name.to_string(),
        password_hash: format!("hash-of-{name}"),
        role,
        full_name: String::new(),
        require_password_change: false,
    }
}

const ALL: Page = Page {
    page: 1,
    per_page: 100,
};

async fn users_are_created_listed_updated_and_deleted(engine: TestEngine) {
    let db = TestDatabase::new(engine).await;
    let store = db.open().await;
    let alice = store
        .create_user(&new_user("alice", Role::Admin))
        .await
        .unwrap();
    let bob = store
        .create_user(&new_user("bob", Role::User))
        .await
        .unwrap();
    assert!(alice.id < bob.id);

    let (all, total) = store.list_users(&UserFilter::default(), ALL).await.unwrap();
    assert_eq!(total, 2);
    assert_eq!(all[0].username, "alice");

    let filter = UserFilter {
        role: Some(Role::User),
        search: None,
    };
    let (users, total) = store.list_users(&filter, ALL).await.unwrap();
    assert_eq!((users.len(), total), (1, 1));
    assert_eq!(users[0].username, "bob");

    let search = UserFilter {
        role: None,
        search: Some("LIC".into()),
    };
    assert_eq!(store.list_users(&search, ALL).await.unwrap().1, 1);

    // Alice is the only admin: the writes that would leave none are not made.
    let kept = store
        .update_user(
            alice.id,
            &UserChanges {
                role: Some(Role::User),
                full_name: Some("Alice A"),
                ..UserChanges::default()
            },
        )
        .await
        .unwrap();
    assert!(kept.is_none(), "the last admin was demoted: {kept:?}");
    assert!(store.delete_user(alice.id).await.unwrap().is_none());
    let alice_now = store.get_user(alice.id).await.unwrap();
    assert_eq!(
        (alice_now.role, alice_now.full_name.as_str()),
        (Role::Admin, "")
    );
    assert!(matches!(
        store
            .update_user(
                999,
                &UserChanges {
                    role: Some(Role::User),
                    ..UserChanges::default()
                }
            )
            .await,
        Err(gantry_store::StoreError::NotFound { .. })
    ));

    let bob2 = store
        .update_user(
            bob.id,
            &UserChanges {
                role: Some(Role::Admin),
                full_name: Some("Bob B"),
                ..UserChanges::default()
            },
        )
        .await
        .unwrap()
        .expect("another admin remains");
    assert_eq!(bob2.role, Role::Admin);
    assert_eq!(bob2.full_name, "Bob B");
    assert_eq!(store.count_admins().await.unwrap(), 2);

    let before = store.user_record(bob.id).await.unwrap().session_version;
    store.set_password(bob.id, "new-hash", true).await.unwrap();
    let record = store.user_record_by_name("bob").await.unwrap();
    assert_eq!(record.password_hash, "new-hash");
    assert!(record.user.require_password_change);
    assert_eq!(record.session_version, before + 1);

    store.delete_user(bob.id).await.unwrap();
    assert!(matches!(
        store.get_user(bob.id).await,
        Err(StoreError::NotFound { .. })
    ));
}

async fn duplicate_usernames_conflict_and_keep_the_original(engine: TestEngine) {
    let db = TestDatabase::new(engine).await;
    let store = db.open().await;
    store
        .create_user(&new_user("alice", Role::Admin))
        .await
        .unwrap();
    let mut again = new_user("alice", Role::User);
    again.password_hash = "other".into();
    let err = store.create_user(&again).await.unwrap_err();
    assert!(matches!(err, StoreError::Conflict { .. }), "{err}");
    let record = store.user_record_by_name("alice").await.unwrap();
    assert_eq!(record.password_hash, "hash-of-alice");
    assert!(!store.create_user_if_absent(&again).await.unwrap());
}

async fn api_keys_are_found_by_digest_and_cascade_with_their_user(engine: TestEngine) {
    let db = TestDatabase::new(engine).await;
    let store = db.open().await;
    let alice = store
        .create_user(&new_user("alice", Role::User))
        .await
        .unwrap();
    let key = store
        .create_api_key(&NewApiKey {
            user_id: alice.id,
            name: "laptop".into(),
            description: String::new(),
            access_key: "abcd".into(),
            lookup_digest: "digest-1".into(),
            secret_hash: "argon".into(),
            expires_at: None,
            limits: Default::default(),
        })
        .await
        .unwrap();
    let found = store.api_key_by_digest("digest-1").await.unwrap();
    assert_eq!(found.key.id, key.id);
    assert_eq!(found.secret_hash, "argon");

    let duplicate = store
        .create_api_key(&NewApiKey {
            user_id: alice.id,
            name: "laptop".into(),
            description: String::new(),
            access_key: "efgh".into(),
            lookup_digest: "digest-2".into(),
            secret_hash: "argon".into(),
            expires_at: None,
            limits: Default::default(),
        })
        .await
        .unwrap_err();
    assert!(matches!(duplicate, StoreError::Conflict { .. }));

    let at = gantry_types::Timestamp::from_millis(1_800_000_000_000);
    store.touch_api_key(key.id, at).await.unwrap();
    assert_eq!(
        store.get_api_key(key.id).await.unwrap().last_used_at,
        Some(at)
    );

    let alices = ApiKeyFilter {
        user_id: Some(alice.id),
    };
    assert_eq!(store.list_api_keys(&alices, ALL).await.unwrap().1, 1);
    store.delete_user(alice.id).await.unwrap();
    assert!(store.api_key_by_digest("digest-1").await.is_err());
}

async fn instances_are_created_pending_and_a_taken_replica_is_skipped(engine: TestEngine) {
    let db = TestDatabase::new(engine).await;
    let store = db.open().await;
    let (model, instances) = model_with_instances(&store, "tiny", 3).await;
    let names: Vec<_> = instances.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(names, ["tiny-0", "tiny-1", "tiny-2"]);
    assert!(instances.iter().all(|i| i.state == InstanceState::Pending));
    assert!(instances.iter().all(|i| i.model_name == "tiny"));

    // Another writer was first with replica 1: it is skipped, 3 is created.
    let created = store
        .create_instances(&model, &[1, 3], &Fence::Unfenced)
        .await
        .unwrap();
    let names: Vec<_> = created.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(names, ["tiny-3"]);

    let err = store
        .create_model(&model_create("tiny", 1))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Conflict { .. }));
    // The failed create left the first model and its instances untouched.
    let filter = InstanceFilter {
        model_id: Some(model.id),
        ..Default::default()
    };
    assert_eq!(store.list_instances(&filter, ALL).await.unwrap().1, 4);

    // A model deleted meanwhile gets no instances.
    store.delete_model(model.id).await.unwrap();
    assert!(store
        .create_instances(&model, &[7], &Fence::Unfenced)
        .await
        .unwrap()
        .is_empty());
}

async fn an_instance_is_deleted_only_as_it_was_read(engine: TestEngine) {
    let db = TestDatabase::new(engine).await;
    let store = db.open().await;
    let worker = simulated_worker(&store, "w1", 2).await;
    let (_, instances) = model_with_instances(&store, "tiny", 2).await;
    // Placed since it was read: the decision to delete it was taken from a stale view.
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    place_by_hand(&store, instances[0].id, worker.id, &[1]).await;
    assert!(store
        .delete_instance_if_unchanged(&instances[0], &Fence::Unfenced)
        .await
        .unwrap()
        .is_none());
    assert!(store.get_instance(instances[0].id).await.is_ok());
    let deleted = store
        .delete_instance_if_unchanged(&instances[1], &Fence::Unfenced)
        .await
        .unwrap()
        .expect("unchanged since read");
    assert_eq!(deleted.id, instances[1].id);
    assert!(store.get_instance(instances[1].id).await.is_err());
}

async fn deleting_a_model_deletes_its_instances(engine: TestEngine) {
    let db = TestDatabase::new(engine).await;
    let store = db.open().await;
    let (keep, _) = model_with_instances(&store, "keep", 1).await;
    let (gone, _) = model_with_instances(&store, "gone", 2).await;
    store.delete_model(gone.id).await.unwrap();
    let (all, total) = store
        .list_instances(&InstanceFilter::default(), ALL)
        .await
        .unwrap();
    assert_eq!(total, 1);
    assert_eq!(all[0].model_id, keep.id);
    assert!(store.get_model(gone.id).await.is_err());
}

async fn a_placement_by_hand_records_the_launch_and_a_deleted_worker_unplaces(engine: TestEngine) {
    let db = TestDatabase::new(engine).await;
    let store = db.open().await;
    let worker = simulated_worker(&store, "w1", 2).await;
    let (_, instances) = model_with_instances(&store, "tiny", 1).await;
    let id = instances[0].id;

    let placed = place_by_hand(&store, id, worker.id, &[0, 1]).await;
    assert_eq!(placed.state, InstanceState::Scheduled);
    assert_eq!(placed.gpu_indexes, vec![0, 1]);
    let record = placed.placement.expect("a record");
    assert_eq!(
        record.launch.backend_args,
        model_create("tiny", 1).backend_args
    );
    assert!(record.reservation.is_none(), "nothing was estimated");

    // Deleting the worker sends the instance back to pending.
    store.delete_worker(worker.id).await.unwrap();
    let back = store.get_instance(id).await.unwrap();
    assert_eq!(back.state, InstanceState::Pending);
    assert_eq!(back.worker_id, None);
    assert!(back.state_message.contains("w1 was deleted"));
}

fn report(state: InstanceState, port: u16, backend_version: Option<&str>) -> InstanceStateReport {
    InstanceStateReport {
        state,
        state_message: format!("now {state:?}"),
        port: Some(port),
        address: (state == InstanceState::Running).then(|| format!("127.0.0.1:{port}")),
        restart_count: 0,
        download: None,
        install: None,
        backend_version: backend_version.map(str::to_owned),
    }
}

/// Many reports at once (what a fleet starting a model sends): the store writes those
/// that queue up together, and each must still be judged and answered on its own.
async fn reports_arriving_together_are_each_applied_in_order_and_answered(engine: TestEngine) {
    let db = TestDatabase::new(engine).await;
    let store = db.open().await;
    let status = worker_status("w", 1);
    let w1 = store
        .create_worker("w1", &BTreeMap::new(), "127.0.0.1:1", &status, "c1")
        .await
        .unwrap();
    let w2 = store
        .create_worker("w2", &BTreeMap::new(), "127.0.0.1:2", &status, "c2")
        .await
        .unwrap();
    let (_, instances) = model_with_instances(&store, "tiny", 150).await;
    for instance in &instances {
        place_by_hand(&store, instance.id, w1.id, &[0]).await;
    }
    let mut changes = store.subscribe();

    // Every instance `starting` from its worker (with a backend version), the first 20
    // then `running` (no version: the one reported stays), 10 reports from a worker
    // the instances are not on, and one of an instance that does not exist.
    let mut sent = Vec::new();
    for instance in &instances {
        sent.push((
            instance.id,
            w1.id,
            report(InstanceState::Starting, 20_001, Some("b7")),
        ));
    }
    for instance in &instances[..20] {
        sent.push((
            instance.id,
            w1.id,
            report(InstanceState::Running, 20_002, None),
        ));
    }
    for instance in &instances[20..30] {
        sent.push((
            instance.id,
            w2.id,
            report(InstanceState::Error, 20_003, None),
        ));
    }
    sent.push((
        i64::MAX,
        w1.id,
        report(InstanceState::Running, 20_004, None),
    ));
    let answers = futures_util::future::join_all(
        sent.iter()
            .map(|(id, worker_id, report)| store.report_instance_state(*id, *worker_id, report)),
    )
    .await;

    let mut applied = 0;
    for ((id, worker_id, report), answer) in sent.iter().zip(answers) {
        if *worker_id == w2.id || *id == i64::MAX {
            assert!(
                matches!(answer, Err(StoreError::NotFound { .. })),
                "instance {id} is not on worker {worker_id}: {answer:?}"
            );
            continue;
        }
        let instance = answer.unwrap_or_else(|e| panic!("report of {id}: {e}"));
        assert_eq!((instance.id, instance.state), (*id, report.state));
        assert_eq!(instance.port, report.port);
        assert_eq!(instance.backend_version.as_deref(), Some("b7"));
        assert_eq!(instance.worker_name.as_deref(), Some("w1"));
        applied += 1;
    }
    assert_eq!(applied, 170);

    // Stored as last reported: the two reports of one instance applied in order.
    let (stored, _) = store
        .list_instances(
            &InstanceFilter::default(),
            Page {
                page: 1,
                per_page: 500,
            },
        )
        .await
        .unwrap();
    for (n, instance) in instances.iter().enumerate() {
        let now = stored.iter().find(|i| i.id == instance.id).unwrap();
        let (state, address) = if n < 20 {
            (InstanceState::Running, Some("127.0.0.1:20002"))
        } else {
            (InstanceState::Starting, None)
        };
        assert_eq!(
            (now.state, now.address.as_deref()),
            (state, address),
            "instance {n}"
        );
        assert_eq!(now.backend_version.as_deref(), Some("b7"));
    }
    // One change published per report applied, and none for the others.
    let mut published = 0;
    while let Ok(change) = changes.try_recv() {
        if let Change::Instance(ChangeKind::Updated, _) = change.as_ref() {
            published += 1;
        }
    }
    assert_eq!(published, 170);
}

async fn lists_paginate_and_filter(engine: TestEngine) {
    let db = TestDatabase::new(engine).await;
    let store = db.open().await;
    for i in 0..5 {
        store
            .create_model(&model_create(&format!("m{i}"), 0))
            .await
            .unwrap();
    }
    let page2 = Page {
        page: 2,
        per_page: 2,
    };
    let (models, total) = store
        .list_models(&ModelFilter::default(), page2)
        .await
        .unwrap();
    assert_eq!(total, 5);
    let names: Vec<_> = models.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names, ["m2", "m3"]);

    let by_name = ModelFilter {
        name: Some("m4".into()),
        ..Default::default()
    };
    assert_eq!(store.list_models(&by_name, ALL).await.unwrap().1, 1);
    let by_backend = ModelFilter {
        backend: Some("vllm".to_owned()),
        ..Default::default()
    };
    assert_eq!(store.list_models(&by_backend, ALL).await.unwrap().1, 0);
    let search_literal_percent = ModelFilter {
        search: Some("%".into()),
        ..Default::default()
    };
    assert_eq!(
        store
            .list_models(&search_literal_percent, ALL)
            .await
            .unwrap()
            .1,
        0
    );

    store
        .create_worker("w1", &BTreeMap::new(), "a:1", &worker_status("w1", 0), "c1")
        .await
        .unwrap();
    let ready = WorkerFilter {
        within_clusters: None,
        cluster_id: None,
        state: Some(gantry_types::WorkerState::Ready),
        name: None,
    };
    assert_eq!(store.list_workers(&ready, ALL).await.unwrap().1, 1);

    // A listing that joins (instances, with their model's name): each page in id order
    // with the count of every instance the filter selects, and past the end an empty
    // page that still says how many there are.
    let (_, others) = model_with_instances(&store, "other", 2).await;
    let (paged, instances) = model_with_instances(&store, "paged", 5).await;
    let of_paged = InstanceFilter {
        model_id: Some(paged.id),
        ..Default::default()
    };
    for (number, ids) in [
        (1, &instances[..2]),
        (2, &instances[2..4]),
        (3, &instances[4..]),
    ] {
        let page = Page {
            page: number,
            per_page: 2,
        };
        let (listed, total) = store.list_instances(&of_paged, page).await.unwrap();
        assert_eq!(total, 5, "page {number}");
        let listed: Vec<(i64, &str)> = listed
            .iter()
            .map(|i| (i.id, i.model_name.as_str()))
            .collect();
        let expected: Vec<(i64, &str)> = ids.iter().map(|i| (i.id, "paged")).collect();
        assert_eq!(listed, expected, "page {number}");
    }
    let past = Page {
        page: 4,
        per_page: 2,
    };
    assert_eq!(
        store.list_instances(&of_paged, past).await.unwrap(),
        (Vec::new(), 5)
    );
    let (all, total) = store
        .list_instances(
            &InstanceFilter::default(),
            Page {
                page: 1,
                per_page: 3,
            },
        )
        .await
        .unwrap();
    assert_eq!(total, 7);
    assert_eq!(all[0].id, others[0].id);
    let (users, total) = store
        .list_users(
            &UserFilter::default(),
            Page {
                page: 9,
                per_page: 10,
            },
        )
        .await
        .unwrap();
    assert_eq!((users.len(), total), (0, 0));
}

/// Checks, for each filter, that the store's SQL selects exactly the items (of all that
/// the unfiltered list holds) that `ListFilter::matches` accepts, in the same order.
async fn agree<F>(store: &gantry_store::Store, filters: &[F])
where
    F: Listed + Default + std::fmt::Debug,
    F::Item: PartialEq + std::fmt::Debug,
{
    let everything = Page {
        page: 1,
        per_page: 1000,
    };
    let all = F::default().list(store, everything).await.unwrap().0;
    for filter in filters {
        let listed = filter.list(store, everything).await.unwrap().0;
        let expected: Vec<&F::Item> = all.iter().filter(|item| filter.matches(item)).collect();
        let listed: Vec<&F::Item> = listed.iter().collect();
        assert_eq!(listed, expected, "SQL and watch disagree on {filter:?}");
    }
}

async fn lists_and_watches_read_a_filter_the_same_way(engine: TestEngine) {
    let db = TestDatabase::new(engine).await;
    let store = db.open().await;
    for (name, backend) in [
        ("tiny-llama", "llama.cpp"),
        ("qwen_7b", "vllm"),
        ("Llama-Big", "llama.cpp"),
        ("llama%1", "sglang"),
    ] {
        let mut create = model_create(&name.to_lowercase(), 0);
        create.backend = BackendKind::parse(backend).unwrap().into();
        let model = store.create_model(&create).await.unwrap();
        store
            .create_instances(&model, &[0, 1], &Fence::Unfenced)
            .await
            .unwrap();
    }
    for name in ["Alice", "bob", "ALBERT", "carol_a"] {
        store
            .create_user(&new_user(name, Role::User))
            .await
            .unwrap();
    }
    for name in ["w1", "w2"] {
        simulated_worker(&store, name, 1).await;
    }
    agree(
        &store,
        &[
            ModelFilter::default(),
            ModelFilter {
                search: Some("LLAMA".into()),
                ..Default::default()
            },
            ModelFilter {
                search: Some("%".into()),
                ..Default::default()
            },
            ModelFilter {
                search: Some("_".into()),
                ..Default::default()
            },
            ModelFilter {
                backend: Some("llama.cpp".to_owned()),
                search: Some("big".into()),
                ..Default::default()
            },
            ModelFilter {
                name: Some("qwen_7b".into()),
                ..Default::default()
            },
        ],
    )
    .await;
    agree(
        &store,
        &[
            UserFilter {
                search: Some("al".into()),
                ..Default::default()
            },
            UserFilter {
                role: Some(Role::Admin),
                ..Default::default()
            },
            UserFilter {
                role: Some(Role::User),
                search: Some("A".into()),
            },
        ],
    )
    .await;
    let first = store
        .list_instances(&InstanceFilter::default(), ALL)
        .await
        .unwrap()
        .0
        .remove(0);
    let worker = store.get_worker_by_name("w2").await.unwrap();
    place_by_hand(&store, first.id, worker.id, &[0]).await;
    agree(
        &store,
        &[
            InstanceFilter {
                model_id: Some(first.model_id),
                ..Default::default()
            },
            InstanceFilter {
                worker_id: Some(worker.id),
                ..Default::default()
            },
            InstanceFilter {
                state: Some(InstanceState::Pending),
                model_id: Some(first.model_id),
                ..Default::default()
            },
            InstanceFilter {
                state: Some(InstanceState::Scheduled),
                ..Default::default()
            },
        ],
    )
    .await;
    agree(
        &store,
        &[
            WorkerFilter {
                name: Some("w1".into()),
                ..Default::default()
            },
            WorkerFilter {
                state: Some(gantry_types::WorkerState::Ready),
                ..Default::default()
            },
        ],
    )
    .await;
}

async fn committed_writes_are_published_as_changes(engine: TestEngine) {
    let db = TestDatabase::new(engine).await;
    let store = db.open().await;
    let mut changes = store.subscribe();
    let (model, _) = model_with_instances(&store, "tiny", 1).await;
    let mut seen = Vec::new();
    for _ in 0..2 {
        match &*changes.recv().await.unwrap() {
            Change::Model(kind, m) => seen.push(format!("model {kind:?} {}", m.name)),
            Change::Instance(kind, i) => seen.push(format!("instance {kind:?} {}", i.name)),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(seen, ["model Created tiny", "instance Created tiny-0"]);
    store.delete_model(model.id).await.unwrap();
    let first = changes.recv().await.unwrap();
    assert!(matches!(&*first, Change::Instance(ChangeKind::Deleted, i) if i.name == "tiny-0"));
}

async fn reopening_a_database_keeps_data_and_skips_applied_migrations(engine: TestEngine) {
    let db = TestDatabase::new(engine).await;
    let store = db.open().await;
    store
        .create_user(&new_user("alice", Role::Admin))
        .await
        .unwrap();
    store.close().await;
    let again = db.open().await;
    assert!(again.migrations_done().await.unwrap());
    assert_eq!(
        again.user_record_by_name("alice").await.unwrap().user.role,
        Role::Admin
    );
    assert!(again.insert_setting_if_absent("k", "v1").await.unwrap());
    assert!(!again.insert_setting_if_absent("k", "v2").await.unwrap());
    assert_eq!(again.get_setting("k").await.unwrap().as_deref(), Some("v1"));
}

/// Migration 8 moves every worker's last heartbeat from `workers` into
/// `worker_heartbeats`: a database from before it keeps its workers' times.
async fn upgrading_to_the_heartbeat_table_keeps_each_workers_last_heartbeat(engine: TestEngine) {
    let db = TestDatabase::new(engine).await;
    // The database as version 7 left it: the time in the worker's row, w2 never heard.
    let config = gantry_store::StoreConfig {
        url: db.url.clone(),
        max_connections: 2,
    };
    gantry_store::testing::create_schema_at(&config, 7)
        .await
        .unwrap();
    assert!(gantry_store::testing::create_schema_at(&config, 0)
        .await
        .is_err());
    let pool = sqlx::AnyPool::connect(&db.url).await.unwrap();
    let version: i64 = sqlx::Row::get(
        &sqlx::query("SELECT MAX(version) AS v FROM gantry_migrations")
            .fetch_one(&pool)
            .await
            .unwrap(),
        "v",
    );
    assert_eq!(version, 7);
    let mut ids = Vec::new();
    for (name, heard_at) in [("w1", Some(1_700_000_123_456_i64)), ("w2", None)] {
        let status = serde_json::to_string(&worker_status(name, 1)).unwrap();
        let row = sqlx::query(
            "INSERT INTO workers (name, state, state_message, labels, address, status, \
             credential_digest, api_token, last_heartbeat_at, created_at, updated_at) \
             VALUES ($1, 'ready', '', '{}', '10.0.0.1:10150', $2, $3, 'token', $4, 1, 1) \
             RETURNING id",
        )
        .bind(name)
        .bind(status)
        .bind(format!("digest-{name}"))
        .bind(heard_at)
        .fetch_one(&pool)
        .await
        .unwrap();
        ids.push(sqlx::Row::get::<i64, _>(&row, "id"));
    }
    pool.close().await;
    let (heard, silent) = (ids[0], ids[1]);

    let upgraded = db.open().await;
    assert!(upgraded.migrations_done().await.unwrap());
    assert_eq!(
        upgraded.get_worker(heard).await.unwrap().last_heartbeat_at,
        Some(gantry_types::Timestamp::from_millis(1_700_000_123_456))
    );
    assert_eq!(
        upgraded.get_worker(silent).await.unwrap().last_heartbeat_at,
        None
    );
    // And heartbeats land in the new table.
    let after = upgraded
        .record_heartbeat_of_ready(heard)
        .await
        .unwrap()
        .unwrap();
    assert!(after.last_heartbeat_at.unwrap().as_millis() > 1_700_000_123_456);
}

async fn an_upload_is_created_advanced_finished_listed_and_deleted(engine: TestEngine) {
    let db = TestDatabase::new(engine).await;
    let store = db.open().await;
    let new = UploadCreate {
        name: "tiny.gguf".into(),
        size: 100,
        sha256: Some("AB".repeat(32)),
    };
    let upload = store
        .create_upload(&new, "server:a", 1)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(upload.state, UploadState::Uploading);
    assert_eq!(upload.sha256.as_deref(), Some("ab".repeat(32).as_str()));
    store
        .set_upload_received(upload.id, 40)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let got = store
        .get_upload(upload.id)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(got.bytes_received, 40);
    let done = store
        .finish_upload(
            upload.id,
            &UploadDone {
                sha256: "ab".repeat(32),
                location: "s3:b/k".into(),
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (done.state, done.bytes_received, done.location.as_str()),
        (UploadState::Ready, 100, "s3:b/k")
    );
    // A finished upload no longer moves.
    store
        .set_upload_received(upload.id, 3)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        store
            .get_upload(upload.id)
            .await
            .map(|u| u.bytes_received)
            .ok(),
        Some(100)
    );
    assert_eq!(store.list_uploads().await.map(|l| l.len()).ok(), Some(1));
    store
        .delete_upload(upload.id)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(matches!(
        store.get_upload(upload.id).await,
        Err(StoreError::NotFound { .. })
    ));
}

test_both_engines!(
    upgrading_to_the_heartbeat_table_keeps_each_workers_last_heartbeat,
    an_upload_is_created_advanced_finished_listed_and_deleted,
    users_are_created_listed_updated_and_deleted,
    duplicate_usernames_conflict_and_keep_the_original,
    api_keys_are_found_by_digest_and_cascade_with_their_user,
    instances_are_created_pending_and_a_taken_replica_is_skipped,
    an_instance_is_deleted_only_as_it_was_read,
    deleting_a_model_deletes_its_instances,
    a_placement_by_hand_records_the_launch_and_a_deleted_worker_unplaces,
    reports_arriving_together_are_each_applied_in_order_and_answered,
    lists_and_watches_read_a_filter_the_same_way,
    lists_paginate_and_filter,
    committed_writes_are_published_as_changes,
    reopening_a_database_keeps_data_and_skips_applied_migrations,
);

/// Places an instance by hand with the record the service layer would write.
async fn place_by_hand(
    store: &gantry_store::Store,
    id: i64,
    worker_id: i64,
    gpus: &[u32],
) -> gantry_types::ModelInstance {
    let instance = store.get_instance(id).await.unwrap();
    let model = store.get_model(instance.model_id).await.unwrap();
    let record = gantry_types::PlacementRecord::by_hand(&model);
    store
        .place_instance_manually(
            id,
            Some(gantry_store::ManualPlacement {
                worker_id,
                gpu_indexes: gpus,
                state_message: "placed by hand",
                record: &record,
            }),
        )
        .await
        .unwrap()
}

/// A worker named `name` with `gpus` simulated GPUs, its name also its credential.
async fn simulated_worker(
    store: &gantry_store::Store,
    name: &str,
    gpus: u32,
) -> gantry_types::Worker {
    store
        .create_worker(
            name,
            &BTreeMap::new(),
            "127.0.0.1:1",
            &worker_status(name, gpus),
            name,
        )
        .await
        .unwrap()
}

/// A model and its `replicas` instances, as the model controller would create them.
async fn model_with_instances(
    store: &gantry_store::Store,
    name: &str,
    replicas: u32,
) -> (gantry_types::Model, Vec<gantry_types::ModelInstance>) {
    let model = store
        .create_model(&model_create(name, replicas))
        .await
        .unwrap();
    let numbers: Vec<u32> = (0..replicas).collect();
    let instances = store
        .create_instances(&model, &numbers, &Fence::Unfenced)
        .await
        .unwrap();
    (model, instances)
}

/// On SQLite a page of workers or instances finds its ids through the narrow index of
/// ids (migration 10), not by walking the wide rows before it: the statement the listing
/// runs (query.rs) is planned as a covering-index scan.
#[tokio::test]
async fn sqlite_pages_of_workers_and_instances_walk_the_index_of_ids() {
    let db = TestDatabase::new(TestEngine::Sqlite).await;
    let store = db.open().await;
    for (list, table) in [
        (PagedList::Workers, "workers"),
        (PagedList::ModelInstances, "model_instances"),
    ] {
        let plan = store.sqlite_plan_of_a_page_for_tests(list).await.unwrap();
        // The page's ids are walked in the narrow index, and its count read there too.
        assert!(
            plan.iter()
                .any(|step| step.contains(&format!("COVERING INDEX {table}_by_id"))),
            "{table}: {plan:?}"
        );
        // Nothing scans the table's wide rows (only the page's rows are read, by rowid),
        // and nothing is sorted.
        assert!(
            !plan.iter().any(
                |step| (step.starts_with("SCAN") && !step.contains("COVERING INDEX"))
                    || step.contains("TEMP B-TREE")
            ),
            "{table}: {plan:?}"
        );
    }
    store.close().await;
}
