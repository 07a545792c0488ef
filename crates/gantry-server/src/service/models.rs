//! Models: declaring, changing and removing what is served.
//!
//! A model is the desired state; its instances follow through the controllers: the model
//! controller brings the instance count to `replicas` ([`super::replicas`]), the roll
//! controller moves instances whose launch settings no longer match the model onto the new
//! ones, one at a time, and the scheduler places what is pending.

use std::collections::HashMap;

use gantry_sched::{claim_parts, place_on_each_worker, Placement, SnapshotState, Unschedulable};
use gantry_source::Sources;
use gantry_store::{Store, StoreError, WorkerFilter};
use gantry_types::{
    BackendKind, Model, ModelCreate, ModelEstimate, ModelSource, ModelUpdate, PlacementVerdict,
    Timestamp, UploadState, WorkerVerdict, DEFAULT_CLUSTER_ID,
};

use crate::controllers::analyze::{analyze_model, AnalysisInput};
use crate::controllers::pass::EVERYTHING;
use crate::controllers::placement::{
    defined_backend, placement_parts, placement_request, preferred_install, unschedulable_message,
};
use crate::controllers::snapshot::build_snapshot;
use crate::error::{ApiError, ApiResult};

/// The cluster a request deploys into: the one it names (422 when there is none such),
/// else the default.
pub async fn cluster_of(store: &Store, create: &ModelCreate) -> ApiResult<i64> {
    match create.cluster_id {
        Some(id) => Ok(super::clusters::named_in_request(store, "cluster_id", id)
            .await?
            .id),
        None => Ok(DEFAULT_CLUSTER_ID),
    }
}

/// Declares a model; its instances appear with the next controller pass.
pub async fn create(store: &Store, create: &ModelCreate) -> ApiResult<Model> {
    cluster_of(store, create).await?;
    check_source(store, &create.source, create.backend.kind()).await?;
    super::backends::check_model_backend(store, &create.backend, create.backend_version.as_deref())
        .await?;
    Ok(store.create_model(create).await?)
}

/// What a model not created yet would need and where it would go now: the same checks as
/// [`create`] (so a body creation would refuse is refused alike), the same analysis as the
/// scheduler's (local files or remote headers), then the scheduler's placement of its
/// replicas and of one instance on each worker of its cluster, against the cluster as it
/// is. Stores nothing.
pub async fn estimate(
    store: &Store,
    sources: &Sources,
    create: &ModelCreate,
) -> ApiResult<ModelEstimate> {
    let cluster_id = cluster_of(store, create).await?;
    check_source(store, &create.source, create.backend.kind()).await?;
    super::backends::check_model_backend(store, &create.backend, create.backend_version.as_deref())
        .await?;
    let model = create.to_model(0, Timestamp::now());
    let analysis = analyze_model(sources, AnalysisInput::of(&model))
        .await
        .map_err(|e| ApiError::validation(e.to_string()))?;
    let defined = defined_backend(store, &model)
        .await?
        .map_err(ApiError::validation)?;
    // A claim estimated now always records its parts; `claim_parts` fails only for claims
    // stored before they did.
    let parts = claim_parts(&analysis.claim)
        .map_err(|e| ApiError::internal(format!("split the estimate into parts: {e}")))?;

    let in_cluster = WorkerFilter {
        cluster_id: Some(cluster_id),
        ..WorkerFilter::default()
    };
    let (workers, _) = store.list_workers(&in_cluster, EVERYTHING).await?;
    let placed = store.placed_instance_claims().await?;
    let snapshot = build_snapshot(&workers, &placed);
    // Instance id 0: nothing is created, and the placements say so.
    let mut request = placement_request(0, &model, &analysis);
    request.prefer_installed = preferred_install(&model, defined.as_ref());

    let mut ledger = SnapshotState::new(&snapshot);
    let replicas = (0..model.replicas)
        .map(|_| verdict(&analysis.claim, ledger.place(&request)))
        .collect();
    let mut fits: HashMap<i64, Result<Placement, Unschedulable>> =
        place_on_each_worker(&snapshot, &request)
            .into_iter()
            .map(|fit| (fit.worker_id, fit.result))
            .collect();
    let workers = workers
        .iter()
        .map(|worker| {
            let result = fits
                .remove(&worker.id)
                .expect("every worker of the snapshot has a verdict");
            let PlacementVerdict {
                fits,
                placement,
                parts,
                reason,
            } = verdict(&analysis.claim, result);
            WorkerVerdict {
                worker_id: worker.id,
                worker_name: worker.name.clone(),
                worker_state: worker.state,
                simulated_gpus: worker.status.gpus.iter().any(|gpu| gpu.simulated),
                fits,
                placement,
                parts,
                reason,
            }
        })
        .collect();
    Ok(ModelEstimate {
        backend: model.backend.clone(),
        context_size: analysis.context_size,
        parts,
        claim: analysis.claim.clone(),
        replicas,
        workers,
    })
}

fn verdict(
    claim: &gantry_types::ResourceClaim,
    result: Result<Placement, Unschedulable>,
) -> PlacementVerdict {
    match result {
        Ok(placement) => PlacementVerdict {
            fits: true,
            parts: placement_parts(claim, &placement),
            placement: Some(placement),
            reason: None,
        },
        Err(unschedulable) => PlacementVerdict {
            fits: false,
            placement: None,
            parts: None,
            reason: Some(unschedulable_message(&unschedulable)),
        },
    }
}

/// Refuses (422) a source the server can tell will not work: an upload that does not
/// exist or is not complete, or a local path missing on the server.
///
/// The server reads a local model's header itself to estimate its memory (every backend
/// but `custom`, whose files the server never reads), so a path it cannot find would leave
/// the instances pending until the model changes. Whether the workers have the file only
/// a worker can tell: it says so in its instance's message.
async fn check_source(store: &Store, source: &ModelSource, backend: BackendKind) -> ApiResult<()> {
    if let ModelSource::LocalPath { path } = source {
        if backend == BackendKind::Custom {
            return Ok(());
        }
        return check_local_path(path).await;
    }
    let ModelSource::Upload { id } = source else {
        return Ok(());
    };
    let upload = match store.get_upload(*id).await {
        Ok(upload) => upload,
        Err(StoreError::NotFound { .. }) => {
            return Err(ApiError::validation(format!(
                "source.id: there is no upload {id} (see GET /api/v1/model-files/uploads)"
            )))
        }
        Err(e) => return Err(e.into()),
    };
    if upload.state != UploadState::Ready {
        return Err(ApiError::validation(format!(
            "source.id: upload {id} ({}) is not complete ({} of {} bytes received); finish it \
             with PATCH /api/v1/model-files/uploads/{id} first",
            upload.name, upload.bytes_received, upload.size
        )));
    }
    Ok(())
}

/// Refuses (422) a local path that does not exist on this server, or that it may not
/// read; any other trouble with the file is the analysis's to describe.
async fn check_local_path(path: &str) -> ApiResult<()> {
    let hint = "The server reads the model's header to estimate its memory, so the file must \
                be on the server as well as on the workers: correct the path, or copy the file \
                there";
    match tokio::fs::metadata(path).await {
        Ok(_) => Ok(()),
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
            ) =>
        {
            Err(ApiError::validation(format!(
                "source.path: {path} does not exist on the server. {hint}."
            )))
        }
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            Err(ApiError::validation(format!(
                "source.path: {path} cannot be read by the server (permission denied). {hint}."
            )))
        }
        Err(_) => Ok(()),
    }
}

/// Applies a validated update. Changing what an instance runs (source, backend, arguments,
/// environment, command, data parallelism) rolls the model's instances; changing only
/// replicas, selectors or descriptions restarts nothing.
pub async fn update(store: &Store, id: i64, update: ModelUpdate) -> ApiResult<(Model, bool)> {
    let mut model = store.get_model(id).await?;
    if let Some(cluster_id) = update.cluster_id.filter(|c| *c != model.cluster_id) {
        return Err(ApiError::validation(format!(
            "cluster_id: model {} is deployed into cluster {}, and a model stays in its \
             cluster; to run it in cluster {cluster_id}, delete it and deploy it there",
            model.name, model.cluster_id
        )));
    }
    let before = model.launch_template();
    model.apply(update);
    if model.source != before.source {
        check_source(store, &model.source, model.backend.kind()).await?;
    }
    if model.backend_version != before.backend_version {
        super::backends::check_model_backend(
            store,
            &model.backend,
            model.backend_version.as_deref(),
        )
        .await?;
    }
    let rolls = model.launch_template() != before;
    Ok((store.update_model(&model).await?, rolls))
}

/// Removes a model and every instance of it (their workers stop them).
pub async fn delete(store: &Store, id: i64) -> ApiResult<Model> {
    Ok(store.delete_model(id).await?)
}
