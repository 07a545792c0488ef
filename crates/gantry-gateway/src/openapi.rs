//! The OpenAPI description of the gateway's hot routes. They have no axum handler: the
//! front (`front.rs`) serves them off the connection, and a connection already handed to
//! hyper reaches the proxy straight from `listener.rs`, so no request ever goes through
//! the router for them. These items carry only their description, which the server's
//! spec lists beside `GET /v1/models` and `/metrics` (real handlers in `lib.rs`).

use crate::error::OpenAiErrorBody;

/// Forwards an OpenAI chat completion (streaming with `"stream": true`) to a running
/// instance of the model. The response names the instance in `x-gantry-instance`.
#[utoipa::path(post, path = "/v1/chat/completions", tag = "gateway", security(("bearer" = [])),
    request_body(content = Object, description = "An OpenAI chat completion request; `model` picks the model."),
    responses((status = 200, description = "The backend's answer: JSON, or server-sent events when streaming"),
        (status = 400, body = OpenAiErrorBody), (status = 401, body = OpenAiErrorBody),
        (status = 404, body = OpenAiErrorBody), (status = 502, body = OpenAiErrorBody),
        (status = 503, body = OpenAiErrorBody)))]
pub fn chat_completions() {}

/// Forwards an OpenAI (legacy) completion to a running instance of the model.
#[utoipa::path(post, path = "/v1/completions", tag = "gateway", security(("bearer" = [])),
    request_body(content = Object, description = "An OpenAI completion request; `model` picks the model."),
    responses((status = 200, description = "The backend's answer: JSON, or server-sent events when streaming"),
        (status = 400, body = OpenAiErrorBody), (status = 404, body = OpenAiErrorBody),
        (status = 503, body = OpenAiErrorBody)))]
pub fn completions() {}

/// Forwards an OpenAI embeddings request to a running instance of the model.
#[utoipa::path(post, path = "/v1/embeddings", tag = "gateway", security(("bearer" = [])),
    request_body(content = Object, description = "An OpenAI embeddings request; `model` picks the model."),
    responses((status = 200, description = "The backend's answer"),
        (status = 400, body = OpenAiErrorBody), (status = 404, body = OpenAiErrorBody),
        (status = 503, body = OpenAiErrorBody)))]
pub fn embeddings() {}
