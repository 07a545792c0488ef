//! The port allocator: hands out ports for backend processes from a configured range.
//!
//! Invariants:
//! - a port is never handed to two live leases at once; a lease gives its ports back when it
//!   is dropped (or [`PortLease::release`]d), which the supervisor does only after the
//!   backend's process group is gone;
//! - a port that someone else is listening on (found by binding it before handing it out) is
//!   skipped;
//! - groups of consecutive ports can be allocated for data-parallel instances (`base + rank`).
//!
//! Allocation walks the range from just after the last port handed out, wrapping around, so
//! a port that was just released is the last one picked again: a client that still holds the
//! old instance's address is less likely to reach a different instance.

use std::collections::BTreeSet;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::ops::RangeInclusive;
use std::sync::{Arc, Mutex, MutexGuard};

/// Why ports could not be allocated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PortError {
    #[error("the port range {start}..={end} is empty")]
    EmptyRange { start: u16, end: u16 },
    #[error("cannot allocate 0 ports")]
    ZeroCount,
    #[error(
        "no {count} free consecutive port(s) in {start}..={end} ({in_use} handed out by this worker)"
    )]
    Exhausted {
        count: usize,
        start: u16,
        end: u16,
        in_use: usize,
    },
}

/// Hands out ports from a range. Cheap to clone; clones share the same bookkeeping.
#[derive(Clone)]
pub struct PortAllocator {
    inner: Arc<Mutex<AllocatorState>>,
}

struct AllocatorState {
    range: RangeInclusive<u16>,
    /// The host a port is test-bound on before it is handed out.
    probe_host: IpAddr,
    /// Ports held by live leases.
    leased: BTreeSet<u16>,
    /// Where the next search starts.
    cursor: u16,
}

impl fmt::Debug for PortAllocator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.state();
        f.debug_struct("PortAllocator")
            .field("range", &state.range)
            .field("probe_host", &state.probe_host)
            .field("leased", &state.leased)
            .finish()
    }
}

impl PortAllocator {
    /// An allocator over `range` that checks a port is free by binding `probe_host:port`.
    /// Pass the host the backends will bind to; an unspecified address (`0.0.0.0`) also
    /// catches listeners on any single interface.
    pub fn new(range: RangeInclusive<u16>, probe_host: IpAddr) -> Result<Self, PortError> {
        if range.is_empty() {
            return Err(PortError::EmptyRange {
                start: *range.start(),
                end: *range.end(),
            });
        }
        let cursor = *range.start();
        Ok(Self {
            inner: Arc::new(Mutex::new(AllocatorState {
                range,
                probe_host,
                leased: BTreeSet::new(),
                cursor,
            })),
        })
    }

    /// An allocator probing on 127.0.0.1.
    pub fn with_loopback_probe(range: RangeInclusive<u16>) -> Result<Self, PortError> {
        Self::new(range, IpAddr::V4(Ipv4Addr::LOCALHOST))
    }

    /// Allocates `count` consecutive ports (`count = 1` for an ordinary instance), none of
    /// them leased and all of them bindable right now.
    pub fn allocate(&self, count: usize) -> Result<PortLease, PortError> {
        let mut state = self.state();
        let ports = state.find_free_run(count)?;
        for port in &ports {
            let inserted = state.leased.insert(*port);
            debug_assert!(inserted, "port {port} was handed out twice");
        }
        let last = *ports
            .last()
            .expect("find_free_run returns at least one port");
        state.cursor = if last >= *state.range.end() {
            *state.range.start()
        } else {
            last + 1
        };
        Ok(PortLease {
            ports,
            allocator: Some(self.clone()),
        })
    }

    /// Whether every port of `lease` can still be bound (nobody else took it while the
    /// lease's backend was down). Used before restarting a backend on the same ports.
    pub fn lease_is_bindable(&self, lease: &PortLease) -> bool {
        let probe_host = self.state().probe_host;
        lease
            .ports
            .iter()
            .all(|port| is_bindable(probe_host, *port))
    }

    /// The ports currently leased, in ascending order.
    pub fn leased(&self) -> Vec<u16> {
        self.state().leased.iter().copied().collect()
    }

    fn release(&self, ports: &[u16]) {
        let mut state = self.state();
        for port in ports {
            let removed = state.leased.remove(port);
            debug_assert!(removed, "port {port} released but not leased");
        }
    }

    fn state(&self) -> MutexGuard<'_, AllocatorState> {
        // A panic while holding the lock cannot leave the set half-updated in a way that
        // matters more than losing the worker, so a poisoned lock is taken over.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl AllocatorState {
    fn find_free_run(&self, count: usize) -> Result<Vec<u16>, PortError> {
        if count == 0 {
            return Err(PortError::ZeroCount);
        }
        let start = u32::from(*self.range.start());
        let end = u32::from(*self.range.end());
        let size = end - start + 1;
        let exhausted = || PortError::Exhausted {
            count,
            start: start as u16,
            end: end as u16,
            in_use: self.leased.len(),
        };
        let count_u32 = u32::try_from(count).map_err(|_| exhausted())?;
        if count_u32 > size {
            return Err(exhausted());
        }
        let cursor_offset = u32::from(self.cursor).saturating_sub(start) % size;
        for step in 0..size {
            let base = start + (cursor_offset + step) % size;
            // A group never wraps around the end of the range: its ports are base + rank.
            if base + count_u32 - 1 > end {
                continue;
            }
            let candidate: Vec<u16> = (base..base + count_u32).map(|p| p as u16).collect();
            let free = candidate
                .iter()
                .all(|port| !self.leased.contains(port) && is_bindable(self.probe_host, *port));
            if free {
                return Ok(candidate);
            }
        }
        Err(exhausted())
    }
}

/// Whether `host:port` can be bound right now. The listener is closed at once; std sets
/// `SO_REUSEADDR`, so connections of a previous owner lingering in `TIME_WAIT` do not count
/// as "in use" (backends set it too).
fn is_bindable(host: IpAddr, port: u16) -> bool {
    TcpListener::bind(SocketAddr::new(host, port)).is_ok()
}

/// Ports held for one instance. Dropping the lease gives the ports back.
pub struct PortLease {
    ports: Vec<u16>,
    /// `None` once released.
    allocator: Option<PortAllocator>,
}

impl fmt::Debug for PortLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PortLease")
            .field("ports", &self.ports)
            .finish()
    }
}

impl PortLease {
    /// The ports, consecutive and ascending; rank `r` of a data-parallel group uses
    /// `ports()[r]`.
    pub fn ports(&self) -> &[u16] {
        &self.ports
    }

    /// The first port: the one advertised for the instance.
    pub fn first(&self) -> u16 {
        self.ports[0]
    }

    /// Gives the ports back now (the same as dropping the lease).
    pub fn release(mut self) {
        self.release_inner();
    }

    fn release_inner(&mut self) {
        if let Some(allocator) = self.allocator.take() {
            allocator.release(&self.ports);
        }
    }
}

impl Drop for PortLease {
    fn drop(&mut self) {
        self.release_inner();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A range of `len` ports that are free on this machine right now, found by asking the
    /// kernel for an ephemeral port and checking the ones after it.
    fn free_range(len: u16) -> RangeInclusive<u16> {
        for _ in 0..50 {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let base = listener.local_addr().unwrap().port();
            drop(listener);
            if base.checked_add(len).is_none() {
                continue;
            }
            if (base..base + len).all(|p| is_bindable(IpAddr::V4(Ipv4Addr::LOCALHOST), p)) {
                return base..=base + len - 1;
            }
        }
        panic!("no free range of {len} ports found");
    }

    #[test]
    fn never_hands_a_port_out_twice_while_leased() {
        let range = free_range(4);
        let allocator = PortAllocator::with_loopback_probe(range.clone()).unwrap();
        let leases: Vec<PortLease> = (0..4).map(|_| allocator.allocate(1).unwrap()).collect();
        let mut ports: Vec<u16> = leases.iter().map(|l| l.first()).collect();
        ports.sort_unstable();
        assert_eq!(ports, range.clone().collect::<Vec<_>>());
        assert!(matches!(
            allocator.allocate(1),
            Err(PortError::Exhausted { in_use: 4, .. })
        ));
    }

    #[test]
    fn recycles_ports_on_release() {
        let range = free_range(2);
        let allocator = PortAllocator::with_loopback_probe(range).unwrap();
        let first = allocator.allocate(1).unwrap();
        let second = allocator.allocate(1).unwrap();
        let freed = first.first();
        drop(first);
        assert_eq!(allocator.leased(), vec![second.first()]);
        let again = allocator.allocate(1).unwrap();
        assert_eq!(again.first(), freed);
        second.release();
        assert_eq!(allocator.leased(), vec![again.first()]);
    }

    #[test]
    fn prefers_ports_not_just_released() {
        let range = free_range(3);
        let allocator = PortAllocator::with_loopback_probe(range.clone()).unwrap();
        let first = allocator.allocate(1).unwrap();
        let port = first.first();
        drop(first);
        let next = allocator.allocate(1).unwrap();
        assert_ne!(next.first(), port, "the cursor moves past a released port");
    }

    #[test]
    fn skips_ports_someone_else_listens_on() {
        let range = free_range(3);
        let busy = TcpListener::bind(("127.0.0.1", *range.start())).unwrap();
        let allocator = PortAllocator::with_loopback_probe(range.clone()).unwrap();
        let lease = allocator.allocate(1).unwrap();
        assert_ne!(lease.first(), *range.start());
        drop(busy);
    }

    #[test]
    fn allocates_consecutive_groups_around_busy_ports() {
        let range = free_range(6);
        let start = *range.start();
        let allocator = PortAllocator::with_loopback_probe(range).unwrap();
        // Someone listens on start+1, so the first run of three free ports is start+2..=start+4.
        let busy = TcpListener::bind(("127.0.0.1", start + 1)).unwrap();
        let group = allocator.allocate(3).unwrap();
        assert_eq!(group.ports(), &[start + 2, start + 3, start + 4]);
        // Only start and start+5 are left, not consecutive: a pair cannot be found.
        assert!(matches!(
            allocator.allocate(2),
            Err(PortError::Exhausted { count: 2, .. })
        ));
        drop(busy);
        let pair = allocator.allocate(2).unwrap();
        assert_eq!(pair.ports(), &[start, start + 1]);
    }

    #[test]
    fn a_group_never_wraps_around_the_end_of_the_range() {
        let range = free_range(3);
        let start = *range.start();
        let allocator = PortAllocator::with_loopback_probe(range).unwrap();
        let single = allocator.allocate(1).unwrap();
        assert_eq!(single.first(), start);
        drop(single);
        // The cursor is at start+1; start+1..=start+2 is a valid pair.
        let pair = allocator.allocate(2).unwrap();
        assert_eq!(pair.ports(), &[start + 1, start + 2]);
        drop(pair);
        // The cursor wrapped to start; a triple must be start..=start+2.
        let triple = allocator.allocate(3).unwrap();
        assert_eq!(triple.ports(), &[start, start + 1, start + 2]);
    }

    #[test]
    fn rejects_empty_ranges_and_zero_counts() {
        #[allow(clippy::reversed_empty_ranges)]
        let empty = 5..=4;
        assert!(matches!(
            PortAllocator::with_loopback_probe(empty),
            Err(PortError::EmptyRange { .. })
        ));
        let allocator = PortAllocator::with_loopback_probe(free_range(1)).unwrap();
        assert_eq!(allocator.allocate(0).unwrap_err(), PortError::ZeroCount);
        assert!(matches!(
            allocator.allocate(2),
            Err(PortError::Exhausted { .. })
        ));
    }

    #[test]
    fn lease_is_bindable_notices_a_squatter() {
        let range = free_range(1);
        let allocator = PortAllocator::with_loopback_probe(range).unwrap();
        let lease = allocator.allocate(1).unwrap();
        assert!(allocator.lease_is_bindable(&lease));
        let squatter = TcpListener::bind(("127.0.0.1", lease.first())).unwrap();
        assert!(!allocator.lease_is_bindable(&lease));
        drop(squatter);
    }
}
