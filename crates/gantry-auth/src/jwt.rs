//! What the cluster's secret signs:
//!
//! - Session tokens: HS256 JWTs naming the user and the session version they were issued
//!   under (bumped on logout and password change, which ends older sessions).
//! - Server credentials `gantrys_<mac>_<server_id>`: HMAC-SHA256 of the server id. Every
//!   server of a cluster shares the secret (sessions must be valid on each), so each can
//!   check another's credential without a database read; the coordinator API accepts them
//!   beside an admin's credentials.

use std::time::Duration;

use gantry_types::{Role, Timestamp};
use hmac::{Hmac, Mac};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

/// Prefix of server credentials.
pub const SERVER_CREDENTIAL_PREFIX: &str = "gantrys_";
/// Hex characters of a server credential's MAC.
const SERVER_MAC_HEX: usize = 64;

/// Claims carried by a session token.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Claims {
    /// User id.
    pub sub: i64,
    pub username: String,
    pub role: Role,
    /// Session version at issue time.
    pub sv: i64,
    pub iat: i64,
    pub exp: i64,
}

/// The signing keys, derived from the JWT secret.
pub struct JwtKeys {
    encoding: EncodingKey,
    decoding: DecodingKey,
    /// Keyed with the same secret; makes and checks server credentials.
    server_mac: Hmac<Sha256>,
    pub session_ttl: Duration,
}

impl std::fmt::Debug for JwtKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtKeys").finish_non_exhaustive()
    }
}

impl JwtKeys {
    pub fn new(secret: &[u8], session_ttl: Duration) -> Self {
        Self {
            encoding: EncodingKey::from_secret(secret),
            decoding: DecodingKey::from_secret(secret),
            server_mac: Hmac::new_from_slice(secret).expect("HMAC takes a key of any length"),
            session_ttl,
        }
    }

    /// Issues a token; returns it with its expiry.
    pub fn issue(
        &self,
        user_id: i64,
        username: &str,
        role: Role,
        session_version: i64,
    ) -> Result<(String, Timestamp), jsonwebtoken::errors::Error> {
        let now = Timestamp::now();
        let expires = now.plus(self.session_ttl);
        let claims = Claims {
            sub: user_id,
            username: username.to_string(),
            role,
            sv: session_version,
            iat: now.as_millis() / 1000,
            exp: expires.as_millis() / 1000,
        };
        let token = jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, &self.encoding)?;
        Ok((token, expires))
    }

    /// Checks signature and expiry.
    pub fn verify(&self, token: &str) -> Result<Claims, jsonwebtoken::errors::Error> {
        let mut validation = Validation::new(Algorithm::HS256);
        validation.leeway = 5;
        jsonwebtoken::decode::<Claims>(token, &self.decoding, &validation).map(|d| d.claims)
    }

    /// The credential of the server `server_id` in this cluster.
    pub fn server_credential(&self, server_id: &str) -> String {
        let mac = self.server_mac_of(server_id).finalize().into_bytes();
        format!("{SERVER_CREDENTIAL_PREFIX}{}_{server_id}", hex::encode(mac))
    }

    /// The server id a server credential was made for, if this cluster's secret made it
    /// (compared in constant time). `None` for anything else.
    pub fn verify_server_credential(&self, token: &str) -> Option<String> {
        let rest = token.strip_prefix(SERVER_CREDENTIAL_PREFIX)?;
        let (mac_hex, server_id) = (rest.get(..SERVER_MAC_HEX)?, rest.get(SERVER_MAC_HEX..)?);
        let server_id = server_id.strip_prefix('_').filter(|id| !id.is_empty())?;
        let mac = hex::decode(mac_hex).ok()?;
        self.server_mac_of(server_id)
            .verify_slice(&mac)
            .ok()
            .map(|()| server_id.to_owned())
    }

    fn server_mac_of(&self, server_id: &str) -> Hmac<Sha256> {
        let mut mac = self.server_mac.clone();
        mac.update(b"gantry server credential:");
        mac.update(server_id.as_bytes());
        mac
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issued_tokens_verify_and_foreign_ones_do_not() {
        let keys = JwtKeys::new(b"0123456789abcdef0123456789abcdef", Duration::from_secs(60));
        let (token, _) = keys.issue(7, "alice", Role::Admin, 3).unwrap();
        let claims = keys.verify(&token).unwrap();
        assert_eq!((claims.sub, claims.sv, claims.role), (7, 3, Role::Admin));

        let other = JwtKeys::new(b"another secret of sufficient len", Duration::from_secs(60));
        assert!(other.verify(&token).is_err());
    }

    #[test]
    fn server_credentials_name_their_server_and_only_this_secret_makes_them() {
        let keys = JwtKeys::new(b"0123456789abcdef0123456789abcdef", Duration::from_secs(60));
        let credential = keys.server_credential("server_a-1");
        assert!(credential.starts_with(SERVER_CREDENTIAL_PREFIX));
        assert_eq!(
            keys.verify_server_credential(&credential).as_deref(),
            Some("server_a-1")
        );

        let other = JwtKeys::new(b"another secret of sufficient len", Duration::from_secs(60));
        assert_eq!(other.verify_server_credential(&credential), None);
        // Another id under the same MAC, a changed MAC, a truncated or empty one: refused.
        let mac = &credential[SERVER_CREDENTIAL_PREFIX.len()..][..SERVER_MAC_HEX];
        for forged in [
            format!("{SERVER_CREDENTIAL_PREFIX}{mac}_server-b"),
            credential.replace(&mac[..4], "0000"),
            credential[..credential.len() - 1].to_owned(),
            format!("{SERVER_CREDENTIAL_PREFIX}{mac}_"),
            format!("{SERVER_CREDENTIAL_PREFIX}{mac}"),
            "gantrys_".to_owned(),
        ] {
            assert_eq!(keys.verify_server_credential(&forged), None, "{forged}");
        }
    }
}
