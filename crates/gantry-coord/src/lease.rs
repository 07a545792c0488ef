//! The PostgreSQL backend: leadership is the lease row of `gantry-store`'s `lease.rs`,
//! taken, renewed and released by one task per server over one dedicated connection.
//!
//! * **Standby**: every `standby_poll` it tries the advisory lock and the lease. It takes
//!   the lease when it is free, lapsed (by the database's clock), or its holder's session
//!   died (the advisory lock came free while the row says the holder held it) — the last
//!   within about one poll of a `kill -9`.
//! * **Leader**: renews every `renew_interval`. Its term is valid locally until the start
//!   of the last successful renewal plus `ttl` less a tenth (the database's expiry is
//!   later than that); [`Coordinator::leadership`] answers `Follower` past that instant
//!   even before the task runs, so a process resumed after a pause stops at once.
//! * **Stepping down**, without exiting: when a renewal finds the lease taken, when the
//!   session fails, when the local term ends, or when a fenced write was refused
//!   ([`Coordinator::fenced`]). It releases the advisory lock and goes back to standby;
//!   it may lead again later, with a new token.
//! * **Shutdown**: releases the lease and the lock, so a standby takes over at its next
//!   poll.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gantry_store::{LeaderSession, Store, StoreError};
use tokio::sync::{watch, Notify};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::{BoxFuture, Coordinator, Leadership, LeadershipWatch};

/// Timing of the lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseConfig {
    /// How long a lease holds without renewal.
    pub ttl: Duration,
    /// How often the leader renews (a third of the TTL by default).
    pub renew_interval: Duration,
    /// How often a standby tries to take over.
    pub standby_poll: Duration,
}

/// The lease's default TTL.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(15);
/// The default renewal interval: a third of the TTL.
pub const DEFAULT_LEASE_RENEW_INTERVAL: Duration = Duration::from_secs(5);

impl LeaseConfig {
    /// A lease of `ttl` renewed every `renew_interval`; standbys poll a tenth as often as
    /// the leader renews, between 100 ms and 500 ms.
    pub fn new(ttl: Duration, renew_interval: Duration) -> Self {
        LeaseConfig {
            ttl,
            renew_interval,
            standby_poll: (renew_interval / 10)
                .clamp(Duration::from_millis(100), Duration::from_millis(500)),
        }
    }

    /// Checks that a renewal fits in the TTL with room for one retry.
    pub fn validate(&self) -> Result<(), String> {
        if self.renew_interval.is_zero() || self.ttl < self.renew_interval * 2 {
            return Err(format!(
                "lease_renew_interval ({:?}) must be above zero and at most half of lease_ttl ({:?})",
                self.renew_interval, self.ttl
            ));
        }
        Ok(())
    }

    /// How long a term stays valid locally after a renewal started.
    fn local_term(&self) -> Duration {
        self.ttl - self.ttl / 10
    }
}

/// Leadership through the PostgreSQL lease. See the module documentation.
#[derive(Debug)]
pub struct LeaseCoordinator {
    server_id: String,
    sender: watch::Sender<Leadership>,
    /// End of the current term as this process sees it; `None` when not leading.
    valid_until: Mutex<Option<Instant>>,
    /// Woken when a fenced write was refused.
    fenced: Notify,
    /// Cancelled by `step_down` (or the server's shutdown): release and stop.
    stop: CancellationToken,
    /// Closed when the task has released everything.
    finished: CancellationToken,
    /// The backend pid of the current session (0: none).
    session_pid: AtomicI64,
}

impl LeaseCoordinator {
    /// Opens the leader session (failing when the database cannot be reached) and starts
    /// the lease task on `tasks`; it runs until `shutdown` (or `step_down`), then
    /// releases the lease.
    pub async fn start(
        server_id: impl Into<String>,
        store: Store,
        config: LeaseConfig,
        shutdown: &CancellationToken,
        tasks: &TaskTracker,
    ) -> Result<Arc<Self>, StoreError> {
        let mut session = store.leader_session().await?;
        let pid = session.backend_pid().await?;
        let (sender, _) = watch::channel(Leadership::Follower);
        let coordinator = Arc::new(LeaseCoordinator {
            server_id: server_id.into(),
            sender,
            valid_until: Mutex::new(None),
            fenced: Notify::new(),
            stop: shutdown.child_token(),
            finished: CancellationToken::new(),
            session_pid: AtomicI64::new(pid),
        });
        let task = Arc::clone(&coordinator);
        tasks.spawn(async move {
            task.run(store, config, session).await;
            task.finished.cancel();
        });
        Ok(coordinator)
    }

    fn valid_until(&self) -> Option<Instant> {
        *self.valid_until.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set_term(&self, term: Option<(u64, Instant)>) {
        *self.valid_until.lock().unwrap_or_else(|e| e.into_inner()) = term.map(|(_, until)| until);
        self.sender.send_replace(match term {
            Some((fencing_token, _)) => Leadership::Leader { fencing_token },
            None => Leadership::Follower,
        });
    }

    async fn run(&self, store: Store, config: LeaseConfig, first: LeaderSession) {
        let mut session: Option<LeaderSession> = Some(first);
        let mut term: Option<Term> = None;
        let mut failing_since: Option<String> = None;
        while !self.stop.is_cancelled() {
            let Some(active) = session.as_mut() else {
                let opened = match store.leader_session().await {
                    Ok(mut opened) => opened.backend_pid().await.map(|pid| (opened, pid)),
                    Err(e) => Err(e),
                };
                match opened {
                    Ok((opened, pid)) => {
                        self.session_pid.store(pid, Ordering::Relaxed);
                        if failing_since.take().is_some() {
                            tracing::info!(server_id = %self.server_id, "leader lease: database reachable again");
                        }
                        session = Some(opened);
                    }
                    Err(e) => {
                        if failing_since.is_none() {
                            tracing::warn!(server_id = %self.server_id, error = %e, "leader lease: cannot reach the database; retrying");
                        }
                        failing_since = Some(e.to_string());
                        self.pause(config.standby_poll).await;
                    }
                }
                continue;
            };
            let outcome = match term {
                None => self.try_lead(active, &config).await,
                Some(current) => self.hold(active, &config, current).await,
            };
            match outcome {
                Ok(next) => term = next,
                Err(e) => {
                    if let Some(lost) = term.take() {
                        self.lose(lost, &format!("the leader session failed: {e}"));
                    } else {
                        tracing::warn!(server_id = %self.server_id, error = %e, "leader lease: the session failed; reconnecting");
                    }
                    // The advisory lock went with the connection, if it was alive.
                    if let Some(dead) = session.take() {
                        dead.close().await;
                    }
                    self.pause(config.standby_poll).await;
                }
            }
        }
        self.release(session, term).await;
    }

    /// One standby round: try to take the lease; wait a poll when it is held.
    async fn try_lead(
        &self,
        session: &mut LeaderSession,
        config: &LeaseConfig,
    ) -> Result<Option<Term>, StoreError> {
        let started = Instant::now();
        let holding_lock = session.try_lock().await?;
        if let Some(token) = session
            .acquire(&self.server_id, config.ttl, holding_lock)
            .await?
        {
            let until = started + config.local_term();
            self.set_term(Some((token, until)));
            tracing::info!(server_id = %self.server_id, fencing_token = token, holding_lock, "took the leader lease: this server leads");
            return Ok(Some(Term {
                token,
                holding_lock,
                renewed: started,
            }));
        }
        if holding_lock {
            // The lease is held by a live leader that lacks the lock: let it have it.
            session.unlock().await?;
        }
        self.pause(config.standby_poll).await;
        Ok(None)
    }

    /// One leader round: wait for the next renewal (or a reason to stop), then renew.
    async fn hold(
        &self,
        session: &mut LeaderSession,
        config: &LeaseConfig,
        mut term: Term,
    ) -> Result<Option<Term>, StoreError> {
        let until = self.valid_until().unwrap_or_else(Instant::now);
        let next_renewal = (term.renewed + config.renew_interval).min(until);
        tokio::select! {
            () = self.stop.cancelled() => return Ok(Some(term)),
            () = self.fenced.notified() => {
                self.lose(term, "a write was refused: another server holds the lease now");
                session.unlock().await?;
                return Ok(None);
            }
            () = tokio::time::sleep_until(next_renewal) => {}
        }
        if Instant::now() >= until {
            self.lose(term, "the lease could not be renewed before it lapsed");
            session.unlock().await?;
            return Ok(None);
        }
        let started = Instant::now();
        let renewal = async {
            let holding_lock = term.holding_lock || session.try_lock().await?;
            let renewed = session
                .renew(&self.server_id, term.token, config.ttl, holding_lock)
                .await?;
            Ok::<_, StoreError>((renewed, holding_lock))
        };
        match tokio::time::timeout_at(until, renewal).await {
            Ok(Ok((true, holding_lock))) => {
                if holding_lock && !term.holding_lock {
                    tracing::info!(server_id = %self.server_id, fencing_token = term.token, "leader now also holds the session lock");
                }
                term.holding_lock = holding_lock;
                term.renewed = started;
                let until = started + config.local_term();
                *self.valid_until.lock().unwrap_or_else(|e| e.into_inner()) = Some(until);
                Ok(Some(term))
            }
            Ok(Ok((false, _))) => {
                self.lose(term, "another server holds the lease now");
                session.unlock().await?;
                Ok(None)
            }
            Ok(Err(e)) => Err(e),
            Err(_) => {
                self.lose(term, "the lease could not be renewed before it lapsed");
                Err(StoreError::Config(
                    "the renewal did not finish in time".into(),
                ))
            }
        }
    }

    fn lose(&self, term: Term, reason: &str) {
        self.set_term(None);
        tracing::warn!(server_id = %self.server_id, fencing_token = term.token, reason, "stepped down: this server is a standby now");
    }

    async fn release(&self, session: Option<LeaderSession>, term: Option<Term>) {
        if term.is_some() {
            self.set_term(None);
        }
        let Some(mut session) = session else {
            return;
        };
        if let Some(term) = term {
            match session.release(&self.server_id, term.token).await {
                Ok(true) => {
                    tracing::info!(server_id = %self.server_id, fencing_token = term.token, "released the leader lease")
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(server_id = %self.server_id, error = %e, "could not release the leader lease; it lapses on its own")
                }
            }
        }
        // Closing the connection drops the advisory lock.
        session.close().await;
    }

    /// Waits `duration`, or less when stopping.
    async fn pause(&self, duration: Duration) {
        tokio::select! {
            () = self.stop.cancelled() => {}
            () = tokio::time::sleep(duration) => {}
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Term {
    token: u64,
    holding_lock: bool,
    renewed: Instant,
}

impl Coordinator for LeaseCoordinator {
    fn server_id(&self) -> &str {
        &self.server_id
    }

    fn watch(&self) -> LeadershipWatch {
        LeadershipWatch {
            receiver: self.sender.subscribe(),
        }
    }

    fn leadership(&self) -> Leadership {
        let leadership = *self.sender.borrow();
        match self.valid_until() {
            Some(until) if Instant::now() < until => leadership,
            _ => Leadership::Follower,
        }
    }

    fn session_id(&self) -> Option<i64> {
        Some(self.session_pid.load(Ordering::Relaxed)).filter(|pid| *pid != 0)
    }

    fn fenced(&self) {
        // Only while leading: a stored permit would end the next term at once.
        if self.leadership().is_leader() {
            self.fenced.notify_one();
        }
    }

    fn step_down(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            self.stop.cancel();
            self.finished.cancelled().await;
        })
    }
}
