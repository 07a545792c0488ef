//! Proves the ModelScope double is faithful: the official `modelscope` Python client, in a
//! real process, downloads single files and filtered snapshots from it (choosing the
//! revision from its tags, listing with `Root`, verifying every file against the listed
//! SHA-256) and turns its errors into the client's own; then reqwest checks the wire details
//! a downloader relies on (the envelope, redirects, ranges, corruption).
//!
//! Needs `GANTRY_PYTHON`, a python with `modelscope` (scripts/python-env.sh prints it;
//! scripts/test.sh sets it). Without it the client tests fail saying so; they never skip.

use std::path::Path;

use gantry_testkit::modelscope::{ModelscopeDouble, ModelscopeFile, ModelscopeRepo};
use reqwest::header::{CONTENT_LENGTH, LOCATION, RANGE};
use reqwest::StatusCode;
use serde::Serialize;

use crate::common::{
    assert_ranges_answered, assert_requested, assert_sent_once, contents, get_bytes, get_json,
    header, no_redirects, pseudo_random, read, run_client_driver, ClientOutcome, CONFIG,
};

const REPO: &str = "gantry-test/tiny-gguf";
const TAG: &str = "v1.0";
const TOKENIZER: &[u8] = br#"{"version": "1.0", "model": {"type": "BPE"}}"#;

fn model_repo() -> ModelscopeRepo {
    ModelscopeRepo::new(
        REPO,
        vec![
            ModelscopeFile::regular("config.json", CONFIG),
            ModelscopeFile::regular("tokenizer/tokenizer.json", TOKENIZER),
            ModelscopeFile::lfs("model-Q4_K_M.gguf", pseudo_random(1, 300 * 1024)),
            ModelscopeFile::lfs("model-00001-of-00002.gguf", pseudo_random(2, 48 * 1024)),
            ModelscopeFile::lfs("model-00002-of-00002.gguf", pseudo_random(3, 32 * 1024)),
        ],
    )
    .with_tag(TAG)
}

// ---------------------------------------------------------------------------------------
// The official client, in a real process.
// ---------------------------------------------------------------------------------------

/// Runs each call in one Python process and prints one JSON outcome per call.
const CLIENT_DRIVER: &str = r#"
import json, sys
from modelscope.hub.file_download import model_file_download
from modelscope.hub.snapshot_download import snapshot_download

outcomes = []
for call in json.loads(sys.argv[1]):
    try:
        if call["kind"] == "model_file_download":
            path = model_file_download(call["model_id"], call["file_path"], revision=call["revision"])
        elif call["kind"] == "snapshot_download":
            path = snapshot_download(
                call["model_id"], revision=call["revision"], allow_patterns=call["allow_patterns"]
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
    ModelFileDownload {
        model_id: &'a str,
        file_path: &'a str,
        revision: Option<&'a str>,
    },
    SnapshotDownload {
        model_id: &'a str,
        revision: Option<&'a str>,
        allow_patterns: Vec<&'a str>,
    },
}

/// `model_file_download` without a revision: the client chooses one.
fn download<'a>(model_id: &'a str, file_path: &'a str) -> ClientCall<'a> {
    ClientCall::ModelFileDownload {
        model_id,
        file_path,
        revision: None,
    }
}

/// Runs `calls` through the official client against `hub`, with its cache and home in
/// `dir` and no token of the machine's.
async fn run_official_client(
    hub: &ModelscopeDouble,
    dir: &Path,
    calls: &[ClientCall<'_>],
) -> Vec<ClientOutcome> {
    run_client_driver("modelscope", CLIENT_DRIVER, calls, |command| {
        command
            .env("MODELSCOPE_ENDPOINT", hub.endpoint())
            .env("MODELSCOPE_CACHE", dir.join("cache"))
            .env("MODELSCOPE_HOME", dir.join("home"))
            .env("TQDM_DISABLE", "1")
            .env_remove("MODELSCOPE_API_TOKEN")
            .env_remove("MODELSCOPE_DOMAIN")
            .env_remove("MODELSCOPE_SDK_DEBUG")
            .env_remove("MODELSCOPE_INTER_CLOUD_REGIONS")
            .env_remove("INTER_CLOUD_ACCELERATION_REGIONS");
    })
    .await
}

/// The files below `dir`, as sorted `/`-separated relative paths.
fn files_below(dir: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(root, &path, out);
            } else {
                let relative = path.strip_prefix(root).unwrap();
                out.push(relative.to_string_lossy().replace('\\', "/"));
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_client_downloads_regular_and_lfs_files() {
    let repo = model_repo();
    let hub = ModelscopeDouble::start(vec![repo.clone()]).await;
    let dir = tempfile::tempdir().unwrap();

    let outcomes = run_official_client(
        &hub,
        dir.path(),
        &[
            download(REPO, "config.json"),
            download(REPO, "model-Q4_K_M.gguf"),
            download(REPO, "no-such-file.gguf"),
            ClientCall::ModelFileDownload {
                model_id: REPO,
                file_path: "config.json",
                revision: Some("no-such-branch"),
            },
            download("gantry-test/no-such-model", "config.json"),
        ],
    )
    .await;

    let config = outcomes[0].path();
    let weights = outcomes[1].path();
    assert_eq!(read(config), CONFIG);
    assert_eq!(read(weights), contents(&repo.files, "model-Q4_K_M.gguf"));
    // Without a revision the client takes the newest tag from `revisions` (made before its
    // own release) and files the download under it.
    let snapshot = format!("models/gantry-test--tiny-gguf/snapshots/{TAG}");
    assert!(
        config.ends_with(format!("{snapshot}/config.json")),
        "{config:?}"
    );
    assert!(
        weights.ends_with(format!("{snapshot}/model-Q4_K_M.gguf")),
        "{weights:?}"
    );

    // The client turns the hub's 404s into HTTPError (through its NotExistError).
    for outcome in &outcomes[2..] {
        let (error, message) = outcome.error();
        assert_eq!(error, "HTTPError", "{message}");
    }
    let (_, message) = outcomes[2].error();
    assert!(message.contains("获取模型文件失败"), "{message}");

    let weights_len = contents(&repo.files, "model-Q4_K_M.gguf").len() as u64;
    assert_sent_once(
        &hub,
        REPO,
        &repo.files,
        &["config.json", "model-Q4_K_M.gguf"],
        &[],
    );
    assert_eq!(hub.total_bytes_served(), CONFIG.len() as u64 + weights_len);

    // The weights went through the redirect to the object store; the config was answered
    // in place.
    let sha256 = ModelscopeDouble::sha256(contents(&repo.files, "model-Q4_K_M.gguf"));
    assert_requested(
        &hub,
        [
            format!("GET /api/v1/models/{REPO}/revisions"),
            format!("GET /api/v1/models/{REPO}/repo?Revision={TAG}&FilePath=config.json"),
            format!("GET /api/v1/models/{REPO}/repo?Revision={TAG}&FilePath=model-Q4_K_M.gguf"),
            format!("GET /lfs/{REPO}/{sha256}"),
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_download_fetches_only_the_matching_files() {
    let repo = model_repo();
    let hub = ModelscopeDouble::start(vec![repo.clone()]).await;
    let dir = tempfile::tempdir().unwrap();

    let outcomes = run_official_client(
        &hub,
        dir.path(),
        &[
            ClientCall::SnapshotDownload {
                model_id: REPO,
                revision: Some(&repo.commit),
                allow_patterns: vec!["*-of-*.gguf"],
            },
            ClientCall::SnapshotDownload {
                model_id: REPO,
                revision: None,
                allow_patterns: vec!["tokenizer/*"],
            },
            // The hub answers a revision the model does not have with an empty listing,
            // so the client downloads nothing and does not complain.
            ClientCall::SnapshotDownload {
                model_id: REPO,
                revision: Some("no-such-branch"),
                allow_patterns: vec!["*"],
            },
        ],
    )
    .await;

    let parts = outcomes[0].path();
    assert!(
        parts.ends_with(format!("snapshots/{}", repo.commit)),
        "{parts:?}"
    );
    let names = files_below(parts);
    assert_eq!(
        names,
        ["model-00001-of-00002.gguf", "model-00002-of-00002.gguf"]
    );
    for name in &names {
        assert_eq!(
            read(&parts.join(name)),
            contents(&repo.files, name),
            "{name}"
        );
    }
    let others = ["model-Q4_K_M.gguf", "config.json"];
    assert_sent_once(&hub, REPO, &repo.files, &names, &others);

    let tokenizer = outcomes[1].path();
    assert!(tokenizer.ends_with("snapshots/master"), "{tokenizer:?}");
    assert_eq!(files_below(tokenizer), ["tokenizer/tokenizer.json"]);
    assert_eq!(read(&tokenizer.join("tokenizer/tokenizer.json")), TOKENIZER);

    let nothing = outcomes[2].path();
    assert!(files_below(nothing).is_empty(), "{nothing:?}");

    // The client listed the commit's tree; for a literal directory it listed only that
    // directory (`Root`).
    assert_requested(
        &hub,
        [
            format!(
                "GET /api/v1/models/{REPO}/repo/files?Revision={}&Recursive=True",
                repo.commit
            ),
            format!(
                "GET /api/v1/models/{REPO}/repo/files?Revision=master&Recursive=True&Root=tokenizer"
            ),
            format!("GET /api/v1/models/{REPO}/repo/files?Revision=no-such-branch&Recursive=True"),
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_client_refuses_bytes_that_do_not_match_the_listing() {
    let repo = model_repo();
    let hub = ModelscopeDouble::start(vec![repo.clone()]).await;
    hub.corrupt(REPO, "model-00002-of-00002.gguf");
    let dir = tempfile::tempdir().unwrap();

    let outcomes = run_official_client(
        &hub,
        dir.path(),
        &[ClientCall::SnapshotDownload {
            model_id: REPO,
            revision: None,
            allow_patterns: vec!["*-of-*.gguf"],
        }],
    )
    .await;

    let (error, message) = outcomes[0].error();
    assert_eq!(error, "FileDownloadError", "{message}");
    assert!(message.contains("1 of 2"), "{message}");
    let snapshot = dir
        .path()
        .join("cache/models/gantry-test--tiny-gguf/snapshots/master");
    assert_eq!(files_below(&snapshot), ["model-00001-of-00002.gguf"]);
}

// ---------------------------------------------------------------------------------------
// The wire, with reqwest.
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_answers_in_the_hubs_envelope() {
    let repo = model_repo();
    let hub = ModelscopeDouble::start(vec![repo.clone()]).await;
    let client = no_redirects();
    let api = format!("{}/api/v1/models/{REPO}", hub.endpoint());

    let (status, info) = get_json(&client, &api).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(info["Code"], 200);
    assert_eq!(info["Success"], true);
    assert_eq!(info["Data"]["Name"], "tiny-gguf");
    assert_eq!(info["Data"]["Path"], "gantry-test");

    let (_, revisions) = get_json(&client, &format!("{api}/revisions")).await;
    let map = &revisions["Data"]["RevisionMap"];
    assert_eq!(map["Branches"][0]["Revision"], "master");
    assert_eq!(map["Tags"][0]["Revision"], TAG);
    assert!(map["Tags"][0]["CreatedAt"].as_i64().unwrap() > 0);

    // The whole tree, with every file's size and SHA-256 and the commit.
    let (_, listing) = get_json(
        &client,
        &format!("{api}/repo/files?Revision={TAG}&Recursive=True"),
    )
    .await;
    let files = listing["Data"]["Files"].as_array().unwrap();
    assert_eq!(
        files.len(),
        repo.files.len() + 1,
        "the files and one directory"
    );
    assert_eq!(
        listing["Data"]["LatestCommitter"]["Id"],
        repo.commit.as_str()
    );
    let weights = files
        .iter()
        .find(|entry| entry["Path"] == "model-Q4_K_M.gguf")
        .unwrap();
    assert_eq!(weights["Type"], "blob");
    assert_eq!(weights["IsLFS"], true);
    assert_eq!(
        weights["Size"],
        contents(&repo.files, "model-Q4_K_M.gguf").len()
    );
    assert_eq!(
        weights["Sha256"],
        ModelscopeDouble::sha256(contents(&repo.files, "model-Q4_K_M.gguf")).as_str()
    );
    let directory = files
        .iter()
        .find(|entry| entry["Path"] == "tokenizer")
        .unwrap();
    assert_eq!(directory["Type"], "tree");

    // Not recursive: the top's children only.
    let (_, top) = get_json(
        &client,
        &format!("{api}/repo/files?Revision=master&Recursive=False"),
    )
    .await;
    assert!(top["Data"]["Files"]
        .as_array()
        .unwrap()
        .iter()
        .all(|entry| !entry["Path"].as_str().unwrap().contains('/')));

    // A revision the model does not have: a success without files.
    let (status, unknown) = get_json(
        &client,
        &format!("{api}/repo/files?Revision=v9&Recursive=True"),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(unknown["Success"], true);
    assert!(unknown["Data"]["Files"].is_null());

    // Errors: a 404 with the hub's business code in the envelope.
    let cases = [
        (
            format!(
                "{}/api/v1/models/gantry-test/nothing/repo/files?Revision=master",
                hub.endpoint()
            ),
            10_010_205_001_u64,
        ),
        (
            format!(
                "{}/api/v1/models/gantry-test/nothing/revisions",
                hub.endpoint()
            ),
            10_010_205_001,
        ),
        (
            format!("{api}/repo?Revision=master&FilePath=missing.gguf"),
            10_990_101_007,
        ),
        (
            format!("{api}/repo?Revision=v9&FilePath=config.json"),
            10_990_101_007,
        ),
    ];
    for (url, code) in cases {
        let (status, body) = get_json(&client, &url).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{url}");
        assert_eq!(body["Code"], code, "{url}: {body}");
        assert_eq!(body["Success"], false, "{url}: {body}");
        assert!(body["Message"].is_string(), "{url}: {body}");
    }

    // A regular file is answered in place; an LFS file is a redirect to the object store.
    let regular = client
        .head(format!("{api}/repo?Revision=master&FilePath=config.json"))
        .send()
        .await
        .unwrap();
    assert_eq!(regular.status(), StatusCode::OK);
    assert_eq!(
        header(regular.headers(), CONTENT_LENGTH.as_str()),
        CONFIG.len().to_string()
    );
    let lfs = client
        .get(format!(
            "{api}/repo?Revision={}&FilePath=model-Q4_K_M.gguf",
            repo.commit
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(lfs.status(), StatusCode::FOUND);
    let sha256 = ModelscopeDouble::sha256(contents(&repo.files, "model-Q4_K_M.gguf"));
    assert_eq!(
        header(lfs.headers(), LOCATION.as_str()),
        format!("{}/lfs/{REPO}/{sha256}", hub.oss_endpoint())
    );
    let object = client
        .head(format!("{}/lfs/{REPO}/{sha256}", hub.oss_endpoint()))
        .send()
        .await
        .unwrap();
    assert_eq!(object.status(), StatusCode::OK);
    assert_eq!(
        header(object.headers(), "x-linked-etag"),
        format!("\"{sha256}\"")
    );

    assert_eq!(
        hub.total_bytes_served(),
        0,
        "HEADs, redirects and listings send no file bytes"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ranges_are_answered_by_the_object_store_and_ignored_in_place() {
    let repo = model_repo();
    let hub = ModelscopeDouble::start(vec![repo.clone()]).await;
    let client = reqwest::Client::new();
    let api = format!("{}/api/v1/models/{REPO}", hub.endpoint());
    let weights = contents(&repo.files, "model-Q4_K_M.gguf");
    // reqwest follows the redirect and keeps the Range header.
    let url = format!("{api}/repo?Revision=master&FilePath=model-Q4_K_M.gguf");

    assert_ranges_answered(&client, &url, weights).await;

    // A file served in place ignores the range and sends everything.
    let config = client
        .get(format!("{api}/repo?Revision=master&FilePath=config.json"))
        .header(RANGE, "bytes=-5")
        .send()
        .await
        .unwrap();
    assert_eq!(config.status(), StatusCode::OK);
    assert_eq!(config.bytes().await.unwrap(), CONFIG);

    assert_eq!(hub.bytes_served(REPO, "model-Q4_K_M.gguf"), 1000 + 10);
    assert_eq!(hub.bytes_served(REPO, "config.json"), CONFIG.len() as u64);
    assert!(hub
        .requests()
        .iter()
        .any(|request| request.starts_with("GET /lfs/") && request.ends_with(" bytes=1000-1999")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_serves_other_bytes_than_the_listing_names() {
    let repo = model_repo();
    let hub = ModelscopeDouble::start(vec![repo.clone()]).await;
    let client = reqwest::Client::new();
    let api = format!("{}/api/v1/models/{REPO}", hub.endpoint());
    let weights = contents(&repo.files, "model-Q4_K_M.gguf");
    hub.corrupt(REPO, "model-Q4_K_M.gguf");

    let served = get_bytes(
        &client,
        &format!("{api}/repo?Revision=master&FilePath=model-Q4_K_M.gguf"),
    )
    .await;
    assert_eq!(served.len(), weights.len());
    assert_ne!(
        ModelscopeDouble::sha256(&served),
        ModelscopeDouble::sha256(weights)
    );
    // The listing still names the original contents.
    let (_, listing) = get_json(
        &client,
        &format!("{api}/repo/files?Revision=master&Recursive=True"),
    )
    .await;
    let entry = listing["Data"]["Files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|entry| entry["Path"] == "model-Q4_K_M.gguf")
        .unwrap()
        .clone();
    assert_eq!(entry["Sha256"], ModelscopeDouble::sha256(weights).as_str());

    // Other files are untouched.
    let config = get_bytes(
        &client,
        &format!("{api}/repo?Revision=master&FilePath=config.json"),
    )
    .await;
    assert_eq!(config, CONFIG);
}
