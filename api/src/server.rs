//! The listener: accepts connections, applies the limits a router cannot
//! see, and serves each connection with hyper's HTTP/1.1, the peer's
//! address attached to every request (`ConnectInfo<SocketAddr>`).
//!
//! ```text
//!  accept ─▶ peer holds [api].max_connections_per_client already? ─yes─▶ 503, closed (counted)
//!              └─no─▶ HTTP/1.1: request headers within HEADER_READ_TIMEOUT, else closed
//!                     ─▶ router (edge ─▶ metrics ─▶ limits ─▶ routes)
//!  shutdown ─▶ stop accepting; each connection finishes its request in
//!              progress and closes; returns once all have
//! ```
//!
//! `axum::serve` has neither a header read timeout nor a cap per address,
//! so a client sending headers a byte a minute, or opening connections
//! without end, would hold the process's sockets and tasks; this loop
//! replaces it. Trusted proxies (`[api].trusted_proxies`) carry many
//! clients over their connections and are not capped.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use parking_lot::Mutex;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use crate::client::{ClientKey, TrustedProxies};
use crate::metrics::{Metrics, Refusal};

/// How long a client may take to send a request's headers (and how long
/// an idle kept-alive connection stays open).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(15);

/// What a connection past the cap is told before it is closed.
const TOO_MANY_CONNECTIONS: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\n\
content-type: application/problem+json\r\nretry-after: 1\r\nconnection: close\r\n\
content-length: 206\r\n\r\n\
{\"type\":\"urn:walhook:problem:busy\",\"title\":\"Server busy\",\"status\":503,\
\"detail\":\"this client address holds the most connections [api].max_connections_per_client \
allows; close one or reuse them (keep-alive)\"}";

/// Open connections per client address, and how long headers may take.
#[derive(Debug)]
pub(crate) struct ConnectionLimits {
    per_client: usize,
    header_read_timeout: Duration,
    exempt: TrustedProxies,
    open: Mutex<HashMap<ClientKey, usize>>,
}

impl ConnectionLimits {
    /// At most `per_client` connections per address, `exempt` aside.
    pub(crate) fn new(per_client: usize, exempt: TrustedProxies) -> Self {
        ConnectionLimits {
            per_client: per_client.max(1),
            header_read_timeout: HEADER_READ_TIMEOUT,
            exempt,
            open: Mutex::new(HashMap::new()),
        }
    }

    /// No cap (the loopback metrics listener).
    pub(crate) fn none() -> Self {
        Self::new(usize::MAX, TrustedProxies::default())
    }

    /// The same limits with headers allowed `timeout`.
    #[cfg(test)]
    fn with_header_read_timeout(mut self, timeout: Duration) -> Self {
        self.header_read_timeout = timeout;
        self
    }

    /// Counts a connection from `peer`, or refuses it (`None`).
    fn admit(self: &Arc<Self>, peer: SocketAddr) -> Option<ConnectionGuard> {
        if self.exempt.contains(peer.ip()) {
            return Some(ConnectionGuard(None));
        }
        let key = ClientKey::of(peer.ip());
        let mut open = self.open.lock();
        let n = open.entry(key).or_default();
        if *n >= self.per_client {
            return None;
        }
        *n += 1;
        Some(ConnectionGuard(Some((self.clone(), key))))
    }
}

/// A counted connection; uncounted when dropped.
struct ConnectionGuard(Option<(Arc<ConnectionLimits>, ClientKey)>);

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        if let Some((limits, key)) = self.0.take() {
            let mut open = limits.open.lock();
            if let Some(n) = open.get_mut(&key) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    open.remove(&key);
                }
            }
        }
    }
}

/// Serves `app` on `listener` until `shutdown` (see the module docs).
pub(crate) async fn run(
    listener: TcpListener,
    app: Router,
    limits: Arc<ConnectionLimits>,
    metrics: Option<Arc<Metrics>>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let mut connections = JoinSet::new();
    loop {
        while connections.try_join_next().is_some() {}
        let (stream, peer) = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) if is_connection_error(&e) => continue,
                Err(e) => {
                    // Out of descriptors and the like: wait, as axum
                    // does, rather than spin.
                    tracing::error!(error = %e, "the API cannot accept connections");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            },
        };
        let Some(guard) = limits.admit(peer) else {
            if metrics
                .as_ref()
                .is_some_and(|m| m.refused(Refusal::ClientConnections))
            {
                tracing::warn!(
                    client = %ClientKey::of(peer.ip()),
                    max_connections_per_client = limits.per_client,
                    "connection refused: the client address holds its most connections"
                );
            }
            let _ = stream.try_write(TOO_MANY_CONNECTIONS);
            continue;
        };
        let _ = stream.set_nodelay(true);
        connections.spawn(serve_connection(
            stream,
            peer,
            app.clone(),
            guard,
            limits.header_read_timeout,
            shutdown.clone(),
        ));
    }
    drop(listener);
    while connections.join_next().await.is_some() {}
    Ok(())
}

async fn serve_connection(
    stream: TcpStream,
    peer: SocketAddr,
    app: Router,
    _guard: ConnectionGuard,
    header_read_timeout: Duration,
    shutdown: CancellationToken,
) {
    let service = app.map_request(move |mut request: axum::http::Request<Incoming>| {
        request.extensions_mut().insert(ConnectInfo(peer));
        request.map(Body::new)
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout);
    let connection =
        builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(service));
    let mut connection = std::pin::pin!(connection);
    let served = tokio::select! {
        served = connection.as_mut() => served,
        _ = shutdown.cancelled() => {
            connection.as_mut().graceful_shutdown();
            connection.await
        }
    };
    if let Err(e) = served {
        tracing::trace!(error = %e, "connection ended with an error");
    }
}

fn is_connection_error(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        e.kind(),
        ConnectionRefused | ConnectionAborted | ConnectionReset
    )
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// Serves a router answering `ok` with `limits`; its address and stop.
    async fn served(limits: ConnectionLimits) -> (SocketAddr, CancellationToken) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = Router::new().route("/", axum::routing::get(|| async { "ok" }));
        let stop = CancellationToken::new();
        let metrics = Arc::new(Metrics::new());
        tokio::spawn(run(
            listener,
            app,
            Arc::new(limits),
            Some(metrics),
            stop.clone(),
        ));
        (addr, stop)
    }

    async fn connect_from(from: &str, to: SocketAddr) -> TcpStream {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
        socket.connect(to).await.unwrap()
    }

    /// Reads until the server closes; what it sent.
    async fn until_closed(stream: &mut TcpStream) -> String {
        let mut out = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut out))
            .await
            .expect("the server closes the connection")
            .ok();
        String::from_utf8_lossy(&out).into_owned()
    }

    #[tokio::test]
    async fn headers_that_do_not_arrive_in_time_close_the_connection() {
        let limits = ConnectionLimits::none().with_header_read_timeout(Duration::from_millis(300));
        let (addr, stop) = served(limits).await;
        let mut slow = connect_from("127.0.0.1", addr).await;
        slow.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n")
            .await
            .unwrap();
        let started = std::time::Instant::now();
        until_closed(&mut slow).await;
        assert!(started.elapsed() < Duration::from_secs(2));
        // A whole request is served.
        let mut fast = connect_from("127.0.0.1", addr).await;
        fast.write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        assert!(until_closed(&mut fast).await.starts_with("HTTP/1.1 200"));
        stop.cancel();
    }

    #[tokio::test]
    async fn an_address_past_its_connections_is_answered_503_and_closed() {
        let (addr, stop) = served(ConnectionLimits::new(3, TrustedProxies::default())).await;
        let mut held = Vec::new();
        for _ in 0..3 {
            held.push(connect_from("127.0.4.1", addr).await);
        }
        // Accepted in order: a request on the last one is answered, so all
        // three are counted before the fourth arrives.
        held[2]
            .write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 64];
        let n = held[2].read(&mut buf).await.unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
        let mut fourth = connect_from("127.0.4.1", addr).await;
        let refused = until_closed(&mut fourth).await;
        assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
        // Another address is served meanwhile; and once one closes, so is
        // the first address again.
        let mut other = connect_from("127.0.4.2", addr).await;
        other
            .write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        assert!(until_closed(&mut other).await.starts_with("HTTP/1.1 200"));
        drop(held.remove(0));
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut again = connect_from("127.0.4.1", addr).await;
        again
            .write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        assert!(until_closed(&mut again).await.starts_with("HTTP/1.1 200"));
        stop.cancel();
    }

    #[test]
    fn the_refusal_is_a_whole_response() {
        let text = std::str::from_utf8(TOO_MANY_CONNECTIONS).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(
            head.contains(&format!("content-length: {}", body.len())),
            "{}",
            body.len()
        );
        let problem: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(problem["status"], 503);
    }

    #[test]
    fn connections_are_capped_per_address_but_not_for_trusted_proxies() {
        let proxies = TrustedProxies::parse(&["10.0.0.0/8"]).unwrap();
        let limits = Arc::new(ConnectionLimits::new(2, proxies));
        let peer: SocketAddr = "192.0.2.1:1000".parse().unwrap();
        let a = limits.admit(peer).unwrap();
        let _b = limits.admit(peer).unwrap();
        assert!(limits.admit(peer).is_none());
        assert!(limits.admit("192.0.2.2:1000".parse().unwrap()).is_some());
        drop(a);
        assert!(limits.admit(peer).is_some());
        let proxy: SocketAddr = "10.1.2.3:1000".parse().unwrap();
        let held: Vec<_> = (0..10).map(|_| limits.admit(proxy).unwrap()).collect();
        assert_eq!(held.len(), 10);
    }
}
