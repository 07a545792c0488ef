//! The gateway in-process on a loopback port, as the server runs it (`start`, then
//! `serve`), with its routing state in the in-memory store and its callers in a SQLite
//! store of the test's own: no server, no management API. One test binary, so the gateway
//! is linked once; each module is one area.
//!
//! The modules under `llama::` proxy to a real llama.cpp `llama-server` serving the tiny
//! model this project writes (`GANTRY_LLAMA_SERVER`), for what only a real backend shows;
//! the rest use stand-in backends on loopback ports and belong to the quick tier.

#![allow(clippy::unwrap_used)]

mod common;

mod answer_name;
mod disconnect;
mod errors;
mod llama;
