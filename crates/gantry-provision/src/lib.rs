//! Machines for worker pools. A [`Provider`] creates a machine that joins a cluster as a
//! worker, finds one by the name it was given, and deletes one; the server's pool
//! controller decides when (`gantry-server`'s `controllers/pools.rs`).
//!
//! * [`digitalocean`]: droplets through DigitalOcean's v2 API, set up by cloud-init user
//!   data ([`setup`]) that installs gantry from the server and starts the worker.
//! * [`exec`]: a command of yours that does the same for any cloud or on-premise system,
//!   with JSON on stdin and stdout.
//! * [`local`]: `gantry worker` processes with simulated GPUs on this machine.
//!
//! Every provider is idempotent by name: [`Provider::find`] answers a machine made
//! earlier (by a leader that died before it recorded it), and [`Provider::delete`] of a
//! machine already gone succeeds.

use std::collections::BTreeMap;

pub mod digitalocean;
pub mod exec;
pub mod local;
pub mod setup;
mod ssh_key;

/// What a new machine is to be and how it joins its cluster.
#[derive(Debug, Clone, serde::Serialize)]
pub struct MachineRequest {
    /// The machine's name at the provider and its worker's name.
    pub name: String,
    /// The cluster's registration token, for the worker's first start.
    pub cluster_token: String,
    /// The servers' URLs.
    pub server_urls: Vec<String>,
    pub instance_type: String,
    pub image: String,
    pub region: String,
    /// What each machine has, `8x80GiB` style (`local` simulates it).
    pub gpus: String,
    /// Labels the worker carries.
    pub labels: BTreeMap<String, String>,
}

/// A machine the provider has.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Machine {
    /// The provider's id of it.
    pub external_id: String,
    /// Its address, when the provider knows it.
    #[serde(default)]
    pub address: Option<String>,
}

/// What the provider answered when it failed, in its own words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ProviderError(pub String);

/// A pool's provider, set up with its settings and credentials.
#[derive(Debug)]
pub enum Provider {
    DigitalOcean(digitalocean::DigitalOcean),
    Exec(exec::Exec),
    Local(local::Local),
}

impl Provider {
    /// The machine named `name`, if the provider has it.
    pub async fn find(&self, name: &str) -> Result<Option<Machine>, ProviderError> {
        match self {
            Provider::DigitalOcean(p) => p.find(name).await,
            Provider::Exec(p) => p.find(name).await,
            Provider::Local(p) => p.find(name).await,
        }
    }

    /// Creates the machine `request` describes; callers look for it with [`Self::find`]
    /// first.
    pub async fn create(&self, request: &MachineRequest) -> Result<Machine, ProviderError> {
        match self {
            Provider::DigitalOcean(p) => p.create(request).await,
            Provider::Exec(p) => p.create(request).await,
            Provider::Local(p) => p.create(request).await,
        }
    }

    /// Deletes the machine `name` (with the provider's id `external_id` when known);
    /// succeeds when it is gone already.
    pub async fn delete(&self, name: &str, external_id: Option<&str>) -> Result<(), ProviderError> {
        match self {
            Provider::DigitalOcean(p) => p.delete(name, external_id).await,
            Provider::Exec(p) => p.delete(name, external_id).await,
            Provider::Local(p) => p.delete(name, external_id).await,
        }
    }
}
