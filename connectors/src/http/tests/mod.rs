//! Egress tests: the SSRF corpus, the resolver and the dial guard under a
//! recording observer, client hygiene, TLS pinning and a property test.
//!
//! Only loopback is ever dialled. Names resolve through a recording static
//! table, never DNS; and the [`Recorder`] approves loopback addresses only,
//! so that a bug in the policy fails a test instead of sending a packet
//! anywhere else.

mod client;
mod corpus;
mod extremes;
mod prop;
mod server;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use walhook_pipeline::dispatch::egress::{EgressResult, Outbound};
use walhook_pipeline::dispatch::outcome::{ErrorClass, classify_failure};

use super::observe::EgressObserver;
use super::resolve::StaticLookup;
use super::{EgressSettings, HttpEgress};

/// Records what the egress was about to dial and what it connected to;
/// approves loopback only.
#[derive(Debug, Default)]
pub struct Recorder {
    /// (host, addresses) approved.
    pub approved: Mutex<Vec<(String, Vec<IpAddr>)>>,
    /// (host, addresses) the policy let through that were not loopback: a
    /// test fails when this is not empty.
    pub fenced: Mutex<Vec<(String, Vec<IpAddr>)>>,
    /// Peers connected to.
    pub connected: Mutex<Vec<SocketAddr>>,
}

impl EgressObserver for Recorder {
    fn approve(&self, host: &str, addrs: &[IpAddr]) -> bool {
        let entry = (host.to_owned(), addrs.to_vec());
        if addrs.iter().all(IpAddr::is_loopback) {
            self.approved.lock().push(entry);
            true
        } else {
            self.fenced.lock().push(entry);
            false
        }
    }

    fn connected(&self, peer: SocketAddr) {
        self.connected.lock().push(peer);
    }
}

impl Recorder {
    /// Asserts that nothing but loopback was approved or connected to.
    pub fn assert_only_loopback(&self) {
        let fenced = self.fenced.lock();
        assert!(
            fenced.is_empty(),
            "the policy let non-loopback addresses through: {fenced:?}"
        );
        for peer in self.connected.lock().iter() {
            assert!(peer.ip().is_loopback(), "connected to {peer}");
        }
    }
}

/// An egress with `settings`, names from `table`, observed by `recorder`.
pub fn egress(
    settings: EgressSettings,
    table: &Arc<StaticLookup>,
    recorder: &Arc<Recorder>,
) -> HttpEgress {
    HttpEgress::builder(settings)
        .lookup(table.clone())
        .observer(recorder.clone())
        .root_certificate_pem(server::CA_PEM)
        .unwrap()
        .build()
        .unwrap()
}

/// Development settings (loopback allowed), short timeouts.
pub fn dev_settings() -> EgressSettings {
    EgressSettings {
        allow_http_loopback: true,
        connect_timeout: std::time::Duration::from_secs(2),
        request_timeout: std::time::Duration::from_secs(5),
        ..EgressSettings::default()
    }
}

/// A POST of `{}` to `url`.
pub fn outbound(url: &str) -> Outbound {
    Outbound {
        url: url.to_owned(),
        headers: vec![("content-type", "application/json".into())],
        body: Bytes::from_static(b"{}"),
    }
}

/// The result of a blocked attempt.
pub fn blocked() -> EgressResult {
    EgressResult::bare(classify_failure(ErrorClass::Blocked))
}
