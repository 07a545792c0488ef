//! The model catalog (`GET /api/v1/model-catalog`): well-known models with where their
//! weights come from, the backend that runs them and arguments that suit them, to deploy
//! without typing a path. Built into the server, or read from `model_catalog_file`.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::backend::BackendName;
use crate::model::{ModelCreate, ModelSource};
use crate::validate::{check_text, FieldError, Validate};

/// One model of the catalog.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CatalogEntry {
    /// The name a deployed model gets by default (a model name: lowercase, digits, `-._`).
    pub name: String,
    /// How people call it: "Llama 3.2 1B Instruct (Q4_K_M)".
    pub title: String,
    #[serde(default)]
    pub description: String,
    /// `chat`, `embedding`, `small`, …
    #[serde(default)]
    pub tags: Vec<String>,
    /// Its parameter count, as people say it: "1.2B".
    #[serde(default)]
    pub parameters: String,
    /// About how big its files are ("0.8 GB"); the estimate reads the real size.
    #[serde(default)]
    pub size: String,
    pub source: ModelSource,
    pub backend: BackendName,
    #[serde(default)]
    pub backend_args: Vec<String>,
}

impl CatalogEntry {
    /// The model this entry deploys, with one replica.
    pub fn model(&self) -> ModelCreate {
        ModelCreate {
            name: self.name.clone(),
            description: self.description.clone(),
            cluster_id: None,
            source: self.source.clone(),
            backend: self.backend.clone(),
            backend_version: None,
            backend_args: self.backend_args.clone(),
            env: Default::default(),
            replicas: 1,
            worker_selector: Default::default(),
            gpu_selector: None,
            placement_strategy: Default::default(),
            data_parallel_size: None,
            cpu_offload: true,
            custom_command: None,
            labels: Default::default(),
        }
    }
}

impl Validate for CatalogEntry {
    fn validate(&self) -> Result<(), FieldError> {
        check_text("title", &self.title, 200)?;
        check_text("parameters", &self.parameters, 40)?;
        check_text("size", &self.size, 40)?;
        for tag in &self.tags {
            check_text("tags", tag, 40)?;
        }
        self.model().validate()
    }
}

/// The catalog, in its file's order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ModelCatalog {
    pub items: Vec<CatalogEntry>,
}
