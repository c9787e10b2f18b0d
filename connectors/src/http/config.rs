//! `[egress]`: timeouts, the response cap, the connection pool, the URL
//! policy's ports, an optional egress proxy and the development switch.

use std::time::Duration;

use walhook_pipeline::url_policy::UrlPolicy;

/// The most response bytes ever read (and digested) per attempt.
pub const MAX_RESPONSE_BYTES: usize = 64 * 1024;

/// The default ports endpoints may use.
pub const DEFAULT_PORTS: &[u16] = &[443];

/// Egress settings.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EgressSettings {
    /// Time to establish a connection (name resolution, TCP and TLS).
    #[serde(with = "walhook_pipeline::duration")]
    pub connect_timeout: Duration,
    /// Time for the whole request, response headers and the body read.
    #[serde(with = "walhook_pipeline::duration")]
    pub request_timeout: Duration,
    /// Response bytes read at most (the rest is ignored); at most 64 KiB.
    pub max_response_bytes: usize,
    /// Idle connections kept per host. Keep it at least at the attempts one
    /// host sees in flight at once (several endpoints of one receiver
    /// share a host): a connection returned to a full pool is closed, and
    /// the next attempt pays a new TCP and TLS handshake.
    pub pool_idle_per_host: usize,
    /// Ports endpoints may use with https (443 by default; never 0).
    pub allowed_ports: Vec<u16>,
    /// An explicit egress proxy (`http://host:port`), for example an
    /// SSRF-filtering proxy such as Smokescreen. Proxies from the
    /// environment (`HTTPS_PROXY`, …) are never used. With a proxy, the
    /// proxy resolves endpoint names, so it must enforce the address policy
    /// itself; walhook still applies the URL policy.
    pub proxy: Option<ProxyUrl>,
    /// Development only: allow `http://` to loopback address literals, and
    /// loopback addresses for any endpoint. walhook logs a warning at start
    /// when it is on; never set it in production.
    pub allow_http_loopback: bool,
}

impl Default for EgressSettings {
    fn default() -> Self {
        EgressSettings {
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(15),
            max_response_bytes: MAX_RESPONSE_BYTES,
            pool_idle_per_host: 256,
            allowed_ports: DEFAULT_PORTS.to_vec(),
            proxy: None,
            allow_http_loopback: false,
        }
    }
}

impl EgressSettings {
    /// The URL and address policy these settings describe.
    pub fn url_policy(&self) -> UrlPolicy {
        UrlPolicy {
            allowed_ports: self.allowed_ports.clone(),
            allow_http_loopback: self.allow_http_loopback,
        }
    }

    /// Checks the values; the error names the field and the constraint.
    pub fn validate(&self) -> Result<(), String> {
        if self.allowed_ports.is_empty() {
            return Err("[egress].allowed_ports is empty: list at least 443".into());
        }
        if self.allowed_ports.contains(&0) {
            return Err("[egress].allowed_ports contains 0, which is not a port".into());
        }
        if self.max_response_bytes > MAX_RESPONSE_BYTES {
            return Err(format!(
                "[egress].max_response_bytes = {} is above the cap of {MAX_RESPONSE_BYTES}",
                self.max_response_bytes
            ));
        }
        if self.connect_timeout.is_zero() || self.request_timeout.is_zero() {
            return Err("[egress] connect_timeout and request_timeout must be above 0".into());
        }
        if let Some(p) = &self.proxy {
            p.parsed()?;
        }
        Ok(())
    }
}

/// The proxy URL. It may carry credentials, so `Debug` hides them.
#[derive(Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(transparent)]
pub struct ProxyUrl(pub String);

impl ProxyUrl {
    /// The parsed URL, or why it is unusable.
    pub fn parsed(&self) -> Result<url::Url, String> {
        let url = url::Url::parse(&self.0).map_err(|e| {
            format!("[egress].proxy is not a URL ({e}); write http://proxy.example.net:4750")
        })?;
        if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
            return Err("[egress].proxy must be an http:// or https:// URL with a host".into());
        }
        Ok(url)
    }
}

impl std::fmt::Debug for ProxyUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match url::Url::parse(&self.0) {
            Ok(mut u) => {
                if u.password().is_some() {
                    let _ = u.set_password(Some("***"));
                }
                write!(f, "ProxyUrl({:?})", u.as_str())
            }
            Err(_) => f.write_str("ProxyUrl(<invalid>)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bad_values_are_named() {
        EgressSettings::default().validate().unwrap();
        let bad = |f: fn(&mut EgressSettings)| {
            let mut s = EgressSettings::default();
            f(&mut s);
            s.validate().unwrap_err()
        };
        assert!(bad(|s| s.allowed_ports = vec![]).contains("allowed_ports"));
        assert!(bad(|s| s.allowed_ports = vec![443, 0]).contains("allowed_ports"));
        assert!(bad(|s| s.max_response_bytes = 1 << 20).contains("max_response_bytes"));
        assert!(bad(|s| s.proxy = Some(ProxyUrl("socks5://p:1".into()))).contains("proxy"));
    }

    #[test]
    fn proxy_credentials_never_print() {
        let p = ProxyUrl("http://user:hunter2@proxy.example.net:4750".into());
        let s = EgressSettings {
            proxy: Some(p),
            ..EgressSettings::default()
        };
        let shown = format!("{s:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("proxy.example.net"), "{shown}");
    }
}
