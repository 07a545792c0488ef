//! Random secrets and their formats: API keys `gantry_<access>_<secret>`, worker
//! credentials `gantryw_<secret>`, registration tokens `gantryreg_<secret>`; and the
//! SHA-256 digest every secret is looked up by.

use rand::distributions::{Alphanumeric, DistString};
use rand::rngs::OsRng;
use sha2::{Digest, Sha256};

/// `len` random characters from `[A-Za-z0-9]` (about 5.95 bits each).
pub fn random_alphanumeric(len: usize) -> String {
    Alphanumeric.sample_string(&mut OsRng, len)
}

/// Lowercase hex SHA-256: the fast digest secrets are looked up by in the store.
pub fn digest(value: &str) -> String {
    SecretDigest::of(value).to_hex()
}

/// The SHA-256 of a secret as raw bytes: what the credential cache is keyed by, so a
/// cache hit costs one hash and no hex string.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SecretDigest([u8; 32]);

impl SecretDigest {
    pub fn of(value: &str) -> Self {
        Self(Sha256::digest(value.as_bytes()).into())
    }

    /// The form the store keeps (see [`digest`]).
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }
}

/// The two halves of a freshly generated API key.
#[derive(Debug, Clone)]
pub struct GeneratedApiKey {
    pub access: String,
    pub secret: String,
}

impl GeneratedApiKey {
    pub fn generate() -> Self {
        Self {
            access: random_alphanumeric(12).to_lowercase(),
            secret: random_alphanumeric(40),
        }
    }

    pub fn full(&self) -> String {
        format!("gantry_{}_{}", self.access, self.secret)
    }
}

/// Splits `gantry_<access>_<secret>` into its halves; `None` if it is not an API key.
pub fn parse_api_key(token: &str) -> Option<(&str, &str)> {
    let rest = token.strip_prefix("gantry_")?;
    let (access, secret) = rest.split_once('_')?;
    // Bytes, not chars: a character outside ASCII is bytes that are not alphanumeric.
    let plain = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric());
    (plain(access) && plain(secret)).then_some((access, secret))
}

/// Prefix of worker credentials.
pub const WORKER_CREDENTIAL_PREFIX: &str = "gantryw_";
/// Prefix of registration tokens.
pub const REGISTRATION_TOKEN_PREFIX: &str = "gantryreg_";

pub fn generate_worker_credential() -> String {
    format!("{WORKER_CREDENTIAL_PREFIX}{}", random_alphanumeric(48))
}

pub fn generate_registration_token() -> String {
    format!("{REGISTRATION_TOKEN_PREFIX}{}", random_alphanumeric(48))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_api_keys_parse_back() {
        let key = GeneratedApiKey::generate();
        let full = key.full();
        assert_eq!(
            parse_api_key(&full),
            Some((key.access.as_str(), key.secret.as_str()))
        );
    }

    #[test]
    fn non_keys_do_not_parse() {
        assert_eq!(parse_api_key("eyJhbGciOi.x.y"), None);
        assert_eq!(parse_api_key("gantry_abc"), None);
        assert_eq!(parse_api_key("gantry__secret"), None);
        assert_eq!(parse_api_key("gantry_a_b_c"), None);
    }

    #[test]
    fn digest_is_sha256_hex() {
        assert_eq!(
            digest("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(SecretDigest::of("abc").to_hex(), digest("abc"));
    }
}
