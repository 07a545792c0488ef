//! Background loops that move the observed state toward the desired state. They are
//! level-triggered: each pass looks at the store as it is now, so a missed wake-up is
//! healed by the next pass.
//!
//! * [`run_loop`]: when the leader-only pass runs (triggers from [`triggers`], debounce,
//!   requeues, the period) — tested in paused time;
//! * [`pass`]: one pass, which runs the controllers in order: [`model`] (replica counts),
//!   [`instance`] (rescheduling lost instances), [`rollout`] (model changes), and
//!   [`placement`] (with [`analyze`] and [`snapshot`]);
//! * [`scheduling`]: placement on every server under the scheduling lock, when
//!   scheduling is distributed (otherwise placement is part of the leader's pass);
//! * [`worker_health`]: marks silent workers, leader only;
//! * [`usage_archive`]: rolls old per-minute usage up into days, leader only.

pub mod analyze;
pub mod instance;
pub mod model;
pub mod pass;
pub mod placement;
pub mod pools;
pub mod rollout;
pub mod run_loop;
pub mod scheduling;
pub mod snapshot;
pub mod triggers;
pub mod usage_archive;
pub mod worker_health;

use std::sync::Arc;

use gantry_coord::{Coordinator, LocalCoordinator};

use crate::state::AppState;

/// Starts the controllers on the server's task tracker: the leader-only pass, which runs
/// only while the cluster's coordinator says this server leads, and, when scheduling is
/// distributed, the placement loop every server runs. They end at shutdown.
pub fn spawn(state: &AppState) {
    let config = pass::ControllerConfig::from_server_config(&state.config);
    let placer = Arc::new(tokio::sync::Mutex::new(placement::Placer::new(
        config.analysis_retry,
        config.show_analyzing_after,
        state.sources.clone(),
    )));
    let coordinator = Arc::clone(&state.cluster.coordinator);
    let reconciler = pass::ControlPass::new(state.clone(), &config, Arc::clone(&placer));
    state.tasks.spawn(run_loop::run(
        reconciler,
        coordinator,
        state.store.subscribe(),
        config.loop_config(),
        state.shutdown.clone(),
    ));
    if state.cluster.places_under_lock() {
        let placing = scheduling::LockedPlacement::new(state.clone(), placer);
        // Every server places: a coordinator that always "leads" runs its loop.
        let always: Arc<dyn Coordinator> =
            Arc::new(LocalCoordinator::new(state.config.server_id.clone()));
        state.tasks.spawn(run_loop::run(
            placing,
            always,
            state.store.subscribe(),
            config.loop_config(),
            state.shutdown.clone(),
        ));
    }
}
