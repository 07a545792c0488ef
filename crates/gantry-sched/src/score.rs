//! Scoring: how a strategy ranks candidates that all fit.
//!
//! * `Spread` prefers the worker with the most free GPU memory, and on it the GPUs with the
//!   most allocatable memory;
//! * `Binpack` prefers the worker with the least free GPU memory that still fits, and on it
//!   the GPUs left with the least allocatable memory after the placement.
//!
//! Ties are broken by worker id, then by GPU index, so the same snapshot and request always
//! give the same placement. Worker ranking itself is done by the ledger's orderings; this
//! module ranks GPUs within a worker and the scan-based tiers (partial offload, CPU-only).

use std::cmp::Reverse;

use crate::request::Strategy;

/// A GPU that can take part in a shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FittingGpu {
    /// Position in the worker's GPU list.
    pub position: usize,
    /// Device index.
    pub index: u32,
    /// Allocatable bytes.
    pub allocatable: u64,
    /// Bytes the shape needs on it (≤ `allocatable`).
    pub need: u64,
}

/// Picks `count` GPUs of `fitting` by `strategy` and returns them in device-index order.
/// `fitting` must hold at least `count` entries.
pub(crate) fn choose_gpus(
    strategy: Strategy,
    mut fitting: Vec<FittingGpu>,
    count: usize,
) -> Vec<FittingGpu> {
    debug_assert!(fitting.len() >= count, "enough fitting GPUs to choose from");
    match strategy {
        Strategy::Spread => fitting.sort_by_key(|gpu| (Reverse(gpu.allocatable), gpu.index)),
        Strategy::Binpack => fitting.sort_by_key(|gpu| (gpu.allocatable - gpu.need, gpu.index)),
    }
    fitting.truncate(count);
    fitting.sort_by_key(|gpu| gpu.index);
    fitting
}

/// Rank of a single-resource candidate (a GPU for partial offload, a worker's RAM for
/// CPU-only): smaller is better. `worker_rank` is the worker's position in id order.
pub(crate) fn scan_rank(
    strategy: Strategy,
    allocatable: u64,
    need: u64,
    worker_rank: usize,
    gpu_index: u32,
) -> (u64, usize, u32) {
    let primary = match strategy {
        Strategy::Spread => u64::MAX - allocatable,
        Strategy::Binpack => allocatable - need,
    };
    (primary, worker_rank, gpu_index)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(index: u32, allocatable: u64, need: u64) -> FittingGpu {
        FittingGpu {
            position: index as usize,
            index,
            allocatable,
            need,
        }
    }

    #[test]
    fn spread_takes_the_emptiest_gpus_binpack_the_fullest() {
        let fitting = vec![
            gpu(0, 50, 10),
            gpu(1, 80, 10),
            gpu(2, 20, 10),
            gpu(3, 80, 10),
        ];
        let spread = choose_gpus(Strategy::Spread, fitting.clone(), 2);
        assert_eq!(spread.iter().map(|g| g.index).collect::<Vec<_>>(), [1, 3]);
        let binpack = choose_gpus(Strategy::Binpack, fitting, 2);
        assert_eq!(binpack.iter().map(|g| g.index).collect::<Vec<_>>(), [0, 2]);
    }

    #[test]
    fn ties_go_to_the_lowest_index_and_results_are_in_index_order() {
        let fitting = vec![gpu(3, 80, 10), gpu(1, 80, 10), gpu(2, 80, 10)];
        let chosen = choose_gpus(Strategy::Spread, fitting.clone(), 2);
        assert_eq!(chosen.iter().map(|g| g.index).collect::<Vec<_>>(), [1, 2]);
        let chosen = choose_gpus(Strategy::Binpack, fitting, 2);
        assert_eq!(chosen.iter().map(|g| g.index).collect::<Vec<_>>(), [1, 2]);
    }

    #[test]
    fn scan_rank_orders_by_strategy_then_worker_then_gpu() {
        // Spread: more allocatable first.
        assert!(
            scan_rank(Strategy::Spread, 90, 10, 5, 0) < scan_rank(Strategy::Spread, 80, 10, 0, 0)
        );
        // Binpack: less left over first.
        assert!(
            scan_rank(Strategy::Binpack, 20, 10, 5, 0) < scan_rank(Strategy::Binpack, 80, 10, 0, 0)
        );
        assert!(
            scan_rank(Strategy::Spread, 80, 10, 0, 1) < scan_rank(Strategy::Spread, 80, 10, 1, 0)
        );
    }
}
