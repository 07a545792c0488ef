//! Authentication and authorisation: passwords, session tokens (JWT), API keys, worker
//! credentials, and the extractor that turns a request into a [`Principal`].

pub mod jwt;
pub mod password;
pub mod principal;
pub mod secrets;

pub use principal::{Auth, AuthAllowingPasswordChange, Principal};
