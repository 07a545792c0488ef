//! The test doubles of third-party services (the Hugging Face hub, ModelScope) checked
//! against the behaviour of the real APIs they stand for. One test binary.

#![allow(clippy::unwrap_used)]

mod common;
mod hub;
mod modelscope;
