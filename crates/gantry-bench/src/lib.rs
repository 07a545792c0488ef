//! Benchmark-only tools for gantry; nothing here is part of the product or its tests.
//!
//! `openai-responder` (in `src/bin`) is a **test double**: a minimal, fast
//! OpenAI-compatible HTTP server that answers every chat or text completion at once with
//! a fixed small body (JSON with `usage`, or a few server-sent events when the request
//! says `"stream": true`). It does no inference. `scripts/bench-gateway.sh` puts it behind
//! nginx and behind the gantry gateway to measure what each proxy adds.
//!
//! `control-plane-load` ([`control_plane`]) loads one real `gantry server` with N
//! simulated workers — **test doubles** of the worker agent, lightweight tasks that
//! register with simulated GPUs, heartbeat, hold their assignment watches and report
//! their instances running without running anything — and measures heartbeat latency,
//! the server's CPU and memory, placement of many instances, list pages, worker flips and
//! memory under create/delete churn. `scripts/bench-control-plane.sh` runs it on SQLite
//! and PostgreSQL.

pub mod control_plane;
