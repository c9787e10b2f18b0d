//! A compiled table or outbox rule applied to a change: the operations and
//! conditions decide whether it fires; the tenant, object id and version,
//! and the payload (columns, or the outbox's JSON) make the event; a row
//! that cannot make one is an incident naming the rule and the table.

use walhook_pipeline::canonical::JsonWriter;
use walhook_pipeline::capture::{Incident, IncidentKind};
use walhook_pipeline::event::{EventType, check_object_id};
use walhook_pipeline::ids::TenantId;

use super::change::{Change, Rows, Val};
use super::compile::{CompiledRule, TenantSource, VersionSource};
use super::event::{EventParts, Outcome, TxContext};
use crate::postgres::value::{oid, write_text_value};

fn text_of(v: Val<'_>) -> Option<String> {
    match v {
        Val::Text(t) => Some(String::from_utf8_lossy(t).into_owned()),
        _ => None,
    }
}

/// The object id: one column's text, or a composite key's texts joined
/// ([`join_key`]). None when the rule names no column or a key column is
/// null.
fn object_id_of(columns: &[usize], rows: &Rows<'_, '_>) -> Option<String> {
    match columns {
        [] => None,
        [one] => text_of(rows.data(*one)),
        many => {
            let parts: Option<Vec<String>> = many.iter().map(|i| text_of(rows.data(*i))).collect();
            Some(join_key(&parts?))
        }
    }
}

/// A composite key's values joined by `:`, with `%` and `:` inside a value
/// written `%25` and `%3A`, so that two keys never make the same id.
fn join_key(parts: &[String]) -> String {
    let mut id = String::new();
    for (n, part) in parts.iter().enumerate() {
        if n > 0 {
            id.push(':');
        }
        for c in part.chars() {
            match c {
                '%' => id.push_str("%25"),
                ':' => id.push_str("%3A"),
                c => id.push(c),
            }
        }
    }
    id
}

impl CompiledRule {
    /// The row's tenant, or why it has none.
    fn tenant_of(&self, rows: &Rows<'_, '_>) -> Result<TenantId, String> {
        match &self.tenant {
            TenantSource::Fixed(t) => Ok(t.clone()),
            TenantSource::Column(i) => match rows.data(*i) {
                Val::Text(t) => TenantId::new(String::from_utf8_lossy(t))
                    .map_err(|e| format!("tenant column: {e}")),
                Val::Null => Err("the tenant column is null".into()),
                Val::Unknown => Err("the tenant column was not in the WAL".into()),
            },
        }
    }

    fn incident(
        &self,
        kind: IncidentKind,
        tx: &TxContext<'_>,
        ordinal: u32,
        detail: String,
    ) -> Outcome {
        Outcome::Incident(Incident {
            kind,
            commit_lsn: Some(tx.commit_lsn),
            tx_ordinal: Some(ordinal),
            rule: Some(self.name.to_string()),
            table: Some(self.table.clone()),
            detail,
        })
    }

    /// Applies the rule to the change at `ordinal` of transaction `tx`.
    pub fn apply(
        &self,
        change: Change<'_, '_>,
        keys: &[bool],
        tx: &TxContext<'_>,
        ordinal: u32,
    ) -> Outcome {
        if !self.ops.contains(&change.operation()) {
            return Outcome::Skip;
        }
        let rows = Rows { change, keys };
        for c in &self.conditions {
            match c.holds(&rows) {
                Some(true) => {}
                Some(false) => return Outcome::Skip,
                None => {
                    return self.incident(
                        IncidentKind::UndecidedCondition,
                        tx,
                        ordinal,
                        "a condition reads a value the WAL did not carry (unchanged TOAST); set \
                         REPLICA IDENTITY FULL on the table"
                            .into(),
                    );
                }
            }
        }
        let tenant = match self.tenant_of(&rows) {
            Ok(t) => t,
            Err(why) => return self.incident(IncidentKind::InvalidRow, tx, ordinal, why),
        };
        // Raw values bigger than an event may be are refused before any
        // envelope is built from them (memory stays bounded).
        let raw: usize = self
            .payload
            .iter()
            .map(|(_, i, _)| match rows.data(*i) {
                Val::Text(t) => t.len(),
                _ => 0,
            })
            .chain(self.outbox.map(|(_, p, _)| match rows.data(p) {
                Val::Text(t) => t.len(),
                _ => 0,
            }))
            .sum();
        if raw > tx.max_event_bytes {
            return self.incident(
                IncidentKind::OversizedEvent,
                tx,
                ordinal,
                format!(
                    "the row's payload values are {raw} bytes, over [source].max_event_bytes = {}; \
                     include fewer or smaller columns, or raise the limit",
                    tx.max_event_bytes
                ),
            );
        }
        let object_id = object_id_of(&self.object_id, &rows);
        if let Some(Err(problem)) = object_id.as_deref().map(check_object_id) {
            return self.incident(IncidentKind::InvalidRow, tx, ordinal, problem);
        }
        let object_version = match &self.version {
            None => None,
            Some(VersionSource::Lsn) => Some(tx.commit_lsn.0.to_string()),
            Some(VersionSource::Column(i)) => match rows.data(*i) {
                Val::Text(t) => {
                    let mut out = Vec::new();
                    write_text_value(&mut JsonWriter::new(&mut out), self.column_type(*i), t);
                    Some(String::from_utf8_lossy(&out).into_owned())
                }
                _ => None,
            },
        };
        let parts = |event_type: EventType, unavailable: Vec<String>| EventParts {
            rule: &self.name,
            tenant: tenant.clone(),
            event_type,
            schema_version: self.schema_version,
            object_id: object_id.clone(),
            object_version: object_version.clone(),
            unavailable,
        };
        match self.outbox {
            Some((type_index, payload_index, _)) => {
                let invalid = |detail: &str| {
                    self.incident(IncidentKind::InvalidRow, tx, ordinal, detail.into())
                };
                let Some(type_text) = text_of(rows.data(type_index)) else {
                    return invalid("the outbox type column is null");
                };
                let event_type = match EventType::new(&type_text) {
                    Ok(t) => t,
                    Err(e) => return invalid(&format!("outbox type: {e}")),
                };
                let Some(payload_text) = text_of(rows.data(payload_index)) else {
                    return invalid("the outbox payload is null or missing");
                };
                let mut data = Vec::new();
                if JsonWriter::new(&mut data)
                    .embedded_json(&payload_text)
                    .is_err()
                {
                    return invalid("the outbox payload is not JSON");
                }
                if let Some(declared) = &self.declared
                    && let Err(why) = declared.check(event_type.as_str(), &payload_text)
                {
                    return invalid(&why);
                }
                let data = String::from_utf8_lossy(&data).into_owned();
                parts(event_type, Vec::new()).build(tx, ordinal, |w| w.raw_value(&data))
            }
            None => {
                let Some(event_type) = self.event_type.clone() else {
                    return Outcome::Skip;
                };
                let unavailable: Vec<String> = self
                    .payload
                    .iter()
                    .filter(|(_, i, _)| rows.data(*i) == Val::Unknown)
                    .map(|(name, _, _)| name.clone())
                    .collect();
                parts(event_type, unavailable).build(tx, ordinal, |w| {
                    w.begin_object();
                    for (name, i, type_oid) in &self.payload {
                        match rows.data(*i) {
                            Val::Unknown => {}
                            Val::Null => {
                                w.key(name);
                                w.null();
                            }
                            Val::Text(t) => {
                                w.key(name);
                                write_text_value(w, *type_oid, t);
                            }
                        }
                    }
                    w.end_object();
                })
            }
        }
    }

    fn column_type(&self, index: usize) -> u32 {
        self.payload
            .iter()
            .find(|(_, i, _)| *i == index)
            .map_or(oid::TEXT, |(_, _, t)| *t)
    }
}
