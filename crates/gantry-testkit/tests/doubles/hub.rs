//! Proves the Hugging Face Hub double is faithful: the official `huggingface_hub` Python
//! client, in a real process, downloads single files, filtered snapshots and private files
//! from it, and turns its errors into the client's own exceptions; then reqwest checks the
//! wire details a downloader relies on (headers, ranges, throttling, corruption, the byte
//! count of an interrupted transfer).
//!
//! Needs `GANTRY_PYTHON`, a python with `huggingface_hub` (scripts/python-env.sh prints it;
//! scripts/test.sh sets it). Without it the client tests fail saying so; they never skip.

use std::path::Path;
use std::time::Duration;

use gantry_testkit::hub::{HubDouble, HubFile, HubRepo};
use reqwest::header::{CONTENT_LENGTH, ETAG, LOCATION, RANGE};
use reqwest::StatusCode;
use serde::Serialize;

use crate::common::{
    assert_ranges_answered, assert_requested, assert_sent_once, contents, get_bytes, get_json,
    header, no_redirects, pseudo_random, read, run_client_driver, ClientOutcome, CONFIG,
};

const REPO: &str = "gantry-test/tiny-gguf";
const PRIVATE_REPO: &str = "gantry-test/private-gguf";
const PRIVATE_TOKEN: &str = "hf_gantry_private_token";

fn model_repo() -> HubRepo {
    HubRepo::new(
        REPO,
        vec![
            HubFile::regular("config.json", CONFIG),
            HubFile::lfs("model-Q4_K_M.gguf", pseudo_random(1, 300 * 1024)),
            HubFile::lfs("model-00001-of-00002.gguf", pseudo_random(2, 48 * 1024)),
            HubFile::lfs("model-00002-of-00002.gguf", pseudo_random(3, 32 * 1024)),
        ],
    )
}

fn private_repo() -> HubRepo {
    HubRepo::new(
        PRIVATE_REPO,
        vec![
            HubFile::regular("config.json", CONFIG),
            HubFile::lfs("model-Q8_0.gguf", pseudo_random(4, 64 * 1024)),
        ],
    )
    .with_token(PRIVATE_TOKEN)
}

// ---------------------------------------------------------------------------------------
// The official client, in a real process.
// ---------------------------------------------------------------------------------------

/// Runs each call in one Python process and prints one JSON outcome per call.
const CLIENT_DRIVER: &str = r#"
import json, sys
from huggingface_hub import hf_hub_download, snapshot_download

outcomes = []
for call in json.loads(sys.argv[1]):
    try:
        if call["kind"] == "hf_hub_download":
            path = hf_hub_download(
                call["repo_id"], call["filename"], revision=call["revision"], token=call["token"]
            )
        elif call["kind"] == "snapshot_download":
            path = snapshot_download(
                call["repo_id"], allow_patterns=call["allow_patterns"], token=call["token"]
            )
        else:
            raise ValueError(f"unknown call {call!r}")
        outcomes.append({"path": path, "error": None, "message": None})
    except Exception as error:
        outcomes.append({"path": None, "error": type(error).__name__, "message": str(error)})
print(json.dumps(outcomes))
"#;

/// One call of the client, as the driver script reads it.
#[derive(Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum ClientCall<'a> {
    HfHubDownload {
        repo_id: &'a str,
        filename: &'a str,
        revision: &'a str,
        token: Option<&'a str>,
    },
    SnapshotDownload {
        repo_id: &'a str,
        allow_patterns: Vec<&'a str>,
        token: Option<&'a str>,
    },
}

fn download<'a>(repo_id: &'a str, filename: &'a str, token: Option<&'a str>) -> ClientCall<'a> {
    ClientCall::HfHubDownload {
        repo_id,
        filename,
        revision: "main",
        token,
    }
}

/// Runs `calls` through the official client against `hub`, with its cache and home in
/// `dir`, no token of the machine's and no telemetry.
async fn run_official_client(
    hub: &HubDouble,
    dir: &Path,
    calls: &[ClientCall<'_>],
) -> Vec<ClientOutcome> {
    run_client_driver("huggingface_hub", CLIENT_DRIVER, calls, |command| {
        command
            .env("HF_ENDPOINT", hub.endpoint())
            .env("HF_HOME", dir.join("hf-home"))
            .env("HF_HUB_CACHE", dir.join("hub-cache"))
            .env("HF_HUB_DISABLE_TELEMETRY", "1")
            .env("HF_HUB_ENABLE_HF_TRANSFER", "0")
            .env("HF_HUB_DISABLE_PROGRESS_BARS", "1")
            .env_remove("HF_TOKEN")
            .env_remove("HUGGING_FACE_HUB_TOKEN")
            .env_remove("HF_HUB_OFFLINE");
    })
    .await
}

/// The name of the cache blob a snapshot path links to: the client names blobs by ETag.
fn blob_name(path: &Path) -> String {
    let blob = std::fs::canonicalize(path).unwrap();
    blob.file_name().unwrap().to_string_lossy().into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_client_downloads_regular_and_lfs_files() {
    let repo = model_repo();
    let hub = HubDouble::start(vec![repo.clone()]).await;
    let dir = tempfile::tempdir().unwrap();

    let outcomes = run_official_client(
        &hub,
        dir.path(),
        &[
            download(REPO, "config.json", None),
            download(REPO, "model-Q4_K_M.gguf", None),
            download(REPO, "no-such-file.gguf", None),
            ClientCall::HfHubDownload {
                repo_id: REPO,
                filename: "config.json",
                revision: "no-such-branch",
                token: None,
            },
            download("gantry-test/no-such-repo", "config.json", None),
        ],
    )
    .await;

    let config = outcomes[0].path();
    let weights = outcomes[1].path();
    assert_eq!(read(config), contents(&repo.files, "config.json"));
    assert_eq!(read(weights), contents(&repo.files, "model-Q4_K_M.gguf"));
    // The client filed both under the commit from X-Repo-Commit, in blobs named by the
    // ETag: the git blob id for a regular file, X-Linked-Etag's sha256 for an LFS file.
    assert!(config.ends_with(format!("snapshots/{}/config.json", repo.commit)));
    assert!(weights.ends_with(format!("snapshots/{}/model-Q4_K_M.gguf", repo.commit)));
    assert_eq!(blob_name(config), HubDouble::git_blob_oid(CONFIG));
    assert_eq!(
        blob_name(weights),
        HubDouble::sha256(contents(&repo.files, "model-Q4_K_M.gguf"))
    );

    assert_eq!(outcomes[2].error().0, "RemoteEntryNotFoundError");
    assert_eq!(outcomes[3].error().0, "RevisionNotFoundError");
    assert_eq!(outcomes[4].error().0, "RepositoryNotFoundError");

    let weights_len = contents(&repo.files, "model-Q4_K_M.gguf").len() as u64;
    assert_sent_once(
        &hub,
        REPO,
        &repo.files,
        &["config.json", "model-Q4_K_M.gguf"],
        &[],
    );
    assert_eq!(hub.total_bytes_served(), CONFIG.len() as u64 + weights_len);

    // The LFS file went HEAD on the hub, then GET on the CDN the redirect named.
    let sha256 = HubDouble::sha256(contents(&repo.files, "model-Q4_K_M.gguf"));
    assert_requested(
        &hub,
        [
            format!("HEAD /{REPO}/resolve/main/model-Q4_K_M.gguf"),
            format!("GET /repos/{REPO}/{sha256}/model-Q4_K_M.gguf"),
            format!("HEAD /{REPO}/resolve/main/config.json"),
            format!("GET /{REPO}/resolve/main/config.json"),
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_download_fetches_only_the_matching_files() {
    let repo = model_repo();
    let hub = HubDouble::start(vec![repo.clone()]).await;
    let dir = tempfile::tempdir().unwrap();

    let outcomes = run_official_client(
        &hub,
        dir.path(),
        &[ClientCall::SnapshotDownload {
            repo_id: REPO,
            allow_patterns: vec!["*-of-*.gguf"],
            token: None,
        }],
    )
    .await;

    let folder = outcomes[0].path();
    assert!(folder.ends_with(format!("snapshots/{}", repo.commit)));
    let mut names: Vec<String> = std::fs::read_dir(folder)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["model-00001-of-00002.gguf", "model-00002-of-00002.gguf"]
    );
    for name in &names {
        assert_eq!(
            read(&folder.join(name)),
            contents(&repo.files, name),
            "{name}"
        );
    }
    let others = ["model-Q4_K_M.gguf", "config.json"];
    assert_sent_once(&hub, REPO, &repo.files, &names, &others);

    // The client resolved main through the model info, then listed the commit's tree.
    let requests = hub.requests();
    assert!(
        requests.contains(&format!("GET /api/models/{REPO}/revision/main")),
        "{requests:#?}"
    );
    let tree = format!("GET /api/models/{REPO}/tree/{}?", repo.commit);
    assert!(
        requests
            .iter()
            .any(|request| request.starts_with(&tree) && request.contains("recursive=true")),
        "no recursive tree listing of the commit among {requests:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_private_repository_needs_its_token() {
    let private = private_repo();
    let hub = HubDouble::start(vec![model_repo(), private.clone()]).await;
    let dir = tempfile::tempdir().unwrap();

    let outcomes = run_official_client(
        &hub,
        dir.path(),
        &[
            download(PRIVATE_REPO, "model-Q8_0.gguf", None),
            download(
                PRIVATE_REPO,
                "model-Q8_0.gguf",
                Some("hf_not_a_token_of_this_hub"),
            ),
            download(PRIVATE_REPO, "model-Q8_0.gguf", Some(PRIVATE_TOKEN)),
            ClientCall::SnapshotDownload {
                repo_id: PRIVATE_REPO,
                allow_patterns: vec!["*.json"],
                token: Some(PRIVATE_TOKEN),
            },
        ],
    )
    .await;

    let (error, message) = outcomes[0].error();
    assert_eq!(error, "RepositoryNotFoundError", "{message}");
    let (error, message) = outcomes[1].error();
    assert_eq!(error, "HfHubHTTPError", "{message}");
    assert!(message.contains("Invalid credentials"), "{message}");

    assert_eq!(
        read(outcomes[2].path()),
        contents(&private.files, "model-Q8_0.gguf")
    );
    let snapshot = outcomes[3].path();
    assert_eq!(read(&snapshot.join("config.json")), CONFIG);

    // Only the download with the token moved the weights, once: the snapshot, filtered to
    // `*.json`, did not fetch them again.
    assert_eq!(
        hub.bytes_served(PRIVATE_REPO, "model-Q8_0.gguf"),
        contents(&private.files, "model-Q8_0.gguf").len() as u64
    );
    assert_eq!(
        hub.bytes_served(PRIVATE_REPO, "config.json"),
        CONFIG.len() as u64
    );
}

// ---------------------------------------------------------------------------------------
// The wire, with reqwest.
// ---------------------------------------------------------------------------------------

/// The CDN link the hub redirects an LFS file to.
async fn cdn_link(hub: &HubDouble, repo_id: &str, path: &str) -> String {
    let response = no_redirects()
        .head(format!("{}/{repo_id}/resolve/main/{path}", hub.endpoint()))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::FOUND);
    header(response.headers(), "location").to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resolve_and_the_api_answer_with_the_hubs_headers_and_shapes() {
    let repo = model_repo();
    let hub = HubDouble::start(vec![repo.clone(), private_repo()]).await;
    let client = no_redirects();
    let weights = contents(&repo.files, "model-Q4_K_M.gguf");
    let sha256 = HubDouble::sha256(weights);

    let regular = client
        .head(format!(
            "{}/{REPO}/resolve/main/config.json",
            hub.endpoint()
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(regular.status(), StatusCode::OK);
    let headers = regular.headers();
    assert_eq!(
        header(headers, "etag"),
        format!("\"{}\"", HubDouble::git_blob_oid(CONFIG))
    );
    assert_eq!(header(headers, "x-repo-commit"), repo.commit);
    assert_eq!(header(headers, "content-length"), CONFIG.len().to_string());
    assert_eq!(header(headers, "accept-ranges"), "bytes");

    // An LFS file, by commit: a redirect to the CDN that carries the file's metadata.
    let lfs = client
        .head(format!(
            "{}/{REPO}/resolve/{}/model-Q4_K_M.gguf",
            hub.endpoint(),
            repo.commit
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(lfs.status(), StatusCode::FOUND);
    let headers = lfs.headers();
    assert_eq!(header(headers, "x-linked-etag"), format!("\"{sha256}\""));
    assert_eq!(header(headers, "x-linked-size"), weights.len().to_string());
    assert_eq!(header(headers, "x-repo-commit"), repo.commit);
    assert!(headers.contains_key(ETAG));
    let location = header(headers, LOCATION.as_str());
    assert!(
        location.starts_with(&format!("{}/repos/{REPO}/{sha256}/", hub.cdn_endpoint())),
        "{location}"
    );
    let cdn = client.head(location).send().await.unwrap();
    assert_eq!(cdn.status(), StatusCode::OK);
    assert_eq!(header(cdn.headers(), "etag"), format!("\"{sha256}\""));
    assert_eq!(
        header(cdn.headers(), CONTENT_LENGTH.as_str()),
        weights.len().to_string()
    );

    // Errors carry the codes the client maps to its exceptions, and a JSON body.
    let cases = [
        (
            format!("{}/{REPO}/resolve/v2/config.json", hub.endpoint()),
            StatusCode::NOT_FOUND,
            "RevisionNotFound",
        ),
        (
            format!("{}/{REPO}/resolve/main/missing.gguf", hub.endpoint()),
            StatusCode::NOT_FOUND,
            "EntryNotFound",
        ),
        (
            format!("{}/{PRIVATE_REPO}/resolve/main/config.json", hub.endpoint()),
            StatusCode::UNAUTHORIZED,
            "RepoNotFound",
        ),
        (
            format!("{}/api/models/someone/else", hub.endpoint()),
            StatusCode::UNAUTHORIZED,
            "RepoNotFound",
        ),
    ];
    for (url, status, code) in cases {
        let response = client.get(&url).send().await.unwrap();
        assert_eq!(response.status(), status, "{url}");
        assert_eq!(header(response.headers(), "x-error-code"), code, "{url}");
        let body: serde_json::Value = response.json().await.unwrap();
        assert!(body["error"].is_string(), "{url}: {body}");
    }
    let missing = client
        .head(format!(
            "{}/{REPO}/resolve/main/missing.gguf",
            hub.endpoint()
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(header(missing.headers(), "x-repo-commit"), repo.commit);

    // The model info and the tree listing.
    let (_, info) = get_json(
        &client,
        &format!("{}/api/models/{REPO}?blobs=true", hub.endpoint()),
    )
    .await;
    assert_eq!(info["id"], REPO);
    assert_eq!(info["sha"], repo.commit.as_str());
    assert_eq!(info["private"], false);
    let siblings = info["siblings"].as_array().unwrap();
    assert_eq!(siblings.len(), repo.files.len());
    let sibling = siblings
        .iter()
        .find(|sibling| sibling["rfilename"] == "model-Q4_K_M.gguf")
        .unwrap();
    assert_eq!(sibling["lfs"]["sha256"], sha256.as_str());
    assert_eq!(sibling["size"], weights.len());

    let (_, tree) = get_json(
        &client,
        &format!(
            "{}/api/models/{REPO}/tree/main?recursive=true",
            hub.endpoint()
        ),
    )
    .await;
    let tree = tree.as_array().unwrap();
    assert_eq!(tree.len(), repo.files.len());
    let config_entry = tree
        .iter()
        .find(|entry| entry["path"] == "config.json")
        .unwrap();
    assert_eq!(config_entry["type"], "file");
    assert_eq!(
        config_entry["oid"],
        HubDouble::git_blob_oid(CONFIG).as_str()
    );
    assert_eq!(config_entry["size"], CONFIG.len());
    assert!(config_entry.get("lfs").is_none());
    let weights_entry = tree
        .iter()
        .find(|entry| entry["path"] == "model-Q4_K_M.gguf")
        .unwrap();
    assert_eq!(weights_entry["size"], weights.len());
    assert_eq!(weights_entry["lfs"]["oid"], sha256.as_str());
    assert_eq!(weights_entry["lfs"]["size"], weights.len());
    assert!(weights_entry["lfs"]["pointerSize"].as_u64().unwrap() > 100);

    assert_eq!(
        hub.total_bytes_served(),
        0,
        "HEADs and listings send no file bytes"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ranges_are_answered_206_and_unsatisfiable_ones_416() {
    let repo = model_repo();
    let hub = HubDouble::start(vec![repo.clone()]).await;
    let client = reqwest::Client::new();
    let weights = contents(&repo.files, "model-Q4_K_M.gguf");
    let link = cdn_link(&hub, REPO, "model-Q4_K_M.gguf").await;

    assert_ranges_answered(&client, &link, weights).await;

    // A regular file is served in place by the hub, ranges included.
    let suffix = client
        .get(format!(
            "{}/{REPO}/resolve/main/config.json",
            hub.endpoint()
        ))
        .header(RANGE, "bytes=-5")
        .send()
        .await
        .unwrap();
    assert_eq!(suffix.status(), StatusCode::PARTIAL_CONTENT);
    assert_eq!(suffix.bytes().await.unwrap(), CONFIG[CONFIG.len() - 5..]);

    assert_eq!(hub.bytes_served(REPO, "model-Q4_K_M.gguf"), 1000 + 10);
    assert_eq!(hub.bytes_served(REPO, "config.json"), 5);
    assert!(hub
        .requests()
        .iter()
        .any(|request| request.ends_with(" bytes=1000-1999")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_throttle_slows_file_bodies_down() {
    let weights = pseudo_random(5, 200 * 1000);
    let hub = HubDouble::start(vec![HubRepo::new(
        REPO,
        vec![HubFile::lfs("model-Q4_K_M.gguf", weights.clone())],
    )])
    .await;
    let client = reqwest::Client::new();
    let url = format!("{}/{REPO}/resolve/main/model-Q4_K_M.gguf", hub.endpoint());

    hub.set_throttle(Some(100_000));
    let started = tokio::time::Instant::now();
    let body = get_bytes(&client, &url).await;
    let throttled = started.elapsed();
    assert_eq!(body, weights);
    // 200 kB at 100 kB/s: about two seconds; loose bounds, this is no benchmark.
    assert!(
        (Duration::from_millis(1500)..Duration::from_secs(15)).contains(&throttled),
        "took {throttled:?}"
    );

    hub.set_throttle(None);
    let started = tokio::time::Instant::now();
    let body = get_bytes(&client, &url).await;
    assert_eq!(body, weights);
    assert!(
        started.elapsed() < throttled,
        "full speed took {:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_serves_other_bytes_than_the_listing_names() {
    let repo = model_repo();
    let hub = HubDouble::start(vec![repo.clone()]).await;
    let client = reqwest::Client::new();
    let weights = contents(&repo.files, "model-Q4_K_M.gguf");
    let url = format!("{}/{REPO}/resolve/main/model-Q4_K_M.gguf", hub.endpoint());

    hub.corrupt(REPO, "model-Q4_K_M.gguf");
    hub.corrupt(REPO, "config.json");

    let served = get_bytes(&client, &url).await;
    assert_eq!(served.len(), weights.len());
    assert_ne!(served, weights);
    assert_ne!(HubDouble::sha256(&served), HubDouble::sha256(weights));
    // The hub still names the original contents.
    let link = no_redirects().head(&url).send().await.unwrap();
    assert_eq!(
        header(link.headers(), "x-linked-etag"),
        format!("\"{}\"", HubDouble::sha256(weights))
    );

    let config = client
        .get(format!(
            "{}/{REPO}/resolve/main/config.json",
            hub.endpoint()
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(
        header(config.headers(), "etag"),
        format!("\"{}\"", HubDouble::git_blob_oid(CONFIG))
    );
    let config = config.bytes().await.unwrap();
    assert_eq!(config.len(), CONFIG.len());
    assert_ne!(
        HubDouble::git_blob_oid(&config),
        HubDouble::git_blob_oid(CONFIG)
    );

    // Other files are untouched.
    let split = get_bytes(
        &client,
        &format!(
            "{}/{REPO}/resolve/main/model-00001-of-00002.gguf",
            hub.endpoint()
        ),
    )
    .await;
    assert_eq!(split, contents(&repo.files, "model-00001-of-00002.gguf"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_download_counts_only_the_bytes_sent() {
    let size: u64 = 4 * 1024 * 1024;
    let hub = HubDouble::start(vec![HubRepo::new(
        REPO,
        vec![HubFile::lfs(
            "model-Q4_K_M.gguf",
            pseudo_random(6, size as usize),
        )],
    )])
    .await;
    hub.set_throttle(Some(1_000_000));
    let mut response = reqwest::get(format!(
        "{}/{REPO}/resolve/main/model-Q4_K_M.gguf",
        hub.endpoint()
    ))
    .await
    .unwrap();
    let mut read = 0u64;
    while read < 200 * 1024 {
        let chunk = response.chunk().await.unwrap().expect("more body");
        read += chunk.len() as u64;
    }
    drop(response);

    // Once the server notices the closed connection the count stops moving.
    let mut served = hub.bytes_served(REPO, "model-Q4_K_M.gguf");
    for _ in 0..25 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = hub.bytes_served(REPO, "model-Q4_K_M.gguf");
        if now == served {
            break;
        }
        served = now;
    }
    assert!(served >= read, "served {served} < read {read}");
    assert!(
        served < size / 2,
        "served {served} of {size} bytes after the client read {read} and hung up"
    );
    assert_eq!(hub.total_bytes_served(), served);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_transfers_in_flight_and_stops_listening() {
    let hub = HubDouble::start(vec![HubRepo::new(
        REPO,
        vec![HubFile::lfs(
            "model-Q4_K_M.gguf",
            pseudo_random(7, 1024 * 1024),
        )],
    )])
    .await;
    let endpoint = hub.endpoint();
    let url = format!("{endpoint}/{REPO}/resolve/main/model-Q4_K_M.gguf");
    hub.set_throttle(Some(50_000));
    let mut response = reqwest::get(&url).await.unwrap();
    response.chunk().await.unwrap().expect("a first chunk");

    tokio::time::timeout(Duration::from_secs(10), hub.shutdown())
        .await
        .expect("shutdown does not wait for a throttled transfer to finish");

    let cut = loop {
        match response.chunk().await {
            Ok(Some(_)) => continue,
            Ok(None) => break false,
            Err(_) => break true,
        }
    };
    assert!(
        cut,
        "the cut transfer ends in an error, not in a short success"
    );
    assert!(
        reqwest::get(&url).await.is_err(),
        "nothing listens at {endpoint} any more"
    );
}
