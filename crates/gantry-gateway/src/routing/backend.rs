//! One running instance as the gateway sees it (or a model provider, reached the same
//! way): its address, its pool of keep-alive connections, the requests in flight on it,
//! its health and its passive-ejection record (`eject.rs`), and the signal that it left
//! routing.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::uri::Authority;
use axum::http::HeaderValue;
use gantry_types::{units, InstanceState, ModelInstance};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::balance::{EJECTED_PENALTY, UNHEALTHY_PENALTY};
use crate::eject::{Ejected, Ejection, EjectionPolicy, Recovered};
use crate::providers::ProviderEndpoint;
use crate::shard::Sharded;
use crate::upstream::{ConnectError, ConnectionPool, UpstreamConnection};

/// One running instance as the gateway sees it — or a model provider
/// (`providers.rs`), which is reached the same way.
#[derive(Debug)]
pub struct Backend {
    /// The instance's id; for a provider, minus the provider's id.
    pub instance_id: i64,
    pub instance_name: String,
    /// The instance's model, for logs.
    pub model_name: String,
    /// Set for a model provider: how its requests differ from an instance's.
    pub provider: Option<Arc<ProviderEndpoint>>,
    /// `instance_name` as the `x-gantry-instance` response header.
    pub header_value: HeaderValue,
    /// `address` as the `Host` request header.
    pub host_header: HeaderValue,
    /// `host:port` as the worker reported it.
    pub address: String,
    pub authority: Authority,
    in_flight: AtomicU64,
    /// Milliseconds after [`clock_origin`] until which this instance counts as failing
    /// (it refused a connection); 0 when healthy.
    unhealthy_until_ms: AtomicU64,
    /// Idle keep-alive connections to the instance.
    pub pool: ConnectionPool,
    /// Connections opened to the instance so far.
    connections_opened: AtomicU64,
    /// Its failures in a row and ejection; taken only by failures and by the first
    /// success after them (see `failing`).
    ejection: Mutex<Ejection>,
    /// Whether `ejection` records any failure: a success takes the lock only then.
    failing: AtomicBool,
    /// `ejection`'s end of ejection as the balancer reads it without the lock:
    /// milliseconds after [`clock_origin`], 0 when not ejected (or back already).
    ejected_until_ms: AtomicU64,
    /// Times this instance was ejected.
    ejections: AtomicU64,
    /// Set when the routing table drops the instance (not `running` any more, deleted,
    /// moved to another address); never reset: a later return to routing makes a new
    /// `Backend`. What the balancer reads for every candidate of every request.
    left: AtomicBool,
    /// Tries waiting for a response head, woken when `left` is set: one wait list per
    /// shard (`shard.rs`), so a try joins and leaves a list only its own thread uses,
    /// not one that every request to the instance takes the lock of.
    left_waiters: Sharded<Notify>,
}

/// A fixed point the millisecond deadlines above count from.
fn clock_origin() -> Instant {
    static ORIGIN: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

fn now_ms() -> u64 {
    u64::try_from(clock_origin().elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// [`now_ms`], read the first time it is asked for and not at all when nothing asks:
/// a pick reads the clock only when an instance is refusing or ejected.
#[derive(Default)]
pub(super) struct LazyNow(std::cell::OnceCell<u64>);

impl LazyNow {
    fn get(&self) -> u64 {
        *self.0.get_or_init(now_ms)
    }
}

impl Backend {
    /// `None` when the instance cannot be routed to (no address, or one that is not
    /// `host:port`).
    pub(super) fn from_instance(instance: &ModelInstance) -> Option<Self> {
        if instance.state != InstanceState::Running {
            return None;
        }
        let address = instance.address.as_deref()?;
        let authority = match address.parse::<Authority>() {
            Ok(authority) if authority.port_u16().is_some() => authority,
            _ => {
                tracing::warn!(instance = %instance.name, address, "running instance has an address that is not host:port; not routing to it");
                return None;
            }
        };
        let header_value = HeaderValue::from_str(&instance.name).ok()?;
        let host_header = HeaderValue::from_str(address).ok()?;
        Some(Self::new(
            instance.id,
            instance.name.clone(),
            instance.model_name.clone(),
            None,
            header_value,
            host_header,
            address.to_string(),
            authority,
        ))
    }

    /// The backend of a model provider: `address` is where to connect (`host:port`),
    /// `host_header` what the `Host` header says.
    pub fn for_provider(
        endpoint: Arc<ProviderEndpoint>,
        address: String,
        authority: Authority,
        host_header: HeaderValue,
    ) -> Result<Self, String> {
        let header_value = HeaderValue::from_str(&endpoint.name)
            .map_err(|_| format!("name {:?} is not a header value", endpoint.name))?;
        Ok(Self::new(
            -endpoint.id,
            endpoint.name.to_string(),
            endpoint.name.to_string(),
            Some(endpoint),
            header_value,
            host_header,
            address,
            authority,
        ))
    }

    #[allow(clippy::too_many_arguments)]
    fn new(
        instance_id: i64,
        instance_name: String,
        model_name: String,
        provider: Option<Arc<ProviderEndpoint>>,
        header_value: HeaderValue,
        host_header: HeaderValue,
        address: String,
        authority: Authority,
    ) -> Self {
        Self {
            instance_id,
            instance_name,
            model_name,
            provider,
            header_value,
            host_header,
            address,
            authority,
            in_flight: AtomicU64::new(0),
            unhealthy_until_ms: AtomicU64::new(0),
            pool: ConnectionPool::default(),
            connections_opened: AtomicU64::new(0),
            ejection: Mutex::default(),
            failing: AtomicBool::new(false),
            ejected_until_ms: AtomicU64::new(0),
            ejections: AtomicU64::new(0),
            left: AtomicBool::new(false),
            left_waiters: Sharded::default(),
        }
    }

    /// An idle keep-alive connection, or a new one; `now` is the caller's reading of
    /// the clock.
    pub async fn connection(&self, now: Instant) -> Result<UpstreamConnection, ConnectError> {
        match self.pool.take(now) {
            Some(connection) => Ok(connection),
            // Boxed: connecting (a TLS handshake's state included) is most of a
            // request's future by size, and that future is moved on every request;
            // a pooled connection, the usual case, needs none of it.
            None => Box::pin(self.connect()).await,
        }
    }

    /// Keeps a connection whose response ended cleanly for the next request — unless the
    /// instance has left routing: then no request will take it, and an open connection
    /// would tell the instance's worker, draining it before a stop, that a request is
    /// still under way (`gantry-worker`'s `drain.rs`). `now` is the caller's reading of
    /// the clock.
    pub fn give_back(&self, connection: UpstreamConnection, now: Instant) {
        if self.has_left_routing() {
            return;
        }
        self.pool.give_back(connection, now);
        // Left while it was given back: the removal may have closed the idle connections
        // before this one arrived (the pool's lock orders the two).
        if self.has_left_routing() {
            self.pool.close_idle();
        }
    }

    /// A new connection.
    pub async fn connect(&self) -> Result<UpstreamConnection, ConnectError> {
        let tls_name = self.provider.as_ref().and_then(|p| p.tls_name.as_ref());
        let connection = UpstreamConnection::connect_with(&self.address, tls_name).await?;
        self.connections_opened.fetch_add(1, Ordering::Relaxed);
        Ok(connection)
    }

    /// Connections opened to the instance so far (reuse keeps this low).
    pub fn connections_opened(&self) -> u64 {
        self.connections_opened.load(Ordering::Relaxed)
    }

    /// Requests being proxied to this instance now.
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Makes the balancer avoid this instance for a while.
    pub fn mark_failing(&self, duration: Duration) {
        let until = now_ms().saturating_add(u64::try_from(duration.as_millis()).unwrap_or(0));
        self.unhealthy_until_ms.store(until, Ordering::Relaxed);
    }

    /// The instance answered: forget an earlier failure.
    pub fn mark_healthy(&self) {
        if self.unhealthy_until_ms.load(Ordering::Relaxed) != 0 {
            self.unhealthy_until_ms.store(0, Ordering::Relaxed);
        }
    }

    /// Counts a failed try (connection error, 5xx answer, no response head in time)
    /// towards ejection; `Some` when it ejects the instance (the caller logs it).
    pub fn record_failure(&self, policy: &EjectionPolicy) -> Option<Ejected> {
        let mut ejection = self.ejection.lock().unwrap_or_else(|e| e.into_inner());
        self.failing.store(true, Ordering::Relaxed);
        let ejected = ejection.record_failure(now_ms(), policy)?;
        self.ejected_until_ms
            .store(ejected.until_ms, Ordering::Relaxed);
        self.ejections.fetch_add(1, Ordering::Relaxed);
        Some(ejected)
    }

    /// Counts an answer: forgets the failures in a row and ends an ejection. `Some`
    /// when there was something to forget (the caller logs an ended ejection). Takes
    /// no lock unless the instance has been failing.
    pub fn record_success(&self) -> Option<Recovered> {
        if !self.failing.load(Ordering::Relaxed) {
            return None;
        }
        let mut ejection = self.ejection.lock().unwrap_or_else(|e| e.into_inner());
        self.failing.store(false, Ordering::Relaxed);
        self.ejected_until_ms.store(0, Ordering::Relaxed);
        ejection.record_success(now_ms())
    }

    /// Whether the instance is ejected now. The first call after its cooldown ended
    /// logs its return to routing (still counting as failing: one more failure ejects
    /// it again).
    pub fn is_ejected(&self) -> bool {
        self.ejected_at(&LazyNow::default())
    }

    fn ejected_at(&self, now: &LazyNow) -> bool {
        let until = self.ejected_until_ms.load(Ordering::Relaxed);
        if until == 0 {
            return false;
        }
        if until > now.get() {
            return true;
        }
        // Only the caller that clears the deadline logs; a new ejection stored in
        // between makes the exchange fail.
        if self
            .ejected_until_ms
            .compare_exchange(until, 0, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            let (failures, cooldown) = {
                let ejection = self.ejection.lock().unwrap_or_else(|e| e.into_inner());
                (ejection.consecutive_failures(), ejection.cooldown())
            };
            tracing::info!(
                model = %self.model_name,
                instance = %self.instance_name,
                instance_id = self.instance_id,
                failures,
                cooldown = %units::format_duration(cooldown),
                "ejection cooldown ended; instance is back in routing (its next failure ejects it again)"
            );
        }
        false
    }

    /// Times this instance was ejected (`/metrics`).
    pub fn ejections(&self) -> u64 {
        self.ejections.load(Ordering::Relaxed)
    }

    /// Completes when the routing table drops this instance; at once if it has.
    pub async fn left_routing(&self) {
        let notified = self.left_waiters.local().notified();
        let mut notified = std::pin::pin!(notified);
        // On the list before `left` is read: a removal after the read wakes it.
        notified.as_mut().enable();
        if self.has_left_routing() {
            return;
        }
        notified.await;
    }

    /// Whether the routing table has dropped this instance.
    pub fn has_left_routing(&self) -> bool {
        self.left.load(Ordering::Acquire)
    }

    /// Called by the routing task when it drops the instance (and by the route table
    /// when a provider changes): requests waiting for its response head give up on it,
    /// and its idle connections are closed (the requests under way keep theirs).
    pub(crate) fn leave_routing(&self) {
        if !self.left.swap(true, Ordering::AcqRel) {
            tracing::debug!(instance = %self.instance_name, instance_id = self.instance_id, in_flight = self.in_flight(), "instance left routing");
            for waiters in self.left_waiters.iter() {
                waiters.notify_waiters();
            }
            self.pool.close_idle();
        }
    }

    /// Whether the balancer would pick this backend without reservation: in routing,
    /// not ejected and not recently refusing connections.
    pub fn is_healthy(&self) -> bool {
        !self.has_left_routing() && self.load(&LazyNow::default()) < UNHEALTHY_PENALTY
    }

    pub(super) fn load(&self, now: &LazyNow) -> u64 {
        let refused_until = self.unhealthy_until_ms.load(Ordering::Relaxed);
        let refused = if refused_until != 0 && refused_until > now.get() {
            UNHEALTHY_PENALTY
        } else {
            0
        };
        let ejected = if self.ejected_at(now) {
            EJECTED_PENALTY
        } else {
            0
        };
        self.in_flight() + refused + ejected
    }
}

/// Holds one request in an instance's in-flight count.
#[derive(Debug)]
pub struct InFlightGuard(Arc<Backend>);

impl InFlightGuard {
    /// Counts a request to `backend` until the guard is dropped.
    pub fn start(backend: Arc<Backend>) -> Self {
        backend.in_flight.fetch_add(1, Ordering::Relaxed);
        Self(backend)
    }

    pub fn backend(&self) -> &Arc<Backend> {
        &self.0
    }
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}
