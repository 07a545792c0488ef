//! Coordination between gantry servers: who is the leader, and the fencing token that
//! proves it.
//!
//! Several servers may share one database, but only one of them — the leader — runs the
//! scheduler and the controllers. A [`Coordinator`] answers "am I the leader, and with
//! which token?" and lets a loop wait until that answer changes.
//!
//! Two backends:
//!
//! * [`LocalCoordinator`]: one server, always the leader with a constant token. It is
//!   what `gantry start`, SQLite and `scheduling_mode: local` use.
//! * [`LeaseCoordinator`] (`lease.rs`): several servers on one PostgreSQL. Leadership is
//!   a lease row (`holder`, `fencing_token`, `expires_at`) that the leader renews and
//!   another server takes over once it lapses or its holder's session dies, incrementing
//!   the token. A background task keeps the answer current, so
//!   [`Coordinator::is_leader`] and [`Coordinator::fencing_token`] read local state and
//!   never wait on the database.
//!
//! **Where the token is checked.** Being told "you are the leader" is not enough: a
//! server that was paused (GC, swap, a stopped VM) may wake up after its lease expired and
//! another server took over. So every write a leader-only loop makes carries the token
//! it held when it decided (`gantry_store::Fence`), and the store applies the write only
//! while that token is still the current one, inside the write's own statement. A write
//! refused that way is reported with [`Coordinator::fenced`], and the server steps down.
//!
//! *Architecture Invariant:* this crate knows nothing about models, instances or workers.

mod lease;

pub use lease::{LeaseConfig, LeaseCoordinator, DEFAULT_LEASE_RENEW_INTERVAL, DEFAULT_LEASE_TTL};

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use tokio::sync::watch;

/// A boxed future, for the async methods of the object-safe [`Coordinator`].
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// This server's role at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leadership {
    /// Another server leads, or nobody does yet: leader-only loops stay idle.
    Follower,
    /// This server leads. `fencing_token` grows every time leadership changes hands, so a
    /// write carrying an older token comes from a leader that has been replaced.
    Leader {
        /// The token of this term.
        fencing_token: u64,
    },
}

impl Leadership {
    /// Whether this is the leader.
    pub fn is_leader(self) -> bool {
        matches!(self, Leadership::Leader { .. })
    }

    /// The fencing token of the current term, when leading.
    pub fn fencing_token(self) -> Option<u64> {
        match self {
            Leadership::Leader { fencing_token } => Some(fencing_token),
            Leadership::Follower => None,
        }
    }
}

/// Decides which server leads. Object safe, so the server holds an
/// `Arc<dyn Coordinator>` and does not care which backend it has.
pub trait Coordinator: Send + Sync + fmt::Debug + 'static {
    /// This server's id, as other servers and the logs know it.
    fn server_id(&self) -> &str;

    /// A receiver of every leadership change, starting from the current value.
    fn watch(&self) -> LeadershipWatch;

    /// The current role. Never waits: backends keep it current in the background.
    fn leadership(&self) -> Leadership;

    /// Whether this server leads now.
    fn is_leader(&self) -> bool {
        self.leadership().is_leader()
    }

    /// The fencing token of the current term, when leading. Leader-only writes carry it
    /// (see the crate documentation for where it is checked).
    fn fencing_token(&self) -> Option<u64> {
        self.leadership().fencing_token()
    }

    /// A write carrying this server's token was refused as stale: another server leads.
    /// Stops leading at once. The local backend has nobody to lose to.
    fn fenced(&self) {}

    /// The database session that shows this server is alive (the backend pid of the
    /// lease's connection), so the registry can tell a dead server from a live one at
    /// once; `None` for the local backend.
    fn session_id(&self) -> Option<i64> {
        None
    }

    /// Gives leadership up (at shutdown), so another server can take over at once rather
    /// than after the lease expires. Idempotent.
    fn step_down(&self) -> BoxFuture<'_, ()>;
}

/// Waits for leadership changes. Cheap to clone; every clone sees every later change.
#[derive(Debug, Clone)]
pub struct LeadershipWatch {
    pub(crate) receiver: watch::Receiver<Leadership>,
}

impl LeadershipWatch {
    /// The role now.
    pub fn current(&self) -> Leadership {
        *self.receiver.borrow()
    }

    /// Waits until the role differs from the last one this watch returned, and returns
    /// the new role. When the coordinator is gone, the role stays as it was and this
    /// never returns, which is what a loop waiting for work wants.
    pub async fn changed(&mut self) -> Leadership {
        if self.receiver.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
        *self.receiver.borrow_and_update()
    }

    /// Returns the fencing token as soon as this server leads (at once if it does now).
    pub async fn until_leader(&mut self) -> u64 {
        loop {
            if let Some(token) = self.receiver.borrow_and_update().fencing_token() {
                return token;
            }
            self.changed().await;
        }
    }
}

/// The single-server backend: this server is the leader from the start, with token 1,
/// until [`Coordinator::step_down`].
#[derive(Debug)]
pub struct LocalCoordinator {
    server_id: String,
    sender: watch::Sender<Leadership>,
}

/// The token the local backend leads with. Constant: with one server there is never a
/// previous leader to fence off.
pub const LOCAL_FENCING_TOKEN: u64 = 1;

impl LocalCoordinator {
    /// A coordinator that leads.
    pub fn new(server_id: impl Into<String>) -> Self {
        let (sender, _) = watch::channel(Leadership::Leader {
            fencing_token: LOCAL_FENCING_TOKEN,
        });
        LocalCoordinator {
            server_id: server_id.into(),
            sender,
        }
    }

    /// Sets the role by hand: tests use it to check that leader-only loops pause and
    /// resume.
    pub fn set_leadership(&self, leadership: Leadership) {
        self.sender.send_replace(leadership);
    }
}

impl Coordinator for LocalCoordinator {
    fn server_id(&self) -> &str {
        &self.server_id
    }

    fn watch(&self) -> LeadershipWatch {
        LeadershipWatch {
            receiver: self.sender.subscribe(),
        }
    }

    fn leadership(&self) -> Leadership {
        *self.sender.borrow()
    }

    fn step_down(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            self.sender.send_replace(Leadership::Follower);
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    #[test]
    fn local_coordinator_leads_with_a_constant_token() {
        let coordinator = LocalCoordinator::new("s1");
        assert_eq!(coordinator.server_id(), "s1");
        assert!(coordinator.is_leader());
        assert_eq!(coordinator.fencing_token(), Some(LOCAL_FENCING_TOKEN));
        assert_eq!(coordinator.watch().current().fencing_token(), Some(1));
    }

    #[tokio::test(start_paused = true)]
    async fn step_down_makes_a_follower_and_is_idempotent() {
        let coordinator = LocalCoordinator::new("s1");
        let mut watch = coordinator.watch();
        coordinator.step_down().await;
        coordinator.step_down().await;
        assert!(!coordinator.is_leader());
        assert_eq!(coordinator.fencing_token(), None);
        assert_eq!(watch.changed().await, Leadership::Follower);
    }

    #[tokio::test(start_paused = true)]
    async fn until_leader_waits_for_leadership() {
        let coordinator: Arc<dyn Coordinator> = Arc::new(LocalCoordinator::new("s1"));
        let mut watch = coordinator.watch();
        assert_eq!(watch.until_leader().await, 1, "already leading: at once");

        let local = Arc::new(LocalCoordinator::new("s2"));
        local.set_leadership(Leadership::Follower);
        let mut watch = local.watch();
        let waiter = tokio::spawn(async move { watch.until_leader().await });
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(!waiter.is_finished(), "a follower keeps waiting");
        local.set_leadership(Leadership::Leader { fencing_token: 7 });
        assert_eq!(waiter.await.expect("the waiter ends"), 7);
    }

    #[tokio::test(start_paused = true)]
    async fn changed_reports_each_new_role() {
        let coordinator = LocalCoordinator::new("s1");
        let mut watch = coordinator.watch();
        coordinator.set_leadership(Leadership::Follower);
        assert_eq!(watch.changed().await, Leadership::Follower);
        coordinator.set_leadership(Leadership::Leader { fencing_token: 2 });
        assert_eq!(
            watch.changed().await,
            Leadership::Leader { fencing_token: 2 }
        );
    }
}
