//! A fresh Ed25519 public key in OpenSSH's `authorized_keys` form, for a droplet made
//! with an SSH key of its own: DigitalOcean then mails no root password. The private half
//! is never kept, so no one logs in with it; the machine is reached through gantry.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use ring::rand::SystemRandom;
use ring::signature::{Ed25519KeyPair, KeyPair};

use crate::ProviderError;

/// `ssh-ed25519 <base64 of the key blob> <comment>`.
pub fn public_key(comment: &str) -> Result<String, ProviderError> {
    let random = SystemRandom::new();
    let pkcs8 = Ed25519KeyPair::generate_pkcs8(&random)
        .map_err(|_| ProviderError("cannot generate an SSH key: no random source".into()))?;
    let pair = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref())
        .map_err(|_| ProviderError("cannot read the SSH key just generated".into()))?;
    Ok(format!(
        "ssh-ed25519 {} {comment}",
        STANDARD.encode(blob(pair.public_key().as_ref()))
    ))
}

/// The SSH wire form of an Ed25519 public key: the algorithm name and the 32 bytes, each
/// as a length-prefixed string.
fn blob(key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(51);
    for part in [b"ssh-ed25519".as_slice(), key] {
        let len = u32::try_from(part.len()).unwrap_or(u32::MAX);
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(part);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_is_in_authorized_keys_form() {
        let line = public_key("gantry-h100-1").unwrap();
        let parts: Vec<&str> = line.split(' ').collect();
        assert_eq!(parts[0], "ssh-ed25519");
        assert_eq!(parts[2], "gantry-h100-1");
        let blob = STANDARD.decode(parts[1]).unwrap();
        assert_eq!(blob.len(), 4 + 11 + 4 + 32);
        assert_eq!(&blob[4..15], b"ssh-ed25519");
        assert_ne!(
            line,
            public_key("gantry-h100-1").unwrap(),
            "a fresh key each time"
        );
    }
}
