//! Worker pools: their settings checked and stored (credentials sealed), shown with their
//! machines, changed, and deleted (the leader then deletes their machines; see
//! `controllers/pools.rs`).

use gantry_auth::sealed::Sealer;
use gantry_store::{NewPool, PoolSpec, Store, StoredPool};
use gantry_types::pool::{check_scale_down_after, default_scale_down_after};
use gantry_types::{FieldError, PoolEvent, WorkerPool, WorkerPoolCreate, WorkerPoolUpdate};

use crate::error::{ApiError, ApiResult};

/// The sealer of pools' credentials: the providers' one, under its own purpose.
pub fn credentials_sealer(server_secret: &[u8]) -> Sealer {
    Sealer::new(server_secret, "worker pool credentials")
}

fn spec_of(pool: &WorkerPool) -> PoolSpec {
    PoolSpec {
        instance_type: pool.instance_type.clone(),
        image: pool.image.clone(),
        region: pool.region.clone(),
        gpus: pool.gpus.clone(),
        memory: pool.memory.clone(),
        labels: pool.labels.clone(),
        scale_down_after: pool.scale_down_after.clone(),
        command: pool.command.clone(),
        api_url: pool.api_url.clone(),
    }
}

/// A pool with its machines, as the API shows it.
pub async fn shown(store: &Store, stored: StoredPool) -> ApiResult<WorkerPool> {
    let mut pool = stored.pool;
    pool.machines = store
        .pool_machines(Some(pool.id))
        .await?
        .into_iter()
        .map(|m| m.machine)
        .collect();
    Ok(pool)
}

/// A pool of cluster `cluster_id` (404 when it is another cluster's).
pub async fn get(store: &Store, cluster_id: i64, id: i64) -> ApiResult<StoredPool> {
    let stored = store.get_pool(id).await?;
    if stored.pool.cluster_id != cluster_id {
        return Err(ApiError::not_found(format!(
            "worker pool {id} not found in cluster {cluster_id}"
        )));
    }
    Ok(stored)
}

/// Adds a pool to a cluster.
pub async fn create(
    store: &Store,
    (sealer, commands_dir): (&Sealer, &std::path::Path),
    cluster_id: i64,
    request: WorkerPoolCreate,
) -> ApiResult<WorkerPool> {
    let commands_dir = commands_dir.to_owned();
    store.get_cluster(cluster_id).await?;
    if request.provider == gantry_types::PoolProvider::Digitalocean && request.name.contains('_') {
        return Err(ApiError::validation(
            "name: DigitalOcean names droplets by hostname rules, which allow no `_`; \
             use `-` instead",
        ));
    }
    if let Some(command) = &request.command {
        check_command(&commands_dir, command)?;
    }
    let spec = PoolSpec {
        instance_type: request.instance_type,
        image: request.image,
        region: request.region,
        gpus: request.gpus,
        memory: request.memory,
        labels: request.labels,
        scale_down_after: request
            .scale_down_after
            .unwrap_or_else(default_scale_down_after),
        command: request.command,
        api_url: request.api_url,
    };
    let sealed = request.credentials.as_deref().map(|c| sealer.seal(c));
    let stored = store
        .create_pool(&NewPool {
            cluster_id,
            name: &request.name,
            provider: request.provider,
            spec: &spec,
            min: request.min,
            max: request.max,
            credentials_sealed: sealed.as_deref(),
        })
        .await?;
    shown(store, stored).await
}

/// Changes a pool's bounds, labels, idle time or credentials.
pub async fn update(
    store: &Store,
    sealer: &Sealer,
    cluster_id: i64,
    id: i64,
    update: WorkerPoolUpdate,
) -> ApiResult<WorkerPool> {
    let stored = get(store, cluster_id, id).await?;
    update
        .validate_for(&stored.pool)
        .map_err(|FieldError { field, message }| {
            ApiError::validation(format!("{field}: {message}"))
        })?;
    let mut spec = spec_of(&stored.pool);
    if let Some(labels) = update.labels {
        spec.labels = labels;
    }
    if let Some(text) = update.scale_down_after {
        check_scale_down_after(&text).map_err(|e| ApiError::validation(e.to_string()))?;
        spec.scale_down_after = text;
    }
    let sealed = match &update.credentials {
        Some(credentials) => Some(sealer.seal(credentials)),
        None => stored.credentials_sealed.clone(),
    };
    let bounds = (
        update.min.unwrap_or(stored.pool.min),
        update.max.unwrap_or(stored.pool.max),
    );
    let stored = store
        .update_pool(id, stored.pool.updated_at, &spec, bounds, sealed.as_deref())
        .await?;
    shown(store, stored).await
}

/// Deletes a pool: its machines are deleted by the leader, then the pool.
pub async fn delete(store: &Store, cluster_id: i64, id: i64) -> ApiResult<WorkerPool> {
    get(store, cluster_id, id).await?;
    let stored = store.mark_pool_deleting(id).await?;
    store
        .add_pool_event(
            id,
            "deleting",
            "the pool was deleted: its machines are being deleted, then the pool goes",
        )
        .await?;
    shown(store, stored).await
}

/// An `exec` pool's program must be an executable in the servers' `pool_commands_dir`.
fn check_command(dir: &std::path::Path, command: &str) -> ApiResult<()> {
    use std::os::unix::fs::PermissionsExt;
    let exec = gantry_provision::exec::Exec::new(dir, command, None)
        .map_err(|e| ApiError::validation(format!("command: {e}")))?;
    let program = std::path::Path::new(exec.program());
    let runnable = std::fs::metadata(program)
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
    if !runnable {
        return Err(ApiError::validation(format!(
            "command: {} is not an executable file; put the pool's program in {} on every \
             server (only programs there run)",
            program.display(),
            dir.display()
        )));
    }
    Ok(())
}

/// A pool's latest decisions, newest first.
pub async fn events(store: &Store, cluster_id: i64, id: i64) -> ApiResult<Vec<PoolEvent>> {
    get(store, cluster_id, id).await?;
    Ok(store.pool_events(id, 200).await?)
}
