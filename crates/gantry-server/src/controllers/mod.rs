//! Background loops that move the observed state toward the desired state. They are
//! level-triggered: each pass looks at the store as it is now, so a missed wake-up is
//! healed by the next pass.

pub mod worker_health;
