//! The typed client of the gantry server's HTTP API: the one place outside the server that
//! knows its URLs and methods. The worker agent, the tests and the command line call
//! [`Client`] methods with `gantry-types` values and get `gantry-types` values back.
//!
//! * [`Client`]: every server URL it was given, a bearer token, and failover: a call goes
//!   to the server in use and moves on to the next when a server cannot be reached or
//!   answers 502, 503 or 504 — unless the server reports a worker it could not reach or
//!   that failed, which another server would report too ([`transport`]);
//! * the calls: the management API ([`management`]), the worker agent's endpoints
//!   ([`agent`]) and a streamed chat through the OpenAI-compatible gateway ([`gateway`]);
//! * [`WatchStream`]: a `?watch=true` list as typed [`gantry_types::WatchEvent`]s;
//! * [`ClientError`]: an unreachable server, or the server's own error with its
//!   [`gantry_types::ErrorCode`].

pub mod agent;
mod error;
pub mod gateway;
pub mod management;
pub mod transport;
mod watch;

pub use error::ClientError;
pub use transport::Client;
pub use watch::{WatchStream, WATCH_UPGRADE};
