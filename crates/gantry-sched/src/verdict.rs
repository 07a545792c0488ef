//! Per-worker verdicts: would one instance fit on this worker, as it is now? For the
//! estimate a person asks for before creating a model, next to where the scheduler itself
//! would put it.
//!
//! Each worker is asked on its own: placement runs on a snapshot holding only that worker
//! and the claims placed on it, so a worker that does not fit is explained in exactly the
//! words ([`Unschedulable`]) a pending instance would show were it the only worker.

use std::collections::HashMap;

use gantry_types::placement::Placement;

use crate::explain::Unschedulable;
use crate::ledger::SnapshotState;
use crate::request::PlacementRequest;
use crate::snapshot::{ClusterSnapshot, PlacedClaim};

/// One worker's answer to a request.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerFit {
    /// The worker, by store id.
    pub worker_id: i64,
    /// Where the instance would go on it, or why it does not fit there.
    pub result: Result<Placement, Unschedulable>,
}

/// Places `request` on each worker of `snapshot` alone, in worker id order; books nothing.
pub fn place_on_each_worker(
    snapshot: &ClusterSnapshot,
    request: &PlacementRequest,
) -> Vec<WorkerFit> {
    let mut placed_on: HashMap<i64, Vec<PlacedClaim>> = HashMap::new();
    for claim in &snapshot.placed {
        placed_on
            .entry(claim.worker_id)
            .or_default()
            .push(claim.clone());
    }
    let mut workers: Vec<_> = snapshot.workers.iter().collect();
    workers.sort_by_key(|worker| worker.id);
    workers
        .into_iter()
        .map(|worker| {
            let result = match &request.manual {
                // A manual selection names one worker; on any other the scheduler would
                // not look, and "worker … does not exist" would be wrong.
                Some(manual) if manual.worker_name != worker.name => {
                    Err(Unschedulable::ManualSelection {
                        worker: manual.worker_name.clone(),
                        reason: format!(
                            "the model's gpu_selector places it there, not on {}",
                            worker.name
                        ),
                    })
                }
                _ => {
                    let alone = ClusterSnapshot {
                        workers: vec![worker.clone()],
                        placed: placed_on.remove(&worker.id).unwrap_or_default(),
                    };
                    SnapshotState::new(&alone).find(request)
                }
            };
            WorkerFit {
                worker_id: worker.id,
                result,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::ManualGpuSelection;
    use crate::testkit::{llama_request, worker};
    use crate::units::GIB;

    #[test]
    fn each_worker_answers_for_itself_against_its_own_claims() {
        // w1: one 80 GiB GPU, 70 GiB already placed; w2: two empty 24 GiB GPUs.
        let snapshot = ClusterSnapshot {
            workers: vec![
                worker(1, "w1").gpus(1, 80 * GIB).build(),
                worker(2, "w2").gpus(2, 24 * GIB).build(),
            ],
            placed: vec![PlacedClaim::uniform(9, 1, &[0], 70 * GIB, 0)],
        };
        // 4 blocks of 5 GiB: 20 GiB on one GPU.
        let request = llama_request(1, 5 * GIB);
        let fits = place_on_each_worker(&snapshot, &request);
        assert_eq!(fits.len(), 2);
        assert_eq!(fits[0].worker_id, 1);
        let reason = fits[0].result.clone().expect_err("10 GiB left on w1");
        assert!(reason.to_string().contains("w1"), "{reason}");
        let placement = fits[1].result.clone().expect("w2 has room");
        assert_eq!(placement.worker_name, "w2");
        assert_eq!(placement.gpus.len(), 1);
    }

    #[test]
    fn a_manual_selection_is_answered_by_its_worker_only() {
        let snapshot = ClusterSnapshot {
            workers: vec![
                worker(1, "w1").gpus(1, 80 * GIB).build(),
                worker(2, "w2").gpus(1, 80 * GIB).build(),
            ],
            placed: Vec::new(),
        };
        let mut request = llama_request(1, GIB);
        request.manual = Some(ManualGpuSelection {
            worker_name: "w2".to_owned(),
            gpu_indexes: vec![0],
        });
        let fits = place_on_each_worker(&snapshot, &request);
        let reason = fits[0].result.clone().expect_err("not the chosen worker");
        assert!(reason.to_string().contains("not on w1"), "{reason}");
        assert_eq!(
            fits[1]
                .result
                .clone()
                .expect("the chosen worker")
                .worker_name,
            "w2"
        );
    }
}
