//! Follows the instances placed on this worker and makes the supervisor run exactly
//! those. It first reads the full list (so instances that went away while the worker
//! was disconnected are stopped), then follows the watch stream; when the stream ends
//! or falls silent it starts over, on whichever server answers. Instances already
//! running are left running across reconnects and server switches.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use gantry_types::{
    InstanceState, InstanceStateReport, ModelSource, WatchEvent, WatchEventType, WorkerAssignment,
};
use reqwest::Method;

use super::report::Reporter;
use super::Shared;
use crate::supervisor::{BackendState, InstanceOverrides, InstanceSpec};

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
    let list: Vec<WorkerAssignment> = shared
        .client
        .json(Method::GET, "/api/v1/worker/assignments", None, None)
        .await?;
    let wanted: BTreeSet<i64> = list.iter().map(|a| a.instance.id).collect();
    for status in shared.supervisor.statuses() {
        if !wanted.contains(&status.instance_id) {
            tracing::info!(instance_id = status.instance_id, key = %status.key, "instance no longer placed here; stopping it");
            shared.supervisor.stop(status.instance_id).await;
            reporter.forget(status.instance_id);
        }
    }
    for assignment in list {
        apply(shared, reporter, assignment).await;
    }

    let response = shared
        .client
        .send(
            Method::GET,
            "/api/v1/worker/assignments?watch=true",
            None,
            None,
            None,
        )
        .await?;
    tracing::info!(server = %shared.client.current_url(), "following assignments");
    let mut body = response.bytes_stream();
    let mut buffer: Vec<u8> = Vec::new();
    loop {
        let chunk = tokio::select! {
            () = shared.shutdown.cancelled() => return Ok(()),
            chunk = tokio::time::timeout(SILENT_STREAM, body.next()) => chunk,
        };
        let chunk = match chunk {
            Err(_) => anyhow::bail!("the assignment stream was silent for {SILENT_STREAM:?}"),
            Ok(None) => anyhow::bail!("the server closed the assignment stream"),
            Ok(Some(Err(e))) => anyhow::bail!("reading the assignment stream: {e}"),
            Ok(Some(Ok(chunk))) => chunk,
        };
        buffer.extend_from_slice(&chunk);
        while let Some(end) = buffer.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buffer.drain(..=end).collect();
            let value: serde_json::Value = match serde_json::from_slice(&line) {
                Ok(value) => value,
                Err(e) => {
                    tracing::warn!(error = %e, "unreadable line in the assignment stream");
                    continue;
                }
            };
            if value["type"] == "ERROR" {
                anyhow::bail!("the server ended the stream: {}", value["error"]["message"]);
            }
            let event: WatchEvent<WorkerAssignment> = match serde_json::from_value(value) {
                Ok(event) => event,
                Err(e) => {
                    tracing::warn!(error = %e, "unexpected event in the assignment stream");
                    continue;
                }
            };
            match (event.event_type, event.object) {
                (WatchEventType::Heartbeat, _) | (_, None) => {}
                (WatchEventType::Deleted, Some(assignment)) => {
                    let id = assignment.instance.id;
                    if shared.supervisor.stop(id).await {
                        tracing::info!(instance_id = id, instance = %assignment.instance.name, "instance removed from this worker; stopped it");
                    }
                    reporter.forget(id);
                }
                (_, Some(assignment)) => apply(shared, reporter, assignment).await,
            }
        }
    }
}

/// Makes the supervisor match one assignment.
async fn apply(shared: &Arc<Shared>, reporter: &Arc<Reporter>, assignment: WorkerAssignment) {
    let instance = &assignment.instance;
    let id = instance.id;
    match instance.state {
        InstanceState::Pending | InstanceState::Analyzing => {
            if shared.supervisor.stop(id).await {
                reporter.forget(id);
            }
            return;
        }
        // The worker said so itself; the server decides what happens next.
        InstanceState::Error => return,
        InstanceState::Scheduled
        | InstanceState::Starting
        | InstanceState::Running
        | InstanceState::Unreachable => {}
    }
    let spec = match spec_for(shared, &assignment) {
        Ok(spec) => spec,
        Err(message) => {
            tracing::error!(instance_id = id, instance = %instance.name, %message, "cannot run instance");
            reporter.submit(
                id,
                InstanceStateReport {
                    state: InstanceState::Error,
                    state_message: message,
                    port: None,
                    address: None,
                    restart_count: 0,
                },
            );
            return;
        }
    };
    // A placement made again after an error (the server rescheduled it here): start
    // afresh instead of keeping the old error.
    let errored = shared
        .supervisor
        .status(id)
        .is_some_and(|s| matches!(s.state, BackendState::Error { .. }));
    if errored && instance.state == InstanceState::Scheduled {
        shared.supervisor.stop(id).await;
        reporter.forget(id);
    }
    match shared.supervisor.ensure(spec).await {
        Ok(outcome) => {
            tracing::debug!(instance_id = id, ?outcome, "ensured instance");
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

/// The supervisor spec for an assignment, or a message saying why it cannot run here.
fn spec_for(shared: &Shared, assignment: &WorkerAssignment) -> Result<InstanceSpec, String> {
    let instance = &assignment.instance;
    let model = assignment
        .model
        .as_ref()
        .ok_or_else(|| format!("the model of instance {} is gone", instance.name))?;
    let model_path = match &model.source {
        ModelSource::LocalPath { path } => PathBuf::from(path),
        ModelSource::Huggingface { repo_id, .. } => {
            return Err(format!(
                "model source huggingface ({repo_id}) cannot be downloaded by this worker yet; \
                 download it and use a local_path source"
            ))
        }
        ModelSource::Url { url } => {
            return Err(format!(
                "model source url ({url}) cannot be downloaded by this worker yet; \
                 download it and use a local_path source"
            ))
        }
    };
    if !model_path.exists() {
        return Err(format!(
            "model path {} does not exist on worker {}",
            model_path.display(),
            shared.config.name
        ));
    }
    let mut backend_args = model.backend_args.clone();
    backend_args.extend(extra_backend_args(
        instance.computed_resource_claim.as_ref(),
    ));
    Ok(InstanceSpec {
        instance_id: instance.id,
        key: format!("{}#{}", model.name, instance.replica),
        backend: model.backend,
        model_path,
        backend_args,
        env: model.env.clone(),
        gpu_indexes: instance.gpu_indexes.clone(),
        data_parallel_size: model.data_parallel_size,
        overrides: InstanceOverrides {
            custom_command: model.custom_command.clone(),
            ..Default::default()
        },
    })
}

/// Flags the scheduler added for this placement (`extra_backend_args` in the stored
/// resource claim: context size, GPU layers, tensor split, tensor-parallel size).
pub fn extra_backend_args(claim: Option<&serde_json::Value>) -> Vec<String> {
    claim
        .and_then(|c| c.get("extra_backend_args"))
        .and_then(|a| a.as_array())
        .map(|args| {
            args.iter()
                .filter_map(|a| a.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extra_args_come_from_the_claim() {
        let claim = serde_json::json!({"extra_backend_args": ["-ngl", "99", 3]});
        assert_eq!(extra_backend_args(Some(&claim)), ["-ngl", "99"]);
        assert!(extra_backend_args(None).is_empty());
        assert!(extra_backend_args(Some(&serde_json::json!({}))).is_empty());
    }
}
