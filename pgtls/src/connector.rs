//! A tokio-postgres TLS connector on rustls that carries out libpq's
//! `sslmode`, with errors that say which check failed.
//!
//! ```text
//!  TlsOptions ──▶ RustlsConnector ──make_tls_connect(host)──▶ RustlsConnect ──handshake──▶ RustlsStream
//!                  (rustls config,                               (rustls::Error → Untrusted /
//!                   verifier per mode)                             WrongHost / Handshake)
//! ```
//!
//! The verifier decides how much is checked: nothing (`prefer`, `require`;
//! handshake signatures are still checked), the chain (`verify-ca`), or the
//! chain and the host name (`verify-full`, rustls's own verifier).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::Socket;
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};

use crate::error::ConnectError;
use crate::mode::SslMode;
use crate::options::{Roots, TlsOptions, Verification};

/// The ALPN protocol Postgres 17 expects (required with
/// `sslnegotiation=direct`, ignored by older servers).
const ALPN_POSTGRESQL: &[u8] = b"postgresql";

/// Makes TLS sessions for tokio-postgres (and deadpool) under one policy.
#[derive(Clone)]
pub struct RustlsConnector {
    config: Arc<ClientConfig>,
    mode: SslMode,
    roots: Arc<str>,
}

impl std::fmt::Debug for RustlsConnector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RustlsConnector")
            .field("mode", &self.mode)
            .field("roots", &self.roots)
            .finish()
    }
}

impl RustlsConnector {
    /// The connector for `tls`; reads the roots when the mode verifies.
    pub fn new(tls: &TlsOptions) -> Result<Self, ConnectError> {
        // An explicit provider: the process-wide default may be unset, or
        // set by another library to another one.
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = server_verifier(tls.verification(), &tls.roots, provider.clone())?;
        let mut config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(ConnectError::Rustls)?
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_no_client_auth();
        config.alpn_protocols = vec![ALPN_POSTGRESQL.to_vec()];
        Ok(RustlsConnector {
            config: Arc::new(config),
            mode: tls.mode,
            roots: tls.roots.describe().into(),
        })
    }
}

/// The check of the server's certificate that `verification` asks for,
/// against `roots`: for any rustls client of walhook's (the Fluvio log
/// checks its cluster with it too).
pub fn server_verifier(
    verification: Verification,
    roots: &Roots,
    provider: Arc<CryptoProvider>,
) -> Result<Arc<dyn ServerCertVerifier>, ConnectError> {
    Ok(match verification {
        Verification::None => Arc::new(AcceptAny { provider }),
        Verification::Chain => Arc::new(ChainOnly {
            inner: webpki_verifier(roots, provider)?,
        }),
        Verification::Full => webpki_verifier(roots, provider)?,
    })
}

/// The trust anchors of `roots`.
fn root_store(roots: &Roots) -> Result<RootCertStore, ConnectError> {
    let mut store = RootCertStore::empty();
    match roots {
        Roots::BuiltIn => store.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
        Roots::File(path) => {
            let pem = std::fs::read(path).map_err(|source| ConnectError::RootCertUnreadable {
                path: path.clone(),
                source,
            })?;
            let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem)
                .filter_map(Result::ok)
                .collect();
            let (added, _ignored) = store.add_parsable_certificates(certs);
            if added == 0 {
                return Err(ConnectError::RootCertEmpty { path: path.clone() });
            }
        }
    }
    Ok(store)
}

fn webpki_verifier(
    roots: &Roots,
    provider: Arc<CryptoProvider>,
) -> Result<Arc<WebPkiServerVerifier>, ConnectError> {
    let store = root_store(roots)?;
    WebPkiServerVerifier::builder_with_provider(Arc::new(store), provider)
        .build()
        .map_err(|e| ConnectError::Rustls(rustls::Error::General(e.to_string())))
}

impl MakeTlsConnect<Socket> for RustlsConnector {
    type Stream = RustlsStream;
    type TlsConnect = RustlsConnect;
    type Error = ConnectError;

    fn make_tls_connect(&mut self, domain: &str) -> Result<RustlsConnect, ConnectError> {
        // The name is checked when a handshake happens: tokio-postgres asks
        // for a connector even for `sslmode=disable` and Unix sockets.
        Ok(RustlsConnect {
            connector: self.clone(),
            host: domain.to_owned(),
        })
    }
}

/// One handshake with `host`.
pub struct RustlsConnect {
    connector: RustlsConnector,
    host: String,
}

impl TlsConnect<Socket> for RustlsConnect {
    type Stream = RustlsStream;
    type Error = ConnectError;
    type Future = Pin<Box<dyn Future<Output = Result<RustlsStream, ConnectError>> + Send>>;

    fn connect(self, stream: Socket) -> Self::Future {
        Box::pin(async move {
            let RustlsConnect { connector, host } = self;
            let name = ServerName::try_from(host.clone())
                .map_err(|_| ConnectError::BadServerName(host.clone()))?;
            tokio_rustls::TlsConnector::from(connector.config.clone())
                .connect(name, stream)
                .await
                .map(|s| RustlsStream(Box::new(s)))
                .map_err(|e| classify(e, host, &connector))
        })
    }
}

/// Names the check that failed: tokio-rustls hands rustls's error over
/// inside an `io::Error`.
fn classify(e: io::Error, host: String, connector: &RustlsConnector) -> ConnectError {
    let found = e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        .cloned();
    match found {
        Some(
            source @ rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            ),
        ) => ConnectError::WrongHost { host, source },
        Some(source @ rustls::Error::InvalidCertificate(_)) => ConnectError::Untrusted {
            host,
            roots: connector.roots.to_string(),
            mode: connector.mode,
            source,
        },
        _ => ConnectError::Handshake { host, source: e },
    }
}

/// A TLS session to Postgres.
pub struct RustlsStream(Box<tokio_rustls::client::TlsStream<Socket>>);

impl AsyncRead for RustlsStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for RustlsStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_shutdown(cx)
    }
}

impl TlsStream for RustlsStream {
    fn channel_binding(&self) -> ChannelBinding {
        // `tls-server-end-point` over the certificate the server presented
        // in this session: tokio-postgres then logs in with
        // SCRAM-SHA-256-PLUS when the server offers it (and, under
        // `channel_binding=require`, refuses to log in without it).
        self.0
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|chain| chain.first())
            .and_then(|leaf| crate::binding::server_end_point(leaf))
            .map_or_else(ChannelBinding::none, ChannelBinding::tls_server_end_point)
    }
}

/// `prefer` and `require` without `sslrootcert`: any certificate, but the
/// handshake's signatures are still checked against it.
#[derive(Debug)]
struct AcceptAny {
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for AcceptAny {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// `verify-ca`: rustls's verifier with the name check left out.
#[derive(Debug)]
struct ChainOnly {
    inner: Arc<WebPkiServerVerifier>,
}

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .inner
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            // The name is checked last, after the chain verified.
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}
