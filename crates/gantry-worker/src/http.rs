//! The worker's own small HTTP API, called by the servers: `GET /healthz`,
//! `GET /v1/instances/{id}/logs?tail=N&follow=true`, `POST /v1/instances/{id}/restart`
//! (an admin's restart of a backend in place), and the model cache's files
//! (`GET /v1/model-files`, `DELETE /v1/model-files/{blob}`), the backends installed here
//! (`GET`/`POST /v1/backends`, `DELETE /v1/backends/{name}/{version}`), authenticated
//! with the API token the server issued at registration.

use std::io::{Read, Seek, SeekFrom};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use serde::Deserialize;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::agent::Shared;

/// How often a followed log is checked for new output.
const FOLLOW_POLL: Duration = Duration::from_millis(250);

/// Starts serving on the listener until the worker shuts down, over TLS with `tls`.
pub(crate) fn serve(shared: Arc<Shared>, listener: TcpListener, tls: Option<TlsAcceptor>) {
    let app = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/v1/instances/{id}/logs", get(logs))
        .route(
            "/v1/instances/{id}/restart",
            axum::routing::post(restart_instance),
        )
        .route("/v1/model-files", get(model_files))
        .route(
            "/v1/model-files/{blob}",
            axum::routing::delete(delete_model_file),
        )
        .route("/v1/backends", get(list_backends).post(install_backend))
        .route(
            "/v1/backends/{name}/{version}",
            axum::routing::delete(remove_backend),
        )
        .with_state(shared.clone());
    let shutdown = shared.shutdown.clone();
    let Some(tls) = tls else {
        shared.tasks.spawn(async move {
            let serve =
                axum::serve(listener, app).with_graceful_shutdown(shutdown.cancelled_owned());
            if let Err(e) = serve.await {
                tracing::error!(error = %e, "worker API stopped with an error");
            }
        });
        return;
    };
    let tasks = shared.tasks.clone();
    shared.tasks.spawn(async move {
        loop {
            let (tcp, peer) = tokio::select! {
                () = shutdown.cancelled() => return,
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // Out of descriptors and the like: pause rather than spin.
                        tracing::warn!(error = %e, "worker API cannot accept a connection");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
            };
            let (tls, app, shutdown) = (tls.clone(), app.clone(), shutdown.clone());
            tasks.spawn(async move {
                if let Some(stream) = gantry_tls::handshake(&tls, tcp, peer, &shutdown).await {
                    let service = hyper_util::service::TowerToHyperService::new(app);
                    gantry_tls::serve_http1(stream, service, shutdown, peer).await;
                }
            });
        }
    });
}

#[derive(Debug, Deserialize)]
struct LogQuery {
    tail: Option<usize>,
    follow: Option<bool>,
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, message.into()).into_response()
}

fn authorised(shared: &Shared, headers: &HeaderMap) -> bool {
    presents_token(headers, &shared.api_token)
}

/// Whether the request's bearer token is `expected`. No token never matches.
fn presents_token(headers: &HeaderMap, expected: &str) -> bool {
    let Some(presented) = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(gantry_types::auth::bearer_token)
    else {
        return false;
    };
    // Compare in constant time: the token is a secret.
    let expected = expected.as_bytes();
    presented.len() == expected.len()
        && presented
            .bytes()
            .zip(expected)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

/// The files of this worker's model cache.
async fn model_files(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    if !authorised(&shared, &headers) {
        return error(StatusCode::UNAUTHORIZED, "invalid worker API token");
    }
    let files = match &shared.config.supervisor.model_cache {
        Some(cache) => cache.list().await,
        None => Vec::new(),
    };
    axum::Json(files).into_response()
}

/// Removes a file of the model cache that no instance uses.
async fn delete_model_file(
    State(shared): State<Arc<Shared>>,
    Path(blob): Path<String>,
    headers: HeaderMap,
) -> Response {
    if !authorised(&shared, &headers) {
        return error(StatusCode::UNAUTHORIZED, "invalid worker API token");
    }
    let Some(cache) = &shared.config.supervisor.model_cache else {
        return error(StatusCode::NOT_FOUND, "this worker has no model cache");
    };
    use gantry_source::files::DeleteError;
    match cache.delete(&blob).await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e @ DeleteError::NotFound(_)) => error(StatusCode::NOT_FOUND, e.to_string()),
        Err(e @ DeleteError::InUse(_)) => error(StatusCode::CONFLICT, e.to_string()),
        Err(e @ DeleteError::Invalid(_)) => error(StatusCode::BAD_REQUEST, e.to_string()),
        Err(e @ DeleteError::Disk(_)) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// Why a worker without an installer refuses to install or remove.
fn no_installer() -> Response {
    error(
        StatusCode::CONFLICT,
        "this worker does not install backends (install_backends is false)",
    )
}

fn refused(refusal: crate::preinstall::Refusal) -> Response {
    use crate::preinstall::Refusal;
    let status = match &refusal {
        Refusal::Invalid(_) => StatusCode::BAD_REQUEST,
        Refusal::NotFound(_) => StatusCode::NOT_FOUND,
        Refusal::Conflict(_) => StatusCode::CONFLICT,
        Refusal::Failed(_) => StatusCode::INTERNAL_SERVER_ERROR,
    };
    error(status, refusal.to_string())
}

/// The backends installed here, being installed or failed to install.
async fn list_backends(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    if !authorised(&shared, &headers) {
        return error(StatusCode::UNAUTHORIZED, "invalid worker API token");
    }
    let Some(installed) = &shared.config.supervisor.installed_backends else {
        return axum::Json(Vec::<gantry_types::BackendInstallStatus>::new()).into_response();
    };
    axum::Json(shared.preinstalls.list(installed, &shared.supervisor)).into_response()
}

/// Installs a backend version ahead of need: 200 when it is installed already, else 202
/// and the install runs on (see `GET /v1/backends`).
async fn install_backend(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if !authorised(&shared, &headers) {
        return error(StatusCode::UNAUTHORIZED, "invalid worker API token");
    }
    let order: gantry_types::BackendInstallOrder = match serde_json::from_slice(&body) {
        Ok(order) => order,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("invalid install order: {e}"),
            )
        }
    };
    let Some(installed) = &shared.config.supervisor.installed_backends else {
        return no_installer();
    };
    match shared
        .preinstalls
        .start(installed, order, &shared.tasks, &shared.shutdown)
        .await
    {
        Ok(status) => {
            let code = if status.state == "installed" {
                StatusCode::OK
            } else {
                StatusCode::ACCEPTED
            };
            (code, axum::Json(status)).into_response()
        }
        Err(refusal) => refused(refusal),
    }
}

/// Removes an installed backend version that no instance here uses.
async fn remove_backend(
    State(shared): State<Arc<Shared>>,
    Path((name, version)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    if !authorised(&shared, &headers) {
        return error(StatusCode::UNAUTHORIZED, "invalid worker API token");
    }
    let Some(installed) = &shared.config.supervisor.installed_backends else {
        return no_installer();
    };
    match shared
        .preinstalls
        .remove(installed, &shared.supervisor, &name, &version)
    {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(refusal) => refused(refusal),
    }
}

/// Restarts an instance's backend with the spec it runs: 204, or 404 when it does not run
/// here.
async fn restart_instance(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<i64>,
    headers: HeaderMap,
) -> Response {
    if !authorised(&shared, &headers) {
        return error(StatusCode::UNAUTHORIZED, "invalid worker API token");
    }
    if !shared.supervisor.restart_in_place(id) {
        return error(
            StatusCode::NOT_FOUND,
            format!("instance {id} does not run on this worker"),
        );
    }
    tracing::info!(instance_id = id, "restarting instance as asked");
    StatusCode::NO_CONTENT.into_response()
}

async fn logs(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<i64>,
    Query(query): Query<LogQuery>,
    headers: HeaderMap,
) -> Response {
    if !authorised(&shared, &headers) {
        return error(StatusCode::UNAUTHORIZED, "invalid worker API token");
    }
    let latest = match shared.supervisor.current_log_file(id) {
        Ok(Some(path)) => path,
        Ok(None) => {
            return error(
                StatusCode::NOT_FOUND,
                format!("instance {id} has no log on this worker"),
            )
        }
        Err(e) => {
            return error(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("find logs of instance {id}: {e}"),
            )
        }
    };
    let tail = query.tail.unwrap_or(100).min(100_000);
    let text = match shared.supervisor.read_log(id, tail).await {
        Ok(text) => text,
        Err(e) => {
            return error(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("read {}: {e}", latest.display()),
            )
        }
    };
    if query.follow != Some(true) {
        return (
            [(
                axum::http::header::CONTENT_TYPE,
                "text/plain; charset=utf-8",
            )],
            text,
        )
            .into_response();
    }
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(16);
    let shutdown = shared.shutdown.clone();
    let shared_for_follow = shared.clone();
    shared.tasks.spawn(async move {
        // Every wait, sending included, also waits for shutdown: a client that stops
        // reading cannot hold the worker up.
        let send = |bytes: Bytes| {
            let (tx, shutdown) = (tx.clone(), shutdown.clone());
            async move {
                tokio::select! {
                    () = shutdown.cancelled() => false,
                    sent = tx.send(Ok(bytes)) => sent.is_ok(),
                }
            }
        };
        if !send(Bytes::from(text)).await {
            return;
        }
        let mut offset = std::fs::metadata(&latest).map(|m| m.len()).unwrap_or(0);
        let mut current = latest;
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(FOLLOW_POLL) => {}
            }
            // A restart starts a new file: follow it from its beginning.
            if let Ok(Some(newest)) = shared_for_follow.supervisor.current_log_file(id) {
                if newest != current {
                    current = newest;
                    offset = 0;
                }
            }
            let path = current.clone();
            let read = tokio::task::spawn_blocking(move || -> std::io::Result<Vec<u8>> {
                let mut file = std::fs::File::open(&path)?;
                file.seek(SeekFrom::Start(offset))?;
                let mut buffer = Vec::new();
                file.take(1 << 20).read_to_end(&mut buffer)?;
                Ok(buffer)
            })
            .await;
            match read {
                Ok(Ok(chunk)) if !chunk.is_empty() => {
                    offset += chunk.len() as u64;
                    if !send(Bytes::from(chunk)).await {
                        return;
                    }
                }
                Ok(Ok(_)) => {
                    if tx.is_closed() {
                        return;
                    }
                }
                _ => return,
            }
        }
    });
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; charset=utf-8",
        )],
        Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx)),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_authorization(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(
            axum::http::header::AUTHORIZATION,
            value.parse().expect("a valid header value"),
        );
        headers
    }

    #[test]
    fn worker_api_accepts_the_bearer_scheme_in_any_case() {
        assert!(presents_token(
            &with_authorization("Bearer secret"),
            "secret"
        ));
        assert!(presents_token(
            &with_authorization("bearer secret"),
            "secret"
        ));
        assert!(presents_token(
            &with_authorization("BEARER  secret "),
            "secret"
        ));
    }

    #[test]
    fn worker_api_rejects_wrong_or_missing_tokens() {
        assert!(!presents_token(
            &with_authorization("Bearer other"),
            "secret"
        ));
        assert!(!presents_token(
            &with_authorization("Basic secret"),
            "secret"
        ));
        assert!(!presents_token(&with_authorization("secret"), "secret"));
        assert!(!presents_token(&HeaderMap::new(), "secret"));
        assert!(!presents_token(&HeaderMap::new(), ""));
    }
}
