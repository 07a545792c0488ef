//! The worker agent: registration, heartbeat, GPU detection, backend supervisor.

pub mod logs;
pub mod ports;
pub mod supervisor;

// The agent: registration, heartbeats, hardware, assignments, the worker's own API.
pub mod agent;
pub mod backends;
pub mod gpu;
pub(crate) mod http;
pub mod preinstall;
pub mod system;
