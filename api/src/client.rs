//! Who is on the other end of a request: its client address, from the TCP
//! peer or, behind a reverse proxy the operator trusts, from the
//! `X-Forwarded-For` that proxy adds.
//!
//! ```text
//!  TCP peer ──in [api].trusted_proxies?──no──▶ the peer is the client
//!                    │
//!                    └─yes─▶ X-Forwarded-For, right to left: the first address
//!                            that is not a trusted proxy (none parsable: the peer)
//! ```
//!
//! Only the right end of the header can be believed: each trusted proxy
//! appends the peer it saw, and anything to the left of that was written
//! by whoever connected, so a client cannot name itself someone else.
//! Without `trusted_proxies` the header is ignored, and behind a proxy
//! every client shares the proxy's address (and its limits).
//!
//! Limits keyed by address use a [`ClientKey`]: an IPv4 address, or the
//! /64 network of an IPv6 address (one subscriber usually holds a whole
//! /64, so counting single IPv6 addresses would give it 2^64 budgets).

use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use axum::extract::FromRequestParts;
use axum::http::HeaderMap;
use axum::http::request::Parts;
use ipnet::IpNet;

use crate::settings::InvalidSetting;

/// The client address of a request (a request extension, set by
/// [`crate::edge`] from the connection and the trusted proxies).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientAddr(pub IpAddr);

impl ClientAddr {
    /// The key of limits per address.
    pub fn key(self) -> ClientKey {
        ClientKey::of(self.0)
    }
}

/// The extractor of a request's [`ClientKey`]: `None` for calls made
/// in-process (the console's calls to the API), which came over no
/// connection.
#[derive(Debug, Clone, Copy)]
pub struct Client(pub Option<ClientKey>);

impl<S: Send + Sync> FromRequestParts<S> for Client {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Infallible> {
        Ok(Client(
            parts.extensions.get::<ClientAddr>().map(|c| c.key()),
        ))
    }
}

/// What per-address limits count by: an IPv4 address, or the /64 network
/// of an IPv6 address.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
pub enum ClientKey {
    /// An IPv4 address (IPv4-mapped IPv6 addresses included).
    V4(Ipv4Addr),
    /// The first 64 bits of an IPv6 address.
    V6Net(u64),
}

impl ClientKey {
    /// The key of `ip`.
    pub fn of(ip: IpAddr) -> ClientKey {
        match ip {
            IpAddr::V4(v4) => ClientKey::V4(v4),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => ClientKey::V4(v4),
                None => ClientKey::V6Net((u128::from(v6) >> 64) as u64),
            },
        }
    }
}

impl std::fmt::Display for ClientKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientKey::V4(v4) => write!(f, "{v4}"),
            ClientKey::V6Net(net) => {
                let addr = std::net::Ipv6Addr::from(u128::from(*net) << 64);
                write!(f, "{addr}/64")
            }
        }
    }
}

/// The most `X-Forwarded-For` entries read, from the right: enough for
/// any chain of proxies, and a long forged header costs nothing.
const MAX_FORWARDED_HOPS: usize = 32;

/// The reverse proxies whose `X-Forwarded-For` is believed
/// (`[api].trusted_proxies`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustedProxies(Vec<IpNet>);

impl TrustedProxies {
    /// Parses `[api].trusted_proxies`: CIDRs (`10.0.0.0/8`, `fd00::/8`) or
    /// single addresses.
    pub fn parse<S: AsRef<str>>(list: &[S]) -> Result<TrustedProxies, InvalidSetting> {
        let mut nets = Vec::with_capacity(list.len());
        for (i, text) in list.iter().enumerate() {
            let text = text.as_ref().trim();
            let net = text
                .parse::<IpNet>()
                .or_else(|_| text.parse::<IpAddr>().map(IpNet::from))
                .map_err(|_| InvalidSetting {
                    field: "trusted_proxies",
                    message: format!(
                        "[{i}] = {text:?} is not an address or a CIDR; write e.g. \"10.0.0.0/8\" \
                         or \"192.0.2.7\""
                    ),
                })?;
            nets.push(net.trunc());
        }
        Ok(TrustedProxies(nets))
    }

    /// Whether no proxy is trusted.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `ip` is a trusted proxy.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        self.0.iter().any(|net| net.contains(&ip))
    }

    /// The client of a request that came from `peer` with `headers`.
    pub fn client(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        let peer = canonical(peer);
        if !self.contains(peer) {
            return peer;
        }
        let mut hops: Vec<&str> = Vec::new();
        for value in headers.get_all("x-forwarded-for").iter() {
            let Ok(text) = value.to_str() else {
                return peer;
            };
            hops.extend(text.split(','));
        }
        let mut nearest = peer;
        for hop in hops.iter().rev().take(MAX_FORWARDED_HOPS) {
            let Some(ip) = parse_hop(hop.trim()) else {
                // Garbage where a trusted proxy writes: believe nothing
                // further left.
                return nearest;
            };
            if !self.contains(ip) {
                return ip;
            }
            nearest = ip;
        }
        nearest
    }
}

/// An address as a proxy writes it: bare, or with a port
/// (`192.0.2.1:4711`, `[2001:db8::1]:4711`).
fn parse_hop(text: &str) -> Option<IpAddr> {
    text.parse::<IpAddr>()
        .ok()
        .or_else(|| text.parse::<SocketAddr>().ok().map(|s| s.ip()))
        .map(canonical)
}

/// IPv4-mapped IPv6 addresses as IPv4, so that one client has one form.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    fn forwarded(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append("x-forwarded-for", HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn ipv6_clients_are_grouped_by_64() {
        let a = ClientKey::of(ip("2001:db8:1:2:aaaa::1"));
        let b = ClientKey::of(ip("2001:db8:1:2:ffff:ffff:ffff:ffff"));
        let c = ClientKey::of(ip("2001:db8:1:3::1"));
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_eq!(a.to_string(), "2001:db8:1:2::/64");
        assert_eq!(
            ClientKey::of(ip("::ffff:192.0.2.1")),
            ClientKey::of(ip("192.0.2.1"))
        );
        assert_ne!(
            ClientKey::of(ip("192.0.2.1")),
            ClientKey::of(ip("192.0.2.2"))
        );
    }

    #[test]
    fn forwarded_for_is_believed_only_from_trusted_proxies() {
        let none = TrustedProxies::default();
        let h = forwarded(&["198.51.100.9"]);
        assert_eq!(none.client(ip("203.0.113.5"), &h), ip("203.0.113.5"));
        let proxies = TrustedProxies::parse(&["10.0.0.0/8", "192.0.2.7"]).unwrap();
        // An untrusted peer's header is ignored.
        assert_eq!(proxies.client(ip("203.0.113.5"), &h), ip("203.0.113.5"));
        // A trusted peer: the rightmost untrusted hop; what the client
        // wrote further left is not believed.
        let h = forwarded(&["1.1.1.1, 198.51.100.9", "10.1.1.1"]);
        assert_eq!(proxies.client(ip("10.0.0.2"), &h), ip("198.51.100.9"));
        assert_eq!(proxies.client(ip("192.0.2.7"), &h), ip("198.51.100.9"));
        // Ports and IPv4-mapped forms.
        let h = forwarded(&["[2001:db8::5]:4711"]);
        assert_eq!(proxies.client(ip("::ffff:10.0.0.2"), &h), ip("2001:db8::5"));
        // No header, or garbage: the nearest trusted hop.
        assert_eq!(
            proxies.client(ip("10.0.0.2"), &HeaderMap::new()),
            ip("10.0.0.2")
        );
        let h = forwarded(&["198.51.100.9, bogus, 10.0.0.3"]);
        assert_eq!(proxies.client(ip("10.0.0.2"), &h), ip("10.0.0.3"));
    }

    #[test]
    fn bad_proxies_name_the_entry() {
        let e = TrustedProxies::parse(&["10.0.0.0/8", "10.0.0.0/40"]).unwrap_err();
        assert_eq!(e.field, "trusted_proxies");
        assert!(e.message.contains("[1]") && e.message.contains("10.0.0.0/40"));
        assert!(TrustedProxies::parse(&["::1", "fd00::/8"]).is_ok());
    }
}
