//! Worker pools: machines a cluster creates and deletes through a provider — a cloud
//! (DigitalOcean), a command of yours (`exec`), or `gantry worker` processes on the
//! server's own machine (`local`) — between `min` and `max`, growing when pending replicas
//! fit nowhere but would fit a new machine and shrinking when a machine has hosted nothing
//! for a while.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::time::Timestamp;
use crate::units::{format_duration, parse_duration, parse_size};
use crate::validate::{check_labels, check_name, FieldError, Validate};
use crate::worker::WorkerState;

/// Where a pool's machines come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum PoolProvider {
    /// Droplets made through DigitalOcean's v2 API.
    Digitalocean,
    /// A command you give, run once per machine to create, find or delete it.
    Exec,
    /// `gantry worker` processes with simulated GPUs on the server's own machine, for
    /// trying pools on one machine.
    Local,
}

impl PoolProvider {
    pub fn as_str(self) -> &'static str {
        match self {
            PoolProvider::Digitalocean => "digitalocean",
            PoolProvider::Exec => "exec",
            PoolProvider::Local => "local",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "digitalocean" => Some(PoolProvider::Digitalocean),
            "exec" => Some(PoolProvider::Exec),
            "local" => Some(PoolProvider::Local),
            _ => None,
        }
    }
}

/// The longest pool name: a machine is named `<pool>-<n>`, and worker names are at most
/// 63 characters.
pub const MAX_POOL_NAME: usize = 40;
/// How long a machine may host nothing before it is deleted, unless the pool says.
pub const DEFAULT_SCALE_DOWN_AFTER: Duration = Duration::from_secs(600);
/// The most machines one pool may hold.
pub const MAX_POOL_MACHINES: u32 = 1000;
/// The most machines a `local` pool may hold: each is a process on the server's machine.
pub const MAX_LOCAL_MACHINES: u32 = 8;

/// What each machine of a pool has, as the scheduler counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct MachineShape {
    pub gpu_count: u32,
    pub gpu_memory_bytes: u64,
    /// System memory; 0 when the pool does not say (the scheduler then counts none
    /// against it).
    pub memory_bytes: u64,
}

impl MachineShape {
    /// Parses `gpus` (`COUNTxMEMORY`, such as `8x80GiB`) and `memory` (a size).
    pub fn parse(gpus: &str, memory: Option<&str>) -> Result<Self, FieldError> {
        let (count, per_gpu) = gpus.split_once(['x', 'X']).ok_or_else(|| {
            FieldError::new("gpus", "must be COUNTxMEMORY, such as 1x80GiB or 8x80GiB")
        })?;
        let gpu_count: u32 = count
            .trim()
            .parse()
            .ok()
            .filter(|n| (1..=64).contains(n))
            .ok_or_else(|| FieldError::new("gpus", "the GPU count must be between 1 and 64"))?;
        let gpu_memory_bytes = parse_size(per_gpu)
            .ok()
            .filter(|bytes| *bytes > 0)
            .ok_or_else(|| {
                FieldError::new(
                    "gpus",
                    format!("{per_gpu:?} is not a memory size such as 80GiB"),
                )
            })?;
        let memory_bytes = match memory {
            Some(text) => parse_size(text).map_err(|e| FieldError::new("memory", e.to_string()))?,
            None => 0,
        };
        Ok(Self {
            gpu_count,
            gpu_memory_bytes,
            memory_bytes,
        })
    }
}

/// A machine's place in its life, before its worker takes over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum MachineState {
    /// Being created by the provider (or waiting to be tried again after a failure; the
    /// message says what the provider answered).
    Provisioning,
    /// Created; its worker has not registered yet.
    Initializing,
    /// Its worker registered: see `worker_state`.
    Registered,
    /// Being deleted by the provider.
    Deleting,
}

impl MachineState {
    pub fn as_str(self) -> &'static str {
        match self {
            MachineState::Provisioning => "provisioning",
            MachineState::Initializing => "initializing",
            MachineState::Registered => "registered",
            MachineState::Deleting => "deleting",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "provisioning" => Some(MachineState::Provisioning),
            "initializing" => Some(MachineState::Initializing),
            "registered" => Some(MachineState::Registered),
            "deleting" => Some(MachineState::Deleting),
            _ => None,
        }
    }
}

/// One machine of a pool.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct PoolMachine {
    pub id: i64,
    pub pool_id: i64,
    /// `<pool>-<n>`: the name it has at the provider and the name its worker registers
    /// with, fixed before it is created, so a machine is found again rather than made
    /// twice.
    pub name: String,
    pub state: MachineState,
    pub state_message: String,
    /// The provider's id of it, once created.
    pub external_id: Option<String>,
    /// Its address, when the provider says.
    pub address: Option<String>,
    pub worker_id: Option<i64>,
    /// The worker's own state, once registered.
    pub worker_state: Option<WorkerState>,
    /// Since when its worker has hosted no instance; `None` while it hosts some.
    pub idle_since: Option<Timestamp>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

/// A pool as the API shows it: never its credentials.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct WorkerPool {
    pub id: i64,
    pub cluster_id: i64,
    pub name: String,
    pub provider: PoolProvider,
    /// The provider's machine type (a DigitalOcean size slug such as
    /// `gpu-h100x1-80gb`); handed to an `exec` command as it is.
    pub instance_type: String,
    /// The provider's image (a DigitalOcean image slug); handed to `exec` as it is.
    pub image: String,
    /// The provider's region or zone.
    pub region: String,
    /// What each machine has, `8x80GiB` style, and its memory: what the scheduler
    /// counts to decide whether a new machine would fit a pending replica.
    pub gpus: String,
    pub memory: Option<String>,
    /// Labels every machine's worker carries (besides `gantry.dev/pool=<name>`).
    pub labels: BTreeMap<String, String>,
    pub min: u32,
    pub max: u32,
    /// How long a machine may host nothing before it is drained and deleted (down to
    /// `min`), such as `10m`.
    pub scale_down_after: String,
    /// For `exec`: the command (split like a shell would, run without one), whose
    /// program is the name of an executable in the servers' `pool_commands_dir`.
    pub command: Option<String>,
    /// For `digitalocean`: the API's base URL.
    pub api_url: Option<String>,
    pub has_credentials: bool,
    /// Deleted, and deleting its machines; the pool goes once they are gone.
    pub deleting: bool,
    pub machines: Vec<PoolMachine>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

/// One decision of a pool, with its reason.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq)]
pub struct PoolEvent {
    pub id: i64,
    pub pool_id: i64,
    pub at: Timestamp,
    /// `scale_up`, `scale_down`, `created`, `deleted`, `failed`, `registered`, `waiting`.
    pub kind: String,
    pub message: String,
}

/// `POST /api/v1/clusters/{id}/worker-pools`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkerPoolCreate {
    #[schema(min_length = 1, max_length = 40, pattern = r"^[a-z0-9][a-z0-9._-]*$")]
    pub name: String,
    pub provider: PoolProvider,
    #[serde(default)]
    #[schema(max_length = 200)]
    pub instance_type: String,
    #[serde(default)]
    #[schema(max_length = 200)]
    pub image: String,
    #[serde(default)]
    #[schema(max_length = 100)]
    pub region: String,
    #[schema(min_length = 3, max_length = 40)]
    pub gpus: String,
    #[serde(
        default,
        deserialize_with = "crate::validate::not_null",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(nullable = false, max_length = 40)]
    pub memory: Option<String>,
    #[serde(default)]
    #[schema(schema_with = crate::validate::labels_schema)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    #[schema(maximum = 1000)]
    pub min: u32,
    #[schema(minimum = 1, maximum = 1000)]
    pub max: u32,
    #[serde(
        default,
        deserialize_with = "crate::validate::not_null",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(nullable = false, max_length = 40)]
    pub scale_down_after: Option<String>,
    #[serde(
        default,
        deserialize_with = "crate::validate::not_null",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(nullable = false, min_length = 1, max_length = 2000)]
    pub command: Option<String>,
    #[serde(
        default,
        deserialize_with = "crate::validate::not_null",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(nullable = false, min_length = 1, max_length = 2000)]
    pub api_url: Option<String>,
    /// Write-only: DigitalOcean's API token; for `exec`, handed to the command as
    /// `GANTRY_POOL_CREDENTIALS`. Stored sealed, never shown.
    #[serde(
        default,
        deserialize_with = "crate::validate::not_null",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(nullable = false, min_length = 1, max_length = 4096)]
    pub credentials: Option<String>,
}

impl WorkerPoolCreate {
    /// A pool of up to `max` machines with `gpus` each, `min` 0, every other setting
    /// empty or the default.
    pub fn new(name: &str, provider: PoolProvider, gpus: &str, max: u32) -> Self {
        Self {
            name: name.to_owned(),
            provider,
            instance_type: String::new(),
            image: String::new(),
            region: String::new(),
            gpus: gpus.to_owned(),
            memory: None,
            labels: BTreeMap::new(),
            min: 0,
            max,
            scale_down_after: None,
            command: None,
            api_url: None,
            credentials: None,
        }
    }
}

/// `PATCH /api/v1/clusters/{id}/worker-pools/{pool}`: the bounds, labels, idle time and
/// credentials; absent fields stay.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkerPoolUpdate {
    #[serde(
        default,
        deserialize_with = "crate::validate::not_null",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(nullable = false, maximum = 1000)]
    pub min: Option<u32>,
    #[serde(
        default,
        deserialize_with = "crate::validate::not_null",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(nullable = false, minimum = 1, maximum = 1000)]
    pub max: Option<u32>,
    #[serde(
        default,
        deserialize_with = "crate::validate::not_null",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(nullable = false)]
    pub labels: Option<BTreeMap<String, String>>,
    #[serde(
        default,
        deserialize_with = "crate::validate::not_null",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(nullable = false, max_length = 40)]
    pub scale_down_after: Option<String>,
    #[serde(
        default,
        deserialize_with = "crate::validate::not_null",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(nullable = false, min_length = 1, max_length = 4096)]
    pub credentials: Option<String>,
}

/// `scale_down_after`: a duration of at least 10 s.
pub fn check_scale_down_after(text: &str) -> Result<Duration, FieldError> {
    let duration =
        parse_duration(text).map_err(|e| FieldError::new("scale_down_after", e.to_string()))?;
    if duration < Duration::from_secs(10) {
        return Err(FieldError::new(
            "scale_down_after",
            "must be at least 10s, so a machine is not deleted between two placements",
        ));
    }
    Ok(duration)
}

/// The default idle time, as the API writes it.
pub fn default_scale_down_after() -> String {
    format_duration(DEFAULT_SCALE_DOWN_AFTER)
}

fn check_bounds(provider: PoolProvider, min: u32, max: u32) -> Result<(), FieldError> {
    if max == 0 || max > MAX_POOL_MACHINES {
        return Err(FieldError::new(
            "max",
            format!("must be between 1 and {MAX_POOL_MACHINES}"),
        ));
    }
    if provider == PoolProvider::Local && max > MAX_LOCAL_MACHINES {
        return Err(FieldError::new(
            "max",
            format!(
                "a local pool runs its machines as processes on the server's own machine: \
                 at most {MAX_LOCAL_MACHINES}"
            ),
        ));
    }
    if min > max {
        return Err(FieldError::new(
            "min",
            format!("must be at most max ({max})"),
        ));
    }
    Ok(())
}

impl Validate for WorkerPoolCreate {
    fn validate(&self) -> Result<(), FieldError> {
        check_name("name", &self.name)?;
        if self.name.len() > MAX_POOL_NAME {
            return Err(FieldError::new(
                "name",
                format!(
                    "must be at most {MAX_POOL_NAME} characters: machines are named \
                     <pool>-<n> and worker names are at most 63"
                ),
            ));
        }
        for (field, value, max) in [
            ("instance_type", &self.instance_type, 200),
            ("image", &self.image, 200),
            ("region", &self.region, 100),
        ] {
            if value.len() > max || value.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(FieldError::new(
                    field,
                    format!("must be at most {max} characters, without spaces"),
                ));
            }
        }
        MachineShape::parse(&self.gpus, self.memory.as_deref())?;
        check_labels("labels", &self.labels)?;
        check_bounds(self.provider, self.min, self.max)?;
        if let Some(text) = &self.scale_down_after {
            check_scale_down_after(text)?;
        }
        match self.provider {
            PoolProvider::Exec if self.command.is_none() => {
                return Err(FieldError::new(
                    "command",
                    "an exec pool needs the command that creates, finds and deletes a machine",
                ))
            }
            PoolProvider::Digitalocean => {
                for (field, value) in [
                    ("instance_type", &self.instance_type),
                    ("image", &self.image),
                    ("region", &self.region),
                ] {
                    if value.is_empty() {
                        return Err(FieldError::new(
                            field,
                            "a digitalocean pool needs the droplet's size (instance_type), \
                             image and region",
                        ));
                    }
                }
                if self.credentials.is_none() {
                    return Err(FieldError::new(
                        "credentials",
                        "a digitalocean pool needs an API token (a personal access token \
                         with droplet and ssh_key scopes)",
                    ));
                }
            }
            _ => {}
        }
        if self.command.is_some() && self.provider != PoolProvider::Exec {
            return Err(FieldError::new(
                "command",
                "only an exec pool takes a command",
            ));
        }
        if let Some(url) = &self.api_url {
            if self.provider != PoolProvider::Digitalocean {
                return Err(FieldError::new(
                    "api_url",
                    "only a digitalocean pool takes an api_url",
                ));
            }
            crate::route::check_base_url("api_url", url)?;
        }
        if let Some(command) = &self.command {
            if command.trim().is_empty() || command.chars().any(|c| c.is_control()) {
                return Err(FieldError::new(
                    "command",
                    "must be a command line without control characters",
                ));
            }
            let program = command.split_whitespace().next().unwrap_or_default();
            if program.contains('/') || program.starts_with('.') {
                return Err(FieldError::new(
                    "command",
                    "its program must be the name of an executable in the servers' \
                     pool_commands_dir (no path): only programs put there run, so the API \
                     cannot run arbitrary commands on a server",
                ));
            }
        }
        Ok(())
    }
}

impl WorkerPoolUpdate {
    /// Checks the update against the pool it changes (the bounds together).
    pub fn validate_for(&self, pool: &WorkerPool) -> Result<(), FieldError> {
        check_bounds(
            pool.provider,
            self.min.unwrap_or(pool.min),
            self.max.unwrap_or(pool.max),
        )?;
        if let Some(labels) = &self.labels {
            check_labels("labels", labels)?;
        }
        if let Some(text) = &self.scale_down_after {
            check_scale_down_after(text)?;
        }
        Ok(())
    }
}

impl Validate for WorkerPoolUpdate {
    fn validate(&self) -> Result<(), FieldError> {
        if let (Some(min), Some(max)) = (self.min, self.max) {
            check_bounds(PoolProvider::Exec, min, max)?;
        }
        if let Some(labels) = &self.labels {
            check_labels("labels", labels)?;
        }
        if let Some(text) = &self.scale_down_after {
            check_scale_down_after(text)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn create(provider: PoolProvider) -> WorkerPoolCreate {
        WorkerPoolCreate {
            name: "h100".into(),
            provider,
            instance_type: "gpu-h100x1-80gb".into(),
            image: "gpu-h100x1-base".into(),
            region: "nyc2".into(),
            gpus: "1x80GiB".into(),
            memory: Some("240GiB".into()),
            labels: BTreeMap::new(),
            min: 0,
            max: 3,
            scale_down_after: None,
            command: None,
            api_url: None,
            credentials: Some("dop_v1_x".into()),
        }
    }

    #[test]
    fn a_shape_reads_count_and_sizes() {
        let shape = MachineShape::parse("8x80GiB", Some("1TiB")).unwrap();
        assert_eq!(shape.gpu_count, 8);
        assert_eq!(shape.gpu_memory_bytes, 80 << 30);
        assert_eq!(shape.memory_bytes, 1 << 40);
        assert_eq!(
            MachineShape::parse("80GiB", None).unwrap_err().field,
            "gpus"
        );
        assert_eq!(
            MachineShape::parse("0x80GiB", None).unwrap_err().field,
            "gpus"
        );
        assert_eq!(
            MachineShape::parse("1x80GiB", Some("lots"))
                .unwrap_err()
                .field,
            "memory"
        );
    }

    #[test]
    fn each_provider_needs_what_it_uses() {
        assert!(create(PoolProvider::Digitalocean).validate().is_ok());
        let no_token = WorkerPoolCreate {
            credentials: None,
            ..create(PoolProvider::Digitalocean)
        };
        assert_eq!(no_token.validate().unwrap_err().field, "credentials");
        assert_eq!(
            create(PoolProvider::Exec).validate().unwrap_err().field,
            "command"
        );
        let local = WorkerPoolCreate {
            command: Some("x".into()),
            ..create(PoolProvider::Local)
        };
        assert_eq!(local.validate().unwrap_err().field, "command");
        let bounds = WorkerPoolCreate {
            min: 4,
            ..create(PoolProvider::Local)
        };
        assert_eq!(bounds.validate().unwrap_err().field, "min");
        let quick = WorkerPoolCreate {
            scale_down_after: Some("1s".into()),
            ..create(PoolProvider::Local)
        };
        assert_eq!(quick.validate().unwrap_err().field, "scale_down_after");
        let long = WorkerPoolCreate {
            name: "a".repeat(41),
            ..create(PoolProvider::Local)
        };
        assert_eq!(long.validate().unwrap_err().field, "name");
    }
}
