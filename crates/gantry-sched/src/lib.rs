//! Placement: a pure function of a cluster snapshot, and resource estimation. No IO, no clock.
