//! Model instances: placing one by hand, deleting one, restarting one's backend where it
//! runs, and finding the worker that holds its logs.

use gantry_store::{ManualPlacement, Store};
use gantry_types::{InstancePatch, ModelInstance, PlacementRecord, Worker};

use super::worker_api::WorkerApi;
use crate::error::{ApiError, ApiResult};

/// Asks the worker an instance is placed on to restart its backend in place: the same
/// placement, GPUs and port, the process stopped (drained as on any stop) and started
/// again, counted in the instance's `restart_count`. Deleting the instance instead makes
/// the model controller create a new one, with a count of its own. Answers the instance as
/// it was when asked; the worker reports the restart as it goes.
pub async fn restart(store: &Store, http: &reqwest::Client, id: i64) -> ApiResult<ModelInstance> {
    let instance = store.get_instance(id).await?;
    let worker_id = instance.worker_id.ok_or_else(|| {
        ApiError::conflict(format!(
            "instance {} is not placed on a worker yet, so no backend of it runs to restart; \
             it starts once the scheduler places it",
            instance.name
        ))
    })?;
    let worker = WorkerApi::of(store, http, worker_id).await?;
    worker
        .send(worker.request(
            reqwest::Method::POST,
            &format!("/v1/instances/{id}/restart"),
        ))
        .await?;
    Ok(instance)
}

/// Places an instance by hand on a worker and GPUs, or takes its placement away
/// (`worker_id: null`). Absent fields keep the instance's current worker or GPUs. The GPUs
/// must be ones the worker reported; the instance then runs the model's launch settings as
/// they are now, with no flags derived from a placement (nothing was estimated).
pub async fn place_by_hand(
    store: &Store,
    id: i64,
    patch: InstancePatch,
) -> ApiResult<ModelInstance> {
    let current = store.get_instance(id).await?;
    let worker_id = patch.worker_id.unwrap_or(current.worker_id);
    let gpus = patch.gpu_indexes.unwrap_or(current.gpu_indexes);
    let Some(worker_id) = worker_id else {
        return Ok(store.place_instance_manually(id, None).await?);
    };
    let worker = match store.get_worker(worker_id).await {
        Ok(worker) => worker,
        Err(gantry_store::StoreError::NotFound { .. }) => {
            return Err(ApiError::validation(format!(
                "worker_id: no worker has id {worker_id}"
            )))
        }
        Err(e) => return Err(e.into()),
    };
    if worker.cluster_id != current.cluster_id {
        return Err(ApiError::validation(format!(
            "worker_id: worker {} is in cluster {}, and instance {} belongs to cluster {} \
             (its model's): pick a worker of that cluster",
            worker.name, worker.cluster_id, current.name, current.cluster_id
        )));
    }
    check_gpus(&worker, &gpus)?;
    let model = store.get_model(current.model_id).await?;
    let record = PlacementRecord::by_hand(&model);
    let message = format!("placed by hand on {}", worker.name);
    Ok(store
        .place_instance_manually(
            id,
            Some(ManualPlacement {
                worker_id,
                gpu_indexes: &gpus,
                state_message: &message,
                record: &record,
            }),
        )
        .await?)
}

/// The GPUs of a placement by hand must be ones the worker reported.
fn check_gpus(worker: &Worker, gpus: &[u32]) -> ApiResult<()> {
    for index in gpus {
        if !worker.status.gpus.iter().any(|g| g.index == *index) {
            let have: Vec<String> = worker
                .status
                .gpus
                .iter()
                .map(|g| g.index.to_string())
                .collect();
            return Err(ApiError::validation(format!(
                "gpu_indexes: worker {} has no GPU {index} (it has {})",
                worker.name,
                if have.is_empty() {
                    "none".to_owned()
                } else {
                    have.join(", ")
                }
            )));
        }
    }
    Ok(())
}

/// Where an instance's logs are: its worker, and the token the worker's API expects.
#[derive(Debug)]
pub struct LogSource {
    pub instance: ModelInstance,
    pub worker: Worker,
    pub token: String,
}

/// The worker that holds an instance's logs; `conflict` while the instance is unplaced.
pub async fn log_source(store: &Store, id: i64) -> ApiResult<LogSource> {
    let instance = store.get_instance(id).await?;
    let worker_id = instance.worker_id.ok_or_else(|| {
        ApiError::conflict(format!(
            "instance {} is not placed on a worker yet; its logs appear once it is",
            instance.name
        ))
    })?;
    let worker = store.get_worker(worker_id).await?;
    let token = store.worker_api_token(worker_id).await?;
    Ok(LogSource {
        instance,
        worker,
        token,
    })
}

#[cfg(test)]
mod tests {
    use gantry_types::fixtures;

    use super::*;

    fn worker(gpus: u32) -> Worker {
        fixtures::worker(1, gpus)
    }

    #[test]
    fn gpus_placed_by_hand_must_exist_on_the_worker() {
        assert!(check_gpus(&worker(2), &[0, 1]).is_ok());
        assert!(check_gpus(&worker(2), &[]).is_ok());
        let e = check_gpus(&worker(2), &[5]).expect_err("no GPU 5");
        assert!(
            e.message.contains("has no GPU 5 (it has 0, 1)"),
            "{}",
            e.message
        );
        let e = check_gpus(&worker(0), &[0]).expect_err("no GPUs at all");
        assert!(e.message.contains("it has none"), "{}", e.message);
    }
}
