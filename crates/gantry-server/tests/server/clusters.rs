//! Clusters through the API: each with its own registration token and workers, models
//! placed on their cluster's workers only, estimates per cluster, tokens rotated, cluster
//! administrators who act on their clusters alone, and a database from before clusters
//! started on.

use std::path::PathBuf;

use crate::common::{expect_error, simulated_worker, tiny_model, user, TestServer, ADMIN_PASSWORD};
use gantry_client::Client;
use gantry_testkit::{test_both_engines, TestEngine};
use gantry_types::{
    ClusterCreate, ClusterProvider, ClusterState, ClusterUpdate, ErrorCode, InstanceQuery,
    InstanceState, ModelCreate, ModelUpdate, UserUpdate, WorkerLabelsUpdate, WorkerQuery,
    WorkerRegister, DEFAULT_CLUSTER_ID,
};

fn tiny_gguf(server: &TestServer) -> PathBuf {
    let path = server.data_dir.path().join("tiny.gguf");
    gantry_gguf::write_tiny_llama(&path).unwrap();
    path
}

fn llama(name: &str, path: &std::path::Path, replicas: u32, cluster: Option<i64>) -> ModelCreate {
    let mut model = crate::common::model(name, &path.display().to_string(), replicas);
    model.cluster_id = cluster;
    model
}

fn cluster(name: &str, provider: ClusterProvider) -> ClusterCreate {
    ClusterCreate {
        name: name.into(),
        description: String::new(),
        provider,
    }
}

/// Registers a worker with `token`; its client.
async fn join(server: &TestServer, token: &str, registration: &WorkerRegister) -> Client {
    let (registered, created) = server
        .anonymous()
        .register_worker(token, registration)
        .await
        .unwrap();
    assert!(created);
    server.client_for(&registered.credential.unwrap())
}

async fn scheduled_on(server: &TestServer, model_id: i64, count: usize) -> Vec<String> {
    let instances = server
        .wait_for_instances(model_id, &format!("{count} scheduled"), |items| {
            items.len() == count && items.iter().all(|i| i.state == InstanceState::Scheduled)
        })
        .await;
    instances
        .into_iter()
        .map(|i| i.worker_name.unwrap_or_default())
        .collect()
}

async fn each_cluster_has_its_own_token_workers_and_models(engine: TestEngine) {
    let server = TestServer::start(engine).await;
    let admin = server.client();

    let clusters = admin.list_clusters().await.unwrap();
    assert_eq!(clusters.len(), 1);
    let default = &clusters[0];
    assert!(default.is_default && default.id == DEFAULT_CLUSTER_ID);
    assert_eq!(default.state, ClusterState::Pending);
    assert!(
        default.state_message.contains("join command"),
        "{}",
        default.state_message
    );
    // The default cluster's token is the one `gantry start` joins with.
    let default_join = admin
        .cluster_registration(DEFAULT_CLUSTER_ID, None)
        .await
        .unwrap();
    assert_eq!(default_join.token, server.registration_token());
    assert_eq!(
        admin.worker_join().await.unwrap().token.as_deref(),
        Some(default_join.token.as_str())
    );

    let east = admin
        .create_cluster(&cluster("east", ClusterProvider::Custom))
        .await
        .unwrap();
    expect_error(
        admin
            .create_cluster(&cluster("east", ClusterProvider::Custom))
            .await,
        409,
        ErrorCode::Conflict,
    );
    let east_join = admin.cluster_registration(east.id, None).await.unwrap();
    assert_ne!(east_join.token, default_join.token);
    assert!(east_join.token.starts_with("gantryreg_"));
    assert_eq!(
        east_join.command,
        format!(
            "gantry worker --server-url {} --token {}",
            server.base, east_join.token
        )
    );
    assert!(east_join.kubernetes_manifests.is_none());

    let e1 = join(&server, &east_join.token, &simulated_worker("e1", 2)).await;
    let d1 = join(&server, &default_join.token, &simulated_worker("d1", 2)).await;
    let e1_worker = e1.heartbeat().await.unwrap();
    assert_eq!(e1_worker.cluster_id, east.id);
    assert_eq!(d1.heartbeat().await.unwrap().cluster_id, DEFAULT_CLUSTER_ID);
    let east_now = admin.get_cluster(east.id).await.unwrap();
    assert_eq!(east_now.state, ClusterState::Ready);
    assert_eq!(
        (
            east_now.counts.workers,
            east_now.counts.gpus,
            east_now.counts.models
        ),
        (1, 2, 0)
    );

    // Models go to their cluster's workers and nowhere else.
    let path = tiny_gguf(&server);
    let in_east = admin
        .create_model(&llama("in-east", &path, 3, Some(east.id)))
        .await
        .unwrap();
    assert_eq!(in_east.cluster_id, east.id);
    let in_default = admin
        .create_model(&llama("in-default", &path, 3, None))
        .await
        .unwrap();
    assert_eq!(in_default.cluster_id, DEFAULT_CLUSTER_ID);
    assert_eq!(scheduled_on(&server, in_east.id, 3).await, ["e1"; 3]);
    assert_eq!(scheduled_on(&server, in_default.id, 3).await, ["d1"; 3]);
    let east_instances = admin
        .list_instances(&InstanceQuery {
            cluster_id: Some(east.id),
            ..InstanceQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(east_instances.pagination.total, 3);
    assert!(east_instances.items.iter().all(|i| i.cluster_id == east.id));

    // An estimate answers for the cluster the body names.
    let estimate = admin
        .estimate_model(&llama("probe", &path, 1, Some(east.id)))
        .await
        .unwrap();
    let judged: Vec<&str> = estimate
        .workers
        .iter()
        .map(|w| w.worker_name.as_str())
        .collect();
    assert_eq!(judged, ["e1"]);

    // A cluster that is not there, and a model that would change cluster: 422.
    let message = expect_error(
        admin
            .create_model(&llama("lost", &path, 1, Some(999)))
            .await,
        422,
        ErrorCode::ValidationFailed,
    );
    assert!(
        message.contains("cluster_id") && message.contains("999"),
        "{message}"
    );
    let message = expect_error(
        admin
            .update_model(
                in_east.id,
                &ModelUpdate {
                    cluster_id: Some(DEFAULT_CLUSTER_ID),
                    ..ModelUpdate::default()
                },
            )
            .await,
        422,
        ErrorCode::ValidationFailed,
    );
    assert!(message.contains("stays in its cluster"), "{message}");

    // A rotated token stops new registrations; the registered worker keeps working.
    let rotated = admin.rotate_cluster_token(east.id, None).await.unwrap();
    assert_ne!(rotated.token, east_join.token);
    expect_error(
        server
            .anonymous()
            .register_worker(&east_join.token, &simulated_worker("e2", 1))
            .await,
        401,
        ErrorCode::Unauthorized,
    );
    e1.heartbeat().await.unwrap();
    join(&server, &rotated.token, &simulated_worker("e2", 1)).await;

    // Renamed; deleted only once empty; the default one never.
    let renamed = admin
        .update_cluster(
            east.id,
            &ClusterUpdate {
                name: Some("east-2".into()),
                ..ClusterUpdate::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(renamed.name, "east-2");
    let message = expect_error(
        admin.delete_cluster(east.id).await,
        409,
        ErrorCode::Conflict,
    );
    assert!(
        message.contains("e1") && message.contains("in-east"),
        "{message}"
    );
    expect_error(
        admin.delete_cluster(DEFAULT_CLUSTER_ID).await,
        409,
        ErrorCode::Conflict,
    );

    // A Kubernetes cluster answers the manifests with its token in them.
    let k8s = admin
        .create_cluster(&cluster("gpu-nodes", ClusterProvider::Kubernetes))
        .await
        .unwrap();
    let k8s_join = admin
        .cluster_registration(k8s.id, Some("registry.example.com/gantry:1.2"))
        .await
        .unwrap();
    let manifests = k8s_join.kubernetes_manifests.unwrap();
    assert!(manifests.contains(&format!("token: \"{}\"", k8s_join.token)));
    assert!(manifests.contains("image: \"registry.example.com/gantry:1.2\""));
    admin.delete_cluster(k8s.id).await.unwrap();
    expect_error(admin.get_cluster(k8s.id).await, 404, ErrorCode::NotFound);
    server.shutdown().await;
}

async fn a_cluster_administrator_acts_on_their_cluster_only(engine: TestEngine) {
    let server = TestServer::start(engine).await;
    let admin = server.client();
    let east = admin
        .create_cluster(&cluster("east", ClusterProvider::Custom))
        .await
        .unwrap();
    let east_token = admin
        .cluster_registration(east.id, None)
        .await
        .unwrap()
        .token;
    let e1 = join(&server, &east_token, &simulated_worker("e1", 1))
        .await
        .heartbeat()
        .await
        .unwrap();
    let d1 = join(
        &server,
        &server.registration_token(),
        &simulated_worker("d1", 1),
    )
    .await
    .heartbeat()
    .await
    .unwrap();
    let theirs = admin
        .create_model(&tiny_model("default-model", 1))
        .await
        .unwrap();

    let mut carol = user("carol", "carol-password");
    carol.cluster_admin_of = vec![999];
    let message = expect_error(
        admin.create_user(&carol).await,
        422,
        ErrorCode::ValidationFailed,
    );
    assert!(message.contains("cluster_admin_of"), "{message}");
    carol.cluster_admin_of = vec![east.id];
    let carol_user = admin.create_user(&carol).await.unwrap();
    assert_eq!(carol_user.cluster_admin_of, [east.id]);
    let carol = server.login("carol", "carol-password").await;

    let seen: Vec<String> = carol
        .list_clusters()
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.name)
        .collect();
    assert_eq!(seen, ["east"]);
    carol.get_cluster(east.id).await.unwrap();
    expect_error(
        carol.get_cluster(DEFAULT_CLUSTER_ID).await,
        403,
        ErrorCode::Forbidden,
    );
    let workers: Vec<String> = carol
        .list_workers(&WorkerQuery::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|w| w.name)
        .collect();
    assert_eq!(workers, ["e1"]);
    carol.get_worker(e1.id).await.unwrap();
    expect_error(carol.get_worker(d1.id).await, 403, ErrorCode::Forbidden);
    let labels = WorkerLabelsUpdate {
        labels: [("rack".to_owned(), "4".to_owned())].into(),
    };
    carol.set_worker_labels(e1.id, &labels).await.unwrap();
    expect_error(
        carol.set_worker_labels(d1.id, &labels).await,
        403,
        ErrorCode::Forbidden,
    );
    expect_error(carol.delete_worker(e1.id).await, 403, ErrorCode::Forbidden);

    // Models: deployed, scaled and deleted in her cluster; nowhere else.
    let mut mine = tiny_model("carols-model", 1);
    mine.cluster_id = Some(east.id);
    let mine = carol.create_model(&mine).await.unwrap();
    carol
        .update_model(
            mine.id,
            &ModelUpdate {
                replicas: Some(2),
                ..ModelUpdate::default()
            },
        )
        .await
        .unwrap();
    expect_error(
        carol.create_model(&tiny_model("elsewhere", 1)).await,
        403,
        ErrorCode::Forbidden,
    );
    expect_error(
        carol
            .update_model(
                theirs.id,
                &ModelUpdate {
                    replicas: Some(3),
                    ..ModelUpdate::default()
                },
            )
            .await,
        403,
        ErrorCode::Forbidden,
    );
    expect_error(
        carol.delete_model(theirs.id).await,
        403,
        ErrorCode::Forbidden,
    );
    carol.delete_model(mine.id).await.unwrap();

    // Clusters themselves and their tokens stay the admins'.
    expect_error(
        carol
            .create_cluster(&cluster("west", ClusterProvider::Custom))
            .await,
        403,
        ErrorCode::Forbidden,
    );
    expect_error(
        carol.cluster_registration(east.id, None).await,
        403,
        ErrorCode::Forbidden,
    );

    // A plain user sees no cluster and no worker.
    admin
        .create_user(&user("bob", "bob-password"))
        .await
        .unwrap();
    let bob = server.login("bob", "bob-password").await;
    assert!(bob.list_clusters().await.unwrap().is_empty());
    expect_error(
        bob.list_workers(&WorkerQuery::default()).await,
        403,
        ErrorCode::Forbidden,
    );

    // Taking the cluster away takes the rights with it, at once.
    admin
        .update_user(
            carol_user.id,
            &UserUpdate {
                cluster_admin_of: Some(Vec::new()),
                ..UserUpdate::default()
            },
        )
        .await
        .unwrap();
    server
        .wait_for(
            "carol's rights to go",
            || async { Ok(carol.list_clusters().await?.len()) },
            |seen| *seen == 0,
        )
        .await;
    expect_error(carol.get_worker(e1.id).await, 403, ErrorCode::Forbidden);
    server.shutdown().await;
}

/// A SQLite database and data directory as a gantry from before clusters left them: the
/// server starts on them, seals the token its data directory holds into the default
/// cluster, and the worker registered back then carries on with its credential.
#[tokio::test]
async fn a_server_from_before_clusters_starts_with_everything_in_the_default_cluster() {
    let data_dir = tempfile::tempdir().unwrap();
    let mut config = gantry_server::ServerConfig::new(data_dir.path().join("data"));
    config.host = "127.0.0.1".into();
    config.port = 0;
    config.bootstrap_password = Some(ADMIN_PASSWORD.into());
    std::fs::create_dir_all(&config.data_dir).unwrap();
    let store_config = gantry_store::StoreConfig {
        url: config.effective_database_url(),
        max_connections: 2,
    };
    gantry_store::testing::create_schema_at(&store_config, 10)
        .await
        .unwrap();
    let token = gantry_auth::secrets::generate_registration_token();
    let credential = gantry_auth::secrets::generate_worker_credential();
    std::fs::write(config.data_dir.join("registration_token"), &token).unwrap();
    let pool = sqlx::AnyPool::connect(&store_config.url).await.unwrap();
    let status = serde_json::to_string(&gantry_types::fixtures::worker_status("old", 1)).unwrap();
    sqlx::query(
        "INSERT INTO settings (key, value, created_at) VALUES ('registration_token_digest', $1, 1)",
    )
    .bind(gantry_auth::secrets::digest(&token))
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO workers (name, state, state_message, labels, address, status, \
         credential_digest, api_token, created_at, updated_at) \
         VALUES ('old', 'ready', '', '{}', '127.0.0.1:1', $1, $2, 'api', 1, 1)",
    )
    .bind(status)
    .bind(gantry_auth::secrets::digest(&credential))
    .execute(&pool)
    .await
    .unwrap();
    pool.close().await;

    let running = gantry_server::start(config).await.unwrap();
    let base = format!("http://{}", running.addr);
    let anonymous = Client::new(&base);
    let login = anonymous.login("admin", ADMIN_PASSWORD).await.unwrap();
    let admin = Client::new(&base).with_token(&login.token);
    let clusters = admin.list_clusters().await.unwrap();
    assert_eq!(clusters.len(), 1);
    assert_eq!(clusters[0].counts.workers, 1);
    let worker = Client::new(&base).with_token(&credential);
    assert_eq!(
        worker.heartbeat().await.unwrap().cluster_id,
        DEFAULT_CLUSTER_ID
    );
    let registration = admin
        .cluster_registration(DEFAULT_CLUSTER_ID, None)
        .await
        .unwrap();
    assert_eq!(
        registration.token, token,
        "the token from the data directory"
    );
    // New machines still join with the token they always did.
    let (registered, created) = anonymous
        .register_worker(&token, &simulated_worker("new", 1))
        .await
        .unwrap();
    assert!(created);
    assert_eq!(registered.worker.cluster_id, DEFAULT_CLUSTER_ID);
    running.shutdown().await;
}

test_both_engines!(
    each_cluster_has_its_own_token_workers_and_models,
    a_cluster_administrator_acts_on_their_cluster_only,
);
