//! Authentication shared by gantry's two planes, the management API (`gantry-server`)
//! and the OpenAI-compatible gateway (`gantry-gateway`):
//!
//! - `secrets.rs`: API keys `gantry_<access>_<secret>`, worker credentials `gantryw_…`,
//!   registration tokens `gantryreg_…`, their generation and the SHA-256 digest they
//!   are looked up by;
//! - `password.rs`: argon2id hashing on the blocking pool;
//! - `jwt.rs`: HS256 session tokens carrying the user's session version;
//! - `principal.rs`: who is calling, a user (session or API key) or a worker;
//! - `authenticator.rs`: a raw token → a principal, with
//! - `cache.rs`: the one cache of accepted API keys, and
//! - `last_used.rs`: API-key last-used times, batched and written by a task;
//! - `sealed.rs`: secrets gantry must send on (a model provider's API key), sealed with
//!   a key derived from the server secret before they are stored.
//!
//! No HTTP here (each plane has its own extractors and error shape) and no IO beyond
//! the store.

pub mod authenticator;
pub mod cache;
pub mod error;
pub mod jwt;
pub mod last_used;
pub mod password;
pub mod principal;
pub mod sealed;
pub mod secrets;
pub mod worker_cache;

pub use authenticator::{AuthConfig, Authenticator};
pub use error::AuthError;
pub use principal::{Forbidden, Principal};
