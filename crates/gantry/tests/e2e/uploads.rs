//! Files uploaded to the server and deployed from it, end to end with real processes:
//! `gantry server`, `gantry worker` and a real `llama-server`.
//!
//! - The tiny GGUF is uploaded in pieces with `PATCH` and `Upload-Offset`: a wrong offset
//!   is refused with the right one, a request cut off mid-body keeps what arrived and the
//!   upload continues from there; the last byte makes it `ready`, its SHA-256 checked.
//! - Deployed as `{"type": "upload", "id": …}`: estimated from its header, downloaded by
//!   the worker through a signed URL, started and served through the gateway. A model
//!   naming a missing or incomplete upload is refused; an upload in use cannot be
//!   deleted; a wrong signature gets 403; wrong bytes (another SHA-256 than declared)
//!   are discarded with both digests named.
//! - With `--s3-upload-bucket` (moto's S3 server, `gantry_testkit::s3`), the complete
//!   upload moves to the bucket and the worker — which has no S3 keys — downloads it
//!   through a URL the server presigned.
//! - Two servers on one PostgreSQL: an upload received by A is deployed by a worker that
//!   knows only B (B redirects the signed download, and a `PATCH`, to A).
//!
//! The S3 test needs `GANTRY_PYTHON` (scripts/python-env.sh prints it), the two-server
//! test `GANTRY_TEST_POSTGRES_URL` (scripts/test.sh sets both).

use crate::common;

use std::time::Duration;

use crate::common::{Cluster, Process};
use gantry_testkit::s3::S3Server;
use gantry_types::{InstanceState, ModelCreate, Upload, UploadState};
use serde_json::json;
use sha2::{Digest, Sha256};

fn uploads_url(cluster: &Cluster) -> String {
    format!("{}/api/v1/model-files/uploads", cluster.base)
}

async fn create_upload(cluster: &Cluster, body: serde_json::Value) -> reqwest::Response {
    cluster
        .http
        .post(uploads_url(cluster))
        .bearer_auth(cluster.client().token().unwrap())
        .json(&body)
        .send()
        .await
        .unwrap()
}

async fn patch(cluster: &Cluster, id: i64, offset: u64, body: reqwest::Body) -> reqwest::Response {
    cluster
        .http
        .patch(format!("{}/{id}", uploads_url(cluster)))
        .bearer_auth(cluster.client().token().unwrap())
        .header("Upload-Offset", offset)
        .header("Content-Type", "application/offset+octet-stream")
        .body(body)
        .send()
        .await
        .unwrap()
}

async fn get_upload(cluster: &Cluster, id: i64) -> Upload {
    gantry_testkit::answer_json(
        cluster
            .http
            .get(format!("{}/{id}", uploads_url(cluster)))
            .bearer_auth(cluster.client().token().unwrap()),
    )
    .await
}

/// Uploads `bytes` in one piece; returns the ready upload.
async fn upload_whole(cluster: &Cluster, name: &str, bytes: &[u8]) -> Upload {
    let created = create_upload(
        cluster,
        json!({"name": name, "size": bytes.len(), "sha256": hex::encode(Sha256::digest(bytes))}),
    )
    .await;
    assert_eq!(created.status(), 201);
    let upload: Upload = created.json().await.unwrap();
    let done = patch(cluster, upload.id, 0, bytes.to_vec().into()).await;
    assert_eq!(done.status(), 200, "{}", done.text().await.unwrap());
    let upload: Upload = done.json().await.unwrap();
    assert_eq!(upload.state, UploadState::Ready);
    upload
}

fn model(name: &str, upload_id: i64) -> ModelCreate {
    common::tiny_model_create_from(name, json!({"type": "upload", "id": upload_id}), 1)
}

/// Deploys `upload` and waits until its instance runs and answers through the gateway.
async fn deploy_and_chat(cluster: &Cluster, worker: &Process, name: &str, upload: &Upload) {
    let model = cluster
        .client()
        .create_model(&model(name, upload.id))
        .await
        .unwrap();
    let running = cluster
        .wait_for_first_instance(
            model.id,
            "the instance of the uploaded model to run",
            Duration::from_secs(120),
            &[worker],
            |i| i.state == InstanceState::Running,
        )
        .await;
    assert!(
        running.placement.as_ref().unwrap().reservation.is_some(),
        "placed from an estimate"
    );
    let answer = cluster.chat_via_gateway(name).await;
    assert!(answer["choices"].is_array(), "{answer}");
}

fn start_worker(cluster: &Cluster) -> Process {
    cluster.worker(
        "w1",
        &["--simulate-gpus", "1x8GiB", "--heartbeat-interval", "300ms"],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_resumes_by_offset_is_verified_and_deployed() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = std::fs::read(common::tiny_model(dir.path())).unwrap();
    let size = bytes.len() as u64;
    let digest = hex::encode(Sha256::digest(&bytes));
    let cluster = Cluster::start(&[]).await;
    let worker = start_worker(&cluster);
    cluster.worker_id("w1", &worker).await;

    let created = create_upload(
        &cluster,
        json!({"name": "tiny.gguf", "size": size, "sha256": digest}),
    )
    .await;
    assert_eq!(created.status(), 201);
    let upload: Upload = created.json().await.unwrap();
    assert_eq!(
        (upload.state, upload.bytes_received),
        (UploadState::Uploading, 0)
    );

    // The first third, then a wrong offset: refused with the right one.
    let third = (size / 3) as usize;
    let first = patch(&cluster, upload.id, 0, bytes[..third].to_vec().into()).await;
    assert_eq!(first.status(), 200);
    let wrong = patch(&cluster, upload.id, 5, bytes[5..10].to_vec().into()).await;
    assert_eq!(wrong.status(), 409);
    assert_eq!(wrong.headers()["upload-offset"], third.to_string().as_str());

    // A request cut off mid-body: what arrived is kept.
    let sent = third..2 * third;
    let piece = bytes[sent.clone()].to_vec();
    // The piece goes out, then (half a second later) the client fails.
    let stream = futures_util::stream::unfold(Some(piece), |piece| async move {
        match piece {
            Some(piece) => Some((Ok::<_, std::io::Error>(piece), None)),
            None => {
                tokio::time::sleep(Duration::from_millis(500)).await;
                Some((
                    Err(std::io::Error::other("the client dies mid-upload")),
                    None,
                ))
            }
        }
    });
    let cut = cluster
        .http
        .patch(format!("{}/{}", uploads_url(&cluster), upload.id))
        .bearer_auth(cluster.client().token().unwrap())
        .header("Upload-Offset", third)
        .header("Content-Type", "application/offset+octet-stream")
        .body(reqwest::Body::wrap_stream(stream))
        .send()
        .await;
    assert!(
        cut.as_ref().map_or(true, |r| !r.status().is_success()),
        "{cut:?}"
    );
    let resumed_at = common::poll(
        "the cut-off request to end on the server",
        Duration::from_secs(10),
        &[&cluster.server],
        || async { Ok(get_upload(&cluster, upload.id).await) },
        |u: &Upload| u.bytes_received > third as u64,
    )
    .await
    .bytes_received;
    println!(
        "a {size}-byte upload: {third} bytes sent, then a request cut off after {} more; the \
         upload continues from {resumed_at}",
        sent.len()
    );
    assert!(
        (third as u64..=sent.end as u64).contains(&resumed_at),
        "{resumed_at}"
    );
    let model_too_early = cluster
        .client()
        .create_model(&model("too-early", upload.id))
        .await
        .unwrap_err();
    assert!(
        model_too_early.to_string().contains("not complete"),
        "{model_too_early}"
    );
    let rest = bytes[resumed_at as usize..].to_vec();
    let last = patch(&cluster, upload.id, resumed_at, rest.into()).await;
    assert_eq!(last.status(), 200);
    let ready: Upload = last.json().await.unwrap();
    assert_eq!(ready.state, UploadState::Ready);
    assert_eq!(ready.sha256.as_deref(), Some(digest.as_str()));
    assert_eq!(ready.bytes_received, size);
    let kept = cluster
        .dir
        .path()
        .join(format!("server/uploads/{}/tiny.gguf", upload.id));
    assert_eq!(std::fs::read(&kept).unwrap(), bytes);

    // A model naming no upload is refused.
    let missing = cluster
        .client()
        .create_model(&model("missing", 999))
        .await
        .unwrap_err();
    assert!(missing.to_string().contains("no upload 999"), "{missing}");

    deploy_and_chat(&cluster, &worker, "tiny-upload", &ready).await;
    // The worker cached the file by its SHA-256.
    let blob = cluster
        .dir
        .path()
        .join(format!("w1/worker/model-cache/blobs/sha256-{digest}"));
    assert_eq!(std::fs::read(&blob).unwrap(), bytes);

    // In use: not deleted.
    let delete = cluster
        .http
        .delete(format!("{}/{}", uploads_url(&cluster), upload.id))
        .bearer_auth(cluster.client().token().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(delete.status(), 409);
    assert!(delete.text().await.unwrap().contains("tiny-upload"));

    // A forged download URL.
    let forged = cluster
        .http
        .get(format!(
            "{}/{}/content?expires=99999999999999&signature=00",
            uploads_url(&cluster),
            upload.id
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(forged.status(), 403);

    // Wrong bytes: refused naming both digests, and discarded.
    let declared = "ab".repeat(32);
    let created = create_upload(
        &cluster,
        json!({"name": "bad.gguf", "size": 4, "sha256": declared}),
    )
    .await;
    let bad: Upload = created.json().await.unwrap();
    let refused = patch(&cluster, bad.id, 0, b"abcd".to_vec().into()).await;
    assert_eq!(refused.status(), 422);
    let message = refused.text().await.unwrap();
    let actual = hex::encode(Sha256::digest(b"abcd"));
    assert!(
        message.contains(&declared) && message.contains(&actual),
        "{message}"
    );
    assert_eq!(get_upload(&cluster, bad.id).await.bytes_received, 0);

    // Unused: deleted with its bytes.
    cluster
        .client()
        .delete_model(
            cluster
                .client()
                .list_models(&Default::default())
                .await
                .unwrap()
                .items
                .iter()
                .find(|m| m.name == "tiny-upload")
                .unwrap()
                .id,
        )
        .await
        .unwrap();
    let delete = cluster
        .http
        .delete(format!("{}/{}", uploads_url(&cluster), upload.id))
        .bearer_auth(cluster.client().token().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(delete.status(), 204);
    assert!(!kept.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_moves_to_the_bucket_and_the_worker_downloads_it_presigned() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = std::fs::read(common::tiny_model(dir.path())).unwrap();
    let store = S3Server::start().await;
    store.create_bucket("staged").await;
    let cluster = Cluster::start(&[
        "--s3-endpoint",
        store.endpoint(),
        "--s3-access-key",
        store.access_key(),
        "--s3-secret-key",
        store.secret_key(),
        "--s3-upload-bucket",
        "staged",
    ])
    .await;
    // No S3 keys: the server signs the worker's URL.
    let worker = start_worker(&cluster);
    cluster.worker_id("w1", &worker).await;

    let upload = upload_whole(&cluster, "tiny.gguf", &bytes).await;
    let key = format!("uploads/{}/tiny.gguf", upload.id);
    assert_eq!(upload.location, format!("s3:staged/{key}"));
    assert_eq!(store.get("staged", &key).await, bytes);
    assert!(
        !cluster
            .dir
            .path()
            .join(format!("server/uploads/{}", upload.id))
            .exists(),
        "the server's copy is removed once the bucket has it"
    );
    deploy_and_chat(&cluster, &worker, "tiny-staged", &upload).await;
    let secret = store.secret_key();
    for log in [cluster.server.log_text(), worker.log_text()] {
        assert!(!log.contains(secret));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_on_one_server_is_deployed_through_another() {
    let db = gantry_testkit::TestDatabase::new(gantry_testkit::TestEngine::Postgres).await;
    let args = common::ha_server_args(&db.url);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let a = Cluster::start(&args).await;
    let b = Cluster::start(&args).await;
    let dir = tempfile::tempdir().unwrap();
    let bytes = std::fs::read(common::tiny_model(dir.path())).unwrap();
    let upload = upload_whole(&a, "tiny.gguf", &bytes).await;
    assert!(
        upload.location.starts_with("server:server-"),
        "{}",
        upload.location
    );

    // Asked of B, a download URL is a path on B, which redirects to A.
    let no_redirects = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let staged: gantry_types::StagedUpload = gantry_testkit::answer_json(
        b.http
            .get(format!("{}/api/v1/worker/uploads/{}", b.base, upload.id))
            .bearer_auth(b.client().token().unwrap()),
    )
    .await;
    let via_b = no_redirects
        .get(format!("{}{}", b.base, staged.url))
        .send()
        .await
        .unwrap();
    assert_eq!(via_b.status(), 307);
    let location = via_b.headers()["location"].to_str().unwrap().to_owned();
    assert_eq!(location, format!("{}{}", a.base, staged.url));
    let via_a = b.http.get(&location).send().await.unwrap();
    assert_eq!(via_a.status(), 200);
    assert_eq!(via_a.bytes().await.unwrap(), bytes);
    // A PATCH of an upload A receives, sent to B, is sent on to A.
    let receiving: Upload = create_upload(&a, json!({"name": "next.gguf", "size": 10}))
        .await
        .json()
        .await
        .unwrap();
    let path = format!("/api/v1/model-files/uploads/{}", receiving.id);
    let patch_b = no_redirects
        .patch(format!("{}{path}", b.base))
        .bearer_auth(b.client().token().unwrap())
        .header("Upload-Offset", 0)
        .header("Content-Type", "application/offset+octet-stream")
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(patch_b.status(), 307);
    assert_eq!(
        patch_b.headers()["location"],
        format!("{}{path}", a.base).as_str()
    );

    // A worker told only of B (the registration token is A's file) runs the model.
    let worker = a.worker_for(
        &b.base,
        "w1",
        &["--simulate-gpus", "1x8GiB", "--heartbeat-interval", "300ms"],
    );
    b.worker_id("w1", &worker).await;
    deploy_and_chat(&b, &worker, "tiny-elsewhere", &upload).await;
}
