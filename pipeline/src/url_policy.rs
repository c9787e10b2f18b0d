//! The egress policy: which URLs and addresses walhook may send to.
//!
//! Customer URLs are an attack surface (SSRF). A URL is parsed once with the
//! WHATWG parser (`url`), which applies IDNA, lower-cases, decodes
//! percent-encoded hosts and reads IPv4 in every legacy form (decimal, octal,
//! hex, shortened); the re-serialised URL is what is sent. Then:
//!
//! - scheme `https` only; plain `http` only to loopback, and only when the
//!   development setting `allow_http_loopback` is on;
//! - no user name or password in the URL;
//! - an approved port (443 unless configured), never 0;
//! - host names compared after IDNA, lower-casing and stripping one trailing
//!   dot: `localhost`, `*.localhost`, `*.local`, `*.internal`,
//!   `metadata.goog` (and its subdomains), single-label names and names with
//!   an empty label are refused;
//! - every IP literal, and at connect time every resolved address
//!   ([`check_ip`]), must be a public unicast address: IPv4 outside the
//!   special-purpose ranges, IPv6 inside 2000::/3 and outside its
//!   special-purpose blocks. IPv4-mapped, -compatible, NAT64, 6to4 and Teredo
//!   forms are refused as they are, never unwrapped, so no embedded IPv4
//!   address is ever reached through them.
//!
//! In development (`allow_http_loopback`) loopback addresses pass
//! ([`check_addr`]), and plain http to a loopback address literal; nothing
//! else private ever does.
//!
//! Checked at registration for a helpful error and again at connect time
//! for safety (the resolver and the dial guard of walhook-connectors'
//! `http` module). The code is pure (no I/O), so the API validates with it
//! without linking the egress.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use url::{Host, Url};

/// What the policy allows beyond its fixed rules.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UrlPolicy {
    /// Ports endpoints may use with https.
    pub allowed_ports: Vec<u16>,
    /// Development only: `http://` to loopback addresses (tests, demo).
    pub allow_http_loopback: bool,
}

impl Default for UrlPolicy {
    fn default() -> Self {
        UrlPolicy {
            allowed_ports: vec![443],
            allow_http_loopback: false,
        }
    }
}

/// Why a URL or an address is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{detail}")]
pub struct Refusal {
    /// The class of refusal.
    pub reason: RefusalReason,
    /// A sentence with the value at fault and the fix.
    pub detail: String,
}

/// Classes of refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RefusalReason {
    /// Not a URL.
    Malformed,
    /// Not https (or http to loopback in development).
    Scheme,
    /// A user name or password in the URL.
    Userinfo,
    /// A port that is not approved.
    Port,
    /// A host name that names an internal service.
    HostName,
    /// An address that is not public unicast.
    Address,
}

impl RefusalReason {
    /// A short name for logs and API errors.
    pub fn as_str(self) -> &'static str {
        match self {
            RefusalReason::Malformed => "malformed",
            RefusalReason::Scheme => "scheme",
            RefusalReason::Userinfo => "userinfo",
            RefusalReason::Port => "port",
            RefusalReason::HostName => "host_name",
            RefusalReason::Address => "address",
        }
    }
}

fn refuse(reason: RefusalReason, detail: impl Into<String>) -> Refusal {
    Refusal {
        reason,
        detail: detail.into(),
    }
}

/// A URL that passed the policy (its addresses still need [`check_ip`] at
/// connect time, for host names).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VettedUrl {
    /// The re-serialised URL: what is sent.
    pub url: Url,
    /// The host as compared: a lower-case ASCII name without trailing dot,
    /// or an address.
    pub host: VettedHost,
    /// The port connected to.
    pub port: u16,
}

/// The host of a [`VettedUrl`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VettedHost {
    /// A name, to resolve.
    Name(String),
    /// An address literal (already checked).
    Ip(IpAddr),
}

const DENIED_NAMES: &[&str] = &["localhost", "metadata.goog"];
const DENIED_SUFFIXES: &[&str] = &[".localhost", ".local", ".internal", ".metadata.goog"];

/// URLs longer than this are refused: no customer needs more, and the URL is
/// stored with every endpoint version and shown in logs.
pub const MAX_URL_BYTES: usize = 2048;

/// At most this many characters of a refused input are quoted back.
const QUOTED_CHARS: usize = 120;

fn quoted(text: &str) -> String {
    let mut q: String = text.chars().take(QUOTED_CHARS).collect();
    if q.len() < text.len() {
        q.push('…');
    }
    format!("{q:?}")
}

/// Checks `text` against `policy`: the registration-time check, and the
/// first half of the connect-time check (the resolver does the rest).
pub fn check_url(text: &str, policy: &UrlPolicy) -> Result<VettedUrl, Refusal> {
    if text.len() > MAX_URL_BYTES {
        return Err(refuse(
            RefusalReason::Malformed,
            format!(
                "the URL is {} bytes long; at most {MAX_URL_BYTES} are allowed",
                text.len()
            ),
        ));
    }
    let url = Url::parse(text).map_err(|e| {
        refuse(
            RefusalReason::Malformed,
            format!(
                "{} is not a valid URL ({e}); write https://host/path",
                quoted(text)
            ),
        )
    })?;
    // The scheme first: for other schemes the rest of the URL may not even
    // have a host in the WHATWG sense.
    let http = match url.scheme() {
        "https" => false,
        "http" => true,
        other => {
            return Err(refuse(
                RefusalReason::Scheme,
                format!("scheme {other:?} is not allowed; use https"),
            ));
        }
    };
    if !url.username().is_empty() || url.password().is_some() {
        return Err(refuse(
            RefusalReason::Userinfo,
            "the URL carries a user name or password; remove it (walhook signs every request instead)",
        ));
    }
    let host = match url.host() {
        None => {
            return Err(refuse(
                RefusalReason::Malformed,
                format!("{} has no host", quoted(text)),
            ));
        }
        Some(Host::Ipv4(ip)) => VettedHost::Ip(IpAddr::V4(ip)),
        Some(Host::Ipv6(ip)) => VettedHost::Ip(IpAddr::V6(ip)),
        // The parser has applied IDNA (UTS #46: full-width forms, case,
        // ideographic full stops) and percent-decoding already.
        Some(Host::Domain(d)) => {
            VettedHost::Name(d.strip_suffix('.').unwrap_or(d).to_ascii_lowercase())
        }
    };
    // Development: plain http, on any port, to a loopback address literal.
    let loopback_dev =
        policy.allow_http_loopback && matches!(host, VettedHost::Ip(ip) if is_loopback(ip));
    if http && !loopback_dev {
        let hint = if policy.allow_http_loopback {
            "plain http is allowed only to a loopback address literal (127.0.0.1, [::1]) in development; use https"
        } else {
            "plain http is not allowed; use https"
        };
        return Err(refuse(RefusalReason::Scheme, hint));
    }
    let port = url.port_or_known_default().unwrap_or(0);
    if port == 0 {
        return Err(refuse(RefusalReason::Port, "port 0 is not a port; use 443"));
    }
    if !loopback_dev && !policy.allowed_ports.contains(&port) {
        return Err(refuse(
            RefusalReason::Port,
            format!(
                "port {port} is not allowed; allowed: {:?} (set [egress].allowed_ports)",
                policy.allowed_ports
            ),
        ));
    }
    match &host {
        VettedHost::Ip(ip) => check_addr(*ip, policy)?,
        VettedHost::Name(name) => check_name(name)?,
    }
    Ok(VettedUrl { url, host, port })
}

/// The host name rules, on a name already lower-cased, IDNA-mapped and
/// stripped of one trailing dot.
fn check_name(name: &str) -> Result<(), Refusal> {
    if name.is_empty() || name.split('.').any(str::is_empty) {
        return Err(refuse(
            RefusalReason::HostName,
            format!("{name:?} has an empty label; write a fully qualified public domain"),
        ));
    }
    if !name.contains('.') {
        return Err(refuse(
            RefusalReason::HostName,
            format!("{name:?} is a single-label name; use a fully qualified public domain"),
        ));
    }
    if DENIED_NAMES.contains(&name) || DENIED_SUFFIXES.iter().any(|s| name.ends_with(s)) {
        return Err(refuse(
            RefusalReason::HostName,
            format!("{name:?} names an internal or local service; use a public domain"),
        ));
    }
    Ok(())
}

fn is_loopback(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback(),
        IpAddr::V6(v6) => v6.is_loopback(),
    }
}

/// Checks one address under `policy`: [`check_ip`], except that in
/// development (`allow_http_loopback`) loopback addresses (127.0.0.0/8 and
/// `::1`, not their IPv4-mapped forms) are allowed. Nothing else private
/// ever is.
pub fn check_addr(ip: IpAddr, policy: &UrlPolicy) -> Result<(), Refusal> {
    if policy.allow_http_loopback && is_loopback(ip) {
        return Ok(());
    }
    check_ip(ip)
}

/// Denied IPv4 ranges: (network, prefix length, what it is).
const V4_DENIED: &[([u8; 4], u8, &str)] = &[
    ([0, 0, 0, 0], 8, "\"this network\" 0.0.0.0/8"),
    ([10, 0, 0, 0], 8, "private 10.0.0.0/8"),
    (
        [100, 64, 0, 0],
        10,
        "shared address space (CGNAT) 100.64.0.0/10",
    ),
    ([127, 0, 0, 0], 8, "loopback 127.0.0.0/8"),
    (
        [169, 254, 0, 0],
        16,
        "link-local (cloud metadata) 169.254.0.0/16",
    ),
    ([172, 16, 0, 0], 12, "private 172.16.0.0/12"),
    ([192, 0, 0, 0], 24, "IETF protocol assignments 192.0.0.0/24"),
    ([192, 0, 2, 0], 24, "documentation 192.0.2.0/24"),
    ([192, 88, 99, 0], 24, "6to4 relay anycast 192.88.99.0/24"),
    ([192, 168, 0, 0], 16, "private 192.168.0.0/16"),
    ([198, 18, 0, 0], 15, "benchmarking 198.18.0.0/15"),
    ([198, 51, 100, 0], 24, "documentation 198.51.100.0/24"),
    ([203, 0, 113, 0], 24, "documentation 203.0.113.0/24"),
    ([224, 0, 0, 0], 4, "multicast 224.0.0.0/4"),
    ([240, 0, 0, 0], 4, "reserved 240.0.0.0/4"),
    ([255, 255, 255, 255], 32, "broadcast 255.255.255.255"),
];

/// Denied ranges inside the one allowed IPv6 range, 2000::/3.
const V6_DENIED: &[(u128, u8, &str)] = &[
    (
        0x2001_0000 << 96,
        23,
        "IETF protocol assignments (Teredo, ORCHID, …) 2001::/23",
    ),
    (0x2001_0db8 << 96, 32, "documentation 2001:db8::/32"),
    (0x2002 << 112, 16, "6to4 2002::/16"),
    (0x3fff << 112, 20, "documentation 3fff::/20"),
];

fn in_v4(ip: Ipv4Addr, net: [u8; 4], len: u8) -> bool {
    let mask = if len == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(len))
    };
    u32::from(ip) & mask == u32::from(Ipv4Addr::from(net)) & mask
}

fn in_v6(ip: Ipv6Addr, net: u128, len: u8) -> bool {
    let mask = if len == 0 {
        0
    } else {
        u128::MAX << (128 - u32::from(len))
    };
    u128::from(ip) & mask == net & mask
}

/// Checks one address: public unicast only. IPv4-mapped and -compatible
/// IPv6 forms, NAT64 and every other range outside 2000::/3 are refused as
/// they are, never unwrapped.
pub fn check_ip(ip: IpAddr) -> Result<(), Refusal> {
    let denied = |what: &str| {
        refuse(
            RefusalReason::Address,
            format!(
                "{ip} is {what}, not a public address; endpoints must resolve only to public addresses"
            ),
        )
    };
    match ip {
        IpAddr::V4(v4) => {
            if let Some((_, _, what)) = V4_DENIED.iter().find(|(net, len, _)| in_v4(v4, *net, *len))
            {
                return Err(denied(what));
            }
        }
        IpAddr::V6(v6) => {
            if !in_v6(v6, 0x2000 << 112, 3) {
                let what = if v6.is_loopback() {
                    "loopback ::1"
                } else if v6.is_unspecified() {
                    "unspecified ::"
                } else if in_v6(v6, 0xffff << 32, 96) {
                    "IPv4-mapped ::ffff:0:0/96"
                } else if in_v6(v6, 0, 96) {
                    "IPv4-compatible ::/96"
                } else if in_v6(v6, 0x0064_ff9b << 96, 32) {
                    "NAT64 64:ff9b::/32"
                } else if in_v6(v6, 0xfc00 << 112, 7) {
                    "unique local fc00::/7"
                } else if in_v6(v6, 0xfe80 << 112, 10) {
                    "link-local fe80::/10"
                } else if in_v6(v6, 0xfec0 << 112, 10) {
                    "site-local fec0::/10"
                } else if in_v6(v6, 0xff00 << 112, 8) {
                    "multicast ff00::/8"
                } else {
                    "outside global unicast 2000::/3"
                };
                return Err(denied(what));
            }
            if let Some((_, _, what)) = V6_DENIED.iter().find(|(net, len, _)| in_v6(v6, *net, *len))
            {
                return Err(denied(what));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(url: &str) -> RefusalReason {
        match check_url(url, &UrlPolicy::default()) {
            Ok(v) => panic!("{url} was accepted as {}", v.url),
            Err(r) => r.reason,
        }
    }

    #[test]
    fn public_https_urls_pass_and_are_reserialised() {
        let v = check_url("HTTPS://Example.COM./hooks?a=1", &UrlPolicy::default()).unwrap();
        assert_eq!(v.url.as_str(), "https://example.com./hooks?a=1");
        assert_eq!(v.host, VettedHost::Name("example.com".into()));
        let v = check_url("https://93.184.216.34/x", &UrlPolicy::default()).unwrap();
        assert_eq!(v.host, VettedHost::Ip("93.184.216.34".parse().unwrap()));
        check_url("https://[2606:4700::1111]/", &UrlPolicy::default()).unwrap();
    }

    #[test]
    fn every_rule_refuses_with_its_reason() {
        assert_eq!(refused("http://example.com/"), RefusalReason::Scheme);
        assert_eq!(refused("ftp://example.com/"), RefusalReason::Scheme);
        assert_eq!(
            refused("https://user:pw@example.com/"),
            RefusalReason::Userinfo
        );
        assert_eq!(refused("https://example.com:8443/"), RefusalReason::Port);
        assert_eq!(refused("https://example.com:0/"), RefusalReason::Port);
        assert_eq!(refused("https://localhost/"), RefusalReason::HostName);
        assert_eq!(refused("https://api.internal/"), RefusalReason::HostName);
        assert_eq!(refused("https://printer/"), RefusalReason::HostName);
        assert_eq!(refused("https://0x7f.1/"), RefusalReason::Address);
        assert_eq!(refused("https://2130706433/"), RefusalReason::Address);
        assert_eq!(
            refused("https://[::ffff:127.0.0.1]/"),
            RefusalReason::Address
        );
        assert_eq!(
            refused("https://[64:ff9b::a9fe:a9fe]/"),
            RefusalReason::Address
        );
        assert_eq!(refused("https://[2002:7f00:1::]/"), RefusalReason::Address);
        assert_eq!(refused("https://[fd00:ec2::254]/"), RefusalReason::Address);
        assert_eq!(refused("not a url"), RefusalReason::Malformed);
        assert_eq!(refused("https://localhost../"), RefusalReason::HostName);
        assert_eq!(refused("https://a..example.com/"), RefusalReason::HostName);
        assert_eq!(refused("https://x.metadata.goog/"), RefusalReason::HostName);
        assert_eq!(
            refused("ftp://user:pw@10.0.0.1/"),
            RefusalReason::Scheme,
            "the scheme is reported first"
        );
        let long = format!("https://example.com/{}", "a".repeat(MAX_URL_BYTES));
        assert_eq!(refused(&long), RefusalReason::Malformed);
    }

    #[test]
    fn refusals_quote_at_most_a_little_of_the_input() {
        let junk = "x".repeat(1000);
        let r = check_url(&junk, &UrlPolicy::default()).unwrap_err();
        assert!(r.detail.len() < 400, "{}", r.detail);
    }

    #[test]
    fn development_allows_loopback_addresses_and_nothing_else_private() {
        let dev = UrlPolicy {
            allow_http_loopback: true,
            ..UrlPolicy::default()
        };
        for ok in ["127.0.0.1", "127.255.0.9", "::1"] {
            check_addr(ok.parse().unwrap(), &dev).unwrap();
            assert!(check_addr(ok.parse().unwrap(), &UrlPolicy::default()).is_err());
        }
        for denied in [
            "::ffff:127.0.0.1",
            "10.0.0.1",
            "169.254.169.254",
            "fd00::1",
            "0.0.0.0",
        ] {
            assert!(
                check_addr(denied.parse().unwrap(), &dev).is_err(),
                "{denied}"
            );
        }
    }

    #[test]
    fn loopback_http_only_in_development() {
        let dev = UrlPolicy {
            allow_http_loopback: true,
            ..UrlPolicy::default()
        };
        check_url("http://127.0.0.1:8080/hook", &dev).unwrap();
        check_url("http://[::1]:8080/hook", &dev).unwrap();
        assert!(check_url("http://10.0.0.1:8080/hook", &dev).is_err());
        assert!(check_url("http://localhost:8080/hook", &dev).is_err());
        assert!(check_url("http://127.0.0.1:8080/hook", &UrlPolicy::default()).is_err());
    }
}
