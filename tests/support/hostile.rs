//! A receiver that misbehaves on purpose, written on raw TCP so that it can
//! send what no well-behaved HTTP server would: NUL bytes and invalid UTF-8
//! in bodies, control characters, a 10 MB body, a body that trickles, 500
//! headers, a header with a control byte, a response cut off mid-body.
//! Loopback only.

// Test code spawns freely.
#![allow(clippy::disallowed_methods)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The misbehaviours, by request path (without the slash).
pub const PATHS: &[&str] = &[
    "nul-200",
    "nul-500",
    "control",
    "big",
    "trickle",
    "headers",
    "bad-header",
    "cut",
];

/// A running hostile receiver.
pub struct Hostile {
    /// `127.0.0.1:PORT`.
    pub addr: std::net::SocketAddr,
    /// Requests answered (or cut).
    pub requests: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Hostile {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Hostile {
    /// Starts on a free loopback port.
    pub async fn start() -> Hostile {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(AtomicU64::new(0));
        let count = requests.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((socket, _)) = listener.accept().await else {
                    return;
                };
                let count = count.clone();
                tokio::spawn(async move {
                    let _ = serve(socket, count).await;
                });
            }
        });
        Hostile {
            addr,
            requests,
            task,
        }
    }

    /// The URL of `path`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}/{path}", self.addr)
    }
}

/// Reads one request and answers according to its path, then closes.
async fn serve(mut socket: TcpStream, count: Arc<AtomicU64>) -> std::io::Result<()> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        let n = socket.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let length: usize = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().parse().unwrap_or(0))
        })
        .unwrap_or(0);
    while buf.len() < head_end + length {
        let n = socket.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let path = head
        .split_whitespace()
        .nth(1)
        .unwrap_or("/")
        .trim_start_matches('/')
        .to_owned();
    count.fetch_add(1, Ordering::Relaxed);
    let evil_body: &[u8] = b"ok\0\xff\xfe\xc3(\x1b[31mred\x07\x7f\xc2\x85 \r\ntail";
    match path.as_str() {
        "nul-200" => respond(&mut socket, "200 OK", &[], evil_body).await,
        "nul-500" => respond(&mut socket, "500 Internal Server Error", &[], evil_body).await,
        "control" => {
            let body: Vec<u8> = (0u8..=255).collect();
            respond(&mut socket, "503 Service Unavailable", &[], &body).await
        }
        "big" => {
            let size = 10 << 20;
            socket
                .write_all(
                    format!("HTTP/1.1 200 OK\r\nContent-Length: {size}\r\nConnection: close\r\n\r\n")
                        .as_bytes(),
                )
                .await?;
            let block = vec![0u8; 64 << 10];
            let mut sent = 0;
            while sent < size {
                socket.write_all(&block).await?;
                sent += block.len();
            }
            Ok(())
        }
        "trickle" => {
            socket
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 60\r\nConnection: close\r\n\r\n")
                .await?;
            for _ in 0..60 {
                socket.write_all(b"\0").await?;
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Ok(())
        }
        "headers" => {
            let headers: Vec<String> = (0..500).map(|i| format!("x-h{i}: {i}")).collect();
            let headers: Vec<&str> = headers.iter().map(String::as_str).collect();
            respond(&mut socket, "200 OK", &headers, b"many headers").await
        }
        "bad-header" => {
            socket
                .write_all(
                    b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 1\x01\r\nX-Evil: a\x00b\r\nContent-Length: 2\r\nConnection: close\r\n\r\nno",
                )
                .await
        }
        "cut" => {
            socket
                .write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\nConnection: close\r\n\r\nonly ten b",
                )
                .await?;
            socket.shutdown().await
        }
        _ => respond(&mut socket, "404 Not Found", &[], b"").await,
    }
}

async fn respond(
    socket: &mut TcpStream,
    status: &str,
    headers: &[&str],
    body: &[u8],
) -> std::io::Result<()> {
    let mut out = format!("HTTP/1.1 {status}\r\n");
    for h in headers {
        out.push_str(h);
        out.push_str("\r\n");
    }
    out.push_str(&format!(
        "Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    ));
    let mut bytes = out.into_bytes();
    bytes.extend_from_slice(body);
    socket.write_all(&bytes).await
}
