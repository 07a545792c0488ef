//! The authenticator against a real store, on SQLite and PostgreSQL: each kind of
//! credential, a deleted key refused at once through the change feed, and last-used
//! times written by the flusher (at the latest at shutdown), never by the request.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use gantry_auth::jwt::JwtKeys;
use gantry_auth::secrets::{digest, generate_worker_credential, GeneratedApiKey};
use gantry_auth::{password, AuthConfig, AuthError, Authenticator, Principal};
use gantry_store::{NewApiKey, NewUser, Store};
use gantry_testkit::{test_both_engines, TestDatabase, TestEngine};
use gantry_types::{ApiKey, Role, Timestamp, User};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

struct Fixture {
    db: TestDatabase,
    store: Store,
    authenticator: Arc<Authenticator>,
    shutdown: CancellationToken,
    tasks: TaskTracker,
    user: User,
}

impl Fixture {
    async fn new(engine: TestEngine) -> Self {
        let db = TestDatabase::new(engine).await;
        let store = db.open().await;
        let user = store
            .create_user(&NewUser {
                cluster_admin_of: Vec::new(),
                username: "alice".into(),
                password_hash: password::hash("alice-password".into()).await.unwrap(),
                role: Role::User,
                full_name: String::new(),
                require_password_change: false,
            })
            .await
            .unwrap();
        let authenticator = Arc::new(Authenticator::new(
            store.clone(),
            JwtKeys::new(
                b"a-test-secret-that-is-long-enough",
                Duration::from_secs(60),
            ),
            AuthConfig::default(),
        ));
        let shutdown = CancellationToken::new();
        let tasks = TaskTracker::new();
        authenticator.spawn(&shutdown, &tasks);
        Self {
            db,
            store,
            authenticator,
            shutdown,
            tasks,
            user,
        }
    }

    async fn api_key(&self, name: &str, expires_at: Option<Timestamp>) -> (String, ApiKey) {
        let generated = GeneratedApiKey::generate();
        let full = generated.full();
        let key = self
            .store
            .create_api_key(&NewApiKey {
                user_id: self.user.id,
                name: name.into(),
                description: String::new(),
                access_key: generated.access.clone(),
                lookup_digest: digest(&full),
                secret_hash: password::hash(generated.secret.clone()).await.unwrap(),
                expires_at,
                limits: Default::default(),
            })
            .await
            .unwrap();
        (full, key)
    }

    /// Stops the background tasks; the store stays usable, with its database kept until
    /// the returned guard drops.
    async fn stop(self) -> (Store, TestDatabase) {
        self.shutdown.cancel();
        self.tasks.close();
        self.tasks.wait().await;
        (self.store, self.db)
    }
}

async fn credentials_resolve_to_their_principal(engine: TestEngine) {
    let fx = Fixture::new(engine).await;
    let (key, record) = fx.api_key("k", None).await;
    // The first use verifies with argon2, the second is served from the cache: both
    // are the same key of the same user.
    for _ in 0..2 {
        let Principal::User { user, api_key_id } =
            fx.authenticator.authenticate(&key).await.unwrap()
        else {
            panic!("an API key is a user");
        };
        assert_eq!((user.id, api_key_id), (fx.user.id, Some(record.id)));
    }
    assert_eq!(fx.authenticator.api_keys().len(), 1);

    let wrong = format!("{}x", key);
    assert!(matches!(
        fx.authenticator.authenticate(&wrong).await,
        Err(AuthError::InvalidApiKey)
    ));

    let (expired, _) = fx.api_key("old", Some(Timestamp::from_millis(1_000))).await;
    let error = fx.authenticator.authenticate(&expired).await.unwrap_err();
    assert!(matches!(error, AuthError::ApiKeyExpired { .. }), "{error}");
    assert!(
        error.to_string().starts_with("API key old expired at"),
        "{error}"
    );

    let (session, _) = fx
        .authenticator
        .jwt()
        .issue(fx.user.id, "alice", Role::User, 1)
        .unwrap();
    let principal = fx.authenticator.authenticate(&session).await.unwrap();
    assert!(matches!(
        principal,
        Principal::User {
            api_key_id: None,
            ..
        }
    ));
    fx.store.bump_session_version(fx.user.id).await.unwrap();
    assert!(matches!(
        fx.authenticator.authenticate(&session).await,
        Err(AuthError::SessionEnded)
    ));
    assert!(matches!(
        fx.authenticator.authenticate("not-a-token").await,
        Err(AuthError::InvalidSessionToken(_))
    ));
    assert!(matches!(
        fx.authenticator
            .authenticate(&generate_worker_credential())
            .await,
        Err(AuthError::UnknownWorkerCredential)
    ));
    fx.stop().await;
}

async fn a_deleted_key_is_refused_once_the_change_arrives(engine: TestEngine) {
    let fx = Fixture::new(engine).await;
    let (key, record) = fx.api_key("k", None).await;
    fx.authenticator.authenticate(&key).await.unwrap();
    fx.store.delete_api_key(record.id).await.unwrap();
    // The change feed reaches the cache through the authenticator's task; the cache
    // must not serve the key for its whole freshness window.
    let mut refused = false;
    for _ in 0..100 {
        if fx.authenticator.authenticate(&key).await.is_err() {
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(refused, "a deleted key keeps working from the cache");
    fx.stop().await;
}

async fn a_deleted_workers_credential_is_refused_by_the_next_request(engine: TestEngine) {
    let fx = Fixture::new(engine).await;
    let credential = generate_worker_credential();
    let worker = fx
        .store
        .create_worker(
            "w1",
            &Default::default(),
            "127.0.0.1:1",
            &Default::default(),
            &digest(&credential),
        )
        .await
        .unwrap();
    // The second call is served from the worker credential cache.
    for _ in 0..2 {
        let Principal::Worker {
            worker_id,
            worker_name,
        } = fx.authenticator.authenticate(&credential).await.unwrap()
        else {
            panic!("a worker credential is a worker");
        };
        assert_eq!((worker_id, worker_name.as_str()), (worker.id, "w1"));
    }
    fx.store.delete_worker(worker.id).await.unwrap();
    // The store's change reaches the cache inline, before the delete returns.
    assert!(matches!(
        fx.authenticator.authenticate(&credential).await,
        Err(AuthError::UnknownWorkerCredential)
    ));
    fx.stop().await;
}

async fn last_used_times_are_written_by_the_flusher_not_the_request(engine: TestEngine) {
    let fx = Fixture::new(engine).await;
    let (key, record) = fx.api_key("k", None).await;
    let before = Timestamp::now();
    for _ in 0..5 {
        fx.authenticator.authenticate(&key).await.unwrap();
    }
    assert_eq!(
        fx.store.get_api_key(record.id).await.unwrap().last_used_at,
        None,
        "the request path wrote to the store"
    );
    let (store, _db) = fx.stop().await;
    let last_used = store
        .get_api_key(record.id)
        .await
        .unwrap()
        .last_used_at
        .expect("the flush at shutdown writes the last use");
    assert!(last_used >= before, "{last_used} < {before}");
}

test_both_engines!(
    credentials_resolve_to_their_principal,
    a_deleted_key_is_refused_once_the_change_arrives,
    a_deleted_workers_credential_is_refused_by_the_next_request,
    last_used_times_are_written_by_the_flusher_not_the_request,
);
