//! Worker pools through the API and the leader's pool loop, with the `exec` provider and a
//! real script as the cloud: replicas that fit nowhere grow the pool by as many machines
//! as they need (up to `max`, and saying so past it), each machine's worker registers (the
//! test boots it: registers a simulated worker under the machine's name with the
//! cluster's token), the replicas are placed there, and machines that host nothing for
//! `scale_down_after` are drained and deleted. A provider's failure is retried with its
//! words shown; a deleted pool deletes its machines.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::{simulated_worker, Options, TestServer};
use gantry_client::Client;
use gantry_testkit::cloud::{cloud_log, write_cloud_script, Cloud};
use gantry_testkit::{test_both_engines, TestEngine};
use gantry_types::{
    ClusterCreate, InstanceState, MachineState, ModelCreate, ModelUpdate, PoolProvider, WorkerPool,
    WorkerPoolCreate,
};

const LONG_WAIT: Duration = Duration::from_secs(60);

/// The cloud's script, in the server's `pool_commands_dir`.
fn script(server: &TestServer) -> PathBuf {
    let dir = server.data_path("pool-commands");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("cloud.sh");
    write_cloud_script(
        &path,
        Cloud {
            fail_names_starting: Some(("bad", "out of capacity: no GPUs left in region lab-1")),
            ..Cloud::default()
        },
    );
    path
}

/// A vLLM model whose one instance takes most of an 80 GiB GPU (vLLM claims 90 % of
/// each GPU it is given), so each replica needs a machine of its own.
fn vllm_model(server: &TestServer, name: &str, replicas: u32, cluster: i64) -> ModelCreate {
    let dir = server.data_dir.path().join("small-vllm");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("config.json"),
        r#"{"hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 16,
            "num_key_value_heads": 8, "max_position_embeddings": 4096}"#,
    )
    .unwrap();
    let header =
        r#"{"w": {"dtype": "BF16", "shape": [1000, 1000000], "data_offsets": [0, 2000000000]}}"#;
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    std::fs::write(dir.join("model.safetensors"), bytes).unwrap();
    let mut model: ModelCreate = serde_json::from_value(serde_json::json!({
        "name": name,
        "source": {"type": "local_path", "path": dir.display().to_string()},
        "backend": "vllm",
        "replicas": replicas,
    }))
    .unwrap();
    model.cluster_id = Some(cluster);
    model
}

fn exec_pool(name: &str, command: &Path, min: u32, max: u32) -> WorkerPoolCreate {
    WorkerPoolCreate {
        instance_type: "gpu-80g".into(),
        image: "ubuntu-gpu".into(),
        region: "lab-1".into(),
        memory: Some("64GiB".into()),
        labels: [("tier".to_owned(), "burst".to_owned())].into(),
        min,
        scale_down_after: Some("10s".into()),
        command: Some(format!(
            "{} --region lab-1",
            command.file_name().unwrap().to_str().unwrap()
        )),
        credentials: Some("lab-secret".into()),
        ..WorkerPoolCreate::new(name, PoolProvider::Exec, "1x80GiB", max)
    }
}

/// A server whose leader looks at the pools every 200 ms, with the cloud's script in its
/// `pool_commands_dir`.
async fn start(engine: TestEngine) -> (TestServer, PathBuf) {
    let server = TestServer::start_with(
        engine,
        Options {
            configure: |config| config.pool_interval = Duration::from_millis(200),
            ..Options::default()
        },
    )
    .await;
    let cloud = script(&server);
    (server, cloud)
}

async fn pool_until(
    server: &TestServer,
    cluster: i64,
    pool: i64,
    what: &str,
    done: impl Fn(&WorkerPool) -> bool,
) -> WorkerPool {
    let admin = server.client();
    gantry_testkit::eventually(
        what,
        LONG_WAIT,
        Duration::from_millis(100),
        || admin.get_pool(cluster, pool),
        done,
        String::new,
    )
    .await
}

fn in_state(pool: &WorkerPool, state: MachineState) -> usize {
    pool.machines.iter().filter(|m| m.state == state).count()
}

/// Boots a machine: its worker registers with the cluster's token under its name and
/// keeps sending heartbeats.
async fn boot(server: &TestServer, token: &str, name: &str) -> tokio::task::JoinHandle<()> {
    let mut registration = simulated_worker(name, 1);
    registration.labels = [
        ("tier".to_owned(), "burst".to_owned()),
        ("gantry.dev/pool".to_owned(), "burst".to_owned()),
    ]
    .into();
    let (registered, _) = server
        .anonymous()
        .register_worker(token, &registration)
        .await
        .unwrap();
    let worker: Client = server.client_for(&registered.credential.unwrap());
    tokio::spawn(async move {
        loop {
            let _ = worker.heartbeat().await;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
}

async fn a_pool_follows_demand_and_gives_idle_machines_back(engine: TestEngine) {
    let (server, cloud) = start(engine).await;
    let admin = server.client();
    let burst = admin
        .create_cluster(&ClusterCreate::named("burst"))
        .await
        .unwrap();
    let token = admin
        .cluster_registration(burst.id, None)
        .await
        .unwrap()
        .token;
    let pool = admin
        .create_pool(burst.id, &exec_pool("burst", &cloud, 0, 3))
        .await
        .unwrap();
    assert!(pool.has_credentials && pool.machines.is_empty());
    assert_eq!(pool.scale_down_after, "10s");

    // Two replicas that fit nowhere (the cluster has no worker), each needing a GPU.
    let model = admin
        .create_model(&vllm_model(&server, "small", 2, burst.id))
        .await
        .unwrap();
    let grown = pool_until(&server, burst.id, pool.id, "two machines made", |p| {
        in_state(p, MachineState::Initializing) == 2
    })
    .await;
    let names: Vec<String> = grown.machines.iter().map(|m| m.name.clone()).collect();
    assert_eq!(names, ["burst-1", "burst-2"]);
    let coming = admin.get_cluster(burst.id).await.unwrap();
    assert_eq!(coming.state, gantry_types::ClusterState::Provisioning);
    assert_eq!(coming.counts.machines_on_the_way, 2);
    assert_eq!(grown.machines[0].external_id.as_deref(), Some("vm-burst-1"));
    let request: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(cloud.parent().unwrap().join("machines/burst-1.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(request["cluster_token"], token.as_str());
    assert_eq!(request["labels"]["gantry.dev/pool"], "burst");
    let events = admin.pool_events(burst.id, pool.id).await.unwrap();
    assert!(
        events.iter().any(|e| e.kind == "scale_up"
            && e.message.contains("2 pending replica(s) of small")
            && e.message.contains("adding 2")),
        "{events:?}"
    );

    // The machines boot; the replicas land on them, one each.
    let mut beats = Vec::new();
    for name in &names {
        beats.push(boot(&server, &token, name).await);
    }
    pool_until(
        &server,
        burst.id,
        pool.id,
        "both machines registered",
        |p| in_state(p, MachineState::Registered) == 2,
    )
    .await;
    let placed = server
        .wait_for_instances(model.id, "scheduled on the new machines", |items| {
            items.len() == 2 && items.iter().all(|i| i.state == InstanceState::Scheduled)
        })
        .await;
    let mut hosts: Vec<String> = placed
        .iter()
        .map(|i| i.worker_name.clone().unwrap())
        .collect();
    hosts.sort();
    assert_eq!(hosts, names);

    // Four replicas need two more machines; the pool stops at its max of 3 and says so.
    admin
        .update_model(
            model.id,
            &ModelUpdate {
                replicas: Some(4),
                ..ModelUpdate::default()
            },
        )
        .await
        .unwrap();
    let at_max = pool_until(&server, burst.id, pool.id, "a third machine", |p| {
        p.machines.len() == 3
    })
    .await;
    assert_eq!(at_max.machines[2].name, "burst-3");
    gantry_testkit::eventually(
        "the pool to say it is at its max",
        LONG_WAIT,
        Duration::from_millis(100),
        || admin.pool_events(burst.id, pool.id),
        |events| {
            events
                .iter()
                .any(|e| e.kind == "waiting" && e.message.contains("at its max of 3"))
        },
        String::new,
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        admin
            .get_pool(burst.id, pool.id)
            .await
            .unwrap()
            .machines
            .len(),
        3
    );

    // The model goes; after 10 s of hosting nothing every machine is deleted (min 0).
    beats.push(boot(&server, &token, "burst-3").await);
    admin.delete_model(model.id).await.unwrap();
    let emptied = pool_until(&server, burst.id, pool.id, "every machine deleted", |p| {
        p.machines.is_empty()
    })
    .await;
    assert!(emptied.machines.is_empty());
    assert_eq!(
        cloud_log(&cloud, "deleted.log"),
        ["burst-1", "burst-2", "burst-3"]
    );
    let events = admin.pool_events(burst.id, pool.id).await.unwrap();
    assert!(
        events
            .iter()
            .any(|e| e.kind == "scale_down" && e.message.contains("hosted nothing for 10s")),
        "{events:?}"
    );
    let workers = admin
        .list_workers(&gantry_types::WorkerQuery {
            cluster_id: Some(burst.id),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(workers.pagination.total, 0, "their workers went with them");
    for beat in beats {
        beat.abort();
    }

    // A model no machine of the pool could hold does not grow it, and says why.
    let mut huge = vllm_model(&server, "huge", 1, burst.id);
    huge.source = gantry_types::ModelSource::LocalPath {
        path: crate::common::huge_safetensors_dir(&server)
            .display()
            .to_string(),
    };
    admin.create_model(&huge).await.unwrap();
    gantry_testkit::eventually(
        "the pool to say the huge model fits no machine",
        LONG_WAIT,
        Duration::from_millis(100),
        || admin.pool_events(burst.id, pool.id),
        |events| {
            events.iter().any(|e| {
                e.kind == "waiting" && e.message.contains("would not fit a new 1x80GiB machine")
            })
        },
        String::new,
    )
    .await;
    assert!(admin
        .get_pool(burst.id, pool.id)
        .await
        .unwrap()
        .machines
        .is_empty());
    server.shutdown().await;
}

async fn a_failing_provider_is_retried_with_its_words_and_a_deleted_pool_goes(engine: TestEngine) {
    let (server, cloud) = start(engine).await;
    let admin = server.client();
    // `min` machines are kept whatever the demand; this cloud has no capacity for them.
    let pool = admin
        .create_pool(
            gantry_types::DEFAULT_CLUSTER_ID,
            &exec_pool("badpool", &cloud, 1, 2),
        )
        .await
        .unwrap();
    let failing = pool_until(&server, 1, pool.id, "the failure shown", |p| {
        p.machines
            .first()
            .is_some_and(|m| m.state_message.contains("out of capacity"))
    })
    .await;
    let machine = &failing.machines[0];
    assert_eq!(machine.state, MachineState::Provisioning);
    assert!(
        machine.state_message.contains("trying again in"),
        "{}",
        machine.state_message
    );
    let events = admin.pool_events(1, pool.id).await.unwrap();
    assert!(
        events
            .iter()
            .any(|e| e.kind == "failed" && e.message.contains("no GPUs left in region lab-1")),
        "{events:?}"
    );
    assert!(
        events
            .iter()
            .any(|e| e.kind == "scale_up" && e.message.contains("at least 1")),
        "{events:?}"
    );

    // Bad input, in words.
    let mut no_command = exec_pool("x", &cloud, 0, 1);
    no_command.command = None;
    let message = crate::common::expect_error(
        admin.create_pool(1, &no_command).await,
        422,
        gantry_types::ErrorCode::ValidationFailed,
    );
    assert!(message.contains("command"), "{message}");
    for command in ["/bin/sh -c true", "missing.sh"] {
        let mut elsewhere = exec_pool("x", &cloud, 0, 1);
        elsewhere.command = Some(command.into());
        let message = crate::common::expect_error(
            admin.create_pool(1, &elsewhere).await,
            422,
            gantry_types::ErrorCode::ValidationFailed,
        );
        assert!(
            message.contains("pool_commands_dir") || message.contains("pool-commands"),
            "{message}"
        );
    }
    let mut local = exec_pool("local", &cloud, 0, 9);
    local.provider = PoolProvider::Local;
    local.command = None;
    let message = crate::common::expect_error(
        admin.create_pool(1, &local).await,
        422,
        gantry_types::ErrorCode::ValidationFailed,
    );
    assert!(message.contains("at most 8"), "{message}");
    crate::common::expect_error(
        admin
            .create_pool(1, &exec_pool("badpool", &cloud, 0, 1))
            .await,
        409,
        gantry_types::ErrorCode::Conflict,
    );
    crate::common::expect_error(
        admin.get_pool(1, pool.id + 100).await,
        404,
        gantry_types::ErrorCode::NotFound,
    );

    // Deleted: its machine (never created) goes, then the pool.
    let deleting = admin.delete_pool(1, pool.id).await.unwrap();
    assert!(deleting.deleting);
    gantry_testkit::eventually(
        "the pool to go",
        LONG_WAIT,
        Duration::from_millis(100),
        || async { Ok::<_, gantry_client::ClientError>(admin.get_pool(1, pool.id).await.is_err()) },
        |gone| *gone,
        String::new,
    )
    .await;
    assert!(admin.list_pools(1).await.unwrap().is_empty());

    // A cluster with a pool is not deleted.
    let spare = admin
        .create_cluster(&ClusterCreate::named("spare"))
        .await
        .unwrap();
    admin
        .create_pool(spare.id, &exec_pool("spare", &cloud, 0, 1))
        .await
        .unwrap();
    let message = crate::common::expect_error(
        admin.delete_cluster(spare.id).await,
        409,
        gantry_types::ErrorCode::Conflict,
    );
    assert!(message.contains("worker pool(s) spare"), "{message}");
    server.shutdown().await;
}

test_both_engines!(
    a_pool_follows_demand_and_gives_idle_machines_back,
    a_failing_provider_is_retried_with_its_words_and_a_deleted_pool_goes,
);
