//! Providers, routes, API-key limits and the shared per-key load, on both engines.

use std::collections::BTreeMap;
use std::time::Duration;

use gantry_store::{Change, ChangeKind, KeyLoad, NewApiKey, NewUser, ProviderFields, StoreError};
use gantry_testkit::{test_both_engines, TestDatabase, TestEngine};
use gantry_types::{ApiKeyLimits, Role, RouteTarget, Timestamp};

fn fields(url: &str) -> ProviderFields {
    ProviderFields {
        description: String::new(),
        base_url: url.into(),
        api_key_sealed: Some("v1.sealed".into()),
        headers: BTreeMap::from([("x-org".into(), "team".into())]),
        timeout_seconds: 30,
        models: vec!["m1".into()],
    }
}

fn target(model: &str, provider: Option<&str>, weight: u32) -> RouteTarget {
    RouteTarget {
        model: model.into(),
        provider: provider.map(str::to_string),
        weight,
        priority: 0,
    }
}

async fn providers_and_routes_are_stored_changed_and_guarded(engine: TestEngine) {
    let db = TestDatabase::new(engine).await;
    let store = db.open().await;
    let mut changes = store.subscribe();

    let provider = store
        .create_provider("hosted", &fields("https://api.example.com/v1"))
        .await
        .unwrap();
    assert!(provider.provider.has_api_key);
    assert_eq!(provider.api_key_sealed.as_deref(), Some("v1.sealed"));
    assert!(matches!(
        store.create_provider("hosted", &fields("http://x")).await,
        Err(StoreError::Conflict { .. })
    ));
    let change = changes.recv().await.unwrap();
    assert!(matches!(&*change, Change::Provider(ChangeKind::Created, p) if p.name == "hosted"));

    // A change written over what was read; a stale read is refused.
    let mut changed = fields("https://api.example.com/v2");
    changed.api_key_sealed = None;
    let updated = store
        .update_provider("hosted", provider.provider.updated_at, &changed)
        .await
        .unwrap();
    assert!(!updated.provider.has_api_key);
    assert_eq!(updated.provider.base_url, "https://api.example.com/v2");
    assert!(matches!(
        store
            .update_provider("hosted", provider.provider.updated_at, &changed)
            .await,
        Err(StoreError::Conflict { .. })
    ));

    let route = store
        .create_route(
            "chat",
            "",
            &[target("qwen", None, 3), target("m1", Some("hosted"), 1)],
        )
        .await
        .unwrap();
    assert_eq!(route.targets.len(), 2);
    let route = store
        .update_route(
            "chat",
            route.updated_at,
            "main chat",
            &[target("m1", Some("hosted"), 1)],
        )
        .await
        .unwrap();
    assert_eq!(store.get_route("chat").await.unwrap(), route);
    assert_eq!(store.list_routes().await.unwrap().len(), 1);

    // A provider a route uses cannot go; once the route is gone, it can.
    let Err(StoreError::InUse { by, .. }) = store.delete_provider("hosted").await else {
        panic!("deleted a provider a route uses");
    };
    assert!(by.contains("chat"), "{by}");
    store.delete_route("chat").await.unwrap();
    store.delete_provider("hosted").await.unwrap();
    assert!(store.list_providers().await.unwrap().is_empty());
}

async fn key_limits_and_shared_load_round_trip(engine: TestEngine) {
    let db = TestDatabase::new(engine).await;
    let store = db.open().await;
    let user = store
        .create_user(&NewUser {
            cluster_admin_of: Vec::new(),
            username: "u".into(),
            password_hash: "x".into(),
            role: Role::User,
            full_name: String::new(),
            require_password_change: false,
        })
        .await
        .unwrap();
    let limits = ApiKeyLimits {
        allowed_routes: Some(vec!["chat".into()]),
        requests_per_minute: Some(60),
        tokens_per_minute: None,
    };
    let key = store
        .create_api_key(&NewApiKey {
            user_id: user.id,
            name: "k".into(),
            description: String::new(),
            access_key: "a1".into(),
            lookup_digest: "d1".into(),
            secret_hash: "h".into(),
            expires_at: None,
            limits: limits.clone(),
        })
        .await
        .unwrap();
    assert_eq!(key.limits, limits);
    assert_eq!(store.limited_api_keys().await.unwrap().len(), 1);
    let lifted = store
        .update_api_key(key.id, "now free", &ApiKeyLimits::default())
        .await
        .unwrap();
    assert_eq!(lifted.limits, ApiKeyLimits::default());
    assert_eq!(lifted.description, "now free");
    assert!(store.limited_api_keys().await.unwrap().is_empty());

    // Each server's load replaces its own rows; a server reads only the others'.
    let load = |id, requests, tokens| KeyLoad {
        api_key_id: id,
        requests,
        tokens,
    };
    store
        .publish_key_load("s1", &[load(1, 10, 100)])
        .await
        .unwrap();
    store
        .publish_key_load("s2", &[load(1, 5, 50), load(2, 1, 0)])
        .await
        .unwrap();
    let since = Timestamp::now().minus(Duration::from_secs(5));
    let mut others = store.key_load_of_others("s1", since).await.unwrap();
    others.sort_by_key(|l| l.api_key_id);
    assert_eq!(others, vec![load(1, 5, 50), load(2, 1, 0)]);
    store.publish_key_load("s2", &[]).await.unwrap();
    assert!(store
        .key_load_of_others("s1", since)
        .await
        .unwrap()
        .is_empty());
    let mine = store.key_load_of_others("s2", since).await.unwrap();
    assert_eq!(mine, vec![load(1, 10, 100)]);
}

test_both_engines!(
    providers_and_routes_are_stored_changed_and_guarded,
    key_limits_and_shared_load_round_trip,
);
