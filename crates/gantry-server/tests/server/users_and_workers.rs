//! What keeps the cluster administrable and how it grows, over HTTP on SQLite and
//! PostgreSQL: the last admin keeps the role however it is asked (and however many ask at
//! once), and an admin reads the command that joins a machine as a worker.

use crate::common::{expect_error, user, TestServer};
use gantry_testkit::{test_both_engines, TestEngine};
use gantry_types::{ErrorCode, Role, UserUpdate};

/// The last admin keeps the role, whoever asks: demoting them is refused with a sentence
/// that names them, and two admins demoting or deleting each other at once leave one.
async fn the_last_admin_keeps_the_role(engine: TestEngine) {
    let server = TestServer::start(engine).await;
    let admin = server.client();
    let demote = UserUpdate {
        role: Some(Role::User),
        ..UserUpdate::default()
    };
    let promote = UserUpdate {
        role: Some(Role::Admin),
        ..UserUpdate::default()
    };
    let message = expect_error(
        admin.update_user(1, &demote).await,
        409,
        ErrorCode::Conflict,
    );
    assert!(
        message.contains("admin is the last admin") && message.contains("make another user"),
        "{message}"
    );
    assert_eq!(admin.me().await.unwrap().role, Role::Admin);
    let message = expect_error(admin.delete_user(1).await, 409, ErrorCode::Conflict);
    assert!(message.contains("yourself"), "{message}");
    // What leaves the role alone is not refused.
    let renamed = UserUpdate {
        full_name: Some("Ada Admin".into()),
        ..UserUpdate::default()
    };
    let ada = admin.update_user(1, &renamed).await.unwrap();
    assert_eq!(
        (ada.role, ada.full_name.as_str()),
        (Role::Admin, "Ada Admin")
    );

    // With a second admin either may be demoted, and then the other is the last.
    let carol = admin
        .create_user(&user("carol", "carol-password"))
        .await
        .unwrap();
    admin.update_user(carol.id, &promote).await.unwrap();
    let carol_client = server.login("carol", "carol-password").await;
    carol_client.update_user(1, &demote).await.unwrap();
    let message = expect_error(
        carol_client.update_user(carol.id, &demote).await,
        409,
        ErrorCode::Conflict,
    );
    assert!(message.contains("carol is the last admin"), "{message}");
    carol_client.update_user(1, &promote).await.unwrap();

    // Two admins demoting each other at once: one wins, the other is refused (409, or
    // 403 when it was demoted before its request was authorised).
    let store = &server.state().store;
    for round in 0..5 {
        let (first, second) = tokio::join!(
            admin.update_user(carol.id, &demote),
            carol_client.update_user(1, &demote)
        );
        let won = [first.is_ok(), second.is_ok()];
        assert_eq!(
            won.iter().filter(|w| **w).count(),
            1,
            "round {round}: {first:?} {second:?}"
        );
        for refused in [first, second].into_iter().filter_map(Result::err) {
            assert!(
                matches!(refused.status(), Some(409 | 403)),
                "round {round}: {refused}"
            );
        }
        assert_eq!(store.count_admins().await.unwrap(), 1, "round {round}");
        let winner = if won[0] { admin } else { &carol_client };
        let loser = if won[0] { carol.id } else { 1 };
        winner.update_user(loser, &promote).await.unwrap();
    }
    // The same for deleting each other: the one left is an admin.
    let (first, second) = tokio::join!(admin.delete_user(carol.id), carol_client.delete_user(1));
    assert_eq!(
        [first.is_ok(), second.is_ok()]
            .iter()
            .filter(|w| **w)
            .count(),
        1,
        "{first:?} {second:?}"
    );
    assert_eq!(store.count_admins().await.unwrap(), 1);
    server.shutdown().await;
}

/// An admin reads how a machine joins the default cluster: the servers and its
/// registration token, as one `gantry worker` command; no one else does. The token comes
/// from the database (sealed), so what the data directory's file holds does not matter.
async fn admins_see_how_a_worker_joins(engine: TestEngine) {
    let server = TestServer::start(engine).await;
    let admin = server.client();
    let token_file = server.data_path("registration_token");
    let token = std::fs::read_to_string(&token_file).unwrap();
    let token = token.trim();
    let join = admin.worker_join().await.unwrap();
    assert_eq!(join.server_urls, vec![server.base.clone()]);
    assert_eq!(join.token.as_deref(), Some(token));
    assert_eq!(
        join.command,
        Some(format!(
            "gantry worker --server-url {} --token {token}",
            server.base
        ))
    );

    admin
        .create_user(&user("bob", "bob-password"))
        .await
        .unwrap();
    let bob = server.login("bob", "bob-password").await;
    expect_error(bob.worker_join().await, 403, ErrorCode::Forbidden);

    // A file that is not the cluster's token (copied from elsewhere), or none, changes
    // nothing: every server shows the one token.
    std::fs::write(&token_file, "gantryreg_notthetoken").unwrap();
    let join = admin.worker_join().await.unwrap();
    assert_eq!(join.token.as_deref(), Some(token));
    std::fs::remove_file(&token_file).unwrap();
    let join = admin.worker_join().await.unwrap();
    assert_eq!(join.token.as_deref(), Some(token));
    assert_eq!(join.server_urls, vec![server.base.clone()]);
    server.shutdown().await;
}

test_both_engines!(the_last_admin_keeps_the_role, admins_see_how_a_worker_joins);
