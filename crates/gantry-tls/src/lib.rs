//! What gantry's two HTTP listeners share (the server's port: API, console, gateway,
//! workers; a worker's own API, called by the servers):
//!
//! - TLS: the certificate chain and private key of `tls_cert_file` and `tls_key_file`
//!   (PEM), read and checked at start-up ([`acceptor`]), and the handshake of each
//!   accepted connection, bounded in time ([`handshake`]);
//! - serving one HTTP/1.1 connection, plain or TLS, until it closes or the process shuts
//!   down ([`serve_http1`]). HTTP/1.1 only, as neither listener serves anything else.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use hyper::body::{Body, Incoming};
use hyper::service::HttpService;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;

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

/// The TLS handshake of an accepted connection, given [`HANDSHAKE_TIMEOUT`] and ended by
/// `shutdown`; `None` (logged at debug) when it fails: a client speaking plain HTTP to the
/// TLS port, or one that distrusts the certificate, ends here, and only its side can say
/// more.
pub async fn handshake(
    acceptor: &TlsAcceptor,
    tcp: TcpStream,
    peer: SocketAddr,
    shutdown: &CancellationToken,
) -> Option<TlsStream<TcpStream>> {
    let handshake = tokio::select! {
        () = shutdown.cancelled() => return None,
        handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)) => handshake,
    };
    match handshake {
        Ok(Ok(stream)) => Some(stream),
        Ok(Err(e)) => {
            tracing::debug!(error = %e, %peer, "TLS handshake failed");
            None
        }
        Err(_) => {
            tracing::debug!(%peer, "TLS handshake did not finish in time");
            None
        }
    }
}

/// Serves one HTTP/1.1 connection (plain TCP or TLS) until it closes, finishing the
/// request in progress at `shutdown`.
pub async fn serve_http1<I, S>(io: I, service: S, shutdown: CancellationToken, peer: SocketAddr)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: HttpService<Incoming>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    S::ResBody: 'static,
    <S::ResBody as Body>::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let connection = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(io), service)
        .with_upgrades();
    tokio::pin!(connection);
    let outcome = tokio::select! {
        outcome = connection.as_mut() => outcome,
        () = shutdown.cancelled() => {
            connection.as_mut().graceful_shutdown();
            connection.await
        }
    };
    if let Err(e) = outcome {
        tracing::debug!(error = %e, %peer, "connection ended with an error");
    }
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
