//! The store against real databases: every test runs on SQLite and on the PostgreSQL that
//! `scripts/with-postgres.sh` provides. One test binary; each module is one area.

#![allow(clippy::unwrap_used)]

mod coordination;
mod heartbeats;
mod lease;
mod notify;
mod reachability;
mod routes;
mod store;
mod usage;
mod vacuum;
