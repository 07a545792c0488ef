//! `gantry start`: a server and a worker in one process on an embedded SQLite database,
//! as a newcomer runs it. The API is called through the typed client; the backend's own
//! OpenAI API ([`common::chat`]) with raw HTTP.

use crate::common;

use std::time::Duration;

use crate::common::{
    admin_client, chat, descendants, instances_of, manual_model_create, poll, tiny_model,
};
use gantry_types::{ChangePasswordRequest, InstancePatch, InstanceState, LogQuery, WorkerQuery};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gantry_start_serves_writes_bootstrap_files_and_runs_a_model() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (mut gantry, base) = common::start_gantry(dir.path(), &["--simulate-gpus", "1x8GiB"]).await;
    let http = reqwest::Client::new();

    // The bootstrap files, private to the owner.
    use std::os::unix::fs::PermissionsExt;
    for file in ["initial_admin_password", "registration_token"] {
        let meta = std::fs::metadata(data.join(file)).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600, "{file}");
    }
    let password = std::fs::read_to_string(data.join("initial_admin_password")).unwrap();
    let first = admin_client(&base, password.trim()).await;
    let change = ChangePasswordRequest {
        current_password: password.trim().into(),
        new_password: "a-better-password".into(),
    };
    let changed = first.change_password(&change).await.unwrap();
    let admin = first.for_token(changed.token);

    // The embedded worker joined on its own.
    let all_workers = WorkerQuery::default();
    let workers = poll(
        "the embedded worker to join",
        Duration::from_secs(10),
        &[&gantry],
        || admin.list_workers(&all_workers),
        |list| list.pagination.total == 1,
    )
    .await;
    let worker = &workers.items[0];
    assert!(worker.status.gpus[0].simulated);

    let model = tiny_model(dir.path());
    let created = admin
        .create_model(&manual_model_create("tiny", &model, 1))
        .await
        .unwrap();
    // The model controller creates the instance a moment after the model.
    let instances = instances_of(
        &admin,
        created.id,
        "1 in number",
        Duration::from_secs(5),
        &[&gantry],
        |instances| instances.len() == 1,
    )
    .await;
    let id = instances[0].id;
    let patch = InstancePatch {
        worker_id: Some(Some(worker.id)),
        gpu_indexes: Some(vec![0]),
    };
    admin.place_instance(id, &patch).await.unwrap();
    let instance = poll(
        "the instance to run",
        Duration::from_secs(60),
        &[&gantry],
        || admin.get_instance(id),
        |instance| instance.state == InstanceState::Running,
    )
    .await;
    chat(&http, instance.address.as_deref().unwrap()).await;

    // Following the log streams what is there and keeps the response open.
    let followed = LogQuery {
        tail: Some(5),
        follow: Some(true),
        timeout_seconds: None,
    };
    let mut follow = admin.instance_logs(id, &followed).await.unwrap();
    let first = tokio::time::timeout(Duration::from_secs(10), follow.chunk())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(!first.is_empty());
    drop(follow);

    // SIGTERM: backends stopped, exit 0, nothing left behind.
    let children = descendants(gantry.pid());
    assert!(!children.is_empty());
    gantry.terminate_cleanly(Duration::from_secs(40));
    for child in children {
        assert!(!common::alive(child), "child {child} outlived gantry start");
    }
}
