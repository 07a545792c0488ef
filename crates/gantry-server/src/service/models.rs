//! Models: declaring, changing and removing what is served.
//!
//! A model is the desired state; its instances follow through the controllers: the model
//! controller brings the instance count to `replicas` ([`super::replicas`]), the roll
//! controller moves instances whose launch settings no longer match the model onto the new
//! ones, one at a time, and the scheduler places what is pending.

use gantry_store::{Store, StoreError};
use gantry_types::{Model, ModelCreate, ModelSource, ModelUpdate, UploadState};

use crate::error::{ApiError, ApiResult};

/// Declares a model; its instances appear with the next controller pass.
pub async fn create(store: &Store, create: &ModelCreate) -> ApiResult<Model> {
    check_source(store, &create.source).await?;
    super::backends::check_model_backend(store, &create.backend, create.backend_version.as_deref())
        .await?;
    Ok(store.create_model(create).await?)
}

/// Refuses (422) a source that names an upload that does not exist or is not complete.
async fn check_source(store: &Store, source: &ModelSource) -> ApiResult<()> {
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

/// Applies a validated update. Changing what an instance runs (source, backend, arguments,
/// environment, command, data parallelism) rolls the model's instances; changing only
/// replicas, selectors or descriptions restarts nothing.
pub async fn update(store: &Store, id: i64, update: ModelUpdate) -> ApiResult<(Model, bool)> {
    let mut model = store.get_model(id).await?;
    let before = model.launch_template();
    model.apply(update);
    if model.source != before.source {
        check_source(store, &model.source).await?;
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
