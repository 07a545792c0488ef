//! Ready-made values of the resources for tests of every crate (feature `fixtures`, which
//! only dev-dependencies enable): a model, an instance, a worker with simulated GPUs, each
//! with plain defaults a test changes with struct-update syntax.

use std::collections::BTreeMap;

use crate::instance::{InstanceState, ModelInstance};
use crate::model::{BackendKind, Model, ModelSource, PlacementStrategy};
use crate::placement::{GpuShare, LlamaLayout, Placement, PlacementKind};
use crate::time::Timestamp;
use crate::worker::{GpuDevice, SystemInfo, Worker, WorkerState, WorkerStatus};

const GIB: u64 = 1 << 30;

/// Model `id` named `name`: llama.cpp on `/models/<name>.gguf`, one replica, no arguments.
pub fn model(id: i64, name: &str) -> Model {
    Model {
        cluster_id: crate::cluster::DEFAULT_CLUSTER_ID,
        id,
        name: name.to_owned(),
        description: String::new(),
        source: ModelSource::LocalPath {
            path: format!("/models/{name}.gguf"),
        },
        backend: BackendKind::LlamaCpp.into(),
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
        cluster_id: crate::cluster::DEFAULT_CLUSTER_ID,
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
        download: None,
        install: None,
        backend_version: None,
        restart_count: 0,
        created_at: Timestamp::from_millis(id),
        updated_at: Timestamp::from_millis(id),
    }
}

/// Worker `id` named `w<id>`, ready, with [`worker_status`] of `gpus` GPUs.
pub fn worker(id: i64, gpus: u32) -> Worker {
    let name = format!("w{id}");
    Worker {
        cluster_id: crate::cluster::DEFAULT_CLUSTER_ID,
        id,
        status: worker_status(&name, gpus),
        name,
        state: WorkerState::Ready,
        state_message: String::new(),
        labels: BTreeMap::new(),
        address: "127.0.0.1:1".to_owned(),
        last_heartbeat_at: None,
        created_at: Timestamp::from_millis(0),
        updated_at: Timestamp::from_millis(0),
    }
}

/// What worker `name` reports with `gpus` simulated 80 GiB GPUs, 8 CPUs and 64 GiB of RAM,
/// running llama.cpp and vLLM.
pub fn worker_status(name: &str, gpus: u32) -> WorkerStatus {
    WorkerStatus {
        gpus: (0..gpus)
            .map(|index| GpuDevice {
                index,
                name: "Simulated GPU".to_owned(),
                uuid: format!("SIM-{name}-{index}"),
                memory_total: 80 * GIB,
                memory_used: 0,
                utilization: None,
                temperature: None,
                simulated: true,
            })
            .collect(),
        system: SystemInfo {
            cpu_count: 8,
            load_average: 0.1,
            memory_total: 64 * GIB,
            memory_available: 60 * GIB,
            disk_free: 100 * GIB,
            os: "linux".to_owned(),
            hostname: name.to_owned(),
        },
        backends: vec!["llama.cpp".to_owned(), "vllm".to_owned()],
        installed_backends: Vec::new(),
        found_backends: Vec::new(),
    }
}

/// A placement of instance 1 on worker `w1` (id 1): 1 GiB on each of `gpus` (tensor
/// parallel over all of them), 0.5 GiB of RAM, and with `split` the llama.cpp layout
/// (layers per GPU; their sum is `-ngl`).
pub fn placement(kind: PlacementKind, gpus: &[u32], split: Option<&[u32]>) -> Placement {
    Placement {
        instance_id: 1,
        worker_id: 1,
        worker_name: "w1".to_owned(),
        gpus: gpus
            .iter()
            .map(|&index| GpuShare { index, bytes: GIB })
            .collect(),
        ram_bytes: GIB / 2,
        kind,
        tensor_parallel_size: u32::try_from(gpus.len().max(1)).unwrap_or(u32::MAX),
        data_parallel_size: 1,
        llama: split.map(|split| LlamaLayout {
            n_gpu_layers: split.iter().sum(),
            tensor_split: split.to_vec(),
        }),
    }
}
