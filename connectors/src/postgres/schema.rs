//! JSON Schemas of table rules' events, derived from the rule's columns and
//! their Postgres types (after [`super::types`] mapped domains and arrays),
//! so that a customer can validate every payload with a standard validator.
//!
//! | column type | schema of its value |
//! |---|---|
//! | `bool` | boolean |
//! | `int2`, `int4`, `int8`, `oid` | integer |
//! | `numeric`, `float4`, `float8` | number, or the strings `NaN`, `Infinity`, `-Infinity` |
//! | `json`, `jsonb` | any JSON |
//! | `bytea` | string, base64 |
//! | `timestamp`, `timestamptz` | string (RFC 3339 UTC, or `infinity` / a BC date as Postgres prints it) |
//! | arrays | arrays of the element's schema (inner arrays of more dimensions as arrays) |
//! | anything else | string |
//!
//! Every column may be null. A change of the columns a rule sends (a column
//! added, dropped or retyped) is a new shape: its fingerprint differs, and
//! the catalog gives it the next schema version.

use serde_json::{Value, json};

use super::value::{array_element, oid};

/// The schema of one column's value (null allowed).
fn column_schema(type_oid: u32) -> Value {
    let scalar = |t: u32| -> Value {
        match t {
            oid::BOOL => json!({"type": "boolean"}),
            oid::INT2 | oid::INT4 | oid::INT8 | oid::OID => json!({"type": "integer"}),
            oid::NUMERIC | oid::FLOAT4 | oid::FLOAT8 => json!({"anyOf": [
                {"type": "number"},
                {"enum": ["NaN", "Infinity", "-Infinity"]}
            ]}),
            oid::JSON | oid::JSONB => json!({}),
            oid::BYTEA => json!({"type": "string", "contentEncoding": "base64"}),
            oid::TIMESTAMP | oid::TIMESTAMPTZ => {
                json!({"type": "string", "description": "RFC 3339 in UTC, or infinity / a BC date as Postgres prints it"})
            }
            _ => json!({"type": "string"}),
        }
    };
    let nullable = |v: Value| json!({"anyOf": [v, {"type": "null"}]});
    match array_element(type_oid) {
        // Elements may be null; arrays of more dimensions nest (their inner
        // arrays are checked as arrays).
        Some(element) => json!({"anyOf": [
            {"type": "array", "items": {"anyOf": [nullable(scalar(element)), {"type": "array"}]}},
            {"type": "null"}
        ]}),
        None => nullable(scalar(type_oid)),
    }
}

/// A fingerprint of the columns a rule sends: equal shapes, equal
/// fingerprints.
pub fn fingerprint(columns: &[(String, u32)]) -> String {
    let mut text = String::new();
    for (name, type_oid) in columns {
        text.push_str(name);
        text.push(':');
        text.push_str(&type_oid.to_string());
        text.push(';');
    }
    text
}

/// The JSON Schema (draft 2020-12) of an event of `event_type`, schema
/// `version`, whose `data` holds `columns` (name, type) and nothing else.
pub fn event_schema(event_type: &str, version: u32, columns: &[(String, u32)]) -> Value {
    let mut data = serde_json::Map::new();
    for (name, type_oid) in columns {
        data.insert(name.clone(), column_schema(*type_oid));
    }
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": format!("{event_type} v{version}"),
        "type": "object",
        "required": ["data", "id", "object_id", "object_version", "occurred_at", "schema_version", "tenant_id", "type"],
        "additionalProperties": false,
        "properties": {
            "data": {
                "type": "object",
                "properties": data,
                "additionalProperties": false
            },
            "id": {"type": "string", "pattern": "^evt_[0-9a-z]{26}$"},
            "object_id": {"type": ["string", "null"]},
            "object_version": {"type": ["integer", "null"]},
            "occurred_at": {"type": "string", "format": "date-time"},
            "schema_version": {"const": version},
            "tenant_id": {"type": "string"},
            "type": {"const": event_type},
            "unavailable": {
                "description": "Columns left out of data: unchanged TOASTed values the WAL did not carry",
                "type": "array",
                "items": {"type": "string"}
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_map_to_their_json_types() {
        let s = event_schema(
            "invoice.paid",
            2,
            &[("amount".into(), oid::NUMERIC), ("tags".into(), 1009)],
        );
        assert_eq!(s["properties"]["schema_version"]["const"], 2);
        assert_eq!(s["properties"]["type"]["const"], "invoice.paid");
        let amount = &s["properties"]["data"]["properties"]["amount"];
        assert_eq!(amount["anyOf"][1]["type"], "null");
        let tags = &s["properties"]["data"]["properties"]["tags"];
        assert_eq!(tags["anyOf"][0]["type"], "array");
        assert_ne!(
            fingerprint(&[("a".into(), oid::INT4)]),
            fingerprint(&[("a".into(), oid::INT8)])
        );
    }
}
