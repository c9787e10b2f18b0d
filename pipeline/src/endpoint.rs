//! Endpoints and the subscription directory fan-out and dispatch read.
//!
//! The directory is an immutable snapshot swapped as a whole: readers take an
//! `Arc` and never wait. A refresh task polls the platform's config epoch
//! (bumped by a trigger on every endpoint, secret or tenant change) and
//! reloads when it moves, so a change is seen within one poll interval.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use tokio_util::sync::CancellationToken;

use crate::event::EventType;
use crate::ids::{EndpointId, TenantId};
use crate::signing::SigningSecret;
use crate::store::StoreError;

/// An endpoint's current configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct EndpointConfig {
    /// Its id.
    pub id: EndpointId,
    /// Its tenant.
    pub tenant_id: TenantId,
    /// Where deliveries go.
    pub url: String,
    /// Subscribed types; empty means every type.
    pub event_types: Vec<EventType>,
    /// Disabled endpoints get no new deliveries and send nothing.
    pub enabled: bool,
    /// The configuration version; deliveries record it.
    pub config_version: i32,
    /// Requests per second allowed (endpoint setting), if limited.
    pub rate_limit_per_sec: Option<u32>,
    /// Concurrent requests allowed, if set.
    pub max_in_flight: Option<u32>,
    /// Active signing secrets, newest first (two during a rotation overlap).
    pub secrets: Vec<SigningSecret>,
    /// When it was created: it receives events that occurred from then on.
    pub created_at: crate::time::Timestamp,
}

impl EndpointConfig {
    /// Whether the endpoint receives events of `event_type`.
    pub fn subscribes_to(&self, event_type: &EventType) -> bool {
        self.enabled && (self.event_types.is_empty() || self.event_types.contains(event_type))
    }
}

/// A snapshot of every endpoint.
#[derive(Debug, Default)]
pub struct Directory {
    /// The platform's config epoch this snapshot was read at.
    pub epoch: i64,
    by_tenant: HashMap<TenantId, Vec<Arc<EndpointConfig>>>,
    by_id: HashMap<EndpointId, Arc<EndpointConfig>>,
}

impl Directory {
    /// Builds a snapshot.
    pub fn new(epoch: i64, endpoints: Vec<EndpointConfig>) -> Self {
        let mut dir = Directory {
            epoch,
            ..Directory::default()
        };
        for ep in endpoints {
            let ep = Arc::new(ep);
            dir.by_tenant
                .entry(ep.tenant_id.clone())
                .or_default()
                .push(ep.clone());
            dir.by_id.insert(ep.id, ep);
        }
        dir
    }

    /// The endpoints of `tenant` that receive an event of `event_type` that
    /// occurred at `occurred_at`: enabled, subscribed, and created by then (an
    /// endpoint does not receive events from before it existed, however late
    /// capture reads them).
    pub fn subscribers<'a>(
        &'a self,
        tenant: &TenantId,
        event_type: &'a EventType,
        occurred_at: crate::time::Timestamp,
    ) -> impl Iterator<Item = &'a Arc<EndpointConfig>> + 'a {
        self.by_tenant
            .get(tenant)
            .into_iter()
            .flatten()
            .filter(move |e| e.subscribes_to(event_type) && e.created_at <= occurred_at)
    }

    /// An endpoint by id (enabled or not); `None` once deleted.
    pub fn endpoint(&self, id: &EndpointId) -> Option<&Arc<EndpointConfig>> {
        self.by_id.get(id)
    }

    /// How many endpoints the snapshot holds.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }
}

/// Where endpoints are read from (the platform database).
pub trait EndpointSource: Send + Sync + 'static {
    /// The current config epoch.
    fn config_epoch(&self) -> impl Future<Output = Result<i64, StoreError>> + Send;
    /// Every endpoint that is not deleted, with its active secrets.
    fn load_endpoints(
        &self,
    ) -> impl Future<Output = Result<Vec<EndpointConfig>, StoreError>> + Send;
}

/// The shared, refreshed directory.
#[derive(Debug, Default)]
pub struct SubscriptionCache {
    current: RwLock<Arc<Directory>>,
}

impl SubscriptionCache {
    /// The current snapshot.
    pub fn snapshot(&self) -> Arc<Directory> {
        self.current.read().clone()
    }

    /// Replaces the snapshot.
    pub fn replace(&self, dir: Directory) {
        *self.current.write() = Arc::new(dir);
    }

    /// Loads once (at start-up, so that fan-out never runs on an empty
    /// directory by mistake).
    pub async fn load<S: EndpointSource>(&self, source: &S) -> Result<(), StoreError> {
        let epoch = source.config_epoch().await?;
        let endpoints = source.load_endpoints().await?;
        tracing::debug!(
            epoch,
            endpoints = endpoints.len(),
            "loaded the endpoint directory"
        );
        self.replace(Directory::new(epoch, endpoints));
        Ok(())
    }

    /// Polls the epoch every `interval` and reloads when it moved, until
    /// `shutdown`.
    pub async fn refresh<S: EndpointSource>(
        &self,
        source: S,
        interval: Duration,
        shutdown: CancellationToken,
    ) {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            match source.config_epoch().await {
                Ok(epoch) if epoch != self.snapshot().epoch => {
                    if let Err(e) = self.load(&source).await {
                        tracing::warn!(error = %e, "could not reload endpoints; keeping the previous directory");
                    }
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "could not read the config epoch"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(id: u8, tenant: &str, types: &[&str], enabled: bool) -> EndpointConfig {
        EndpointConfig {
            id: EndpointId([id; 16]),
            tenant_id: TenantId::new(tenant).unwrap(),
            url: format!("https://example.com/{id}"),
            event_types: types.iter().map(|t| EventType::new(t).unwrap()).collect(),
            enabled,
            config_version: 1,
            rate_limit_per_sec: None,
            max_in_flight: None,
            secrets: vec![],
            created_at: crate::time::Timestamp(id as i64),
        }
    }

    #[test]
    fn subscribers_match_tenant_type_and_state() {
        let dir = Directory::new(
            1,
            vec![
                ep(1, "acme", &[], true),
                ep(2, "acme", &["invoice.paid"], true),
                ep(3, "acme", &["order.shipped"], true),
                ep(4, "acme", &["invoice.paid"], false),
                ep(5, "globex", &[], true),
            ],
        );
        let paid = EventType::new("invoice.paid").unwrap();
        let acme = TenantId::new("acme").unwrap();
        let at = crate::time::Timestamp(10);
        let ids: Vec<u8> = dir
            .subscribers(&acme, &paid, at)
            .map(|e| e.id.0[0])
            .collect();
        assert_eq!(ids, vec![1, 2]);
        let early: Vec<u8> = dir
            .subscribers(&acme, &paid, crate::time::Timestamp(1))
            .map(|e| e.id.0[0])
            .collect();
        assert_eq!(
            early,
            vec![1],
            "an endpoint got an event from before it existed"
        );
        assert_eq!(
            dir.subscribers(&TenantId::new("nobody").unwrap(), &paid, at)
                .count(),
            0
        );
        assert!(dir.endpoint(&EndpointId([4; 16])).is_some());
    }
}
