//! Shutdown is bounded: `gantry server`, as a real process, exits within seconds of
//! SIGTERM although clients are following an instance's logs (proxied from a real worker
//! running a real `llama-server`) and holding a watch stream open.

use crate::common;

use std::time::{Duration, Instant};

use crate::common::{manual_model_create, tiny_model, Cluster};
use futures_util::StreamExt;
use gantry_types::{InstanceQuery, InstanceState, LogQuery};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_exits_within_seconds_while_clients_follow_logs_and_watch() {
    let mut cluster = Cluster::start(&[]).await;
    let worker = cluster.worker("w1", &["--simulate-gpus", "1x8GiB"]);
    let worker_id = cluster.worker_id("w1", &worker).await;
    let client = cluster.client().clone();

    let model_file = tiny_model(cluster.dir.path());
    let (model_id, instances) = cluster
        .create_model(&manual_model_create("tiny", &model_file, 1))
        .await;
    let id = instances[0];
    cluster.place(id, worker_id, &[0]).await;
    cluster
        .wait_instance(id, InstanceState::Running, Duration::from_secs(60))
        .await;
    let query = InstanceQuery {
        model_id: Some(model_id),
        ..InstanceQuery::default()
    };

    // Two clients follow the logs, one holds a watch; each has received its first bytes.
    let follow = LogQuery {
        tail: Some(5),
        follow: Some(true),
        timeout_seconds: None,
    };
    let mut logs = Vec::new();
    for _ in 0..2 {
        let mut body = client
            .instance_logs(id, &follow)
            .await
            .unwrap()
            .bytes_stream();
        let first = tokio::time::timeout(Duration::from_secs(10), body.next())
            .await
            .expect("log lines arrive")
            .expect("the log stream is open")
            .unwrap();
        assert!(!first.is_empty());
        logs.push(body);
    }
    let mut watch = client.watch_instances(&query).await.unwrap();
    let first = tokio::time::timeout(Duration::from_secs(10), watch.next())
        .await
        .expect("the watch answers")
        .expect("the watch is open")
        .unwrap();
    assert!(first.into_change().is_some(), "the list comes first");

    let asked = Instant::now();
    let status = cluster.server.terminate(Duration::from_secs(30));
    let took = asked.elapsed();
    println!("gantry server exited {took:?} after SIGTERM");
    assert!(status.success(), "{status}");
    assert!(
        took < Duration::from_secs(5),
        "took {took:?}; log:\n{}",
        common::tail(&cluster.server.log_text(), 40)
    );
    // The streams the server held end with it.
    for mut body in logs {
        let rest = tokio::time::timeout(Duration::from_secs(5), async {
            while let Some(Ok(_)) = body.next().await {}
        })
        .await;
        assert!(rest.is_ok(), "a log stream outlived the server");
    }
    drop(worker);
}
