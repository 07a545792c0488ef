//! Workers: registration, heartbeats and the other calls of the worker agent, and the
//! rules of a worker's state on them.

use gantry_store::{Store, StoreError, WorkerRegistration};
use gantry_types::{
    InstanceStateReport, ModelInstance, Worker, WorkerJoin, WorkerRegister, WorkerRegistered,
    WorkerState, WorkerStatus, DEFAULT_CLUSTER_ID,
};

use crate::auth::secrets::{
    digest, generate_worker_credential, random_alphanumeric, REGISTRATION_TOKEN_PREFIX,
    WORKER_CREDENTIAL_PREFIX,
};
use crate::error::{ApiError, ApiResult};

/// How often a conditional state write is retried when the state moved under it.
const STATE_WRITE_ATTEMPTS: usize = 3;

/// The state a worker is in after it was heard from (a heartbeat or a registration): an
/// admin's `maintenance` stays; anything else is `ready` again. Returns the state and its
/// message.
pub fn state_when_heard_from(worker: &Worker) -> (WorkerState, &str) {
    match worker.state {
        WorkerState::Maintenance => (WorkerState::Maintenance, worker.state_message.as_str()),
        WorkerState::Ready => (WorkerState::Ready, worker.state_message.as_str()),
        WorkerState::NotReady | WorkerState::Unreachable => (WorkerState::Ready, ""),
    }
}

/// The outcome of a registration.
#[derive(Debug)]
pub struct Registration {
    pub registered: WorkerRegistered,
    /// A new worker (the registration token was used), rather than a known one returning.
    pub created: bool,
}

/// How a new machine joins the default cluster as a worker: the servers, the cluster's
/// token and the command; no token (and no command) while its token is one only another
/// server's data directory holds.
pub async fn join(store: &Store, joining: &super::clusters::Joining<'_>) -> ApiResult<WorkerJoin> {
    match super::clusters::registration(store, joining, DEFAULT_CLUSTER_ID).await {
        Ok(registration) => Ok(WorkerJoin {
            server_urls: registration.server_urls,
            token: Some(registration.token),
            command: Some(registration.command),
        }),
        Err(e) if e.status() == axum::http::StatusCode::CONFLICT => Ok(WorkerJoin {
            server_urls: joining.server_urls.clone(),
            token: None,
            command: None,
        }),
        Err(e) => Err(e),
    }
}

/// Registers a worker with the cluster's registration token, or refreshes the
/// registration of a known worker presenting its own credential (idempotent).
pub async fn register(
    store: &Store,
    bearer: &str,
    request: &WorkerRegister,
) -> ApiResult<Registration> {
    let registration = WorkerRegistration {
        labels: &request.labels,
        address: &request.address,
        status: &request.status,
    };
    if bearer.starts_with(WORKER_CREDENTIAL_PREFIX) {
        let worker = match store.worker_by_credential(&digest(bearer)).await {
            Ok(worker) => worker,
            Err(StoreError::NotFound { .. }) => {
                return Err(ApiError::unauthorized(
                    "unknown worker credential: the worker was deleted; remove its credential \
                     file and register again with the registration token",
                ))
            }
            Err(e) => return Err(e.into()),
        };
        if worker.name != request.name {
            return Err(ApiError::conflict(format!(
                "this credential belongs to worker {}, not {}",
                worker.name, request.name
            )));
        }
        let mut current = worker;
        for _ in 0..STATE_WRITE_ATTEMPTS {
            let state = state_when_heard_from(&current);
            if let Some(worker) = store
                .update_worker_registration(current.id, &registration, current.state, state)
                .await?
            {
                return Ok(Registration {
                    registered: WorkerRegistered {
                        worker,
                        credential: None,
                        api_token: None,
                    },
                    created: false,
                });
            }
            current = store.get_worker(current.id).await?;
        }
        return Err(ApiError::conflict(format!(
            "worker {}'s state kept changing during its registration; try again",
            current.name
        )));
    }
    let invalid = || {
        ApiError::unauthorized(
            "invalid registration token: it is no cluster's current token (it may have been \
             rotated); an admin shows the current one with GET \
             /api/v1/clusters/{id}/registration-token",
        )
    };
    if !bearer.starts_with(REGISTRATION_TOKEN_PREFIX) {
        return Err(invalid());
    }
    let cluster = match store.cluster_by_token_digest(&digest(bearer)).await {
        Ok(cluster) => cluster,
        Err(StoreError::NotFound { .. }) => return Err(invalid()),
        Err(e) => return Err(e.into()),
    };
    if store.get_worker_by_name(&request.name).await.is_ok() {
        return Err(ApiError::conflict(format!(
            "a worker named {} is already registered: start it with its saved credential, \
             pick another --name, or delete the old worker (DELETE /api/v1/workers/{{id}})",
            request.name
        )));
    }
    let credential = generate_worker_credential();
    let api_token = random_alphanumeric(48);
    let worker = store
        .register_worker(
            cluster.id,
            &request.name,
            &registration,
            &digest(&credential),
            &api_token,
        )
        .await?;
    tracing::info!(worker = %worker.name, worker_id = worker.id, cluster = %cluster.name,
        cluster_id = cluster.id, "worker joined its cluster");
    Ok(Registration {
        registered: WorkerRegistered {
            worker,
            credential: Some(credential),
            api_token: Some(api_token),
        },
        created: true,
    })
}

/// Records a heartbeat of a worker; returns it with the state it had before.
pub async fn heartbeat(store: &Store, worker_id: i64) -> ApiResult<(Worker, WorkerState)> {
    // Almost every heartbeat is of a ready worker that stays ready: one write.
    if let Some(worker) = store.record_heartbeat_of_ready(worker_id).await? {
        return Ok((worker, WorkerState::Ready));
    }
    let mut current = store.get_worker(worker_id).await?;
    let before = current.state;
    for _ in 0..STATE_WRITE_ATTEMPTS {
        let state = state_when_heard_from(&current);
        if let Some(worker) = store
            .record_heartbeat(worker_id, current.state, state)
            .await?
        {
            return Ok((worker, before));
        }
        current = store.get_worker(worker_id).await?;
    }
    Err(ApiError::conflict(format!(
        "worker {}'s state kept changing during the heartbeat; the next one will count",
        current.name
    )))
}

/// Applies a worker's report about an instance placed on it; `not_found` when the
/// instance is gone or was moved to another worker (a late report changes nothing).
pub async fn report_state(
    store: &Store,
    worker_id: i64,
    instance_id: i64,
    report: &InstanceStateReport,
) -> ApiResult<ModelInstance> {
    Ok(store
        .report_instance_state(instance_id, worker_id, report)
        .await?)
}

/// Stores a worker's hardware report.
pub async fn report_status(
    store: &Store,
    worker_id: i64,
    status: &WorkerStatus,
) -> ApiResult<Worker> {
    Ok(store.set_worker_status(worker_id, status).await?)
}

/// A worker is going away: `not_ready` until it is heard from again.
pub async fn goodbye(store: &Store, worker_id: i64) -> ApiResult<Worker> {
    Ok(store
        .set_worker_state(worker_id, WorkerState::NotReady, "worker shut down")
        .await?)
}

#[cfg(test)]
mod tests {
    use gantry_types::fixtures;

    use super::*;

    fn worker(state: WorkerState, message: &str) -> Worker {
        Worker {
            state,
            state_message: message.into(),
            ..fixtures::worker(1, 0)
        }
    }

    #[test]
    fn hearing_from_a_worker_makes_it_ready_unless_in_maintenance() {
        assert_eq!(
            state_when_heard_from(&worker(WorkerState::NotReady, "missed 3 heartbeats")),
            (WorkerState::Ready, "")
        );
        assert_eq!(
            state_when_heard_from(&worker(WorkerState::Unreachable, "silent")),
            (WorkerState::Ready, "")
        );
        assert_eq!(
            state_when_heard_from(&worker(WorkerState::Maintenance, "disk swap")),
            (WorkerState::Maintenance, "disk swap")
        );
        assert_eq!(
            state_when_heard_from(&worker(WorkerState::Ready, "")),
            (WorkerState::Ready, "")
        );
    }
}
