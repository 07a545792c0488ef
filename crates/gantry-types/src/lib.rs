//! API resources, states and request/response shapes shared by the server, the worker,
//! the CLI and the tests.
//!
//! Architecture invariant: this crate does no IO. It holds plain data with serde and
//! OpenAPI schema derives, plus the validation rules that belong to the data itself
//! (name syntax, ranges), so every caller agrees on what a valid request is.

pub mod api_key;
pub mod auth;
pub mod backend;
pub mod catalog;
pub mod claim;
pub mod cluster;
pub mod coordination;
pub mod error;
pub mod estimate;
#[cfg(feature = "fixtures")]
pub mod fixtures;
pub mod instance;
pub mod list;
pub mod model;
pub mod model_file;
pub mod parts;
pub mod placement;
pub mod pool;
pub mod query;
pub mod route;
pub mod time;
pub mod units;
pub mod usage;
pub mod user;
pub mod validate;
pub mod worker;

pub use api_key::{ApiKey, ApiKeyCreate, ApiKeyCreated, ApiKeyLimits, ApiKeyUpdate};
pub use auth::{ChangePasswordRequest, LoginRequest, LoginResponse};
pub use backend::{
    BackendInstallOrder, BackendInstallRequest, BackendInstallStatus, BackendName, BackendVersion,
    CustomBackendSpec, DefinedBackend, InferenceBackend, InferenceBackendCreate,
    InferenceBackendUpdate, InstallMethod, InstalledBackend, InstalledOn,
};
pub use catalog::{CatalogEntry, ModelCatalog};
pub use claim::{
    EngineMemory, FixedMemory, LayerBreakdown, MemoryFraction, ModelMemory, ResourceClaim,
};
pub use cluster::{
    Cluster, ClusterCounts, ClusterCreate, ClusterProvider, ClusterRegistration, ClusterState,
    ClusterUpdate, DEFAULT_CLUSTER_ID,
};
pub use coordination::{
    ClusterStatus, CoordinatorHealth, LeaderInfo, LockAcquire, LockInfo, LockRelease,
    ServerDirectory, ServerHeartbeat, ServerInfo, ServerLoad, ServerRegister, ServerRole,
};
pub use error::{ErrorBody, ErrorCode, ErrorDetail};
pub use estimate::{ModelEstimate, PlacementVerdict, WorkerVerdict};
pub use instance::{
    DownloadProgress, InstallProgress, InstancePatch, InstanceState, InstanceStateReport, LogQuery,
    ModelInstance, INSTALL_LOG_TAIL_LINES,
};
pub use list::{ChangeKind, ListResponse, Pagination, WatchEvent};
pub use model::{
    BackendKind, GpuSelector, Model, ModelCreate, ModelSource, ModelUpdate, OneOrMany,
    PlacementStrategy,
};
pub use model_file::{
    CachedModelFile, ModelFile, ModelFileList, ModelFileState, StagedUpload, UnreachableWorker,
    Upload, UploadCreate, UploadList, UploadState,
};
pub use parts::{ClaimParts, GpuParts, LayerRange, RamParts, ReservationParts};
pub use placement::{
    GpuShare, LaunchTemplate, LlamaLayout, Placement, PlacementKind, PlacementRecord, Reservation,
};
pub use pool::{
    MachineShape, MachineState, PoolEvent, PoolMachine, PoolProvider, WorkerPool, WorkerPoolCreate,
    WorkerPoolUpdate,
};
pub use query::{
    ApiKeyFilter, ApiKeyQuery, InstanceFilter, InstanceQuery, ListFilter, ListQuery, ModelFilter,
    ModelQuery, UserFilter, UserQuery, WorkerFilter, WorkerQuery,
};
pub use route::{
    ModelProvider, ModelProviderCreate, ModelProviderUpdate, ModelRoute, ModelRouteCreate,
    ModelRouteUpdate, ProviderModels, RouteTarget,
};
pub use time::Timestamp;
pub use user::{Role, User, UserCreate, UserUpdate};
pub use validate::{FieldError, Validate};
pub use worker::{
    FoundBackend, GpuDevice, GpuSample, SystemInfo, Worker, WorkerHeartbeat, WorkerHistory,
    WorkerJoin, WorkerLabelsUpdate, WorkerRegister, WorkerRegistered, WorkerSample, WorkerState,
    WorkerStatus,
};
