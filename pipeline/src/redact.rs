//! Values that must never be printed: tokens, keys, database passwords.
//!
//! [`Redacted`] holds a secret whose `Debug` and `Display` print `***`, so a
//! config dumped with `{:?}`, a struct logged at `debug`, or an error that
//! quotes its input cannot leak it. It deserializes from a plain value, so
//! config files stay as they are; the secret comes out only through an
//! `expose` call, which is easy to find in review (a database password:
//! `walhook_pgtls::DatabaseUrl`).
//! [`url_without_secrets`] is an endpoint URL as shown to anyone but its
//! tenant (the operator's audit records, `endpoint.disabled` events).

use std::fmt;

/// A secret value; prints as `***`.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Redacted<T>(T);

impl<T> Redacted<T> {
    /// Wraps `value`.
    pub fn new(value: T) -> Self {
        Redacted(value)
    }

    /// The secret itself.
    pub fn expose(&self) -> &T {
        &self.0
    }

    /// The secret, unwrapped.
    pub fn into_inner(self) -> T {
        self.0
    }
}

impl<T> fmt::Debug for Redacted<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl<T> fmt::Display for Redacted<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl<T> From<T> for Redacted<T> {
    fn from(value: T) -> Self {
        Redacted(value)
    }
}

impl<'de, T: serde::Deserialize<'de>> serde::Deserialize<'de> for Redacted<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        T::deserialize(d).map(Redacted)
    }
}

/// `url` without the parts where credentials live: its user info, query
/// string and fragment (`https://u:p@h:8443/hook?token=…#x` becomes
/// `https://h:8443/hook`). Endpoint URLs often carry a receiver's token in
/// their query; the tenant sees its URL in full through the API, everyone
/// else (the operator reading audit records, the receivers of
/// `endpoint.disabled` events) sees this.
///
/// The authority is cut as WHATWG URL parsing cuts it (it ends at the first
/// `/`, `\`, `?` or `#`; the user info is everything up to its last `@`),
/// which is how every stored endpoint URL was parsed when it was accepted.
/// Never panics, for any input.
pub fn url_without_secrets(url: &str) -> String {
    let scheme_len = url
        .find(':')
        .filter(|&i| {
            i > 0
                && url[..i]
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
        })
        .map_or(0, |i| i + 1);
    let (scheme, rest) = url.split_at(scheme_len);
    let slashes = rest.len() - rest.trim_start_matches(['/', '\\']).len();
    let (slashes, rest) = rest.split_at(slashes);
    let authority_end = rest.find(['/', '\\', '?', '#']).unwrap_or(rest.len());
    let (authority, rest) = rest.split_at(authority_end);
    let host = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    let path = &rest[..rest.find(['?', '#']).unwrap_or(rest.len())];
    format!("{scheme}{slashes}{host}{path}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacted_values_never_print() {
        let token: Redacted<String> = Redacted::new("s3cr3t-token".into());
        assert_eq!(format!("{token:?} {token}"), "*** ***");
        assert_eq!(token.expose(), "s3cr3t-token");
        #[derive(Debug, serde::Deserialize)]
        struct Cfg {
            #[allow(dead_code)]
            token: Redacted<String>,
        }
        let cfg: Cfg = serde_json::from_str(r#"{"token":"s3cr3t-token"}"#).unwrap();
        assert!(!format!("{cfg:?}").contains("s3cr3t"));
    }

    #[test]
    fn endpoint_urls_lose_their_query_and_user_info() {
        for (url, shown) in [
            (
                "https://hooks.example.com/in?token=s3cr3t",
                "https://hooks.example.com/in",
            ),
            (
                "https://u:s3cr3t@hooks.example.com:8443/a/b?x=1#s3cr3t",
                "https://hooks.example.com:8443/a/b",
            ),
            (
                "https://hooks.example.com?token=s3cr3t",
                "https://hooks.example.com",
            ),
            (
                "https://hooks.example.com#s3cr3t",
                "https://hooks.example.com",
            ),
            ("http://127.0.0.1:9/hook", "http://127.0.0.1:9/hook"),
            (
                "https://a@b@hooks.example.com/",
                "https://hooks.example.com/",
            ),
            ("https://[::1]:8443/p?q", "https://[::1]:8443/p"),
            ("", ""),
            ("?s3cr3t", ""),
            ("not a url?s3cr3t", "not a url"),
        ] {
            let got = url_without_secrets(url);
            assert_eq!(got, shown, "{url}");
            assert!(!got.contains("s3cr3t"), "{url}");
        }
    }

    proptest::proptest! {
        /// For URLs as the url crate (WHATWG) parses them, the result is
        /// that parse with user info, query and fragment cleared; for any
        /// input, no panic and nothing after a `?`.
        #[test]
        fn urls_are_cut_as_whatwg_parses_them(
            user in proptest::option::of("[a-zA-Z0-9%._~-]{1,8}(:[a-zA-Z0-9%._~!$&'()*+,;=-]{0,8})?"),
            host in "[a-z][a-z0-9]{0,10}(\\.[a-z]{2,5}){0,2}",
            port in proptest::option::of(1024u16..65535),
            path in "(/[a-zA-Z0-9_~%!$&'()*+,;=:@-]{0,8}){1,4}",
            query in proptest::option::of("[a-zA-Z0-9=&._~%/?:@-]{0,16}"),
            fragment in proptest::option::of("[a-zA-Z0-9=&._~%/?:@#-]{0,16}"),
            noise in ".{0,40}",
        ) {
            let mut text = String::from("https://");
            if let Some(u) = &user {
                text.push_str(u);
                text.push('@');
            }
            text.push_str(&host);
            if let Some(p) = port {
                text.push_str(&format!(":{p}"));
            }
            text.push_str(&path);
            if let Some(q) = &query {
                text.push('?');
                text.push_str(q);
            }
            if let Some(f) = &fragment {
                text.push('#');
                text.push_str(f);
            }
            let mut parsed = url::Url::parse(&text).unwrap();
            parsed.set_username("").unwrap();
            parsed.set_password(None).unwrap();
            parsed.set_query(None);
            parsed.set_fragment(None);
            proptest::prop_assert_eq!(url_without_secrets(&text), parsed.as_str());
            let any = url_without_secrets(&noise);
            proptest::prop_assert!(!any.contains('?') && !any.contains('#'));
        }
    }
}
