//! Reports the supervisor's events to the servers as instance states. The latest
//! state of each instance is kept until a server has accepted it, so a report lost
//! while servers are down is sent again, and an older one never overtakes a newer.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gantry_types::{ErrorCode, InstanceState, InstanceStateReport};
use tokio::sync::{mpsc, Notify};

use super::Shared;
use crate::supervisor::{BackendState, InstanceEvent};

/// What the backend of each instance is doing, as last seen by this worker.
#[derive(Debug, Default)]
pub struct Reporter {
    /// The latest report per instance not yet accepted by a server.
    pending: Mutex<BTreeMap<i64, InstanceStateReport>>,
    /// The latest report per instance, accepted or not: lets the assignment loop
    /// re-send it when the server's view differs (after an `unreachable` spell).
    latest: Mutex<BTreeMap<i64, InstanceStateReport>>,
    wake: Notify,
}

impl Reporter {
    /// Queues a report (replacing an unsent older one) and wakes the sender.
    pub fn submit(&self, instance_id: i64, report: InstanceStateReport) {
        if let Ok(mut latest) = self.latest.lock() {
            latest.insert(instance_id, report.clone());
        }
        if let Ok(mut pending) = self.pending.lock() {
            pending.insert(instance_id, report);
        }
        self.wake.notify_one();
    }

    /// The last report for an instance.
    pub fn latest(&self, instance_id: i64) -> Option<InstanceStateReport> {
        self.latest.lock().ok()?.get(&instance_id).cloned()
    }

    /// Forgets an instance that no longer runs here.
    pub fn forget(&self, instance_id: i64) {
        if let Ok(mut latest) = self.latest.lock() {
            latest.remove(&instance_id);
        }
        if let Ok(mut pending) = self.pending.lock() {
            pending.remove(&instance_id);
        }
    }

    fn take_pending(&self) -> Vec<(i64, InstanceStateReport)> {
        match self.pending.lock() {
            Ok(mut pending) => std::mem::take(&mut *pending).into_iter().collect(),
            Err(_) => Vec::new(),
        }
    }

    /// Puts back a report that could not be sent, unless a newer one arrived.
    fn requeue(&self, instance_id: i64, report: InstanceStateReport) {
        if let Ok(mut pending) = self.pending.lock() {
            pending.entry(instance_id).or_insert(report);
        }
    }
}

/// The report for a supervisor state; `None` for `Stopped` (nothing to say: the
/// instance was removed or moved).
pub fn report_for(state: &BackendState, restart_count: u32) -> Option<InstanceStateReport> {
    let mut download = None;
    let mut install = None;
    let (state, message, port, address) = match state {
        BackendState::Installing { progress } => {
            install = Some(progress.clone());
            (
                InstanceState::Installing,
                install_message(progress),
                None,
                None,
            )
        }
        BackendState::Unhealthy { reason } => {
            (InstanceState::Unhealthy, reason.clone(), None, None)
        }
        BackendState::Downloading { progress } => {
            download = Some(*progress);
            (
                InstanceState::Downloading,
                download_message(progress),
                None,
                None,
            )
        }
        BackendState::Starting { port } => {
            (InstanceState::Starting, String::new(), Some(*port), None)
        }
        BackendState::Running { address, ports, .. } => (
            InstanceState::Running,
            String::new(),
            ports.first().copied(),
            Some(address.clone()),
        ),
        BackendState::Restarting {
            attempt,
            backoff,
            reason,
        } => (
            InstanceState::Starting,
            format!(
                "restarting after a crash (attempt {attempt}, in {}): {reason}",
                humantime_short(*backoff)
            ),
            None,
            None,
        ),
        BackendState::Error { message } => (InstanceState::Error, message.clone(), None, None),
        BackendState::Stopped => return None,
    };
    Some(InstanceStateReport {
        state,
        state_message: message,
        port,
        address,
        restart_count,
        download,
        install,
        backend_version: None,
    })
}

/// `installing llama.cpp 11434.0.0: building (42 %)`.
fn install_message(progress: &gantry_types::InstallProgress) -> String {
    let mut message = format!(
        "installing {} {}: {}",
        progress.backend, progress.version, progress.phase
    );
    if let Some(percent) = progress.percent {
        message.push_str(&format!(" ({percent} %)"));
    } else if progress.bytes_done > 0 {
        let done = gantry_types::units::format_size(progress.bytes_done);
        match progress.bytes_total {
            Some(total) => message.push_str(&format!(
                " ({done} of {})",
                gantry_types::units::format_size(total)
            )),
            None => message.push_str(&format!(" ({done})")),
        }
    }
    message
}

/// `downloading 1.2 GiB of 4.7 GiB at 85.3 MiB/s`.
fn download_message(progress: &gantry_types::DownloadProgress) -> String {
    let size = |bytes: u64| {
        let units = ["B", "KiB", "MiB", "GiB", "TiB"];
        let mut value = bytes as f64;
        let mut unit = 0;
        while value >= 1024.0 && unit < units.len() - 1 {
            value /= 1024.0;
            unit += 1;
        }
        if unit == 0 {
            format!("{bytes} B")
        } else {
            format!("{value:.1} {}", units[unit])
        }
    };
    match progress.bytes_total {
        Some(total) => format!(
            "downloading {} of {} at {}/s",
            size(progress.bytes_done),
            size(total),
            size(progress.bytes_per_second)
        ),
        None => format!(
            "downloading: {} at {}/s",
            size(progress.bytes_done),
            size(progress.bytes_per_second)
        ),
    }
}

fn humantime_short(d: Duration) -> String {
    if d.as_secs() >= 60 {
        format!("{}m{}s", d.as_secs() / 60, d.as_secs() % 60)
    } else {
        format!("{:.1}s", d.as_secs_f64())
    }
}

/// Turns supervisor events into reports and sends them, retrying every second while
/// no server accepts them.
pub(crate) fn spawn(
    shared: Arc<Shared>,
    mut events: mpsc::Receiver<InstanceEvent>,
) -> Arc<Reporter> {
    let reporter = Arc::new(Reporter::default());
    let for_events = reporter.clone();
    let events_shared = shared.clone();
    shared.tasks.spawn(async move {
        loop {
            // The supervisor keeps its sender until the worker is dropped, so the loop
            // ends on shutdown rather than on a closed channel.
            let event = tokio::select! {
                () = events_shared.shutdown.cancelled() => return,
                event = events.recv() => match event {
                    Some(event) => event,
                    None => return,
                },
            };
            let status = events_shared.supervisor.status(event.instance_id);
            let restarts = status.as_ref().map_or(0, |s| s.restart_count);
            let version = status.and_then(|s| s.backend_version);
            let progress = matches!(
                event.state,
                BackendState::Installing { .. } | BackendState::Downloading { .. }
            );
            if progress {
                tracing::debug!(
                    instance_id = event.instance_id,
                    state = event.state.name(),
                    "backend progress"
                );
            } else {
                tracing::info!(
                    instance_id = event.instance_id,
                    state = event.state.name(),
                    "backend state changed"
                );
            }
            if let Some(mut report) = report_for(&event.state, restarts) {
                report.backend_version = version;
                for_events.submit(event.instance_id, report);
            }
        }
    });
    let sender = reporter.clone();
    let tasks = shared.tasks.clone();
    tasks.spawn(async move {
        loop {
            tokio::select! {
                () = shared.shutdown.cancelled() => return,
                () = sender.wake.notified() => {}
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
            for (instance_id, report) in sender.take_pending() {
                match shared.client.report_state(instance_id, &report).await {
                    Ok(_) => {}
                    Err(e) if e.code() == Some(ErrorCode::NotFound) => {
                        // The instance was deleted or moved away; the assignment stream
                        // stops it. Nothing to report any more.
                        tracing::debug!(
                            instance_id,
                            "state report for an instance no longer placed here"
                        );
                    }
                    Err(e) if e.status().is_some_and(|s| (400..500).contains(&s)) => {
                        tracing::error!(instance_id, error = %e, "state report refused");
                    }
                    Err(e) => {
                        tracing::warn!(instance_id, error = %e, "state report failed; will retry");
                        sender.requeue(instance_id, report);
                    }
                }
            }
        }
    });
    reporter
}
