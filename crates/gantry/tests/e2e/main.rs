//! End-to-end tests of the `gantry` binary: real `gantry server`, `gantry worker` and
//! `gantry start` processes on loopback ports, a real `llama-server`, SQLite and PostgreSQL,
//! the CLI, the packaging files and the console in a real browser. One test binary, so
//! the stack is linked once; each module is one area.

#![allow(clippy::unwrap_used)]

mod common;

mod api_fuzz;
mod backends;
mod backup;
mod chaos;
mod cli;
mod config_cli;
mod console;
mod console_cluster_admins;
mod console_clusters;
mod console_failures;
mod console_playground;
mod console_workers;
mod convergence;
mod failover;
mod gateway;
mod ha;
mod model_dirs;
mod model_files;
mod model_sources;
mod model_sources_s3;
mod outage;
mod packaging;
mod pools;
mod rolling_restart;
mod routes;
mod secrets_in_logs;
mod shutdown;
mod start;
mod tls;
mod uploads;
mod worker;
