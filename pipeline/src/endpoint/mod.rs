//! Endpoints and the subscription directory fan-out and dispatch read.
//!
//! The directory is an immutable snapshot swapped as a whole: readers take an
//! `Arc` and never wait. [`SubscriptionCache`] (in `cache`) keeps it current
//! and knows how fresh it is, so that fan-out never decides from a snapshot
//! older than the events it plans.
//!
//! An endpoint whose row or secret cannot be loaded is *quarantined*, not
//! dropped: it stays in the directory with the reason, fan-out still makes
//! its deliveries (nothing is lost) and dispatch holds them until it loads
//! again; every other endpoint is unaffected.

mod cache;

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use crate::event::EventType;
use crate::ids::{EndpointId, TenantId};
use crate::retry::RetryOverride;
use crate::signing::VersionedSecret;
use crate::store::StoreError;

pub use cache::{RefreshSettings, SubscriptionCache};

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
    /// Active signing secrets, newest first (two or more during a rotation
    /// overlap). Shared: every attempt holds the set that signed it.
    pub secrets: Arc<[VersionedSecret]>,
    /// When it was created: it receives events that occurred from then on.
    pub created_at: crate::time::Timestamp,
    /// Why its row or secrets could not be loaded, when they could not: its
    /// deliveries are made and wait, none is sent.
    pub quarantine: Option<String>,
    /// Its retry schedule's changes (the endpoint's fields over its
    /// tenant's); empty: `[retry]` as configured.
    pub retry: RetryOverride,
    /// The ownership check it waits for, when it does: its deliveries are
    /// made and wait (visible), none is sent until the URL answered the
    /// ownership proof. `None`: verified, or never required.
    pub verification: Option<PendingVerification>,
    /// Whether one object's deliveries are attempted in commit order.
    pub ordering: DeliveryOrder,
    /// Its recent subscription versions, oldest first: every version in
    /// force within [`VERSION_HORIZON`] (the current one included). Empty
    /// means the current configuration has always applied.
    pub history: Vec<SubscriptionVersion>,
}

/// How an endpoint's deliveries are ordered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum DeliveryOrder {
    /// Any order: every delivery goes as soon as its endpoint's limits
    /// allow (the fastest, and the default).
    #[default]
    Unordered,
    /// Deliveries of one object (the event's `object_id`) are attempted in
    /// commit order: the next waits while an earlier one is pending.
    /// Events without an object are not ordered.
    PerObject,
}

impl DeliveryOrder {
    /// The stored and API name.
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryOrder::Unordered => "none",
            DeliveryOrder::PerObject => "per_object",
        }
    }

    /// Parses a stored or API name.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "none" => Some(DeliveryOrder::Unordered),
            "per_object" => Some(DeliveryOrder::PerObject),
            _ => None,
        }
    }
}

/// An ownership check an endpoint waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingVerification {
    /// What the URL must prove it holds the secret for.
    pub challenge: String,
    /// When it was asked for (a re-send asks again with a new challenge).
    pub requested_at: crate::time::Timestamp,
}

/// How far back fan-out can tell which subscription was in force: events
/// older than this (capture that far behind) are decided by the oldest
/// version kept.
pub const VERSION_HORIZON: std::time::Duration = std::time::Duration::from_secs(7 * 24 * 3600);

/// What an endpoint subscribed to from one time on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscriptionVersion {
    /// Its config version.
    pub version: i32,
    /// When it took effect (the platform's clock at the change).
    pub valid_from: crate::time::Timestamp,
    /// Whether the endpoint was enabled.
    pub enabled: bool,
    /// Subscribed types; empty means every type.
    pub event_types: Vec<EventType>,
}

impl SubscriptionVersion {
    /// Whether this version receives events of `event_type`.
    pub fn subscribes_to(&self, event_type: &EventType) -> bool {
        self.enabled && (self.event_types.is_empty() || self.event_types.contains(event_type))
    }
}

#[cfg(any(test, feature = "testing"))]
impl EndpointConfig {
    /// An enabled endpoint of `tenant` at `url` that receives every type:
    /// config version 1, no secret, no limit, the default retries and
    /// order, made at the epoch. Tests set what they are about with struct
    /// update syntax.
    pub fn for_tests(id: EndpointId, tenant: &str, url: impl Into<String>) -> Self {
        EndpointConfig {
            id,
            tenant_id: TenantId::new(tenant).expect("a valid tenant"),
            url: url.into(),
            event_types: vec![],
            enabled: true,
            config_version: 1,
            rate_limit_per_sec: None,
            max_in_flight: None,
            secrets: Arc::from([]),
            retry: RetryOverride::default(),
            verification: None,
            ordering: Default::default(),
            created_at: crate::time::Timestamp(0),
            quarantine: None,
            history: vec![],
        }
    }
}

impl EndpointConfig {
    /// Whether the endpoint, as it is now, receives events of `event_type`.
    pub fn subscribes_to(&self, event_type: &EventType) -> bool {
        self.enabled && (self.event_types.is_empty() || self.event_types.contains(event_type))
    }

    /// The config version whose subscription receives an event of
    /// `event_type` that occurred at `at`, if one does: the version in
    /// force when the event was committed, so that a change committed after
    /// the event does not decide it, however late capture reads it. `None`
    /// as well when the endpoint did not exist yet.
    pub fn receiving_version(
        &self,
        event_type: &EventType,
        at: crate::time::Timestamp,
    ) -> Option<i32> {
        if self.created_at > at {
            return None;
        }
        match self.version_in_force(at) {
            Some(v) => v.subscribes_to(event_type).then_some(v.version),
            None => self
                .subscribes_to(event_type)
                .then_some(self.config_version),
        }
    }

    /// Whether the endpoint was enabled at `at`, by the version in force
    /// then (as [`EndpointConfig::receiving_version`] picks it).
    pub fn enabled_at(&self, at: crate::time::Timestamp) -> bool {
        self.version_in_force(at)
            .map_or(self.enabled, |v| v.enabled)
    }

    /// The recorded version in force at `at` (the oldest kept when `at` is
    /// older than all); `None` when no history is kept.
    fn version_in_force(&self, at: crate::time::Timestamp) -> Option<&SubscriptionVersion> {
        self.history
            .iter()
            .rev()
            .find(|v| v.valid_from <= at)
            .or_else(|| self.history.first())
    }
}

/// Whether a tenant is registered, and whether it is enabled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TenantStatus {
    /// Registered and enabled.
    Enabled,
    /// Registered, disabled: its endpoints get nothing.
    Disabled,
    /// Not registered: events for it reach no endpoint (an incident).
    Unknown,
}

/// What [`EndpointSource::load_endpoints`] reads.
#[derive(Debug, Default)]
pub struct Loaded {
    /// Every registered tenant and whether it is enabled.
    pub tenants: Vec<(TenantId, bool)>,
    /// Tenants' dispatch weights other than 1 (`tenants.weight`).
    pub weights: HashMap<TenantId, u32>,
    /// Tenants' own in-flight budgets (`tenants.max_in_flight`).
    pub budgets: HashMap<TenantId, u32>,
    /// Every endpoint that is not deleted (of enabled tenants), quarantined
    /// ones included.
    pub endpoints: Vec<EndpointConfig>,
    /// Master keys that sealed a secret but are not configured in this
    /// process (their endpoints are quarantined). A process starting like
    /// this is misconfigured and should say so rather than run.
    pub missing_keys: Vec<String>,
}

/// A snapshot of every endpoint.
#[derive(Debug, Default)]
pub struct Directory {
    /// The platform's config epoch this snapshot was read at.
    pub epoch: i64,
    by_tenant: HashMap<TenantId, Vec<Arc<EndpointConfig>>>,
    by_id: HashMap<EndpointId, Arc<EndpointConfig>>,
    tenants: HashMap<TenantId, bool>,
    weights: HashMap<TenantId, u32>,
    budgets: HashMap<TenantId, u32>,
    ordered: std::collections::HashSet<EndpointId>,
    missing_keys: Vec<String>,
}

impl Directory {
    /// A snapshot of `endpoints`, whose tenants count as registered and
    /// enabled (tests; the platform's loader uses [`Directory::loaded`]).
    pub fn new(epoch: i64, endpoints: Vec<EndpointConfig>) -> Self {
        let tenants = endpoints
            .iter()
            .map(|e| (e.tenant_id.clone(), true))
            .collect();
        Directory::loaded(
            epoch,
            Loaded {
                tenants,
                weights: HashMap::new(),
                budgets: HashMap::new(),
                endpoints,
                missing_keys: Vec::new(),
            },
        )
    }

    /// A snapshot of what the loader read.
    pub fn loaded(epoch: i64, loaded: Loaded) -> Self {
        let mut dir = Directory {
            epoch,
            tenants: loaded.tenants.into_iter().collect(),
            weights: loaded.weights,
            budgets: loaded.budgets,
            missing_keys: loaded.missing_keys,
            ..Directory::default()
        };
        for ep in loaded.endpoints {
            let ep = Arc::new(ep);
            dir.by_tenant
                .entry(ep.tenant_id.clone())
                .or_default()
                .push(ep.clone());
            if ep.ordering == DeliveryOrder::PerObject {
                dir.ordered.insert(ep.id);
            }
            dir.by_id.insert(ep.id, ep);
        }
        dir
    }

    /// The endpoints whose deliveries are ordered per object.
    pub fn ordered(&self) -> &std::collections::HashSet<EndpointId> {
        &self.ordered
    }

    /// The endpoints of `tenant` that receive an event of `event_type` that
    /// occurred at `occurred_at`, with the config version that decided it:
    /// created by then, and enabled and subscribed in the version in force
    /// then (see [`EndpointConfig::receiving_version`]).
    pub fn subscribers<'a>(
        &'a self,
        tenant: &TenantId,
        event_type: &'a EventType,
        occurred_at: crate::time::Timestamp,
    ) -> impl Iterator<Item = (&'a Arc<EndpointConfig>, i32)> + 'a {
        self.by_tenant
            .get(tenant)
            .into_iter()
            .flatten()
            .filter_map(move |e| e.receiving_version(event_type, occurred_at).map(|v| (e, v)))
    }

    /// Every endpoint of `tenant`, whatever it subscribes to.
    pub fn endpoints_of<'a>(
        &'a self,
        tenant: &TenantId,
    ) -> impl Iterator<Item = &'a Arc<EndpointConfig>> + 'a {
        self.by_tenant.get(tenant).into_iter().flatten()
    }

    /// An endpoint by id (enabled or not); `None` once deleted.
    pub fn endpoint(&self, id: &EndpointId) -> Option<&Arc<EndpointConfig>> {
        self.by_id.get(id)
    }

    /// Whether `tenant` is registered and enabled.
    pub fn tenant(&self, tenant: &TenantId) -> TenantStatus {
        match self.tenants.get(tenant) {
            Some(true) => TenantStatus::Enabled,
            Some(false) => TenantStatus::Disabled,
            None => TenantStatus::Unknown,
        }
    }

    /// The tenants' dispatch weights other than 1.
    pub fn weights(&self) -> &HashMap<TenantId, u32> {
        &self.weights
    }

    /// The tenants' own in-flight budgets, where set.
    pub fn budgets(&self) -> &HashMap<TenantId, u32> {
        &self.budgets
    }

    /// Master keys that sealed secrets of this snapshot's endpoints but are
    /// not configured here.
    pub fn missing_keys(&self) -> &[String] {
        &self.missing_keys
    }

    /// The endpoints waiting for an ownership check.
    pub fn unverified(&self) -> impl Iterator<Item = &Arc<EndpointConfig>> {
        self.by_id.values().filter(|e| e.verification.is_some())
    }

    /// The quarantined endpoints.
    pub fn quarantined(&self) -> impl Iterator<Item = &Arc<EndpointConfig>> {
        self.by_id.values().filter(|e| e.quarantine.is_some())
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
    /// The current config epoch: it changes with every endpoint, secret or
    /// tenant change (only equality is meaningful).
    fn config_epoch(&self) -> impl Future<Output = Result<i64, StoreError>> + Send;

    /// Every tenant, and every endpoint that is not deleted with its active
    /// secrets. A row or secret that cannot be read quarantines that
    /// endpoint ([`EndpointConfig::quarantine`]); it never fails the load.
    fn load_endpoints(&self) -> impl Future<Output = Result<Loaded, StoreError>> + Send;

    /// Records that exactly `quarantined` are quarantined now: an incident
    /// (and an audit record) for each one not quarantined before, and every
    /// other open quarantine lifted (audited too).
    fn quarantine_sync(
        &self,
        quarantined: &[Arc<EndpointConfig>],
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// A shared source reads as the source it shares (the directory's
/// refresher holds the process's store this way).
impl<T: EndpointSource> EndpointSource for Arc<T> {
    fn config_epoch(&self) -> impl Future<Output = Result<i64, StoreError>> + Send {
        (**self).config_epoch()
    }

    fn load_endpoints(&self) -> impl Future<Output = Result<Loaded, StoreError>> + Send {
        (**self).load_endpoints()
    }

    fn quarantine_sync(
        &self,
        quarantined: &[Arc<EndpointConfig>],
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        (**self).quarantine_sync(quarantined)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(id: u8, tenant: &str, types: &[&str], enabled: bool) -> EndpointConfig {
        EndpointConfig {
            event_types: types.iter().map(|t| EventType::new(t).unwrap()).collect(),
            enabled,
            created_at: crate::time::Timestamp(id as i64),
            ..EndpointConfig::for_tests(
                EndpointId([id; 16]),
                tenant,
                format!("https://example.com/{id}"),
            )
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
            .map(|(e, _)| e.id.0[0])
            .collect();
        assert_eq!(ids, vec![1, 2]);
        let early: Vec<u8> = dir
            .subscribers(&acme, &paid, crate::time::Timestamp(1))
            .map(|(e, _)| e.id.0[0])
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

    #[test]
    fn the_version_in_force_at_the_commit_decides() {
        let t = crate::time::Timestamp;
        let paid = EventType::new("invoice.paid").unwrap();
        let version = |version, from, enabled, types: &[&str]| SubscriptionVersion {
            version,
            valid_from: t(from),
            enabled,
            event_types: types.iter().map(|x| EventType::new(x).unwrap()).collect(),
        };
        let mut e = ep(1, "acme", &["invoice.paid"], true);
        e.created_at = t(10);
        e.config_version = 4;
        e.history = vec![
            version(1, 10, true, &["order.created"]),
            version(2, 20, true, &["invoice.paid"]),
            version(3, 30, false, &["invoice.paid"]),
            version(4, 40, true, &["invoice.paid"]),
        ];
        assert_eq!(e.receiving_version(&paid, t(5)), None, "before it existed");
        assert_eq!(
            e.receiving_version(&paid, t(15)),
            None,
            "before it subscribed"
        );
        assert_eq!(e.receiving_version(&paid, t(25)), Some(2));
        assert_eq!(e.receiving_version(&paid, t(35)), None, "while disabled");
        assert_eq!(e.receiving_version(&paid, t(45)), Some(4));
    }
}
