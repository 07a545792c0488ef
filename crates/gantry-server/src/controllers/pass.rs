//! One pass of the controllers, leader only, level-triggered (it reads the store as it is
//! and never asks why it woke):
//!
//! 1. [`model`](super::model): every model gets exactly `replicas` instances;
//! 2. [`instance`](super::instance): instances lost with their worker (`unreachable`) or
//!    given up by it (`error`) go back to `pending`, after a per-instance backoff;
//! 3. [`rollout`](super::rollout): instances whose launch settings the model no longer has
//!    move onto the new ones, one serving instance at a time;
//! 4. [`placement`](super::placement): the `pending` instances are placed (unless every
//!    server places under the scheduling lock: [`scheduling`](super::scheduling)).
//!
//! Every write carries the leader's fence ([`Cluster::leader_fence`]), taken once at the
//! start of the pass; a write refused as stale ends the pass, and the server steps down.
//!
//! [`run_loop`](super::run_loop) decides when a pass runs. A pass that finds nothing to
//! change writes nothing, so the changes it causes itself settle after one more pass.

use std::sync::Arc;
use std::time::Duration;

use gantry_store::{Fence, InstanceFilter, ModelFilter, Page, StoreError};

use super::instance::{reschedule_lost, RescheduleBackoff};
use super::placement::Placer;
use super::run_loop::{Action, LoopConfig, Reconcile};
use crate::cluster::Cluster;
use crate::config::ServerConfig;
use crate::state::AppState;

/// Every row of a list, in one page.
pub const EVERYTHING: Page = Page {
    page: 1,
    per_page: u32::MAX,
};

/// Timing of the control loop and its controllers.
#[derive(Debug, Clone)]
pub struct ControllerConfig {
    /// A pass runs at least this often, changes or not.
    pub period: Duration,
    /// The longest a change waits for its pass while the loop rests after a long one.
    pub debounce: Duration,
    /// The wait before the first reschedule of a lost instance; doubled per reschedule.
    pub reschedule_base: Duration,
    /// The longest wait before a reschedule.
    pub reschedule_cap: Duration,
    /// How soon a failed analysis (a missing file, say) is tried again.
    pub analysis_retry: Duration,
    /// An analysis that takes longer than this shows its instances as `analyzing`; faster
    /// ones go from `pending` straight to their outcome without two extra writes each.
    pub show_analyzing_after: Duration,
    /// Back-off after a pass failed on the store.
    pub error_retry: Duration,
}

impl ControllerConfig {
    /// The timing for a server: a 10 s period, a change waiting at most 100 ms for its pass,
    /// and a reschedule delay of
    /// a third of `server_timeout` (a lost worker has already been silent that long), at
    /// most 10 s, doubling up to 5 minutes.
    pub fn from_server_config(config: &ServerConfig) -> Self {
        ControllerConfig {
            period: Duration::from_secs(10),
            debounce: Duration::from_millis(100),
            reschedule_base: (config.server_timeout / 3)
                .clamp(Duration::from_millis(100), Duration::from_secs(10)),
            reschedule_cap: Duration::from_secs(300),
            analysis_retry: Duration::from_secs(10),
            show_analyzing_after: Duration::from_millis(200),
            error_retry: Duration::from_secs(1),
        }
    }
}

impl ControllerConfig {
    /// The loop's part of the timing.
    pub fn loop_config(&self) -> LoopConfig {
        LoopConfig {
            period: self.period,
            debounce: self.debounce,
            error_retry: self.error_retry,
        }
    }
}

/// The controllers of one leader, and what they remember between passes.
pub struct ControlPass {
    state: AppState,
    backoff: RescheduleBackoff,
    /// Shared with the placement loop of distributed scheduling, which places when
    /// this pass does not.
    placer: Arc<tokio::sync::Mutex<Placer>>,
    /// Whether the last pass saw a roll under way (it waits for instances to run).
    rolling: bool,
}

impl ControlPass {
    pub fn new(
        state: AppState,
        config: &ControllerConfig,
        placer: Arc<tokio::sync::Mutex<Placer>>,
    ) -> Self {
        ControlPass {
            state,
            backoff: RescheduleBackoff::new(config.reschedule_base, config.reschedule_cap),
            placer,
            rolling: true,
        }
    }

    async fn run(&mut self, cluster: &Cluster, fence: &Fence) -> Result<Action, StoreError> {
        let store = self.state.store.clone();
        let leading = || cluster.leader_fence().as_ref() == Some(fence);
        let began = std::time::Instant::now();
        let (models, _) = store
            .list_models(&ModelFilter::default(), EVERYTHING)
            .await?;
        let (instances, _) = store
            .list_instances(&InstanceFilter::default(), EVERYTHING)
            .await?;
        tracing::debug!(
            models = models.len(),
            instances = instances.len(),
            read_ms = began.elapsed().as_secs_f64() * 1e3,
            "control pass read the models and instances"
        );
        self.rolling = super::rollout::under_way(&models, &instances);
        let replicas_changed =
            super::model::reconcile_replicas(&store, &models, &instances, fence).await?;
        if !leading() {
            return Ok(Action::AwaitChange);
        }
        let rescheduled = reschedule_lost(&store, &mut self.backoff, &instances, fence).await?;
        let reschedule = rescheduled.action;
        {
            let mut placer = self.placer.lock().await;
            for (instance_id, worker_id) in rescheduled.gave_up {
                placer.avoid(instance_id, worker_id);
            }
        }
        if !leading() {
            return Ok(Action::AwaitChange);
        }
        let rolled = super::rollout::roll(&store, &models, &instances, fence).await?;
        if !leading() || cluster.places_under_lock() {
            return Ok(reschedule);
        }
        // When this pass changed no instance, the list it read is still what placement
        // needs (a write that raced with it is refused by the placement's own
        // condition): no second read of every pending instance.
        let unchanged = replicas_changed == 0 && rescheduled.count == 0 && rolled == 0;
        let retry = self
            .placer
            .lock()
            .await
            .place_pending(
                &store,
                &models,
                unchanged.then_some(instances),
                leading,
                fence,
            )
            .await?;
        Ok(reschedule.min(retry))
    }
}

impl Reconcile for ControlPass {
    fn new_term(&mut self) {
        self.backoff.clear();
        if let Ok(mut placer) = self.placer.try_lock() {
            placer.clear();
        }
    }

    fn wakes_on_running(&self) -> bool {
        self.rolling
    }

    async fn pass(&mut self) -> Result<Action, StoreError> {
        let cluster = Arc::clone(&self.state.cluster);
        let Some(fence) = cluster.leader_fence() else {
            return Ok(Action::AwaitChange);
        };
        let outcome = self.run(&cluster, &fence).await;
        if let Err(e) = &outcome {
            cluster.on_write_error(e);
        }
        outcome
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reschedule_delay_scales_with_server_timeout() {
        let mut config = ServerConfig::new("/tmp/x".into());
        assert_eq!(
            ControllerConfig::from_server_config(&config).reschedule_base,
            Duration::from_secs(10)
        );
        config.server_timeout = Duration::from_millis(1500);
        assert_eq!(
            ControllerConfig::from_server_config(&config).reschedule_base,
            Duration::from_millis(500)
        );
    }
}
