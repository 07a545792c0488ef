//! Distributed scheduling: with `distributed_scheduling` in distributed mode, every
//! server places pending instances, one at a time cluster-wide: a pass takes the
//! scheduling lock ([`SCHEDULING_LOCK`], `schedule_lock_timeout`), reads the cluster, places,
//! and releases the lock. Each placement is fenced by the lock's token, so a server that
//! was paused past the lock's timeout cannot write a placement decided on a stale
//! snapshot once another server took the lock.
//!
//! One lock rather than one per instance: two servers placing two different instances at
//! once, each on its own snapshot, could both book the last free bytes of one GPU. With
//! one lock, every placement is decided on a snapshot holding every earlier one. (A
//! placement is also conditional on the instance being unplaced, so no instance is ever
//! placed twice, lock or not.)
//!
//! A pass that finds the lock held by another server comes back shortly: the holder may
//! have read the pending list before the change that woke this pass.

use std::sync::Arc;
use std::time::Duration;

use gantry_store::{Fence, ModelFilter, StoreError};
use gantry_types::Timestamp;

use super::pass::EVERYTHING;
use super::placement::Placer;
use super::run_loop::{Action, Reconcile};
use crate::cluster::SCHEDULING_LOCK;
use crate::state::AppState;

/// How soon a pass that found the lock held tries again.
pub const LOCK_BUSY_RETRY: Duration = Duration::from_millis(200);

/// The placement loop of one server under the scheduling lock.
pub struct LockedPlacement {
    state: AppState,
    placer: Arc<tokio::sync::Mutex<Placer>>,
}

impl LockedPlacement {
    pub fn new(state: AppState, placer: Arc<tokio::sync::Mutex<Placer>>) -> Self {
        LockedPlacement { state, placer }
    }
}

impl Reconcile for LockedPlacement {
    fn new_term(&mut self) {}

    /// Placement never waits for an instance to run.
    fn wakes_on_running(&self) -> bool {
        false
    }

    async fn pass(&mut self) -> Result<Action, StoreError> {
        let store = &self.state.store;
        let owner = self.state.config.server_id.as_str();
        let lock = match store
            .acquire_lock(
                SCHEDULING_LOCK,
                owner,
                self.state.config.schedule_lock_timeout,
                Timestamp::now(),
            )
            .await?
        {
            Ok(lock) => lock,
            Err(holder) => {
                // A holder that died (kill -9) would block placement until the lock's
                // timeout: take it over at once when its server's session is gone.
                let taken = if store.server_is_gone(&holder.owner).await? {
                    store
                        .take_over_lock(
                            SCHEDULING_LOCK,
                            owner,
                            holder.token,
                            self.state.config.schedule_lock_timeout,
                            Timestamp::now(),
                        )
                        .await?
                } else {
                    None
                };
                match taken {
                    Some(lock) => {
                        tracing::warn!(server_id = owner, previous = %holder.owner, token = lock.token,
                            "took the scheduling lock over from a server that is gone");
                        lock
                    }
                    None => {
                        tracing::debug!(holder = %holder.owner, "the scheduling lock is held elsewhere; retrying shortly");
                        return Ok(Action::requeue_after(LOCK_BUSY_RETRY));
                    }
                }
            }
        };
        let fence = Fence::Lock {
            name: lock.name.clone(),
            token: lock.token,
        };
        let outcome = async {
            let (models, _) = store
                .list_models(&ModelFilter::default(), EVERYTHING)
                .await?;
            let mut placer = self.placer.lock().await;
            placer
                .place_pending(store, &models, None, || true, &fence)
                .await
        }
        .await;
        if let Err(e) = store
            .release_lock(SCHEDULING_LOCK, owner, Timestamp::now())
            .await
        {
            tracing::warn!(error = %e, "could not release the scheduling lock; it lapses after schedule_lock_timeout");
        }
        if let Err(StoreError::Fenced { .. }) = &outcome {
            tracing::warn!(
                server_id = owner,
                token = lock.token,
                "a placement was refused: the scheduling lock lapsed and another server took it"
            );
            return Ok(Action::requeue_after(LOCK_BUSY_RETRY));
        }
        outcome
    }
}
