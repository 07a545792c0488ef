//! The scheduler's view of the cluster: a [`ClusterSnapshot`] built from the store's
//! workers and placed claims. Pure functions of their arguments, so unit tests drive them
//! from fixtures.
//!
//! * Every registered worker is listed; only `ready` ones receive instances.
//! * GPUs are the ones the worker reported in `status.gpus`, simulated ones included
//!   (they are scheduled like real ones; the API labels them as simulated).
//! * Backends are the worker's `status.backends`; labels are its labels.
//! * A worker that reports no total memory (0) is treated as having unlimited RAM rather
//!   than none, so a worker that cannot read its memory still receives GPU instances.
//! * Placed claims are read from the reservation in the placement record the scheduler
//!   stored with each placement. A reservation that no longer matches the instance's worker
//!   and GPUs (the instance was moved by hand since) is ignored: its bytes describe another
//!   place. Instances placed by hand carry no reservation and are not subtracted.
//! * A record that cannot be read at all keeps every GPU the instance holds booked in full:
//!   what runs there is unknown, and booking nothing could put a second model on a GPU that
//!   is already full. It is counted and logged by the store.

use std::collections::{BTreeSet, HashMap};

use gantry_sched::{ClusterSnapshot, GpuShare, GpuView, PlacedClaim, SystemReserve, WorkerView};
use gantry_store::{PlacedInstanceClaim, StoredPlacement};
use gantry_types::{Worker, WorkerState};

/// The snapshot of `workers` with the claims of `placed`.
pub fn build_snapshot(workers: &[Worker], placed: &[PlacedInstanceClaim]) -> ClusterSnapshot {
    snapshot_of(workers.iter(), placed.iter())
}

/// One snapshot per cluster, each of the cluster's workers and the claims placed on them:
/// a model's instances are placed on its cluster's workers only, and what the scheduler
/// says when nothing fits counts those alone. Every id of `clusters` has a snapshot, an
/// empty one for a cluster without workers.
pub fn build_cluster_snapshots(
    workers: &[Worker],
    placed: &[PlacedInstanceClaim],
    clusters: impl IntoIterator<Item = i64>,
) -> HashMap<i64, ClusterSnapshot> {
    let mut members: HashMap<i64, Vec<&Worker>> =
        clusters.into_iter().map(|id| (id, Vec::new())).collect();
    let mut cluster_of = HashMap::with_capacity(workers.len());
    for worker in workers {
        members.entry(worker.cluster_id).or_default().push(worker);
        cluster_of.insert(worker.id, worker.cluster_id);
    }
    let mut claims: HashMap<i64, Vec<&PlacedInstanceClaim>> = HashMap::new();
    for row in placed {
        if let Some(cluster) = cluster_of.get(&row.worker_id) {
            claims.entry(*cluster).or_default().push(row);
        }
    }
    members
        .into_iter()
        .map(|(cluster, workers)| {
            let placed = claims.remove(&cluster).unwrap_or_default();
            (
                cluster,
                snapshot_of(workers.into_iter(), placed.into_iter()),
            )
        })
        .collect()
}

fn snapshot_of<'a>(
    workers: impl Iterator<Item = &'a Worker>,
    placed: impl Iterator<Item = &'a PlacedInstanceClaim>,
) -> ClusterSnapshot {
    let workers: Vec<WorkerView> = workers.map(worker_view).collect();
    let placed = placed
        .filter_map(|row| placed_claim(row, &workers))
        .collect();
    ClusterSnapshot { workers, placed }
}

/// One worker as the scheduler sees it.
pub fn worker_view(worker: &Worker) -> WorkerView {
    let system = &worker.status.system;
    WorkerView {
        id: worker.id,
        name: worker.name.clone(),
        ready: worker.state == WorkerState::Ready,
        labels: worker.labels.clone(),
        backends: worker
            .status
            .backends
            .iter()
            .cloned()
            .collect::<BTreeSet<_>>(),
        installed: worker
            .status
            .installed_backends
            .iter()
            .flat_map(|b| [b.name.clone(), format!("{}@{}", b.name, b.version)])
            .collect(),
        gpus: worker
            .status
            .gpus
            .iter()
            .map(|gpu| GpuView {
                index: gpu.index,
                total_memory_bytes: gpu.memory_total,
                simulated: gpu.simulated,
            })
            .collect(),
        system_memory_bytes: if system.memory_total == 0 {
            u64::MAX
        } else {
            system.memory_total
        },
        cpu_count: system.cpu_count,
        reserve: SystemReserve::default(),
    }
}

/// The claim an instance holds, from the reservation stored with it; `None` when there is
/// none (placed by hand) or it describes another worker or other GPUs than the instance now
/// has. A record that cannot be read books the whole of every GPU the instance holds.
pub fn placed_claim(row: &PlacedInstanceClaim, workers: &[WorkerView]) -> Option<PlacedClaim> {
    let record = match &row.placement {
        StoredPlacement::None => return None,
        StoredPlacement::Record(record) => record,
        StoredPlacement::Undecodable(_) => return Some(whole_gpus(row, workers)),
    };
    let placement = &record.reservation.as_ref()?.placement;
    let mut stored = placement.gpu_indexes();
    stored.sort_unstable();
    let mut current = row.gpu_indexes.clone();
    current.sort_unstable();
    if placement.worker_id != row.worker_id || stored != current {
        return None;
    }
    let mut claim = PlacedClaim::from(placement);
    claim.instance_id = row.instance_id;
    Some(claim)
}

/// Every byte of the instance's GPUs, and no RAM (which cannot be told).
fn whole_gpus(row: &PlacedInstanceClaim, workers: &[WorkerView]) -> PlacedClaim {
    let worker = workers.iter().find(|w| w.id == row.worker_id);
    PlacedClaim {
        instance_id: row.instance_id,
        worker_id: row.worker_id,
        gpus: row
            .gpu_indexes
            .iter()
            .map(|&index| GpuShare {
                index,
                bytes: worker
                    .and_then(|w| w.gpus.iter().find(|g| g.index == index))
                    .map_or(u64::MAX, |g| g.total_memory_bytes),
            })
            .collect(),
        ram_bytes: 0,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use gantry_sched::{
        FixedMemory, ModelMemory, Placement, PlacementKind, ResourceClaim, SnapshotState,
    };
    use gantry_types::{
        fixtures, BackendKind, InstanceState, LaunchTemplate, ModelSource, PlacementRecord,
        Reservation,
    };

    use super::*;

    const GIB: u64 = 1 << 30;

    fn worker(id: i64, state: WorkerState, gpus: u32) -> Worker {
        Worker {
            state,
            labels: BTreeMap::from([("zone".to_owned(), "a".to_owned())]),
            ..fixtures::worker(id, gpus)
        }
    }

    fn stored(instance_id: i64, worker_id: i64, gpus: &[(u32, u64)]) -> PlacedInstanceClaim {
        let placement = Placement {
            instance_id,
            worker_id,
            worker_name: format!("w{worker_id}"),
            gpus: gpus
                .iter()
                .map(|&(index, bytes)| GpuShare { index, bytes })
                .collect(),
            ram_bytes: GIB,
            kind: PlacementKind::SingleGpu,
            tensor_parallel_size: 1,
            data_parallel_size: 1,
            llama: None,
        };
        let record = PlacementRecord {
            launch: LaunchTemplate {
                backend: BackendKind::Custom.into(),
                backend_version: None,
                source: ModelSource::LocalPath { path: "/m".into() },
                backend_args: Vec::new(),
                env: BTreeMap::new(),
                custom_command: Some("serve".into()),
                data_parallel_size: None,
            },
            placement_args: Vec::new(),
            defined_backend: None,
            reservation: Some(Reservation {
                claim: ResourceClaim {
                    per_gpu_overhead_bytes: 0,
                    base_ram_bytes: GIB,
                    memory: ModelMemory::Fixed(FixedMemory {
                        gpu_count: 1,
                        bytes_per_gpu: 1,
                    }),
                },
                placement,
                parts: None,
            }),
        };
        PlacedInstanceClaim {
            instance_id,
            worker_id,
            state: InstanceState::Running,
            gpu_indexes: gpus.iter().map(|g| g.0).collect(),
            placement: StoredPlacement::Record(Box::new(record)),
        }
    }

    #[test]
    fn workers_carry_state_labels_backends_and_reported_gpus() {
        let snapshot = build_snapshot(
            &[
                worker(1, WorkerState::Ready, 2),
                worker(2, WorkerState::NotReady, 1),
                worker(3, WorkerState::Maintenance, 0),
            ],
            &[],
        );
        let view = &snapshot.workers[0];
        assert!(view.ready);
        assert_eq!(view.name, "w1");
        assert_eq!(view.labels["zone"], "a");
        assert!(view.backends.contains("llama.cpp") && view.backends.contains("vllm"));
        assert_eq!(view.gpus.len(), 2);
        assert_eq!(view.gpus[1].index, 1);
        assert_eq!(view.gpus[1].total_memory_bytes, 80 * GIB);
        assert!(view.gpus[1].simulated, "simulated GPUs are scheduled");
        assert_eq!(view.system_memory_bytes, 64 * GIB);
        assert!(!snapshot.workers[1].ready, "not_ready receives nothing");
        assert!(!snapshot.workers[2].ready, "maintenance receives nothing");
    }

    #[test]
    fn unknown_ram_does_not_block_placement() {
        let mut w = worker(1, WorkerState::Ready, 1);
        w.status.system.memory_total = 0;
        assert_eq!(worker_view(&w).system_memory_bytes, u64::MAX);
    }

    #[test]
    fn placed_claims_come_from_stored_placements_that_still_match() {
        let placed = [
            stored(10, 1, &[(0, 30 * GIB)]),
            stored(11, 1, &[(1, 5 * GIB)]),
        ];
        let snapshot = build_snapshot(&[worker(1, WorkerState::Ready, 2)], &placed);
        assert_eq!(snapshot.placed.len(), 2);
        let state = SnapshotState::new(&snapshot);
        assert_eq!(state.gpu_allocatable(1, 0), Some(50 * GIB));
        assert_eq!(state.gpu_allocatable(1, 1), Some(75 * GIB));
        assert_eq!(state.ram_allocatable(1), Some(62 * GIB));

        // Moved by hand to another worker or GPU since: the stored bytes are not there.
        let workers = snapshot.workers.clone();
        let mut moved = stored(12, 1, &[(0, 30 * GIB)]);
        moved.worker_id = 2;
        assert_eq!(placed_claim(&moved, &workers), None);
        let mut moved = stored(13, 1, &[(0, 30 * GIB)]);
        moved.gpu_indexes = vec![1];
        assert_eq!(placed_claim(&moved, &workers), None);
        // Placed by hand: nothing was reserved.
        let mut by_hand = stored(14, 1, &[(0, GIB)]);
        if let StoredPlacement::Record(record) = &mut by_hand.placement {
            record.reservation = None;
        }
        assert_eq!(placed_claim(&by_hand, &workers), None);
    }

    #[test]
    fn a_record_that_cannot_be_read_keeps_its_gpus_booked_in_full() {
        let mut unreadable = stored(15, 1, &[(1, 5 * GIB)]);
        unreadable.placement = StoredPlacement::Undecodable("expected a record".into());
        let snapshot = build_snapshot(&[worker(1, WorkerState::Ready, 2)], &[unreadable]);
        let state = SnapshotState::new(&snapshot);
        assert_eq!(
            state.gpu_allocatable(1, 1),
            Some(0),
            "GPU 1 is booked whole"
        );
        assert_eq!(state.gpu_allocatable(1, 0), Some(80 * GIB));
    }
}
