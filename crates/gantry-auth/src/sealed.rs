//! Secrets gantry keeps in order to send them on — a model provider's API key — are
//! stored sealed: AES-256-GCM under a key derived (HKDF-SHA256) from the server secret
//! the cluster's servers share, with a random 96-bit nonce per seal. A database dump
//! alone does not reveal them; a server with the secret opens them to send a request.
//!
//! Sealed form: `v1.<base64url(nonce ‖ ciphertext ‖ tag)>`. The purpose is bound in as
//! associated data, so a value sealed for one purpose does not open as another.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use ring::hkdf::{Salt, HKDF_SHA256};
use ring::rand::{SecureRandom, SystemRandom};

const PREFIX: &str = "v1.";
const SALT: &[u8] = b"gantry sealed secrets v1";

/// Why a sealed value did not open.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    #[error("the sealed value is not in gantry's sealed form")]
    Malformed,
    #[error(
        "the sealed value does not open with this server's secret: it was sealed with \
         another jwt_secret (set the same secret on every server, or set the value again)"
    )]
    WrongKey,
}

/// Seals and opens values for one purpose.
pub struct Sealer {
    key: LessSafeKey,
    purpose: &'static str,
    random: SystemRandom,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sealer")
            .field("purpose", &self.purpose)
            .finish_non_exhaustive()
    }
}

impl Sealer {
    /// The sealer for `purpose` under `server_secret`.
    pub fn new(server_secret: &[u8], purpose: &'static str) -> Self {
        let prk = Salt::new(HKDF_SHA256, SALT).extract(server_secret);
        let mut key = [0u8; 32];
        // Expanding 32 bytes from HKDF-SHA256 is within its limit (255 × 32), so this
        // cannot fail.
        if let Ok(okm) = prk.expand(&[purpose.as_bytes()], &AES_256_GCM) {
            let _ = okm.fill(&mut key);
        }
        let unbound = UnboundKey::new(&AES_256_GCM, &key).unwrap_or_else(|_| {
            // 32 bytes is AES-256-GCM's key length; ring accepts it.
            unreachable!("AES-256-GCM takes a 32-byte key")
        });
        Self {
            key: LessSafeKey::new(unbound),
            purpose,
            random: SystemRandom::new(),
        }
    }

    /// The provider-API-key sealer.
    pub fn provider_keys(server_secret: &[u8]) -> Self {
        Self::new(server_secret, "model provider api key")
    }

    /// The sealer of clusters' registration tokens, which any server opens to show a
    /// cluster's join command.
    pub fn registration_tokens(server_secret: &[u8]) -> Self {
        Self::new(server_secret, "cluster registration token")
    }

    /// Seals `plaintext`.
    pub fn seal(&self, plaintext: &str) -> String {
        let mut nonce = [0u8; NONCE_LEN];
        // The OS random source does not fail on supported systems; a zero nonce
        // would still be unique per key only by chance, so refuse to go on.
        if self.random.fill(&mut nonce).is_err() {
            panic!("the operating system's random source failed");
        }
        let mut buffer = plaintext.as_bytes().to_vec();
        if self
            .key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(self.purpose.as_bytes()),
                &mut buffer,
            )
            .is_err()
        {
            unreachable!("AES-GCM seals any input shorter than 64 GiB");
        }
        let mut out = Vec::with_capacity(NONCE_LEN + buffer.len());
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&buffer);
        format!("{PREFIX}{}", URL_SAFE_NO_PAD.encode(out))
    }

    /// Opens a value [`Sealer::seal`] made with the same secret and purpose.
    pub fn open(&self, sealed: &str) -> Result<String, SealError> {
        let encoded = sealed.strip_prefix(PREFIX).ok_or(SealError::Malformed)?;
        let raw = URL_SAFE_NO_PAD
            .decode(encoded)
            .map_err(|_| SealError::Malformed)?;
        if raw.len() < NONCE_LEN + AES_256_GCM.tag_len() {
            return Err(SealError::Malformed);
        }
        let (nonce, rest) = raw.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| SealError::Malformed)?;
        let mut buffer = rest.to_vec();
        let plain = self
            .key
            .open_in_place(nonce, Aad::from(self.purpose.as_bytes()), &mut buffer)
            .map_err(|_| SealError::WrongKey)?;
        String::from_utf8(plain.to_vec()).map_err(|_| SealError::Malformed)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_sealed_value_opens_with_the_same_secret_only() {
        let sealer = Sealer::provider_keys(b"a secret of at least thirty-two bytes!!");
        let sealed = sealer.seal("sk-provider-key");
        assert!(sealed.starts_with("v1."));
        assert!(!sealed.contains("sk-provider-key"));
        assert_eq!(sealer.open(&sealed).unwrap(), "sk-provider-key");
        // A fresh nonce each time.
        assert_ne!(sealer.seal("sk-provider-key"), sealed);

        let other = Sealer::provider_keys(b"another secret of at least thirty-two bytes");
        assert_eq!(other.open(&sealed), Err(SealError::WrongKey));
        let other_purpose = Sealer::new(b"a secret of at least thirty-two bytes!!", "other");
        assert_eq!(other_purpose.open(&sealed), Err(SealError::WrongKey));

        assert_eq!(sealer.open("sk-plain"), Err(SealError::Malformed));
        assert_eq!(sealer.open("v1.AAAA"), Err(SealError::Malformed));
        let mut tampered = sealed.clone().into_bytes();
        let last = tampered.len() - 2;
        tampered[last] = if tampered[last] == b'A' { b'B' } else { b'A' };
        assert_eq!(
            sealer.open(&String::from_utf8(tampered).unwrap()),
            Err(SealError::WrongKey)
        );
    }
}
