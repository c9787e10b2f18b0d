//! HTTP egress: signed requests to customers' endpoints, and the policy
//! that keeps them away from everything else (SSRF).
//!
//! ```text
//!  dispatch ──Outbound──▶ HttpEgress::send
//!                            ├─ url_policy::check_url  URL rules, address literals
//!                            ├─ resolve::vetted_addrs  every resolved address (rebinding-safe)
//!                            ├─ dial::guard_peer       the peer of every new connection
//!                            ├─ direct::Direct         HTTP/1.1, own pool per origin (no proxy)
//!                            └─ reqwest                the egress proxy path
//!                               both: no redirects, no env proxy, no decompression,
//!                               timeouts, ≤ 64 KiB of response read
//! ```
//!
//! - `walhook_pipeline::url_policy`: which URLs and addresses are allowed;
//!   pure code, shared with registration (the API) and `walhook check-url`.
//! - [`resolve`]: the resolver that returns vetted addresses only, and the
//!   lookups behind it (system DNS, a recording static table).
//! - [`dial`]: the check of each connection's peer (and reqwest's layer).
//! - [`direct`]: the HTTP/1.1 client of the hot path.
//! - [`observe`]: what tests record and production logs.
//! - [`config`]: the `[egress]` section.
//! - [`sink`]: [`HttpEgress`], the `Egress` implementation.

pub mod config;
pub mod dial;
pub mod direct;
pub mod observe;
pub mod resolve;
pub mod sink;

#[cfg(test)]
mod tests;

pub use config::{EgressSettings, ProxyUrl};
pub use observe::{EgressObserver, LogObserver};
pub use sink::{BuildError, EgressBuilder, HttpEgress};
