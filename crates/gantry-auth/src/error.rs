//! Why a credential was not accepted. Each plane turns these into its own error shape
//! (the management API's `{"error": {code, message}}`, the gateway's OpenAI shape);
//! the messages are written for the person holding the credential.

use gantry_store::StoreError;
use gantry_types::Timestamp;

/// A credential that resolved to no principal.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("invalid API key")]
    InvalidApiKey,
    #[error("API key {name} expired at {expires_at}; create a new one")]
    ApiKeyExpired { name: String, expires_at: Timestamp },
    #[error("unknown worker credential: the worker was deleted; register it again")]
    UnknownWorkerCredential,
    #[error("invalid server credential: it was not made with this cluster's secret (are the servers' jwt_secret the same?)")]
    InvalidServerCredential,
    #[error("invalid session token ({0}); log in again")]
    InvalidSessionToken(jsonwebtoken::errors::Error),
    #[error("the user of this session no longer exists")]
    SessionUserGone,
    #[error("this session has ended (logout or password change); log in again")]
    SessionEnded,
    /// The store could not answer: not the caller's fault, and not a refusal.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl AuthError {
    /// True when the credential itself was refused (a 401), false when the store
    /// failed to answer.
    pub fn is_refusal(&self) -> bool {
        !matches!(self, AuthError::Store(_))
    }
}
