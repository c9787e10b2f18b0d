//! Property: any URL the policy accepts is https (or, in development, http
//! to a loopback literal), has no user info, a non-zero approved port, and
//! resolves only to allowed addresses.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use proptest::prelude::*;

use crate::http::resolve::{StaticLookup, resolve};
use walhook_pipeline::url_policy::{UrlPolicy, VettedHost, check_addr, check_ip, check_url};

/// Addresses biased towards the interesting ranges.
fn ip() -> impl Strategy<Value = IpAddr> {
    let v4_nets: Vec<[u8; 2]> = vec![
        [0, 0],
        [10, 0],
        [100, 64],
        [127, 0],
        [169, 254],
        [172, 16],
        [192, 0],
        [192, 88],
        [192, 168],
        [198, 18],
        [198, 51],
        [203, 0],
        [224, 0],
        [240, 0],
        [255, 255],
        [93, 184],
        [8, 8],
    ];
    let v6_prefixes: Vec<u16> = vec![
        0, 0x64, 0x100, 0x2001, 0x2002, 0x2400, 0x2606, 0x3fff, 0x4000, 0xfc00, 0xfd00, 0xfe80,
        0xfec0, 0xff02,
    ];
    prop_oneof![
        any::<u32>().prop_map(|n| IpAddr::V4(Ipv4Addr::from(n))),
        (proptest::sample::select(v4_nets), any::<[u8; 2]>())
            .prop_map(|(n, h)| IpAddr::V4(Ipv4Addr::new(n[0], n[1], h[0], h[1]))),
        any::<u128>().prop_map(|n| IpAddr::V6(Ipv6Addr::from(n))),
        (
            proptest::sample::select(v6_prefixes),
            any::<u16>(),
            any::<u64>()
        )
            .prop_map(|(p, q, r)| IpAddr::V6(Ipv6Addr::from(
                (u128::from(p) << 112) | (u128::from(q) << 96) | u128::from(r)
            ))),
        any::<u32>().prop_map(|n| IpAddr::V6(Ipv4Addr::from(n).to_ipv6_mapped())),
    ]
}

/// A host as written in a URL, in many notations.
fn host() -> impl Strategy<Value = String> {
    let label = proptest::string::string_regex("[a-zA-Z0-9ｌＯ-]{1,8}").unwrap();
    let suffix = proptest::sample::select(vec![
        "",
        ".",
        ".com",
        ".example.com",
        ".example.com.",
        ".local",
        ".internal",
        ".localhost",
        ".metadata.goog",
        "。com",
        ".ｃｏｍ",
    ]);
    prop_oneof![
        4 => ip().prop_map(|ip| match ip {
            IpAddr::V4(v4) => v4.to_string(),
            IpAddr::V6(v6) => format!("[{v6}]"),
        }),
        1 => any::<u32>().prop_map(|n| n.to_string()),
        1 => any::<u32>().prop_map(|n| format!("0x{n:x}")),
        1 => any::<u32>().prop_map(|n| format!("0{n:o}")),
        1 => (any::<u8>(), any::<u32>()).prop_map(|(a, b)| format!("{a}.{}", b & 0xff_ffff)),
        4 => (proptest::collection::vec(label, 1..4), suffix).prop_map(|(l, s)| l.join(".") + s),
        1 => proptest::string::string_regex("[a-z0-9%.:@\\[\\]\\\\]{1,20}").unwrap(),
    ]
}

fn url() -> impl Strategy<Value = String> {
    // Weighted towards what passes, so that the property is exercised.
    let scheme = prop_oneof![
        8 => Just("https"),
        2 => Just("http"),
        1 => proptest::sample::select(vec!["HTTPS", "ftp", "https:", "ws", "file"]),
    ];
    let userinfo = prop_oneof![
        8 => Just(""),
        1 => proptest::sample::select(vec!["u@", "u:p@", ":p@", "@", "%40@"]),
    ];
    let port = prop_oneof![
        6 => Just(String::new()),
        2 => Just(":443".to_owned()),
        1 => Just(":0".to_owned()),
        1 => any::<u16>().prop_map(|p| format!(":{p}")),
    ];
    let path = proptest::string::string_regex("(/[a-z0-9?#=&@.%\\\\]{0,12}){0,3}").unwrap();
    (scheme, userinfo, host(), port, path)
        .prop_map(|(s, u, h, p, path)| format!("{s}://{u}{h}{p}{path}"))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn accepted_urls_are_safe(
        text in url(),
        answers in proptest::collection::vec(ip(), 0..4),
        dev in any::<bool>(),
    ) {
        let policy = UrlPolicy { allow_http_loopback: dev, ..UrlPolicy::default() };
        if let Ok(vetted) = check_url(&text, &policy) {
            let u = &vetted.url;
            prop_assert!(u.username().is_empty() && u.password().is_none(), "{text} → {u}");
            let port = u.port_or_known_default().unwrap();
            prop_assert!(port != 0 && port == vetted.port);
            match vetted.host {
                VettedHost::Ip(ip) => {
                    prop_assert!(check_addr(ip, &policy).is_ok());
                    if u.scheme() == "http" || port != 443 {
                        prop_assert!(dev && ip.is_loopback(), "{text} → {u}");
                    } else {
                        prop_assert_eq!(u.scheme(), "https");
                    }
                    if !dev {
                        prop_assert!(check_ip(ip).is_ok());
                    }
                }
                VettedHost::Name(name) => {
                    prop_assert_eq!(u.scheme(), "https", "{} → {}", text, u);
                    prop_assert_eq!(port, 443);
                    prop_assert!(name.contains('.') && !name.ends_with(".local"));
                    // Whatever the name resolves to, what is handed to the
                    // connector is allowed.
                    let table = StaticLookup::new();
                    table.set(&name, answers.clone());
                    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
                    let resolution = rt.block_on(resolve(&table, &name, &policy)).unwrap();
                    match resolution.verdict() {
                        Ok(addrs) => {
                            prop_assert!(!addrs.is_empty());
                            for a in addrs {
                                prop_assert!(check_addr(a, &policy).is_ok());
                                prop_assert!(check_ip(a).is_ok() || (dev && a.is_loopback()));
                            }
                        }
                        Err(_) => prop_assert!(
                            answers.is_empty() || answers.iter().any(|a| check_addr(*a, &policy).is_err())
                        ),
                    }
                }
            }
        }
    }

    #[test]
    fn check_url_never_panics(text in "\\PC{0,64}") {
        let _ = check_url(&text, &UrlPolicy::default());
    }
}

#[test]
fn the_generator_reaches_accepted_urls() {
    // Guards the property above against a generator that only makes junk.
    use proptest::strategy::ValueTree;
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let (mut names, mut ips) = (0, 0);
    for _ in 0..2000 {
        let text = url().new_tree(&mut runner).unwrap().current();
        let dev = UrlPolicy {
            allow_http_loopback: true,
            ..UrlPolicy::default()
        };
        match check_url(&text, &dev).map(|v| v.host) {
            Ok(VettedHost::Name(_)) => names += 1,
            Ok(VettedHost::Ip(_)) => ips += 1,
            Err(_) => {}
        }
    }
    assert!(names > 100 && ips > 100, "names {names}, addresses {ips}");
}
