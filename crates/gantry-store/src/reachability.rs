//! Whether the database can be reached right now, known without asking it.
//!
//! A query on a PostgreSQL server that is down does not fail at once: the pool retries
//! a refused connection until its acquire timeout (10 s). Callers that can do without
//! the database — the gateway serving API keys it verified before, the management API
//! answering 503 at once, `/readyz` — ask [`Store::unreachable`] first instead.
//!
//! On PostgreSQL a probe keeps the answer current: every [`PROBE_INTERVAL`] it runs
//! `SELECT 1` on a connection of its own (outside the pool, so a busy pool never looks
//! like an outage), with [`PROBE_TIMEOUT`] for connecting and answering. One failure
//! marks the database unreachable; the first success marks it back. A SQLite file is
//! always reachable: nothing probes it.

use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::any::AnyConnectOptions;
use sqlx::{AnyConnection, ConnectOptions, Connection};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::Store;

/// Time between probes.
pub const PROBE_INTERVAL: Duration = Duration::from_secs(1);
/// How long one probe may take, connecting included.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// The probe's latest answer.
#[derive(Debug, Default)]
pub(crate) struct Reachability {
    down: Mutex<Option<Down>>,
}

#[derive(Debug, Clone)]
struct Down {
    since: Instant,
    error: String,
}

impl Reachability {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Down>> {
        self.down.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn mark_down(&self, error: String) {
        let mut down = self.lock();
        match down.as_mut() {
            Some(down) => down.error = error,
            None => {
                tracing::warn!(%error, "database unreachable; the gateway goes on with the API keys and routes it knows, the management API answers 503 until it is back");
                *down = Some(Down {
                    since: Instant::now(),
                    error,
                });
            }
        }
    }

    fn mark_up(&self) {
        if let Some(down) = self.lock().take() {
            tracing::info!(
                down_for_s = down.since.elapsed().as_secs_f64(),
                "database reachable again"
            );
        }
    }

    fn why(&self) -> Option<String> {
        self.lock().as_ref().map(|down| {
            format!(
                "{} (for {:.0} s)",
                down.error,
                down.since.elapsed().as_secs_f64()
            )
        })
    }
}

impl Store {
    /// Why the database cannot be reached, if the last probe found it so (`None` on
    /// SQLite, and on PostgreSQL while it answers).
    pub fn unreachable(&self) -> Option<String> {
        self.reachability.why()
    }
}

/// Starts the probe of a PostgreSQL store, until `cancel`.
pub(crate) fn start_probe(store: &Store, url: &str, cancel: CancellationToken) {
    let reachability = Arc::clone(&store.reachability);
    let options = match AnyConnectOptions::from_str(url) {
        Ok(options) => options.disable_statement_logging(),
        // The pool was opened with the same URL, so it parses; nothing to probe if not.
        Err(_) => return,
    };
    tokio::spawn(async move {
        let mut connection: Option<AnyConnection> = None;
        let mut tick = tokio::time::interval(PROBE_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = cancel.cancelled() => break,
                _ = tick.tick() => {}
            }
            let probe = async {
                let connection = match connection.as_mut() {
                    Some(connection) => connection,
                    None => connection.insert(AnyConnection::connect_with(&options).await?),
                };
                sqlx::query("SELECT 1").execute(&mut *connection).await?;
                Ok::<(), sqlx::Error>(())
            };
            match tokio::time::timeout(PROBE_TIMEOUT, probe).await {
                Ok(Ok(())) => reachability.mark_up(),
                Ok(Err(e)) => {
                    connection = None;
                    reachability.mark_down(e.to_string());
                }
                Err(_) => {
                    connection = None;
                    reachability.mark_down(format!(
                        "no answer to a probe within {} s",
                        PROBE_TIMEOUT.as_secs()
                    ));
                }
            }
        }
        if let Some(connection) = connection {
            let _ = connection.close().await;
        }
    });
}
