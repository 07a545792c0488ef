//! Authentication as the management API sees it: the axum extractors that resolve a
//! request's credential to a [`Principal`] through the shared
//! [`Authenticator`](gantry_auth::Authenticator). Secrets, passwords, session tokens
//! and the credential cache live in `gantry-auth`, shared with the gateway; they are
//! re-exported here under their old paths.

pub mod principal;

pub use gantry_auth::{jwt, password, secrets, Principal};
pub use principal::{
    AdminAuth, AdminOrServerAuth, Auth, AuthAllowingPasswordChange, ClusterAdminAuth,
    UserAllowingPasswordChange, UserAuth,
};
