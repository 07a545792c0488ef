//! The gantry command line.

fn main() {}
