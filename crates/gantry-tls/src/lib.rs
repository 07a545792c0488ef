//! TLS for gantry's listeners: the certificate chain and private key of `tls_cert_file`
//! and `tls_key_file` (PEM), read and checked at start-up, served with rustls. The server
//! serves its port with them (API, console, gateway, workers); a worker, its own API
//! (called by the servers). HTTP/1.1 only, as both accept loops serve nothing else.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

/// How long a client may take to finish its TLS handshake before the connection is
/// closed (a connection that never speaks must not hold a task forever).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the server's certificate and key are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM: the server's certificate first, then any intermediates.
    pub cert: PathBuf,
    /// PEM: the private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

/// Why TLS could not be set up; each says which file and what to do.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("read tls_cert_file {path}: {reason}")]
    Certificate { path: String, reason: String },
    #[error("tls_cert_file {path} holds no certificate; it must be PEM (-----BEGIN CERTIFICATE-----), the server's certificate first")]
    NoCertificate { path: String },
    #[error(
        "read tls_key_file {path}: {reason}; it must be a PEM private key (PKCS#8, PKCS#1 or SEC1)"
    )]
    Key { path: String, reason: String },
    #[error("tls_cert_file {cert} and tls_key_file {key} do not go together: {reason}")]
    Mismatch {
        cert: String,
        key: String,
        reason: String,
    },
}

fn shown(path: &Path) -> String {
    path.display().to_string()
}

/// Reads the files and builds the acceptor. Fails at start-up, never per connection.
pub fn acceptor(files: &TlsFiles) -> Result<TlsAcceptor, TlsError> {
    let certificates: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert)
        .and_then(|certs| certs.collect::<Result<_, _>>())
        .map_err(|e| TlsError::Certificate {
            path: shown(&files.cert),
            reason: e.to_string(),
        })?;
    if certificates.is_empty() {
        return Err(TlsError::NoCertificate {
            path: shown(&files.cert),
        });
    }
    let key = PrivateKeyDer::from_pem_file(&files.key).map_err(|e| TlsError::Key {
        path: shown(&files.key),
        reason: e.to_string(),
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .and_then(|builder| {
            builder
                .with_no_client_auth()
                .with_single_cert(certificates, key)
        })
        .map_err(|e| TlsError::Mismatch {
            cert: shown(&files.cert),
            key: shown(&files.key),
            reason: e.to_string(),
        })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    fn refused(files: TlsFiles) -> TlsError {
        match acceptor(&files) {
            Ok(_) => panic!("{files:?} were accepted"),
            Err(e) => e,
        }
    }

    #[test]
    fn bad_files_are_named_with_what_is_wrong() {
        let dir = tempfile::tempdir().unwrap();
        let made = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let cert = write(dir.path(), "cert.pem", &made.cert.pem());
        let key = write(dir.path(), "key.pem", &made.key_pair.serialize_pem());
        let other = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let other_key = write(dir.path(), "other.pem", &other.key_pair.serialize_pem());
        let empty = write(dir.path(), "empty.pem", "");

        assert!(acceptor(&TlsFiles {
            cert: cert.clone(),
            key: key.clone()
        })
        .is_ok());

        let missing = dir.path().join("missing.pem");
        let e = refused(TlsFiles {
            cert: missing.clone(),
            key: key.clone(),
        });
        assert!(
            e.to_string()
                .starts_with(&format!("read tls_cert_file {}", missing.display())),
            "{e}"
        );

        let e = refused(TlsFiles {
            cert: empty.clone(),
            key: key.clone(),
        });
        assert!(matches!(e, TlsError::NoCertificate { .. }), "{e}");

        let e = refused(TlsFiles {
            cert: cert.clone(),
            key: empty,
        });
        assert!(matches!(e, TlsError::Key { .. }), "{e}");

        let e = refused(TlsFiles {
            cert,
            key: other_key,
        });
        assert!(matches!(e, TlsError::Mismatch { .. }), "{e}");
    }
}
