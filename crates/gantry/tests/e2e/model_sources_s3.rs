//! A model from an S3-compatible store, end to end with real processes: `gantry server`
//! and `gantry worker` pointed (`--s3-endpoint`, `--s3-access-key`, `--s3-secret-key`) at
//! moto's S3 server (`gantry_testkit::s3`, a real `moto_server` process), a real
//! `llama-server`. The tiny GGUF is uploaded to a bucket; a model deployed from
//! `{"type": "s3", ...}` is estimated from the header read through a presigned URL,
//! downloaded by the worker into its cache (checked against the object's ETag, its MD5),
//! started and served through the gateway; the secret key is in no log.
//!
//! Needs `GANTRY_PYTHON` (scripts/python-env.sh prints it; scripts/test.sh sets it).

use crate::common;

use std::time::Duration;

use crate::common::{tail, Cluster};
use gantry_testkit::s3::S3Server;
use gantry_types::InstanceState;
use serde_json::json;

const BUCKET: &str = "models";
const KEY: &str = "qwen/tiny.gguf";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_from_s3_is_placed_downloaded_verified_and_served() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = std::fs::read(common::tiny_model(dir.path())).unwrap();
    let store = S3Server::start().await;
    store.create_bucket(BUCKET).await;
    let etag = store.put(BUCKET, KEY, &bytes).await;
    let s3_flags = [
        "--s3-endpoint",
        store.endpoint(),
        "--s3-access-key",
        store.access_key(),
        "--s3-secret-key",
        store.secret_key(),
    ];

    let cluster = Cluster::start(&s3_flags).await;
    let mut worker_flags = vec!["--simulate-gpus", "1x8GiB", "--heartbeat-interval", "300ms"];
    worker_flags.extend(s3_flags);
    let worker = cluster.worker("w1", &worker_flags);
    cluster.worker_id("w1", &worker).await;

    let source = json!({"type": "s3", "bucket": BUCKET, "key": KEY});
    let create = common::tiny_model_create_from("tiny-s3", source, 1);
    let model = cluster.client().create_model(&create).await.unwrap();
    let running = cluster
        .wait_for_first_instance(
            model.id,
            "the instance from S3 to run",
            Duration::from_secs(120),
            &[&worker],
            |i| i.state == InstanceState::Running,
        )
        .await;
    let record = running.placement.as_ref().unwrap();
    assert!(record.reservation.is_some(), "placed from an estimate");

    // Served through the gateway.
    let answer = cluster.chat_via_gateway("tiny-s3").await;
    assert!(
        answer["choices"].is_array(),
        "{answer}; worker log:\n{}",
        tail(&worker.log_text(), 30)
    );

    // The cache holds the object's bytes under the object's identity, checked against its
    // ETag (the MD5 of a single-part upload).
    let blobs = cluster.dir.path().join("w1/worker/model-cache/blobs");
    let cached: Vec<_> = std::fs::read_dir(&blobs)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(cached.len(), 1, "{cached:?}");
    assert!(cached[0]
        .file_name()
        .unwrap()
        .to_string_lossy()
        .starts_with("id-"));
    assert_eq!(std::fs::read(&cached[0]).unwrap(), bytes);
    assert_eq!(etag.len(), 32, "a single-part ETag: {etag}");

    // The secret key is in no log.
    for log in [cluster.server.log_text(), worker.log_text()] {
        assert!(
            !log.contains(store.secret_key()),
            "the secret key is logged"
        );
    }
    drop(worker);
}
