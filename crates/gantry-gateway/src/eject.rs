//! Passive ejection: an instance that keeps failing the gateway's requests is taken out
//! of routing for a while, without any probe of its own. Failures are what requests
//! meet anyway: a connection refused or broken before the answer, a 5xx answer, no
//! response head within `gateway_first_byte_timeout`.
//!
//! [`EjectionPolicy::eject_after`] failures in a row eject an instance for
//! [`EjectionPolicy::cooldown`]. When the cooldown ends the instance is routed to again,
//! still counting as failing: its next failure ejects it at once, for twice the previous
//! cooldown (at most [`MAX_EJECTION_COOLDOWN`]). One success forgets it all. A frozen
//! backend so costs a handful of requests (each retried elsewhere) and then one request
//! per cooldown, which grows from seconds to minutes while it stays frozen.
//!
//! The bookkeeping is a pure value over a millisecond clock the caller reads, tested
//! without a clock; `routing/backend.rs` keeps one per instance behind a lock that only failing
//! instances take.

use std::time::Duration;

/// Failures in a row that eject an instance, unless configured
/// (`gateway_eject_after`).
pub const DEFAULT_EJECT_AFTER: usize = 5;
/// The first ejection's length, unless configured (`gateway_eject_cooldown`).
pub const DEFAULT_EJECT_COOLDOWN: Duration = Duration::from_secs(10);
/// The longest ejection: a cooldown that doubles stops growing here.
pub const MAX_EJECTION_COOLDOWN: Duration = Duration::from_secs(5 * 60);

/// When an instance is ejected and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EjectionPolicy {
    /// Failures in a row that eject an instance; at least 1.
    pub eject_after: usize,
    /// The length of a first ejection; each further one (without a success between)
    /// doubles it, up to [`MAX_EJECTION_COOLDOWN`].
    pub cooldown: Duration,
}

impl Default for EjectionPolicy {
    fn default() -> Self {
        Self {
            eject_after: DEFAULT_EJECT_AFTER,
            cooldown: DEFAULT_EJECT_COOLDOWN,
        }
    }
}

impl EjectionPolicy {
    /// The length of an ejection that follows `earlier` ejections without a success
    /// between: `cooldown × 2^earlier`, at most [`MAX_EJECTION_COOLDOWN`] (and never
    /// shorter than `cooldown`, should that be configured above the cap).
    pub fn cooldown_after(&self, earlier: u32) -> Duration {
        let factor = 1u32.checked_shl(earlier).unwrap_or(u32::MAX);
        self.cooldown
            .saturating_mul(factor)
            .min(MAX_EJECTION_COOLDOWN.max(self.cooldown))
    }
}

/// An instance was just ejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ejected {
    /// Its failures in a row (since its last success).
    pub failures: u32,
    /// How long it stays out of routing.
    pub cooldown: Duration,
    /// Its ejections in a row, this one included (1 for a first ejection).
    pub ejections_in_a_row: u32,
    /// Milliseconds on the caller's clock until which it is out.
    pub until_ms: u64,
}

/// What a success ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recovered {
    /// The failures in a row the success ended.
    pub failures: u32,
    /// Whether the instance was ejected at that moment (a request sent before its
    /// ejection, or sent to it because every instance was ejected, succeeded).
    pub was_ejected: bool,
}

/// The failure record of one instance.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ejection {
    /// Failures since the last success. It is not reset by an ejection: an instance
    /// back from one that fails again is ejected again at once.
    consecutive_failures: u32,
    /// Ejections since the last success: the exponent of the next cooldown.
    ejections_in_a_row: u32,
    /// Milliseconds on the caller's clock until which the instance is out of routing;
    /// 0 when it never was since the last success.
    ejected_until_ms: u64,
    /// The length of the latest ejection (zero when none since the last success).
    cooldown: Duration,
}

impl Ejection {
    /// Whether the instance is out of routing at `now_ms`.
    pub fn is_ejected(&self, now_ms: u64) -> bool {
        self.ejected_until_ms > now_ms
    }

    /// Failures since the last success.
    pub fn consecutive_failures(&self) -> u32 {
        self.consecutive_failures
    }

    /// The length of the latest ejection since the last success (zero when none).
    pub fn cooldown(&self) -> Duration {
        self.cooldown
    }

    /// Records a failed try; `Some` when it ejects the instance. A failure while the
    /// instance is already out (a request sent before the ejection, or sent there
    /// because every instance was out) counts but neither ejects again nor extends
    /// the cooldown.
    pub fn record_failure(&mut self, now_ms: u64, policy: &EjectionPolicy) -> Option<Ejected> {
        self.consecutive_failures = self.consecutive_failures.saturating_add(1);
        if self.is_ejected(now_ms) {
            return None;
        }
        let threshold = u32::try_from(policy.eject_after.max(1)).unwrap_or(u32::MAX);
        if self.consecutive_failures < threshold {
            return None;
        }
        let cooldown = policy.cooldown_after(self.ejections_in_a_row);
        self.ejections_in_a_row = self.ejections_in_a_row.saturating_add(1);
        let cooldown_ms = u64::try_from(cooldown.as_millis()).unwrap_or(u64::MAX);
        // At least 1 ms, so that 0 keeps meaning "not ejected".
        self.ejected_until_ms = now_ms.saturating_add(cooldown_ms).max(1);
        self.cooldown = cooldown;
        Some(Ejected {
            failures: self.consecutive_failures,
            cooldown,
            ejections_in_a_row: self.ejections_in_a_row,
            until_ms: self.ejected_until_ms,
        })
    }

    /// Records an answer; `Some` when it ended a run of failures (and so possibly an
    /// ejection).
    pub fn record_success(&mut self, now_ms: u64) -> Option<Recovered> {
        if self.consecutive_failures == 0 && self.ejections_in_a_row == 0 {
            return None;
        }
        let recovered = Recovered {
            failures: self.consecutive_failures,
            was_ejected: self.is_ejected(now_ms),
        };
        *self = Self::default();
        Some(recovered)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(eject_after: usize, cooldown_secs: u64) -> EjectionPolicy {
        EjectionPolicy {
            eject_after,
            cooldown: Duration::from_secs(cooldown_secs),
        }
    }

    #[test]
    fn cooldown_doubles_with_each_ejection_in_a_row_up_to_five_minutes() {
        let p = policy(5, 10);
        let secs: Vec<u64> = (0..7).map(|n| p.cooldown_after(n).as_secs()).collect();
        assert_eq!(secs, vec![10, 20, 40, 80, 160, 300, 300]);
        // No overflow however long the run.
        assert_eq!(p.cooldown_after(31), MAX_EJECTION_COOLDOWN);
        assert_eq!(p.cooldown_after(32), MAX_EJECTION_COOLDOWN);
        assert_eq!(p.cooldown_after(u32::MAX), MAX_EJECTION_COOLDOWN);
        // A configured cooldown above the cap is used as it is, never shortened.
        let long = policy(5, 600);
        assert_eq!(long.cooldown_after(0), Duration::from_secs(600));
        assert_eq!(long.cooldown_after(3), Duration::from_secs(600));
    }

    #[test]
    fn an_instance_is_ejected_after_the_configured_failures_in_a_row() {
        let p = policy(3, 10);
        let mut e = Ejection::default();
        assert_eq!(e.record_failure(1_000, &p), None);
        assert_eq!(e.record_failure(1_100, &p), None);
        let ejected = e.record_failure(1_200, &p).expect("third failure ejects");
        assert_eq!(
            ejected,
            Ejected {
                failures: 3,
                cooldown: Duration::from_secs(10),
                ejections_in_a_row: 1,
                until_ms: 11_200,
            }
        );
        assert!(e.is_ejected(1_200));
        assert!(e.is_ejected(11_199));
        assert!(!e.is_ejected(11_200));
        assert_eq!(e.cooldown(), Duration::from_secs(10));
    }

    #[test]
    fn a_success_resets_the_count_of_failures_in_a_row() {
        let p = policy(3, 10);
        let mut e = Ejection::default();
        e.record_failure(0, &p);
        e.record_failure(0, &p);
        assert_eq!(
            e.record_success(0),
            Some(Recovered {
                failures: 2,
                was_ejected: false
            })
        );
        assert_eq!(e.record_success(0), None, "nothing left to reset");
        assert_eq!(e.record_failure(0, &p), None);
        assert_eq!(e.record_failure(0, &p), None);
        assert!(e.record_failure(0, &p).is_some());
    }

    #[test]
    fn failures_while_ejected_neither_eject_again_nor_extend_the_cooldown() {
        let p = policy(1, 10);
        let mut e = Ejection::default();
        let first = e.record_failure(0, &p).unwrap();
        assert_eq!(first.until_ms, 10_000);
        // Requests sent before the ejection fail later.
        assert_eq!(e.record_failure(5_000, &p), None);
        assert_eq!(e.record_failure(9_999, &p), None);
        assert!(!e.is_ejected(10_000));
        assert_eq!(e.consecutive_failures(), 3);
    }

    #[test]
    fn an_instance_back_from_ejection_that_fails_again_is_ejected_at_once_for_twice_as_long() {
        let p = policy(5, 10);
        let mut e = Ejection::default();
        for _ in 0..4 {
            assert_eq!(e.record_failure(0, &p), None);
        }
        let mut now = 0;
        let mut cooldowns = Vec::new();
        let ejected = e.record_failure(now, &p).unwrap();
        cooldowns.push(ejected.cooldown.as_secs());
        for _ in 0..6 {
            // Back in routing when the cooldown ends; its first try fails again.
            now = ejected_until(&e);
            let again = e.record_failure(now, &p).expect("one failure suffices");
            assert_eq!(again.failures, e.consecutive_failures());
            cooldowns.push(again.cooldown.as_secs());
        }
        assert_eq!(cooldowns, vec![10, 20, 40, 80, 160, 300, 300]);
    }

    #[test]
    fn a_success_after_ejection_starts_over_from_the_first_cooldown() {
        let p = policy(2, 10);
        let mut e = Ejection::default();
        e.record_failure(0, &p);
        let first = e.record_failure(0, &p).unwrap();
        let second = e.record_failure(first.until_ms, &p).unwrap();
        assert_eq!(second.cooldown, Duration::from_secs(20));
        // Served a request while ejected (the only instance left, say).
        assert_eq!(
            e.record_success(second.until_ms - 1),
            Some(Recovered {
                failures: 3,
                was_ejected: true
            })
        );
        assert!(!e.is_ejected(second.until_ms - 1));
        let now = second.until_ms;
        assert_eq!(e.record_failure(now, &p), None, "the count starts over");
        let third = e.record_failure(now, &p).unwrap();
        assert_eq!(third.cooldown, Duration::from_secs(10));
        assert_eq!(third.ejections_in_a_row, 1);
    }

    fn ejected_until(e: &Ejection) -> u64 {
        e.ejected_until_ms
    }
}
