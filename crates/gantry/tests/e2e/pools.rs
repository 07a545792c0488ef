//! A `local` worker pool end to end, everything real: a model that fits nowhere (its
//! cluster has no worker) grows the pool, which starts a `gantry worker` process with a
//! simulated GPU; it registers, runs the model on a real `llama-server` and answers
//! through the gateway; once the model is deleted the machine hosts nothing, and after
//! the pool's idle time it is drained and its process stopped.

use std::time::Duration;

use crate::common::{poll, tiny_model, Cluster};
use gantry_types::{
    ClusterCreate, ClusterProvider, InstanceState, MachineState, PoolProvider, WorkerPoolCreate,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_pool_grows_for_a_model_serves_it_and_shrinks_when_it_goes() {
    let ports = gantry_testkit::reserve_ports(20);
    let port_range = format!("{}-{}", ports.start(), ports.end());
    let dir = tempfile::tempdir().unwrap();
    let models = dir.path().display().to_string();
    let cluster = Cluster::start_in(
        dir,
        &[
            "--pool-interval",
            "500ms",
            "--local-pool-port-range",
            &port_range,
        ],
        // The pool's workers are started by the server and inherit its environment.
        &[
            (
                "GANTRY_LLAMA_SERVER_PATH",
                gantry_testkit::llama_server().display().to_string(),
            ),
            ("GANTRY_MODEL_DIRS", models),
        ],
    )
    .await;
    let admin = cluster.client();
    let burst = admin
        .create_cluster(&ClusterCreate {
            name: "burst".into(),
            description: "grows on demand".into(),
            provider: ClusterProvider::Custom,
        })
        .await
        .unwrap();
    let pool = admin
        .create_pool(
            burst.id,
            &WorkerPoolCreate {
                name: "here".into(),
                provider: PoolProvider::Local,
                instance_type: String::new(),
                image: String::new(),
                region: String::new(),
                gpus: "1x8GiB".into(),
                memory: None,
                labels: Default::default(),
                min: 0,
                max: 2,
                scale_down_after: Some("10s".into()),
                command: None,
                api_url: None,
                credentials: None,
            },
        )
        .await
        .unwrap();

    let mut model = crate::common::tiny_model_create("tiny", &tiny_model(cluster.dir.path()), 1);
    model.cluster_id = Some(burst.id);
    let model = admin.create_model(&model).await.unwrap();
    let logs = [&cluster.server];
    let running = crate::common::instances_of(
        admin,
        model.id,
        "running on a machine the pool made",
        Duration::from_secs(120),
        &logs,
        |items| items.len() == 1 && items[0].state == InstanceState::Running,
    )
    .await;
    assert_eq!(running[0].worker_name.as_deref(), Some("here-1"));
    let grown = admin.get_pool(burst.id, pool.id).await.unwrap();
    assert_eq!(grown.machines.len(), 1, "{grown:?}");
    assert_eq!(grown.machines[0].state, MachineState::Registered);
    let pid: i32 = grown.machines[0]
        .external_id
        .as_deref()
        .unwrap()
        .parse()
        .unwrap();
    let answer = cluster.chat_via_gateway("tiny").await;
    assert!(
        answer["choices"][0]["message"]["content"].is_string(),
        "{answer}"
    );
    let events = admin.pool_events(burst.id, pool.id).await.unwrap();
    assert!(
        events
            .iter()
            .any(|e| e.kind == "scale_up" && e.message.contains("1 pending replica(s) of tiny")),
        "{events:?}"
    );

    // The model goes: 10 s later the machine is drained, its worker stopped and gone.
    admin.delete_model(model.id).await.unwrap();
    poll(
        "the idle machine to be deleted",
        Duration::from_secs(60),
        &logs,
        || admin.get_pool(burst.id, pool.id),
        |p: &gantry_types::WorkerPool| p.machines.is_empty(),
    )
    .await;
    crate::common::wait_gone(
        &[pid],
        "the pool's worker process to stop",
        Duration::from_secs(30),
    )
    .await;
    let workers = admin
        .list_workers(&gantry_types::WorkerQuery {
            cluster_id: Some(burst.id),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(workers.pagination.total, 0);
    let events = admin.pool_events(burst.id, pool.id).await.unwrap();
    assert!(events.iter().any(|e| e.kind == "scale_down"), "{events:?}");
}
