//! Rules compiled against a sample table and applied to hand-made tuples:
//! replica identity checks, conditions, unchanged TOAST, deletes, and
//! message rules.

use walhook_pipeline::capture::IncidentKind;
use walhook_pipeline::ids::{EventId, Lsn};
use walhook_pipeline::time::Timestamp;

use super::{Change, ColumnInfo, MessageRule, Outcome, TableInfo, TxContext, compile};
use crate::postgres::config::RuleConfig;
use crate::postgres::pgoutput::{ColumnValue, OldTuple, TupleData};
use crate::postgres::value::oid;

fn table(identity: u8) -> TableInfo {
    let col = |name: &str, type_oid, key| ColumnInfo {
        name: name.into(),
        type_oid,
        key,
    };
    TableInfo {
        schema: "public".into(),
        name: "invoices".into(),
        replica_identity: identity,
        columns: vec![
            col("id", oid::INT8, true),
            col("tenant_id", oid::TEXT, false),
            col("status", oid::TEXT, false),
            col("amount", oid::NUMERIC, false),
            col("notes", oid::TEXT, false),
        ],
    }
}

fn rule(text: &str) -> RuleConfig {
    toml::from_str(text).unwrap()
}

const PAID: &str = r#"name = "paid"
    table = "invoices"
    operations = ["update"]
    when = [{ column = "status", changed_to = "paid" }]
    event_type = "invoice.paid"
    tenant_column = "tenant_id"
    object_id_column = "id"
    object_version = "lsn"
    exclude = ["notes"]"#;

fn tuple<'a>(values: &[Option<&'a str>]) -> TupleData<'a> {
    TupleData {
        columns: values
            .iter()
            .map(|v| match v {
                None => ColumnValue::Null,
                Some("<toast>") => ColumnValue::UnchangedToast,
                Some(s) => ColumnValue::Text(s.as_bytes()),
            })
            .collect(),
    }
}

const TX: TxContext<'static> = TxContext {
    source: "main",
    commit_lsn: Lsn(0x100),
    commit_time: Timestamp(0),
    max_event_bytes: 1 << 20,
};

#[test]
fn changed_to_needs_full_identity() {
    let err = compile(&rule(PAID), &table(b'd')).unwrap_err();
    assert_eq!(err.field, "when[0]");
    assert!(err.problem.contains("REPLICA IDENTITY FULL"), "{err}");
    compile(&rule(PAID), &table(b'f')).unwrap();
}

#[test]
fn unknown_columns_are_named() {
    let bad = PAID.replace("object_id_column = \"id\"", "object_id_column = \"nope\"");
    let err = compile(&rule(&bad), &table(b'f')).unwrap_err();
    assert_eq!(err.field, "object_id_column");
    assert!(
        err.problem.contains("\"nope\"") && err.problem.contains("tenant_id"),
        "{err}"
    );
}

#[test]
fn changed_to_fires_once() {
    let r = compile(&rule(PAID), &table(b'f')).unwrap();
    let keys = [true, true, true, true, true];
    let old = OldTuple::Full(tuple(&[
        Some("7"),
        Some("acme"),
        Some("open"),
        Some("10.50"),
        Some("n"),
    ]));
    let new = tuple(&[
        Some("7"),
        Some("acme"),
        Some("paid"),
        Some("10.50"),
        Some("<toast>"),
    ]);
    let Outcome::Event(e) = r.apply(
        Change::Update {
            old: Some(&old),
            new: &new,
        },
        &keys,
        &TX,
        3,
    ) else {
        panic!("no event")
    };
    assert_eq!(
        std::str::from_utf8(&e.payload).unwrap(),
        format!(
            r#"{{"data":{{"amount":10.50,"id":7,"status":"paid","tenant_id":"acme"}},"id":"{}","object_id":"7","object_version":256,"occurred_at":"1970-01-01T00:00:00.000000Z","schema_version":1,"tenant_id":"acme","type":"invoice.paid"}}"#,
            e.id
        )
    );
    assert_eq!(e.id, EventId::derive("main", Lsn(0x100), 3, "paid"));
    let again = OldTuple::Full(new.clone());
    assert!(matches!(
        r.apply(
            Change::Update {
                old: Some(&again),
                new: &new
            },
            &keys,
            &TX,
            4
        ),
        Outcome::Skip
    ));
}

#[test]
fn unchanged_toast_is_never_null() {
    let all = r#"name = "upd"
        table = "invoices"
        operations = ["update"]
        event_type = "invoice.updated"
        tenant_column = "tenant_id""#;
    let keys = [true, false, false, false, false];
    let new = tuple(&[
        Some("7"),
        Some("acme"),
        Some("open"),
        Some("1"),
        Some("<toast>"),
    ]);
    // DEFAULT identity: listed as unavailable, left out of data.
    let r = compile(&rule(all), &table(b'd')).unwrap();
    assert!(r.warnings.iter().any(|w| w.contains("notes")));
    let Outcome::Event(e) = r.apply(
        Change::Update {
            old: None,
            new: &new,
        },
        &keys,
        &TX,
        0,
    ) else {
        panic!()
    };
    let v: serde_json::Value = serde_json::from_slice(&e.payload).unwrap();
    assert!(v["data"].get("notes").is_none());
    assert_eq!(v["unavailable"], serde_json::json!(["notes"]));
    // FULL identity: taken from the old row.
    let r = compile(&rule(all), &table(b'f')).unwrap();
    let old = OldTuple::Full(tuple(&[
        Some("7"),
        Some("acme"),
        Some("open"),
        Some("1"),
        Some("long text"),
    ]));
    let Outcome::Event(e) = r.apply(
        Change::Update {
            old: Some(&old),
            new: &new,
        },
        &keys,
        &TX,
        0,
    ) else {
        panic!()
    };
    let v: serde_json::Value = serde_json::from_slice(&e.payload).unwrap();
    assert_eq!(v["data"]["notes"], "long text");
    assert!(v.get("unavailable").is_none());
}

#[test]
fn deletes_under_default_identity_need_key_columns() {
    let del = r#"name = "del"
        table = "invoices"
        operations = ["delete"]
        event_type = "invoice.deleted"
        tenant_column = "tenant_id"
        include = ["id"]"#;
    let err = compile(&rule(del), &table(b'd')).unwrap_err();
    assert_eq!(err.field, "tenant_column");
    let r = compile(&rule(del), &table(b'f')).unwrap();
    let old = OldTuple::Full(tuple(&[Some("7"), Some("acme"), None, None, None]));
    let Outcome::Event(e) = r.apply(Change::Delete { old: &old }, &[true; 5], &TX, 0) else {
        panic!()
    };
    assert!(
        std::str::from_utf8(&e.payload)
            .unwrap()
            .starts_with(r#"{"data":{"id":7},"#)
    );
}

#[test]
fn null_tenants_become_incidents() {
    let ins = r#"name = "ins"
        table = "invoices"
        operations = ["insert"]
        event_type = "invoice.created"
        tenant_column = "tenant_id""#;
    let r = compile(&rule(ins), &table(b'd')).unwrap();
    let new = tuple(&[Some("7"), None, None, None, None]);
    let Outcome::Incident(i) = r.apply(Change::Insert { new: &new }, &[true; 5], &TX, 0) else {
        panic!()
    };
    assert_eq!(i.kind, IncidentKind::InvalidRow);
}

#[test]
fn messages_carry_their_own_type_and_tenant() {
    let r = MessageRule::new(&rule(
        r#"name = "m"
        kind = "message"
        prefix = "app""#,
    ));
    let Outcome::Event(e) = r.apply(
        br#"{"type":"user.disabled","tenant_id":"acme","data":{"z":1,"a":2}}"#,
        &TX,
        2,
    ) else {
        panic!()
    };
    assert!(
        std::str::from_utf8(&e.payload)
            .unwrap()
            .starts_with(r#"{"data":{"a":2,"z":1},"#)
    );
    assert!(matches!(
        r.apply(br#"{"type":"x"}"#, &TX, 2),
        Outcome::Incident(_)
    ));
    assert!(matches!(r.apply(b"not json", &TX, 2), Outcome::Incident(_)));
}

#[test]
fn a_fixed_tenant_and_a_composite_key_that_stays_unambiguous() {
    let r = compile(
        &rule(
            r#"name = "lines"
            table = "invoices"
            operations = ["insert"]
            event_type = "invoice.line"
            tenant = "solo"
            object_id_column = ["status", "notes"]"#,
        ),
        &table(b'd'),
    )
    .unwrap();
    let id_of = |status: &str, notes: &str| {
        let new = tuple(&[
            Some("7"),
            Some("acme"),
            Some(status),
            Some("1"),
            Some(notes),
        ]);
        let Outcome::Event(e) = r.apply(Change::Insert { new: &new }, &[true; 5], &TX, 0) else {
            panic!("no event")
        };
        let body: serde_json::Value = serde_json::from_slice(&e.payload).unwrap();
        assert_eq!(
            body["tenant_id"], "solo",
            "the fixed tenant, not the column"
        );
        body["object_id"].as_str().unwrap().to_owned()
    };
    assert_eq!(id_of("a:b", "c"), "a%3Ab:c");
    assert_eq!(id_of("a", "b:c"), "a:b%3Ac");
    assert_eq!(id_of("50%", "x"), "50%25:x");
}
