//! Every endpoint that ever existed, with every subscription version it had,
//! as fan-out's [`Directory`]: reconciliation asks fan-out's own planner
//! ([`EndpointConfig::receiving_version`], the function behind
//! [`Directory::subscribers`]) which endpoints an event was due to reach, so
//! the rule has one home. Deleted endpoints are kept, with when they were
//! deleted, and so are the current pause reasons that explain a pending
//! delivery waiting.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::SystemTime;

use uuid::Uuid;
use walhook_pipeline::endpoint::{Directory, EndpointConfig, Loaded, SubscriptionVersion};
use walhook_pipeline::event::EventType;
use walhook_pipeline::ids::{EndpointId, TenantId};
use walhook_pipeline::time::Timestamp;

use crate::ReconcileError;
use crate::report::Explanation;

/// Why an endpoint's pending deliveries may wait today.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Paused {
    /// Its row or secret does not load.
    Quarantined,
    /// Its circuit is open.
    CircuitOpen,
    /// It, or its tenant, is disabled or deleted.
    Disabled,
}

impl Paused {
    /// The explanation it gives an overdue delivery.
    pub fn explanation(self) -> Explanation {
        match self {
            Paused::Quarantined => Explanation::PendingQuarantined,
            Paused::CircuitOpen => Explanation::PendingCircuitOpen,
            Paused::Disabled => Explanation::PendingEndpointDisabled,
        }
    }
}

/// The history the planner decides from.
pub struct History {
    directory: Directory,
    deleted_at: HashMap<EndpointId, Timestamp>,
    tenant_disabled_at: HashMap<TenantId, Option<Timestamp>>,
    paused: HashMap<EndpointId, Paused>,
}

/// What the planner says about one (event, endpoint) pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// A delivery is due, made with this config version.
    Expected(i32),
    /// No delivery, for this reason.
    NotExpected(Explanation),
}

impl History {
    /// Reads it from the platform database at the snapshot of `client`.
    pub async fn load(client: &tokio_postgres::Client) -> Result<History, ReconcileError> {
        let tenants = client
            .query("SELECT id, disabled_at FROM walhook.tenants", &[])
            .await
            .map_err(ReconcileError::query("read tenants"))?;
        let mut loaded = Loaded::default();
        let mut tenant_disabled_at = HashMap::new();
        for t in tenants {
            let Ok(id) = TenantId::new(t.get::<_, String>(0)) else {
                continue;
            };
            let disabled: Option<SystemTime> = t.get(1);
            // Every tenant counts as enabled for the planner; when it was
            // disabled is judged per event below.
            loaded.tenants.push((id.clone(), true));
            tenant_disabled_at.insert(id, disabled.map(Timestamp::from_system_time));
        }
        let versions = client
            .query(
                "SELECT endpoint_id, version, event_types, enabled, changed_at \
                 FROM walhook.endpoint_versions ORDER BY endpoint_id, version",
                &[],
            )
            .await
            .map_err(ReconcileError::query("read endpoint versions"))?;
        let mut history: HashMap<Uuid, Vec<SubscriptionVersion>> = HashMap::new();
        for v in versions {
            history
                .entry(v.get(0))
                .or_default()
                .push(SubscriptionVersion {
                    version: v.get(1),
                    valid_from: Timestamp::from_system_time(v.get(4)),
                    enabled: v.get(3),
                    event_types: event_types(v.get(2)),
                });
        }
        let rows = client
            .query(
                "SELECT e.id, e.tenant_id, e.event_types, e.enabled, e.config_version, e.created_at, \
                        e.deleted_at, t.disabled_at IS NOT NULL, \
                        coalesce(h.circuit = 'open' AND (h.open_until IS NULL OR h.open_until > now()), false), \
                        EXISTS (SELECT 1 FROM walhook.incidents i WHERE i.stage = 'directory' \
                                AND i.kind = 'endpoint_quarantined' AND i.resolved_at IS NULL \
                                AND i.subject = e.id::text) \
                 FROM walhook.endpoints e JOIN walhook.tenants t ON t.id = e.tenant_id \
                 LEFT JOIN walhook.endpoint_health h ON h.endpoint_id = e.id",
                &[],
            )
            .await
            .map_err(ReconcileError::query("read endpoints"))?;
        let mut deleted_at = HashMap::new();
        let mut paused = HashMap::new();
        for r in rows {
            let uid: Uuid = r.get(0);
            let id = EndpointId(*uid.as_bytes());
            let Ok(tenant_id) = TenantId::new(r.get::<_, String>(1)) else {
                continue;
            };
            let enabled: bool = r.get(3);
            let deleted: Option<SystemTime> = r.get(6);
            if let Some(at) = deleted {
                deleted_at.insert(id, Timestamp::from_system_time(at));
            }
            let reason = if r.get::<_, bool>(9) {
                Some(Paused::Quarantined)
            } else if !enabled || deleted.is_some() || r.get::<_, bool>(7) {
                Some(Paused::Disabled)
            } else if r.get::<_, bool>(8) {
                Some(Paused::CircuitOpen)
            } else {
                None
            };
            if let Some(reason) = reason {
                paused.insert(id, reason);
            }
            loaded.endpoints.push(EndpointConfig {
                id,
                tenant_id,
                url: String::new(),
                event_types: event_types(r.get(2)),
                enabled,
                config_version: r.get(4),
                rate_limit_per_sec: None,
                max_in_flight: None,
                secrets: std::sync::Arc::from([]),
                retry: Default::default(),
                verification: None,
                ordering: Default::default(),
                created_at: Timestamp::from_system_time(r.get(5)),
                quarantine: None,
                history: history.remove(&uid).unwrap_or_default(),
            });
        }
        Ok(History {
            directory: Directory::loaded(0, loaded),
            deleted_at,
            tenant_disabled_at,
            paused,
        })
    }

    /// Whether `tenant` is registered.
    pub fn knows_tenant(&self, tenant: &TenantId) -> bool {
        self.tenant_disabled_at.contains_key(tenant)
    }

    /// Why a pending delivery to `endpoint` may wait today, if it may.
    pub fn paused(&self, endpoint: &EndpointId) -> Option<Paused> {
        self.paused.get(endpoint).copied()
    }

    /// Every endpoint of `tenant` with the planner's decision for an event
    /// of `event_type` that occurred at `at`.
    pub fn decide<'a>(
        &'a self,
        tenant: &'a TenantId,
        event_type: &'a EventType,
        at: Timestamp,
    ) -> impl Iterator<Item = (&'a Arc<EndpointConfig>, Decision)> + 'a {
        let tenant_off = self
            .tenant_disabled_at
            .get(tenant)
            .copied()
            .flatten()
            .is_some_and(|d| d <= at);
        self.directory.endpoints_of(tenant).map(move |e| {
            let decision = match e.receiving_version(event_type, at) {
                _ if tenant_off => Decision::NotExpected(Explanation::TenantDisabled),
                Some(_) if self.deleted_at.get(&e.id).is_some_and(|d| *d <= at) => {
                    Decision::NotExpected(Explanation::EndpointDeleted)
                }
                Some(v) => Decision::Expected(v),
                None if e.created_at > at => {
                    Decision::NotExpected(Explanation::EventBeforeEndpoint)
                }
                None if self.deleted_at.get(&e.id).is_some_and(|d| *d <= at) => {
                    Decision::NotExpected(Explanation::EndpointDeleted)
                }
                None if !e.enabled_at(at) => Decision::NotExpected(Explanation::EndpointDisabled),
                None => Decision::NotExpected(Explanation::TypeNotSubscribed),
            };
            (e, decision)
        })
    }
}

fn event_types(names: Vec<String>) -> Vec<EventType> {
    // A name that is not a valid type can match no event; keeping the list
    // non-empty keeps it from meaning "every type".
    names
        .iter()
        .map(|n| {
            EventType::new(n).unwrap_or_else(|_| EventType::new("invalid.type").expect("valid"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64) -> Timestamp {
        Timestamp::from_system_time(
            SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(s as u64),
        )
    }

    fn version(version: i32, from: i64, enabled: bool, types: &[&str]) -> SubscriptionVersion {
        SubscriptionVersion {
            version,
            valid_from: at(from),
            enabled,
            event_types: types.iter().map(|t| EventType::new(t).unwrap()).collect(),
        }
    }

    /// One endpoint of tenant `acme`, created at 100: enabled for every
    /// type, disabled at 200, enabled for `a.done` only at 400, deleted at
    /// 600; the tenant disabled at 800.
    fn history() -> History {
        let tenant = TenantId::new("acme").unwrap();
        let id = EndpointId([7; 16]);
        let endpoint = EndpointConfig {
            id,
            tenant_id: tenant.clone(),
            url: String::new(),
            event_types: vec![EventType::new("a.done").unwrap()],
            enabled: true,
            config_version: 3,
            rate_limit_per_sec: None,
            max_in_flight: None,
            secrets: std::sync::Arc::from([]),
            retry: Default::default(),
            verification: None,
            ordering: Default::default(),
            created_at: at(100),
            quarantine: None,
            history: vec![
                version(1, 100, true, &[]),
                version(2, 200, false, &[]),
                version(3, 400, true, &["a.done"]),
            ],
        };
        History {
            directory: Directory::loaded(
                0,
                Loaded {
                    tenants: vec![(tenant.clone(), true)],
                    endpoints: vec![endpoint],
                    ..Loaded::default()
                },
            ),
            deleted_at: HashMap::from([(id, at(600))]),
            tenant_disabled_at: HashMap::from([(tenant, Some(at(800)))]),
            paused: HashMap::new(),
        }
    }

    #[test]
    fn the_planner_decides_by_the_version_in_force_when_the_event_occurred() {
        let h = history();
        let tenant = TenantId::new("acme").unwrap();
        let decide = |ty: &str, t: i64| {
            let ty = EventType::new(ty).unwrap();
            let all: Vec<Decision> = h.decide(&tenant, &ty, at(t)).map(|(_, d)| d).collect();
            assert_eq!(all.len(), 1);
            all[0]
        };
        use Decision::*;
        assert_eq!(
            decide("a.done", 50),
            NotExpected(Explanation::EventBeforeEndpoint)
        );
        assert_eq!(decide("b.done", 150), Expected(1));
        assert_eq!(
            decide("a.done", 300),
            NotExpected(Explanation::EndpointDisabled)
        );
        assert_eq!(decide("a.done", 500), Expected(3));
        assert_eq!(
            decide("b.done", 500),
            NotExpected(Explanation::TypeNotSubscribed)
        );
        assert_eq!(
            decide("a.done", 700),
            NotExpected(Explanation::EndpointDeleted)
        );
        assert_eq!(
            decide("a.done", 900),
            NotExpected(Explanation::TenantDisabled)
        );
        assert!(h.knows_tenant(&tenant));
        assert!(!h.knows_tenant(&TenantId::new("globex").unwrap()));
    }
}
