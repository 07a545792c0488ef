//! Why an instance cannot be placed: [`Unschedulable`], with a reason a person can act on.
//!
//! The filters are explained in the order they apply (no ready worker, selector, backend),
//! so the message names the first thing that rules every worker out. When workers pass the
//! filters but none has room, the message lists every layout that was tried and the best
//! candidate for the largest one, e.g.
//! `no ready worker has 2 GPUs with 40.0 GiB free; best: w3 has 1 (71.2 GiB free)`.

use thiserror::Error;

use crate::filter::{eligible, format_selector, matches_selector};
use crate::ledger::{SnapshotState, WorkerSlot};
use crate::request::PlacementRequest;
use crate::shape::{PartialOffload, PerGpu, Shape};
use crate::units::format_gib;

/// Why a request could not be placed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum Unschedulable {
    /// The request itself is contradictory; placing it again will not help.
    #[error("invalid placement request: {reason}")]
    InvalidRequest {
        /// What is wrong.
        reason: String,
    },
    /// No worker is ready.
    #[error("no ready worker ({workers} workers registered, none ready)")]
    NoReadyWorker {
        /// Workers in the snapshot.
        workers: usize,
    },
    /// No worker at all carries the selector's labels.
    #[error("no worker matches selector {selector}")]
    NoWorkerMatchesSelector {
        /// The selector, as `key=value,…`.
        selector: String,
    },
    /// Workers carry the labels, but none of them is ready.
    #[error(
        "no ready worker matches selector {selector} ({not_ready} matching workers are not ready)"
    )]
    NoReadyWorkerMatchesSelector {
        /// The selector, as `key=value,…`.
        selector: String,
        /// Matching workers that are not ready.
        not_ready: usize,
    },
    /// No ready worker (matching the selector) runs the backend.
    #[error("backend {backend} runs on no ready worker{}", selector.as_ref().map(|s| format!(" matching selector {s}")).unwrap_or_default())]
    BackendUnavailable {
        /// The backend.
        backend: String,
        /// The selector, when the request had one.
        selector: Option<String>,
    },
    /// The user's manual GPU selection cannot be honoured.
    #[error("manual GPU selection on {worker}: {reason}")]
    ManualSelection {
        /// The worker named by the selection.
        worker: String,
        /// Why.
        reason: String,
    },
    /// Workers pass the filters, but none has the memory.
    #[error("{shortfall}; best: {best}")]
    InsufficientResources {
        /// What was needed, e.g. `no ready worker has 2 GPUs with 40.0 GiB free`.
        shortfall: String,
        /// The closest candidate, e.g. `w3 has 1 (71.2 GiB free)`.
        best: String,
    },
}

impl Unschedulable {
    /// Whether the same request may succeed later, when the cluster changes (workers join,
    /// instances stop). Only an invalid request never can.
    pub fn may_succeed_later(&self) -> bool {
        !matches!(self, Unschedulable::InvalidRequest { .. })
    }
}

/// Builds the reason `request` found no placement, given the shapes that were tried.
pub(crate) fn explain(
    state: &SnapshotState,
    request: &PlacementRequest,
    shapes: &[Shape],
    partial: Option<&PartialOffload>,
) -> Unschedulable {
    let workers = &state.workers;
    if !workers.iter().any(|slot| slot.view.ready) {
        return Unschedulable::NoReadyWorker {
            workers: workers.len(),
        };
    }
    let selector = (!request.selector.is_empty()).then(|| format_selector(&request.selector));
    if let Some(selector) = &selector {
        let matching = workers
            .iter()
            .filter(|slot| matches_selector(&slot.view, &request.selector));
        let (mut all, mut ready) = (0, 0);
        for slot in matching {
            all += 1;
            ready += usize::from(slot.view.ready);
        }
        if all == 0 {
            return Unschedulable::NoWorkerMatchesSelector {
                selector: selector.clone(),
            };
        }
        if ready == 0 {
            return Unschedulable::NoReadyWorkerMatchesSelector {
                selector: selector.clone(),
                not_ready: all,
            };
        }
    }
    let candidates: Vec<&WorkerSlot> = workers
        .iter()
        .filter(|slot| eligible(&slot.view, request))
        .collect();
    if candidates.is_empty() {
        return Unschedulable::BackendUnavailable {
            backend: request.backend.clone(),
            selector,
        };
    }

    let mut wanted: Vec<String> = shapes.iter().map(describe).collect();
    if let Some(plan) = partial {
        wanted.push(format!(
            "1 GPU with {} free for partial offload",
            format_gib(plan.gpu_bytes(1))
        ));
        wanted.push(format!(
            "{} RAM free for CPU-only",
            format_gib(plan.cpu_only_ram_bytes())
        ));
    }
    let subject = match &selector {
        Some(selector) => format!("no ready worker matching {selector} has"),
        None => "no ready worker has".to_owned(),
    };
    let shortfall = format!("{subject} {}", join_alternatives(&wanted));
    let best = shapes
        .iter()
        .rev()
        .find(|shape| shape.gpu_count > 0)
        .map_or_else(
            || best_for_ram(&candidates),
            |shape| best_for_gpus(&candidates, shape),
        );
    Unschedulable::InsufficientResources { shortfall, best }
}

/// `a`, `a or b`, `a, b or c`.
fn join_alternatives(items: &[String]) -> String {
    match items {
        [] => "room for this model".to_owned(),
        [only] => only.clone(),
        [rest @ .., last] => format!("{} or {last}", rest.join(", ")),
    }
}

fn describe(shape: &Shape) -> String {
    let count = shape.gpu_count;
    let gpus = if count == 1 { "GPU" } else { "GPUs" };
    match &shape.per_gpu {
        _ if count == 0 => format!("{} RAM free", format_gib(shape.ram_bytes)),
        PerGpu::Bytes { threshold, .. } => {
            format!("{count} {gpus} with {} free", format_gib(*threshold))
        }
        PerGpu::Fraction { fraction, minimum } => format!(
            "{count} {gpus} with {:.0}% of memory free (at least {} each)",
            fraction * 100.0,
            format_gib(*minimum)
        ),
    }
}

/// The worker closest to offering `shape`: the most qualifying GPUs, then enough RAM, then
/// the most free memory on one GPU.
fn best_for_gpus(candidates: &[&WorkerSlot], shape: &Shape) -> String {
    let scored = candidates.iter().map(|slot| {
        let qualifying = slot
            .view
            .gpus
            .iter()
            .zip(&slot.gpu_allocatable)
            .filter(|(gpu, allocatable)| {
                shape
                    .per_gpu
                    .need_on(gpu.total_memory_bytes)
                    .is_some_and(|need| need <= **allocatable)
            })
            .count();
        let emptiest = slot.gpu_allocatable.iter().copied().max().unwrap_or(0);
        let ram_ok = shape.ram_bytes <= slot.ram_allocatable;
        (
            (qualifying.min(shape.gpu_count), ram_ok, emptiest),
            *slot,
            qualifying,
        )
    });
    // `max_by_key` keeps the last maximum; reversing keeps the lowest worker id among equals.
    let Some((_, slot, qualifying)) = scored.rev().max_by_key(|(key, _, _)| *key) else {
        return "no candidate".to_owned();
    };
    let name = &slot.view.name;
    if slot.view.gpus.is_empty() {
        format!("{name} has no GPUs")
    } else if qualifying >= shape.gpu_count && shape.ram_bytes > slot.ram_allocatable {
        format!(
            "{name} has the GPUs but {} RAM free of {} needed",
            format_gib(slot.ram_allocatable),
            format_gib(shape.ram_bytes)
        )
    } else {
        let emptiest = slot.gpu_allocatable.iter().copied().max().unwrap_or(0);
        format!("{name} has {qualifying} ({} free)", format_gib(emptiest))
    }
}

/// The worker with the most RAM left.
fn best_for_ram(candidates: &[&WorkerSlot]) -> String {
    candidates
        .iter()
        .rev()
        .max_by_key(|slot| slot.ram_allocatable)
        .map_or_else(
            || "no candidate".to_owned(),
            |slot| {
                format!(
                    "{} has {} RAM free",
                    slot.view.name,
                    format_gib(slot.ram_allocatable)
                )
            },
        )
}
