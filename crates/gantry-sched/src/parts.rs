//! What the bytes of a placement are for: [`reservation_parts`] splits the bytes a
//! [`Placement`] reserves on each GPU and in RAM into weights, KV cache, compute buffers and
//! fixed overhead; [`claim_parts`] does the same for a claim before it is placed.
//!
//! The split follows the same rules as placement (the private `shape` module), read back
//! from the placement's layout:
//!
//! * llama.cpp: the last `min(n_gpu_layers, blocks)` blocks are on the GPUs in runs of
//!   `tensor_split` (the output layer counted on the last GPU when `n_gpu_layers > blocks`),
//!   the first blocks on the host; every GPU pays the compute buffer and the CUDA context;
//!   the host pays the embedding, the logits buffer and the process, plus its blocks, the
//!   output layer unless it is on a GPU, and the host compute buffer unless every layer is
//!   on a GPU;
//! * vLLM / SGLang: every GPU holds its shard of the weights and of the KV heads for the
//!   minimum tokens, plus the engine's overhead; the rest of its reserved fraction becomes
//!   more KV cache; RAM is one process per data-parallel replica;
//! * a custom backend: what it declares.
//!
//! *Invariant:* the parts of each GPU and of RAM add up exactly to the placement's bytes.
//! A placement whose bytes do not follow from its claim is refused with
//! [`PartsError::Mismatch`] rather than explained wrongly.

use gantry_types::claim::{EngineMemory, FixedMemory, LayerBreakdown, ModelMemory, ResourceClaim};
use gantry_types::parts::{ClaimParts, GpuParts, LayerRange, RamParts, ReservationParts};
use gantry_types::placement::Placement;
use thiserror::Error;

/// Why a reservation cannot be split into parts.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PartsError {
    /// The claim was estimated before claims recorded their parts (the KV cache's share of
    /// each block, the compute buffer): it places the same, but cannot say which bytes are
    /// which.
    #[error("the claim was estimated before claims recorded their parts")]
    NotRecorded,
    /// The placement's bytes do not follow from the claim (a placement made by other rules,
    /// or a claim and a placement that do not belong together).
    #[error("the placement does not follow from the claim: {0}")]
    Mismatch(String),
}

/// The parts of `placement`'s bytes, which the scheduler made from `claim`. See the module
/// documentation.
pub fn reservation_parts(
    claim: &ResourceClaim,
    placement: &Placement,
) -> Result<ReservationParts, PartsError> {
    let parts = match &claim.memory {
        ModelMemory::Layers(layers) => layered(claim, layers, placement)?,
        ModelMemory::Engine(engine) => engine_parts(claim, engine, placement)?,
        ModelMemory::Fixed(fixed) => fixed_parts(claim, fixed, placement)?,
    };
    debug_assert!(
        parts
            .gpus
            .iter()
            .all(|gpu| gpu_sum(gpu) == Some(gpu.total_bytes))
            && ram_sum(&parts.ram) == Some(parts.ram.total_bytes),
        "parts add up: {parts:?}"
    );
    Ok(parts)
}

/// The parts of `claim` as a whole, before placement.
pub fn claim_parts(claim: &ResourceClaim) -> Result<ClaimParts, PartsError> {
    let overhead = claim.per_gpu_overhead_bytes;
    let base_ram_bytes = claim.base_ram_bytes;
    Ok(match &claim.memory {
        ModelMemory::Layers(layers) => {
            if !layers.has_parts() {
                return Err(PartsError::NotRecorded);
            }
            let (block_weights, kv) = block_parts(layers, 0, layers.block_bytes.len());
            ClaimParts {
                weights_bytes: block_weights
                    .saturating_add(layers.output_bytes)
                    .saturating_add(layers.host_embedding_bytes),
                kv_cache_bytes: kv,
                per_gpu_compute_buffer_bytes: layers.per_gpu_compute_bytes,
                per_gpu_overhead_bytes: overhead.saturating_sub(layers.per_gpu_compute_bytes),
                host_compute_buffer_bytes: layers.host_compute_bytes,
                base_ram_bytes,
                declared_gpu_count: None,
                declared_bytes_per_gpu: None,
                reserved_fraction: None,
                single_gpu_bytes: claim.single_gpu_bytes(),
            }
        }
        ModelMemory::Engine(engine) => ClaimParts {
            weights_bytes: engine.weight_bytes,
            kv_cache_bytes: engine.per_gpu_shares(1).1,
            per_gpu_compute_buffer_bytes: 0,
            per_gpu_overhead_bytes: overhead,
            host_compute_buffer_bytes: 0,
            base_ram_bytes,
            declared_gpu_count: None,
            declared_bytes_per_gpu: None,
            reserved_fraction: Some(engine.memory_fraction.at_tensor_parallel(1)),
            single_gpu_bytes: None,
        },
        ModelMemory::Fixed(fixed) => ClaimParts {
            weights_bytes: 0,
            kv_cache_bytes: 0,
            per_gpu_compute_buffer_bytes: 0,
            per_gpu_overhead_bytes: overhead,
            host_compute_buffer_bytes: 0,
            base_ram_bytes,
            declared_gpu_count: Some(fixed.gpu_count),
            declared_bytes_per_gpu: Some(fixed.bytes_per_gpu),
            reserved_fraction: None,
            single_gpu_bytes: claim.single_gpu_bytes(),
        },
    })
}

/// Weights and KV cache of blocks `start..end`.
fn block_parts(layers: &LayerBreakdown, start: usize, end: usize) -> (u64, u64) {
    layers.block_bytes[start..end]
        .iter()
        .zip(&layers.block_kv_bytes[start..end])
        .fold((0u64, 0u64), |(weights, kv), (&block, &block_kv)| {
            (
                weights.saturating_add(block.saturating_sub(block_kv)),
                kv.saturating_add(block_kv),
            )
        })
}

fn mismatch<T>(reason: String) -> Result<T, PartsError> {
    Err(PartsError::Mismatch(reason))
}

/// Refuses a GPU whose parts do not add up to what the placement reserves on it.
fn check_gpu(parts: GpuParts) -> Result<GpuParts, PartsError> {
    match gpu_sum(&parts) {
        Some(sum) if sum == parts.total_bytes => Ok(parts),
        sum => mismatch(format!(
            "GPU {}: the parts add up to {} bytes, the placement reserves {}",
            parts.index,
            sum.map_or_else(|| "more than 2^64".to_owned(), |s| s.to_string()),
            parts.total_bytes
        )),
    }
}

/// Refuses RAM whose parts do not add up to what the placement reserves.
fn check_ram(parts: RamParts) -> Result<RamParts, PartsError> {
    match ram_sum(&parts) {
        Some(sum) if sum == parts.total_bytes => Ok(parts),
        sum => mismatch(format!(
            "RAM: the parts add up to {} bytes, the placement reserves {}",
            sum.map_or_else(|| "more than 2^64".to_owned(), |s| s.to_string()),
            parts.total_bytes
        )),
    }
}

/// The sum of a GPU's parts; `None` on overflow.
fn gpu_sum(parts: &GpuParts) -> Option<u64> {
    [
        parts.weights_bytes,
        parts.kv_cache_bytes,
        parts.extra_kv_cache_bytes,
        parts.compute_buffer_bytes,
        parts.overhead_bytes,
        parts.declared_bytes,
    ]
    .into_iter()
    .try_fold(0u64, u64::checked_add)
}

/// The sum of RAM's parts; `None` on overflow.
fn ram_sum(parts: &RamParts) -> Option<u64> {
    [
        parts.weights_bytes,
        parts.embedding_bytes,
        parts.kv_cache_bytes,
        parts.compute_buffer_bytes,
        parts.logits_bytes,
        parts.process_bytes,
    ]
    .into_iter()
    .try_fold(0u64, u64::checked_add)
}

fn layered(
    claim: &ResourceClaim,
    layers: &LayerBreakdown,
    placement: &Placement,
) -> Result<ReservationParts, PartsError> {
    if !layers.has_parts() {
        return Err(PartsError::NotRecorded);
    }
    let Some(layout) = &placement.llama else {
        return mismatch("a llama.cpp placement without a layer layout".to_owned());
    };
    if layout.tensor_split.len() != placement.gpus.len() {
        return mismatch(format!(
            "{} GPUs but a tensor split over {}",
            placement.gpus.len(),
            layout.tensor_split.len()
        ));
    }
    let block_count = layers.block_bytes.len();
    let n_gpu_layers = layout.n_gpu_layers as usize;
    let split_layers: usize = layout.tensor_split.iter().map(|&l| l as usize).sum();
    if n_gpu_layers > block_count + 1 || split_layers != n_gpu_layers {
        return mismatch(format!(
            "{n_gpu_layers} GPU layers split as {:?} for a model of {block_count} blocks",
            layout.tensor_split
        ));
    }
    let gpu_blocks = n_gpu_layers.min(block_count);
    let output_on_gpu = n_gpu_layers > block_count;
    let host_blocks = block_count - gpu_blocks;
    let compute = layers.per_gpu_compute_bytes;
    let Some(cuda_context) = claim.per_gpu_overhead_bytes.checked_sub(compute) else {
        return mismatch("the compute buffer exceeds the per-GPU overhead".to_owned());
    };

    let last = placement.gpus.len().checked_sub(1);
    let mut next_block = host_blocks;
    let mut gpus = Vec::with_capacity(placement.gpus.len());
    for (position, (share, &layers_here)) in
        placement.gpus.iter().zip(&layout.tensor_split).enumerate()
    {
        let output_here = output_on_gpu && Some(position) == last;
        let Some(run) = (layers_here as usize).checked_sub(usize::from(output_here)) else {
            return mismatch(format!(
                "GPU {} holds the output layer and no room for it",
                share.index
            ));
        };
        let end = next_block + run;
        if end > block_count {
            return mismatch(format!("GPU {} runs past the last block", share.index));
        }
        let (weights, kv) = block_parts(layers, next_block, end);
        let output = if output_here { layers.output_bytes } else { 0 };
        gpus.push(check_gpu(GpuParts {
            index: share.index,
            total_bytes: share.bytes,
            weights_bytes: weights.saturating_add(output),
            kv_cache_bytes: kv,
            extra_kv_cache_bytes: 0,
            compute_buffer_bytes: compute,
            overhead_bytes: cuda_context,
            declared_bytes: 0,
            reserved_fraction: None,
            layers: Some(LayerRange {
                first_block: u32::try_from(next_block).unwrap_or(u32::MAX),
                blocks: u32::try_from(run).unwrap_or(u32::MAX),
                output_layer: output_here,
            }),
        })?);
        next_block = end;
    }
    debug_assert_eq!(next_block, block_count, "the split sums to the GPU layers");

    let full_offload = host_blocks == 0 && output_on_gpu;
    let (host_weights, host_kv) = block_parts(layers, 0, host_blocks);
    let host_output = if output_on_gpu {
        0
    } else {
        layers.host_output_bytes()
    };
    let Some(process) = claim
        .base_ram_bytes
        .checked_sub(layers.host_embedding_bytes)
        .and_then(|rest| rest.checked_sub(layers.host_logits_bytes))
    else {
        return mismatch("the embedding and logits exceed the base RAM".to_owned());
    };
    let ram = check_ram(RamParts {
        total_bytes: placement.ram_bytes,
        weights_bytes: host_weights
            .saturating_add(host_output)
            .saturating_add(if full_offload {
                0
            } else {
                layers.host_repack_bytes
            }),
        embedding_bytes: layers.host_embedding_bytes,
        kv_cache_bytes: host_kv,
        compute_buffer_bytes: if full_offload {
            0
        } else {
            layers.host_compute_bytes
        },
        logits_bytes: layers.host_logits_bytes,
        process_bytes: process,
        layers: (!full_offload).then(|| LayerRange {
            first_block: 0,
            blocks: u32::try_from(host_blocks).unwrap_or(u32::MAX),
            output_layer: !output_on_gpu,
        }),
    })?;
    Ok(ReservationParts { gpus, ram })
}

fn engine_parts(
    claim: &ResourceClaim,
    engine: &EngineMemory,
    placement: &Placement,
) -> Result<ReservationParts, PartsError> {
    let tp = placement.tensor_parallel_size.max(1);
    let dp = placement.data_parallel_size.max(1);
    if placement.gpus.len() as u64 != u64::from(tp) * u64::from(dp) {
        return mismatch(format!(
            "{} GPUs for {dp} replica(s) of tensor parallel size {tp}",
            placement.gpus.len()
        ));
    }
    let (weights, kv) = engine.per_gpu_shares(tp);
    let overhead = claim.per_gpu_overhead_bytes;
    let minimum = engine.minimum_per_gpu(tp, overhead);
    let fraction = engine.memory_fraction.at_tensor_parallel(tp);
    let gpus = placement
        .gpus
        .iter()
        .map(|share| {
            let Some(extra) = share.bytes.checked_sub(minimum) else {
                return mismatch(format!(
                    "GPU {} reserves {} bytes, less than the engine's minimum of {minimum}",
                    share.index, share.bytes
                ));
            };
            check_gpu(GpuParts {
                index: share.index,
                total_bytes: share.bytes,
                weights_bytes: weights,
                kv_cache_bytes: kv,
                extra_kv_cache_bytes: extra,
                compute_buffer_bytes: 0,
                overhead_bytes: overhead,
                declared_bytes: 0,
                reserved_fraction: Some(fraction),
                layers: None,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let ram = check_ram(RamParts {
        total_bytes: placement.ram_bytes,
        weights_bytes: 0,
        embedding_bytes: 0,
        kv_cache_bytes: 0,
        compute_buffer_bytes: 0,
        logits_bytes: 0,
        process_bytes: claim.base_ram_bytes.saturating_mul(u64::from(dp)),
        layers: None,
    })?;
    Ok(ReservationParts { gpus, ram })
}

fn fixed_parts(
    claim: &ResourceClaim,
    fixed: &FixedMemory,
    placement: &Placement,
) -> Result<ReservationParts, PartsError> {
    if placement.gpus.len() != fixed.gpu_count as usize {
        return mismatch(format!(
            "{} GPUs where the backend declares {}",
            placement.gpus.len(),
            fixed.gpu_count
        ));
    }
    let gpus = placement
        .gpus
        .iter()
        .map(|share| {
            check_gpu(GpuParts {
                index: share.index,
                total_bytes: share.bytes,
                weights_bytes: 0,
                kv_cache_bytes: 0,
                extra_kv_cache_bytes: 0,
                compute_buffer_bytes: 0,
                overhead_bytes: claim.per_gpu_overhead_bytes,
                declared_bytes: fixed.bytes_per_gpu,
                reserved_fraction: None,
                layers: None,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let ram = check_ram(RamParts {
        total_bytes: placement.ram_bytes,
        weights_bytes: 0,
        embedding_bytes: 0,
        kv_cache_bytes: 0,
        compute_buffer_bytes: 0,
        logits_bytes: 0,
        process_bytes: claim.base_ram_bytes,
        layers: None,
    })?;
    Ok(ReservationParts { gpus, ram })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::worker;
    use crate::units::{GIB, MIB};
    use crate::{place, ClusterSnapshot, PlacementRequest};
    use gantry_types::claim::MemoryFraction;
    use gantry_types::placement::{GpuShare, LlamaLayout, PlacementKind};

    /// Compute buffer of each device (a Llama-3-8B at 8192 tokens, ubatch 512).
    const COMPUTE: u64 = 562_036_736;
    const CUDA_CONTEXT: u64 = 512 * MIB;
    /// Logits of one slot: 4 × 128256.
    const LOGITS: u64 = 513_024;

    /// Shaped like Llama-3-8B's estimate, written out so that these tests check the split
    /// and not the estimate's formulas: 32 blocks of 208 MiB of weights and 32 MiB of KV
    /// cache each, embedding and output 501 MiB each, 256 MiB for the process.
    fn llama3_8b() -> ResourceClaim {
        ResourceClaim {
            per_gpu_overhead_bytes: CUDA_CONTEXT + COMPUTE,
            base_ram_bytes: 256 * MIB + 501 * MIB + LOGITS,
            memory: ModelMemory::Layers(LayerBreakdown {
                block_bytes: vec![(208 + 32) * MIB; 32],
                block_kv_bytes: vec![32 * MIB; 32],
                output_bytes: 501 * MIB,
                host_compute_bytes: COMPUTE,
                per_gpu_compute_bytes: COMPUTE,
                host_embedding_bytes: 501 * MIB,
                host_logits_bytes: LOGITS,
                host_repack_bytes: 0,
                tied_output_bytes: 0,
                fixed_gpu_layers: None,
            }),
        }
    }

    fn request(claim: ResourceClaim) -> PlacementRequest {
        let mut request = PlacementRequest::new(1, "m", "llama.cpp", claim);
        request.allow_cpu_offload = true;
        request
    }

    fn snapshot(gpus: u32, gpu_bytes: u64) -> ClusterSnapshot {
        ClusterSnapshot {
            workers: vec![worker(1, "w1").gpus(gpus, gpu_bytes).build()],
            placed: Vec::new(),
        }
    }

    #[test]
    fn whole_model_on_one_gpu_splits_into_weights_kv_compute_and_context() {
        let claim = llama3_8b();
        let placement = place(&snapshot(1, 80 * GIB), &request(claim.clone())).expect("fits");
        assert_eq!(placement.kind, PlacementKind::SingleGpu);
        let parts = reservation_parts(&claim, &placement).expect("parts");
        let gpu = &parts.gpus[0];
        // 32 blocks × 208 MiB + the 501 MiB output layer.
        assert_eq!(gpu.weights_bytes, (32 * 208 + 501) * MIB);
        // 32 blocks × 32 MiB of KV cache for 8192 tokens.
        assert_eq!(gpu.kv_cache_bytes, GIB);
        assert_eq!(gpu.compute_buffer_bytes, COMPUTE);
        assert_eq!(gpu.overhead_bytes, CUDA_CONTEXT);
        assert_eq!(gpu.total_bytes, 9_677_307_904);
        assert_eq!(
            gpu.layers,
            Some(LayerRange {
                first_block: 0,
                blocks: 32,
                output_layer: true
            })
        );
        // RAM: the embedding, one slot's logits and the process; nothing runs on the host.
        let ram = &parts.ram;
        assert_eq!(ram.embedding_bytes, 501 * MIB);
        assert_eq!(ram.logits_bytes, LOGITS);
        assert_eq!(ram.process_bytes, 256 * MIB);
        assert_eq!(
            (
                ram.weights_bytes,
                ram.kv_cache_bytes,
                ram.compute_buffer_bytes
            ),
            (0, 0, 0)
        );
        assert_eq!(ram.total_bytes, 757 * MIB + LOGITS);
        assert_eq!(ram.layers, None);
    }

    #[test]
    fn a_split_over_two_gpus_puts_the_output_layer_on_the_last() {
        let claim = llama3_8b();
        // 9.0 GiB does not fit an 8 GiB GPU: two GPUs of 16 blocks each.
        let placement = place(&snapshot(2, 8 * GIB), &request(claim.clone())).expect("fits");
        assert_eq!(placement.kind, PlacementKind::MultiGpu);
        let parts = reservation_parts(&claim, &placement).expect("parts");
        let [first, second] = parts.gpus.as_slice() else {
            panic!("two GPUs: {parts:?}");
        };
        assert_eq!(first.weights_bytes, 16 * 208 * MIB);
        assert_eq!(second.weights_bytes, (16 * 208 + 501) * MIB);
        for gpu in [first, second] {
            assert_eq!(gpu.kv_cache_bytes, 16 * 32 * MIB);
            assert_eq!(
                gpu.compute_buffer_bytes, COMPUTE,
                "every GPU pays the buffer"
            );
            assert_eq!(gpu.overhead_bytes, CUDA_CONTEXT);
        }
        // 1_098_907_648 overhead + 16 × 240 MiB, and the output layer on the second.
        assert_eq!(first.total_bytes, 5_125_439_488);
        assert_eq!(second.total_bytes, 5_125_439_488 + 501 * MIB);
        assert_eq!(
            first.layers.map(|l| (l.first_block, l.blocks)),
            Some((0, 16))
        );
        assert_eq!(
            second.layers,
            Some(LayerRange {
                first_block: 16,
                blocks: 16,
                output_layer: true
            })
        );
    }

    #[test]
    fn partial_offload_keeps_the_first_blocks_output_and_host_buffer_in_ram() {
        let claim = llama3_8b();
        // A 5 GiB GPU holds 1_098_907_648 of overhead and 16 blocks of 240 MiB; 17 would
        // need 5_377_097_728 bytes, just over 5 GiB.
        let placement = place(&snapshot(1, 5 * GIB), &request(claim.clone())).expect("fits");
        assert_eq!(placement.kind, PlacementKind::PartialOffload);
        let parts = reservation_parts(&claim, &placement).expect("parts");
        let gpu = &parts.gpus[0];
        assert_eq!(
            gpu.layers,
            Some(LayerRange {
                first_block: 16,
                blocks: 16,
                output_layer: false
            })
        );
        assert_eq!(gpu.weights_bytes, 16 * 208 * MIB);
        assert_eq!(gpu.kv_cache_bytes, 16 * 32 * MIB);
        let ram = &parts.ram;
        assert_eq!(
            ram.layers,
            Some(LayerRange {
                first_block: 0,
                blocks: 16,
                output_layer: true
            })
        );
        assert_eq!(ram.weights_bytes, (16 * 208 + 501) * MIB);
        assert_eq!(ram.kv_cache_bytes, 16 * 32 * MIB);
        assert_eq!(ram.compute_buffer_bytes, COMPUTE);
        assert_eq!(ram.total_bytes, placement.ram_bytes);
        assert_eq!(
            ram.total_bytes,
            757 * MIB + LOGITS + 16 * 240 * MIB + 501 * MIB + COMPUTE
        );
    }

    #[test]
    fn cpu_only_puts_everything_in_ram() {
        let claim = llama3_8b();
        let placement = place(&snapshot(0, 0), &request(claim.clone())).expect("fits");
        assert_eq!(placement.kind, PlacementKind::CpuOnly);
        let parts = reservation_parts(&claim, &placement).expect("parts");
        assert!(parts.gpus.is_empty());
        let ram = &parts.ram;
        assert_eq!(ram.weights_bytes, (32 * 208 + 501) * MIB);
        assert_eq!(ram.kv_cache_bytes, GIB);
        assert_eq!(ram.compute_buffer_bytes, COMPUTE);
        assert_eq!(
            ram.layers,
            Some(LayerRange {
                first_block: 0,
                blocks: 32,
                output_layer: true
            })
        );
    }

    #[test]
    fn engine_gpus_hold_their_shards_and_fill_the_fraction_with_kv_cache() {
        let claim = ResourceClaim {
            per_gpu_overhead_bytes: 2 * GIB,
            base_ram_bytes: 4 * GIB,
            memory: ModelMemory::Engine(EngineMemory {
                weight_bytes: 16 * GIB,
                // 2 × 32 layers × 128 × 2 bytes: 128 MiB per KV head for 8192 tokens.
                kv_bytes_per_token_per_kv_head: 2 * 32 * 128 * 2,
                kv_head_count: 8,
                attention_head_count: 32,
                minimum_kv_tokens: 8192,
                memory_fraction: MemoryFraction::Fixed(0.5),
                fixed_tensor_parallel_size: Some(2),
            }),
        };
        let mut request = PlacementRequest::new(1, "m", "vllm", claim.clone());
        request.data_parallel_size = Some(2);
        let placement = place(&snapshot(4, 80 * GIB), &request).expect("fits");
        let parts = reservation_parts(&claim, &placement).expect("parts");
        assert_eq!(parts.gpus.len(), 4);
        for gpu in &parts.gpus {
            // Half of 80 GiB; tp 2: 8 GiB of weights and 4 KV heads × 128 MiB.
            assert_eq!(gpu.total_bytes, 40 * GIB);
            assert_eq!(gpu.weights_bytes, 8 * GIB);
            assert_eq!(gpu.kv_cache_bytes, GIB / 2);
            assert_eq!(gpu.overhead_bytes, 2 * GIB);
            assert_eq!(
                gpu.extra_kv_cache_bytes,
                40 * GIB - 8 * GIB - GIB / 2 - 2 * GIB
            );
            assert_eq!(gpu.reserved_fraction, Some(0.5));
        }
        // One process per data-parallel replica.
        assert_eq!(parts.ram.process_bytes, 8 * GIB);
        assert_eq!(parts.ram.total_bytes, 8 * GIB);
    }

    #[test]
    fn a_custom_backend_is_what_it_declares() {
        let claim = ResourceClaim {
            per_gpu_overhead_bytes: GIB,
            base_ram_bytes: 3 * GIB,
            memory: ModelMemory::Fixed(FixedMemory {
                gpu_count: 2,
                bytes_per_gpu: 10 * GIB,
            }),
        };
        let request = PlacementRequest::new(1, "m", "custom", claim.clone());
        let placement = place(&snapshot(2, 80 * GIB), &request).expect("fits");
        let parts = reservation_parts(&claim, &placement).expect("parts");
        for gpu in &parts.gpus {
            assert_eq!((gpu.declared_bytes, gpu.overhead_bytes), (10 * GIB, GIB));
            assert_eq!(gpu.total_bytes, 11 * GIB);
        }
        assert_eq!(parts.ram.process_bytes, 3 * GIB);
        let whole = claim_parts(&claim).expect("parts");
        assert_eq!(whole.declared_gpu_count, Some(2));
        assert_eq!(whole.single_gpu_bytes, Some(11 * GIB));
    }

    #[test]
    fn claim_parts_total_the_model() {
        let whole = claim_parts(&llama3_8b()).expect("parts");
        assert_eq!(whole.weights_bytes, (32 * 208 + 501 + 501) * MIB);
        assert_eq!(whole.kv_cache_bytes, GIB);
        assert_eq!(whole.per_gpu_compute_buffer_bytes, COMPUTE);
        assert_eq!(whole.per_gpu_overhead_bytes, CUDA_CONTEXT);
        assert_eq!(whole.host_compute_buffer_bytes, COMPUTE);
        assert_eq!(whole.base_ram_bytes, 757 * MIB + LOGITS);
        assert_eq!(whole.single_gpu_bytes, Some(9_677_307_904));
    }

    #[test]
    fn claims_recorded_before_parts_and_foreign_placements_are_refused() {
        let claim = llama3_8b();
        let placement = place(&snapshot(1, 80 * GIB), &request(claim.clone())).expect("fits");
        let mut old = claim.clone();
        if let ModelMemory::Layers(layers) = &mut old.memory {
            layers.block_kv_bytes.clear();
        }
        assert_eq!(
            reservation_parts(&old, &placement),
            Err(PartsError::NotRecorded)
        );
        assert_eq!(claim_parts(&old), Err(PartsError::NotRecorded));

        // One byte more than the claim says: refused, not explained wrongly.
        let mut more = placement.clone();
        more.gpus[0].bytes += 1;
        let e = reservation_parts(&claim, &more).expect_err("does not add up");
        assert!(e.to_string().contains("GPU 0"), "{e}");
        let mut more = placement.clone();
        more.ram_bytes += 1;
        assert!(reservation_parts(&claim, &more).is_err());
        // A layout that does not cover the model.
        let mut short = placement;
        short.llama = Some(LlamaLayout {
            n_gpu_layers: 33,
            tensor_split: vec![20],
        });
        assert!(reservation_parts(&claim, &short).is_err());
        let fixed = ResourceClaim {
            per_gpu_overhead_bytes: 0,
            base_ram_bytes: 0,
            memory: ModelMemory::Fixed(FixedMemory {
                gpu_count: 1,
                bytes_per_gpu: 1,
            }),
        };
        let two = Placement {
            gpus: vec![GpuShare { index: 0, bytes: 1 }; 2],
            ..short
        };
        assert!(reservation_parts(&fixed, &two).is_err());
    }
}
