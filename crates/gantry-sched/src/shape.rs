//! Candidate shapes: the ways a claim can be laid out on GPUs, in the order placement tries
//! them, and what each needs from every GPU it uses.
//!
//! A [`Shape`] is independent of any worker: "2 GPUs with 40 GiB free each and 1.2 GiB of
//! RAM", or "2 GPUs with 90% of their memory free, if 90% is at least 19 GiB". Placement then
//! looks for the best worker offering it. Partial offload is not a fixed shape (how many
//! blocks fit depends on the GPU), so it has its own [`PartialOffload`] helper.

use crate::explain::Unschedulable;
use crate::request::PlacementRequest;
use gantry_types::claim::{LayerBreakdown, ModelMemory, ResourceClaim};
use gantry_types::placement::LlamaLayout;

/// What one GPU of a shape needs.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum PerGpu {
    /// Every chosen GPU needs `threshold` bytes allocatable; the i-th chosen GPU (by device
    /// index) records `shares[i]`, which is at most `threshold`.
    Bytes { threshold: u64, shares: Vec<u64> },
    /// Every chosen GPU records and needs `fraction × its total memory`, and qualifies only if
    /// that is at least `minimum`.
    Fraction { fraction: f64, minimum: u64 },
}

impl PerGpu {
    /// Bytes a GPU of `total_bytes` must have allocatable to take part, or `None` when a GPU of
    /// that size can never take part.
    pub(crate) fn need_on(&self, total_bytes: u64) -> Option<u64> {
        match self {
            PerGpu::Bytes { threshold, .. } => Some(*threshold),
            PerGpu::Fraction { fraction, minimum } => {
                let reserved = fraction_of(*fraction, total_bytes);
                (reserved >= *minimum).then_some(reserved)
            }
        }
    }

    /// No GPU can take part with less allocatable than this.
    pub(crate) fn lower_bound(&self) -> u64 {
        match self {
            PerGpu::Bytes { threshold, .. } => *threshold,
            PerGpu::Fraction { minimum, .. } => *minimum,
        }
    }

    /// Bytes recorded on the chosen GPU at `position` (device-index order) whose need is
    /// `need`.
    pub(crate) fn share(&self, position: usize, need: u64) -> u64 {
        match self {
            PerGpu::Bytes { shares, .. } => shares.get(position).copied().unwrap_or(need),
            PerGpu::Fraction { .. } => need,
        }
    }
}

/// `fraction × total`, rounded down.
pub(crate) fn fraction_of(fraction: f64, total: u64) -> u64 {
    // f64 has 53 bits of mantissa: exact to the byte below 8 PiB, far beyond any GPU. The
    // product is never negative, so the truncating cast rounds down like `floor` (which
    // without SSE4.1 is a libm call, measurable when every GPU of a large cluster is
    // visited).
    (fraction * total as f64) as u64
}

/// One way to lay a claim out on one worker.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Shape {
    /// GPUs used; 0 for CPU-only.
    pub gpu_count: usize,
    /// GPUs per replica (`--tensor-parallel-size`); for llama.cpp the number of GPUs the
    /// blocks are split over.
    pub tensor_parallel: u32,
    /// Replicas (`--data-parallel-size`).
    pub data_parallel: u32,
    /// What each GPU needs.
    pub per_gpu: PerGpu,
    /// RAM needed on the worker.
    pub ram_bytes: u64,
    /// For llama.cpp, the layer layout to pass to the backend.
    pub llama: Option<LlamaLayout>,
}

/// The shapes to try for `request`, best first: one GPU, then more GPUs on one worker (when
/// allowed), each needing no more than `max_gpus` (the most GPUs any worker has), except
/// that a size fixed by the user's arguments is always listed so that the failure names it.
pub(crate) fn full_fit_shapes(
    request: &PlacementRequest,
    max_gpus: usize,
) -> Result<Vec<Shape>, Unschedulable> {
    let claim = &request.claim;
    let data_parallel = request.data_parallel_size.unwrap_or(1);
    if data_parallel == 0 {
        return Err(invalid("data_parallel_size must be at least 1"));
    }
    match &claim.memory {
        ModelMemory::Layers(layers) => {
            if data_parallel > 1 {
                return Err(invalid("data parallelism applies to vLLM and SGLang only"));
            }
            Ok(layer_shapes(
                claim,
                layers,
                request.allow_tensor_parallel,
                max_gpus,
            ))
        }
        ModelMemory::Engine(engine) => {
            let tensor_parallel_sizes: Vec<u32> = match engine.fixed_tensor_parallel_size {
                Some(tp) if !engine.accepts_tensor_parallel(tp) => {
                    return Err(Unschedulable::InvalidRequest {
                        reason: format!(
                            "tensor parallel size {tp} must divide the model's {} attention \
                             heads and divide or be a multiple of its {} KV heads",
                            engine.attention_head_count, engine.kv_head_count
                        ),
                    });
                }
                Some(tp) => vec![tp],
                None if request.allow_tensor_parallel => {
                    let most = u32::try_from(max_gpus).unwrap_or(u32::MAX) / data_parallel;
                    let mut sizes: Vec<u32> = (2..=most)
                        .filter(|&tp| engine.accepts_tensor_parallel(tp))
                        .collect();
                    sizes.insert(0, 1);
                    sizes
                }
                None => vec![1],
            };
            let ram_bytes = claim
                .base_ram_bytes
                .saturating_mul(u64::from(data_parallel));
            Ok(tensor_parallel_sizes
                .into_iter()
                .map(|tp| Shape {
                    gpu_count: (tp as usize).saturating_mul(data_parallel as usize),
                    tensor_parallel: tp,
                    data_parallel,
                    per_gpu: PerGpu::Fraction {
                        fraction: engine.memory_fraction.at_tensor_parallel(tp),
                        minimum: engine.minimum_per_gpu(tp, claim.per_gpu_overhead_bytes),
                    },
                    ram_bytes,
                    llama: None,
                })
                .collect())
        }
        ModelMemory::Fixed(fixed) => {
            if data_parallel > 1 {
                return Err(invalid("data parallelism applies to vLLM and SGLang only"));
            }
            let gpu_count = fixed.gpu_count as usize;
            let bytes = claim
                .per_gpu_overhead_bytes
                .saturating_add(fixed.bytes_per_gpu);
            Ok(vec![Shape {
                gpu_count,
                tensor_parallel: fixed.gpu_count.max(1),
                data_parallel: 1,
                per_gpu: PerGpu::Bytes {
                    threshold: bytes,
                    shares: vec![bytes; gpu_count],
                },
                ram_bytes: claim.base_ram_bytes,
                llama: None,
            }])
        }
    }
}

fn invalid(reason: &str) -> Unschedulable {
    Unschedulable::InvalidRequest {
        reason: reason.to_owned(),
    }
}

/// llama.cpp shapes: the last `gpu_blocks` blocks on `k` GPUs, split into contiguous runs
/// as even as possible (earlier GPUs take the odd blocks, the last one takes the output
/// layer), for `k = 1, 2, …`.
fn layer_shapes(
    claim: &ResourceClaim,
    layers: &LayerBreakdown,
    allow_split: bool,
    max_gpus: usize,
) -> Vec<Shape> {
    let block_count = layers.block_bytes.len();
    let (gpu_blocks, output_on_gpu) = match layers.fixed_gpu_layers {
        None => (block_count, true),
        Some(n) => {
            let n = n as usize;
            (n.min(block_count), n > block_count)
        }
    };
    let host_blocks = block_count - gpu_blocks;
    let host_block_bytes: u64 = layers.block_bytes[..host_blocks].iter().sum();
    let full_offload = host_blocks == 0 && output_on_gpu;
    let mut ram_bytes = claim.base_ram_bytes.saturating_add(host_block_bytes);
    if !output_on_gpu {
        ram_bytes = ram_bytes.saturating_add(layers.host_output_bytes());
    }
    if !full_offload {
        ram_bytes = ram_bytes
            .saturating_add(layers.host_compute_bytes)
            .saturating_add(layers.host_repack_bytes);
    }
    if gpu_blocks == 0 {
        return vec![Shape {
            gpu_count: 0,
            tensor_parallel: 1,
            data_parallel: 1,
            per_gpu: PerGpu::Bytes {
                threshold: 0,
                shares: Vec::new(),
            },
            ram_bytes,
            llama: Some(LlamaLayout {
                n_gpu_layers: 0,
                tensor_split: Vec::new(),
            }),
        }];
    }
    let gpu_side = &layers.block_bytes[host_blocks..];
    let most = if allow_split {
        max_gpus.min(gpu_blocks).max(1)
    } else {
        1
    };
    (1..=most)
        .map(|k| {
            let mut shares = Vec::with_capacity(k);
            let mut tensor_split = Vec::with_capacity(k);
            let mut start = 0;
            for position in 0..k {
                let run = gpu_blocks / k + usize::from(position < gpu_blocks % k);
                let mut bytes: u64 = gpu_side[start..start + run].iter().sum();
                let mut layers_here = run;
                if position == k - 1 && output_on_gpu {
                    bytes = bytes.saturating_add(layers.output_bytes);
                    layers_here += 1;
                }
                shares.push(claim.per_gpu_overhead_bytes.saturating_add(bytes));
                tensor_split.push(u32::try_from(layers_here).unwrap_or(u32::MAX));
                start += run;
            }
            debug_assert_eq!(start, gpu_blocks, "runs cover every GPU block once");
            let threshold = shares.iter().copied().max().unwrap_or(0);
            Shape {
                gpu_count: k,
                tensor_parallel: u32::try_from(k).unwrap_or(u32::MAX),
                data_parallel: 1,
                per_gpu: PerGpu::Bytes { threshold, shares },
                ram_bytes,
                llama: Some(LlamaLayout {
                    n_gpu_layers: tensor_split.iter().sum(),
                    tensor_split,
                }),
            }
        })
        .collect()
}

/// Partial offload of a llama.cpp model onto one GPU: the last `b` blocks on the GPU, the
/// rest of the blocks, the output layer and a host compute buffer in RAM.
#[derive(Debug, Clone)]
pub(crate) struct PartialOffload {
    overhead: u64,
    /// `suffix[b]` = bytes of the last `b` blocks; `suffix[0] = 0`.
    suffix: Vec<u64>,
    /// RAM with every block on the host.
    ram_all_blocks_on_host: u64,
}

impl PartialOffload {
    /// The plan for `request`, if it allows partial offload and its claim is layered with no
    /// user-fixed `--n-gpu-layers`.
    pub(crate) fn for_request(request: &PlacementRequest) -> Option<Self> {
        let ModelMemory::Layers(layers) = &request.claim.memory else {
            return None;
        };
        if !request.allow_cpu_offload || layers.fixed_gpu_layers.is_some() {
            return None;
        }
        let mut suffix = Vec::with_capacity(layers.block_bytes.len() + 1);
        suffix.push(0u64);
        let mut running = 0u64;
        for bytes in layers.block_bytes.iter().rev() {
            running = running.saturating_add(*bytes);
            suffix.push(running);
        }
        Some(PartialOffload {
            overhead: request.claim.per_gpu_overhead_bytes,
            suffix,
            ram_all_blocks_on_host: request
                .claim
                .base_ram_bytes
                .saturating_add(layers.total_block_bytes())
                .saturating_add(layers.host_output_bytes())
                .saturating_add(layers.host_compute_bytes)
                .saturating_add(layers.host_repack_bytes),
        })
    }

    /// GPU bytes with the last `blocks` blocks on the GPU.
    pub(crate) fn gpu_bytes(&self, blocks: usize) -> u64 {
        self.overhead.saturating_add(self.suffix[blocks])
    }

    /// RAM with the last `blocks` blocks on the GPU.
    pub(crate) fn ram_bytes(&self, blocks: usize) -> u64 {
        self.ram_all_blocks_on_host - self.suffix[blocks]
    }

    /// RAM with everything on the host (CPU-only).
    pub(crate) fn cpu_only_ram_bytes(&self) -> u64 {
        self.ram_all_blocks_on_host
    }

    /// The most blocks (at least 1) a GPU with `allocatable` bytes can hold, or `None` when not
    /// even one fits.
    pub(crate) fn max_blocks(&self, allocatable: u64) -> Option<usize> {
        // suffix is non-decreasing, so the blocks that fit form a prefix of 0..=block_count.
        let fitting = self
            .suffix
            .partition_point(|&bytes| self.overhead.saturating_add(bytes) <= allocatable);
        (fitting >= 2).then(|| fitting - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::units::GIB;
    use gantry_types::claim::{EngineMemory, FixedMemory, LayerBreakdown, MemoryFraction};

    fn layered(blocks: Vec<u64>, output: u64, fixed: Option<u32>) -> PlacementRequest {
        let claim = ResourceClaim {
            per_gpu_overhead_bytes: 100,
            base_ram_bytes: 1000,
            memory: ModelMemory::Layers(LayerBreakdown {
                block_kv_bytes: blocks.iter().map(|bytes| bytes / 2).collect(),
                block_bytes: blocks,
                output_bytes: output,
                host_compute_bytes: 50,
                per_gpu_compute_bytes: 50,
                host_embedding_bytes: 300,
                host_logits_bytes: 20,
                host_repack_bytes: 0,
                tied_output_bytes: 0,
                fixed_gpu_layers: fixed,
            }),
        };
        PlacementRequest::new(1, "m", "llama.cpp", claim)
    }

    fn bytes_of(shape: &Shape) -> (u64, Vec<u64>) {
        match &shape.per_gpu {
            PerGpu::Bytes { threshold, shares } => (*threshold, shares.clone()),
            other => panic!("expected bytes, got {other:?}"),
        }
    }

    #[test]
    fn layer_shapes_split_blocks_evenly_with_output_on_the_last_gpu() {
        // 5 blocks of 10 bytes, output 7, overhead 100.
        let request = layered(vec![10; 5], 7, None);
        let shapes = full_fit_shapes(&request, 3).expect("valid");
        assert_eq!(shapes.len(), 3);
        // k = 1: 100 + 50 + 7 = 157; full offload, so RAM is just the base.
        assert_eq!(bytes_of(&shapes[0]), (157, vec![157]));
        assert_eq!(shapes[0].ram_bytes, 1000);
        let layout = shapes[0].llama.clone().expect("llama layout");
        assert_eq!(layout.n_gpu_layers, 6, "5 blocks and the output layer");
        // k = 2: runs of 3 and 2 blocks; the output goes with the last run.
        // GPU 0: 100 + 30 = 130, GPU 1: 100 + 20 + 7 = 127.
        assert_eq!(bytes_of(&shapes[1]), (130, vec![130, 127]));
        assert_eq!(
            shapes[1].llama.clone().expect("layout").tensor_split,
            vec![3, 3]
        );
        // k = 3: runs 2, 2, 1 → 120, 120, 100 + 10 + 7 = 117.
        assert_eq!(bytes_of(&shapes[2]), (120, vec![120, 120, 117]));
    }

    #[test]
    fn fixed_gpu_layers_keep_the_first_blocks_and_output_on_the_host() {
        // -ngl 3 of 5 blocks: blocks 0 and 1 (11 + 12) on the host with the output (7) and the
        // host compute buffer (50): RAM 1000 + 23 + 7 + 50 = 1080.
        let request = layered(vec![11, 12, 13, 14, 15], 7, Some(3));
        let shapes = full_fit_shapes(&request, 1).expect("valid");
        assert_eq!(shapes.len(), 1);
        assert_eq!(bytes_of(&shapes[0]), (142, vec![142]));
        assert_eq!(shapes[0].ram_bytes, 1080);
        assert_eq!(shapes[0].llama.clone().expect("layout").n_gpu_layers, 3);
        // -ngl 5 = all blocks but not the output: output and host compute stay in RAM.
        let shapes = full_fit_shapes(&layered(vec![10; 5], 7, Some(5)), 1).expect("valid");
        assert_eq!(shapes[0].ram_bytes, 1000 + 7 + 50);
        // -ngl 0: CPU only.
        let shapes = full_fit_shapes(&layered(vec![10; 5], 7, Some(0)), 4).expect("valid");
        assert_eq!(shapes.len(), 1);
        assert_eq!(shapes[0].gpu_count, 0);
        assert_eq!(shapes[0].ram_bytes, 1000 + 50 + 7 + 50);
    }

    #[test]
    fn a_tied_output_and_repacked_copies_count_only_where_llama_cpp_makes_them() {
        // The output (7) is a tied copy of the embedding on the GPU; repacked copies (30)
        // exist only when something runs on the CPU.
        let tied = |fixed| {
            let mut request = layered(vec![10; 5], 7, fixed);
            if let ModelMemory::Layers(layers) = &mut request.claim.memory {
                layers.tied_output_bytes = 7;
                layers.host_repack_bytes = 30;
            }
            request
        };
        // Full offload: the copy is on the GPU (100 + 50 + 7), RAM is the base alone.
        let shapes = full_fit_shapes(&tied(None), 1).expect("valid");
        assert_eq!(bytes_of(&shapes[0]), (157, vec![157]));
        assert_eq!(shapes[0].ram_bytes, 1000);
        // CPU only: blocks, host compute and the repacked copies, no second embedding.
        let shapes = full_fit_shapes(&tied(Some(0)), 1).expect("valid");
        assert_eq!(shapes[0].ram_bytes, 1000 + 50 + 50 + 30);
    }

    #[test]
    fn no_split_when_tensor_parallel_is_not_allowed() {
        let mut request = layered(vec![10; 5], 7, None);
        request.allow_tensor_parallel = false;
        assert_eq!(full_fit_shapes(&request, 8).expect("valid").len(), 1);
    }

    #[test]
    fn engine_shapes_list_valid_tensor_parallel_sizes_times_data_parallel() {
        let claim = ResourceClaim {
            per_gpu_overhead_bytes: GIB,
            base_ram_bytes: 4 * GIB,
            memory: ModelMemory::Engine(EngineMemory {
                weight_bytes: 12 * GIB,
                kv_bytes_per_token_per_kv_head: 0,
                kv_head_count: 4,
                attention_head_count: 12,
                minimum_kv_tokens: 0,
                memory_fraction: MemoryFraction::Fixed(0.9),
                fixed_tensor_parallel_size: None,
            }),
        };
        let mut request = PlacementRequest::new(1, "m", "vllm", claim);
        let shapes = full_fit_shapes(&request, 8).expect("valid");
        let sizes: Vec<u32> = shapes.iter().map(|s| s.tensor_parallel).collect();
        // 12 heads and 4 KV heads: 1, 2 and 4 qualify; 3 and 6 split 4 KV heads unevenly.
        assert_eq!(sizes, vec![1, 2, 4]);
        assert_eq!(
            shapes[1].per_gpu,
            PerGpu::Fraction {
                fraction: 0.9,
                minimum: 7 * GIB
            }
        );
        request.data_parallel_size = Some(2);
        let shapes = full_fit_shapes(&request, 8).expect("valid");
        let counts: Vec<usize> = shapes.iter().map(|s| s.gpu_count).collect();
        assert_eq!(counts, vec![2, 4, 8]);
        assert_eq!(shapes[0].ram_bytes, 8 * GIB, "one process per replica");
    }

    #[test]
    fn fraction_qualifies_only_gpus_large_enough() {
        let per_gpu = PerGpu::Fraction {
            fraction: 0.9,
            minimum: 20 * GIB,
        };
        assert_eq!(per_gpu.need_on(80 * GIB), Some(72 * GIB));
        assert_eq!(per_gpu.need_on(20 * GIB), None, "0.9 × 20 GiB < 20 GiB");
    }

    #[test]
    fn data_parallel_is_rejected_for_llama_cpp_and_fixed_claims() {
        let mut request = layered(vec![10; 2], 1, None);
        request.data_parallel_size = Some(2);
        assert!(matches!(
            full_fit_shapes(&request, 8),
            Err(Unschedulable::InvalidRequest { .. })
        ));
        request.claim.memory = ModelMemory::Fixed(FixedMemory {
            gpu_count: 1,
            bytes_per_gpu: 1,
        });
        assert!(full_fit_shapes(&request, 8).is_err());
        request.data_parallel_size = Some(0);
        assert!(full_fit_shapes(&request, 8).is_err());
    }

    #[test]
    fn partial_offload_finds_the_most_blocks_that_fit() {
        let mut request = layered(vec![11, 12, 13, 14, 15], 7, None);
        assert!(
            PartialOffload::for_request(&request).is_none(),
            "not allowed"
        );
        request.allow_cpu_offload = true;
        let plan = PartialOffload::for_request(&request).expect("allowed");
        // Last blocks first: 15, then 15 + 14 = 29, 42, 54, 65; overhead 100.
        assert_eq!(plan.max_blocks(114), None);
        assert_eq!(plan.max_blocks(115), Some(1));
        assert_eq!(plan.max_blocks(142), Some(3));
        assert_eq!(plan.max_blocks(10_000), Some(5));
        // All on host: 1000 + 65 + 7 + 50 = 1122; with 3 on the GPU: 1122 − 42 = 1080.
        assert_eq!(plan.cpu_only_ram_bytes(), 1122);
        assert_eq!(plan.ram_bytes(3), 1080);
        assert_eq!(plan.gpu_bytes(3), 142);
    }
}
