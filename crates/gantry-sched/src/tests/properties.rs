//! Property tests: random small clusters and batches of requests, placed one after another
//! through the ledger and checked against a brute-force oracle that shares no code with the
//! placer's search.
//!
//! For every request the oracle enumerates every eligible worker and every subset of its
//! GPUs (and, for llama.cpp offload, every block count) under the layout rules the crate
//! documents, and returns the first tier that has a fitting slot. The properties:
//!
//! * a placement is made exactly when the oracle finds a slot, and in the oracle's tier;
//! * a placement is on a ready worker that matches the selector and runs the backend, on
//!   distinct existing GPUs, honouring a manual selection;
//! * its bytes are what the claim's rules say, and never exceed what is allocatable, so no
//!   GPU or RAM is ever over-committed across the whole batch;
//! * among workers offering the tier, the chosen one is the strategy's best.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use proptest::prelude::*;

use crate::units::{GIB, MIB};
use crate::{
    ClusterSnapshot, GpuShare, GpuView, ManualGpuSelection, PlacedClaim, Placement, PlacementKind,
    PlacementRequest, SnapshotState, Strategy as PlacementStrategy, SystemReserve, WorkerView,
};
use gantry_types::claim::{
    EngineMemory, FixedMemory, LayerBreakdown, MemoryFraction, ModelMemory, ResourceClaim,
};

// ---------------------------------------------------------------------------------------
// Generators
// ---------------------------------------------------------------------------------------

fn gpu_size() -> impl proptest::strategy::Strategy<Value = u64> {
    prop_oneof![
        Just(16 * GIB),
        Just(24 * GIB),
        Just(48 * GIB),
        Just(80 * GIB),
        (1u64..=100).prop_map(|g| g * GIB),
    ]
}

/// A worker with id `id` and, per GPU, the percentage already used by placed instances.
fn arb_worker(id: i64) -> impl proptest::strategy::Strategy<Value = (WorkerView, Vec<u64>, u64)> {
    (
        prop::bool::weighted(0.85),
        prop_oneof![Just("a"), Just("b")],
        prop::sample::subsequence(vec!["llama.cpp", "vllm", "custom"], 1..=3),
        prop_oneof![1 => Just(0usize), 6 => 1usize..=4]
            .prop_flat_map(|n| prop::collection::vec(gpu_size(), n)),
        8u64..=256,
        0u64..=2048,
        0u64..=8,
        prop::collection::vec(prop_oneof![Just(0u64), 0u64..=100], 4),
        0u64..=100,
    )
        .prop_map(
            move |(
                ready,
                zone,
                backends,
                gpus,
                ram_gib,
                reserve_mib,
                reserve_ram_gib,
                used,
                ram_used,
            )| {
                let view = WorkerView {
                    id,
                    name: format!("w{id}"),
                    ready,
                    labels: BTreeMap::from([("zone".to_owned(), zone.to_owned())]),
                    backends: backends.into_iter().map(str::to_owned).collect(),
                    installed: Default::default(),
                    gpus: gpus
                        .into_iter()
                        .enumerate()
                        .map(|(index, total)| GpuView {
                            index: u32::try_from(index).expect("at most 4 GPUs"),
                            total_memory_bytes: total,
                            simulated: true,
                        })
                        .collect(),
                    system_memory_bytes: ram_gib * GIB,
                    cpu_count: 16,
                    reserve: SystemReserve {
                        gpu_bytes_per_gpu: reserve_mib * MIB,
                        ram_bytes: reserve_ram_gib * GIB,
                    },
                };
                (view, used, ram_used)
            },
        )
}

/// A cluster of 1–5 workers with some memory already placed (never beyond capacity).
fn arb_cluster() -> impl proptest::strategy::Strategy<Value = ClusterSnapshot> {
    (1usize..=5)
        .prop_flat_map(|n| (1..=n).map(|id| arb_worker(id as i64)).collect::<Vec<_>>())
        .prop_map(|workers| {
            let mut snapshot = ClusterSnapshot::default();
            for (position, (view, used, ram_used)) in workers.into_iter().enumerate() {
                let gpus = view
                    .gpus
                    .iter()
                    .zip(&used)
                    .map(|(gpu, percent)| GpuShare {
                        index: gpu.index,
                        bytes: capacity(&view, gpu) / 100 * percent,
                    })
                    .collect();
                let ram = ram_capacity(&view) / 100 * ram_used;
                snapshot.placed.push(PlacedClaim {
                    instance_id: 1000 + position as i64,
                    worker_id: view.id,
                    gpus,
                    ram_bytes: ram,
                });
                snapshot.workers.push(view);
            }
            snapshot
        })
}

#[derive(Debug, Clone)]
enum Model {
    Fixed {
        gpus: u32,
        gib: u64,
    },
    Layered {
        blocks: usize,
        block_mib: u64,
        output_mib: u64,
        overhead_mib: u64,
        base_ram_gib: u64,
        host_compute_mib: u64,
        fixed_gpu_layers: Option<u32>,
    },
    Engine {
        weights_gib: u64,
        heads: (u32, u32),
        fraction_percent: u32,
        sglang_default: bool,
        kv_tokens: u64,
        fixed_tp: Option<u32>,
        data_parallel: u32,
    },
}

fn arb_model() -> impl proptest::strategy::Strategy<Value = Model> {
    prop_oneof![
        (0u32..=3, 1u64..=60).prop_map(|(gpus, gib)| Model::Fixed { gpus, gib }),
        (
            1usize..=8,
            256u64..=20_480,
            0u64..=2048,
            0u64..=2048,
            0u64..=16,
            0u64..=2048,
            prop::option::weighted(0.2, 0u32..=10),
        )
            .prop_map(
                |(
                    blocks,
                    block_mib,
                    output_mib,
                    overhead_mib,
                    base_ram_gib,
                    host_compute_mib,
                    fixed_gpu_layers,
                )| {
                    Model::Layered {
                        blocks,
                        block_mib,
                        output_mib,
                        overhead_mib,
                        base_ram_gib,
                        host_compute_mib,
                        fixed_gpu_layers,
                    }
                }
            ),
        (
            1u64..=60,
            prop::sample::select(vec![(32u32, 8u32), (12, 4), (40, 8), (8, 8), (6, 2)]),
            50u32..=95,
            prop::bool::weighted(0.2),
            prop_oneof![Just(0u64), 512u64..=16_384],
            prop::option::weighted(0.2, prop::sample::select(vec![1u32, 2, 4])),
            prop_oneof![4 => Just(1u32), 1 => Just(2u32)],
        )
            .prop_map(
                |(
                    weights_gib,
                    heads,
                    fraction_percent,
                    sglang_default,
                    kv_tokens,
                    fixed_tp,
                    data_parallel,
                )| {
                    Model::Engine {
                        weights_gib,
                        heads,
                        fraction_percent,
                        sglang_default,
                        kv_tokens,
                        fixed_tp,
                        data_parallel,
                    }
                }
            ),
    ]
}

fn arb_request(instance_id: i64) -> impl proptest::strategy::Strategy<Value = PlacementRequest> {
    (
        arb_model(),
        prop_oneof![
            Just(PlacementStrategy::Spread),
            Just(PlacementStrategy::Binpack)
        ],
        prop::bool::weighted(0.7),
        prop::bool::weighted(0.5),
        prop::option::weighted(
            0.25,
            prop_oneof![4 => Just("a"), 4 => Just("b"), 1 => Just("c")],
        ),
        prop::option::weighted(
            0.15,
            (
                1i64..=4,
                prop_oneof![Just(1u32), Just(2), Just(3), 1u32..16],
            ),
        ),
    )
        .prop_map(
            move |(model, strategy, allow_tp, allow_offload, zone, manual)| {
                let (claim, backend, data_parallel) = claim_of(&model);
                let mut request = PlacementRequest::new(instance_id, "m", backend, claim);
                request.strategy = strategy;
                request.allow_tensor_parallel = allow_tp;
                request.allow_cpu_offload = allow_offload;
                request.data_parallel_size = data_parallel;
                if let Some(zone) = zone {
                    request.selector.insert("zone".to_owned(), zone.to_owned());
                }
                if let Some((worker, mask)) = manual {
                    request.manual = Some(ManualGpuSelection {
                        worker_name: format!("w{worker}"),
                        gpu_indexes: (0..4).filter(|bit| mask & (1 << bit) != 0).collect(),
                    });
                }
                request
            },
        )
}

fn claim_of(model: &Model) -> (ResourceClaim, &'static str, Option<u32>) {
    match *model {
        Model::Fixed { gpus, gib } => (
            ResourceClaim {
                per_gpu_overhead_bytes: 0,
                base_ram_bytes: GIB,
                memory: ModelMemory::Fixed(FixedMemory {
                    gpu_count: gpus,
                    bytes_per_gpu: gib * GIB,
                }),
            },
            "custom",
            None,
        ),
        Model::Layered {
            blocks,
            block_mib,
            output_mib,
            overhead_mib,
            base_ram_gib,
            host_compute_mib,
            fixed_gpu_layers,
        } => (
            ResourceClaim {
                per_gpu_overhead_bytes: overhead_mib * MIB,
                base_ram_bytes: base_ram_gib * GIB,
                memory: ModelMemory::Layers(LayerBreakdown {
                    // Blocks differ slightly so that the order of blocks matters.
                    block_bytes: (0..blocks as u64)
                        .map(|i| block_mib * MIB + i * 7 * MIB)
                        .collect(),
                    // The KV cache differs per block too (as with sliding-window layers).
                    block_kv_bytes: (0..blocks as u64).map(|i| (i + 1) * 5 * MIB).collect(),
                    output_bytes: output_mib * MIB,
                    host_compute_bytes: host_compute_mib * MIB,
                    per_gpu_compute_bytes: overhead_mib * MIB / 3,
                    host_embedding_bytes: base_ram_gib * GIB / 2,
                    host_logits_bytes: base_ram_gib * GIB / 16,
                    host_repack_bytes: 0,
                    tied_output_bytes: 0,
                    fixed_gpu_layers,
                }),
            },
            "llama.cpp",
            None,
        ),
        Model::Engine {
            weights_gib,
            heads,
            fraction_percent,
            sglang_default,
            kv_tokens,
            fixed_tp,
            data_parallel,
        } => (
            ResourceClaim {
                per_gpu_overhead_bytes: 2 * GIB,
                base_ram_bytes: 4 * GIB,
                memory: ModelMemory::Engine(EngineMemory {
                    weight_bytes: weights_gib * GIB,
                    kv_bytes_per_token_per_kv_head: 16_384,
                    kv_head_count: heads.1,
                    attention_head_count: heads.0,
                    minimum_kv_tokens: kv_tokens,
                    memory_fraction: if sglang_default {
                        MemoryFraction::SglangDefault
                    } else {
                        MemoryFraction::Fixed(f64::from(fraction_percent) / 100.0)
                    },
                    fixed_tensor_parallel_size: fixed_tp,
                }),
            },
            "vllm",
            Some(data_parallel),
        ),
    }
}

// ---------------------------------------------------------------------------------------
// The independent ledger and the oracle
// ---------------------------------------------------------------------------------------

fn capacity(worker: &WorkerView, gpu: &GpuView) -> u64 {
    gpu.total_memory_bytes
        .saturating_sub(worker.reserve.gpu_bytes_per_gpu)
}

fn ram_capacity(worker: &WorkerView) -> u64 {
    worker
        .system_memory_bytes
        .saturating_sub(worker.reserve.ram_bytes)
}

/// Allocatable memory, recomputed by the test from the snapshot and the placements.
struct Ledger {
    gpu: HashMap<(i64, u32), u64>,
    ram: HashMap<i64, u64>,
}

impl Ledger {
    fn new(snapshot: &ClusterSnapshot) -> Self {
        let mut ledger = Ledger {
            gpu: HashMap::new(),
            ram: HashMap::new(),
        };
        for worker in &snapshot.workers {
            for gpu in &worker.gpus {
                ledger
                    .gpu
                    .insert((worker.id, gpu.index), capacity(worker, gpu));
            }
            ledger.ram.insert(worker.id, ram_capacity(worker));
        }
        for claim in &snapshot.placed {
            for share in &claim.gpus {
                let left = ledger
                    .gpu
                    .get_mut(&(claim.worker_id, share.index))
                    .expect("known GPU");
                *left = left
                    .checked_sub(share.bytes)
                    .expect("fixtures never over-commit");
            }
            let left = ledger.ram.get_mut(&claim.worker_id).expect("known worker");
            *left = left
                .checked_sub(claim.ram_bytes)
                .expect("fixtures never over-commit");
        }
        ledger
    }
}

/// The first tier with a fitting slot, in the documented order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tier {
    /// The whole model (or a user-fixed layer count) on this many GPUs.
    Gpus(usize),
    /// llama.cpp partial offload with this many blocks on one GPU.
    Partial(usize),
    /// Everything in RAM.
    Cpu,
}

fn is_eligible(worker: &WorkerView, request: &PlacementRequest) -> bool {
    worker.ready
        && worker.backends.contains(&request.backend)
        && request
            .selector
            .iter()
            .all(|(key, value)| worker.labels.get(key) == Some(value))
}

fn fraction(memory: &EngineMemory, tp: u32) -> f64 {
    match memory.memory_fraction {
        MemoryFraction::Fixed(f) => f,
        MemoryFraction::SglangDefault => match tp {
            1 => 0.88,
            2..=3 => 0.87,
            4..=7 => 0.85,
            8..=15 => 0.81,
            _ => 0.79,
        },
    }
}

fn engine_minimum(memory: &EngineMemory, overhead: u64, tp: u32) -> u64 {
    let tp = u64::from(tp);
    let heads = u64::from(memory.kv_head_count).div_ceil(tp).max(1);
    memory.weight_bytes.div_ceil(tp)
        + memory.kv_bytes_per_token_per_kv_head * heads * memory.minimum_kv_tokens
        + overhead
}

fn engine_accepts(memory: &EngineMemory, tp: u32) -> bool {
    memory.attention_head_count % tp == 0
        && (memory.kv_head_count % tp == 0 || tp % memory.kv_head_count == 0)
}

/// Blocks on the GPUs and whether the output layer goes with them, for llama.cpp.
fn llama_gpu_side(layers: &LayerBreakdown) -> (usize, bool) {
    let blocks = layers.block_bytes.len();
    match layers.fixed_gpu_layers {
        None => (blocks, true),
        Some(n) => ((n as usize).min(blocks), n as usize > blocks),
    }
}

/// Even runs of the last `gpu_blocks` blocks over `k` GPUs, the extra blocks first, the
/// output with the last run: bytes per GPU.
fn llama_runs(claim: &ResourceClaim, layers: &LayerBreakdown, k: usize) -> Vec<u64> {
    let (gpu_blocks, output_on_gpu) = llama_gpu_side(layers);
    let first = layers.block_bytes.len() - gpu_blocks;
    let mut runs = Vec::new();
    let mut next = first;
    for i in 0..k {
        let size = gpu_blocks / k + usize::from(i < gpu_blocks % k);
        let mut bytes: u64 = layers.block_bytes[next..next + size].iter().sum();
        if i == k - 1 && output_on_gpu {
            bytes += layers.output_bytes;
        }
        runs.push(claim.per_gpu_overhead_bytes + bytes);
        next += size;
    }
    runs
}

fn llama_ram(
    claim: &ResourceClaim,
    layers: &LayerBreakdown,
    gpu_blocks: usize,
    output_on_gpu: bool,
) -> u64 {
    let host = layers.block_bytes.len() - gpu_blocks;
    let mut ram = claim.base_ram_bytes + layers.block_bytes[..host].iter().sum::<u64>();
    if !output_on_gpu {
        ram += layers.output_bytes;
    }
    if host > 0 || !output_on_gpu {
        ram += layers.host_compute_bytes;
    }
    ram
}

/// What a GPU of a given size needs to take part in a tier, `None` when it cannot.
type GpuNeed = Box<dyn Fn(&GpuView) -> Option<u64>>;

/// One full-fit tier: its GPU count, the RAM it needs, and what a GPU needs to take part
/// (`None` when it cannot).
struct GpuTier {
    count: usize,
    ram: u64,
    need: GpuNeed,
}

/// The full-fit tiers of `request`, in order, for a cluster whose largest worker has
/// `max_gpus` GPUs.
fn gpu_tiers(request: &PlacementRequest, max_gpus: usize) -> Vec<GpuTier> {
    let claim = request.claim.clone();
    match &request.claim.memory {
        ModelMemory::Fixed(fixed) => {
            let bytes = claim.per_gpu_overhead_bytes + fixed.bytes_per_gpu;
            vec![GpuTier {
                count: fixed.gpu_count as usize,
                ram: claim.base_ram_bytes,
                need: Box::new(move |_: &GpuView| Some(bytes)),
            }]
        }
        ModelMemory::Layers(layers) => {
            let (gpu_blocks, output_on_gpu) = llama_gpu_side(layers);
            let ram = llama_ram(&claim, layers, gpu_blocks, output_on_gpu);
            if gpu_blocks == 0 {
                return vec![GpuTier {
                    count: 0,
                    ram,
                    need: Box::new(|_: &GpuView| Some(0)),
                }];
            }
            let most = if request.allow_tensor_parallel {
                gpu_blocks.min(max_gpus).max(1)
            } else {
                1
            };
            (1..=most)
                .map(|k| {
                    let threshold = llama_runs(&claim, layers, k)
                        .into_iter()
                        .max()
                        .expect("k ≥ 1");
                    GpuTier {
                        count: k,
                        ram,
                        need: Box::new(move |_: &GpuView| Some(threshold)),
                    }
                })
                .collect()
        }
        ModelMemory::Engine(memory) => {
            let dp = request.data_parallel_size.unwrap_or(1);
            let tps: Vec<u32> = match memory.fixed_tensor_parallel_size {
                Some(tp) if !engine_accepts(memory, tp) => vec![],
                Some(tp) => vec![tp],
                None if request.allow_tensor_parallel => (1..=(max_gpus as u32 / dp).max(1))
                    .filter(|&tp| engine_accepts(memory, tp))
                    .collect(),
                None => vec![1],
            };
            tps.into_iter()
                .map(|tp| {
                    let memory = memory.clone();
                    let overhead = claim.per_gpu_overhead_bytes;
                    GpuTier {
                        count: (tp * dp) as usize,
                        ram: claim.base_ram_bytes * u64::from(dp),
                        need: Box::new(move |gpu: &GpuView| {
                            let reserved = (fraction(&memory, tp) * gpu.total_memory_bytes as f64)
                                .floor() as u64;
                            (reserved >= engine_minimum(&memory, overhead, tp)).then_some(reserved)
                        }),
                    }
                })
                .collect()
        }
    }
}

/// Whether some subset of exactly `count` GPUs of `worker` (restricted to `only` when given)
/// all satisfy the tier, by enumerating every subset.
fn worker_offers(
    worker: &WorkerView,
    ledger: &Ledger,
    tier: &GpuTier,
    only: Option<&BTreeSet<u32>>,
) -> bool {
    if tier.ram > ledger.ram[&worker.id] {
        return false;
    }
    let gpus: Vec<&GpuView> = worker
        .gpus
        .iter()
        .filter(|gpu| only.is_none_or(|set| set.contains(&gpu.index)))
        .collect();
    (0u32..(1 << gpus.len())).any(|mask| {
        mask.count_ones() as usize == tier.count
            && (only.is_none() || tier.count == gpus.len())
            && gpus
                .iter()
                .enumerate()
                .filter(|(bit, _)| mask & (1 << bit) != 0)
                .all(|(_, gpu)| {
                    (tier.need)(gpu).is_some_and(|need| need <= ledger.gpu[&(worker.id, gpu.index)])
                })
    })
}

/// The most blocks any allowed GPU can hold with the rest in RAM, by trying every count.
fn best_partial(
    request: &PlacementRequest,
    workers: &[&WorkerView],
    ledger: &Ledger,
    only: Option<&BTreeSet<u32>>,
) -> Option<usize> {
    let ModelMemory::Layers(layers) = &request.claim.memory else {
        return None;
    };
    let blocks = layers.block_bytes.len();
    let mut best = None;
    for worker in workers {
        for gpu in &worker.gpus {
            if only.is_some_and(|set| !set.contains(&gpu.index)) {
                continue;
            }
            for b in 1..=blocks {
                let gpu_bytes = request.claim.per_gpu_overhead_bytes
                    + layers.block_bytes[blocks - b..].iter().sum::<u64>();
                let ram = llama_ram(&request.claim, layers, b, false);
                if gpu_bytes <= ledger.gpu[&(worker.id, gpu.index)] && ram <= ledger.ram[&worker.id]
                {
                    best = best.max(Some(b));
                }
            }
        }
    }
    best
}

/// The oracle: the first tier with any fitting slot, and the workers offering it.
fn oracle(
    workers: &[WorkerView],
    ledger: &Ledger,
    request: &PlacementRequest,
) -> Option<(Tier, Vec<i64>)> {
    let max_gpus = workers
        .iter()
        .filter(|w| w.ready)
        .map(|w| w.gpus.len())
        .max()
        .unwrap_or(0);
    let mut eligible: Vec<&WorkerView> =
        workers.iter().filter(|w| is_eligible(w, request)).collect();
    let mut only = None;
    if let Some(manual) = &request.manual {
        eligible.retain(|w| w.name == manual.worker_name);
        let set: BTreeSet<u32> = manual.gpu_indexes.iter().copied().collect();
        let worker = eligible.first()?;
        if set.len() != manual.gpu_indexes.len()
            || set.is_empty()
            || !set
                .iter()
                .all(|i| worker.gpus.iter().any(|g| g.index == *i))
        {
            return None;
        }
        only = Some(set);
    }
    let tiers = gpu_tiers(request, max_gpus);
    for tier in &tiers {
        if only.as_ref().is_some_and(|set| set.len() != tier.count) {
            continue;
        }
        let offering: Vec<i64> = eligible
            .iter()
            .filter(|w| worker_offers(w, ledger, tier, only.as_ref()))
            .map(|w| w.id)
            .collect();
        if !offering.is_empty() {
            let found = if tier.count == 0 {
                Tier::Cpu
            } else {
                Tier::Gpus(tier.count)
            };
            return Some((found, offering));
        }
    }
    let auto_layers =
        matches!(&request.claim.memory, ModelMemory::Layers(l) if l.fixed_gpu_layers.is_none());
    if !(auto_layers && request.allow_cpu_offload) {
        return None;
    }
    if only.as_ref().is_some_and(|set| set.len() != 1) {
        return None;
    }
    if let Some(blocks) = best_partial(request, &eligible, ledger, only.as_ref()) {
        return Some((Tier::Partial(blocks), Vec::new()));
    }
    if only.is_some() {
        return None;
    }
    let ModelMemory::Layers(layers) = &request.claim.memory else {
        return None;
    };
    let cpu_ram = llama_ram(&request.claim, layers, 0, false);
    let offering: Vec<i64> = eligible
        .iter()
        .filter(|w| ledger.ram[&w.id] >= cpu_ram)
        .map(|w| w.id)
        .collect();
    (!offering.is_empty()).then_some((Tier::Cpu, offering))
}

// ---------------------------------------------------------------------------------------
// Checking one placement
// ---------------------------------------------------------------------------------------

fn tier_of(request: &PlacementRequest, placement: &Placement) -> Tier {
    let auto_layers =
        matches!(&request.claim.memory, ModelMemory::Layers(l) if l.fixed_gpu_layers.is_none());
    if placement.gpus.is_empty() {
        Tier::Cpu
    } else if auto_layers && placement.kind == PlacementKind::PartialOffload {
        Tier::Partial(placement.llama.as_ref().expect("llama layout").n_gpu_layers as usize)
    } else {
        Tier::Gpus(placement.gpus.len())
    }
}

/// Checks that `placement`'s bytes follow the claim's rules, and that its parts add up to
/// them exactly.
fn check_accounting(request: &PlacementRequest, worker: &WorkerView, placement: &Placement) {
    let claim = &request.claim;
    check_parts(claim, placement);
    let shares: Vec<u64> = placement.gpus.iter().map(|g| g.bytes).collect();
    let total = |index: u32| {
        worker
            .gpus
            .iter()
            .find(|g| g.index == index)
            .expect("existing GPU")
            .total_memory_bytes
    };
    match &claim.memory {
        ModelMemory::Fixed(fixed) => {
            assert_eq!(
                shares,
                vec![claim.per_gpu_overhead_bytes + fixed.bytes_per_gpu; fixed.gpu_count as usize]
            );
            assert_eq!(placement.ram_bytes, claim.base_ram_bytes);
        }
        ModelMemory::Engine(memory) => {
            let dp = request.data_parallel_size.unwrap_or(1);
            let tp = placement.tensor_parallel_size;
            assert_eq!(placement.data_parallel_size, dp);
            assert_eq!(placement.gpus.len(), (tp * dp) as usize);
            assert!(engine_accepts(memory, tp), "tp {tp} is valid for the model");
            if let Some(fixed) = memory.fixed_tensor_parallel_size {
                assert_eq!(tp, fixed);
            }
            if !request.allow_tensor_parallel {
                assert!(tp == 1 || memory.fixed_tensor_parallel_size == Some(tp));
            }
            for gpu in &placement.gpus {
                let reserved = (fraction(memory, tp) * total(gpu.index) as f64).floor() as u64;
                assert_eq!(gpu.bytes, reserved);
                assert!(reserved >= engine_minimum(memory, claim.per_gpu_overhead_bytes, tp));
            }
            assert_eq!(placement.ram_bytes, claim.base_ram_bytes * u64::from(dp));
        }
        ModelMemory::Layers(layers) => {
            let blocks = layers.block_bytes.len();
            let layout = placement.llama.as_ref().expect("llama layout");
            let (gpu_blocks, output_on_gpu) = match tier_of(request, placement) {
                Tier::Partial(b) => (b, false),
                Tier::Cpu => (0, false),
                Tier::Gpus(_) => llama_gpu_side(layers),
            };
            let expected_layers = gpu_blocks + usize::from(output_on_gpu);
            assert_eq!(layout.n_gpu_layers as usize, expected_layers);
            assert_eq!(
                layout.tensor_split.iter().sum::<u32>() as usize,
                expected_layers
            );
            assert_eq!(layout.tensor_split.len(), placement.gpus.len());
            let gpu_side: u64 = layers.block_bytes[blocks - gpu_blocks..]
                .iter()
                .sum::<u64>()
                + if output_on_gpu {
                    layers.output_bytes
                } else {
                    0
                };
            assert_eq!(
                shares.iter().sum::<u64>(),
                gpu_side + claim.per_gpu_overhead_bytes * shares.len() as u64,
                "every GPU block, the output layer and one overhead per GPU are booked"
            );
            assert_eq!(
                placement.ram_bytes,
                llama_ram(claim, layers, gpu_blocks, output_on_gpu)
            );
        }
    }
}

/// Every GPU's parts and RAM's parts add up to exactly the bytes the placement reserves.
fn check_parts(claim: &ResourceClaim, placement: &Placement) {
    let parts = crate::parts::reservation_parts(claim, placement)
        .expect("a placement the scheduler made splits into parts");
    assert_eq!(parts.gpus.len(), placement.gpus.len());
    for (gpu, share) in parts.gpus.iter().zip(&placement.gpus) {
        assert_eq!(gpu.index, share.index);
        assert_eq!(gpu.total_bytes, share.bytes);
        assert_eq!(
            gpu.weights_bytes
                + gpu.kv_cache_bytes
                + gpu.extra_kv_cache_bytes
                + gpu.compute_buffer_bytes
                + gpu.overhead_bytes
                + gpu.declared_bytes,
            share.bytes,
            "GPU {} of {placement:?}: {gpu:?}",
            share.index
        );
    }
    let ram = &parts.ram;
    assert_eq!(
        ram.weights_bytes
            + ram.embedding_bytes
            + ram.kv_cache_bytes
            + ram.compute_buffer_bytes
            + ram.logits_bytes
            + ram.process_bytes,
        placement.ram_bytes,
        "RAM of {placement:?}: {ram:?}"
    );
    if let ModelMemory::Layers(layers) = &claim.memory {
        // Every block is somewhere exactly once, with its KV cache.
        let on_gpus: u64 = parts.gpus.iter().map(|g| g.kv_cache_bytes).sum();
        assert_eq!(
            on_gpus + ram.kv_cache_bytes,
            layers.block_kv_bytes.iter().sum::<u64>()
        );
        let blocks: u32 = parts
            .gpus
            .iter()
            .filter_map(|g| g.layers)
            .chain(ram.layers)
            .map(|range| range.blocks)
            .sum();
        assert_eq!(blocks as usize, layers.block_bytes.len());
    }
}

fn run_batch(
    snapshot: &ClusterSnapshot,
    requests: &[PlacementRequest],
) -> Result<(), TestCaseError> {
    let mut state = SnapshotState::new(snapshot);
    let mut ledger = Ledger::new(snapshot);
    let mut booked: HashMap<(i64, u32), u64> = HashMap::new();
    for request in requests {
        let expected = oracle(&snapshot.workers, &ledger, request);
        let result = state.place(request);
        match (&result, &expected) {
            (Err(e), None) => {
                prop_assert!(!e.to_string().is_empty());
            }
            (Err(e), Some(tier)) => {
                prop_assert!(false, "oracle found {tier:?} but placement failed: {e}");
            }
            (Ok(p), None) => {
                prop_assert!(false, "placement {p:?} where the oracle found no slot");
            }
            (Ok(placement), Some((tier, offering))) => {
                let worker = snapshot
                    .workers
                    .iter()
                    .find(|w| w.id == placement.worker_id)
                    .expect("placed on a known worker");
                prop_assert!(worker.ready, "placed on a non-ready worker");
                prop_assert!(
                    is_eligible(worker, request),
                    "placed on a filtered-out worker"
                );
                prop_assert_eq!(&placement.worker_name, &worker.name);
                prop_assert_eq!(tier_of(request, placement), *tier);
                let indexes: BTreeSet<u32> = placement.gpus.iter().map(|g| g.index).collect();
                prop_assert_eq!(indexes.len(), placement.gpus.len(), "distinct GPUs");
                if let Some(manual) = &request.manual {
                    prop_assert_eq!(&placement.worker_name, &manual.worker_name);
                    let wanted: BTreeSet<u32> = manual.gpu_indexes.iter().copied().collect();
                    prop_assert_eq!(&indexes, &wanted);
                }
                if let Tier::Gpus(_) | Tier::Cpu = tier {
                    if request.manual.is_none() {
                        check_best_worker(snapshot, &ledger, request, placement, offering, *tier)?;
                    }
                }
                check_accounting(request, worker, placement);
                for share in &placement.gpus {
                    let left = ledger
                        .gpu
                        .get_mut(&(worker.id, share.index))
                        .expect("placed on an existing GPU");
                    prop_assert!(share.bytes <= *left, "GPU over-committed");
                    *left -= share.bytes;
                    *booked.entry((worker.id, share.index)).or_default() += share.bytes;
                }
                let left = ledger.ram.get_mut(&worker.id).expect("known worker");
                prop_assert!(placement.ram_bytes <= *left, "RAM over-committed");
                *left -= placement.ram_bytes;
            }
        }
    }
    // Whole batch: the snapshot's claims plus everything booked fit every GPU.
    for worker in &snapshot.workers {
        for gpu in &worker.gpus {
            let before: u64 = snapshot
                .placed
                .iter()
                .filter(|c| c.worker_id == worker.id)
                .flat_map(|c| &c.gpus)
                .filter(|s| s.index == gpu.index)
                .map(|s| s.bytes)
                .sum();
            let after = before + booked.get(&(worker.id, gpu.index)).copied().unwrap_or(0);
            prop_assert!(
                after <= capacity(worker, gpu),
                "GPU {} of {} over-committed",
                gpu.index,
                worker.name
            );
            prop_assert_eq!(
                state.gpu_allocatable(worker.id, gpu.index),
                Some(capacity(worker, gpu) - after)
            );
        }
        prop_assert_eq!(
            state.ram_allocatable(worker.id),
            Some(ledger.ram[&worker.id])
        );
    }
    state.assert_consistent();
    Ok(())
}

/// The chosen worker is the strategy's best among those offering the tier: most (`Spread`)
/// or least (`Binpack`) free GPU memory, then lowest id; for CPU-only, by free RAM.
fn check_best_worker(
    snapshot: &ClusterSnapshot,
    ledger: &Ledger,
    request: &PlacementRequest,
    placement: &Placement,
    offering: &[i64],
    tier: Tier,
) -> Result<(), TestCaseError> {
    let free = |id: i64| -> u64 {
        if tier == Tier::Cpu {
            ledger.ram[&id]
        } else {
            let worker = snapshot.workers.iter().find(|w| w.id == id).expect("known");
            worker.gpus.iter().map(|g| ledger.gpu[&(id, g.index)]).sum()
        }
    };
    let best = match request.strategy {
        PlacementStrategy::Spread => offering
            .iter()
            .copied()
            .min_by_key(|&id| (u64::MAX - free(id), id)),
        PlacementStrategy::Binpack => offering.iter().copied().min_by_key(|&id| (free(id), id)),
    };
    prop_assert_eq!(
        Some(placement.worker_id),
        best,
        "strategy {:?}",
        request.strategy
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn placements_match_the_oracle_and_never_over_commit(
        snapshot in arb_cluster(),
        requests in prop::collection::vec(0i64..1, 1..=12)
            .prop_flat_map(|ids| ids.iter().enumerate().map(|(i, _)| arb_request(i as i64)).collect::<Vec<_>>()),
    ) {
        run_batch(&snapshot, &requests)?;
    }
}
