//! The controllers run only while the coordinator says this server leads: driven here with
//! a `LocalCoordinator` whose role the test sets, on SQLite and PostgreSQL. That a follower
//! runs no pass however long it waits is proved in paused time by the loop's own tests
//! (`controllers::run_loop`); here a real store shows that gaining leadership starts the
//! controllers at once.

use crate::common;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use gantry_auth::jwt::JwtKeys;
use gantry_auth::{AuthConfig, Authenticator};
use gantry_coord::{Coordinator, Leadership, LocalCoordinator};
use gantry_server::cluster::Cluster;
use gantry_server::config::SchedulingMode;
use gantry_server::state::{AppState, Shared};
use gantry_server::ServerConfig;
use gantry_store::{InstanceFilter, Page, Store};
use gantry_testkit::{test_both_engines, TestDatabase, TestEngine};
use gantry_types::InstanceState;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

async fn states(store: &Store, model_id: i64) -> Vec<InstanceState> {
    let filter = InstanceFilter {
        model_id: Some(model_id),
        ..Default::default()
    };
    let page = Page {
        page: 1,
        per_page: 100,
    };
    let (instances, _) = store.list_instances(&filter, page).await.unwrap();
    instances.iter().map(|i| i.state).collect()
}

async fn controllers_run_only_while_leading(engine: TestEngine) {
    let db = TestDatabase::new(engine).await;
    let store = db.open().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    gantry_gguf::write_tiny_llama(&path).unwrap();
    common::stored_worker(&store, "w1", "digest").await;

    let coordinator = Arc::new(LocalCoordinator::new("s1"));
    coordinator.set_leadership(Leadership::Follower);
    let config = ServerConfig::new(dir.path().join("data"));
    let staging = Arc::new(gantry_server::staging::Staging::new(
        dir.path().join("data/uploads"),
        "s1".into(),
        "127.0.0.1:1".parse().unwrap(),
        b"a-test-secret-that-is-long-enough",
        gantry_source::S3Config::default(),
        None,
        1 << 30,
    ));
    let state = AppState::new(Shared {
        store: store.clone(),
        authenticator: Arc::new(Authenticator::new(
            store.clone(),
            JwtKeys::new(
                b"a-test-secret-that-is-long-enough",
                Duration::from_secs(60),
            ),
            AuthConfig::default(),
        )),
        shutdown: CancellationToken::new(),
        draining: CancellationToken::new(),
        tasks: TaskTracker::new(),
        worker_http: gantry_server::state::worker_http_client(),
        cluster: Arc::new(Cluster::new(
            SchedulingMode::Local,
            Arc::clone(&coordinator) as Arc<dyn Coordinator>,
            false,
            "http://127.0.0.1:1".into(),
        )),
        staging: Arc::clone(&staging),
        sources: gantry_server::state::model_sources(&config, &store, &staging),
        config,
        assignment_feeds: gantry_server::feeds::AssignmentFeeds::attach(&store),
        logins: Default::default(),
        provider_keys: Arc::new(gantry_auth::sealed::Sealer::provider_keys(
            b"a-test-secret-that-is-long-enough",
        )),
        registration_tokens: Arc::new(gantry_auth::sealed::Sealer::registration_tokens(
            b"a-test-secret-that-is-long-enough",
        )),
        pool_credentials: Arc::new(gantry_server::service::pools::credentials_sealer(
            b"a-test-secret-that-is-long-enough",
        )),
        histories: Default::default(),
        catalog: Default::default(),
    });
    gantry_server::controllers::spawn(&state);

    let create = common::model("tiny", &path.display().to_string(), 2);
    let model = store.create_model(&create).await.unwrap();
    assert!(
        states(&store, model.id).await.is_empty(),
        "instances are the leader's to create"
    );

    coordinator.set_leadership(Leadership::Leader { fencing_token: 2 });
    gantry_testkit::eventually(
        "the new leader to create and place both instances",
        Duration::from_secs(5),
        Duration::from_millis(50),
        || async { Ok::<_, Infallible>(states(&store, model.id).await) },
        |states| states == &[InstanceState::Scheduled; 2],
        String::new,
    )
    .await;

    state.shutdown.cancel();
    state.tasks.close();
    state.tasks.wait().await;
}

test_both_engines!(controllers_run_only_while_leading);
