//! Benchmark-only tools for gantry; nothing here is part of the product or its tests.
//!
//! `openai-responder` (in `src/bin`) is a **test double**: a minimal, fast
//! OpenAI-compatible HTTP server that answers every chat or text completion at once with
//! a fixed small body (JSON with `usage`, or a few server-sent events when the request
//! says `"stream": true`). It does no inference. `scripts/bench-gateway.sh` puts it behind
//! nginx and behind the gantry gateway to measure what each proxy adds.
