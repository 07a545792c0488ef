//! API resources, states and request/response shapes shared by server, worker, CLI and tests. No IO.
