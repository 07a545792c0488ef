//! Tests across modules: placement rules from small fixtures, and property tests against a
//! brute-force oracle.

mod placement;
mod properties;
