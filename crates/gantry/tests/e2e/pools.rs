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
                scale_down_after: Some("10s".into()),
                ..WorkerPoolCreate::new("here", PoolProvider::Local, "1x8GiB", 2)
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

/// `kill -9` of the leader while its provider is creating three machines: the next
/// leader finds each machine by the name written before it was asked for, so exactly
/// three are made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_killed_during_a_scale_out_leaves_exactly_the_machines_asked_for() {
    let db = gantry_testkit::TestDatabase::new(gantry_testkit::TestEngine::Postgres).await;
    let commands = tempfile::tempdir().unwrap();
    // Each creation takes 5 s after the machine is made: long enough to kill the leader
    // while it waits.
    let script = commands.path().join("slow-cloud.sh");
    gantry_testkit::cloud::write_cloud_script(
        &script,
        gantry_testkit::cloud::Cloud {
            create_delay_seconds: 5,
            ..Default::default()
        },
    );
    let commands_dir = commands.path().display().to_string();
    let mut args = crate::common::ha_server_args(&db.url);
    args.extend(
        [
            "--pool-interval",
            "300ms",
            "--pool-commands-dir",
            &commands_dir,
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut servers = vec![Cluster::start(&args).await, Cluster::start(&args).await];
    let admin =
        gantry_client::Client::with_servers(servers.iter().map(|s| s.base.clone()).collect())
            .with_token(servers[0].client().token().unwrap());
    let burst = admin
        .create_cluster(&ClusterCreate::named("burst"))
        .await
        .unwrap();
    let pool = admin
        .create_pool(
            burst.id,
            &WorkerPoolCreate {
                instance_type: "gpu".into(),
                min: 3,
                command: Some("slow-cloud.sh".into()),
                ..WorkerPoolCreate::new("burst", PoolProvider::Exec, "1x80GiB", 3)
            },
        )
        .await
        .unwrap();

    // All three creations under way: the leader is killed while it waits for them.
    let created = || gantry_testkit::cloud::cloud_log(&script, "created.log");
    gantry_testkit::eventually(
        "three creations under way",
        Duration::from_secs(30),
        Duration::from_millis(50),
        || async { Ok::<_, std::convert::Infallible>(created().len()) },
        |n| *n == 3,
        String::new,
    )
    .await;
    let http = reqwest::Client::new();
    let status: gantry_types::ClusterStatus = gantry_testkit::answer_json(
        http.get(format!("{}/api/v1/coordinator/cluster", servers[0].base))
            .bearer_auth(admin.token().unwrap()),
    )
    .await;
    let leader_id = status.leader.server_id.expect("someone leads");
    let index = servers
        .iter()
        .position(|s| format!("server-{}", s.base.rsplit(':').next().unwrap()) == leader_id)
        .expect("the leader is one of ours");
    let mut leader = servers.remove(index);
    leader.server.signal(nix::sys::signal::Signal::SIGKILL);
    let _ = leader.server.child.take().map(|mut c| c.wait());
    admin.set_servers(vec![servers[0].base.clone()]);

    let adopted = poll(
        "the new leader to find the three machines",
        Duration::from_secs(60),
        &[&servers[0].server],
        || admin.get_pool(burst.id, pool.id),
        |p: &gantry_types::WorkerPool| {
            p.machines.len() == 3
                && p.machines
                    .iter()
                    .all(|m| m.state == MachineState::Initializing)
        },
    )
    .await;
    let mut names: Vec<&str> = adopted.machines.iter().map(|m| m.name.as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, ["burst-1", "burst-2", "burst-3"]);
    assert_eq!(
        created(),
        ["burst-1", "burst-2", "burst-3"],
        "each made once"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(created().len(), 3, "and no more since");
    let events = admin.pool_events(burst.id, pool.id).await.unwrap();
    assert!(
        events
            .iter()
            .any(|e| e.message.contains("found at the provider")),
        "{events:?}"
    );
}
