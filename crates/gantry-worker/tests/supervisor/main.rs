//! The backend supervisor with real child processes: scripted custom backends and a real
//! `llama-server`. One test binary.

#![allow(clippy::unwrap_used)]

mod llama;
mod processes;
