//! Model sources against local doubles of the services they call (the hub, ModelScope,
//! S3) and real files: listing, parallel and resumed downloads. One test binary.

#![allow(clippy::unwrap_used)]

mod files;
mod modelscope;
mod parallel;
mod s3;
