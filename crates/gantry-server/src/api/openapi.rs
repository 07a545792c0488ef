//! The OpenAPI document, generated from the handlers' annotations, and a `/docs` page
//! that renders it without loading anything from the internet.

use axum::response::Html;
use axum::Json;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use super::{
    agent, api_keys, auth, backends, coordinator, health, instances, model_files, models, uploads,
    usage, users, workers,
};

/// The management API's description.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "gantry",
        description = "Cluster manager for serving AI models on GPUs: management API. \
            Authenticate with `Authorization: Bearer <token>`, where the token is an API key \
            (`gantry_…`) or a session token from `POST /auth/login`. Errors are \
            `{\"error\": {\"code\", \"message\"}}`. List endpoints take `page`, `per_page` and \
            `watch=true` (an NDJSON stream of CREATED/UPDATED/DELETED events with a HEARTBEAT \
            line every 15 s)."
    ),
    paths(
        health::healthz, health::readyz,
        auth::login, auth::logout, auth::change_password, auth::me,
        users::list, users::create, users::get, users::update, users::delete,
        api_keys::list, api_keys::create, api_keys::get, api_keys::delete,
        backends::list, backends::create, backends::get, backends::update, backends::delete,
        workers::list, workers::get, workers::delete, workers::set_labels,
        models::list, models::create, models::estimate, models::get, models::update,
        models::delete,
        instances::list, instances::get, instances::update, instances::delete, instances::logs,
        model_files::list, model_files::delete,
        uploads::create, uploads::list, uploads::get, uploads::append, uploads::delete,
        uploads::content, uploads::staged,
        agent::register, agent::heartbeat, agent::status, agent::assignments,
        agent::report_state, agent::goodbye, agent::servers,
        coordinator::servers, coordinator::register, coordinator::unregister,
        coordinator::heartbeat, coordinator::cluster, coordinator::acquire_lock,
        coordinator::release_lock, coordinator::locks, coordinator::health,
        usage::report,
        gantry_gateway::list_models, gantry_gateway::chat_completions,
        gantry_gateway::completions, gantry_gateway::embeddings,
        gantry_gateway::prometheus_metrics,
    ),
    components(schemas(
        gantry_types::ErrorBody,
        gantry_types::ErrorCode,
        gantry_types::WatchEvent<gantry_types::ModelInstance>,
    )),
    modifiers(&BearerAuth),
    tags(
        (name = "health", description = "Probes"),
        (name = "auth", description = "Sessions and passwords"),
        (name = "users", description = "Users (admin)"),
        (name = "api-keys", description = "API keys"),
        (name = "workers", description = "GPU nodes (admin)"),
        (name = "coordinator", description = "Servers, the leader and distributed locks (admin)"),
        (name = "inference-backends", description = "Inference backends: built-in and custom, their versions and installs"),
        (name = "models", description = "Models: the desired state"),
        (name = "model-instances", description = "Replicas: the observed state"),
        (name = "model-files", description = "Files in the workers' model caches (admin)"),
        (name = "worker-agent", description = "Called by worker agents with their credential"),
        (name = "usage", description = "Requests and tokens served by the gateway"),
        (name = "gateway", description = "OpenAI-compatible endpoints (errors in OpenAI's shape) and Prometheus metrics"),
    )
)]
pub struct ApiDoc;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// `GET /api/openapi.json`.
pub async fn spec() -> Json<utoipa::openapi::OpenApi> {
    Json(ApiDoc::openapi())
}

/// `GET /docs`: a small self-contained page listing every operation with its
/// parameters, request body and responses, read from `/api/openapi.json`.
pub async fn docs() -> Html<&'static str> {
    Html(DOCS_PAGE)
}

const DOCS_PAGE: &str = r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>gantry API</title>
<style>
body{font:14px/1.5 system-ui,sans-serif;max-width:980px;margin:2em auto;padding:0 1em;color:#222}
h1{margin-bottom:0}.op{border:1px solid #ddd;border-radius:6px;margin:.6em 0;padding:.5em .8em}
.m{display:inline-block;min-width:4.5em;font-weight:600;text-transform:uppercase}
.get{color:#0a6}.post{color:#06c}.patch{color:#a60}.put{color:#a60}.delete{color:#c22}
code,pre{background:#f5f5f5;border-radius:4px;padding:0 .3em}pre{padding:.5em;overflow:auto}
details summary{cursor:pointer}.tag{margin-top:1.5em;border-bottom:2px solid #eee}
</style></head><body>
<h1>gantry API</h1><p id="desc"></p>
<p>Machine-readable spec: <a href="/api/openapi.json">/api/openapi.json</a></p>
<div id="ops">Loading…</div>
<script>
function ref(spec, s){ if(!s) return s; if(s.$ref){ return spec.components.schemas[s.$ref.split('/').pop()] || s } return s }
function show(spec, s, depth){ s = ref(spec, s); if(!s || depth > 3) return ''; return JSON.stringify(s, null, 1) }
fetch('/api/openapi.json').then(r => r.json()).then(spec => {
  document.getElementById('desc').textContent = spec.info.description || '';
  const byTag = {};
  for (const [path, item] of Object.entries(spec.paths)) for (const [method, op] of Object.entries(item)) {
    const tag = (op.tags && op.tags[0]) || 'other'; (byTag[tag] = byTag[tag] || []).push([method, path, op]);
  }
  const out = document.getElementById('ops'); out.textContent = '';
  for (const [tag, ops] of Object.entries(byTag)) {
    const h = document.createElement('h2'); h.className = 'tag'; h.textContent = tag; out.appendChild(h);
    for (const [method, path, op] of ops) {
      const d = document.createElement('details'); d.className = 'op';
      const s = document.createElement('summary');
      s.innerHTML = '<span class="m ' + method + '"></span> <code></code> ';
      s.children[0].textContent = method; s.children[1].textContent = path;
      s.appendChild(document.createTextNode(' ' + (op.summary || op.description || '')));
      d.appendChild(s);
      const body = document.createElement('div');
      const params = (op.parameters || []).map(p => p.name + ' (' + p.in + ')').join(', ');
      if (params) { const p = document.createElement('p'); p.textContent = 'Parameters: ' + params; body.appendChild(p) }
      const rb = op.requestBody && op.requestBody.content && op.requestBody.content['application/json'];
      if (rb) { const pre = document.createElement('pre'); pre.textContent = 'Body: ' + show(spec, rb.schema, 0); body.appendChild(pre) }
      const codes = Object.keys(op.responses || {}).join(', ');
      const p = document.createElement('p'); p.textContent = 'Responses: ' + codes; body.appendChild(p);
      d.appendChild(body); out.appendChild(d);
    }
  }
}).catch(e => { document.getElementById('ops').textContent = 'Could not load the spec: ' + e });
</script></body></html>"#;

#[cfg(test)]
mod tests {
    use gantry_types::ErrorCode;

    use super::*;

    #[test]
    fn the_spec_lists_every_error_code() {
        let spec = serde_json::to_value(ApiDoc::openapi()).expect("serialisable");
        let listed: Vec<&str> = spec["components"]["schemas"]["ErrorCode"]["enum"]
            .as_array()
            .expect("ErrorCode is an enum schema")
            .iter()
            .filter_map(|v| v.as_str())
            .collect();
        let all: Vec<&str> = ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(listed, all);
        assert_eq!(
            spec["components"]["schemas"]["ErrorDetail"]["properties"]["code"]["$ref"],
            "#/components/schemas/ErrorCode"
        );
    }
}
