//! The model cache's files: listing, holds, deletion and eviction under a size cap,
//! with files downloaded for real from the hub double (`gantry_testkit::hub`, a TEST
//! DOUBLE of the Hugging Face hub's HTTP protocol).

use std::sync::Arc;
use std::time::Duration;

use gantry_source::cache::{ModelCache, Progress};
use gantry_source::files::DeleteError;
use gantry_source::{SourceConfig, Sources};
use gantry_testkit::hub::{HubDouble, HubFile, HubRepo};
use gantry_types::{BackendKind, ModelFileState, ModelSource};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

const KIB: usize = 1024;

fn bytes(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

async fn hub() -> HubDouble {
    HubDouble::start(vec![
        HubRepo::new("org/a", vec![HubFile::lfs("a.gguf", bytes(1, 300 * KIB))]),
        HubRepo::new("org/b", vec![HubFile::lfs("b.gguf", bytes(2, 300 * KIB))]),
        HubRepo::new("org/c", vec![HubFile::lfs("c.gguf", bytes(3, 300 * KIB))]),
    ])
    .await
}

fn cache(hub: &HubDouble, root: &std::path::Path, max: Option<u64>) -> Arc<ModelCache> {
    let sources = Sources::new(SourceConfig {
        hf_endpoint: hub.endpoint(),
        ..SourceConfig::default()
    });
    Arc::new(ModelCache::new(root.to_owned(), sources).with_max_bytes(max))
}

fn source(repo: &str) -> ModelSource {
    ModelSource::Huggingface {
        repo_id: repo.to_owned(),
        file: None,
        revision: None,
    }
}

/// Fetches `repo` for `owner`; returns the hold.
async fn fetch(cache: &Arc<ModelCache>, repo: &str, owner: &str) -> gantry_source::files::Hold {
    let resolved = cache
        .sources()
        .resolve(&source(repo), BackendKind::LlamaCpp)
        .await
        .unwrap();
    let (progress, _) = watch::channel(Progress::default());
    let (_, hold) = cache
        .fetch_held(owner, &resolved, &progress, &CancellationToken::new())
        .await
        .unwrap();
    hold
}

#[tokio::test]
async fn files_are_listed_with_their_names_and_users_and_deleted_only_when_unused() {
    let hub = hub().await;
    let root = tempfile::tempdir().unwrap();
    let cache = cache(&hub, root.path(), None);
    let hold = fetch(&cache, "org/a", "alpha#0").await;

    let files = cache.list().await;
    assert_eq!(files.len(), 1, "{files:?}");
    let file = &files[0];
    assert_eq!(file.state, ModelFileState::Ready);
    assert_eq!(file.size, 300 * KIB as u64);
    assert_eq!(file.bytes_done, file.size);
    assert_eq!(file.models, vec!["alpha".to_owned()]);
    assert!(file.blob.starts_with("sha256-"), "{}", file.blob);
    assert_eq!(file.names.len(), 1);
    assert!(
        file.names[0].starts_with("hf/org/a/") && file.names[0].ends_with("/a.gguf"),
        "{:?}",
        file.names
    );
    assert!(file.last_used_at.is_some());

    let in_use = cache.delete(&file.blob).await.unwrap_err();
    assert!(
        matches!(&in_use, DeleteError::InUse(m) if m.contains("alpha#0")),
        "{in_use:?}"
    );
    drop(hold);
    cache.delete(&file.blob).await.unwrap();
    assert!(cache.list().await.is_empty());
    assert!(
        !root.path().join("snapshots/hf/org/a").exists(),
        "the model directory's names are removed with the file"
    );
    assert!(matches!(
        cache.delete(&file.blob).await.unwrap_err(),
        DeleteError::NotFound(_)
    ));
    assert!(matches!(
        cache.delete("../etc/passwd").await.unwrap_err(),
        DeleteError::Invalid(_)
    ));
}

#[tokio::test]
async fn a_size_cap_evicts_the_least_recently_used_unheld_files() {
    let hub = hub().await;
    let root = tempfile::tempdir().unwrap();
    // Room for two of the three 300 KiB files.
    let cache = cache(&hub, root.path(), Some(700 * KIB as u64));
    drop(fetch(&cache, "org/a", "alpha#0").await);
    tokio::time::sleep(Duration::from_millis(20)).await;
    let b = fetch(&cache, "org/b", "beta#0").await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    // `a` is used again, so `b` becomes the least recently used; but `b` is held.
    drop(fetch(&cache, "org/a", "alpha#0").await);
    tokio::time::sleep(Duration::from_millis(20)).await;

    let _c = fetch(&cache, "org/c", "gamma#0").await;
    let names: Vec<String> = cache
        .list()
        .await
        .iter()
        .flat_map(|f| f.names.clone())
        .collect();
    assert!(
        names.iter().any(|n| n.starts_with("hf/org/b/")),
        "held: {names:?}"
    );
    assert!(
        names.iter().any(|n| n.starts_with("hf/org/c/")),
        "{names:?}"
    );
    assert!(
        !names.iter().any(|n| n.starts_with("hf/org/a/")),
        "the unheld file is evicted even though used more recently: {names:?}"
    );

    // Released, `b` is now the oldest and goes when `a` comes back.
    drop(b);
    let _a = fetch(&cache, "org/a", "alpha#0").await;
    let names: Vec<String> = cache
        .list()
        .await
        .iter()
        .flat_map(|f| f.names.clone())
        .collect();
    assert!(
        !names.iter().any(|n| n.starts_with("hf/org/b/")),
        "{names:?}"
    );
    assert_eq!(names.len(), 2, "{names:?}");
    let on_disk: u64 = cache.list().await.iter().map(|f| f.bytes_done).sum();
    assert!(on_disk <= 700 * KIB as u64, "{on_disk}");
}

#[tokio::test]
async fn an_interrupted_download_is_listed_as_partial_with_its_name() {
    let hub = hub().await;
    hub.set_throttle(Some(200 * KIB as u64));
    let root = tempfile::tempdir().unwrap();
    let cache = cache(&hub, root.path(), None);
    let resolved = cache
        .sources()
        .resolve(&source("org/a"), BackendKind::LlamaCpp)
        .await
        .unwrap();
    let cancel = CancellationToken::new();
    let (progress, mut updates) = watch::channel(Progress::default());
    let fetching = {
        let cache = Arc::clone(&cache);
        let cancel = cancel.clone();
        tokio::spawn(async move {
            cache
                .fetch_held("alpha#0", &resolved, &progress, &cancel)
                .await
                .map(|_| ())
        })
    };
    while updates.borrow_and_update().bytes_done == 0 {
        updates.changed().await.unwrap();
    }
    let files = cache.list().await;
    assert_eq!(files[0].state, ModelFileState::Downloading, "{files:?}");
    assert_eq!(files[0].size, 300 * KIB as u64);
    assert!(matches!(
        cache.delete(&files[0].blob).await.unwrap_err(),
        DeleteError::InUse(_)
    ));
    cancel.cancel();
    assert!(matches!(
        fetching.await.unwrap(),
        Err(gantry_source::SourceError::Cancelled)
    ));
    let files = cache.list().await;
    assert_eq!(files[0].state, ModelFileState::Partial, "{files:?}");
    assert!(files[0].bytes_done > 0 && files[0].bytes_done < files[0].size);
    assert!(files[0].names[0].ends_with("/a.gguf"), "{files:?}");
    assert!(files[0].models.is_empty(), "the hold ended with the fetch");
    cache.delete(&files[0].blob).await.unwrap();
    assert!(cache.list().await.is_empty());
}
