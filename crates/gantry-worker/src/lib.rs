//! The worker agent: registration, heartbeat, GPU detection, backend supervisor.
