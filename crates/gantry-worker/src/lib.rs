//! The worker agent: registration, heartbeat, GPU detection, backend supervisor.

pub mod backend;
pub mod logs;
pub mod ports;
pub mod supervisor;
