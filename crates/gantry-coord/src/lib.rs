//! Coordination: leader lease, locks with fencing tokens, server registry.
