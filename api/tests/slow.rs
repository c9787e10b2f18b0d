//! Slow and large bodies over real TCP: sign-in forms trickled a byte at
//! a time hold no request slot (they are read, small and quickly, before
//! one is taken), and an authenticated body that does not arrive within
//! `[api].body_read_timeout` is answered 408.

// Test code spawns freely.
#![allow(clippy::disallowed_methods)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use walhook_api::ApiLimits;
use walhook_api::metrics::Refusal;

use crate::support::Api;

/// A connection to `server` from loopback address `from`.
async fn connect_from(from: &str, server: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(format!("{from}:0").parse().unwrap())?;
    socket.connect(server).await
}

fn server_addr(api: &Api) -> SocketAddr {
    api.base.trim_start_matches("http://").parse().unwrap()
}

/// What the trickling connections saw.
#[derive(Default)]
struct Trickled {
    connections: AtomicU64,
    bytes: AtomicU64,
    /// Answers 408 (the form was cut off).
    timed_out: AtomicU64,
    /// Other answers, or connections closed without one.
    other: AtomicU64,
}

/// Until `end`, keeps one connection from `from` trickling a sign-in form
/// (declared 1,000 bytes, one byte every 200 ms), opening a new one
/// whenever the server answers or closes.
async fn trickle(server: SocketAddr, from: String, end: Instant, seen: Arc<Trickled>) {
    while Instant::now() < end {
        let Ok(mut stream) = connect_from(&from, server).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        seen.connections.fetch_add(1, Ordering::Relaxed);
        let head = "POST /console/login HTTP/1.1\r\nhost: walhook\r\n\
                    content-type: application/x-www-form-urlencoded\r\ncontent-length: 1000\r\n\r\n";
        if stream.write_all(head.as_bytes()).await.is_err() {
            continue;
        }
        let mut answer = Vec::new();
        let mut buf = [0u8; 512];
        loop {
            if Instant::now() >= end {
                return;
            }
            tokio::select! {
                read = stream.read(&mut buf) => {
                    match read {
                        Ok(0) | Err(_) => break,
                        Ok(n) => answer.extend_from_slice(&buf[..n]),
                    }
                }
                _ = tokio::time::sleep(Duration::from_millis(200)) => {
                    if stream.write_all(b"k").await.is_err() {
                        break;
                    }
                    seen.bytes.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        if answer.starts_with(b"HTTP/1.1 408") {
            seen.timed_out.fetch_add(1, Ordering::Relaxed);
        } else {
            seen.other.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eighty_trickled_sign_ins_do_not_hold_up_a_tenant() {
    let api = Api::start().await;
    let key = api.tenant("acme").await;
    api.endpoint(&key, &["invoice.paid"]).await;
    let server = server_addr(&api);
    let seen = Arc::new(Trickled::default());
    let started = Instant::now();
    let end = started + Duration::from_secs(12);
    // 80 connections from 80 addresses, so that no per-address cap is
    // what stops them: the sign-in form is read before a slot is taken.
    let attackers: Vec<_> = (0..80)
        .map(|i| {
            tokio::spawn(trickle(
                server,
                format!("127.0.3.{}", i + 1),
                end,
                seen.clone(),
            ))
        })
        .collect();
    // Let them connect and start trickling.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let mut latencies = Vec::new();
    while Instant::now() < end {
        let t = Instant::now();
        let r = http
            .get(format!("{}/v1/webhook-endpoints", api.base))
            .bearer_auth(&key)
            .send()
            .await
            .expect("the tenant's GET failed");
        let status = r.status();
        let body = r.text().await.unwrap();
        latencies.push(t.elapsed());
        assert_eq!(status, 200, "{body}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for a in attackers {
        a.await.unwrap();
    }
    latencies.sort();
    let at = |q: f64| latencies[((latencies.len() as f64 * q) as usize).min(latencies.len() - 1)];
    let (p50, p99, max) = (at(0.50), at(0.99), *latencies.last().unwrap());
    println!(
        "80 trickling sign-ins for 12 s ({} connections, {} bytes trickled, {} cut off with 408, \
         {} other ends); the tenant's GET /v1/webhook-endpoints: {} requests, all 200, \
         p50 {p50:?}, p99 {p99:?}, max {max:?}",
        seen.connections.load(Ordering::Relaxed),
        seen.bytes.load(Ordering::Relaxed),
        seen.timed_out.load(Ordering::Relaxed),
        seen.other.load(Ordering::Relaxed),
        latencies.len(),
    );
    assert!(p99 < Duration::from_secs(1), "p99 {p99:?}");
    // The forms were cut off after SIGN_IN_BODY_TIMEOUT (each at least
    // once in 12 s), not read for as long as they trickled.
    let cut = api.state.metrics.refusals(Refusal::SignInBody);
    assert!(cut >= 80, "{cut} forms cut off");
    assert!(seen.connections.load(Ordering::Relaxed) >= 160);
}

#[tokio::test]
async fn a_sign_in_form_over_the_cap_is_refused_at_once() {
    let api = Api::start().await;
    let mut stream = connect_from("127.0.0.1", server_addr(&api)).await.unwrap();
    let head = format!(
        "POST /console/login HTTP/1.1\r\nhost: walhook\r\n\
         content-type: application/x-www-form-urlencoded\r\ncontent-length: {}\r\n\r\n",
        walhook_api::limits::SIGN_IN_MAX_BODY + 1
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut answer = vec![0u8; 256];
    let n = tokio::time::timeout(Duration::from_secs(2), stream.read(&mut answer))
        .await
        .expect("an answer at once")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer[..n]);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
}

#[tokio::test]
async fn an_authenticated_body_that_does_not_arrive_in_time_is_a_408() {
    let api = Api::start_with(ApiLimits {
        body_read_timeout: Duration::from_secs(1),
        ..ApiLimits::default()
    })
    .await;
    let key = api.tenant("acme").await;
    let mut stream = connect_from("127.0.0.1", server_addr(&api)).await.unwrap();
    let head = format!(
        "POST /v1/webhook-endpoints HTTP/1.1\r\nhost: walhook\r\nauthorization: Bearer {key}\r\n\
         content-type: application/json\r\ncontent-length: 100\r\n\r\n{{\"url\": "
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let started = Instant::now();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
        .await
        .expect("an answer and a close")
        .unwrap();
    let waited = started.elapsed();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("body_read_timeout"), "{answer}");
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_secs(5),
        "{waited:?}"
    );
    assert_eq!(
        api.count("SELECT count(*) FROM walhook.endpoints").await,
        0,
        "nothing was created"
    );
}
