//! HTTPS for `serve` (vLLM's `--ssl-keyfile`, `--ssl-certfile`, `--ssl-ca-certs`,
//! `--ssl-cert-reqs`): rustls with ring, ALPN `h2` then `http/1.1`, so HTTP/2 clients (gRPC
//! among them) and HTTP/1.1 clients share the port, as they share the plain one.
//!
//! Handshakes run in tasks of their own, each within [`HANDSHAKE_TIMEOUT`], and only finished
//! connections reach the server ([`TlsListener`]): a client that opens a connection and says
//! nothing holds one task until the timeout, not the accept loop.

use crate::config::{ClientCerts, TlsOptions};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{self, RootCertStore, ServerConfig};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// How long a client has to finish its handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The TLS setup the flags describe; a file that cannot be read or used fails the start.
pub fn acceptor(options: &TlsOptions) -> anyhow::Result<TlsAcceptor> {
    let read = |path: &std::path::Path, what: &str| -> anyhow::Result<Vec<CertificateDer<'static>>> {
        let certs = CertificateDer::pem_file_iter(path)
            .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
            .map_err(|e| anyhow::anyhow!("cannot read {what} {}: {e}", path.display()))?;
        anyhow::ensure!(!certs.is_empty(), "{what} {} holds no PEM certificate", path.display());
        Ok(certs)
    };
    let chain = read(&options.certfile, "--ssl-certfile")?;
    let key = PrivateKeyDer::from_pem_file(&options.keyfile)
        .map_err(|e| anyhow::anyhow!("cannot read a private key from --ssl-keyfile {}: {e}", options.keyfile.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone()).with_safe_default_protocol_versions()?;
    let builder = match (&options.ca_certs, options.client_certs) {
        (Some(path), asked) if asked != ClientCerts::NotAsked => {
            let mut roots = RootCertStore::empty();
            for cert in read(path, "--ssl-ca-certs")? {
                roots.add(cert).map_err(|e| anyhow::anyhow!("--ssl-ca-certs {}: {e}", path.display()))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            let verifier = match asked {
                ClientCerts::Optional => verifier.allow_unauthenticated(),
                _ => verifier,
            };
            builder.with_client_cert_verifier(verifier.build()?)
        }
        _ => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| anyhow::anyhow!("--ssl-certfile and --ssl-keyfile do not make a usable pair: {e}"))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// TLS connections whose handshake is done, for `axum::serve`.
pub struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl TlsListener {
    /// Accepts on `listener` until the returned listener is dropped.
    pub fn new(listener: TcpListener, acceptor: TlsAcceptor) -> std::io::Result<Self> {
        let local = listener.local_addr()?;
        // A few finished handshakes may wait for the server to take them.
        let (tx, ready) = mpsc::channel(64);
        tokio::spawn(async move {
            loop {
                let (stream, peer) = tokio::select! {
                    accepted = listener.accept() => match accepted {
                        Ok(accepted) => accepted,
                        // Out of file descriptors and the like: wait a little, as axum does.
                        Err(e) => {
                            tracing::warn!("accepting a connection failed: {e}");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    },
                    // The server has stopped: close the port.
                    _ = tx.closed() => break,
                };
                let mut stream = stream;
                super::connections::no_delay(&mut stream);
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => {
                            let _ = tx.send((tls, peer)).await;
                        }
                        // A refused client certificate, a plain-HTTP client, a scanner: the
                        // client has its TLS alert; one line for whoever looks into it.
                        Ok(Err(e)) => tracing::info!(%peer, "TLS handshake refused: {e}"),
                        Err(_) => tracing::info!(%peer, "TLS handshake not finished within {HANDSHAKE_TIMEOUT:?}"),
                    }
                });
            }
        });
        Ok(Self { ready, local })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(ready) => ready,
            // The accepting task is gone only when this listener is: never reached.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}
