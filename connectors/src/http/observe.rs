//! What the egress tells an observer: the addresses about to be dialled and
//! the peers actually connected to.
//!
//! Production logs both (at debug level: one line per new connection, not
//! per request). Tests record them, which is how they prove that nothing but
//! loopback was ever dialled, and refuse to approve anything else, so that a
//! bug in the policy can never make a test send a packet elsewhere.

use std::net::{IpAddr, SocketAddr};

/// Sees every address the egress is about to dial and every connection made.
pub trait EgressObserver: Send + Sync + 'static {
    /// `addrs` passed the policy for `host` (a resolved name, or an address
    /// literal) and are about to be handed to the connector. Returning
    /// `false` stops the connection (the request fails as blocked).
    fn approve(&self, host: &str, addrs: &[IpAddr]) -> bool {
        let _ = (host, addrs);
        true
    }

    /// A new connection to `peer` was established (after its address passed
    /// the dial guard).
    fn connected(&self, peer: SocketAddr) {
        let _ = peer;
    }
}

/// The production observer: logs at debug level, approves what the policy
/// approved.
#[derive(Debug, Clone, Copy, Default)]
pub struct LogObserver;

impl EgressObserver for LogObserver {
    fn approve(&self, host: &str, addrs: &[IpAddr]) -> bool {
        tracing::debug!(host, ?addrs, "egress addresses vetted");
        true
    }

    fn connected(&self, peer: SocketAddr) {
        tracing::debug!(%peer, "egress connection established");
    }
}
