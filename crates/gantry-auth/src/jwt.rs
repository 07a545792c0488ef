//! Session tokens: HS256 JWTs naming the user and the session version they were issued
//! under (bumped on logout and password change, which ends older sessions).

use std::time::Duration;

use gantry_types::{Role, Timestamp};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

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
}
