//! The allocatable ledger: [`SnapshotState`] tracks what is left on every GPU and in every
//! worker's RAM while placements are made one after another, so that two placements in a
//! row can never book the same bytes.
//!
//! Besides the per-worker figures it keeps two orderings of the ready workers by free GPU
//! memory, one per strategy, so that placement visits workers best-first and usually stops
//! at the first one that fits instead of scanning the cluster.

use std::collections::{BTreeSet, HashMap, HashSet};

use crate::snapshot::{ClusterSnapshot, PlacedClaim, WorkerView};
use gantry_types::placement::Placement;

/// One worker and what is left on it.
#[derive(Debug, Clone)]
pub(crate) struct WorkerSlot {
    pub view: WorkerView,
    /// Allocatable bytes per GPU, in the order of `view.gpus`.
    pub gpu_allocatable: Vec<u64>,
    /// Allocatable RAM.
    pub ram_allocatable: u64,
    /// Sum of `gpu_allocatable`; the key of the strategy orderings.
    pub gpu_free_total: u64,
    /// `gpu_allocatable` sorted in descending order: entry `k − 1` is the most a set of `k`
    /// GPUs can each offer, which rejects a worker for a `k`-GPU shape without looking
    /// further.
    pub sorted_allocatable: Vec<u64>,
}

impl WorkerSlot {
    fn new(view: WorkerView) -> Self {
        let gpu_allocatable: Vec<u64> = view
            .gpus
            .iter()
            .map(|gpu| {
                gpu.total_memory_bytes
                    .saturating_sub(view.reserve.gpu_bytes_per_gpu)
            })
            .collect();
        let ram_allocatable = view
            .system_memory_bytes
            .saturating_sub(view.reserve.ram_bytes);
        let mut slot = WorkerSlot {
            view,
            gpu_allocatable,
            ram_allocatable,
            gpu_free_total: 0,
            sorted_allocatable: Vec::new(),
        };
        slot.refresh();
        slot
    }

    /// Recomputes the figures derived from `gpu_allocatable`.
    fn refresh(&mut self) {
        self.gpu_free_total = self.gpu_allocatable.iter().sum();
        self.sorted_allocatable.clone_from(&self.gpu_allocatable);
        self.sorted_allocatable.sort_unstable_by(|a, b| b.cmp(a));
    }

    /// Position in `view.gpus` of the GPU with device index `index`.
    pub(crate) fn gpu_position(&self, index: u32) -> Option<usize> {
        self.view.gpus.iter().position(|gpu| gpu.index == index)
    }

    fn capacity(&self, position: usize) -> u64 {
        self.view.gpus[position]
            .total_memory_bytes
            .saturating_sub(self.view.reserve.gpu_bytes_per_gpu)
    }
}

/// The cluster as placement sees it: workers ordered by id, with what is allocatable on
/// each, updated as placements are made.
#[derive(Debug, Clone)]
pub struct SnapshotState {
    /// Workers sorted by id; a worker's position is its tie-break rank.
    pub(crate) workers: Vec<WorkerSlot>,
    pub(crate) by_id: HashMap<i64, usize>,
    pub(crate) by_name: HashMap<String, usize>,
    /// Ready workers as `(u64::MAX − gpu_free_total, position)`: emptiest first, then lowest id.
    pub(crate) spread_order: BTreeSet<(u64, usize)>,
    /// Ready workers as `(gpu_free_total, position)`: fullest first, then lowest id.
    pub(crate) binpack_order: BTreeSet<(u64, usize)>,
    /// The most GPUs any ready worker has.
    pub(crate) max_gpus_per_ready_worker: usize,
    /// Distinct GPU sizes (total memory) among ready workers, ascending: a shape no size can
    /// host is skipped without visiting any worker.
    pub(crate) ready_gpu_sizes: Vec<u64>,
    /// Every backend (`name` and `name@version`) installed on some ready worker: a
    /// preference for one that no ready worker has skips its first pass, which would
    /// visit every worker to find none.
    pub(crate) installed_on_ready: HashSet<String>,
}

impl SnapshotState {
    /// Builds the ledger: allocatable = total − system reserve − the snapshot's placed claims.
    ///
    /// Claims naming an unknown worker or GPU are ignored (the worker or device is gone, so
    /// nothing can be placed there anyway); claims exceeding what is left leave zero rather
    /// than wrapping.
    pub fn new(snapshot: &ClusterSnapshot) -> Self {
        let mut views: Vec<WorkerView> = snapshot.workers.clone();
        views.sort_by_key(|view| view.id);
        let workers: Vec<WorkerSlot> = views.into_iter().map(WorkerSlot::new).collect();
        let by_id = workers
            .iter()
            .enumerate()
            .map(|(position, slot)| (slot.view.id, position))
            .collect();
        let by_name = workers
            .iter()
            .enumerate()
            .map(|(position, slot)| (slot.view.name.clone(), position))
            .collect();
        let mut state = SnapshotState {
            workers,
            by_id,
            by_name,
            spread_order: BTreeSet::new(),
            binpack_order: BTreeSet::new(),
            max_gpus_per_ready_worker: 0,
            ready_gpu_sizes: Vec::new(),
            installed_on_ready: HashSet::new(),
        };
        debug_assert_eq!(
            state.by_id.len(),
            state.workers.len(),
            "worker ids in a snapshot are unique"
        );
        for claim in &snapshot.placed {
            state.hold(claim);
        }
        for position in 0..state.workers.len() {
            state.index(position);
        }
        state.max_gpus_per_ready_worker = state
            .workers
            .iter()
            .filter(|slot| slot.view.ready)
            .map(|slot| slot.view.gpus.len())
            .max()
            .unwrap_or(0);
        let mut sizes: Vec<u64> = state
            .workers
            .iter()
            .filter(|slot| slot.view.ready)
            .flat_map(|slot| slot.view.gpus.iter().map(|gpu| gpu.total_memory_bytes))
            .collect();
        sizes.sort_unstable();
        sizes.dedup();
        state.ready_gpu_sizes = sizes;
        state.installed_on_ready = state
            .workers
            .iter()
            .filter(|slot| slot.view.ready)
            .flat_map(|slot| slot.view.installed.iter().cloned())
            .collect();
        state
    }

    /// Records `claim` as held (an instance placed by someone else since the snapshot).
    /// Over-subscription saturates at zero.
    pub fn apply(&mut self, claim: &PlacedClaim) {
        let Some(&position) = self.by_id.get(&claim.worker_id) else {
            return;
        };
        self.unindex(position);
        self.hold(claim);
        self.index(position);
    }

    /// Returns `claim`'s bytes (an instance stopped or deleted). Allocatable never exceeds
    /// total − reserve.
    pub fn release(&mut self, claim: &PlacedClaim) {
        let Some(&position) = self.by_id.get(&claim.worker_id) else {
            return;
        };
        self.unindex(position);
        let slot = &mut self.workers[position];
        for share in &claim.gpus {
            if let Some(gpu) = slot.gpu_position(share.index) {
                let capacity = slot.capacity(gpu);
                slot.gpu_allocatable[gpu] = slot.gpu_allocatable[gpu]
                    .saturating_add(share.bytes)
                    .min(capacity);
            }
        }
        let ram_capacity = slot
            .view
            .system_memory_bytes
            .saturating_sub(slot.view.reserve.ram_bytes);
        slot.ram_allocatable = slot
            .ram_allocatable
            .saturating_add(claim.ram_bytes)
            .min(ram_capacity);
        slot.refresh();
        self.index(position);
    }

    /// Allocatable bytes on GPU `gpu_index` of worker `worker_id`.
    pub fn gpu_allocatable(&self, worker_id: i64, gpu_index: u32) -> Option<u64> {
        let slot = &self.workers[*self.by_id.get(&worker_id)?];
        Some(slot.gpu_allocatable[slot.gpu_position(gpu_index)?])
    }

    /// Allocatable RAM on worker `worker_id`.
    pub fn ram_allocatable(&self, worker_id: i64) -> Option<u64> {
        Some(self.workers[*self.by_id.get(&worker_id)?].ram_allocatable)
    }

    /// Books a placement made against this ledger. Every share must fit what is left: the
    /// placement was computed from this very state.
    pub(crate) fn commit(&mut self, placement: &Placement) {
        let Some(&position) = self.by_id.get(&placement.worker_id) else {
            debug_assert!(false, "placement on a worker this ledger does not know");
            return;
        };
        self.unindex(position);
        let slot = &mut self.workers[position];
        for share in &placement.gpus {
            let Some(gpu) = slot.gpu_position(share.index) else {
                debug_assert!(false, "placement on a GPU this ledger does not know");
                continue;
            };
            debug_assert!(
                share.bytes <= slot.gpu_allocatable[gpu],
                "placement over-commits GPU {} of {}",
                share.index,
                slot.view.name
            );
            slot.gpu_allocatable[gpu] = slot.gpu_allocatable[gpu].saturating_sub(share.bytes);
        }
        debug_assert!(
            placement.ram_bytes <= slot.ram_allocatable,
            "placement over-commits RAM of {}",
            slot.view.name
        );
        slot.ram_allocatable = slot.ram_allocatable.saturating_sub(placement.ram_bytes);
        slot.refresh();
        self.index(position);
    }

    fn hold(&mut self, claim: &PlacedClaim) {
        let Some(&position) = self.by_id.get(&claim.worker_id) else {
            return;
        };
        let slot = &mut self.workers[position];
        for share in &claim.gpus {
            if let Some(gpu) = slot.gpu_position(share.index) {
                slot.gpu_allocatable[gpu] = slot.gpu_allocatable[gpu].saturating_sub(share.bytes);
            }
        }
        slot.ram_allocatable = slot.ram_allocatable.saturating_sub(claim.ram_bytes);
        slot.refresh();
    }

    fn index(&mut self, position: usize) {
        let slot = &self.workers[position];
        if slot.view.ready {
            let free = slot.gpu_free_total;
            let fresh = self.spread_order.insert((u64::MAX - free, position))
                & self.binpack_order.insert((free, position));
            debug_assert!(fresh, "a worker is indexed once");
        }
    }

    fn unindex(&mut self, position: usize) {
        let slot = &self.workers[position];
        if slot.view.ready {
            let free = slot.gpu_free_total;
            let found = self.spread_order.remove(&(u64::MAX - free, position))
                & self.binpack_order.remove(&(free, position));
            debug_assert!(found, "an indexed worker is found under its current key");
        }
    }

    /// Checks every derived figure against a recomputation; for tests.
    #[cfg(test)]
    pub(crate) fn assert_consistent(&self) {
        let ready = self.workers.iter().filter(|slot| slot.view.ready).count();
        assert_eq!(self.spread_order.len(), ready);
        assert_eq!(self.binpack_order.len(), ready);
        for (position, slot) in self.workers.iter().enumerate() {
            assert_eq!(
                slot.gpu_free_total,
                slot.gpu_allocatable.iter().sum::<u64>()
            );
            let mut sorted = slot.gpu_allocatable.clone();
            sorted.sort_unstable_by(|a, b| b.cmp(a));
            assert_eq!(slot.sorted_allocatable, sorted);
            if slot.view.ready {
                assert!(self
                    .binpack_order
                    .contains(&(slot.gpu_free_total, position)));
                assert!(self
                    .spread_order
                    .contains(&(u64::MAX - slot.gpu_free_total, position)));
            }
        }
    }
}
