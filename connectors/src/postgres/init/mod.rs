//! `walhook init`: a business schema read from the catalog ([`introspect`])
//! becomes a proposal ([`plan`]) that [`render`] writes as a commented
//! `walhook.toml` and an idempotent `walhook-setup.sql` with the
//! least-privilege roles.
//!
//! ```text
//!  pg_class, pg_attribute, pg_index ──introspect──▶ [TableShape]
//!        ──plan──▶ Plan { tables: [Proposal], skipped }
//!        ──render──▶ walhook.toml (a rule per table and operation, or an
//!                    outbox rule) + walhook-setup.sql (roles, grants,
//!                    publication, REPLICA IDENTITY, platform schema)
//! ```
//!
//! What it guesses, it says: a table without a tenant column gets a fixed
//! tenant and a `REVIEW` comment; a nullable tenant column is flagged; a
//! table without a primary key gets `REPLICA IDENTITY FULL` (else a
//! publication that publishes updates would make the producers' updates
//! fail).

use tokio_postgres::Client;

use super::error::CaptureError;

mod plan;
pub mod render;

pub use plan::{Delete, Plan, Proposal, ProposalKind, Skipped, TenantChoice, plan};

/// Which tables to read.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    /// `schema.table` (or `table` in `public`); empty: every table of
    /// [`Selection::schemas`].
    pub tables: Vec<String>,
    /// Schemas to read when no table is named; empty: every schema but the
    /// system ones and `walhook`.
    pub schemas: Vec<String>,
}

/// One column as the catalog describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnShape {
    /// Its name.
    pub name: String,
    /// Its type as SQL writes it (`format_type`), for comments.
    pub type_name: String,
    /// The base type's name (`jsonb`, `text`, `int8`, …), domains resolved.
    pub base_type: String,
    /// `NOT NULL`.
    pub not_null: bool,
}

/// One table as the catalog describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableShape {
    /// Its schema.
    pub schema: String,
    /// Its name.
    pub name: String,
    /// The columns pgoutput sends (generated columns left out), in order.
    pub columns: Vec<ColumnShape>,
    /// The primary key's columns, in key order (empty: none).
    pub primary_key: Vec<String>,
    /// The replica identity's columns when it uses an index (`'i'`).
    pub identity_index: Vec<String>,
    /// `relreplident`: `d`, `n`, `f` or `i`.
    pub replica_identity: u8,
    /// A partitioned table (its partitions publish under its name).
    pub partitioned: bool,
    /// A partition of another table, named here.
    pub partition_of: Option<String>,
    /// `UNLOGGED` (its changes are not in the WAL).
    pub unlogged: bool,
}

impl TableShape {
    /// `schema.table`, unquoted.
    pub fn qualified(&self) -> String {
        format!("{}.{}", self.schema, self.name)
    }

    /// The columns the WAL carries for a delete (and old values of an
    /// update) under the current replica identity; `None` means all.
    pub fn identity_columns(&self) -> Option<Vec<String>> {
        match self.replica_identity {
            b'f' => None,
            b'i' => Some(self.identity_index.clone()),
            b'n' => Some(Vec::new()),
            _ => Some(self.primary_key.clone()),
        }
    }

    /// The column named `name`.
    pub fn column(&self, name: &str) -> Option<&ColumnShape> {
        self.columns.iter().find(|c| c.name == name)
    }
}

/// Reads the tables `selection` names, sorted by schema and name. A named
/// table that does not exist is an error naming it.
pub async fn introspect(
    client: &Client,
    selection: &Selection,
) -> Result<Vec<TableShape>, CaptureError> {
    let named: Vec<(String, String)> = selection
        .tables
        .iter()
        .map(|t| super::config::split_table(t))
        .collect();
    let rows = client
        .query(
            "SELECT c.oid::int8, n.nspname::text, c.relname::text, c.relkind::text, \
                    c.relpersistence::text, c.relreplident::text, \
                    (SELECT pn.nspname || '.' || p.relname FROM pg_inherits h \
                       JOIN pg_class p ON p.oid = h.inhparent \
                       JOIN pg_namespace pn ON pn.oid = p.relnamespace \
                      WHERE h.inhrelid = c.oid AND c.relispartition) \
               FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
              WHERE c.relkind IN ('r', 'p') \
                AND n.nspname NOT IN ('pg_catalog', 'information_schema', 'walhook') \
                AND n.nspname NOT LIKE 'pg\\_toast%' AND n.nspname NOT LIKE 'pg\\_temp%' \
                AND c.relpersistence <> 't' \
              ORDER BY 2, 3",
            &[],
        )
        .await
        .map_err(CaptureError::query("list the tables"))?;
    let mut shapes = Vec::new();
    for row in rows {
        let schema: String = row.get(1);
        let name: String = row.get(2);
        let wanted = if !named.is_empty() {
            named.iter().any(|(s, t)| *s == schema && *t == name)
        } else {
            selection.schemas.is_empty() || selection.schemas.contains(&schema)
        };
        if !wanted {
            continue;
        }
        let oid: i64 = row.get(0);
        let kind: String = row.get(3);
        let persistence: String = row.get(4);
        let identity: String = row.get(5);
        let mut shape = TableShape {
            schema,
            name,
            columns: Vec::new(),
            primary_key: Vec::new(),
            identity_index: Vec::new(),
            replica_identity: identity.bytes().next().unwrap_or(b'd'),
            partitioned: kind == "p",
            partition_of: row.get(6),
            unlogged: persistence == "u",
        };
        read_columns(client, oid, &mut shape).await?;
        shapes.push(shape);
    }
    for (schema, table) in &named {
        if !shapes
            .iter()
            .any(|s| s.schema == *schema && s.name == *table)
        {
            return Err(CaptureError::Definite(format!(
                "--tables names {schema}.{table}, which is not a table of this database \
                 (views, foreign and temporary tables cannot be captured)"
            )));
        }
    }
    Ok(shapes)
}

async fn read_columns(
    client: &Client,
    oid: i64,
    shape: &mut TableShape,
) -> Result<(), CaptureError> {
    let columns = client
        .query(
            "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod), \
                    coalesce(bt.typname, t.typname)::text, a.attnotnull \
               FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid \
               LEFT JOIN pg_type bt ON t.typtype = 'd' AND bt.oid = t.typbasetype \
              WHERE a.attrelid = $1::int8::oid AND a.attnum > 0 AND NOT a.attisdropped \
                AND a.attgenerated = '' \
              ORDER BY a.attnum",
            &[&oid],
        )
        .await
        .map_err(CaptureError::query("read a table's columns"))?;
    shape.columns = columns
        .iter()
        .map(|r| ColumnShape {
            name: r.get(0),
            type_name: r.get(1),
            base_type: r.get(2),
            not_null: r.get(3),
        })
        .collect();
    let keys = client
        .query(
            "SELECT i.indisprimary, i.indisreplident, \
                    array_agg(a.attname::text ORDER BY k.ord) \
               FROM pg_index i \
               CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord) \
               JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum \
              WHERE i.indrelid = $1::int8::oid AND (i.indisprimary OR i.indisreplident) \
              GROUP BY i.indexrelid, i.indisprimary, i.indisreplident",
            &[&oid],
        )
        .await
        .map_err(CaptureError::query("read a table's keys"))?;
    for k in keys {
        let columns: Vec<String> = k.get(2);
        if k.get::<_, bool>(0) {
            shape.primary_key = columns.clone();
        }
        if k.get::<_, bool>(1) {
            shape.identity_index = columns;
        }
    }
    Ok(())
}

/// `url` (a `postgres://` URL or libpq's `key=value` form) rewritten to log
/// in as `role` without a password, on `database` when given; with the
/// database's name. Other parameters (host, port, `sslmode`) are kept.
pub fn as_role(url: &str, role: &str, database: Option<&str>) -> Result<(String, String), String> {
    let rewritten = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let mut u = url::Url::parse(url).map_err(|e| format!("{e}"))?;
        u.set_username(role)
            .map_err(|()| "the URL cannot carry a user name".to_owned())?;
        u.set_password(None)
            .map_err(|()| "the URL cannot drop its password".to_owned())?;
        let kept: Vec<(String, String)> = u
            .query_pairs()
            .filter(|(k, _)| k != "password" && k != "user")
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        if kept.is_empty() {
            u.set_query(None);
        } else {
            u.query_pairs_mut().clear().extend_pairs(kept);
        }
        if let Some(db) = database {
            u.set_path(&format!("/{db}"));
        }
        u.to_string()
    } else {
        let mut parts = Vec::new();
        for part in url.split_whitespace() {
            let Some((k, _)) = part.split_once('=') else {
                return Err(format!("{part:?} is not key=value"));
            };
            match (k, database) {
                ("user" | "password", _) | ("dbname", Some(_)) => {}
                _ => parts.push(part.to_owned()),
            }
        }
        if let Some(db) = database {
            parts.push(format!("dbname={db}"));
        }
        parts.push(format!("user={role}"));
        parts.join(" ")
    };
    // The database's name as walhook reads the URL (percent-decoded; the
    // user's name when none is given).
    let parsed = walhook_pgtls::ConnectOptions::parse(
        &walhook_pgtls::DatabaseUrl::new(rewritten.clone()),
        "the URL",
        &walhook_pgtls::TlsFields::default(),
    )
    .map_err(|e| e.to_string())?;
    let db = parsed.config().get_dbname().unwrap_or(role).to_owned();
    Ok((rewritten, db))
}

#[cfg(test)]
mod url_tests {
    use super::as_role;

    #[test]
    fn a_url_gets_the_role_and_loses_the_password() {
        let (u, db) = as_role(
            "postgres://admin:s3cret@db.example:6432/shop?sslmode=verify-full&password=x",
            "walhook_source",
            None,
        )
        .unwrap();
        assert_eq!(
            u,
            "postgres://walhook_source@db.example:6432/shop?sslmode=verify-full"
        );
        assert_eq!(db, "shop");
        let (u, db) = as_role("postgres://admin@127.0.0.1/shop", "p", Some("walhook")).unwrap();
        assert_eq!(u, "postgres://p@127.0.0.1/walhook");
        assert_eq!(db, "walhook");
    }

    #[test]
    fn the_key_value_form_is_rewritten_too() {
        let (u, db) = as_role(
            "host=/tmp port=5433 user=admin password=x dbname=shop",
            "r",
            None,
        )
        .unwrap();
        assert_eq!(u, "host=/tmp port=5433 dbname=shop user=r");
        assert_eq!(db, "shop");
    }
}
