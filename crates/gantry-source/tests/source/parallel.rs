//! Large files in parallel ranges, downloaded for real from the hub double
//! (`gantry_testkit::hub`, a TEST DOUBLE of the Hugging Face hub's HTTP protocol): several
//! connections at once, resumed segment by segment after the download is torn down
//! mid-way, verified as a whole, and fetched in one piece from a server that ignores
//! `Range`.

use std::sync::Arc;
use std::time::Duration;

use gantry_source::cache::{ModelCache, Progress};
use gantry_source::parallel::Parallel;
use gantry_source::{SourceConfig, SourceError, Sources};
use gantry_testkit::hub::{HubDouble, HubFile, HubRepo};
use gantry_types::{BackendKind, ModelFileState, ModelSource};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

const MIB: usize = 1 << 20;
const REPO: &str = "org/big";
const FILE: &str = "big.gguf";
const SIZE: usize = 6 * MIB;

fn contents() -> Vec<u8> {
    (0..SIZE)
        .map(|i| (i as u8).wrapping_mul(7) ^ (i >> 12) as u8)
        .collect()
}

async fn hub() -> HubDouble {
    HubDouble::start(vec![HubRepo::new(
        REPO,
        vec![HubFile::lfs(FILE, contents())],
    )])
    .await
}

/// Four connections for files of 4 MiB and more (segments of at least 1 MiB).
fn cache(hub: &HubDouble, root: &std::path::Path) -> Arc<ModelCache> {
    let sources = Sources::new(SourceConfig {
        hf_endpoint: hub.endpoint(),
        ..SourceConfig::default()
    });
    Arc::new(
        ModelCache::new(root.to_owned(), sources).with_parallel(Parallel {
            connections: 4,
            min_segment: MIB as u64,
        }),
    )
}

async fn fetch(cache: &ModelCache) -> Result<std::path::PathBuf, SourceError> {
    let resolved = cache
        .sources()
        .resolve(
            &ModelSource::Huggingface {
                repo_id: REPO.into(),
                file: Some(FILE.into()),
                revision: None,
            },
            BackendKind::LlamaCpp,
        )
        .await?;
    let (progress, _) = watch::channel(Progress::default());
    let fetched = cache
        .fetch(&resolved, &progress, &CancellationToken::new())
        .await?;
    Ok(fetched.files[0].clone())
}

fn leftovers(root: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(root.join("partial"))
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_file_comes_over_several_connections_at_once_and_is_verified() {
    let hub = hub().await;
    // Each connection at 4 MiB/s: the four segments overlap for about 0.4 s.
    hub.set_throttle(Some(4 * MIB as u64));
    let root = tempfile::tempdir().unwrap();
    let cache = cache(&hub, root.path());
    let path = fetch(&cache).await.unwrap();

    assert_eq!(std::fs::read(&path).unwrap(), contents());
    assert_eq!(hub.most_concurrent(REPO, FILE), 4, "{:?}", hub.requests());
    // The header read for the resolve is not done here; every byte went out once.
    assert_eq!(hub.bytes_served(REPO, FILE), SIZE as u64);
    let ranges: Vec<String> = hub
        .requests()
        .into_iter()
        .filter(|r| r.starts_with("GET /repos/") && r.contains("bytes="))
        .collect();
    assert_eq!(ranges.len(), 4, "{ranges:?}");
    assert!(
        leftovers(root.path()).is_empty(),
        "{:?}",
        leftovers(root.path())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_download_torn_down_mid_way_resumes_every_segment_from_its_bytes() {
    let hub = hub().await;
    // 256 KiB/s per connection: the file takes about six seconds over four.
    hub.set_throttle(Some(MIB as u64 / 4));
    let root = tempfile::tempdir().unwrap();
    let cache = cache(&hub, root.path());
    let task = tokio::spawn({
        let cache = Arc::clone(&cache);
        async move { fetch(&cache).await }
    });
    // Until the recorded progress passes a third of the file.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let listed = loop {
        let files = cache.list().await;
        if let Some(file) = files
            .iter()
            .find(|f| f.bytes_done * 3 >= SIZE as u64 && f.state == ModelFileState::Downloading)
        {
            break file.clone();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no progress: {files:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(listed.size, SIZE as u64);
    assert!(listed.bytes_done < SIZE as u64, "{listed:?}");
    // Torn down like a process that dies: no clean stop, no last save.
    task.abort();
    let _ = task.await;
    let before = hub.bytes_served(REPO, FILE);
    assert!(
        leftovers(root.path())
            .iter()
            .any(|n| n.ends_with(".part.ranges")),
        "{:?}",
        leftovers(root.path())
    );

    hub.set_throttle(None);
    let path = fetch(&cache).await.unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), contents());
    let served = hub.bytes_served(REPO, FILE);
    println!("{before} bytes served before the tear-down, {served} in all for {SIZE}");
    assert!(
        (served as f64) < 1.2 * SIZE as f64,
        "{served} bytes served for a {SIZE}-byte file"
    );
    let resumed = hub
        .requests()
        .into_iter()
        .filter(|r| r.starts_with("GET /repos/") && r.contains("bytes="))
        .skip(4)
        .collect::<Vec<_>>();
    assert!(!resumed.is_empty());
    // Every segment had bytes recorded, so none starts over.
    let segment = SIZE.div_ceil(4) as u64;
    for request in &resumed {
        let start: u64 = request
            .rsplit("bytes=")
            .next()
            .and_then(|r| r.split('-').next())
            .and_then(|n| n.parse().ok())
            .unwrap();
        assert!(
            !start.is_multiple_of(segment),
            "{request} starts a segment over: {resumed:?}"
        );
    }
    assert!(
        leftovers(root.path()).is_empty(),
        "{:?}",
        leftovers(root.path())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_ignores_ranges_gets_one_download_of_the_whole_file() {
    let hub = hub().await;
    hub.set_ranges(false);
    let root = tempfile::tempdir().unwrap();
    let cache = cache(&hub, root.path());
    let path = fetch(&cache).await.unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), contents());
    let gets = hub
        .requests()
        .into_iter()
        .filter(|r| r.starts_with("GET /repos/"))
        .count();
    // The probing range requests (answered with the whole file) and the one download.
    assert!(gets >= 2, "{:?}", hub.requests());
    assert!(
        leftovers(root.path()).is_empty(),
        "{:?}",
        leftovers(root.path())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_bytes_in_ranges_fail_with_both_digests_and_leave_nothing() {
    let hub = hub().await;
    hub.corrupt(REPO, FILE);
    let root = tempfile::tempdir().unwrap();
    let cache = cache(&hub, root.path());
    let error = fetch(&cache).await.unwrap_err();
    let listed = HubDouble::sha256(&contents());
    let message = error.to_string();
    assert!(matches!(error, SourceError::Corrupt(_)), "{error:?}");
    assert!(message.contains(&listed), "{message}");
    assert!(
        leftovers(root.path()).is_empty(),
        "{:?}",
        leftovers(root.path())
    );
    assert_eq!(
        std::fs::read_dir(root.path().join("blobs"))
            .unwrap()
            .count(),
        0
    );
}
