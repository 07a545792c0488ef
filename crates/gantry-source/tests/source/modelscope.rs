//! ModelScope sources, resolved and downloaded through the ModelScope double
//! (`gantry_testkit::modelscope`, a TEST DOUBLE of ModelScope's `/api/v1` HTTP API, checked
//! against the official `modelscope` client in its own test): which files a source stands
//! for, at which commit, the errors that say what to do, and the worker's cache fetching
//! and verifying the files (ranges through the hub's redirect to its object store).

use gantry_source::cache::{ModelCache, Progress};
use gantry_source::{RemoteFile, Resolved, SourceConfig, SourceError, Sources};
use gantry_testkit::modelscope::{ModelscopeDouble, ModelscopeFile, ModelscopeRepo};
use gantry_testkit::pseudo_random;
use gantry_types::{BackendKind, ModelSource};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

const GGUF_REPO: &str = "gantry-test/Tiny-GGUF";
const ENGINE_REPO: &str = "gantry-test/Tiny-Safetensors";
const TAG: &str = "v1.0";
const KIB: usize = 1024;

/// A safetensors file: the 8-byte length of its JSON header, the header, then `data_len`
/// bytes of data.
fn safetensors(data_len: usize) -> Vec<u8> {
    let header = format!(
        r#"{{"w":{{"dtype":"F32","shape":[{}],"data_offsets":[0,{data_len}]}}}}"#,
        data_len / 4
    );
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend(pseudo_random(9, data_len));
    bytes
}

fn gguf_repo() -> ModelscopeRepo {
    ModelscopeRepo::new(
        GGUF_REPO,
        vec![
            ModelscopeFile::regular("README.md", "# tiny\n"),
            ModelscopeFile::regular("configuration.json", r#"{"framework": "pytorch"}"#),
            ModelscopeFile::lfs("tiny-Q4_K_M.gguf", pseudo_random(1, 64 * KIB)),
            ModelscopeFile::lfs("quant/tiny-Q8_0.gguf", pseudo_random(2, 96 * KIB)),
            ModelscopeFile::lfs("big-Q4_K_M-00002-of-00003.gguf", pseudo_random(4, 40 * KIB)),
            ModelscopeFile::lfs("big-Q4_K_M-00001-of-00003.gguf", pseudo_random(3, 48 * KIB)),
            ModelscopeFile::lfs("big-Q4_K_M-00003-of-00003.gguf", pseudo_random(5, 8 * KIB)),
        ],
    )
    .with_tag(TAG)
}

fn engine_repo() -> ModelscopeRepo {
    ModelscopeRepo::new(
        ENGINE_REPO,
        vec![
            ModelscopeFile::regular("README.md", "# tiny\n"),
            ModelscopeFile::regular("config.json", r#"{"model_type": "llama"}"#),
            ModelscopeFile::regular("tokenizer.json", r#"{"version": "1.0"}"#),
            ModelscopeFile::lfs("model-00001-of-00002.safetensors", safetensors(256 * KIB)),
            ModelscopeFile::lfs("model-00002-of-00002.safetensors", safetensors(64 * KIB)),
            ModelscopeFile::regular("model.safetensors.index.json", r#"{"weight_map": {}}"#),
            ModelscopeFile::lfs("pytorch_model.bin", pseudo_random(6, 32 * KIB)),
            ModelscopeFile::lfs("original/consolidated.00.pth", pseudo_random(7, 32 * KIB)),
        ],
    )
}

fn contents<'a>(repo: &'a ModelscopeRepo, path: &str) -> &'a [u8] {
    &repo
        .files
        .iter()
        .find(|file| file.path == path)
        .unwrap_or_else(|| panic!("the fixture has no {path}"))
        .bytes
}

async fn double() -> (ModelscopeDouble, ModelscopeRepo, ModelscopeRepo) {
    let (gguf, engine) = (gguf_repo(), engine_repo());
    let double = ModelscopeDouble::start(vec![gguf.clone(), engine.clone()]).await;
    (double, gguf, engine)
}

fn sources(double: &ModelscopeDouble) -> Sources {
    Sources::new(SourceConfig {
        modelscope_endpoint: double.endpoint(),
        ..SourceConfig::default()
    })
}

fn source(repo_id: &str, file: Option<&str>, revision: Option<&str>) -> ModelSource {
    ModelSource::Modelscope {
        repo_id: repo_id.to_owned(),
        file: file.map(str::to_owned),
        revision: revision.map(str::to_owned),
    }
}

async fn resolve(
    double: &ModelscopeDouble,
    source: &ModelSource,
    backend: BackendKind,
) -> Result<Resolved, SourceError> {
    sources(double).resolve(source, backend).await
}

fn paths(resolved: &Resolved) -> Vec<&str> {
    resolved.files.iter().map(|f| f.path.as_str()).collect()
}

/// The download URL of `path` at `revision`, as the resolver must build it.
fn file_url(double: &ModelscopeDouble, repo_id: &str, revision: &str, file_path: &str) -> String {
    format!(
        "{}/api/v1/models/{repo_id}/repo?Revision={revision}&FilePath={file_path}",
        double.endpoint()
    )
}

#[tokio::test]
async fn a_named_file_resolves_to_its_size_and_sha256_at_the_commit() {
    let (double, repo, _) = double().await;
    let resolved = resolve(
        &double,
        &source(GGUF_REPO, Some("tiny-Q4_K_M.gguf"), None),
        BackendKind::LlamaCpp,
    )
    .await
    .unwrap();

    // master was resolved to the commit, which names the files in the cache and pins the
    // downloads.
    assert_eq!(resolved.commit.as_deref(), Some(repo.commit.as_str()));
    assert_eq!(resolved.key, format!("ms/{GGUF_REPO}/{}", repo.commit));
    let bytes = contents(&repo, "tiny-Q4_K_M.gguf");
    assert_eq!(
        resolved.files,
        [RemoteFile {
            path: "tiny-Q4_K_M.gguf".to_owned(),
            url: file_url(&double, GGUF_REPO, &repo.commit, "tiny-Q4_K_M.gguf"),
            size: Some(bytes.len() as u64),
            sha256: Some(ModelscopeDouble::sha256(bytes)),
            ..RemoteFile::default()
        }]
    );
    assert_eq!(
        double.requests(),
        [format!(
            "GET /api/v1/models/{GGUF_REPO}/repo/files?Revision=master&Recursive=True"
        )],
        "one listing resolves the source"
    );
}

#[tokio::test]
async fn a_glob_chooses_the_matching_file_in_any_directory() {
    let (double, repo, _) = double().await;
    let resolved = resolve(
        &double,
        &source(GGUF_REPO, Some("*Q8_0.gguf"), None),
        BackendKind::LlamaCpp,
    )
    .await
    .unwrap();
    assert_eq!(paths(&resolved), ["quant/tiny-Q8_0.gguf"]);
    assert_eq!(
        resolved.files[0].url,
        file_url(&double, GGUF_REPO, &repo.commit, "quant%2Ftiny-Q8_0.gguf")
    );

    // A glob that matches two models is ambiguous, and says which.
    let SourceError::Invalid(message) = resolve(
        &double,
        &source(GGUF_REPO, Some("*Q4_K_M*"), None),
        BackendKind::LlamaCpp,
    )
    .await
    .unwrap_err() else {
        panic!("an ambiguous glob is invalid")
    };
    assert!(
        message.contains("big-Q4_K_M") && message.contains("tiny-Q4_K_M"),
        "{message}"
    );
}

#[tokio::test]
async fn a_split_gguf_brings_every_part_first_part_first() {
    let (double, repo, _) = double().await;
    let resolved = resolve(
        &double,
        &source(GGUF_REPO, Some("big-Q4_K_M-00002-of-00003.gguf"), None),
        BackendKind::LlamaCpp,
    )
    .await
    .unwrap();
    assert_eq!(
        paths(&resolved),
        [
            "big-Q4_K_M-00001-of-00003.gguf",
            "big-Q4_K_M-00002-of-00003.gguf",
            "big-Q4_K_M-00003-of-00003.gguf"
        ]
    );
    assert_eq!(
        resolved.first_gguf().map(|f| f.path.as_str()),
        Some("big-Q4_K_M-00001-of-00003.gguf")
    );
    let sizes: Vec<u64> = ["00001", "00002", "00003"]
        .iter()
        .map(|part| contents(&repo, &format!("big-Q4_K_M-{part}-of-00003.gguf")).len() as u64)
        .collect();
    assert_eq!(resolved.total_size(), Some(sizes.iter().sum()));
}

#[tokio::test]
async fn an_engine_gets_only_the_weights_configs_and_tokenizer() {
    let (double, _, _) = double().await;
    for backend in [BackendKind::Vllm, BackendKind::Sglang] {
        let resolved = resolve(&double, &source(ENGINE_REPO, None, None), backend)
            .await
            .unwrap();
        assert_eq!(
            paths(&resolved),
            [
                "config.json",
                "model-00001-of-00002.safetensors",
                "model-00002-of-00002.safetensors",
                "model.safetensors.index.json",
                "tokenizer.json"
            ],
            "{backend:?}"
        );
    }
    // llama.cpp needs a GGUF, and this model has none.
    let SourceError::Invalid(message) = resolve(
        &double,
        &source(ENGINE_REPO, None, None),
        BackendKind::LlamaCpp,
    )
    .await
    .unwrap_err() else {
        panic!("a model without a GGUF is invalid for llama.cpp")
    };
    assert!(message.contains("no .gguf files"), "{message}");
}

#[tokio::test]
async fn a_tag_and_the_commit_resolve_to_the_same_files_as_master() {
    let (double, repo, _) = double().await;
    let file = Some("tiny-Q4_K_M.gguf");
    let at_master = resolve(
        &double,
        &source(GGUF_REPO, file, None),
        BackendKind::LlamaCpp,
    )
    .await
    .unwrap();
    let at_tag = resolve(
        &double,
        &source(GGUF_REPO, file, Some(TAG)),
        BackendKind::LlamaCpp,
    )
    .await
    .unwrap();
    let at_commit = resolve(
        &double,
        &source(GGUF_REPO, file, Some(&repo.commit.to_ascii_uppercase())),
        BackendKind::LlamaCpp,
    )
    .await
    .unwrap();
    assert_eq!(at_tag, at_master);
    assert_eq!(at_commit, at_master);
    assert!(double.requests().contains(&format!(
        "GET /api/v1/models/{GGUF_REPO}/repo/files?Revision={TAG}&Recursive=True"
    )));
}

#[tokio::test]
async fn without_the_commit_the_revision_names_the_files() {
    let repo = ModelscopeRepo::new(
        "gantry-test/No-Commit-Id",
        vec![ModelscopeFile::lfs(
            "tiny-Q4_K_M.gguf",
            pseudo_random(8, 4 * KIB),
        )],
    )
    .with_tag(TAG)
    .with_commit_id_hidden();
    let double = ModelscopeDouble::start(vec![repo.clone()]).await;
    let resolved = resolve(
        &double,
        &source(&repo.id, None, Some(TAG)),
        BackendKind::LlamaCpp,
    )
    .await
    .unwrap();
    assert_eq!(resolved.commit, None);
    assert_eq!(resolved.key, format!("ms/{}/{TAG}", repo.id));
    assert_eq!(
        resolved.files[0].url,
        file_url(&double, &repo.id, TAG, "tiny-Q4_K_M.gguf")
    );
    // The SHA-256 still pins the bytes.
    assert_eq!(
        resolved.files[0].sha256.as_deref(),
        Some(ModelscopeDouble::sha256(contents(&repo, "tiny-Q4_K_M.gguf")).as_str())
    );
}

#[tokio::test]
async fn a_missing_model_names_it_and_says_what_to_check() {
    let (double, _, _) = double().await;
    let error = resolve(
        &double,
        &source("gantry-test/No-Such-Model", None, None),
        BackendKind::LlamaCpp,
    )
    .await
    .unwrap_err();
    let SourceError::Invalid(message) = &error else {
        panic!("a missing model is invalid, not {error:?}")
    };
    assert!(
        message.contains("ModelScope has no model gantry-test/No-Such-Model"),
        "{message}"
    );
    assert!(message.contains("source.repo_id"), "{message}");
    assert!(message.contains("private models"), "{message}");
    assert!(!error.is_transient());
}

#[tokio::test]
async fn a_missing_file_names_the_model_and_lists_its_ggufs() {
    let (double, _, _) = double().await;
    let SourceError::Invalid(message) = resolve(
        &double,
        &source(GGUF_REPO, Some("*Q2_K.gguf"), None),
        BackendKind::LlamaCpp,
    )
    .await
    .unwrap_err() else {
        panic!("a file the model lacks is invalid")
    };
    assert!(message.contains(GGUF_REPO), "{message}");
    assert!(message.contains("source.file"), "{message}");
    assert!(message.contains("tiny-Q4_K_M.gguf"), "{message}");
}

#[tokio::test]
async fn an_unknown_revision_names_the_branches_and_tags() {
    let (double, _, _) = double().await;
    // The hub answers an unknown revision with an empty listing, not an error; the
    // resolver asks for the revisions to say what went wrong.
    let SourceError::Invalid(message) = resolve(
        &double,
        &source(GGUF_REPO, None, Some("v9")),
        BackendKind::LlamaCpp,
    )
    .await
    .unwrap_err() else {
        panic!("an unknown revision is invalid")
    };
    assert!(message.contains(r#"has no revision "v9""#), "{message}");
    assert!(message.contains("source.revision"), "{message}");
    assert!(
        message.contains("master") && message.contains(TAG),
        "{message}"
    );
    assert!(double
        .requests()
        .contains(&format!("GET /api/v1/models/{GGUF_REPO}/revisions")));

    // A commit the model does not have says so too.
    let SourceError::Invalid(message) = resolve(
        &double,
        &source(GGUF_REPO, None, Some(&"0".repeat(40))),
        BackendKind::LlamaCpp,
    )
    .await
    .unwrap_err() else {
        panic!("an unknown commit is invalid")
    };
    assert!(message.contains("no files at commit"), "{message}");
}

fn cache(double: &ModelscopeDouble, root: &std::path::Path) -> ModelCache {
    ModelCache::new(root.to_owned(), sources(double))
}

async fn fetch(
    cache: &ModelCache,
    resolved: &Resolved,
) -> Result<gantry_source::cache::Fetched, SourceError> {
    let (progress, _) = watch::channel(Progress::default());
    cache
        .fetch(resolved, &progress, &CancellationToken::new())
        .await
}

#[tokio::test]
async fn the_cache_downloads_and_verifies_every_file_of_a_model() {
    let (double, _, repo) = double().await;
    let root = tempfile::tempdir().unwrap();
    let cache = cache(&double, root.path());
    let resolved = cache
        .sources()
        .resolve(&source(ENGINE_REPO, None, None), BackendKind::Vllm)
        .await
        .unwrap();

    let fetched = fetch(&cache, &resolved).await.unwrap();
    assert!(fetched
        .dir
        .ends_with(format!("ms/{ENGINE_REPO}/{}", repo.commit)));
    assert_eq!(fetched.files.len(), resolved.files.len());
    for (file, local) in resolved.files.iter().zip(&fetched.files) {
        assert_eq!(
            std::fs::read(local).unwrap(),
            contents(&repo, &file.path),
            "{}",
            file.path
        );
        // Every file is kept under its verified SHA-256, the regular ones served in place
        // as much as the LFS ones behind the redirect.
        let blob = std::fs::canonicalize(local).unwrap();
        let expected = format!(
            "sha256-{}",
            ModelscopeDouble::sha256(contents(&repo, &file.path))
        );
        assert!(blob.ends_with(&expected), "{}: {blob:?}", file.path);
        assert_eq!(
            double.bytes_served(ENGINE_REPO, &file.path),
            contents(&repo, &file.path).len() as u64,
            "{} is fetched once",
            file.path
        );
    }
    assert_eq!(double.bytes_served(ENGINE_REPO, "pytorch_model.bin"), 0);

    // Fetching again finds everything in the cache.
    let served = double.total_bytes_served();
    fetch(&cache, &resolved).await.unwrap();
    assert_eq!(double.total_bytes_served(), served);
}

#[tokio::test]
async fn an_interrupted_download_resumes_through_the_redirect() {
    let (double, repo, _) = double().await;
    let root = tempfile::tempdir().unwrap();
    let cache = cache(&double, root.path());
    let resolved = cache
        .sources()
        .resolve(
            &source(GGUF_REPO, Some("quant/tiny-Q8_0.gguf"), None),
            BackendKind::LlamaCpp,
        )
        .await
        .unwrap();
    let bytes = contents(&repo, "quant/tiny-Q8_0.gguf");
    let sha256 = ModelscopeDouble::sha256(bytes);
    // What an interrupted download leaves (cache.rs: `partial/<blob>.part`).
    let half = bytes.len() / 2;
    std::fs::create_dir_all(root.path().join("partial")).unwrap();
    std::fs::write(
        root.path().join(format!("partial/sha256-{sha256}.part")),
        &bytes[..half],
    )
    .unwrap();

    let fetched = fetch(&cache, &resolved).await.unwrap();
    assert_eq!(std::fs::read(&fetched.files[0]).unwrap(), bytes);
    assert_eq!(
        double.bytes_served(GGUF_REPO, "quant/tiny-Q8_0.gguf"),
        (bytes.len() - half) as u64,
        "only the missing half is fetched"
    );
    assert!(double
        .requests()
        .contains(&format!("GET /lfs/{GGUF_REPO}/{sha256} bytes={half}-")));
}

#[tokio::test]
async fn wrong_bytes_are_refused_and_not_kept() {
    let (double, repo, _) = double().await;
    double.corrupt(GGUF_REPO, "tiny-Q4_K_M.gguf");
    let root = tempfile::tempdir().unwrap();
    let cache = cache(&double, root.path());
    let resolved = cache
        .sources()
        .resolve(
            &source(GGUF_REPO, Some("tiny-Q4_K_M.gguf"), None),
            BackendKind::LlamaCpp,
        )
        .await
        .unwrap();

    let error = fetch(&cache, &resolved).await.unwrap_err();
    let SourceError::Corrupt(message) = &error else {
        panic!("wrong bytes are corrupt, not {error:?}")
    };
    let listed = ModelscopeDouble::sha256(contents(&repo, "tiny-Q4_K_M.gguf"));
    assert!(message.contains(&listed), "{message}");
    let kept: Vec<_> = std::fs::read_dir(root.path().join("blobs"))
        .unwrap()
        .collect();
    assert!(kept.is_empty(), "{kept:?}");
}

#[tokio::test]
async fn headers_are_read_with_ranges_without_the_weights() {
    let (double, _, repo) = double().await;
    let sources = sources(&double);
    let resolved = sources
        .resolve(&source(ENGINE_REPO, None, None), BackendKind::Vllm)
        .await
        .unwrap();
    let weights = resolved
        .files
        .iter()
        .find(|f| f.path == "model-00001-of-00002.safetensors")
        .unwrap();
    let header = sources.safetensors_header(weights).await.unwrap();
    assert!(header.starts_with(br#"{"w":"#), "{header:?}");
    assert_eq!(
        double.bytes_served(ENGINE_REPO, &weights.path),
        8 + header.len() as u64,
        "the length and the header, never the data"
    );

    // A regular file is served whole whatever the range; it is read all the same.
    let config = resolved
        .files
        .iter()
        .find(|f| f.path == "config.json")
        .unwrap();
    assert_eq!(
        sources.read_small(config).await.unwrap(),
        contents(&repo, "config.json")
    );
}
