//! Backends installed ahead of need, and removed, when a server asks
//! (`POST /v1/backends`, `DELETE /v1/backends/{name}/{version}` on the worker's API).
//!
//! An install asked for runs in the background through the same [`InstalledBackends`] an
//! instance installs with, so an instance that needs the version meanwhile waits for this
//! install instead of starting a second. What is being installed, and what failed, is kept
//! here until it is installed (then [`InstalledBackends::list`] shows it), asked again or
//! removed.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use gantry_types::{BackendInstallOrder, BackendInstallStatus, BackendKind, InstallProgress};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::backends::{BackendPlan, InstalledBackends, Removal};
use crate::supervisor::Supervisor;

/// Why a request about an installed backend was refused.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// The order cannot be installed as asked (400).
    #[error("{0}")]
    Invalid(String),
    /// Nothing of that name and version is here (404).
    #[error("{0}")]
    NotFound(String),
    /// In use, being installed, or this worker does not install (409).
    #[error("{0}")]
    Conflict(String),
    /// The disk or the package index failed (500).
    #[error("{0}")]
    Failed(String),
}

/// One install asked for through the API, while it runs or after it failed.
struct Asked {
    progress: watch::Receiver<InstallProgress>,
    failed: Option<String>,
}

/// Installs asked for through the worker's API.
#[derive(Default)]
pub struct PreInstalls {
    asked: Mutex<BTreeMap<(String, String), Asked>>,
}

impl std::fmt::Debug for PreInstalls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreInstalls")
            .field("asked", &self.lock().keys().collect::<Vec<_>>())
            .finish()
    }
}

impl PreInstalls {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<(String, String), Asked>> {
        self.asked.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Everything installed here, and every install asked for that runs or failed, by name
    /// then version, each with the instances that use it.
    pub fn list(
        &self,
        installed: &InstalledBackends,
        supervisor: &Supervisor,
    ) -> Vec<BackendInstallStatus> {
        let mut statuses: BTreeMap<(String, String), BackendInstallStatus> = installed
            .list()
            .into_iter()
            .map(|backend| {
                let key = (backend.name.clone(), backend.version.clone());
                let status = installed_status(backend.name, backend.version, backend.variant);
                (key, status)
            })
            .collect();
        for ((name, version), asked) in self.lock().iter() {
            if statuses.contains_key(&(name.clone(), version.clone())) {
                continue;
            }
            statuses.insert(
                (name.clone(), version.clone()),
                asked_status(name, version, asked),
            );
        }
        statuses
            .into_values()
            .map(|mut status| {
                status.used_by = supervisor.users_of_backend(&status.name, &status.version);
                status
            })
            .collect()
    }

    /// Starts installing `order` unless it is installed or being installed; answers with
    /// the version's status (`installed`, or `installing`).
    pub async fn start(
        self: &Arc<Self>,
        installed: &Arc<InstalledBackends>,
        order: BackendInstallOrder,
        tasks: &TaskTracker,
        shutdown: &CancellationToken,
    ) -> Result<BackendInstallStatus, Refusal> {
        let plan = plan_of(&order)?;
        let version = installed
            .resolve_version(&plan)
            .await
            .map_err(|e| Refusal::Failed(e.message))?;
        if let Some(installation) = installed.find(&plan.name, &version) {
            return Ok(installed_status(plan.name, version, installation.variant));
        }
        let key = (plan.name.clone(), version.clone());
        let (progress, receiver) = watch::channel(InstallProgress {
            backend: plan.name.clone(),
            version: version.clone(),
            phase: "starting".to_owned(),
            ..Default::default()
        });
        {
            let mut asked = self.lock();
            if let Some(running) = asked.get(&key).filter(|a| a.failed.is_none()) {
                return Ok(asked_status(&key.0, &key.1, running));
            }
            asked.insert(
                key.clone(),
                Asked {
                    progress: receiver.clone(),
                    failed: None,
                },
            );
        }
        tracing::info!(backend = %plan.name, %version, "installing a backend as a server asked");
        let status = asked_status(
            &key.0,
            &key.1,
            &Asked {
                progress: receiver,
                failed: None,
            },
        );
        let (this, installed, cancel) = (self.clone(), installed.clone(), shutdown.clone());
        tasks.spawn(async move {
            let result = installed.ensure(&plan, &version, &progress, &cancel).await;
            let mut asked = this.lock();
            match result {
                Ok(installation) => {
                    tracing::info!(backend = %plan.name, %version, variant = %installation.variant, "backend installed as asked");
                    asked.remove(&key);
                }
                Err(e) => {
                    let message = format!(
                        "installing {} {version} failed: {}\nlast installer lines:\n{}",
                        plan.name,
                        e.message,
                        e.log_tail.join("\n")
                    );
                    tracing::warn!(backend = %plan.name, %version, error = %e.message, "asked backend install failed");
                    if let Some(entry) = asked.get_mut(&key) {
                        entry.failed = Some(message);
                    }
                }
            }
        });
        Ok(status)
    }

    /// Removes `name` at `version` from this worker: refused while an instance uses it or
    /// an install of it runs. A failed install asked for is forgotten.
    pub fn remove(
        &self,
        installed: &InstalledBackends,
        supervisor: &Supervisor,
        name: &str,
        version: &str,
    ) -> Result<(), Refusal> {
        let key = (name.to_owned(), version.to_owned());
        let forgot_failure = {
            let mut asked = self.lock();
            match asked.get(&key) {
                Some(running) if running.failed.is_none() => {
                    return Err(Refusal::Conflict(format!(
                        "{name} {version} is being installed; remove it once the install ended"
                    )))
                }
                Some(_) => asked.remove(&key).is_some(),
                None => false,
            }
        };
        let users = supervisor.users_of_backend(name, version);
        if !users.is_empty() {
            return Err(Refusal::Conflict(format!(
                "{name} {version} is used by {}; delete or move those instances first",
                users.join(", ")
            )));
        }
        match installed.remove(name, version) {
            Ok(Removal::Removed) => Ok(()),
            Ok(Removal::NotInstalled) if forgot_failure => Ok(()),
            Ok(Removal::NotInstalled) => Err(Refusal::NotFound(format!(
                "{name} {version} is not installed on this worker"
            ))),
            Ok(Removal::Installing) => Err(Refusal::Conflict(format!(
                "{name} {version} is being installed for an instance; remove it once the \
                 install ended"
            ))),
            Err(e) => Err(Refusal::Failed(format!(
                "cannot remove {name} {version}: {e}"
            ))),
        }
    }
}

/// What installing `order` means on this worker.
fn plan_of(order: &BackendInstallOrder) -> Result<BackendPlan, Refusal> {
    if let Some(kind) = BackendKind::parse(&order.name).filter(|k| *k != BackendKind::Custom) {
        return Ok(BackendPlan {
            name: order.name.clone(),
            kind,
            version: order.version.clone(),
            requirements: Vec::new(),
            pip_args: Vec::new(),
        });
    }
    let Some(defined) = &order.defined else {
        return Err(Refusal::Invalid(format!(
            "{} is not llama.cpp, vllm or sglang, and the order carries no definition of it",
            order.name
        )));
    };
    if defined.requirements.is_empty() {
        return Err(Refusal::Invalid(format!(
            "{} {} has no requirements: there is nothing to install",
            defined.name, defined.version
        )));
    }
    Ok(BackendPlan {
        name: defined.name.clone(),
        kind: BackendKind::Custom,
        version: Some(defined.version.clone()),
        requirements: defined.requirements.clone(),
        pip_args: defined.pip_args.clone(),
    })
}

fn installed_status(name: String, version: String, variant: String) -> BackendInstallStatus {
    BackendInstallStatus {
        name,
        version,
        state: "installed".to_owned(),
        message: variant,
        progress: None,
        used_by: Vec::new(),
    }
}

fn asked_status(name: &str, version: &str, asked: &Asked) -> BackendInstallStatus {
    let progress = asked.progress.borrow().clone();
    match &asked.failed {
        Some(message) => BackendInstallStatus {
            name: name.to_owned(),
            version: version.to_owned(),
            state: "failed".to_owned(),
            message: message.clone(),
            progress: None,
            used_by: Vec::new(),
        },
        None => BackendInstallStatus {
            name: name.to_owned(),
            version: version.to_owned(),
            state: "installing".to_owned(),
            message: progress.phase.clone(),
            progress: Some(progress),
            used_by: Vec::new(),
        },
    }
}
