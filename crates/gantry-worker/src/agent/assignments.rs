//! Follows the instances placed on this worker and makes the supervisor want exactly
//! those. It first reads the full list (so instances that went away while the worker
//! was disconnected are stopped), then follows the watch stream; when the stream ends
//! or falls silent it starts over, on whichever server answers. Instances already
//! running are left running across reconnects and server switches.
//!
//! The loop only hands out desired specs ([`crate::supervisor::Supervisor::apply`] and
//! `remove`) and never waits for a backend: each instance's task converges on its own, so
//! one backend that takes its whole stop grace period holds up no other instance.
//!
//! What an instance runs comes from its placement record alone (the model's launch
//! settings pinned when it was placed, and the flags of its placement), never from the
//! model as it is now: a changed model reaches the instances one at a time, through the
//! server's roll.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use gantry_backends::LaunchSpec;
use gantry_types::BackendKind;
use gantry_types::{InstanceState, InstanceStateReport, ModelInstance, ModelSource, WatchEvent};

use super::model_dirs::ModelDirs;
use super::report::Reporter;
use super::Shared;
use crate::backends::BackendPlan;
use crate::supervisor::{BackendState, InstanceSpec};

/// A stream that says nothing (not even a heartbeat) for this long is treated as dead.
const SILENT_STREAM: Duration = Duration::from_secs(60);
const BACKOFF_START: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(30);

pub(crate) fn spawn(shared: Arc<Shared>, reporter: Arc<Reporter>) {
    let tasks = shared.tasks.clone();
    tasks.spawn(async move {
        let mut backoff = BACKOFF_START;
        while !shared.shutdown.is_cancelled() {
            match follow_once(&shared, &reporter).await {
                Ok(()) => backoff = BACKOFF_START,
                Err(e) => {
                    tracing::warn!(error = %e, retry_in = ?backoff, "lost the assignment stream");
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                }
            }
            tokio::select! {
                () = shared.shutdown.cancelled() => return,
                () = tokio::time::sleep(backoff) => {}
            }
        }
    });
}

/// One list-then-watch cycle; returns when the stream ends.
async fn follow_once(shared: &Arc<Shared>, reporter: &Arc<Reporter>) -> anyhow::Result<()> {
    let list = shared.client.assignments().await?;
    let wanted: BTreeSet<i64> = list.iter().map(|instance| instance.id).collect();
    for id in shared.supervisor.wanted() {
        if !wanted.contains(&id) {
            tracing::info!(
                instance_id = id,
                "instance no longer placed here; stopping it"
            );
            remove(shared, reporter, id);
        }
    }
    for instance in list {
        apply(shared, reporter, &instance);
    }

    let mut events = shared.client.watch_assignments().await?;
    tracing::info!(server = %shared.client.current_url(), "following assignments");
    loop {
        let event = tokio::select! {
            () = shared.shutdown.cancelled() => return Ok(()),
            event = tokio::time::timeout(SILENT_STREAM, events.next()) => event,
        };
        let event = match event {
            Err(_) => anyhow::bail!("the assignment stream was silent for {SILENT_STREAM:?}"),
            Ok(None) => anyhow::bail!("the server closed the assignment stream"),
            Ok(Some(Err(e))) => {
                tracing::warn!(error = %e, "unreadable event in the assignment stream");
                continue;
            }
            Ok(Some(Ok(event))) => event,
        };
        match event {
            WatchEvent::Heartbeat => {}
            WatchEvent::Error { error } => {
                anyhow::bail!(
                    "the server ended the stream ({}): {}",
                    error.code,
                    error.message
                )
            }
            WatchEvent::Deleted { object } => {
                tracing::info!(instance_id = object.id, instance = %object.name, "instance removed from this worker; stopping it");
                remove(shared, reporter, object.id);
            }
            WatchEvent::Created { object } | WatchEvent::Updated { object } => {
                apply(shared, reporter, &object)
            }
        }
    }
}

/// Stops an instance that is no longer placed here. Never waits: the instance's own task
/// stops it, however long its backend takes.
fn remove(shared: &Shared, reporter: &Reporter, instance_id: i64) {
    shared.supervisor.remove(instance_id);
    reporter.forget(instance_id);
}

/// Makes the supervisor want what one assignment says. Never waits for a backend.
fn apply(shared: &Arc<Shared>, reporter: &Arc<Reporter>, instance: &ModelInstance) {
    let id = instance.id;
    match instance.state {
        InstanceState::Pending | InstanceState::Analyzing => {
            remove(shared, reporter, id);
            return;
        }
        // The worker said so itself; the server decides what happens next.
        InstanceState::Error => return,
        InstanceState::Scheduled
        | InstanceState::Installing
        | InstanceState::Unhealthy
        | InstanceState::Downloading
        | InstanceState::Starting
        | InstanceState::Running
        | InstanceState::Unreachable => {}
    }
    let spec = match spec_for(shared, instance) {
        Ok(spec) => spec,
        Err(message) => {
            tracing::error!(instance_id = id, instance = %instance.name, %message, "cannot run instance");
            reporter.submit(id, InstanceStateReport::new(InstanceState::Error, message));
            return;
        }
    };
    // A placement made again after an error (the server rescheduled it here): start
    // afresh instead of keeping the old error.
    let errored = shared
        .supervisor
        .status(id)
        .is_some_and(|s| matches!(s.state, BackendState::Error { .. }));
    let outcome = if errored && instance.state == InstanceState::Scheduled {
        reporter.forget(id);
        shared.supervisor.restart(spec)
    } else {
        shared.supervisor.apply(spec)
    };
    match outcome {
        Ok(outcome) => {
            tracing::debug!(instance_id = id, ?outcome, "applied instance");
            // The server may have a stale view (it marked the instance unreachable
            // while this worker was cut off): say again what is true.
            if let Some(latest) = reporter.latest(id) {
                if latest.state != instance.state || latest.address != instance.address {
                    reporter.submit(id, latest);
                }
            }
        }
        Err(e) => tracing::warn!(instance_id = id, error = %e, "could not start instance"),
    }
}

/// The supervisor spec for an instance placed here, from its placement record, or a
/// message saying why it cannot run here.
fn spec_for(shared: &Shared, instance: &ModelInstance) -> Result<InstanceSpec, String> {
    let record = instance.placement.as_ref().ok_or_else(|| {
        format!(
            "instance {} has no readable placement record, so this worker cannot tell what to \
             run; the scheduler places such instances again",
            instance.name
        )
    })?;
    let launch = &record.launch;
    let (model_path, remote) = match &launch.source {
        ModelSource::LocalPath { path } => {
            let dirs = ModelDirs::new(&shared.config.model_dirs);
            (dirs.check(Path::new(path), &shared.config.name)?, None)
        }
        // Downloaded into the model cache when the instance starts; the path is set then.
        remote => (PathBuf::new(), Some(remote.clone())),
    };
    let kind = launch.backend.kind();
    let mut spec = InstanceSpec {
        instance_id: instance.id,
        key: format!("{}#{}", instance.model_name, instance.replica),
        launch: LaunchSpec {
            backend: kind,
            model_path,
            args: record.backend_args(),
            env: launch.env.clone(),
            gpu_indexes: instance.gpu_indexes.clone(),
            data_parallel_size: launch.data_parallel_size,
            custom_command: launch.custom_command.clone(),
            health_path: None,
            served_name: Some(instance.model_name.clone()),
        },
        remote,
        ready_deadline: None,
        install: None,
        backend_version: None,
    };
    match (&record.defined_backend, launch.backend.defined()) {
        (Some(defined), _) => {
            // The definition as it was when the instance was placed; the model's own
            // environment wins over the backend's.
            let mut env = defined.env.clone();
            env.extend(launch.env.clone());
            spec.launch.env = env;
            spec.launch.custom_command = Some(defined.command.clone());
            spec.launch.health_path = Some(defined.health_path.clone());
            spec.ready_deadline = defined.readiness_timeout_seconds.map(Duration::from_secs);
            spec.backend_version = Some(defined.version.clone());
            if !defined.requirements.is_empty() {
                spec.install = Some(BackendPlan {
                    name: defined.name.clone(),
                    kind,
                    version: Some(defined.version.clone()),
                    requirements: defined.requirements.clone(),
                    pip_args: defined.pip_args.clone(),
                });
            }
        }
        (None, Some(name)) => {
            return Err(format!(
                "instance {} uses backend {name} but its placement record carries no \
                 definition of it; the scheduler places it again",
                instance.name
            ))
        }
        (None, None) if kind == BackendKind::Custom => {}
        (None, None) => {
            // A pinned version is installed (when missing) and run from its own
            // directory; without a pin, the configured program if there is one, else the
            // newest installed version (the default installed when there is none).
            let pinned = launch.backend_version.clone();
            let configured = shared.found_backends.contains_key(&kind);
            let installer = shared.config.supervisor.installed_backends.is_some();
            if installer && (pinned.is_some() || !configured) {
                spec.install = Some(BackendPlan {
                    name: kind.as_str().to_owned(),
                    kind,
                    version: pinned,
                    requirements: Vec::new(),
                    pip_args: Vec::new(),
                });
            }
        }
    }
    Ok(spec)
}
