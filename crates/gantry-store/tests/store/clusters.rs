//! Clusters: the default one a database from before clusters gets, registration tokens,
//! what each cluster holds, and deleting one only when it is empty.

use gantry_store::{
    ClusterToken, Fence, InstanceFilter, ModelFilter, NewUser, Page, StoreError, UserChanges,
    WorkerFilter, WorkerRegistration, REGISTRATION_TOKEN_DIGEST,
};
use gantry_testkit::{test_both_engines, TestDatabase, TestEngine};
use gantry_types::fixtures::worker_status;
use gantry_types::{ClusterProvider, ListFilter, Role, DEFAULT_CLUSTER_ID};

use crate::model_create;

const ALL: Page = Page {
    page: 1,
    per_page: 100,
};

fn token<'a>(digest: &'a str, sealed: &'a str) -> ClusterToken<'a> {
    ClusterToken { digest, sealed }
}

/// Migration 11: the default cluster takes the one registration token there was, and
/// every worker, model and instance; users administer no cluster.
async fn an_upgraded_database_has_everything_in_the_default_cluster(engine: TestEngine) {
    let db = TestDatabase::new(engine).await;
    let config = gantry_store::StoreConfig {
        url: db.url.clone(),
        max_connections: 2,
    };
    gantry_store::testing::create_schema_at(&config, 10)
        .await
        .unwrap();
    // What the schema-10 gantry wrote: its token's digest, an admin, a worker, a model
    // and one instance placed on the worker.
    let pool = sqlx::AnyPool::connect(&db.url).await.unwrap();
    let status = serde_json::to_string(&worker_status("w1", 2)).unwrap();
    let spec = r#"{"description":"","source":{"type":"local_path","path":"/m/tiny.gguf"},
        "backend_version":null,"backend_args":[],"env":{},"worker_selector":{},
        "gpu_selector":null,"placement_strategy":"spread","data_parallel_size":null,
        "cpu_offload":true,"labels":{}}"#;
    for statement in [
        "INSERT INTO settings (key, value, created_at) \
         VALUES ('registration_token_digest', 'digest-of-old-token', 1)"
            .to_owned(),
        "INSERT INTO users (username, password_hash, role, full_name, \
         require_password_change, session_version, created_at, updated_at) \
         VALUES ('admin', 'hash', 'admin', '', 0, 1, 1, 1)"
            .to_owned(),
        format!(
            "INSERT INTO workers (name, state, state_message, labels, address, status, \
             credential_digest, api_token, created_at, updated_at) \
             VALUES ('w1', 'ready', '', '{{}}', '127.0.0.1:10150', '{status}', 'cred', 'api', 1, 1)"
        ),
        format!(
            "INSERT INTO models (name, backend, replicas, spec, created_at, updated_at) \
             VALUES ('tiny', 'llama.cpp', 1, '{spec}', 1, 1)"
        ),
        "INSERT INTO model_instances (name, model_id, replica, worker_id, gpu_indexes, \
         state, state_message, restart_count, created_at, updated_at) \
         VALUES ('tiny-0', 1, 0, 1, '[0]', 'running', '', 0, 1, 1)"
            .to_owned(),
    ] {
        sqlx::query(&statement).execute(&pool).await.unwrap();
    }
    pool.close().await;

    let store = db.open().await;
    assert!(store.migrations_done().await.unwrap());
    let clusters = store.list_clusters().await.unwrap();
    assert_eq!(clusters.len(), 1, "{clusters:?}");
    let default = &clusters[0];
    assert_eq!(default.id, DEFAULT_CLUSTER_ID);
    assert!(default.is_default());
    assert_eq!(default.name, "default");
    assert_eq!(default.provider, ClusterProvider::Custom);
    assert_eq!(default.token_digest.as_deref(), Some("digest-of-old-token"));
    assert_eq!(
        default.token_sealed, None,
        "the plaintext is in one data dir"
    );
    assert!(default.created_at.as_millis() > 1, "made when migrated");
    assert_eq!(
        store
            .cluster_by_token_digest("digest-of-old-token")
            .await
            .unwrap()
            .id,
        DEFAULT_CLUSTER_ID
    );
    let worker = store.get_worker_by_name("w1").await.unwrap();
    assert_eq!(worker.cluster_id, DEFAULT_CLUSTER_ID);
    assert_eq!(worker.status.gpus.len(), 2);
    let model = store.get_model_by_name("tiny").await.unwrap();
    assert_eq!(model.cluster_id, DEFAULT_CLUSTER_ID);
    let (instances, _) = store
        .list_instances(&InstanceFilter::default(), ALL)
        .await
        .unwrap();
    assert_eq!(instances.len(), 1);
    assert_eq!(instances[0].cluster_id, DEFAULT_CLUSTER_ID);
    assert_eq!(instances[0].worker_id, Some(worker.id));
    let admin = store.user_record_by_name("admin").await.unwrap().user;
    assert!(admin.cluster_admin_of.is_empty());
    let counts = store.cluster_counts().await.unwrap();
    let default_counts = counts[&DEFAULT_CLUSTER_ID];
    assert_eq!(
        (
            default_counts.workers,
            default_counts.ready_workers,
            default_counts.gpus,
            default_counts.models
        ),
        (1, 1, 2, 1)
    );
    // The old settings row stays for servers of the previous release.
    assert_eq!(
        store
            .get_setting(REGISTRATION_TOKEN_DIGEST)
            .await
            .unwrap()
            .as_deref(),
        Some("digest-of-old-token")
    );
}

async fn a_fresh_database_has_a_default_cluster_without_a_token_until_one_is_made(
    engine: TestEngine,
) {
    let db = TestDatabase::new(engine).await;
    let store = db.open().await;
    let default = store.get_cluster(DEFAULT_CLUSTER_ID).await.unwrap();
    assert_eq!(default.token_digest, None);
    assert!(store
        .set_first_default_token(token("d1", "s1"))
        .await
        .unwrap());
    assert!(
        !store
            .set_first_default_token(token("d2", "s2"))
            .await
            .unwrap(),
        "a second server starting at the same time keeps the first token"
    );
    let default = store.get_cluster(DEFAULT_CLUSTER_ID).await.unwrap();
    assert_eq!(default.token_digest.as_deref(), Some("d1"));
    assert_eq!(default.token_sealed.as_deref(), Some("s1"));
    assert_eq!(
        store
            .get_setting(REGISTRATION_TOKEN_DIGEST)
            .await
            .unwrap()
            .as_deref(),
        Some("d1")
    );
    // Rotating the default cluster's token keeps the old servers' row in step.
    store
        .set_cluster_token(DEFAULT_CLUSTER_ID, token("d3", "s3"))
        .await
        .unwrap();
    assert_eq!(
        store
            .get_setting(REGISTRATION_TOKEN_DIGEST)
            .await
            .unwrap()
            .as_deref(),
        Some("d3")
    );
    assert!(matches!(
        store.cluster_by_token_digest("d1").await,
        Err(StoreError::NotFound { .. })
    ));
    // A token known by digest alone is sealed in once, and only while it is current.
    assert!(!store
        .seal_cluster_token(DEFAULT_CLUSTER_ID, token("d3", "again"))
        .await
        .unwrap());
}

async fn a_cluster_holds_its_own_workers_models_and_instances(engine: TestEngine) {
    let db = TestDatabase::new(engine).await;
    let store = db.open().await;
    let east = store
        .create_cluster(
            "east",
            "rack 4",
            ClusterProvider::Kubernetes,
            token("de", "se"),
        )
        .await
        .unwrap();
    assert!(east.id > DEFAULT_CLUSTER_ID);
    assert!(matches!(
        store
            .create_cluster("east", "", ClusterProvider::Custom, token("dx", "sx"))
            .await,
        Err(StoreError::Conflict { .. })
    ));
    assert_eq!(
        store.cluster_by_token_digest("de").await.unwrap().name,
        "east"
    );

    let labels = Default::default();
    let status = worker_status("e1", 4);
    let registration = WorkerRegistration {
        labels: &labels,
        address: "127.0.0.1:10150",
        status: &status,
    };
    let e1 = store
        .register_worker(east.id, "e1", &registration, "cred-e1", "api")
        .await
        .unwrap();
    assert_eq!(e1.cluster_id, east.id);
    assert!(matches!(
        store
            .register_worker(999, "lost", &registration, "cred-lost", "api")
            .await,
        Err(StoreError::NotFound { .. })
    ));
    let d1 = store
        .create_worker("d1", &labels, "127.0.0.1:10151", &status, "cred-d1")
        .await
        .unwrap();
    assert_eq!(d1.cluster_id, DEFAULT_CLUSTER_ID);

    let mut in_east = model_create("big", 2);
    in_east.cluster_id = Some(east.id);
    let big = store.create_model(&in_east).await.unwrap();
    assert_eq!(big.cluster_id, east.id);
    let small = store.create_model(&model_create("small", 1)).await.unwrap();
    assert_eq!(small.cluster_id, DEFAULT_CLUSTER_ID);
    let mut nowhere = model_create("lost", 1);
    nowhere.cluster_id = Some(999);
    assert!(matches!(
        store.create_model(&nowhere).await,
        Err(StoreError::NotFound { .. })
    ));
    let created = store
        .create_instances(&big, &[0, 1], &Fence::Unfenced)
        .await
        .unwrap();
    assert!(created.iter().all(|i| i.cluster_id == east.id));
    store
        .create_instances(&small, &[0], &Fence::Unfenced)
        .await
        .unwrap();

    // Lists filter by cluster, and by the clusters a caller may see; a watch reads the
    // same filter the same way.
    let only_east = WorkerFilter {
        cluster_id: Some(east.id),
        ..WorkerFilter::default()
    };
    let (workers, _) = store.list_workers(&only_east, ALL).await.unwrap();
    assert_eq!(names(&workers, |w| &w.name), ["e1"]);
    assert!(only_east.matches(&e1) && !only_east.matches(&d1));
    let seen = WorkerFilter {
        within_clusters: Some(vec![DEFAULT_CLUSTER_ID]),
        ..WorkerFilter::default()
    };
    let (workers, _) = store.list_workers(&seen, ALL).await.unwrap();
    assert_eq!(names(&workers, |w| &w.name), ["d1"]);
    let none = WorkerFilter {
        within_clusters: Some(Vec::new()),
        ..WorkerFilter::default()
    };
    assert_eq!(store.list_workers(&none, ALL).await.unwrap().1, 0);
    let models = ModelFilter {
        cluster_id: Some(east.id),
        ..ModelFilter::default()
    };
    let (listed, _) = store.list_models(&models, ALL).await.unwrap();
    assert_eq!(names(&listed, |m| &m.name), ["big"]);
    let instances = InstanceFilter {
        within_clusters: Some(vec![east.id]),
        ..InstanceFilter::default()
    };
    let (listed, total) = store.list_instances(&instances, ALL).await.unwrap();
    assert_eq!(total, 2);
    assert!(listed.iter().all(|i| i.model_name == "big"));

    let counts = store.cluster_counts().await.unwrap();
    assert_eq!(
        (
            counts[&east.id].workers,
            counts[&east.id].gpus,
            counts[&east.id].models
        ),
        (1, 4, 1)
    );

    // A user administers the cluster; deleting the cluster takes that away.
    let carol = store
        .create_user(&NewUser {
            username: "carol".into(),
            password_hash: "hash".into(),
            role: Role::User,
            full_name: String::new(),
            require_password_change: false,
            cluster_admin_of: vec![east.id],
        })
        .await
        .unwrap();
    assert_eq!(carol.cluster_admin_of, [east.id]);
    let both = [DEFAULT_CLUSTER_ID, east.id];
    let carol = store
        .update_user(
            carol.id,
            &UserChanges {
                cluster_admin_of: Some(&both),
                ..UserChanges::default()
            },
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(carol.cluster_admin_of, both);

    // Not while it holds a worker or a model, and never the default one.
    let refused = store.delete_cluster(east.id).await.unwrap_err();
    let StoreError::InUse { by, .. } = &refused else {
        panic!("expected in use: {refused:?}");
    };
    assert!(
        by.contains("worker(s) e1") && by.contains("model(s) big"),
        "{by}"
    );
    assert!(matches!(
        store.delete_cluster(DEFAULT_CLUSTER_ID).await,
        Err(StoreError::Invalid(_))
    ));
    store.delete_model(big.id).await.unwrap();
    store.delete_worker(e1.id).await.unwrap();
    let gone = store.delete_cluster(east.id).await.unwrap();
    assert_eq!(gone.name, "east");
    assert!(matches!(
        store.get_cluster(east.id).await,
        Err(StoreError::NotFound { .. })
    ));
    let carol = store.get_user(carol.id).await.unwrap();
    assert_eq!(carol.cluster_admin_of, [DEFAULT_CLUSTER_ID]);
}

async fn a_cluster_is_renamed_only_as_it_was_read(engine: TestEngine) {
    let db = TestDatabase::new(engine).await;
    let store = db.open().await;
    let west = store
        .create_cluster("west", "", ClusterProvider::Custom, token("dw", "sw"))
        .await
        .unwrap();
    let renamed = store
        .update_cluster(
            west.id,
            west.updated_at,
            "west-2",
            "moved",
            ClusterProvider::Custom,
        )
        .await
        .unwrap();
    assert_eq!(
        (renamed.name.as_str(), renamed.description.as_str()),
        ("west-2", "moved")
    );
    assert!(matches!(
        store
            .update_cluster(
                west.id,
                west.updated_at,
                "west-3",
                "",
                ClusterProvider::Custom
            )
            .await,
        Err(StoreError::Conflict { .. })
    ));
    assert!(matches!(
        store
            .update_cluster(
                west.id,
                renamed.updated_at,
                "default",
                "",
                ClusterProvider::Custom
            )
            .await,
        Err(StoreError::Conflict { .. })
    ));
    let rotated = store
        .set_cluster_token(west.id, token("dw2", "sw2"))
        .await
        .unwrap();
    assert_eq!(rotated.token_digest.as_deref(), Some("dw2"));
    assert!(store.cluster_by_token_digest("dw").await.is_err());
}

fn names<T>(items: &[T], name: impl Fn(&T) -> &String) -> Vec<String> {
    items.iter().map(|item| name(item).clone()).collect()
}

test_both_engines!(
    an_upgraded_database_has_everything_in_the_default_cluster,
    a_fresh_database_has_a_default_cluster_without_a_token_until_one_is_made,
    a_cluster_holds_its_own_workers_models_and_instances,
    a_cluster_is_renamed_only_as_it_was_read,
);
