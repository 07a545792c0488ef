//! The OpenAPI document, generated from the handlers' annotations, and a `/docs` page
//! that renders it without loading anything from the internet.

use axum::response::Html;
use axum::Json;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use super::{
    agent, api_keys, auth, backends, catalog, clusters, coordinator, downloads, health, instances,
    model_files, models, pools, providers, routes, uploads, usage, users, worker_backends, workers,
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
        api_keys::list, api_keys::create, api_keys::get, api_keys::update, api_keys::delete,
        backends::list, backends::create, backends::get, backends::update, backends::delete,
        clusters::list, clusters::create, clusters::get, clusters::update, clusters::delete,
        clusters::registration, clusters::rotate,
        pools::list, pools::create, pools::get, pools::update, pools::delete, pools::events,
        downloads::gantry,
        workers::list, workers::join, workers::get, workers::delete, workers::set_labels,
        workers::history,
        worker_backends::list, worker_backends::install, worker_backends::remove,
        models::list, models::create, models::estimate, models::get, models::update,
        models::delete, catalog::list,
        providers::list, providers::create, providers::get, providers::update,
        providers::delete, providers::models,
        routes::list, routes::create, routes::get, routes::update, routes::delete,
        instances::list, instances::get, instances::update, instances::delete, instances::logs,
        instances::restart,
        model_files::list, model_files::delete,
        uploads::create, uploads::list, uploads::get, uploads::append, uploads::delete,
        uploads::content, uploads::staged,
        agent::register, agent::heartbeat, agent::status, agent::assignments,
        agent::report_state, agent::goodbye, agent::servers,
        coordinator::servers, coordinator::register, coordinator::unregister,
        coordinator::heartbeat, coordinator::cluster, coordinator::acquire_lock,
        coordinator::release_lock, coordinator::locks, coordinator::health,
        usage::report,
        gantry_gateway::list_models, gantry_gateway::openapi::chat_completions,
        gantry_gateway::openapi::completions, gantry_gateway::openapi::embeddings,
        gantry_gateway::prometheus_metrics,
    ),
    components(schemas(
        gantry_types::ErrorBody,
        gantry_types::ErrorCode,
        gantry_types::WatchEvent<gantry_types::ModelInstance>,
    )),
    modifiers(
        &BearerAuth,
        &StandardErrors,
        &GatewayRequestBodies,
        &BinaryBodies,
        &SchemaRules
    ),
    tags(
        (name = "health", description = "Probes"),
        (name = "auth", description = "Sessions and passwords"),
        (name = "users", description = "Users (admin)"),
        (name = "api-keys", description = "API keys"),
        (name = "clusters", description = "Clusters: sets of workers with their own registration tokens, into which models are deployed"),
        (name = "workers", description = "GPU nodes (admins, and the administrators of their clusters)"),
        (name = "coordinator", description = "Servers, the leader and distributed locks (admin)"),
        (name = "inference-backends", description = "Inference backends: built-in and custom, their versions and installs"),
        (name = "models", description = "Models: the desired state"),
        (name = "model-instances", description = "Replicas: the observed state"),
        (name = "model-files", description = "Files in the workers' model caches (admin)"),
        (name = "worker-agent", description = "Called by worker agents with their credential"),
        (name = "model-routes", description = "Model routes and providers: public model names over deployed models and external OpenAI-compatible endpoints (admin)"),
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

/// Adds to every operation the error answers that the layers in front of its handler
/// give, so the spec names every status an operation can answer with (each with the
/// error body: gantry's, or OpenAI's shape on the gateway's `/v1/*`):
///
/// - an operation that takes credentials: 401 (none, or not valid) and 403 (valid, but
///   not allowed here);
/// - a request body: 400 (not readable as its content type), 413 (larger than
///   `max_request_body`), 415 (another content type) and 422 (readable, but a field is
///   invalid);
/// - parameters: 400 (a query or path parameter that does not parse); path parameters:
///   404 (no such object);
/// - the management API and logins: 503 with `Retry-After` while the database cannot be
///   reached.
///
/// What an operation documents itself (a more specific description) is kept.
struct StandardErrors;

impl Modify for StandardErrors {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::path::ParameterIn;

        for (path, item) in &mut openapi.paths.paths {
            let gateway = path.starts_with("/v1/");
            let database = path.starts_with("/api/v1/") || path.starts_with("/auth/");
            let error_body = if gateway {
                "OpenAiErrorBody"
            } else {
                "ErrorBody"
            };
            for operation in [
                &mut item.get,
                &mut item.put,
                &mut item.post,
                &mut item.delete,
                &mut item.patch,
            ]
            .into_iter()
            .flatten()
            {
                let secured = operation
                    .security
                    .as_ref()
                    .is_some_and(|requirements| !requirements.is_empty());
                let parameters = operation.parameters.as_deref().unwrap_or_default();
                let has_parameters = !parameters.is_empty();
                let has_path_parameters = parameters
                    .iter()
                    .any(|p| p.parameter_in == ParameterIn::Path);
                let has_body = operation.request_body.is_some();
                let mut add = |status: u16, description: &str| {
                    operation
                        .responses
                        .responses
                        .entry(status.to_string())
                        .or_insert_with(|| error_response(error_body, description, status == 503));
                };
                if secured {
                    add(401, "No credentials, or credentials that are not valid");
                    add(403, "Valid credentials that may not do this");
                }
                if has_body {
                    add(400, "The body cannot be read as its content type");
                    add(413, "The body is larger than the server accepts");
                    add(
                        415,
                        "The body is not of the content type the operation takes",
                    );
                    add(
                        422,
                        "A field of the body is not valid; the message names it",
                    );
                }
                if has_parameters {
                    add(400, "A parameter is not valid; the message names it");
                }
                if has_path_parameters {
                    add(404, "No such object");
                }
                if database {
                    add(
                        503,
                        "The database cannot be reached; try again after Retry-After",
                    );
                }
                let watchable = parameters.iter().any(|p| p.name == "watch");
                if watchable {
                    // `watch=true` answers with a stream of events instead of the page.
                    if let Some(utoipa::openapi::RefOr::T(ok)) =
                        operation.responses.responses.get_mut("200")
                    {
                        ok.content.insert(
                            "application/x-ndjson".to_owned(),
                            utoipa::openapi::ContentBuilder::new()
                                .schema(Some(
                                    utoipa::openapi::ObjectBuilder::new()
                                        .schema_type(utoipa::openapi::Type::String)
                                        .description(Some(
                                            "With watch=true: one WatchEvent (JSON) per line",
                                        )),
                                ))
                                .build(),
                        );
                    }
                }
            }
        }
    }
}

/// The request bodies of the gateway's OpenAI endpoints, as far as the gateway reads them:
/// an object with a non-empty string `model`, an optional boolean `stream` and object
/// `stream_options` (each may be `null`); every other field goes to the backend as sent.
struct GatewayRequestBodies;

impl Modify for GatewayRequestBodies {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::schema::{AdditionalProperties, ObjectBuilder, SchemaType, Type};
        use utoipa::openapi::ContentBuilder;

        let nullable = |kind: Type| {
            ObjectBuilder::new().schema_type(SchemaType::from_iter([kind, Type::Null]))
        };
        let schema = ObjectBuilder::new()
            .schema_type(Type::Object)
            .property(
                "model",
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .min_length(Some(1))
                    .description(Some("The model (as `GET /v1/models` lists it)")),
            )
            .required("model")
            .property("stream", nullable(Type::Boolean))
            .property("stream_options", nullable(Type::Object))
            .additional_properties(Some(AdditionalProperties::FreeForm(true)))
            .build();
        for (path, item) in &mut openapi.paths.paths {
            if !path.starts_with("/v1/") {
                continue;
            }
            if let Some(body) = item
                .post
                .as_mut()
                .and_then(|operation| operation.request_body.as_mut())
            {
                let description = body.description.clone();
                body.content.clear();
                body.content.insert(
                    "application/json".to_owned(),
                    ContentBuilder::new().schema(Some(schema.clone())).build(),
                );
                body.description = description;
                body.required = Some(utoipa::openapi::Required::True);
            }
        }
    }
}

/// Raw bytes in a request body (an upload's chunk) are a binary string, not an array of
/// numbers, and both octet-stream types the server takes are listed.
struct BinaryBodies;

impl Modify for BinaryBodies {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::schema::{KnownFormat, ObjectBuilder, SchemaFormat, Type};
        use utoipa::openapi::ContentBuilder;

        let binary = ContentBuilder::new()
            .schema(Some(
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .format(Some(SchemaFormat::KnownFormat(KnownFormat::Binary))),
            ))
            .build();
        for item in openapi.paths.paths.values_mut() {
            for operation in [&mut item.put, &mut item.post, &mut item.patch]
                .into_iter()
                .flatten()
            {
                let Some(body) = operation.request_body.as_mut() else {
                    continue;
                };
                if body.content.contains_key("application/offset+octet-stream") {
                    for media_type in [
                        "application/offset+octet-stream",
                        "application/octet-stream",
                    ] {
                        body.content.insert(media_type.to_owned(), binary.clone());
                    }
                }
            }
        }
    }
}

/// An error answer with the error body `schema`, and `Retry-After` when `retry`.
fn error_response(
    schema: &str,
    description: &str,
    retry: bool,
) -> utoipa::openapi::RefOr<utoipa::openapi::Response> {
    use utoipa::openapi::{header::HeaderBuilder, ContentBuilder, Ref, ResponseBuilder, Type};
    let mut response = ResponseBuilder::new().description(description).content(
        "application/json",
        ContentBuilder::new()
            .schema(Some(Ref::from_schema_name(schema)))
            .build(),
    );
    if retry {
        response = response.header(
            "Retry-After",
            HeaderBuilder::new()
                .schema(
                    utoipa::openapi::ObjectBuilder::new()
                        .schema_type(Type::Integer)
                        .minimum(Some(0)),
                )
                .description(Some("Seconds to wait before trying again"))
                .build(),
        );
    }
    response.build().into()
}

/// Rules of schemas that utoipa's attributes cannot state: a placement patch names at
/// least one of its two fields, and at most 64 distinct GPU indexes.
struct SchemaRules;

impl Modify for SchemaRules {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::{RefOr, Schema};

        let Some(components) = openapi.components.as_mut() else {
            return;
        };
        if let Some(RefOr::T(Schema::Object(patch))) = components.schemas.get_mut("InstancePatch") {
            patch.min_properties = Some(1);
            patch.max_properties = None;
            if let Some(RefOr::T(Schema::Array(indexes))) = patch.properties.get_mut("gpu_indexes")
            {
                indexes.max_items = Some(64);
                indexes.unique_items = true;
                indexes.schema_type = utoipa::openapi::Type::Array.into();
            }
        }
    }
}

/// `GET /api/openapi.json`: the API as this server serves it, its configured limits
/// included.
pub async fn spec(
    axum::extract::State(state): axum::extract::State<crate::state::AppState>,
) -> Json<utoipa::openapi::OpenApi> {
    Json(for_server(&state.config))
}

/// [`ApiDoc`] with the limits of this server's configuration: the largest upload.
pub fn for_server(config: &crate::config::ServerConfig) -> utoipa::openapi::OpenApi {
    use utoipa::openapi::{RefOr, Schema};

    let mut spec = ApiDoc::openapi();
    let upload = spec
        .components
        .as_mut()
        .and_then(|components| components.schemas.get_mut("UploadCreate"));
    if let Some(RefOr::T(Schema::Object(upload))) = upload {
        if let Some(RefOr::T(Schema::Object(size))) = upload.properties.get_mut("size") {
            size.maximum = Some(config.upload_max_size.into());
            size.description = Some(format!(
                "Its size in bytes, at most this server's `upload_max_size` ({} bytes).",
                config.upload_max_size
            ));
        }
    }
    spec
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
