//! Message rules: transactional `pg_logical_emit_message` calls with a
//! prefix, whose JSON content carries its own type, tenant and data.

use std::sync::Arc;

use walhook_pipeline::canonical::canonical_members;
use walhook_pipeline::capture::{Incident, IncidentKind};
use walhook_pipeline::event::{EventType, MAX_OBJECT_VERSION_BYTES, check_object_id};
use walhook_pipeline::ids::TenantId;

use super::event::{EventParts, Outcome, TxContext};
use crate::postgres::config::RuleConfig;
use crate::postgres::declared::DeclaredSchemas;

/// A message rule: transactional logical messages with a prefix.
#[derive(Debug, Clone)]
pub struct MessageRule {
    name: Arc<str>,
    prefix: String,
    schema_version: u32,
    /// The schemas the config declares for payloads.
    declared: Option<Arc<DeclaredSchemas>>,
}

impl MessageRule {
    /// From a validated config rule of kind `message`.
    pub fn new(rule: &RuleConfig) -> Self {
        MessageRule {
            name: rule.name.as_str().into(),
            prefix: rule.prefix.clone().unwrap_or_default(),
            schema_version: rule.schema_version,
            declared: None,
        }
    }

    /// With the schemas the config declares for payloads.
    pub fn with_declared(mut self, declared: Option<Arc<DeclaredSchemas>>) -> Self {
        self.declared = declared;
        self
    }

    /// Whether `prefix` is this rule's.
    pub fn matches(&self, prefix: &str) -> bool {
        self.prefix == prefix
    }

    /// The rule's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The rule's name, shared (cloning it does not allocate).
    pub fn shared_name(&self) -> &Arc<str> {
        &self.name
    }

    /// Makes the event of a transactional message whose content is
    /// `{"type": …, "tenant_id": …, "data": …, "object_id"?: …, "object_version"?: …}`.
    pub fn apply(&self, content: &[u8], tx: &TxContext<'_>, ordinal: u32) -> Outcome {
        let incident = |detail: String| {
            Outcome::Incident(Incident {
                kind: IncidentKind::InvalidMessage,
                commit_lsn: Some(tx.commit_lsn),
                tx_ordinal: Some(ordinal),
                rule: Some(self.name.to_string()),
                table: None,
                detail,
            })
        };
        if content.len() > tx.max_event_bytes {
            return Outcome::Incident(Incident {
                kind: IncidentKind::OversizedEvent,
                commit_lsn: Some(tx.commit_lsn),
                tx_ordinal: Some(ordinal),
                rule: Some(self.name.to_string()),
                table: None,
                detail: format!(
                    "the message is {} bytes, over [source].max_event_bytes = {}",
                    content.len(),
                    tx.max_event_bytes
                ),
            });
        }
        let Ok(text) = std::str::from_utf8(content) else {
            return incident("the message content is not UTF-8".into());
        };
        let members = match canonical_members(text) {
            Ok(m) => m,
            Err(e) => return incident(format!("the message content is not a JSON object: {e}")),
        };
        let get = |k: &str| {
            members
                .iter()
                .find(|(name, _)| name == k)
                .map(|(_, v)| v.as_str())
        };
        let string = |k: &str| get(k).and_then(|v| serde_json::from_str::<String>(v).ok());
        let event_type = match string("type").map(|t| EventType::new(&t)) {
            Some(Ok(t)) => t,
            Some(Err(e)) => {
                return incident(format!(
                    "\"type\": {e}: start with a letter, then letters, digits, `.`, `_`, `-`"
                ));
            }
            None => return incident("\"type\" must be a string".into()),
        };
        let tenant = match string("tenant_id").map(TenantId::new) {
            Some(Ok(t)) => t,
            Some(Err(e)) => {
                return incident(format!(
                    "\"tenant_id\": {e}: use 1 to 128 characters without control characters"
                ));
            }
            None => return incident("\"tenant_id\" must be a string".into()),
        };
        let Some(data) = get("data") else {
            return incident("\"data\" is missing".into());
        };
        if let Some(declared) = &self.declared
            && let Err(why) = declared.check(event_type.as_str(), data)
        {
            return incident(why);
        }
        let object_id = string("object_id");
        if let Some(Err(problem)) = object_id.as_deref().map(check_object_id) {
            return incident(format!("\"object_id\": {problem}"));
        }
        let object_version = get("object_version")
            .filter(|v| *v != "null")
            .map(str::to_owned);
        if let Some(v) = &object_version
            && v.len() > MAX_OBJECT_VERSION_BYTES
        {
            return incident(format!(
                "\"object_version\" is {} bytes of JSON; at most {MAX_OBJECT_VERSION_BYTES} are allowed",
                v.len()
            ));
        }
        for (key, _) in &members {
            if !matches!(
                key.as_str(),
                "type" | "tenant_id" | "data" | "object_id" | "object_version"
            ) {
                return incident(format!("unknown member {key:?}"));
            }
        }
        EventParts {
            rule: &self.name,
            tenant,
            event_type,
            schema_version: self.schema_version,
            object_id,
            object_version,
            unavailable: Vec::new(),
        }
        .build(tx, ordinal, |w| w.raw_value(data))
    }
}
