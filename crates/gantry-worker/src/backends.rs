//! The backends installed on this worker, under `<data_dir>/backends/<name>/<version>/`,
//! each made by `gantry-install` and complete once its manifest exists.
//!
//! An instance whose backend version is missing installs it before its first start
//! ([`InstalledBackends::ensure`]); instances that need the same version share one install
//! (the first installs, the others wait for it). The worker reports what is installed
//! ([`InstalledBackends::list`]) with its status, so the scheduler prefers workers that
//! have a version over those that would install it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use gantry_install::{InstallError, Installation, Installer, Recipe, DEFAULT_LLAMA_CPP_VERSION};
use gantry_types::{BackendKind, InstallProgress, InstalledBackend};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// What an instance needs installed before it starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendPlan {
    /// `llama.cpp`, `vllm`, `sglang`, or a defined backend's name.
    pub name: String,
    /// The implementation that runs it (`Custom` for a defined backend).
    pub kind: BackendKind,
    /// The version; `None`: the newest installed, else the default (llama.cpp) or the
    /// newest release on PyPI (vLLM, SGLang).
    pub version: Option<String>,
    /// A defined backend's requirements (installed into a virtual environment).
    pub requirements: Vec<String>,
    pub pip_args: Vec<String>,
}

/// What [`InstalledBackends::remove`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    Removed,
    NotInstalled,
    /// An install of the version is under way; nothing was removed.
    Installing,
}

/// Where the backends installed on this worker live, and the installer that adds them.
#[derive(Debug)]
pub struct InstalledBackends {
    root: PathBuf,
    installer: Installer,
    /// One async lock per `name/version`: one install at a time, the others wait.
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Bumped after every install or removal, so the agent reports its status again.
    changed: watch::Sender<u64>,
}

impl InstalledBackends {
    /// Backends under `<data_dir>/backends`, installed by `installer`.
    pub fn new(data_dir: &Path, installer: Installer) -> Self {
        Self {
            root: data_dir.join("backends"),
            installer,
            locks: Mutex::new(HashMap::new()),
            changed: watch::Sender::new(0),
        }
    }

    pub fn installer(&self) -> &Installer {
        &self.installer
    }

    /// Changes every time a version is installed or removed.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// The directory of `name` at `version`.
    pub fn dir(&self, name: &str, version: &str) -> PathBuf {
        self.root.join(name).join(version)
    }

    /// The complete installation of `name` at `version`, if there is one.
    pub fn find(&self, name: &str, version: &str) -> Option<Installation> {
        Installer::installed(&self.dir(name, version))
    }

    /// Every complete installation, by name then version.
    pub fn list(&self) -> Vec<InstalledBackend> {
        let mut found = Vec::new();
        let Ok(names) = std::fs::read_dir(&self.root) else {
            return found;
        };
        for name in names.flatten() {
            let Some(name_text) = name.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            let Ok(versions) = std::fs::read_dir(name.path()) else {
                continue;
            };
            for version in versions.flatten() {
                let Some(version_text) = version.file_name().to_str().map(str::to_owned) else {
                    continue;
                };
                if let Some(installation) = Installer::installed(&version.path()) {
                    found.push(InstalledBackend {
                        name: name_text.clone(),
                        version: version_text,
                        variant: installation.variant,
                    });
                }
            }
        }
        found.sort();
        found
    }

    /// The newest installed version of `name` (by [`compare_versions`]).
    pub fn newest(&self, name: &str) -> Option<String> {
        self.list()
            .into_iter()
            .filter(|installed| installed.name == name)
            .map(|installed| installed.version)
            .max_by(|a, b| compare_versions(a, b))
    }

    /// The version a plan resolves to on this worker: its pin, else the newest installed,
    /// else the backend's default (llama.cpp) or the newest release on PyPI.
    pub async fn resolve_version(&self, plan: &BackendPlan) -> Result<String, InstallError> {
        if let Some(version) = &plan.version {
            return Ok(version.clone());
        }
        if let Some(newest) = self.newest(&plan.name) {
            return Ok(newest);
        }
        match plan.kind {
            BackendKind::LlamaCpp => Ok(DEFAULT_LLAMA_CPP_VERSION.to_owned()),
            BackendKind::Vllm | BackendKind::Sglang => {
                self.latest_on_pypi(python_package(plan.kind)).await
            }
            BackendKind::Custom => Err(InstallError::new(format!(
                "backend {} names no version to install",
                plan.name
            ))),
        }
    }

    /// Installs `plan` at `version` unless it is installed; one install per version at a
    /// time (a second caller waits for the first, then finds its result).
    pub async fn ensure(
        &self,
        plan: &BackendPlan,
        version: &str,
        progress: &watch::Sender<InstallProgress>,
        cancel: &CancellationToken,
    ) -> Result<Installation, InstallError> {
        if let Some(done) = self.find(&plan.name, version) {
            return Ok(done);
        }
        let lock = self.lock_of(&plan.name, version);
        let _guard = match lock.clone().try_lock_owned() {
            Ok(guard) => guard,
            Err(_) => {
                progress.send_modify(|p| {
                    p.backend = plan.name.clone();
                    p.version = version.to_owned();
                    p.phase = "waiting".to_owned();
                    p.log_tail = vec![format!(
                        "another instance on this worker is installing {} {version}",
                        plan.name
                    )];
                });
                tokio::select! {
                    guard = lock.lock_owned() => guard,
                    () = cancel.cancelled() => return Err(InstallError::new("cancelled")),
                }
            }
        };
        if let Some(done) = self.find(&plan.name, version) {
            return Ok(done);
        }
        let recipe = recipe(plan, version);
        let dest = self.dir(&plan.name, version);
        let result = self
            .installer
            .install(&plan.name, version, &recipe, &dest, progress, cancel)
            .await;
        if result.is_ok() {
            self.changed.send_modify(|n| *n += 1);
        }
        result
    }

    /// Removes an installed version. The caller checks that no instance uses it; an
    /// install of the version under way keeps it ([`Removal::Installing`]).
    pub fn remove(&self, name: &str, version: &str) -> std::io::Result<Removal> {
        let lock = self.lock_of(name, version);
        let Ok(_guard) = lock.try_lock_owned() else {
            return Ok(Removal::Installing);
        };
        let dir = self.dir(name, version);
        if !dir.exists() {
            return Ok(Removal::NotInstalled);
        }
        std::fs::remove_dir_all(&dir)?;
        // The name's directory goes with its last version.
        if let Some(parent) = dir.parent() {
            let _ = std::fs::remove_dir(parent);
        }
        self.changed.send_modify(|n| *n += 1);
        tracing::info!(backend = name, version, dir = %dir.display(), "removed installed backend");
        Ok(Removal::Removed)
    }

    /// The lock that allows one install (or removal) of `name/version` at a time.
    fn lock_of(&self, name: &str, version: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.locks.lock().unwrap_or_else(|p| p.into_inner());
        locks
            .entry(format!("{name}/{version}"))
            .or_default()
            .clone()
    }

    /// The newest release of `package` on the installer's PyPI.
    async fn latest_on_pypi(&self, package: &str) -> Result<String, InstallError> {
        #[derive(serde::Deserialize)]
        struct Info {
            version: String,
        }
        #[derive(serde::Deserialize)]
        struct Project {
            info: Info,
        }
        let url = format!("{}/pypi/{package}/json", self.installer.config().pypi_url);
        let project: Project = async {
            reqwest::get(&url)
                .await?
                .error_for_status()?
                .json::<Project>()
                .await
        }
        .await
        .map_err(|e| {
            InstallError::new(format!(
                "cannot find the newest {package} on PyPI ({url}: {e}); pin the model's \
                 backend_version"
            ))
        })?;
        Ok(project.info.version)
    }
}

/// The PyPI package of a Python backend.
pub fn python_package(kind: BackendKind) -> &'static str {
    match kind {
        BackendKind::Sglang => "sglang",
        _ => "vllm",
    }
}

/// How `plan` at `version` installs.
fn recipe(plan: &BackendPlan, version: &str) -> Recipe {
    match plan.kind {
        BackendKind::LlamaCpp => Recipe::LlamaCpp {
            version: version.to_owned(),
        },
        BackendKind::Vllm | BackendKind::Sglang => Recipe::Pip {
            requirements: vec![format!("{}=={version}", python_package(plan.kind))],
            pip_args: Vec::new(),
        },
        BackendKind::Custom => Recipe::Pip {
            requirements: plan.requirements.clone(),
            pip_args: plan.pip_args.clone(),
        },
    }
}

/// The command prefix that runs `kind` from `installation`.
pub fn program(kind: BackendKind, installation: &Installation) -> Option<Vec<String>> {
    let bin = |name: &str| {
        installation
            .bin_dir
            .join(name)
            .to_string_lossy()
            .into_owned()
    };
    match kind {
        BackendKind::LlamaCpp => Some(vec![bin(gantry_backends::llama_cpp::PROGRAM)]),
        BackendKind::Vllm => Some(vec![bin(gantry_backends::vllm::PROGRAM)]),
        BackendKind::Sglang => {
            let python = installation
                .python
                .clone()
                .unwrap_or_else(|| installation.bin_dir.join("python"));
            Some(gantry_backends::sglang::program_with(
                &python.to_string_lossy(),
            ))
        }
        BackendKind::Custom => None,
    }
}

/// Orders versions by their dot-separated parts, numerically where both parts are numbers
/// (`11434.0.0` > `9999.1.0`, `0.10.1` > `0.9.2`), else as text.
pub fn compare_versions(a: &str, b: &str) -> std::cmp::Ordering {
    let mut left = a.split(['.', '-', '+', '_']);
    let mut right = b.split(['.', '-', '+', '_']);
    loop {
        match (left.next(), right.next()) {
            (None, None) => return std::cmp::Ordering::Equal,
            (None, Some(_)) => return std::cmp::Ordering::Less,
            (Some(_), None) => return std::cmp::Ordering::Greater,
            (Some(x), Some(y)) => {
                let order = match (x.parse::<u64>(), y.parse::<u64>()) {
                    (Ok(x), Ok(y)) => x.cmp(&y),
                    _ => x.cmp(y),
                };
                if order.is_ne() {
                    return order;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_compare_part_by_part() {
        use std::cmp::Ordering::*;
        assert_eq!(compare_versions("11434.0.0", "9999.1.0"), Greater);
        assert_eq!(compare_versions("0.10.1", "0.9.2"), Greater);
        assert_eq!(compare_versions("1.2", "1.2.0"), Less);
        assert_eq!(compare_versions("2", "2"), Equal);
        assert_eq!(compare_versions("1.0rc1", "1.0rc2"), Less);
    }

    #[test]
    fn only_complete_installations_are_listed() {
        let dir = tempfile::tempdir().unwrap();
        let installer = Installer::new(gantry_install::InstallerConfig {
            cache_dir: dir.path().join("cache"),
            ..Default::default()
        })
        .unwrap();
        let backends = InstalledBackends::new(dir.path(), installer);
        // A half install: a directory without a manifest.
        std::fs::create_dir_all(backends.dir("llama.cpp", "1")).unwrap();
        assert!(backends.list().is_empty());
        assert_eq!(backends.newest("llama.cpp"), None);
    }
}
