//! The client against loopback servers: development mode, TLS pinned to
//! vetted addresses, DNS rebinding, mixed answers, redirects, the response
//! cap, no decompression, keep-alive, timeouts and the explicit proxy.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};
use walhook_devkit::receiver::{Behaviour, Receiver};
use walhook_pipeline::dispatch::egress::Egress;
use walhook_pipeline::dispatch::outcome::{AttemptOutcome, ErrorClass};

use super::server::{RawServer, ok_response};
use super::{Recorder, blocked, dev_settings, egress, outbound};
use crate::http::direct::{Direct, Target};
use crate::http::resolve::StaticLookup;
use crate::http::{EgressSettings, ProxyUrl};
use walhook_pipeline::url_policy::{UrlPolicy, check_url};

fn loopback() -> Vec<IpAddr> {
    vec!["127.0.0.1".parse().unwrap()]
}

fn delivered(status: u16) -> AttemptOutcome {
    walhook_pipeline::dispatch::outcome::classify_status(status, None)
}

#[tokio::test]
async fn plain_http_to_loopback_only_in_development() {
    let server = RawServer::plain(ok_response()).await;
    let url = format!("http://127.0.0.1:{}/hook", server.port());
    let table = Arc::new(StaticLookup::new());
    let recorder = Arc::new(Recorder::default());
    let prod = egress(EgressSettings::default(), &table, &recorder);
    assert_eq!(prod.send(outbound(&url)).await, blocked());
    assert_eq!(server.connections(), 0);
    let dev = egress(dev_settings(), &table, &recorder);
    let result = dev.send(outbound(&url)).await;
    assert_eq!(result.outcome, delivered(200));
    assert_eq!(server.seen().len(), 1);
    assert_eq!(server.seen()[0].request_line, "POST /hook HTTP/1.1");
    recorder.assert_only_loopback();
    assert_eq!(*recorder.connected.lock(), vec![server.addr()]);
}

#[tokio::test]
async fn tls_is_pinned_to_the_vetted_address_under_the_urls_name() {
    let server = RawServer::tls(ok_response()).await;
    let table = Arc::new(StaticLookup::new());
    table.set("hooks.example.com", loopback());
    let recorder = Arc::new(Recorder::default());
    let settings = EgressSettings {
        allowed_ports: vec![server.port()],
        ..dev_settings()
    };
    let egress = egress(settings, &table, &recorder);
    let url = format!("https://Hooks.Example.COM.:{}/in?x=1", server.port());
    let result = egress.send(outbound(&url)).await;
    assert_eq!(result.outcome, delivered(200), "{result:?}");
    let seen = server.seen();
    assert_eq!(seen.len(), 1);
    // The URL was re-serialised (lower case); SNI and Host carry its name,
    // while the connection went to the address the resolver vetted.
    assert_eq!(seen[0].sni.as_deref(), Some("hooks.example.com"));
    assert_eq!(
        seen[0].host,
        format!("hooks.example.com.:{}", server.port())
    );
    assert_eq!(seen[0].request_line, "POST /in?x=1 HTTP/1.1");
    assert_eq!(seen[0].body, b"{}");
    assert_eq!(
        *recorder.approved.lock(),
        vec![("hooks.example.com".to_owned(), loopback())]
    );
    assert_eq!(*recorder.connected.lock(), vec![server.addr()]);
    recorder.assert_only_loopback();
}

#[tokio::test]
async fn a_name_that_rebinds_to_a_private_address_is_refused_at_connect_time() {
    let server = RawServer::tls(ok_response()).await;
    let table = Arc::new(StaticLookup::new());
    table.sequence(
        "rebind.example.com",
        vec![loopback(), vec!["10.0.0.1".parse().unwrap()]],
    );
    let recorder = Arc::new(Recorder::default());
    let settings = EgressSettings {
        allowed_ports: vec![server.port()],
        // No pooled connection: every request resolves again.
        pool_idle_per_host: 0,
        ..dev_settings()
    };
    let egress = egress(settings, &table, &recorder);
    let url = format!("https://rebind.example.com:{}/", server.port());
    assert_eq!(egress.send(outbound(&url)).await.outcome, delivered(200));
    assert_eq!(egress.send(outbound(&url)).await, blocked());
    assert_eq!(egress.send(outbound(&url)).await, blocked());
    assert_eq!(server.seen().len(), 1);
    let asked = table.asked();
    assert_eq!(asked.len(), 3, "{asked:?}");
    assert_eq!(asked[1].1, vec!["10.0.0.1".parse::<IpAddr>().unwrap()]);
    assert_eq!(*recorder.connected.lock(), vec![server.addr()]);
    recorder.assert_only_loopback();
}

#[tokio::test]
async fn mixed_answers_with_one_refused_address_refuse_the_name() {
    let server = RawServer::tls(ok_response()).await;
    let table = Arc::new(StaticLookup::new());
    table.set(
        "hooks.example.com",
        vec!["127.0.0.1".parse().unwrap(), "fd00::1".parse().unwrap()],
    );
    let recorder = Arc::new(Recorder::default());
    let settings = EgressSettings {
        allowed_ports: vec![server.port()],
        ..dev_settings()
    };
    let egress = egress(settings, &table, &recorder);
    let url = format!("https://hooks.example.com:{}/", server.port());
    assert_eq!(egress.send(outbound(&url)).await, blocked());
    assert_eq!(server.connections(), 0);
    assert!(recorder.approved.lock().is_empty());
    recorder.assert_only_loopback();
}

#[tokio::test]
async fn redirects_to_internal_addresses_are_not_followed() {
    let receiver = Receiver::start().await.unwrap();
    let table = Arc::new(StaticLookup::new());
    table.set("internal.example.com", vec!["10.0.0.1".parse().unwrap()]);
    let recorder = Arc::new(Recorder::default());
    let egress = egress(dev_settings(), &table, &recorder);
    let targets = [
        (302, "http://169.254.169.254/latest/meta-data/"),
        (307, "https://internal.example.com/admin"),
        (308, "http://127.0.0.1:1/"),
        (301, "https://[::ffff:10.0.0.1]/"),
    ];
    for (i, (status, location)) in targets.iter().enumerate() {
        let path = format!("r{i}");
        receiver.set_behaviour(
            &path,
            Behaviour::Redirect {
                status: *status,
                location: (*location).to_owned(),
            },
        );
        let result = egress.send(outbound(&receiver.url(&path))).await;
        assert!(
            matches!(
                result.outcome,
                AttemptOutcome::Rejected {
                    status: Some(s),
                    class: ErrorClass::Redirect
                } if s == *status
            ),
            "{location}: {result:?}"
        );
    }
    assert_eq!(receiver.count(), targets.len());
    assert!(table.asked().is_empty(), "a redirect target was resolved");
    for peer in recorder.connected.lock().iter() {
        assert_eq!(*peer, receiver.addr());
    }
    recorder.assert_only_loopback();
}

#[tokio::test]
async fn at_most_64_kib_are_read_undecompressed_and_digested() {
    let body: Vec<u8> = (0..1024 * 1024).map(|i| (i % 251) as u8).collect();
    let mut response = format!(
        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\ncontent-encoding: gzip\r\n\r\n",
        body.len()
    )
    .into_bytes();
    response.extend_from_slice(&body);
    let server = RawServer::plain(response).await;
    let table = Arc::new(StaticLookup::new());
    let recorder = Arc::new(Recorder::default());
    let egress = egress(dev_settings(), &table, &recorder);
    let result = egress
        .send(outbound(&format!("http://127.0.0.1:{}/", server.port())))
        .await;
    assert_eq!(result.outcome, delivered(200));
    // The raw bytes (not gunzipped: they are not even gzip), cut at 64 KiB.
    let expected: [u8; 32] = Sha256::digest(&body[..64 * 1024]).into();
    assert_eq!(result.response_sha256, Some(expected));
    assert!(result.response_excerpt.unwrap().chars().count() <= 1024);
}

#[tokio::test]
async fn connections_are_kept_alive_per_host() {
    let server = RawServer::plain(ok_response()).await;
    let table = Arc::new(StaticLookup::new());
    let recorder = Arc::new(Recorder::default());
    let egress = egress(dev_settings(), &table, &recorder);
    let url = format!("http://127.0.0.1:{}/", server.port());
    for _ in 0..5 {
        assert_eq!(egress.send(outbound(&url)).await.outcome, delivered(200));
    }
    assert_eq!(server.seen().len(), 5);
    assert!(server.seen().iter().all(|s| s.connection == 0));
    assert_eq!(server.connections(), 1);
    assert_eq!(recorder.connected.lock().len(), 1);
}

#[tokio::test]
async fn a_connection_the_receiver_closes_is_never_reused() {
    // Said (`connection: close`) or not (the socket just closes after the
    // response): every request still goes out once and succeeds, on a
    // connection of its own.
    for server in [
        RawServer::plain(
            b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok".to_vec(),
        )
        .await,
        RawServer::plain_closing(ok_response()).await,
    ] {
        let table = Arc::new(StaticLookup::new());
        let recorder = Arc::new(Recorder::default());
        let egress = egress(dev_settings(), &table, &recorder);
        let url = format!("http://127.0.0.1:{}/", server.port());
        for i in 0..5 {
            assert_eq!(
                egress.send(outbound(&url)).await.outcome,
                delivered(200),
                "request {i}"
            );
            // Give the closed connection time to be noticed, or not: both
            // orders must work.
            if i % 2 == 0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        let seen = server.seen();
        assert_eq!(seen.len(), 5, "{seen:?}");
        let mut connections: Vec<usize> = seen.iter().map(|s| s.connection).collect();
        connections.dedup();
        assert_eq!(
            connections.len(),
            5,
            "a closed connection carried two requests"
        );
    }
}

/// The direct client's target for `path` on `server` (checked under the
/// development policy), and a POST of `{}` to it.
fn direct_request(
    server: &RawServer,
    path: &str,
) -> (Target, http::Request<http_body_util::Full<bytes::Bytes>>) {
    let url = format!("http://127.0.0.1:{}{path}", server.port());
    let target = Target::new(&check_url(&url, &dev_settings().url_policy()).unwrap()).unwrap();
    let request = http::Request::post(target.path().clone())
        .body(http_body_util::Full::new(bytes::Bytes::from_static(b"{}")))
        .unwrap();
    (target, request)
}

#[tokio::test]
async fn the_direct_path_checks_the_peer_of_every_new_connection() {
    // The target is made under the development policy and sent by a client
    // under the production one, so the URL check is out of the way: the
    // peer check alone must stop the request.
    let server = RawServer::plain(ok_response()).await;
    let recorder = Arc::new(Recorder::default());
    let (target, request) = direct_request(&server, "/");
    let direct = Direct::new(
        Arc::new(StaticLookup::new()),
        UrlPolicy::default(),
        recorder.clone(),
        &[],
        Duration::from_secs(2),
        4,
    )
    .unwrap();
    let refused = direct.exchange(&target, request).await.err();
    assert_eq!(refused, Some(ErrorClass::Blocked));
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(server.seen().is_empty(), "a request reached a refused peer");
    assert!(recorder.connected.lock().is_empty());
}

#[tokio::test]
async fn idle_connections_are_pooled_per_origin_and_swept_when_stale() {
    use http_body_util::BodyExt;
    let server = RawServer::plain(ok_response()).await;
    let recorder = Arc::new(Recorder::default());
    // The sweeper as production runs it, on a shorter clock.
    let idle_timeout = Duration::from_secs(3);
    let direct = Arc::new(
        Direct::new(
            Arc::new(StaticLookup::new()),
            dev_settings().url_policy(),
            recorder.clone(),
            &[],
            Duration::from_secs(2),
            4,
        )
        .unwrap()
        .idle_timing(idle_timeout, Duration::from_millis(50)),
    );
    Direct::start_sweeping(&direct);
    // Two requests at once need two connections; both go back to the pool
    // once their responses are read, and later requests (another path,
    // the same origin) reuse them.
    let (a, ra) = direct_request(&server, "/a");
    let (b, rb) = direct_request(&server, "/b");
    let (first, second) = tokio::join!(direct.exchange(&a, ra), direct.exchange(&b, rb));
    for (response, mut lease) in [first.unwrap(), second.unwrap()] {
        assert_eq!(response.status(), 200);
        response.into_body().collect().await.unwrap();
        assert!(lease.ready().await);
        direct.checkin(lease);
    }
    assert_eq!(direct.idle(), 2);
    let (c, rc) = direct_request(&server, "/c");
    let (response, mut lease) = direct.exchange(&c, rc).await.unwrap();
    response.into_body().collect().await.unwrap();
    assert!(lease.ready().await);
    direct.checkin(lease);
    assert_eq!(server.connections(), 2);
    assert_eq!(direct.idle(), 2);
    // Sweeps before the idle timeout keep them; one after closes them.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(direct.idle(), 2);
    let deadline = std::time::Instant::now() + idle_timeout + Duration::from_secs(10);
    while direct.idle() > 0 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(direct.idle(), 0);
    let (d, rd) = direct_request(&server, "/d");
    assert!(direct.exchange(&d, rd).await.is_ok());
    assert_eq!(server.connections(), 3);
}

#[tokio::test]
async fn a_slow_receiver_times_out() {
    let receiver = Receiver::start().await.unwrap();
    receiver.set_behaviour(
        "slow",
        Behaviour::Delay {
            wait: Duration::from_secs(5),
            status: 200,
        },
    );
    let table = Arc::new(StaticLookup::new());
    let recorder = Arc::new(Recorder::default());
    let settings = EgressSettings {
        request_timeout: Duration::from_millis(300),
        ..dev_settings()
    };
    let egress = egress(settings, &table, &recorder);
    let started = std::time::Instant::now();
    let result = egress.send(outbound(&receiver.url("slow"))).await;
    assert!(started.elapsed() < Duration::from_secs(3));
    assert!(
        matches!(
            result.outcome,
            AttemptOutcome::Retryable {
                class: ErrorClass::Timeout,
                ..
            }
        ),
        "{result:?}"
    );
}

#[tokio::test]
async fn an_explicit_proxy_gets_connect_and_walhook_resolves_nothing() {
    // The "proxy" refuses every tunnel; what matters is what it was asked.
    let proxy =
        RawServer::plain(b"HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\n\r\n".to_vec()).await;
    let table = Arc::new(StaticLookup::new());
    let recorder = Arc::new(Recorder::default());
    let settings = EgressSettings {
        proxy: Some(ProxyUrl(format!("http://127.0.0.1:{}", proxy.port()))),
        ..EgressSettings::default()
    };
    let egress = egress(settings, &table, &recorder);
    let result = egress.send(outbound("https://hooks.example.com/in")).await;
    assert_ne!(result.outcome, delivered(200));
    let seen = proxy.seen();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(
        seen[0].request_line,
        "CONNECT hooks.example.com:443 HTTP/1.1"
    );
    assert!(
        table.asked().is_empty(),
        "walhook resolved {:?}",
        table.asked()
    );
    // The URL policy still applies in front of the proxy.
    assert_eq!(egress.send(outbound("https://10.0.0.1/")).await, blocked());
    assert_eq!(proxy.seen().len(), 1);
    recorder.assert_only_loopback();
}

#[tokio::test]
async fn the_dial_guard_drops_a_connection_to_a_refused_peer() {
    // A client with the guard but without the URL check in front of it: the
    // guard alone must stop a request to a refused (here: loopback under
    // the production policy) address literal.
    use crate::http::dial::DialGuardLayer;
    use crate::http::resolve::TrustedProxy;
    use walhook_pipeline::url_policy::Refusal;
    let server = RawServer::plain(ok_response()).await;
    let recorder = Arc::new(Recorder::default());
    let client = reqwest::Client::builder()
        .no_proxy()
        .connector_layer(DialGuardLayer::new(
            UrlPolicy::default(),
            recorder.clone(),
            Arc::new(TrustedProxy::default()),
        ))
        .build()
        .unwrap();
    let err = client
        .post(format!("http://127.0.0.1:{}/", server.port()))
        .send()
        .await
        .unwrap_err();
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&err);
    let mut found = false;
    while let Some(e) = source {
        found |= e.downcast_ref::<Refusal>().is_some();
        source = e.source();
    }
    assert!(found, "{err:?}");
    // TCP was accepted (that is how the peer is known), but no request
    // was written.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(server.seen().is_empty());
    assert!(recorder.connected.lock().is_empty());
}

/// A CONNECT proxy that tunnels every request to `target`, whatever it
/// names: enough to put the proxy path's TLS in front of a test server.
async fn tunnel_to(target: std::net::SocketAddr) -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if client.read(&mut byte).await.unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(byte[0]);
                }
                let Ok(mut upstream) = tokio::net::TcpStream::connect(target).await else {
                    return;
                };
                if client
                    .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    .await
                    .is_ok()
                {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                }
            });
        }
    });
    addr
}

#[tokio::test]
async fn the_proxy_paths_failures_are_classified_by_type() {
    let table = Arc::new(StaticLookup::new());
    let recorder = Arc::new(Recorder::default());
    // A proxy whose name does not resolve: DNS.
    let settings = EgressSettings {
        proxy: Some(ProxyUrl("http://proxy.invalid:3128".into())),
        ..EgressSettings::default()
    };
    let result = egress(settings, &table, &recorder)
        .send(outbound("https://hooks.example.com/in"))
        .await;
    assert_eq!(
        result.outcome.error_class(),
        Some(ErrorClass::Dns),
        "{result:?}"
    );
    // A tunnel to a server whose certificate does not name the URL's host:
    // TLS (the handshake's own error, found in the chain).
    let server = RawServer::tls(ok_response()).await;
    let proxy = tunnel_to(server.addr()).await;
    let settings = EgressSettings {
        proxy: Some(ProxyUrl(format!("http://{proxy}"))),
        allowed_ports: vec![server.port()],
        ..EgressSettings::default()
    };
    let egress = egress(settings, &table, &recorder);
    let url = format!("https://wrong.example.com:{}/in", server.port());
    let result = egress.send(outbound(&url)).await;
    assert_eq!(
        result.outcome.error_class(),
        Some(ErrorClass::Tls),
        "{result:?}"
    );
    // The same tunnel to the name the certificate carries delivers: the
    // class above came from the certificate, not from the tunnel.
    let url = format!("https://hooks.example.com:{}/in", server.port());
    assert_eq!(egress.send(outbound(&url)).await.outcome, delivered(200));
    recorder.assert_only_loopback();
}
