//! Joining the cluster: register with the registration token the first time, with the
//! saved credential after that (idempotent on the server), retrying with exponential
//! backoff while no server answers.

use std::path::Path;
use std::time::Duration;

use anyhow::bail;
use gantry_client::{Client, ClientError};
use gantry_types::WorkerRegister;
use tokio_util::sync::CancellationToken;

use super::identity::{self, Identity};

/// First and longest wait between registration attempts.
const BACKOFF_START: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// Registers until a server accepts, returning the worker's identity. Fails at once
/// on answers that retrying cannot fix (a bad token, a name taken by another worker).
pub async fn register(
    client: &Client,
    data_dir: &Path,
    registration_token: Option<&str>,
    request: &WorkerRegister,
    cancel: &CancellationToken,
) -> anyhow::Result<Identity> {
    let mut backoff = BACKOFF_START;
    loop {
        match try_register(client, data_dir, registration_token, request).await {
            Ok(identity) => return Ok(identity),
            Err(Attempt::Fatal(e)) => return Err(e),
            Err(Attempt::Retry(e)) => {
                tracing::warn!(error = %e, retry_in = ?backoff, "registration failed; retrying");
                tokio::select! {
                    () = cancel.cancelled() => bail!("stopped before the worker could register"),
                    () = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(BACKOFF_MAX);
            }
        }
    }
}

enum Attempt {
    Retry(anyhow::Error),
    Fatal(anyhow::Error),
}

async fn try_register(
    client: &Client,
    data_dir: &Path,
    registration_token: Option<&str>,
    request: &WorkerRegister,
) -> Result<Identity, Attempt> {
    if let Some(saved) = identity::load(data_dir).map_err(Attempt::Fatal)? {
        if saved.name == request.name {
            let answer = client.register_worker(&saved.credential, request).await;
            match answer {
                Ok((registered, _)) => {
                    tracing::info!(worker_id = registered.worker.id, worker = %registered.worker.name, server = %client.current_url(), "registered again with the saved credential");
                    return Ok(Identity {
                        worker_id: registered.worker.id,
                        ..saved
                    });
                }
                Err(e) if e.status() == Some(401) => {
                    tracing::warn!(error = %e, "the saved credential is no longer accepted (the worker was deleted?); registering anew");
                    identity::forget(data_dir);
                }
                Err(e) => return Err(classify(e)),
            }
        } else {
            tracing::warn!(saved = %saved.name, requested = %request.name, "the saved credential is for another worker name; registering anew");
        }
    }
    let Some(token) = registration_token else {
        return Err(Attempt::Fatal(anyhow::anyhow!(
            "this worker has no saved credential and no registration token: pass --token (the server writes it to <data_dir>/registration_token)"
        )));
    };
    let (registered, _) = client
        .register_worker(token, request)
        .await
        .map_err(classify)?;
    let (Some(credential), Some(api_token)) = (registered.credential, registered.api_token) else {
        return Err(Attempt::Fatal(anyhow::anyhow!(
            "the server registered the worker but sent no credential"
        )));
    };
    let identity = Identity {
        worker_id: registered.worker.id,
        name: registered.worker.name,
        credential,
        api_token,
    };
    identity::save(data_dir, &identity).map_err(Attempt::Fatal)?;
    tracing::info!(worker_id = identity.worker_id, worker = %identity.name, server = %client.current_url(), "registered");
    Ok(identity)
}

fn classify(error: ClientError) -> Attempt {
    match error.status() {
        Some(401 | 409 | 422) => Attempt::Fatal(anyhow::anyhow!("registration refused: {error}")),
        _ => Attempt::Retry(error.into()),
    }
}
