//! Secrets exist in plaintext only in the one response that shows them:
//! after endpoints are created, secrets rotated and API keys issued under
//! `Idempotency-Key` (and each request repeated), no table of schema
//! `walhook` holds a `whsec_` secret, an API key or the operator token.

use serde_json::json;

use crate::support::{Api, OPERATOR};

/// Every row of every table of schema `walhook` as text; `bytea` columns
/// decoded with `encode(…, 'escape')`, so JSON stored as bytes (the
/// idempotency records) reads as the JSON it is.
async fn dump(api: &Api) -> String {
    let columns = api
        .sql
        .query(
            "SELECT c.table_name::text, c.column_name::text, c.data_type::text \
             FROM information_schema.columns c JOIN information_schema.tables t \
               ON t.table_schema = c.table_schema AND t.table_name = c.table_name \
             WHERE c.table_schema = 'walhook' AND t.table_type = 'BASE TABLE' \
             ORDER BY c.table_name, c.ordinal_position",
            &[],
        )
        .await
        .unwrap();
    let mut tables: Vec<(String, Vec<String>)> = Vec::new();
    for row in &columns {
        let (table, column, kind): (String, String, String) = (row.get(0), row.get(1), row.get(2));
        let expr = if kind == "bytea" {
            format!("coalesce(encode(\"{column}\", 'escape'), '')")
        } else {
            format!("coalesce(\"{column}\"::text, '')")
        };
        match tables.last_mut() {
            Some((t, exprs)) if *t == table => exprs.push(expr),
            _ => tables.push((table, vec![expr])),
        }
    }
    assert!(
        tables.iter().any(|(t, _)| t == "idempotency_keys"),
        "{tables:?}"
    );
    let mut out = String::new();
    for (table, exprs) in &tables {
        let sql = format!(
            "SELECT concat_ws(' | ', {}) FROM walhook.\"{table}\"",
            exprs.join(", ")
        );
        for row in api.sql.query(&sql, &[]).await.unwrap() {
            out.push_str(table);
            out.push_str(": ");
            out.push_str(&row.get::<_, String>(0));
            out.push('\n');
        }
    }
    out
}

#[tokio::test]
async fn no_secret_is_stored_in_plaintext() {
    let api = Api::start().await;
    let key = api.tenant("acme").await;
    let mut shown = vec![OPERATOR.to_owned(), key.clone()];

    // Each request twice with the same key: the first shows the secret, the
    // replay says it is withheld.
    let create = json!({"url": "https://hooks.example.com/a", "event_types": ["invoice.paid"]});
    let first = api
        .post_with_key(&key, "/v1/webhook-endpoints", "ep-1", create.clone())
        .await;
    assert_eq!(first.status, 201, "{first:?}");
    let secret = first.body["secret"].as_str().unwrap().to_owned();
    assert!(secret.starts_with("whsec_"));
    assert_eq!(first.body["secret_withheld"], false);
    let again = api
        .post_with_key(&key, "/v1/webhook-endpoints", "ep-1", create)
        .await;
    assert_eq!(again.status, 201, "{again:?}");
    assert_eq!(again.headers["idempotent-replayed"], "true");
    assert_eq!(again.body["endpoint"], first.body["endpoint"]);
    assert!(again.body["secret"].is_null(), "{again:?}");
    assert_eq!(again.body["secret_withheld"], true);
    let note = again.body["note"].as_str().unwrap();
    assert!(note.contains("rotate-secret"), "{note}");
    shown.push(secret);

    let ep = first.body["endpoint"]["id"].as_str().unwrap();
    let path = format!("/v1/webhook-endpoints/{ep}/rotate-secret");
    let rotated = api
        .post_with_key(&key, &path, "rot-1", json!({"overlap_seconds": 60}))
        .await;
    assert_eq!(rotated.status, 200, "{rotated:?}");
    let new_secret = rotated.body["secret"].as_str().unwrap().to_owned();
    let rotated_again = api
        .post_with_key(&key, &path, "rot-1", json!({"overlap_seconds": 60}))
        .await;
    assert_eq!(rotated_again.status, 200);
    assert!(rotated_again.body["secret"].is_null(), "{rotated_again:?}");
    assert_eq!(rotated_again.body["secret_withheld"], true);
    assert_eq!(
        rotated_again.body["secret_version"],
        rotated.body["secret_version"]
    );
    shown.push(new_secret);

    let keys = "/v1/tenants/acme/api-keys";
    let issued = api
        .post_with_key(OPERATOR, keys, "key-1", json!({"name": "ci"}))
        .await;
    assert_eq!(issued.status, 201, "{issued:?}");
    let api_key = issued.body["key"].as_str().unwrap().to_owned();
    let issued_again = api
        .post_with_key(OPERATOR, keys, "key-1", json!({"name": "ci"}))
        .await;
    assert_eq!(issued_again.body["api_key"], issued.body["api_key"]);
    assert!(issued_again.body["key"].is_null(), "{issued_again:?}");
    assert_eq!(issued_again.body["key_withheld"], true);
    shown.push(api_key);

    // The replays themselves showed nothing secret.
    for replay in [&again, &rotated_again, &issued_again] {
        let text = replay.body.to_string();
        assert!(!text.contains("whsec_"), "{text}");
        for s in &shown {
            assert!(
                !text.contains(s.as_str()),
                "a replay shows a secret: {text}"
            );
        }
    }

    let dump = dump(&api).await;
    assert!(
        dump.contains("idempotency_keys: "),
        "the records are in the dump:\n{dump}"
    );
    assert!(
        !dump.contains("whsec_"),
        "a whsec_ secret is stored:\n{dump}"
    );
    for s in &shown {
        // The secret's key material alone (without the prefix) too.
        let material = s.trim_start_matches("whsec_");
        assert!(
            !dump.contains(material),
            "a secret shown once is stored in plaintext:\n{dump}"
        );
    }
}
