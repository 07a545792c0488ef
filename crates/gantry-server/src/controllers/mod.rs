//! Background loops that move the observed state toward the desired state. They are
//! level-triggered: each pass looks at the store as it is now, so a missed wake-up is
//! healed by the next pass.

pub mod analyze;
pub mod instance;
pub mod model;
pub mod scheduler;
pub mod snapshot;
pub mod worker_health;
