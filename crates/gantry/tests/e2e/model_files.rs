//! The workers' model files through the server's API, with real processes: `gantry
//! server`, `gantry worker` downloading from a hub double (`gantry_testkit::hub`, a TEST
//! DOUBLE of the hub's HTTP protocol) and a real `llama-server`.
//!
//! * While a model downloads, `GET /api/v1/model-files` shows its file `downloading`
//!   with the model named, and `DELETE` is refused (409).
//! * Deleting the model cancels the download: no more bytes are fetched, and the file is
//!   left `partial`, used by nobody, and can be deleted.
//! * Deployed again, the model downloads, runs, and its `ready` file cannot be deleted
//!   while the instance runs.

use crate::common;

use std::time::Duration;

use crate::common::Cluster;
use gantry_testkit::hub::{HubDouble, HubFile, HubRepo};
use gantry_types::{InstanceState, ModelCreate, ModelFileList, ModelFileState};
use serde_json::json;

const REPO: &str = "gantry-test/Files-GGUF";
const FILE: &str = "tiny-Q4_K_M.gguf";

fn model(name: &str) -> ModelCreate {
    serde_json::from_value(json!({
        "name": name,
        "source": {"type": "huggingface", "repo_id": REPO, "file": FILE},
        "backend": "llama.cpp",
        "replicas": 1,
        "backend_args": ["-c", "256", "-t", "1", "-tb", "1", "-np", "1"],
    }))
    .unwrap()
}

async fn files(cluster: &Cluster) -> ModelFileList {
    let token = cluster.client().token().unwrap();
    cluster
        .http
        .get(format!("{}/api/v1/model-files", cluster.base))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
        .error_for_status()
        .unwrap()
        .json()
        .await
        .unwrap()
}

async fn delete_file(cluster: &Cluster, id: &str) -> (u16, String) {
    let token = cluster.client().token().unwrap();
    let response = cluster
        .http
        .delete(format!("{}/api/v1/model-files/{id}", cluster.base))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_files_are_listed_protected_while_used_and_deleting_a_model_cancels_its_download() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = std::fs::read(common::tiny_model(dir.path())).unwrap();
    let size = bytes.len() as u64;
    let hub = HubDouble::start(vec![HubRepo::new(
        REPO,
        vec![HubFile::lfs(FILE, bytes.clone())],
    )])
    .await;
    let cluster = Cluster::start(&["--hf-endpoint", &hub.endpoint()]).await;
    let worker = cluster.worker(
        "w1",
        &[
            "--simulate-gpus",
            "1x8GiB",
            "--heartbeat-interval",
            "300ms",
            "--hf-endpoint",
            &hub.endpoint(),
        ],
    );
    cluster.worker_id("w1", &worker).await;
    // About ten seconds for the file.
    hub.set_throttle(Some(size / 10));

    let (model_id, _) = cluster.create_model(&model("files-a")).await;
    let listed = cluster
        .wait_for(
            "the file to be listed downloading",
            Duration::from_secs(60),
            || async { Ok::<_, gantry_client::ClientError>(files(&cluster).await) },
            |list| {
                list.items.first().is_some_and(|f| {
                    f.file.state == ModelFileState::Downloading && f.file.bytes_done > 0
                })
            },
        )
        .await;
    println!("while downloading: {listed:?}");
    assert!(listed.unreachable.is_empty(), "{listed:?}");
    let file = listed.items[0].clone();
    assert_eq!(file.worker_name, "w1");
    assert_eq!(file.file.size, size);
    assert_eq!(file.file.models, vec!["files-a".to_owned()]);
    assert!(file.file.names[0].ends_with(FILE), "{:?}", file.file.names);
    let (status, text) = delete_file(&cluster, &file.id).await;
    assert_eq!(status, 409, "{text}");
    assert!(text.contains("files-a"), "{text}");

    // Deleting the model cancels the download.
    cluster.client().delete_model(model_id).await.unwrap();
    let partial = cluster
        .wait_for(
            "the download to stop and leave a partial file",
            Duration::from_secs(30),
            || async { Ok::<_, gantry_client::ClientError>(files(&cluster).await) },
            |list| {
                list.items
                    .first()
                    .is_some_and(|f| f.file.state == ModelFileState::Partial)
            },
        )
        .await;
    let served = hub.bytes_served(REPO, FILE);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        hub.bytes_served(REPO, FILE),
        served,
        "nothing is fetched after the model is deleted"
    );
    let left = &partial.items[0].file;
    println!(
        "after the model was deleted: {} of {size} bytes on disk, state {:?}",
        left.bytes_done, left.state
    );
    assert!(left.bytes_done < size, "{left:?}");
    assert!(left.models.is_empty(), "{left:?}");
    let (status, text) = delete_file(&cluster, &partial.items[0].id).await;
    assert_eq!(status, 204, "{text}");
    assert!(files(&cluster).await.items.is_empty());
    let (status, text) = delete_file(&cluster, &partial.items[0].id).await;
    assert_eq!(status, 404, "{text}");

    // Deployed again: downloaded whole, running, and its file protected.
    hub.set_throttle(None);
    let (_, ids) = cluster.create_model(&model("files-b")).await;
    cluster
        .wait_instance(ids[0], InstanceState::Running, Duration::from_secs(90))
        .await;
    let list = files(&cluster).await;
    let ready = &list.items[0];
    assert_eq!(ready.file.state, ModelFileState::Ready, "{list:?}");
    assert_eq!(ready.file.bytes_done, size);
    assert_eq!(ready.file.models, vec!["files-b".to_owned()]);
    assert!(ready.file.last_used_at.is_some());
    let (status, text) = delete_file(&cluster, &ready.id).await;
    assert_eq!(status, 409, "{text}");
    println!("deleting a file in use: {text}");
    let (status, text) = delete_file(&cluster, &format!("{}/..", ready.worker_id)).await;
    assert!(status == 400 || status == 404, "{status} {text}");
}
