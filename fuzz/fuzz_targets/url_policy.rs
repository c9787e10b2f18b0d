//! The URL policy parses customers' URLs: it must never panic, and whatever
//! it accepts must be safe to send to: https (or, in development, http to a
//! loopback literal), no user info, an approved non-zero port, an allowed
//! address literal or a name outside the internal suffixes. Arbitrary bytes
//! also go through the address policy, which must agree with itself.
#![no_main]

use std::net::{IpAddr, Ipv6Addr};

use libfuzzer_sys::fuzz_target;
use walhook_pipeline::url_policy::{
    MAX_URL_BYTES, UrlPolicy, VettedHost, check_addr, check_ip, check_url,
};

fuzz_target!(|data: &[u8]| {
    if data.len() >= 16 {
        let bytes: [u8; 16] = data[..16].try_into().unwrap();
        let v6 = Ipv6Addr::from(bytes);
        let _ = check_ip(IpAddr::V6(v6));
        // A mapped or compatible form is never allowed, whatever it wraps.
        if v6.to_ipv4_mapped().is_some() {
            assert!(check_ip(IpAddr::V6(v6)).is_err());
        }
        let v4 = IpAddr::from([bytes[0], bytes[1], bytes[2], bytes[3]]);
        let _ = check_ip(v4);
    }
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for dev in [false, true] {
        let policy = UrlPolicy {
            allow_http_loopback: dev,
            ..UrlPolicy::default()
        };
        let Ok(vetted) = check_url(text, &policy) else {
            continue;
        };
        let url = &vetted.url;
        assert!(url.username().is_empty() && url.password().is_none());
        let port = url.port_or_known_default().unwrap_or(0);
        assert!(port != 0 && port == vetted.port);
        match vetted.host {
            VettedHost::Ip(ip) => {
                assert!(check_addr(ip, &policy).is_ok());
                if url.scheme() != "https" || port != 443 {
                    assert!(dev && ip.is_loopback());
                }
            }
            VettedHost::Name(name) => {
                assert_eq!(url.scheme(), "https");
                assert!(policy.allowed_ports.contains(&port));
                assert!(name.contains('.') && !name.split('.').any(str::is_empty));
                for suffix in [".localhost", ".local", ".internal"] {
                    assert!(!name.ends_with(suffix));
                }
                assert!(name != "localhost" && name != "metadata.goog");
            }
        }
        // What is sent parses again to the same URL (unless percent-encoding
        // made it longer than the length cap).
        if url.as_str().len() <= MAX_URL_BYTES {
            assert_eq!(
                check_url(url.as_str(), &policy).map(|v| v.url).as_ref(),
                Ok(url)
            );
        }
    }
});
