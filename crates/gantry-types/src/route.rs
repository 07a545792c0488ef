//! Model providers and model routes: the names a client sends to the gateway.
//!
//! A **provider** is an external OpenAI-compatible endpoint (a hosted API, another
//! gantry, a vLLM someone else runs). Its API key is write-only: stored sealed with a key
//! derived from the server secret, sent to the provider, never shown again.
//!
//! A **route** is a public model name with an ordered list of targets, each a model
//! deployed on this cluster or a provider's model. The gateway sends a request to the
//! targets of the lowest `priority` number that are available, split by `weight`, and
//! falls through to the next when one cannot answer. A deployed model with no route of
//! its name is its own route.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::time::Timestamp;
use crate::validate::{check_name, check_text, FieldError, Validate};

/// Default time a provider has to send its response head.
pub const DEFAULT_PROVIDER_TIMEOUT_SECONDS: u64 = 120;
/// Most targets one route may have.
pub const MAX_ROUTE_TARGETS: usize = 32;
/// Largest weight of one target.
pub const MAX_TARGET_WEIGHT: u32 = 10_000;
/// Largest priority number.
pub const MAX_TARGET_PRIORITY: u32 = 100;

/// An external OpenAI-compatible endpoint, as listed. The API key is never shown:
/// `has_api_key` says whether one is set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ModelProvider {
    pub id: i64,
    pub name: String,
    pub description: String,
    /// Where the OpenAI API is, up to and including its version: requests go to
    /// `{base_url}/chat/completions`, `{base_url}/models`, ….
    pub base_url: String,
    /// Whether an API key is set (sent as `Authorization: Bearer …`).
    pub has_api_key: bool,
    /// Extra request headers sent to the provider. Not secret: keep credentials in
    /// `api_key`.
    pub headers: BTreeMap<String, String>,
    /// How long the provider has to send its response head before the request falls
    /// through to the route's next target.
    pub timeout_seconds: u64,
    /// The model ids the provider offers; empty means any (find them with
    /// `GET /api/v1/model-providers/{name}/models`, which asks the provider).
    pub models: Vec<String>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

/// `POST /api/v1/model-providers`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelProviderCreate {
    #[schema(min_length = 1, max_length = 63, pattern = r"^[a-z0-9][a-z0-9._-]*$")]
    pub name: String,
    #[serde(default)]
    #[schema(max_length = 500, pattern = r"^[^\x00-\x08\x0B-\x1F\x7F-\x9F]*$")]
    pub description: String,
    /// `http://` or `https://`, with the API's version path (`https://api.openai.com/v1`).
    #[schema(min_length = 1, max_length = 2000)]
    pub base_url: String,
    /// Write-only.
    #[serde(
        default,
        deserialize_with = "crate::validate::not_null",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(nullable = false, max_length = 4096)]
    pub api_key: Option<String>,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    #[serde(default = "default_timeout", deserialize_with = "timeout_not_null")]
    #[schema(minimum = 1, maximum = 3600)]
    pub timeout_seconds: u64,
    #[serde(default)]
    pub models: Vec<String>,
}

fn default_timeout() -> u64 {
    DEFAULT_PROVIDER_TIMEOUT_SECONDS
}

fn timeout_not_null<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
    u64::deserialize(deserializer)
}

/// `PATCH /api/v1/model-providers/{name}`: absent fields stay as they are. `api_key:
/// null` removes the key.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelProviderUpdate {
    #[serde(
        default,
        deserialize_with = "crate::validate::not_null",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(
        nullable = false,
        max_length = 500,
        pattern = r"^[^\x00-\x08\x0B-\x1F\x7F-\x9F]*$"
    )]
    pub description: Option<String>,
    #[serde(
        default,
        deserialize_with = "crate::validate::not_null",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(nullable = false, min_length = 1, max_length = 2000)]
    pub base_url: Option<String>,
    #[serde(
        default,
        with = "crate::model::double_option",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<String>, max_length = 4096)]
    pub api_key: Option<Option<String>>,
    #[serde(
        default,
        deserialize_with = "crate::validate::not_null",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(nullable = false)]
    pub headers: Option<BTreeMap<String, String>>,
    #[serde(
        default,
        deserialize_with = "crate::validate::not_null",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(nullable = false, minimum = 1, maximum = 3600)]
    pub timeout_seconds: Option<u64>,
    #[serde(
        default,
        deserialize_with = "crate::validate::not_null",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(nullable = false)]
    pub models: Option<Vec<String>>,
}

/// What `GET /api/v1/model-providers/{name}/models` found at the provider.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ProviderModels {
    pub provider: String,
    /// The ids the provider's `GET /models` lists.
    pub models: Vec<String>,
}

/// Checks a base URL: `http(s)://host[:port][/path]`, no query, fragment or user info.
pub fn check_base_url(field: &str, url: &str) -> Result<(), FieldError> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))
        .ok_or_else(|| FieldError::new(field, "must start with http:// or https://"))?;
    if url.len() > 2000 {
        return Err(FieldError::new(
            field,
            "must be at most 2000 characters long",
        ));
    }
    let host = rest.split('/').next().unwrap_or_default();
    if host.is_empty() {
        return Err(FieldError::new(field, "has no host"));
    }
    if host.contains('@') {
        return Err(FieldError::new(
            field,
            "must not hold credentials; give the key as api_key",
        ));
    }
    if url.contains(['?', '#']) || url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(FieldError::new(
            field,
            "must be a plain URL: no query, fragment, spaces or control characters",
        ));
    }
    if let Some((_, port)) = host.rsplit_once(':') {
        if !host.ends_with(']') && port.parse::<u16>().map_or(true, |p| p == 0) {
            return Err(FieldError::new(field, format!("has a bad port {port:?}")));
        }
    }
    Ok(())
}

/// Header names gantry sets itself (or that would break the proxying): not accepted
/// as a provider's extra headers.
const RESERVED_HEADERS: &[&str] = &[
    "authorization",
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "upgrade",
    "te",
    "trailer",
    "proxy-authorization",
    "proxy-connection",
    "expect",
    "cookie",
];

fn check_headers(field: &str, headers: &BTreeMap<String, String>) -> Result<(), FieldError> {
    if headers.len() > 32 {
        return Err(FieldError::new(field, "may hold at most 32 headers"));
    }
    for (name, value) in headers {
        let token = !name.is_empty()
            && name.len() <= 100
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
        if !token {
            return Err(FieldError::new(
                format!("{field}.{name}"),
                "is not a valid header name",
            ));
        }
        if RESERVED_HEADERS.contains(&name.to_ascii_lowercase().as_str()) {
            return Err(FieldError::new(
                format!("{field}.{name}"),
                "is set by gantry; give the provider's key as api_key",
            ));
        }
        if value.len() > 4096 || value.bytes().any(|b| b < 0x20 && b != b'\t' || b == 0x7f) {
            return Err(FieldError::new(
                format!("{field}.{name}"),
                "must be at most 4096 characters with no control characters",
            ));
        }
    }
    Ok(())
}

fn check_api_key(field: &str, key: &str) -> Result<(), FieldError> {
    if key.is_empty() || key.len() > 4096 {
        return Err(FieldError::new(field, "must be 1 to 4096 characters long"));
    }
    if !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(FieldError::new(
            field,
            "must be printable ASCII with no spaces",
        ));
    }
    Ok(())
}

fn check_timeout(field: &str, seconds: u64) -> Result<(), FieldError> {
    if !(1..=3600).contains(&seconds) {
        return Err(FieldError::new(field, "must be between 1 and 3600"));
    }
    Ok(())
}

/// A provider's model id: what its API calls the model (`gpt-4o-mini`,
/// `meta-llama/Llama-3.1-8B-Instruct`).
pub fn check_provider_model(field: &str, model: &str) -> Result<(), FieldError> {
    if model.is_empty() || model.len() > 200 {
        return Err(FieldError::new(field, "must be 1 to 200 characters long"));
    }
    if model.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(FieldError::new(
            field,
            "must not contain spaces or control characters",
        ));
    }
    Ok(())
}

fn check_models(field: &str, models: &[String]) -> Result<(), FieldError> {
    if models.len() > 1000 {
        return Err(FieldError::new(field, "may list at most 1000 models"));
    }
    for (i, model) in models.iter().enumerate() {
        check_provider_model(&format!("{field}[{i}]"), model)?;
    }
    Ok(())
}

impl Validate for ModelProviderCreate {
    fn validate(&self) -> Result<(), FieldError> {
        check_name("name", &self.name)?;
        check_text("description", &self.description, 500)?;
        check_base_url("base_url", &self.base_url)?;
        if let Some(key) = &self.api_key {
            check_api_key("api_key", key)?;
        }
        check_headers("headers", &self.headers)?;
        check_timeout("timeout_seconds", self.timeout_seconds)?;
        check_models("models", &self.models)
    }
}

impl Validate for ModelProviderUpdate {
    fn validate(&self) -> Result<(), FieldError> {
        if let Some(description) = &self.description {
            check_text("description", description, 500)?;
        }
        if let Some(url) = &self.base_url {
            check_base_url("base_url", url)?;
        }
        if let Some(Some(key)) = &self.api_key {
            check_api_key("api_key", key)?;
        }
        if let Some(headers) = &self.headers {
            check_headers("headers", headers)?;
        }
        if let Some(timeout) = self.timeout_seconds {
            check_timeout("timeout_seconds", timeout)?;
        }
        if let Some(models) = &self.models {
            check_models("models", models)?;
        }
        Ok(())
    }
}

/// One target of a route: a deployed model (no `provider`) or a provider's model.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RouteTarget {
    /// The deployed model's name, or with `provider` the provider's model id.
    #[schema(min_length = 1, max_length = 200)]
    pub model: String,
    /// The provider's name; absent for a model deployed on this cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(min_length = 1, max_length = 63)]
    pub provider: Option<String>,
    /// Share of the traffic among the available targets of the same priority.
    #[serde(default = "default_weight")]
    #[schema(minimum = 0, maximum = 10000)]
    pub weight: u32,
    /// Targets with the lowest number are used first; a higher number is a fallback
    /// for when none of the lower ones is available.
    #[serde(default)]
    #[schema(minimum = 0, maximum = 100)]
    pub priority: u32,
}

fn default_weight() -> u32 {
    1
}

impl RouteTarget {
    /// How accounting, metrics and the `x-gantry-target` header name the target:
    /// the model's name, or `provider/model`.
    pub fn label(&self) -> String {
        match &self.provider {
            None => self.model.clone(),
            Some(provider) => format!("{provider}/{}", self.model),
        }
    }
}

/// A route, as listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ModelRoute {
    pub id: i64,
    /// The `model` clients send. A route may take a deployed model's name: it then
    /// replaces that model's implicit route.
    pub name: String,
    pub description: String,
    pub targets: Vec<RouteTarget>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

/// `POST /api/v1/model-routes`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelRouteCreate {
    #[schema(min_length = 1, max_length = 63, pattern = r"^[a-z0-9][a-z0-9._-]*$")]
    pub name: String,
    #[serde(default)]
    #[schema(max_length = 500, pattern = r"^[^\x00-\x08\x0B-\x1F\x7F-\x9F]*$")]
    pub description: String,
    #[schema(min_items = 1, max_items = 32)]
    pub targets: Vec<RouteTarget>,
}

/// `PATCH /api/v1/model-routes/{name}`: absent fields stay as they are; `targets`
/// replaces the whole list.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelRouteUpdate {
    #[serde(
        default,
        deserialize_with = "crate::validate::not_null",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(
        nullable = false,
        max_length = 500,
        pattern = r"^[^\x00-\x08\x0B-\x1F\x7F-\x9F]*$"
    )]
    pub description: Option<String>,
    #[serde(
        default,
        deserialize_with = "crate::validate::not_null",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(nullable = false, min_items = 1, max_items = 32)]
    pub targets: Option<Vec<RouteTarget>>,
}

fn check_targets(field: &str, targets: &[RouteTarget]) -> Result<(), FieldError> {
    if targets.is_empty() {
        return Err(FieldError::new(field, "needs at least one target"));
    }
    if targets.len() > MAX_ROUTE_TARGETS {
        return Err(FieldError::new(
            field,
            format!("may hold at most {MAX_ROUTE_TARGETS} targets"),
        ));
    }
    for (i, target) in targets.iter().enumerate() {
        let at = |name: &str| format!("{field}[{i}].{name}");
        match &target.provider {
            None => check_name(&at("model"), &target.model)?,
            Some(provider) => {
                check_name(&at("provider"), provider)?;
                check_provider_model(&at("model"), &target.model)?;
            }
        }
        if target.weight > MAX_TARGET_WEIGHT {
            return Err(FieldError::new(
                at("weight"),
                format!("must be at most {MAX_TARGET_WEIGHT}"),
            ));
        }
        if target.priority > MAX_TARGET_PRIORITY {
            return Err(FieldError::new(
                at("priority"),
                format!("must be at most {MAX_TARGET_PRIORITY}"),
            ));
        }
        if targets[..i]
            .iter()
            .any(|t| t.provider == target.provider && t.model == target.model)
        {
            return Err(FieldError::new(
                field,
                format!("lists {} twice", target.label()),
            ));
        }
    }
    let mut priorities: Vec<u32> = targets.iter().map(|t| t.priority).collect();
    priorities.sort_unstable();
    priorities.dedup();
    for priority in priorities {
        if targets
            .iter()
            .filter(|t| t.priority == priority)
            .all(|t| t.weight == 0)
        {
            return Err(FieldError::new(
                field,
                format!("every target of priority {priority} has weight 0: none would get traffic"),
            ));
        }
    }
    Ok(())
}

impl Validate for ModelRouteCreate {
    fn validate(&self) -> Result<(), FieldError> {
        check_name("name", &self.name)?;
        check_text("description", &self.description, 500)?;
        check_targets("targets", &self.targets)
    }
}

impl Validate for ModelRouteUpdate {
    fn validate(&self) -> Result<(), FieldError> {
        if let Some(description) = &self.description {
            check_text("description", description, 500)?;
        }
        if let Some(targets) = &self.targets {
            check_targets("targets", targets)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn target(json: &str) -> RouteTarget {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn a_target_defaults_to_weight_one_and_priority_zero() {
        let t = target(r#"{"model":"qwen"}"#);
        assert_eq!((t.weight, t.priority, t.provider.as_deref()), (1, 0, None));
        assert_eq!(t.label(), "qwen");
        let t = target(r#"{"model":"gpt-4o-mini","provider":"openai","weight":3}"#);
        assert_eq!(t.label(), "openai/gpt-4o-mini");
    }

    #[test]
    fn routes_name_their_bad_target() {
        let route = |targets: Vec<RouteTarget>| ModelRouteCreate {
            name: "chat".into(),
            description: String::new(),
            targets,
        };
        assert_eq!(route(vec![]).validate().unwrap_err().field, "targets");
        let bad = route(vec![
            target(r#"{"model":"qwen"}"#),
            target(r#"{"model":"x","provider":"p","weight":20000}"#),
        ]);
        assert_eq!(bad.validate().unwrap_err().field, "targets[1].weight");
        let twice = route(vec![
            target(r#"{"model":"qwen"}"#),
            target(r#"{"model":"qwen","weight":2}"#),
        ]);
        assert!(twice.validate().unwrap_err().message.contains("twice"));
        let silent = route(vec![target(r#"{"model":"qwen","weight":0}"#)]);
        assert!(silent.validate().unwrap_err().message.contains("weight 0"));
        let upper = route(vec![target(r#"{"model":"Qwen"}"#)]);
        assert_eq!(upper.validate().unwrap_err().field, "targets[0].model");
        let ok = route(vec![
            target(r#"{"model":"qwen","weight":3}"#),
            target(r#"{"model":"meta-llama/Llama-3.1-8B","provider":"hosted"}"#),
        ]);
        ok.validate().unwrap();
    }

    #[test]
    fn provider_fields_are_checked() {
        let create = |json: &str| -> ModelProviderCreate { serde_json::from_str(json).unwrap() };
        let ok =
            create(r#"{"name":"hosted","base_url":"https://api.example.com/v1","api_key":"sk-1"}"#);
        ok.validate().unwrap();
        assert_eq!(ok.timeout_seconds, DEFAULT_PROVIDER_TIMEOUT_SECONDS);
        for (json, field) in [
            (r#"{"name":"p","base_url":"ftp://x"}"#, "base_url"),
            (r#"{"name":"p","base_url":"http://u:p@x/v1"}"#, "base_url"),
            (r#"{"name":"p","base_url":"http://x:99999/v1"}"#, "base_url"),
            (r#"{"name":"p","base_url":"http://x/v1?a=1"}"#, "base_url"),
            (
                r#"{"name":"p","base_url":"http://x","api_key":"a b"}"#,
                "api_key",
            ),
            (
                r#"{"name":"p","base_url":"http://x","headers":{"Authorization":"x"}}"#,
                "headers.Authorization",
            ),
            (
                r#"{"name":"p","base_url":"http://x","headers":{"bad name":"x"}}"#,
                "headers.bad name",
            ),
            (
                r#"{"name":"p","base_url":"http://x","timeout_seconds":0}"#,
                "timeout_seconds",
            ),
            (
                r#"{"name":"p","base_url":"http://x","models":["a b"]}"#,
                "models[0]",
            ),
        ] {
            assert_eq!(create(json).validate().unwrap_err().field, field, "{json}");
        }
        assert!(serde_json::from_str::<ModelProviderCreate>(
            r#"{"name":"p","base_url":"http://x","timeout_seconds":null}"#
        )
        .is_err());
        let update: ModelProviderUpdate = serde_json::from_str(r#"{"api_key":null}"#).unwrap();
        assert_eq!(update.api_key, Some(None));
        let update: ModelProviderUpdate = serde_json::from_str("{}").unwrap();
        assert_eq!(update.api_key, None);
    }
}
