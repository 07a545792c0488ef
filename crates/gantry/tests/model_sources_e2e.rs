//! Models from Hugging Face, end to end with real processes: `gantry server` and
//! `gantry worker` pointed (`--hf-endpoint`) at a hub double in this test process
//! (`gantry_testkit::hub`, a TEST DOUBLE of the hub's HTTP protocol, checked against the
//! official `huggingface_hub` client in its own test), a real `llama-server`.
//!
//! * A model named by a glob is estimated from its header, placed, downloaded by the
//!   chosen worker only, shown `downloading` with progress, started and served through
//!   the gateway. The worker is `kill -9`ed mid-download (the double is throttled); the
//!   restarted worker resumes from the bytes on disk: less than 1.2× the file is served
//!   to the worker in all.
//! * Wrong bytes (the double corrupts the file once the worker downloads it): the
//!   instance ends in `error` naming both digests, and nothing is left in the worker's
//!   cache.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{tail, Cluster, Process};
use gantry_testkit::hub::{HubDouble, HubFile, HubRepo};
use gantry_types::{InstanceState, ModelCreate, ModelInstance};
use serde_json::json;

const REPO: &str = "gantry-test/Tiny-GGUF";
const FILE: &str = "tiny-Q4_K_M.gguf";

/// The tiny GGUF model's bytes.
fn tiny_bytes(dir: &std::path::Path) -> Vec<u8> {
    std::fs::read(common::tiny_model(dir)).unwrap()
}

/// A repository with the tiny model, another GGUF (so the glob has to choose) and a
/// README.
fn repo(bytes: &[u8]) -> HubRepo {
    HubRepo::new(
        REPO,
        vec![
            HubFile::regular("README.md", "# tiny\n"),
            HubFile::lfs(FILE, bytes.to_vec()),
            HubFile::lfs("other-Q8_0.gguf", b"not this one".to_vec()),
        ],
    )
}

fn hf_model(name: &str) -> ModelCreate {
    serde_json::from_value(json!({
        "name": name,
        "source": {"type": "huggingface", "repo_id": REPO, "file": "*Q4_K_M.gguf"},
        "backend": "llama.cpp",
        "replicas": 1,
        "backend_args": ["-c", "256", "-t", "1", "-tb", "1", "-np", "1"],
    }))
    .unwrap()
}

fn start_worker(cluster: &Cluster, hub: &HubDouble) -> Process {
    cluster.worker(
        "w1",
        &[
            "--simulate-gpus",
            "1x8GiB",
            "--heartbeat-interval",
            "300ms",
            "--hf-endpoint",
            &hub.endpoint(),
        ],
    )
}

async fn instance(cluster: &Cluster, model_id: i64) -> Option<ModelInstance> {
    let list = cluster
        .client()
        .list_instances(&gantry_types::InstanceQuery {
            model_id: Some(model_id),
            ..Default::default()
        })
        .await
        .ok()?;
    list.items.into_iter().next()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hugging_face_model_is_placed_from_its_header_downloaded_resumed_and_served() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = tiny_bytes(dir.path());
    let size = bytes.len() as u64;
    let hub = HubDouble::start(vec![repo(&bytes)]).await;
    let cluster = Cluster::start(&["--hf-endpoint", &hub.endpoint()]).await;
    let mut worker = start_worker(&cluster, &hub);
    cluster.worker_id("w1", &worker).await;
    // Slow enough to catch the download half-way: about five seconds for the file.
    hub.set_throttle(Some(size / 5));

    let model = cluster
        .client()
        .create_model(&hf_model("tiny-hf"))
        .await
        .unwrap();
    // Placed from the header alone, then downloading with progress.
    let downloading = cluster
        .wait_for(
            "the instance to download a third of the file",
            Duration::from_secs(60),
            || async { Ok::<_, gantry_client::ClientError>(instance(&cluster, model.id).await) },
            |i| {
                i.as_ref().is_some_and(|i| {
                    i.state == InstanceState::Downloading
                        && i.download.is_some_and(|d| d.bytes_done * 3 >= size)
                })
            },
        )
        .await
        .unwrap();
    let progress = downloading.download.unwrap();
    println!(
        "downloading: {progress:?}, message {:?}",
        downloading.state_message
    );
    assert_eq!(progress.bytes_total, Some(size));
    assert!(downloading.worker_id.is_some() && downloading.placement.is_some());
    assert!(downloading.state_message.starts_with("downloading"));
    let record = downloading.placement.as_ref().unwrap();
    assert!(record.reservation.is_some(), "placed from an estimate");

    // kill -9 mid-download, then the same worker again: the download resumes.
    let served_before_kill = hub.bytes_served(REPO, FILE);
    worker.signal(nix::sys::signal::Signal::SIGKILL);
    let _ = worker.child.take().map(|mut c| c.wait());
    let partial: u64 = std::fs::read_dir(cluster.dir.path().join("w1/worker/model-cache/partial"))
        .unwrap()
        .flatten()
        .map(|e| e.metadata().unwrap().len())
        .sum();
    assert!(
        partial > 0 && partial < size,
        "a partial file of {partial} bytes"
    );
    hub.set_throttle(None);
    let worker = start_worker(&cluster, &hub);
    let running = cluster
        .wait_for(
            "the instance to run after the resumed download",
            Duration::from_secs(90),
            || async { Ok::<_, gantry_client::ClientError>(instance(&cluster, model.id).await) },
            |i| {
                i.as_ref()
                    .is_some_and(|i| i.state == InstanceState::Running)
            },
        )
        .await
        .unwrap();
    // What the worker fetched: every byte of the file once, plus what was in flight when
    // it died; the server's header read (the first bytes) is counted too.
    let served = hub.bytes_served(REPO, FILE);
    println!(
        "file of {size} bytes: {served_before_kill} served before the kill ({partial} on disk), \
         {served} in all (header read included)"
    );
    assert!(
        (served as f64) < 1.2 * size as f64 + size.min(4 << 20) as f64,
        "{served} bytes served for a {size}-byte file; worker log:\n{}",
        tail(&worker.log_text(), 30)
    );
    assert!(
        hub.requests()
            .iter()
            .any(|r| r.contains(FILE) && r.contains("bytes=")),
        "a range request resumed the download: {:?}",
        hub.requests()
    );
    assert_eq!(hub.bytes_served(REPO, "other-Q8_0.gguf"), 0);

    // Served through the gateway.
    let token = cluster.client().token().unwrap();
    let answer: serde_json::Value = cluster
        .http
        .post(format!("{}/v1/chat/completions", cluster.base))
        .bearer_auth(&token)
        .json(&json!({"model": "tiny-hf", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(answer["choices"].is_array(), "{answer}");
    // The cache holds the verified file under its digest.
    let blob = cluster
        .dir
        .path()
        .join("w1/worker/model-cache/blobs")
        .join(format!("sha256-{}", HubDouble::sha256(&bytes)));
    assert_eq!(std::fs::read(&blob).unwrap(), bytes);
    assert!(running.download.is_none());
    drop(worker);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_bytes_end_in_error_naming_both_digests_and_leave_nothing_cached() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = tiny_bytes(dir.path());
    let hub = HubDouble::start(vec![repo(&bytes)]).await;
    let cluster = Cluster::start(&["--hf-endpoint", &hub.endpoint()]).await;

    // The header the server reads is sound (the model is analysed while no worker can
    // take it); the bytes the worker then gets are not.
    let model = cluster
        .client()
        .create_model(&hf_model("tiny-bad"))
        .await
        .unwrap();
    cluster
        .wait_for(
            "the model to be analysed and wait for a worker",
            Duration::from_secs(60),
            || async { Ok::<_, gantry_client::ClientError>(instance(&cluster, model.id).await) },
            |i| {
                i.as_ref().is_some_and(|i| {
                    i.state == InstanceState::Pending && i.state_message.contains("worker")
                })
            },
        )
        .await;
    hub.corrupt(REPO, FILE);
    let worker = start_worker(&cluster, &hub);
    cluster.worker_id("w1", &worker).await;
    let failed = cluster
        .wait_for(
            "the instance to fail on the wrong bytes",
            Duration::from_secs(90),
            || async { Ok::<_, gantry_client::ClientError>(instance(&cluster, model.id).await) },
            |i| {
                i.as_ref()
                    .is_some_and(|i| i.state_message.contains("SHA-256"))
            },
        )
        .await
        .unwrap();
    println!("{}: {}", failed.state.as_str(), failed.state_message);
    assert_eq!(failed.state, InstanceState::Error);
    let expected = HubDouble::sha256(&bytes);
    assert!(
        failed.state_message.contains(&expected),
        "{}",
        failed.state_message
    );
    let got = failed
        .state_message
        .split(|c: char| !c.is_ascii_hexdigit())
        .find(|w| w.len() == 64 && w.chars().all(|c| c.is_ascii_hexdigit()) && *w != expected);
    assert!(
        got.is_some(),
        "the received digest is named: {}",
        failed.state_message
    );
    let cache = cluster.dir.path().join("w1/worker/model-cache");
    for sub in ["blobs", "partial"] {
        let left: Vec<_> = std::fs::read_dir(cache.join(sub))
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        assert!(left.is_empty(), "{sub} holds {left:?}");
    }
    drop(worker);
}
