//! The real server in-process on a loopback port, on SQLite and PostgreSQL: the management
//! API, the agent API, the coordinator, the scheduler and its leader, the gateway as part
//! of the server (its own behaviour is tested in `gantry-gateway`) and the console's
//! assets. One test binary, so the stack is linked once; each module is one area.

#![allow(clippy::unwrap_used)]

mod common;

mod agent;
mod api;
mod clusters;
mod coordinator_api;
mod estimate;
mod gateway;
mod least_privilege;
mod placement_record;
mod pools;
mod scheduler;
mod scheduler_leader;
mod scheduler_store;
mod ui;
mod users_and_workers;
