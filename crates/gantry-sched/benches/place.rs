//! Placement benchmark: 10,000 instances placed one after another through the ledger on
//! 2,000 simulated workers with 8 × 80 GiB GPUs each.
//!
//! The mix: 70% small llama.cpp models that fit one GPU (about 5–20 GiB), 20% vLLM models
//! that need a 2-GPU tensor-parallel group, 10% vLLM models that need 4 GPUs; shuffled with a
//! fixed seed. Each strategy runs on a fresh ledger. Afterwards 2,000 more 4-GPU requests
//! are placed on the filled cluster, to time the failure path (which builds the
//! explanation) once the cluster saturates. Run with `cargo bench -p gantry-sched`.

use std::time::{Duration, Instant};

use gantry_sched::estimate::engine::{estimate_engine, EngineOptions, ServingEngine};
use gantry_sched::estimate::gguf::{estimate_llama_cpp, GgufModelFacts, LlamaCppOptions};
use gantry_sched::estimate::hf_config::HfModelConfig;
use gantry_sched::units::{GIB, MIB};
use gantry_sched::{
    ClusterSnapshot, GpuView, PlacementKind, PlacementRequest, ResourceClaim, SnapshotState,
    Strategy, SystemReserve, WorkerView,
};

const WORKERS: i64 = 2_000;
const GPUS_PER_WORKER: u32 = 8;
const INSTANCES: i64 = 10_000;

/// xorshift64*: a fixed-seed generator, so every run places the same sequence.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn cluster() -> ClusterSnapshot {
    let workers = (1..=WORKERS)
        .map(|id| WorkerView {
            id,
            name: format!("worker-{id:04}"),
            ready: true,
            labels: [("zone".to_owned(), format!("z{}", id % 4))].into(),
            backends: ["llama.cpp", "vllm"].map(str::to_owned).into(),
            installed: Default::default(),
            gpus: (0..GPUS_PER_WORKER)
                .map(|index| GpuView {
                    index,
                    total_memory_bytes: 80 * GIB,
                    simulated: true,
                })
                .collect(),
            system_memory_bytes: 1024 * GIB,
            cpu_count: 128,
            reserve: SystemReserve {
                gpu_bytes_per_gpu: 512 * MIB,
                ram_bytes: 16 * GIB,
            },
        })
        .collect();
    ClusterSnapshot {
        workers,
        placed: Vec::new(),
    }
}

/// A llama-style GGUF model of `blocks` blocks of `block_mib`.
fn llama_claim(blocks: u32, block_mib: u64, embd: u32) -> ResourceClaim {
    let facts = GgufModelFacts {
        architecture: "llama".to_owned(),
        block_count: blocks,
        context_length: 8192,
        embedding_length: embd,
        head_count: 32,
        head_count_kv: 8,
        key_length: None,
        value_length: None,
        vocab_size: 128_256,
        layer_weight_bytes: vec![block_mib * MIB; blocks as usize],
        input_weight_bytes: 500 * MIB,
        output_weight_bytes: 500 * MIB,
        ..GgufModelFacts::default()
    };
    estimate_llama_cpp(&facts, &LlamaCppOptions::default())
        .expect("valid synthetic model")
        .claim
}

fn vllm_claim(weight_gib: u64, layers: u32) -> ResourceClaim {
    let config = HfModelConfig {
        num_hidden_layers: layers,
        num_attention_heads: 64,
        num_key_value_heads: 8,
        hidden_size: 8192,
        head_dim: 128,
        torch_dtype: Some("bfloat16".to_owned()),
        max_position_embeddings: Some(8192),
    };
    estimate_engine(
        weight_gib * GIB,
        &config,
        &EngineOptions::defaults(ServingEngine::Vllm),
    )
    .expect("valid synthetic model")
}

/// Needs 4 GPUs at 90% of 80 GiB.
fn tp4_claim() -> ResourceClaim {
    vllm_claim(200, 80)
}

fn requests(strategy: Strategy) -> Vec<PlacementRequest> {
    let small = [
        llama_claim(16, 120, 2048),
        llama_claim(32, 208, 4096),
        llama_claim(40, 420, 5120),
    ];
    let tp2 = vllm_claim(100, 80); // needs 2 GPUs at 90% of 80 GiB
    let tp4 = tp4_claim();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    (0..INSTANCES)
        .map(|id| {
            let roll = rng.below(100);
            let mut request = if roll < 70 {
                let claim = small[rng.below(3) as usize].clone();
                PlacementRequest::new(id, "small", "llama.cpp", claim)
            } else if roll < 90 {
                PlacementRequest::new(id, "tp2", "vllm", tp2.clone())
            } else {
                PlacementRequest::new(id, "tp4", "vllm", tp4.clone())
            };
            request.strategy = strategy;
            request
        })
        .collect()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn main() {
    let snapshot = cluster();
    println!(
        "gantry-sched placement benchmark: {INSTANCES} instances on {WORKERS} workers × {GPUS_PER_WORKER} × 80 GiB"
    );
    for strategy in [Strategy::Spread, Strategy::Binpack] {
        let requests = requests(strategy);
        let built = Instant::now();
        let mut state = SnapshotState::new(&snapshot);
        let build_time = built.elapsed();

        let mut latencies = Vec::with_capacity(requests.len());
        let mut placed = [0usize; 4];
        let mut unschedulable = 0usize;
        let started = Instant::now();
        for request in &requests {
            let before = Instant::now();
            let result = state.place(request);
            latencies.push(before.elapsed());
            match result {
                Ok(placement) => {
                    let slot = match placement.kind {
                        PlacementKind::SingleGpu => 0,
                        PlacementKind::MultiGpu => 1,
                        PlacementKind::PartialOffload => 2,
                        PlacementKind::CpuOnly => 3,
                    };
                    placed[slot] += 1;
                }
                Err(_) => unschedulable += 1,
            }
        }
        let total = started.elapsed();
        latencies.sort_unstable();
        let mean = total / u32::try_from(latencies.len()).expect("10,000 fits u32");
        println!(
            "{strategy:?}: total {total:.2?}, mean {mean:.2?}, p50 {:.2?}, p99 {:.2?}, max {:.2?}; \
             placed {} ({} on 1 GPU, {} multi-GPU), unschedulable {unschedulable}; ledger built in {build_time:.2?}",
            percentile(&latencies, 0.50),
            percentile(&latencies, 0.99),
            latencies.last().copied().unwrap_or_default(),
            placed.iter().sum::<usize>(),
            placed[0],
            placed[1],
        );

        let overflow: Vec<PlacementRequest> = (0..2_000)
            .map(|i| {
                let mut request = PlacementRequest::new(INSTANCES + i, "tp4", "vllm", tp4_claim());
                request.strategy = strategy;
                request
            })
            .collect();
        let (mut ok, mut failed, mut failed_time) = (0usize, 0usize, Duration::ZERO);
        let started = Instant::now();
        for request in &overflow {
            let before = Instant::now();
            let result = state.place(request);
            if result.is_ok() {
                ok += 1;
            } else {
                failed += 1;
                failed_time += before.elapsed();
            }
        }
        let total = started.elapsed();
        println!(
            "{strategy:?} saturation: 2000 more 4-GPU requests in {total:.2?}: {ok} placed, {failed} unschedulable \
             (mean {:.2?} per unschedulable, explanation included)",
            failed_time / u32::try_from(failed.max(1)).expect("fits u32"),
        );
    }
}
