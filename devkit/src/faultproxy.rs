//! A loopback TCP proxy that puts network faults between walhook and a
//! receiver: latency, a connection reset in the middle of the response, a
//! black hole, a slow close, a response trickled a byte at a time, and an
//! endpoint that flaps between up and refused.
//!
//! Each accepted connection takes the fault set at that moment; HTTP
//! clients keep connections alive, so a change applies to the connections
//! opened after it (a fault makes the client drop its connection, so the
//! next attempt sees the new setting).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the proxy does to a new connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Passes bytes both ways.
    None,
    /// Waits this long before passing the request on.
    Latency(Duration),
    /// Passes the request on, sends back half of the response, then resets
    /// the connection (RST).
    ResetMidBody,
    /// Accepts and reads, never answers, never closes.
    BlackHole,
    /// Passes the response, marked `Connection: close`, then keeps the
    /// connection open this long before closing it.
    SlowClose(Duration),
    /// Passes the request on and the response back one byte per interval.
    Trickle(Duration),
    /// Up for one period, down the next: connections accepted while down
    /// are reset at once, and those open when it goes down are reset then.
    Flap(Duration),
}

/// A running proxy; stops accepting when dropped.
pub struct FaultProxy {
    addr: SocketAddr,
    fault: Arc<Mutex<Fault>>,
    connections: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultProxy")
            .field("addr", &self.addr)
            .field("fault", &*self.fault.lock())
            .finish()
    }
}

impl FaultProxy {
    /// Listens on an ephemeral loopback port and forwards to `upstream`
    /// (a loopback address).
    pub async fn start(upstream: SocketAddr) -> std::io::Result<FaultProxy> {
        assert!(
            upstream.ip().is_loopback(),
            "the fault proxy only forwards to loopback"
        );
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let fault = Arc::new(Mutex::new(Fault::None));
        let connections = Arc::new(AtomicU64::new(0));
        let started = Instant::now();
        let task = {
            let fault = fault.clone();
            let connections = connections.clone();
            tokio::spawn(async move {
                while let Ok((client, _)) = listener.accept().await {
                    connections.fetch_add(1, Ordering::Relaxed);
                    let f = *fault.lock();
                    tokio::spawn(serve(client, upstream, f, started));
                }
            })
        };
        Ok(FaultProxy {
            addr,
            fault,
            connections,
            task,
        })
    }

    /// The proxy's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT/path`: the receiver's `path` through the
    /// proxy.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}/{path}", self.addr)
    }

    /// Sets the fault for connections accepted from now on.
    pub fn set(&self, fault: Fault) {
        *self.fault.lock() = fault;
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.connections.load(Ordering::Relaxed)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Closes `s` with a reset rather than a FIN.
// A linger of zero never blocks on drop (the kernel discards the send queue
// and sends RST at once), which is what the deprecation warns about.
#[allow(deprecated)]
fn reset(s: TcpStream) {
    let _ = s.set_linger(Some(Duration::ZERO));
    drop(s);
}

/// `response` with a `Connection: close` header after its status line.
fn with_connection_close(response: &[u8]) -> Vec<u8> {
    match response.windows(2).position(|w| w == b"\r\n") {
        Some(end) => {
            let mut out = Vec::with_capacity(response.len() + 19);
            out.extend_from_slice(&response[..end + 2]);
            out.extend_from_slice(b"connection: close\r\n");
            out.extend_from_slice(&response[end + 2..]);
            out
        }
        None => response.to_vec(),
    }
}

/// Reads one HTTP message (head, and a body of its `content-length`) from
/// `from`; `None` when the peer closes first.
async fn read_message(from: &mut TcpStream) -> std::io::Result<Option<Vec<u8>>> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let n = from.read(&mut chunk).await?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let length = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            if buf.len() >= end + 4 + length {
                return Ok(Some(buf));
            }
        }
    }
}

/// Passes one request from `client` to `upstream` and returns the
/// response (`None` when either side closed first).
async fn exchange(client: &mut TcpStream, upstream: &mut TcpStream) -> Option<Vec<u8>> {
    let request = read_message(client).await.ok()??;
    upstream.write_all(&request).await.ok()?;
    read_message(upstream).await.ok()?
}

async fn serve(mut client: TcpStream, upstream: SocketAddr, fault: Fault, started: Instant) {
    let _ = client.set_nodelay(true);
    match fault {
        Fault::BlackHole => {
            // Read and drop whatever comes until the client gives up.
            let mut sink = [0u8; 8192];
            while matches!(client.read(&mut sink).await, Ok(n) if n > 0) {}
            return;
        }
        Fault::Flap(period) => {
            let phase = started.elapsed().as_millis() / period.as_millis().max(1);
            if phase % 2 == 1 {
                reset(client);
                return;
            }
        }
        Fault::Latency(d) => tokio::time::sleep(d).await,
        _ => {}
    }
    let Ok(mut up) = TcpStream::connect(upstream).await else {
        reset(client);
        return;
    };
    let _ = up.set_nodelay(true);
    match fault {
        Fault::None | Fault::Latency(_) => {
            let _ = tokio::io::copy_bidirectional(&mut client, &mut up).await;
        }
        Fault::Flap(period) => {
            // Up until the period ends; then the connection goes down too.
            let period_ms = period.as_millis().max(1);
            let into = started.elapsed().as_millis() % period_ms;
            let left = Duration::from_millis((period_ms - into) as u64);
            if tokio::time::timeout(left, tokio::io::copy_bidirectional(&mut client, &mut up))
                .await
                .is_err()
            {
                reset(client);
            }
        }
        Fault::ResetMidBody => {
            if let Some(response) = exchange(&mut client, &mut up).await {
                let _ = client.write_all(&response[..response.len() / 2]).await;
                let _ = client.flush().await;
            }
            reset(client);
        }
        Fault::SlowClose(d) => {
            if let Some(response) = exchange(&mut client, &mut up).await {
                let _ = client.write_all(&with_connection_close(&response)).await;
                let _ = client.flush().await;
                tokio::time::sleep(d).await;
            }
        }
        Fault::Trickle(every) => {
            if let Some(response) = exchange(&mut client, &mut up).await {
                for b in response {
                    if client.write_all(&[b]).await.is_err() {
                        return;
                    }
                    tokio::time::sleep(every).await;
                }
            }
        }
        Fault::BlackHole => unreachable!("handled above"),
    }
}
