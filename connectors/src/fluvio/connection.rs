//! The connection to the cluster and how it heals: one client shared by
//! new producers and consumers, replaced by a new connection when an
//! operation on it failed (a broker restart leaves the old one's sockets
//! dead), and operations tried again on new connections.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fluvio::{Fluvio, FluvioClusterConfig};
use walhook_pipeline::log::LogError;

use super::committer::Committer;
use super::{FluvioSettings, Inner, broken, tls};

/// Runs one try of a cluster operation within [`Committer::TRY_TIMEOUT`];
/// its error, or the timeout, as text.
pub(super) async fn within<T, E: std::fmt::Display>(
    op: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, String> {
    match tokio::time::timeout(Committer::TRY_TIMEOUT, op).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(format!("{e:#}")),
        Err(_) => Err(format!("no answer within {:?}", Committer::TRY_TIMEOUT)),
    }
}

impl Inner {
    /// The client for new producers and consumers.
    pub(super) fn client(&self) -> Arc<Fluvio> {
        self.client.lock().clone()
    }

    /// A new connection in place of `failed` (one that an operation failed
    /// on), unless another caller replaced it already: then that one.
    pub(super) async fn reconnect(&self, failed: &Arc<Fluvio>) -> Result<Arc<Fluvio>, LogError> {
        {
            let current = self.client.lock();
            if !Arc::ptr_eq(&current, failed) {
                return Ok(current.clone());
            }
        }
        let fresh = match within(open_client(&self.settings)).await {
            Ok(client) => Arc::new(client),
            Err(error) => {
                self.health.op(Err(&error));
                return Err(broken(error));
            }
        };
        let mut current = self.client.lock();
        if Arc::ptr_eq(&current, failed) {
            *current = fresh.clone();
            Ok(fresh)
        } else {
            Ok(current.clone())
        }
    }
}

/// What a failure to connect without TLS may mean.
pub(super) fn tls_hint(settings: &FluvioSettings) -> &'static str {
    if settings.tls.is_none() {
        " (a cluster that speaks TLS needs [log.tls])"
    } else {
        ""
    }
}

/// A new client of the cluster, over TLS when the settings ask for it.
/// The error names the cluster and, for a TLS failure, the setting to
/// change.
pub(super) async fn open_client(settings: &FluvioSettings) -> Result<Fluvio, String> {
    let connector = tls::connector(settings.tls.as_ref())
        .map_err(|e| format!("cannot connect to Fluvio at {}: {e:#}", settings.endpoint))?;
    let config = FluvioClusterConfig::new(settings.endpoint.clone());
    Fluvio::connect_with_connector(connector, &config)
        .await
        .map_err(|e| {
            let why = settings
                .tls
                .as_ref()
                .and_then(|t| tls::explain(&e, t))
                .unwrap_or_else(|| {
                    format!(
                        "{e:#}; check [log] endpoint and that the cluster's SC listens there{}",
                        tls_hint(settings)
                    )
                });
            format!("cannot connect to Fluvio at {}: {why}", settings.endpoint)
        })
}

/// Runs `op` on `client`, and again on a new connection after each
/// failure, pausing longer each time, until it succeeds or `deadline`
/// passes (`None`: until it succeeds; the log's health watch stops the
/// process if the cluster stays away). `what` says what it does, for the
/// log and the error.
pub(super) async fn on_new_connections<T, Fut>(
    inner: &Inner,
    mut client: Arc<Fluvio>,
    what: &str,
    deadline: Option<Instant>,
    mut op: impl FnMut(Arc<Fluvio>) -> Fut,
) -> Result<(Arc<Fluvio>, T), LogError>
where
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let mut pause = Duration::from_millis(100);
    loop {
        let error = match op(client.clone()).await {
            Ok(done) => return Ok((client, done)),
            Err(error) => error,
        };
        inner.health.op(Err(&error));
        if deadline.is_some_and(|d| Instant::now() + pause > d) {
            return Err(broken(format!(
                "could not {what} on the Fluvio cluster at {} within [log] give_up_after = {:?}: {error}",
                inner.settings.endpoint, inner.settings.give_up_after
            )));
        }
        tracing::warn!(%error, retry_in = ?pause, "could not {what} on the Fluvio cluster; retrying on a new connection");
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(5));
        if let Ok(fresh) = inner.reconnect(&client).await {
            client = fresh;
        }
    }
}
