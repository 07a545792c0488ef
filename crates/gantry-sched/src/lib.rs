//! Placement and resource estimation for gantry: pure functions of their arguments.
//!
//! *Architecture Invariant:* this crate does no IO and never reads the clock. Model facts,
//! file headers, backend arguments and the cluster snapshot come in as values; claims,
//! placements and reasons go out as values. That keeps the scheduler a plain function that
//! unit and property tests can drive from fixtures.
//!
//! * [`estimate`]: from model facts (GGUF, safetensors + `config.json`) and backend arguments
//!   to a [`ResourceClaim`];
//! * [`snapshot`], [`request`]: the scheduler's input;
//! * [`place`](mod@place), with the [`ledger`] of allocatable memory and the private
//!   `filter`, `shape` and `score` modules: choosing a worker and GPUs, or saying in
//!   [`explain`] why none fits; [`verdict`]: the same, asked of each worker alone;
//! * [`parts`]: what the bytes of a claim and of a placement are for (weights, KV cache,
//!   compute buffers, overhead), adding up exactly to what placement reserves.

pub mod estimate;
pub mod explain;
mod filter;
pub mod ledger;
pub mod parts;
pub mod place;
pub mod request;
mod score;
mod shape;
pub mod snapshot;
pub mod units;
pub mod verdict;

#[cfg(test)]
mod testkit;

pub use estimate::engine::{estimate_engine, EngineOptions, ServingEngine};
pub use estimate::gguf::{
    estimate_llama_cpp, FlashAttention, GgufModelFacts, LlamaCppEstimate, LlamaCppOptions,
    LlamaCppParts,
};
pub use estimate::hf_config::{HfConfigError, HfModelConfig};
pub use estimate::kv_type::KvCacheType;
pub use estimate::safetensors::{SafetensorsError, SafetensorsHeader};
pub use estimate::EstimateError;
pub use explain::Unschedulable;
pub use gantry_types::claim::{
    EngineMemory, FixedMemory, LayerBreakdown, MemoryFraction, ModelMemory, ResourceClaim,
};
pub use gantry_types::placement::{GpuShare, LlamaLayout, Placement, PlacementKind};
pub use ledger::SnapshotState;
pub use parts::{claim_parts, reservation_parts, PartsError};
pub use place::{place, place_many};
pub use request::{ManualGpuSelection, PlacementRequest, Strategy};
pub use snapshot::{ClusterSnapshot, GpuView, PlacedClaim, SystemReserve, WorkerView};
pub use verdict::{place_on_each_worker, WorkerFit};

#[cfg(test)]
mod tests;
