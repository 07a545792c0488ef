//! Ready-made values of the resources for tests of every crate (feature `fixtures`, which
//! only dev-dependencies enable): a model, an instance, a worker with simulated GPUs, each
//! with plain defaults a test changes with struct-update syntax.

use std::collections::BTreeMap;

use crate::instance::{InstanceState, ModelInstance};
use crate::model::{BackendKind, Model, ModelSource, PlacementStrategy};
use crate::time::Timestamp;
use crate::worker::{GpuDevice, SystemInfo, Worker, WorkerState, WorkerStatus};

const GIB: u64 = 1 << 30;

/// Model `id` named `name`: llama.cpp on `/models/<name>.gguf`, one replica, no arguments.
pub fn model(id: i64, name: &str) -> Model {
    Model {
        id,
        name: name.to_owned(),
        description: String::new(),
        source: ModelSource::LocalPath {
            path: format!("/models/{name}.gguf"),
        },
        backend: BackendKind::LlamaCpp,
        backend_version: None,
        backend_args: Vec::new(),
        env: BTreeMap::new(),
        replicas: 1,
        worker_selector: BTreeMap::new(),
        gpu_selector: None,
        placement_strategy: PlacementStrategy::Spread,
        data_parallel_size: None,
        cpu_offload: true,
        custom_command: None,
        labels: BTreeMap::new(),
        created_at: Timestamp::from_millis(0),
        updated_at: Timestamp::from_millis(0),
    }
}

/// Instance `id`, replica `replica` of `model`, unplaced, in `state`; created (and last
/// updated) at millisecond `id`, so a higher id is newer.
pub fn instance(id: i64, model: &Model, replica: u32, state: InstanceState) -> ModelInstance {
    ModelInstance {
        id,
        name: format!("{}-{replica}", model.name),
        model_id: model.id,
        model_name: model.name.clone(),
        replica,
        worker_id: None,
        worker_name: None,
        gpu_indexes: Vec::new(),
        port: None,
        address: None,
        state,
        state_message: String::new(),
        placement: None,
        restart_count: 0,
        created_at: Timestamp::from_millis(id),
        updated_at: Timestamp::from_millis(id),
    }
}

/// Worker `id` named `w<id>`, ready, with `gpus` simulated 80 GiB GPUs, 8 CPUs and
/// 64 GiB of RAM, running llama.cpp and vLLM.
pub fn worker(id: i64, gpus: u32) -> Worker {
    Worker {
        id,
        name: format!("w{id}"),
        state: WorkerState::Ready,
        state_message: String::new(),
        labels: BTreeMap::new(),
        address: "127.0.0.1:1".to_owned(),
        status: WorkerStatus {
            gpus: (0..gpus)
                .map(|index| GpuDevice {
                    index,
                    name: "Simulated GPU".to_owned(),
                    uuid: format!("SIM-{id}-{index}"),
                    memory_total: 80 * GIB,
                    memory_used: 0,
                    utilization: None,
                    temperature: None,
                    simulated: true,
                })
                .collect(),
            system: SystemInfo {
                cpu_count: 8,
                memory_total: 64 * GIB,
                ..SystemInfo::default()
            },
            backends: vec!["llama.cpp".to_owned(), "vllm".to_owned()],
        },
        last_heartbeat_at: None,
        created_at: Timestamp::from_millis(0),
        updated_at: Timestamp::from_millis(0),
    }
}
