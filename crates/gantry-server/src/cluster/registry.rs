//! This server's row in the registry: written at start-up (refused when another live
//! process holds the `server_id`, or, in local mode on PostgreSQL, when any other server
//! is active), refreshed every `heartbeat_interval` with role and load, removed at a clean
//! shutdown. Also the one place the registry is read for the API: which servers are
//! active and their load scores.

use std::time::Duration;

use anyhow::bail;
use gantry_store::{RegistryConflict, ServerRecord, ServerRegistration, Store};
use gantry_types::{ServerInfo, ServerRole, Timestamp};

use crate::config::SchedulingMode;
use crate::state::AppState;

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// Registers this server, or explains why it may not run.
pub async fn register(
    store: &Store,
    cluster: &super::Cluster,
    server_timeout: Duration,
) -> anyhow::Result<()> {
    let now = Timestamp::now();
    let live_after = Timestamp::from_millis(now.as_millis() - millis(server_timeout));
    if cluster.mode == SchedulingMode::Local && store.engine() == gantry_store::Engine::Postgres {
        let others: Vec<ServerRecord> = store
            .list_servers()
            .await?
            .into_iter()
            .filter(|s| s.server_id != cluster.server_id() && s.last_heartbeat_at > live_after)
            .collect();
        if let Some(other) = others.first() {
            bail!(
                "scheduling_mode is local, but server {:?} at {} shares this database and is \
                 active (last heartbeat {} ms ago): two servers scheduling alone would fight. \
                 Use scheduling_mode distributed (or auto) on every server, or stop {:?} first",
                other.server_id,
                other.url,
                now.as_millis() - other.last_heartbeat_at.as_millis(),
                other.server_id
            );
        }
    }
    let registration = ServerRegistration {
        server_id: cluster.server_id(),
        url: &cluster.url,
        version: env!("CARGO_PKG_VERSION"),
        incarnation: &cluster.incarnation,
        session_pid: cluster.coordinator.session_id(),
    };
    match store
        .register_server(&registration, now, live_after)
        .await?
    {
        Ok(_) => {
            tracing::info!(server_id = %cluster.server_id(), url = %cluster.url, mode = cluster.mode_name(), "registered in the server registry");
            Ok(())
        }
        Err(RegistryConflict::Duplicate(other)) => bail!(
            "server_id {:?} is already used by a running server at {} (started {}, last \
             heartbeat {} ms ago). Give this server another server_id (--server-id or \
             GANTRY_SERVER_ID), or stop the other one first",
            other.server_id,
            other.url,
            other.started_at,
            now.as_millis() - other.last_heartbeat_at.as_millis()
        ),
    }
}

/// Sends this server's heartbeat every `heartbeat_interval` until the server starts
/// leaving (which removes the row: [`unregister`]). A row that disappeared (an admin
/// unregistered it) is written again.
pub fn spawn_heartbeat(state: &AppState) {
    let state = state.clone();
    let tracker = state.tasks.clone();
    tracker.spawn(async move {
        let interval = state.config.heartbeat_interval;
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_role = None;
        loop {
            tokio::select! {
                () = state.draining.cancelled() => break,
                () = state.shutdown.cancelled() => break,
                _ = tick.tick() => {}
            }
            let cluster = &state.cluster;
            let role = cluster.role();
            if last_role != Some(role) {
                tracing::info!(server_id = %cluster.server_id(), role = role.as_str(), "server role");
                last_role = Some(role);
            }
            let load = cluster.load(interval * 3);
            match state
                .store
                .server_heartbeat(
                    cluster.server_id(),
                    Some(&cluster.incarnation),
                    Some(role),
                    load,
                    cluster.coordinator.session_id(),
                    Timestamp::now(),
                )
                .await
            {
                Ok(Some(_)) => {}
                Ok(None) if state.draining.is_cancelled() => break,
                Ok(None) => {
                    tracing::warn!(server_id = %cluster.server_id(), "this server's registry row is gone; registering again");
                    if let Err(e) =
                        register(&state.store, cluster, state.config.server_timeout).await
                    {
                        tracing::error!(server_id = %cluster.server_id(), error = %e, "could not register again");
                    }
                }
                Err(e) => {
                    tracing::warn!(server_id = %cluster.server_id(), error = %e, "server heartbeat failed")
                }
            }
        }
    });
}

/// Removes this process's row (a clean shutdown).
pub async fn unregister(state: &AppState) {
    let cluster = &state.cluster;
    match state
        .store
        .unregister_server(cluster.server_id(), Some(&cluster.incarnation))
        .await
    {
        Ok(true) => {
            tracing::info!(server_id = %cluster.server_id(), "unregistered from the server registry")
        }
        Ok(false) => {}
        Err(e) => {
            tracing::warn!(server_id = %cluster.server_id(), error = %e, "could not unregister; the row goes inactive after server_timeout")
        }
    }
}

/// The registry as the API shows it: each server with `active` and its load score;
/// `leader` is the lease's holder (or, in local mode, the one server).
pub fn describe(
    records: Vec<ServerRecord>,
    now: Timestamp,
    server_timeout: Duration,
    leader: Option<&str>,
) -> Vec<ServerInfo> {
    let live_after = now.as_millis() - millis(server_timeout);
    let active = |r: &ServerRecord| r.last_heartbeat_at.as_millis() > live_after;
    let max_workers = records
        .iter()
        .filter(|r| active(r))
        .map(|r| r.load.connected_workers)
        .max()
        .unwrap_or(0);
    let max_inflight = records
        .iter()
        .filter(|r| active(r))
        .map(|r| r.load.inflight_requests)
        .max()
        .unwrap_or(0);
    records
        .into_iter()
        .map(|r| {
            let is_active = active(&r);
            let role = match leader {
                Some(id) if id == r.server_id => ServerRole::Leader,
                Some(_) => ServerRole::Standby,
                None => r.role,
            };
            ServerInfo {
                load_score: load_score(
                    r.load.connected_workers,
                    max_workers,
                    r.load.inflight_requests,
                    max_inflight,
                ),
                server_id: r.server_id,
                url: r.url,
                version: r.version,
                role,
                started_at: r.started_at,
                last_heartbeat_at: r.last_heartbeat_at,
                active: is_active,
                load: r.load,
            }
        })
        .collect()
}

/// `worker_factor * 0.4 + load_factor * 0.6`, each factor a share of the largest value
/// among the active servers.
pub fn load_score(workers: u64, max_workers: u64, inflight: u64, max_inflight: u64) -> f64 {
    let share = |value: u64, max: u64| {
        if max == 0 {
            0.0
        } else {
            value as f64 / max as f64
        }
    };
    share(workers, max_workers) * 0.4 + share(inflight, max_inflight) * 0.6
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_score_weighs_requests_over_workers() {
        assert_eq!(load_score(0, 0, 0, 0), 0.0);
        assert!((load_score(10, 10, 0, 50) - 0.4).abs() < 1e-9);
        assert!((load_score(0, 10, 50, 50) - 0.6).abs() < 1e-9);
        assert!((load_score(5, 10, 25, 50) - 0.5).abs() < 1e-9);
    }
}
