//! Password hashing with argon2id. Hashing is CPU-heavy, so it runs on the blocking
//! pool and never stalls the async workers.

use argon2::password_hash::rand_core::OsRng;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::Argon2;

/// Hashing a secret failed (never because of the secret's content).
#[derive(Debug, thiserror::Error)]
pub enum PasswordError {
    #[error("hash a secret: {0}")]
    Hash(String),
    #[error("hash task failed: {0}")]
    Task(String),
}

/// Hashes a password (or any secret) into a PHC string.
pub async fn hash(secret: String) -> Result<String, PasswordError> {
    tokio::task::spawn_blocking(move || {
        let salt = SaltString::generate(&mut OsRng);
        Argon2::default()
            .hash_password(secret.as_bytes(), &salt)
            .map(|h| h.to_string())
            .map_err(|e| PasswordError::Hash(e.to_string()))
    })
    .await
    .map_err(|e| PasswordError::Task(e.to_string()))?
}

/// True when `secret` matches the PHC string `hash`. A malformed hash is a mismatch.
pub async fn verify(secret: String, hash: String) -> bool {
    tokio::task::spawn_blocking(move || match PasswordHash::new(&hash) {
        Ok(parsed) => Argon2::default()
            .verify_password(secret.as_bytes(), &parsed)
            .is_ok(),
        Err(_) => false,
    })
    .await
    .unwrap_or(false)
}

/// A hash of a random value, verified against when the username is unknown so that a
/// failed login takes as long whether or not the user exists.
pub async fn dummy_verify(secret: String) {
    static DUMMY: tokio::sync::OnceCell<String> = tokio::sync::OnceCell::const_new();
    let dummy = DUMMY
        .get_or_init(|| async {
            hash("gantry-dummy-password".to_string())
                .await
                .unwrap_or_default()
        })
        .await
        .clone();
    let _ = verify(secret, dummy).await;
}
