//! The dial guard: a connector layer that checks the peer of every new
//! connection before a request is written on it.
//!
//! ```text
//!  hyper pool ──miss──▶ DialGuard ──▶ reqwest connector (resolver → TCP → TLS)
//!                          │ peer address of the new connection
//!                          ▼
//!                     check_addr ── refused ──▶ connection dropped, request blocked
//!                          │ allowed
//!                          ▼
//!                     EgressObserver::connected
//! ```
//!
//! The resolver already hands out vetted addresses only; this is the second
//! wall, on the address actually connected to, so that no other path (an
//! address literal the URL check let through by mistake, a future reqwest
//! change in how names are resolved) can reach a refused address and send
//! it a request. With an egress proxy configured, the proxy is the peer and
//! is trusted.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper_util::client::legacy::connect::{Connection, HttpInfo};

use super::observe::EgressObserver;
use super::resolve::TrustedProxy;
use walhook_pipeline::url_policy::{Refusal, RefusalReason, UrlPolicy, check_addr};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The layer to give `ClientBuilder::connector_layer`.
#[derive(Clone)]
pub struct DialGuardLayer {
    policy: UrlPolicy,
    observer: Arc<dyn EgressObserver>,
    proxy: Arc<TrustedProxy>,
}

impl DialGuardLayer {
    /// A guard applying `policy` to every peer (except the trusted proxy).
    pub fn new(
        policy: UrlPolicy,
        observer: Arc<dyn EgressObserver>,
        proxy: Arc<TrustedProxy>,
    ) -> Self {
        DialGuardLayer {
            policy,
            observer,
            proxy,
        }
    }
}

impl<S> tower_layer::Layer<S> for DialGuardLayer {
    type Service = DialGuard<S>;

    fn layer(&self, inner: S) -> DialGuard<S> {
        DialGuard {
            inner,
            layer: self.clone(),
        }
    }
}

/// The guarded connector service.
#[derive(Clone)]
pub struct DialGuard<S> {
    inner: S,
    layer: DialGuardLayer,
}

/// The peer of a connection, as the TCP connector recorded it.
fn peer_of<C: Connection>(conn: &C) -> Option<SocketAddr> {
    let mut extensions = http::Extensions::new();
    conn.connected().get_extras(&mut extensions);
    extensions.get::<HttpInfo>().map(HttpInfo::remote_addr)
}

impl<S, R> tower_service::Service<R> for DialGuard<S>
where
    S: tower_service::Service<R, Error = BoxError>,
    S::Response: Connection + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> Self::Future {
        let connecting = self.inner.call(request);
        let layer = self.layer.clone();
        Box::pin(async move {
            let conn = connecting.await?;
            let Some(peer) = peer_of(&conn) else {
                // Fail closed: a connection whose peer is unknown is not used.
                return Err(Box::new(Refusal {
                    reason: RefusalReason::Address,
                    detail: "the connection's peer address is unknown".into(),
                }) as BoxError);
            };
            if !layer.proxy.is_proxy_addr(peer.ip()) {
                guard_peer(peer, &layer.policy, &*layer.observer)
                    .map_err(|refusal| Box::new(refusal) as BoxError)?;
            } else {
                layer.observer.connected(peer);
            }
            Ok(conn)
        })
    }
}

/// The second wall, on the address actually connected to: `peer` must pass
/// `policy` (logged as an error when it does not: the resolver should have
/// refused it), and the observer hears of the connection. Both HTTP paths
/// check every new connection with this.
pub fn guard_peer(
    peer: SocketAddr,
    policy: &UrlPolicy,
    observer: &dyn EgressObserver,
) -> Result<(), Refusal> {
    if let Err(refusal) = check_addr(peer.ip(), policy) {
        tracing::error!(
            %peer,
            detail = %refusal.detail,
            "egress connected to a refused address; dropping the connection"
        );
        return Err(refusal);
    }
    observer.connected(peer);
    Ok(())
}
