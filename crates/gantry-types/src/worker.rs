//! Workers: the GPU nodes that run model instances.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::time::Timestamp;
use crate::validate::{check_labels, FieldError, Validate};

/// Worker lifecycle as the server sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum WorkerState {
    /// Heartbeats arrive; instances may be placed here.
    Ready,
    /// Missed three heartbeats; nothing new is placed here.
    NotReady,
    /// Silent for longer than `server_timeout`; its instances are rescheduled.
    Unreachable,
    /// Set by an admin: running instances stay, nothing new is placed.
    Maintenance,
}

impl WorkerState {
    pub fn as_str(self) -> &'static str {
        match self {
            WorkerState::Ready => "ready",
            WorkerState::NotReady => "not_ready",
            WorkerState::Unreachable => "unreachable",
            WorkerState::Maintenance => "maintenance",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "ready" => Some(WorkerState::Ready),
            "not_ready" => Some(WorkerState::NotReady),
            "unreachable" => Some(WorkerState::Unreachable),
            "maintenance" => Some(WorkerState::Maintenance),
            _ => None,
        }
    }
}

/// One GPU as the worker reports it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct GpuDevice {
    /// The device index as the driver numbers it (`CUDA_VISIBLE_DEVICES` uses it).
    pub index: u32,
    pub name: String,
    pub uuid: String,
    pub memory_total: u64,
    pub memory_used: u64,
    /// Percent, 0-100.
    pub utilization: Option<u32>,
    /// Degrees Celsius.
    pub temperature: Option<u32>,
    /// True for devices declared with `--simulate-gpus`: they exist only for scheduling
    /// tests and demos, and every response that shows them says so.
    pub simulated: bool,
}

/// Host facts reported by a worker.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct SystemInfo {
    pub cpu_count: u32,
    /// One-minute load average.
    pub load_average: f64,
    pub memory_total: u64,
    pub memory_available: u64,
    /// Free bytes on the file system holding the worker's data directory.
    pub disk_free: u64,
    pub os: String,
    pub hostname: String,
}

/// How busy a worker is at one moment, sent with its heartbeats and kept by the server
/// that receives them for an hour (`GET /api/v1/workers/{id}/history`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct WorkerSample {
    /// When the server received it (set by the server; ignored when sent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<Timestamp>,
    /// Percent of all CPUs busy since the previous sample; `None` for the first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 100)]
    pub cpu_percent: Option<f32>,
    pub memory_used: u64,
    pub memory_total: u64,
    #[serde(default)]
    #[schema(max_items = 64)]
    pub gpus: Vec<GpuSample>,
}

/// One GPU in a [`WorkerSample`].
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct GpuSample {
    pub index: u32,
    pub memory_used: u64,
    pub memory_total: u64,
    /// Percent, 0-100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 100)]
    pub utilization: Option<u32>,
}

/// The heartbeat answer's header saying how many seconds a worker should let pass between
/// two samples it sends (the server keeps no more; see `gantry_server::history`).
pub const SAMPLE_INTERVAL_HEADER: &str = "x-gantry-sample-interval";

/// `POST /api/v1/worker/heartbeat`: the body is optional; a worker sends how busy it is.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct WorkerHeartbeat {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sample: Option<WorkerSample>,
}

impl Validate for WorkerHeartbeat {
    fn validate(&self) -> Result<(), FieldError> {
        let Some(sample) = &self.sample else {
            return Ok(());
        };
        if sample
            .cpu_percent
            .is_some_and(|p| !(0.0..=100.0).contains(&p))
        {
            return Err(FieldError::new("sample.cpu_percent", "must be 0 to 100"));
        }
        if sample.gpus.len() > 64 {
            return Err(FieldError::new("sample.gpus", "at most 64 GPUs"));
        }
        if sample
            .gpus
            .iter()
            .any(|g| g.utilization.is_some_and(|u| u > 100))
        {
            return Err(FieldError::new(
                "sample.gpus.utilization",
                "must be 0 to 100",
            ));
        }
        Ok(())
    }
}

/// The last hour of a worker's samples, oldest first.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct WorkerHistory {
    pub worker_id: i64,
    pub samples: Vec<WorkerSample>,
    /// Servers whose part of the hour could not be read (their samples are missing).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub servers_missing: Vec<String>,
}

/// What a worker reports about itself: hardware and backends it can run.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct WorkerStatus {
    pub gpus: Vec<GpuDevice>,
    pub system: SystemInfo,
    /// Backends this worker can run: those whose executables it found or configured, and
    /// those it can install on demand (`llama.cpp`, `vllm`, `sglang`, `custom`).
    pub backends: Vec<String>,
    /// Backend versions installed under the worker's data directory.
    #[serde(default)]
    pub installed_backends: Vec<crate::backend::InstalledBackend>,
    /// The backends of `backends` whose programs the worker found at start (configured,
    /// or on `PATH`): they run without an install. The rest of `backends` is installed on
    /// first use. Empty from workers that predate the field.
    #[serde(default)]
    pub found_backends: Vec<FoundBackend>,
}

/// A backend program a worker found: `program` is the executable it runs (the Python
/// interpreter for a backend run as a module), as configured or as found on `PATH`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct FoundBackend {
    pub name: String,
    pub program: String,
}

/// A worker as the API shows it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct Worker {
    pub id: i64,
    pub name: String,
    /// The cluster whose registration token the worker joined with.
    #[serde(default = "crate::cluster::default_cluster_id")]
    pub cluster_id: i64,
    pub state: WorkerState,
    pub state_message: String,
    pub labels: BTreeMap<String, String>,
    /// Address (host:port) of the worker's own small HTTP API.
    pub address: String,
    pub status: WorkerStatus,
    pub last_heartbeat_at: Option<Timestamp>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

/// `PUT /api/v1/workers/{id}/labels`: replaces the label set.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkerLabelsUpdate {
    #[schema(schema_with = crate::validate::labels_schema)]
    pub labels: BTreeMap<String, String>,
}

impl Validate for WorkerLabelsUpdate {
    fn validate(&self) -> Result<(), FieldError> {
        check_labels("labels", &self.labels)
    }
}

/// `GET /api/v1/workers/join` (admin): how a new machine joins the cluster as a worker.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct WorkerJoin {
    /// The active servers' URLs, for the worker's `--server-url`.
    pub server_urls: Vec<String>,
    /// The cluster's registration token, when the server that answers holds it: the server
    /// that created it keeps it in its data directory (`registration_token`); others
    /// know only its digest and answer `None`.
    pub token: Option<String>,
    /// The `gantry worker` command line that joins a machine; `None` without `token`.
    pub command: Option<String>,
}

/// `POST /api/v1/workers/register`, authenticated with the cluster registration token
/// (first time) or the worker's own credential (re-registration, idempotent).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkerRegister {
    #[schema(min_length = 1, max_length = 63, pattern = r"^[a-z0-9][a-z0-9._-]*$")]
    pub name: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// `host:port` of the worker's own HTTP API (logs, model files), or
    /// `https://host:port` when it serves HTTPS.
    pub address: String,
    pub status: WorkerStatus,
}

/// The URL of `path` on a worker's own API at `address` (`host:port`: plain HTTP;
/// `https://host:port`: HTTPS).
pub fn worker_api_url(address: &str, path: &str) -> String {
    if address.starts_with("https://") {
        format!("{address}{path}")
    } else {
        format!("http://{address}{path}")
    }
}

impl Validate for WorkerRegister {
    fn validate(&self) -> Result<(), FieldError> {
        crate::validate::check_name("name", &self.name)?;
        self.status.validate()?;
        check_labels("labels", &self.labels)?;
        let host_port = self
            .address
            .strip_prefix("https://")
            .unwrap_or(&self.address);
        if host_port.is_empty()
            || self.address.len() > 255
            || !host_port.contains(':')
            || host_port.contains('/')
        {
            return Err(FieldError::new(
                "address",
                "must be host:port, or https://host:port for an API served over HTTPS",
            ));
        }
        Ok(())
    }
}

/// The answer to a registration.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct WorkerRegistered {
    pub worker: Worker,
    /// The worker's credential (`gantryw_…`), only on first registration: store it
    /// and send it as the bearer token from then on.
    pub credential: Option<String>,
    /// What servers present when they call the worker's API; only on first
    /// registration.
    pub api_token: Option<String>,
}

impl Validate for WorkerStatus {
    fn validate(&self) -> Result<(), FieldError> {
        if self.gpus.len() > 1024 {
            return Err(FieldError::new("gpus", "at most 1024 devices"));
        }
        for (i, gpu) in self.gpus.iter().enumerate() {
            crate::validate::check_text(&format!("gpus[{i}].name"), &gpu.name, 256)?;
            crate::validate::check_text(&format!("gpus[{i}].uuid"), &gpu.uuid, 256)?;
        }
        if self.backends.len() > 64 {
            return Err(FieldError::new("backends", "at most 64 backends"));
        }
        if self.installed_backends.len() > 1024 {
            return Err(FieldError::new(
                "installed_backends",
                "at most 1024 installed versions",
            ));
        }
        for (i, installed) in self.installed_backends.iter().enumerate() {
            crate::validate::check_text(
                &format!("installed_backends[{i}].name"),
                &installed.name,
                63,
            )?;
            crate::backend::check_version(
                &format!("installed_backends[{i}].version"),
                &installed.version,
            )?;
            crate::validate::check_text(
                &format!("installed_backends[{i}].variant"),
                &installed.variant,
                32,
            )?;
        }
        if self.found_backends.len() > 64 {
            return Err(FieldError::new("found_backends", "at most 64 backends"));
        }
        for (i, found) in self.found_backends.iter().enumerate() {
            crate::validate::check_text(&format!("found_backends[{i}].name"), &found.name, 63)?;
            crate::validate::check_text(
                &format!("found_backends[{i}].program"),
                &found.program,
                4096,
            )?;
        }
        crate::validate::check_text("system.hostname", &self.system.hostname, 256)?;
        crate::validate::check_text("system.os", &self.system.os, 256)
    }
}
