//! A raw HTTP/1.1 server on loopback, plain or TLS, that answers every
//! request with fixed bytes and records what it saw: the connection, the
//! TLS server name (SNI), the request head and the body. The devkit
//! receiver cannot speak TLS or send arbitrary responses; these tests need
//! both.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use parking_lot::Mutex;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;

/// The test CA that signed [`LEAF_PEM`] (for `hooks.example.com` and
/// `rebind.example.com`). Its key was thrown away after signing.
pub const CA_PEM: &[u8] = include_bytes!("testdata/ca.pem");
const LEAF_PEM: &[u8] = include_bytes!("testdata/leaf.pem");
const LEAF_KEY: &[u8] = include_bytes!("testdata/leaf.key");

/// One request as the server saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    /// Which connection (0-based, in accept order) carried it.
    pub connection: usize,
    /// The TLS server name the client sent, if TLS.
    pub sni: Option<String>,
    /// The `Host` header.
    pub host: String,
    /// The request line.
    pub request_line: String,
    /// The body.
    pub body: Vec<u8>,
}

#[derive(Default)]
struct Shared {
    seen: Mutex<Vec<Seen>>,
    connections: AtomicUsize,
    response: Mutex<Vec<u8>>,
    /// Close each connection after its first response, without saying so.
    close_after_response: AtomicBool,
}

/// A running server; stops when dropped.
pub struct RawServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

/// `200 OK` with a short body.
pub fn ok_response() -> Vec<u8> {
    b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok".to_vec()
}

impl RawServer {
    /// A plain-text server answering `response`.
    pub async fn plain(response: Vec<u8>) -> RawServer {
        Self::start(response, None).await
    }

    /// A plain-text server answering `response`, then closing the
    /// connection without a `connection: close` header (as a receiver
    /// whose idle timeout is shorter than the client's does).
    pub async fn plain_closing(response: Vec<u8>) -> RawServer {
        let server = Self::start(response, None).await;
        server
            .shared
            .close_after_response
            .store(true, Ordering::SeqCst);
        server
    }

    /// A TLS server (certificate for `hooks.example.com` and
    /// `rebind.example.com`) answering `response`.
    pub async fn tls(response: Vec<u8>) -> RawServer {
        let certs = CertificateDer::pem_slice_iter(LEAF_PEM)
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_slice(LEAF_KEY).unwrap();
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
        Self::start(
            response,
            Some(tokio_rustls::TlsAcceptor::from(Arc::new(config))),
        )
        .await
    }

    async fn start(response: Vec<u8>, tls: Option<tokio_rustls::TlsAcceptor>) -> RawServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared::default());
        *shared.response.lock() = response;
        let s = shared.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let connection = s.connections.fetch_add(1, Ordering::SeqCst);
                let s = s.clone();
                let tls = tls.clone();
                tokio::spawn(async move {
                    match tls {
                        None => serve(tcp, connection, None, s).await,
                        Some(acceptor) => {
                            let Ok(stream) = acceptor.accept(tcp).await else {
                                return;
                            };
                            let sni = stream.get_ref().1.server_name().map(str::to_owned);
                            serve(stream, connection, sni, s).await;
                        }
                    }
                });
            }
        });
        RawServer { addr, shared, task }
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Every request so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.shared.seen.lock().clone()
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.shared.connections.load(Ordering::SeqCst)
    }
}

impl Drop for RawServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    connection: usize,
    sni: Option<String>,
    shared: Arc<Shared>,
) {
    let mut buf: Vec<u8> = Vec::new();
    loop {
        // The head.
        let head_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let mut chunk = [0u8; 4096];
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
        buf.drain(..head_end);
        let mut lines = head.split("\r\n");
        let request_line = lines.next().unwrap_or_default().to_owned();
        let mut host = String::new();
        let mut length = 0usize;
        for line in lines {
            if let Some((name, value)) = line.split_once(':') {
                match name.trim().to_ascii_lowercase().as_str() {
                    "host" => host = value.trim().to_owned(),
                    "content-length" => length = value.trim().parse().unwrap_or(0),
                    _ => {}
                }
            }
        }
        while buf.len() < length {
            let mut chunk = [0u8; 4096];
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        let body: Vec<u8> = buf.drain(..length).collect();
        shared.seen.lock().push(Seen {
            connection,
            sni: sni.clone(),
            host,
            request_line,
            body,
        });
        let response = shared.response.lock().clone();
        if stream.write_all(&response).await.is_err() || stream.flush().await.is_err() {
            return;
        }
        if shared.close_after_response.load(Ordering::SeqCst) {
            let _ = stream.shutdown().await;
            return;
        }
    }
}
