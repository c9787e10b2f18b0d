//! Tenant and API key bodies (operator routes).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use walhook_sql::tenants::{ApiKeyRecord, TenantRecord};

use super::{RetrySchedule, double_option, ts};
use crate::auth::key_text_id;
use crate::idempotency::ShownOnce;

/// The longest tenant or key name accepted (characters).
pub const MAX_NAME_LEN: usize = 256;

/// A new tenant.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateTenant {
    /// Its id: the value of the capture rules' tenant column (1 to 128
    /// characters, no control characters).
    #[schema(min_length = 1, max_length = 128, example = "acme")]
    pub id: String,
    /// A name for people (default: the id).
    #[serde(default)]
    #[schema(max_length = 256)]
    pub name: Option<String>,
    /// Its share of dispatch capacity, 1 to 1000 (default 1): under
    /// contention, tenants hold attempt slots in proportion to their
    /// weights.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 1000)]
    pub weight: Option<i32>,
    /// Its own in-flight budget: attempts in flight at most for the tenant
    /// on each dispatcher node, 1 to 100000 (default: `[dispatch]
    /// tenant_max_in_flight`).
    #[serde(default)]
    #[schema(minimum = 1, maximum = 100000)]
    pub max_in_flight: Option<i32>,
    /// Its retry schedule; absent fields inherit `[retry]`, and its
    /// endpoints' own schedules override it field by field.
    #[serde(default)]
    pub retry: Option<RetrySchedule>,
}

/// A change to a tenant: absent fields stay as they are.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PatchTenant {
    /// A new share of dispatch capacity, 1 to 1000.
    #[schema(minimum = 1, maximum = 1000)]
    pub weight: Option<i32>,
    /// A new in-flight budget per dispatcher node; null removes it.
    #[serde(default, deserialize_with = "double_option")]
    #[schema(value_type = Option<i32>, minimum = 1, maximum = 100000)]
    pub max_in_flight: Option<Option<i32>>,
    /// A new retry schedule (replacing the old); null removes it.
    #[serde(default, deserialize_with = "double_option")]
    #[schema(value_type = Option<RetrySchedule>)]
    pub retry: Option<Option<RetrySchedule>>,
}

/// A tenant.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Tenant {
    /// Its id.
    pub id: String,
    /// Its name.
    pub name: String,
    /// Its share of dispatch capacity.
    pub weight: i32,
    /// Its own in-flight budget per dispatcher node, when set.
    pub max_in_flight: Option<i32>,
    /// Its retry schedule, when it has one.
    pub retry: Option<RetrySchedule>,
    /// When it was registered.
    pub created_at: DateTime<Utc>,
    /// When it was disabled.
    pub disabled_at: Option<DateTime<Utc>>,
}

impl From<TenantRecord> for Tenant {
    fn from(r: TenantRecord) -> Self {
        Tenant {
            id: r.id.to_string(),
            name: r.name,
            weight: r.weight,
            max_in_flight: r.max_in_flight,
            retry: r.retry.map(RetrySchedule::from),
            created_at: ts(r.created_at),
            disabled_at: r.disabled_at.map(ts),
        }
    }
}

/// A page of tenants, by id.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TenantPage {
    /// The tenants.
    pub data: Vec<Tenant>,
    /// Pass as `cursor` for the next page; absent on the last page.
    pub next_cursor: Option<String>,
}

/// A new API key.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateApiKey {
    /// A name for people (where the key is used).
    #[serde(default)]
    #[schema(max_length = 256)]
    pub name: String,
}

/// An API key (never the key itself after it was issued).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ApiKey {
    /// Its id (`key_…`).
    pub id: String,
    /// Its tenant.
    pub tenant_id: String,
    /// Its name.
    pub name: String,
    /// The key's first characters, to tell keys apart.
    pub prefix: String,
    /// When it was issued.
    pub created_at: DateTime<Utc>,
    /// Who issued it.
    pub created_by: String,
    /// When it was revoked.
    pub revoked_at: Option<DateTime<Utc>>,
}

impl From<ApiKeyRecord> for ApiKey {
    fn from(r: ApiKeyRecord) -> Self {
        ApiKey {
            id: key_text_id(r.id),
            tenant_id: r.tenant_id.to_string(),
            name: r.name,
            prefix: r.prefix,
            created_at: ts(r.created_at),
            created_by: r.created_by,
            revoked_at: r.revoked_at.map(ts),
        }
    }
}

/// A new API key and the key itself, shown only this once.
#[derive(Clone, Serialize, Deserialize, ToSchema)]
pub struct CreatedApiKey {
    /// The key's record.
    pub api_key: ApiKey,
    /// The key (`whk_…`): send it as `Authorization: Bearer <key>`. `null`
    /// when this response is an idempotent replay (`key_withheld`): keys
    /// are shown once and stored only as a hash.
    #[schema(required = true)]
    pub key: Option<String>,
    /// `true` when `key` is `null` because this is a replay of a request
    /// with the same `Idempotency-Key`; `note` says what to do.
    pub key_withheld: bool,
    /// Why the key is missing and what to do (replays only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl CreatedApiKey {
    /// The response that shows `key`.
    pub fn new(api_key: ApiKey, key: String) -> Self {
        CreatedApiKey {
            api_key,
            key: Some(key),
            key_withheld: false,
            note: None,
        }
    }
}

impl ShownOnce for CreatedApiKey {
    fn withheld(&self) -> Self {
        let note = format!(
            "the key is shown only in the first response to this Idempotency-Key; issue a new \
             one (POST /v1/tenants/{}/api-keys) and revoke {} (DELETE /v1/tenants/{}/api-keys/{})",
            self.api_key.tenant_id, self.api_key.id, self.api_key.tenant_id, self.api_key.id
        );
        CreatedApiKey {
            api_key: self.api_key.clone(),
            key: None,
            key_withheld: true,
            note: Some(note),
        }
    }
}

impl std::fmt::Debug for CreatedApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CreatedApiKey")
            .field("api_key", &self.api_key)
            .field("key", &self.key.as_ref().map(|_| "***"))
            .field("key_withheld", &self.key_withheld)
            .finish()
    }
}

/// A tenant's API keys, oldest first.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ApiKeyList {
    /// The keys (revoked ones included).
    pub data: Vec<ApiKey>,
}
