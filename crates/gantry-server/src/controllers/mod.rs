//! Background loops that move the observed state toward the desired state. They are
//! level-triggered: each pass looks at the store as it is now, so a missed wake-up is
//! healed by the next pass.
//!
//! * [`run_loop`]: when the leader-only pass runs (triggers from [`triggers`], debounce,
//!   requeues, the period) — tested in paused time;
//! * [`pass`]: one pass, which runs the controllers in order: [`model`] (replica counts),
//!   [`instance`] (rescheduling lost instances), [`rollout`] (model changes), and
//!   [`placement`] (with [`analyze`] and [`snapshot`]);
//! * [`worker_health`]: marks silent workers, on every server.

pub mod analyze;
pub mod instance;
pub mod model;
pub mod pass;
pub mod placement;
pub mod rollout;
pub mod run_loop;
pub mod snapshot;
pub mod triggers;
pub mod worker_health;

use std::sync::Arc;

use gantry_coord::Coordinator;

use crate::state::AppState;

/// Starts the leader-only controllers on the server's task tracker. They run passes only
/// while `coordinator` says this server leads, and end at shutdown.
pub fn spawn(state: &AppState, coordinator: Arc<dyn Coordinator>) {
    let config = pass::ControllerConfig::from_server_config(&state.config);
    let reconciler = pass::ControlPass::new(state.clone(), Arc::clone(&coordinator), &config);
    state.tasks.spawn(run_loop::run(
        reconciler,
        coordinator,
        state.store.subscribe(),
        config.loop_config(),
        state.shutdown.clone(),
    ));
}
