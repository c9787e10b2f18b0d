//! The `[source]` section and `[[rules]]` checked without a database: valid
//! rules pass, bad ones name their field, unknown fields are refused.

use super::{RuleConfig, SourceConfig};

fn rule(toml_text: &str) -> RuleConfig {
    toml::from_str(toml_text).unwrap()
}

fn source() -> SourceConfig {
    toml::from_str(r#"url = "postgres://u@127.0.0.1/db""#).unwrap()
}

#[test]
fn channel_binding_require_needs_verify_full_for_the_stream() {
    let with = |url: &str| {
        toml::from_str::<SourceConfig>(&format!("url = {url:?}"))
            .unwrap()
            .connect_options()
    };
    with("postgres://u@db.example.com/db?channel_binding=prefer").unwrap();
    with("postgres://u@db.example.com/db?channel_binding=require&sslmode=verify-full").unwrap();
    let err = with("postgres://u:pw@db.example.com/db?channel_binding=require&sslmode=require")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("[source].url sets channel_binding=require")
            && err.contains("pgwire-replication")
            && err.contains("sslmode=verify-full"),
        "{err}"
    );
}

#[test]
fn valid_rules_pass() {
    let rules = vec![
        rule(
            r#"name = "paid"
            table = "public.invoices"
            operations = ["update"]
            when = [{ column = "status", changed_to = "paid" }, { column = "amount", in = [1, 2] }]
            event_type = "invoice.paid"
            tenant_column = "tenant_id"
            object_version = "lsn""#,
        ),
        rule(
            r#"name = "outbox"
            kind = "outbox"
            table = "outbox"
            type_column = "type"
            payload_column = "payload"
            tenant_column = "tenant"
            event_types = ["order.shipped", "order.returned"]"#,
        ),
        rule(
            r#"name = "msgs"
            kind = "message"
            prefix = "app""#,
        ),
    ];
    source().validate(&rules).unwrap();
}

#[test]
fn bad_rules_name_the_field() {
    let cases = [
        (
            r#"name = "a"
            table = "t"
            event_type = "x.y""#,
            "tenant_column",
        ),
        (
            r#"name = "a"
            table = "t"
            tenant_column = "t"
            event_type = "x.y"
            event_types = ["x.z"]"#,
            "event_types",
        ),
        (
            r#"name = "m"
            kind = "message"
            prefix = "app"
            event_types = ["ok.type", "2bad"]"#,
            "event_types[1]",
        ),
        (
            r#"name = "a"
            table = "t"
            tenant_column = "t"
            event_type = "1bad""#,
            "event_type",
        ),
        (
            r#"name = "a"
            table = "t"
            tenant_column = "t"
            event_type = "x"
            when = [{ column = "s", equals = 1, in = [2] }]"#,
            "when[0]",
        ),
        (
            r#"name = "a"
            table = "t"
            tenant_column = "t"
            event_type = "x"
            include = ["a"]
            exclude = ["b"]"#,
            "include",
        ),
        (
            r#"name = "a"
            kind = "message""#,
            "prefix",
        ),
        (
            r#"name = "a"
            table = "t"
            tenant_column = "t"
            event_type = "x"
            object_version = "xmin""#,
            "object_version",
        ),
        (
            r#"name = "a b"
            kind = "message"
            prefix = "p""#,
            "name",
        ),
    ];
    for (text, field) in cases {
        let err = source().validate(&[rule(text)]).unwrap_err();
        assert_eq!(err.field, field, "{err}");
    }
    let dup = rule(
        r#"name = "m"
        kind = "message"
        prefix = "p""#,
    );
    assert_eq!(
        source().validate(&[dup.clone(), dup]).unwrap_err().field,
        "name"
    );
}

#[test]
fn unknown_fields_are_refused() {
    let err = toml::from_str::<RuleConfig>(
        r#"name = "a"
        tabel = "t""#,
    )
    .unwrap_err();
    assert!(err.to_string().contains("tabel"), "{err}");
}

#[test]
fn a_fixed_tenant_or_a_tenant_column_exactly_one() {
    let base = r#"name = "c"
        table = "currencies"
        event_type = "currency.changed""#;
    let check = |extra: &str| {
        source()
            .validate(&[rule(&format!("{base}\n{extra}"))])
            .map_err(|e| e.to_string())
    };
    check(r#"tenant = "default""#).unwrap();
    check(r#"tenant_column = "tenant_id""#).unwrap();
    let neither = check("").unwrap_err();
    assert!(
        neither.contains("tenant_column") && neither.contains("tenant = "),
        "{neither}"
    );
    let both = check("tenant = \"a\"\ntenant_column = \"t\"").unwrap_err();
    assert!(both.contains("not both"), "{both}");
    let bad = check("tenant = \"\"").unwrap_err();
    assert!(
        bad.contains("rule \"c\"") && bad.contains("tenant"),
        "{bad}"
    );
    let message = source()
        .validate(&[rule(
            "name = \"m\"\nkind = \"message\"\nprefix = \"p\"\ntenant = \"a\"",
        )])
        .unwrap_err()
        .to_string();
    assert!(message.contains("tenant"), "{message}");
}

#[test]
fn a_composite_object_id_names_each_column_once() {
    let base = r#"name = "lines"
        table = "order_lines"
        event_type = "line.changed"
        tenant_column = "tenant_id""#;
    let check = |extra: &str| {
        source()
            .validate(&[rule(&format!("{base}\n{extra}"))])
            .map_err(|e| e.to_string())
    };
    check(r#"object_id_column = ["order_id", "line_no"]"#).unwrap();
    check(r#"object_id_column = "id""#).unwrap();
    for bad in [
        r#"object_id_column = []"#,
        r#"object_id_column = ["a", "a"]"#,
    ] {
        let e = check(bad).unwrap_err();
        assert!(e.contains("object_id_column"), "{bad}: {e}");
    }
}
