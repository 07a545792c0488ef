//! Placement: choosing a worker and GPUs for one model instance.
//!
//! For each request the tiers are tried in order, and the first tier with any fitting
//! candidate wins:
//!
//! 1. the whole model on one GPU;
//! 2. the model split over 2, 3, … GPUs of one worker (vLLM/SGLang tensor parallelism with a
//!    size the model accepts, times the data-parallel size; llama.cpp a split by blocks),
//!    when the request allows it;
//! 3. llama.cpp only, when the request allows CPU offload: as many blocks as fit on one GPU
//!    with the rest in RAM (partial offload), then everything in RAM (CPU-only).
//!
//! Within a tier the [`Strategy`] picks among fitting candidates (see its variants).
//! Fitting is always against *allocatable* memory: total − system reserve − claims of placed
//! instances.
//!
//! [`place`] is the pure entry point for one request. [`SnapshotState::place`] and
//! [`place_many`] book each placement in the ledger before the next one, so a batch never
//! double-books.

use gantry_types::placement::{GpuShare, LlamaLayout, Placement, PlacementKind};

use crate::explain::{explain, Unschedulable};
use crate::filter::{eligible, format_selector, matches_selector, runs_backend};
use crate::ledger::{SnapshotState, WorkerSlot};
use crate::request::{ManualGpuSelection, PlacementRequest, Strategy};
use crate::score::{choose_gpus, scan_rank, FittingGpu};
use crate::shape::{full_fit_shapes, PartialOffload, Shape};
use crate::snapshot::ClusterSnapshot;
use crate::units::format_gib;

/// Places one request on `snapshot`; pure, books nothing.
pub fn place(
    snapshot: &ClusterSnapshot,
    request: &PlacementRequest,
) -> Result<Placement, Unschedulable> {
    SnapshotState::new(snapshot).find(request)
}

/// Places `requests` one after another, booking each placement in `state` before the next;
/// one result per request, in order.
pub fn place_many(
    state: &mut SnapshotState,
    requests: &[PlacementRequest],
) -> Vec<Result<Placement, Unschedulable>> {
    state.place_many(requests)
}

/// Rank of a partial-offload candidate, smaller first: most blocks, then the strategy's
/// [`scan_rank`].
type PartialRank = (std::cmp::Reverse<usize>, (u64, usize, u32));

/// A fitting candidate before it becomes a [`Placement`].
struct Candidate {
    position: usize,
    gpus: Vec<GpuShare>,
    ram_bytes: u64,
    tensor_parallel: u32,
    data_parallel: u32,
    llama: Option<LlamaLayout>,
}

impl SnapshotState {
    /// Places `request` and books it in the ledger.
    pub fn place(&mut self, request: &PlacementRequest) -> Result<Placement, Unschedulable> {
        let placement = self.find(request)?;
        self.commit(&placement);
        Ok(placement)
    }

    /// Places `requests` one after another, booking each; one result per request.
    pub fn place_many(
        &mut self,
        requests: &[PlacementRequest],
    ) -> Vec<Result<Placement, Unschedulable>> {
        requests.iter().map(|request| self.place(request)).collect()
    }

    /// Finds the placement for `request` without booking it: among the workers that have
    /// its preferred backend installed first, then among all.
    pub fn find(&self, request: &PlacementRequest) -> Result<Placement, Unschedulable> {
        if let Some(installed) = request
            .prefer_installed
            .as_ref()
            .filter(|installed| self.installed_on_ready.contains(*installed))
        {
            let mut strict = request.clone();
            strict.prefer_installed = None;
            strict.only_installed = Some(installed.clone());
            if let Ok(placement) = self.find_among(&strict) {
                return Ok(placement);
            }
        }
        self.find_among(request)
    }

    fn find_among(&self, request: &PlacementRequest) -> Result<Placement, Unschedulable> {
        let shapes = full_fit_shapes(request, self.max_gpus_per_ready_worker)?;
        let partial = PartialOffload::for_request(request);
        if let Some(manual) = &request.manual {
            let candidate = self.find_manual(request, manual, &shapes, partial.as_ref())?;
            return Ok(self.finish(request, candidate));
        }
        for shape in &shapes {
            if let Some(candidate) = self.best_for_shape(request, shape) {
                return Ok(self.finish(request, candidate));
            }
        }
        if let Some(plan) = &partial {
            let candidate = self.best_partial_offload(request, plan).or_else(|| {
                self.best_cpu_only(request, plan.cpu_only_ram_bytes(), cpu_only_layout())
            });
            if let Some(candidate) = candidate {
                return Ok(self.finish(request, candidate));
            }
        }
        Err(explain(self, request, &shapes, partial.as_ref()))
    }

    fn finish(&self, request: &PlacementRequest, candidate: Candidate) -> Placement {
        let slot = &self.workers[candidate.position];
        let block_count = match &request.claim.memory {
            gantry_types::claim::ModelMemory::Layers(layers) => Some(layers.block_count()),
            _ => None,
        };
        let kind = match (&candidate.llama, block_count) {
            _ if candidate.gpus.is_empty() => PlacementKind::CpuOnly,
            (Some(layout), Some(blocks)) if layout.n_gpu_layers <= blocks => {
                PlacementKind::PartialOffload
            }
            _ if candidate.gpus.len() == 1 => PlacementKind::SingleGpu,
            _ => PlacementKind::MultiGpu,
        };
        Placement {
            instance_id: request.instance_id,
            worker_id: slot.view.id,
            worker_name: slot.view.name.clone(),
            gpus: candidate.gpus,
            ram_bytes: candidate.ram_bytes,
            kind,
            tensor_parallel_size: candidate.tensor_parallel,
            data_parallel_size: candidate.data_parallel,
            llama: candidate.llama,
        }
    }

    /// The best worker offering `shape`, visiting ready workers best-first in the strategy's
    /// order and skipping those whose total free GPU memory cannot hold the shape.
    fn best_for_shape(&self, request: &PlacementRequest, shape: &Shape) -> Option<Candidate> {
        if shape.gpu_count == 0 {
            return self.best_cpu_only(request, shape.ram_bytes, shape.llama.clone());
        }
        // The least any GPU of the cluster would need for this shape; `None` when no GPU
        // size can host it (e.g. a tensor-parallel size too small for the model), so no
        // worker needs a visit.
        let min_need = self
            .ready_gpu_sizes
            .iter()
            .filter_map(|&size| shape.per_gpu.need_on(size))
            .min()?;
        let count = shape.gpu_count;
        // A fitting worker has `count` GPUs with at least `min_need` each, so at least
        // `count × min_need` free in total: the orderings start (or stop) there.
        let bound = min_need.saturating_mul(count as u64);
        let try_worker = |position: usize| {
            let slot = &self.workers[position];
            // Cheap numeric rejections first; most visited workers end here.
            if slot
                .sorted_allocatable
                .get(count - 1)
                .is_none_or(|&allocatable| allocatable < min_need)
                || slot.ram_allocatable < shape.ram_bytes
                || !eligible(&slot.view, request)
            {
                return None;
            }
            let gpus = fit_shape(slot, shape, request.strategy)?;
            Some(Candidate {
                position,
                gpus,
                ram_bytes: shape.ram_bytes,
                tensor_parallel: shape.tensor_parallel,
                data_parallel: shape.data_parallel,
                llama: shape.llama.clone(),
            })
        };
        match request.strategy {
            Strategy::Spread => self
                .spread_order
                .range(..=(u64::MAX - bound, usize::MAX))
                .find_map(|&(_, position)| try_worker(position)),
            Strategy::Binpack => self
                .binpack_order
                .range((bound, 0)..)
                .find_map(|&(_, position)| try_worker(position)),
        }
    }

    /// llama.cpp partial offload: the GPU that holds the most blocks wins; among equals, the
    /// strategy decides.
    fn best_partial_offload(
        &self,
        request: &PlacementRequest,
        plan: &PartialOffload,
    ) -> Option<Candidate> {
        let mut best: Option<(PartialRank, Candidate)> = None;
        for (position, slot) in self.workers.iter().enumerate() {
            if !eligible(&slot.view, request) {
                continue;
            }
            for (gpu_position, gpu) in slot.view.gpus.iter().enumerate() {
                let allocatable = slot.gpu_allocatable[gpu_position];
                let Some(blocks) = plan.max_blocks(allocatable) else {
                    continue;
                };
                let ram_bytes = plan.ram_bytes(blocks);
                if ram_bytes > slot.ram_allocatable {
                    // Fewer blocks on the GPU would need even more RAM.
                    continue;
                }
                let gpu_bytes = plan.gpu_bytes(blocks);
                let rank = (
                    std::cmp::Reverse(blocks),
                    scan_rank(
                        request.strategy,
                        allocatable,
                        gpu_bytes,
                        position,
                        gpu.index,
                    ),
                );
                if best
                    .as_ref()
                    .is_some_and(|(best_rank, _)| *best_rank <= rank)
                {
                    continue;
                }
                let layers = u32::try_from(blocks).unwrap_or(u32::MAX);
                best = Some((
                    rank,
                    Candidate {
                        position,
                        gpus: vec![GpuShare {
                            index: gpu.index,
                            bytes: gpu_bytes,
                        }],
                        ram_bytes,
                        tensor_parallel: 1,
                        data_parallel: 1,
                        llama: Some(LlamaLayout {
                            n_gpu_layers: layers,
                            tensor_split: vec![layers],
                        }),
                    },
                ));
            }
        }
        best.map(|(_, candidate)| candidate)
    }

    /// Everything in RAM: the worker with the most (`Spread`) or least (`Binpack`) RAM left
    /// that still fits.
    fn best_cpu_only(
        &self,
        request: &PlacementRequest,
        ram_bytes: u64,
        llama: Option<LlamaLayout>,
    ) -> Option<Candidate> {
        let position = self
            .workers
            .iter()
            .enumerate()
            .filter(|(_, slot)| eligible(&slot.view, request) && slot.ram_allocatable >= ram_bytes)
            .min_by_key(|(position, slot)| {
                scan_rank(
                    request.strategy,
                    slot.ram_allocatable,
                    ram_bytes,
                    *position,
                    0,
                )
            })
            .map(|(position, _)| position)?;
        Some(Candidate {
            position,
            gpus: Vec::new(),
            ram_bytes,
            tensor_parallel: 1,
            data_parallel: 1,
            llama,
        })
    }

    /// The user's exact GPUs: the filters still apply, then the layout with that many GPUs
    /// must fit on each of them (or, for one llama.cpp GPU with offload allowed, as many
    /// blocks as fit).
    fn find_manual(
        &self,
        request: &PlacementRequest,
        manual: &ManualGpuSelection,
        shapes: &[Shape],
        partial: Option<&PartialOffload>,
    ) -> Result<Candidate, Unschedulable> {
        let refuse = |reason: String| Unschedulable::ManualSelection {
            worker: manual.worker_name.clone(),
            reason,
        };
        let name = &manual.worker_name;
        let &position = self
            .by_name
            .get(name)
            .ok_or_else(|| refuse(format!("worker {name} does not exist")))?;
        let slot = &self.workers[position];
        if !slot.view.ready {
            return Err(refuse(format!("worker {name} is not ready")));
        }
        if !runs_backend(&slot.view, &request.backend) {
            return Err(refuse(format!(
                "worker {name} does not run backend {}",
                request.backend
            )));
        }
        if !matches_selector(&slot.view, &request.selector) {
            return Err(refuse(format!(
                "worker {name} does not match selector {}",
                format_selector(&request.selector)
            )));
        }
        if manual.gpu_indexes.is_empty() {
            return Err(refuse("no GPU index given".to_owned()));
        }
        let mut indexes = manual.gpu_indexes.clone();
        indexes.sort_unstable();
        if indexes.windows(2).any(|pair| pair[0] == pair[1]) {
            return Err(refuse("a GPU index is given twice".to_owned()));
        }
        let mut positions = Vec::with_capacity(indexes.len());
        for &index in &indexes {
            let gpu = slot
                .gpu_position(index)
                .ok_or_else(|| refuse(format!("worker {name} has no GPU {index}")))?;
            positions.push(gpu);
        }
        let count = positions.len();
        let Some(shape) = shapes.iter().find(|shape| shape.gpu_count == count) else {
            let valid: Vec<String> = shapes
                .iter()
                .map(|shape| shape.gpu_count.to_string())
                .collect();
            return Err(refuse(format!(
                "the model cannot run on {count} GPU(s); valid GPU counts here: {}",
                valid.join(", ")
            )));
        };
        let full_fit = fit_exact(slot, shape, &positions);
        match full_fit {
            Ok(gpus) => Ok(Candidate {
                position,
                gpus,
                ram_bytes: shape.ram_bytes,
                tensor_parallel: shape.tensor_parallel,
                data_parallel: shape.data_parallel,
                llama: shape.llama.clone(),
            }),
            Err(shortfall) => {
                if let (Some(plan), [gpu_position]) = (partial, positions.as_slice()) {
                    let allocatable = slot.gpu_allocatable[*gpu_position];
                    if let Some(blocks) = plan.max_blocks(allocatable) {
                        let ram_bytes = plan.ram_bytes(blocks);
                        if ram_bytes <= slot.ram_allocatable {
                            let layers = u32::try_from(blocks).unwrap_or(u32::MAX);
                            return Ok(Candidate {
                                position,
                                gpus: vec![GpuShare {
                                    index: slot.view.gpus[*gpu_position].index,
                                    bytes: plan.gpu_bytes(blocks),
                                }],
                                ram_bytes,
                                tensor_parallel: 1,
                                data_parallel: 1,
                                llama: Some(LlamaLayout {
                                    n_gpu_layers: layers,
                                    tensor_split: vec![layers],
                                }),
                            });
                        }
                    }
                }
                Err(refuse(shortfall))
            }
        }
    }
}

fn cpu_only_layout() -> Option<LlamaLayout> {
    Some(LlamaLayout {
        n_gpu_layers: 0,
        tensor_split: Vec::new(),
    })
}

/// The GPUs of `slot` chosen by `strategy` for `shape`, with the bytes booked on each, or
/// `None` when the worker cannot offer the shape (not enough fitting GPUs or RAM).
fn fit_shape(slot: &WorkerSlot, shape: &Shape, strategy: Strategy) -> Option<Vec<GpuShare>> {
    if shape.ram_bytes > slot.ram_allocatable || slot.view.gpus.len() < shape.gpu_count {
        return None;
    }
    let fitting: Vec<FittingGpu> = slot
        .view
        .gpus
        .iter()
        .enumerate()
        .filter_map(|(position, gpu)| {
            let need = shape.per_gpu.need_on(gpu.total_memory_bytes)?;
            let allocatable = slot.gpu_allocatable[position];
            (need <= allocatable).then_some(FittingGpu {
                position,
                index: gpu.index,
                allocatable,
                need,
            })
        })
        .collect();
    if fitting.len() < shape.gpu_count {
        return None;
    }
    Some(
        choose_gpus(strategy, fitting, shape.gpu_count)
            .iter()
            .enumerate()
            .map(|(order, gpu)| GpuShare {
                index: gpu.index,
                bytes: shape.per_gpu.share(order, gpu.need),
            })
            .collect(),
    )
}

/// `shape` on exactly the GPUs at `positions` (sorted by device index), or the first
/// shortfall in words.
fn fit_exact(
    slot: &WorkerSlot,
    shape: &Shape,
    positions: &[usize],
) -> Result<Vec<GpuShare>, String> {
    let name = &slot.view.name;
    let mut gpus = Vec::with_capacity(positions.len());
    for (order, &position) in positions.iter().enumerate() {
        let gpu = &slot.view.gpus[position];
        let allocatable = slot.gpu_allocatable[position];
        let Some(need) = shape.per_gpu.need_on(gpu.total_memory_bytes) else {
            return Err(format!(
                "GPU {} on {name} ({} total) is too small: the model needs {} of it",
                gpu.index,
                format_gib(gpu.total_memory_bytes),
                format_gib(shape.per_gpu.lower_bound())
            ));
        };
        if need > allocatable {
            return Err(format!(
                "GPU {} on {name} has {} free, needs {}",
                gpu.index,
                format_gib(allocatable),
                format_gib(need)
            ));
        }
        gpus.push(GpuShare {
            index: gpu.index,
            bytes: shape.per_gpu.share(order, need),
        });
    }
    if shape.ram_bytes > slot.ram_allocatable {
        return Err(format!(
            "{name} has {} RAM free, needs {}",
            format_gib(slot.ram_allocatable),
            format_gib(shape.ram_bytes)
        ));
    }
    Ok(gpus)
}
