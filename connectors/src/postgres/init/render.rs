//! A [`Plan`] written out: the commented `walhook.toml` ([`config_toml`])
//! and the idempotent `walhook-setup.sql` ([`setup_sql`]).

use std::fmt::Write as _;

use super::plan::{Delete, Plan, Proposal, ProposalKind, TenantChoice};
use crate::postgres::catalog::quote_ident;

/// The names the two files share.
#[derive(Debug, Clone)]
pub struct Targets {
    /// `[source] url`: the captured database as the source role, no password.
    pub source_url: String,
    /// `[platform] url`: the platform database as the platform role.
    pub platform_url: String,
    /// The captured database's name (for comments).
    pub source_database: String,
    /// The platform database's name.
    pub platform_database: String,
    /// `[source] name`.
    pub source_name: String,
    /// The slot.
    pub slot: String,
    /// The publication.
    pub publication: String,
    /// The role capture logs in as.
    pub source_role: String,
    /// The role that owns schema `walhook`.
    pub platform_role: String,
    /// `[secrets] master_key_file`, relative to the config's folder.
    pub master_key_file: String,
}

/// A TOML basic string.
pub fn toml_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04X}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn toml_list(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|s| toml_str(s)).collect();
    format!("[{}]", quoted.join(", "))
}

/// An SQL string literal.
fn sql_literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

fn qualified(p: &Proposal) -> String {
    format!(
        "{}.{}",
        quote_ident(&p.table.schema),
        quote_ident(&p.table.name)
    )
}

/// The commented `walhook.toml`.
pub fn config_toml(plan: &Plan, t: &Targets) -> String {
    let mut out = String::new();
    let w = &mut out;
    let _ = writeln!(
        w,
        "# walhook.toml, written by `walhook init` from the tables of database {:?}.\n\
         # Read every comment marked REVIEW, then:\n\
         #   1. apply walhook-setup.sql as a superuser (roles, grants, publication,\n\
         #      replica identity, the platform schema): psql -v ON_ERROR_STOP=1 -f walhook-setup.sql\n\
         #   2. set the roles' passwords and pass the URLs in WALHOOK_SOURCE_URL and\n\
         #      WALHOOK_PLATFORM_URL rather than in this file\n\
         #   3. walhook migrate --config walhook.toml\n\
         #   4. walhook doctor --config walhook.toml   (every precondition, with its fix)\n\
         #   5. walhook run --config walhook.toml\n\
         # Every setting not written here keeps its default: walhook.example.toml\n\
         # lists them all.",
        t.source_database
    );
    let _ = writeln!(
        w,
        "\n[platform]\n\
         # The platform database (schema `walhook`), as the role that owns the schema.\n\
         url = {}\n\
         \n[source]\n\
         # The captured database, as the source role (REPLICATION, SELECT on the\n\
         # published tables only).\n\
         url = {}\n\
         # Part of every event id: never change it once events flowed.\n\
         name = {}\n\
         slot = {}\n\
         publication = {}\n\
         # The source role may create its slot (REPLICATION); the publication is\n\
         # made by walhook-setup.sql, which owns the tables' rights.\n\
         create_slot = true\n\
         create_publication = false\n\
         \n[secrets]\n\
         # Seals the endpoints' signing secrets; `walhook init` wrote one when it was\n\
         # missing. Keep it readable by walhook only, and back it up.\n\
         master_key_file = {}",
        toml_str(&t.platform_url),
        toml_str(&t.source_url),
        toml_str(&t.source_name),
        toml_str(&t.slot),
        toml_str(&t.publication),
        toml_str(&t.master_key_file),
    );
    if !plan.skipped.is_empty() {
        let _ = writeln!(w, "\n# Tables without rules:");
        for s in &plan.skipped {
            let _ = writeln!(w, "#   {}: {}", s.table, s.why);
        }
    }
    for p in &plan.tables {
        rules_of(w, p);
    }
    out
}

fn rules_of(w: &mut String, p: &Proposal) {
    let table = &p.table;
    let key = if table.primary_key.is_empty() {
        "no primary key".to_owned()
    } else {
        format!("primary key ({})", table.primary_key.join(", "))
    };
    let _ = writeln!(
        w,
        "\n# ── {} ({} columns, {key}{})",
        table.qualified(),
        table.columns.len(),
        if table.partitioned {
            ", partitioned"
        } else {
            ""
        }
    );
    for r in &p.review {
        let _ = writeln!(w, "# {r}");
    }
    let tenant = match &p.tenant {
        TenantChoice::Column { name, .. } => format!("tenant_column = {}", toml_str(name)),
        TenantChoice::Fixed(tenant) => format!("tenant = {}", toml_str(tenant)),
    };
    let object_id = match p.object_id.as_slice() {
        [] => None,
        [one] => Some(format!("object_id_column = {}", toml_str(one))),
        many => Some(format!("object_id_column = {}", toml_list(many))),
    };
    let common = |w: &mut String| {
        let _ = writeln!(w, "table = {}", toml_str(&table.qualified()));
        let _ = writeln!(w, "{tenant}");
        if let Some(o) = &object_id {
            let _ = writeln!(w, "{o}");
            let _ = writeln!(w, "object_version = \"lsn\"");
        }
    };
    match &p.kind {
        ProposalKind::Outbox {
            type_column,
            payload_column,
        } => {
            let _ = writeln!(
                w,
                "# An outbox: each inserted row is one event whose type is {type_column:?} and \
                 whose data is {payload_column:?}.\n\
                 # List the types the producer writes in event_types, so that endpoints can\n\
                 # subscribe before the first row."
            );
            let _ = writeln!(w, "[[rules]]\nname = {}", toml_str(&p.rule_base));
            let _ = writeln!(w, "kind = \"outbox\"");
            common(w);
            let _ = writeln!(w, "type_column = {}", toml_str(type_column));
            let _ = writeln!(w, "payload_column = {}", toml_str(payload_column));
            let _ = writeln!(w, "# event_types = []");
        }
        ProposalKind::Rows { delete } => {
            for (op, past) in [
                ("insert", "created"),
                ("update", "updated"),
                ("delete", "deleted"),
            ] {
                let _ = writeln!(
                    w,
                    "[[rules]]\nname = {}\noperations = [\"{op}\"]\nevent_type = {}",
                    toml_str(&format!("{}_{past}", p.rule_base)),
                    toml_str(&format!("{}.{past}", p.type_base)),
                );
                common(w);
                if op == "delete"
                    && let Delete::Key(columns) = delete
                {
                    let _ = writeln!(
                        w,
                        "# A delete carries the replica identity's columns only.\ninclude = {}",
                        toml_list(columns)
                    );
                }
            }
        }
    }
}

/// The idempotent `walhook-setup.sql`, for psql: [`source_setup_sql`]
/// then [`platform_setup_sql`].
pub fn setup_sql(plan: &Plan, t: &Targets) -> String {
    source_setup_sql(plan, t) + &platform_setup_sql(t)
}

/// The captured database's part: the source role, its grants, the replica
/// identities and the publication.
pub fn source_setup_sql(plan: &Plan, t: &Targets) -> String {
    let mut out = String::new();
    let w = &mut out;
    let source = quote_ident(&t.source_role);
    let _ = writeln!(
        w,
        "-- walhook-setup.sql, written by `walhook init`: the least-privilege roles,\n\
         -- the publication and the replica identities its rules need, and the\n\
         -- platform database. Idempotent: run it again after adding tables.\n\
         -- Run it as a superuser, connected to the captured database {db}:\n\
         --   psql \"postgres://ADMIN@HOST:PORT/{db}\" -v ON_ERROR_STOP=1 -f walhook-setup.sql\n\
         \\set ON_ERROR_STOP on\n\
         \n\
         -- 1. The source role: REPLICATION (to stream changes and create its slot)\n\
         --    and SELECT on the published tables, nothing else. Set its password\n\
         --    with \\password {role} and pass it in WALHOOK_SOURCE_URL.\n\
         DO $$\n\
         BEGIN\n\
         \x20 IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = {role_lit}) THEN\n\
         \x20   CREATE ROLE {source} LOGIN REPLICATION;\n\
         \x20 ELSE\n\
         \x20   ALTER ROLE {source} LOGIN REPLICATION;\n\
         \x20 END IF;\n\
         END $$;",
        db = t.source_database,
        role = t.source_role,
        role_lit = sql_literal(&t.source_role),
    );
    let mut schemas: Vec<&str> = plan
        .tables
        .iter()
        .map(|p| p.table.schema.as_str())
        .collect();
    schemas.dedup();
    for s in &schemas {
        let _ = writeln!(w, "GRANT USAGE ON SCHEMA {} TO {source};", quote_ident(s));
    }
    for p in &plan.tables {
        let _ = writeln!(w, "GRANT SELECT ON TABLE {} TO {source};", qualified(p));
    }

    let full: Vec<&Proposal> = plan.tables.iter().filter(|p| p.set_full_identity).collect();
    if !full.is_empty() {
        let _ = writeln!(
            w,
            "\n-- 2. REPLICA IDENTITY FULL where the rules read more than the key (see the\n\
             --    REVIEW notes in walhook.toml). It takes a short ACCESS EXCLUSIVE lock,\n\
             --    and each update or delete then writes the whole old row to the WAL.\n\
             --    A partitioned table's partitions get it too (new partitions need it\n\
             --    when they are attached)."
        );
        for p in full {
            if p.table.partitioned {
                let _ = writeln!(
                    w,
                    "DO $$\nDECLARE r regclass;\nBEGIN\n  FOR r IN SELECT relid FROM pg_partition_tree({}::regclass) LOOP\n    EXECUTE format('ALTER TABLE %s REPLICA IDENTITY FULL', r);\n  END LOOP;\nEND $$;",
                    sql_literal(&qualified(p))
                );
            } else {
                let _ = writeln!(w, "ALTER TABLE {} REPLICA IDENTITY FULL;", qualified(p));
            }
        }
    }

    let publication = quote_ident(&t.publication);
    let tables: Vec<String> = plan
        .tables
        .iter()
        .map(|p| sql_literal(&qualified(p)))
        .collect();
    let _ = writeln!(
        w,
        "\n-- 3. The publication walhook reads: the tables above, added when missing.\n\
         --    Partitioned tables publish under their own name.\n\
         DO $$\n\
         BEGIN\n\
         \x20 IF NOT EXISTS (SELECT FROM pg_publication WHERE pubname = {pub_lit}) THEN\n\
         \x20   CREATE PUBLICATION {publication} WITH (publish_via_partition_root = true);\n\
         \x20 END IF;\n\
         END $$;",
        pub_lit = sql_literal(&t.publication)
    );
    if !tables.is_empty() {
        let _ = writeln!(
            w,
            "DO $$\n\
             DECLARE t text;\n\
             BEGIN\n\
             \x20 IF (SELECT puballtables FROM pg_publication WHERE pubname = {pub_lit}) THEN\n\
             \x20   RETURN;\n\
             \x20 END IF;\n\
             \x20 FOREACH t IN ARRAY ARRAY[{list}]::text[] LOOP\n\
             \x20   IF NOT EXISTS (SELECT FROM pg_publication_rel pr\n\
             \x20                    JOIN pg_publication p ON p.oid = pr.prpubid\n\
             \x20                   WHERE p.pubname = {pub_lit} AND pr.prrelid = t::regclass) THEN\n\
             \x20     EXECUTE format('ALTER PUBLICATION %I ADD TABLE %s', {pub_lit}, t);\n\
             \x20   END IF;\n\
             \x20 END LOOP;\n\
             END $$;",
            pub_lit = sql_literal(&t.publication),
            list = tables.join(",\n    "),
        );
    }

    out
}

/// The platform database's part: the platform role, the database when
/// missing, and schema `walhook` owned by the role. It connects to the
/// platform database (psql's `\\connect`).
pub fn platform_setup_sql(t: &Targets) -> String {
    let mut out = String::new();
    let w = &mut out;
    let platform = quote_ident(&t.platform_role);
    let _ = writeln!(
        w,
        "\n-- 4. The platform role, which owns the platform database's schema `walhook`\n\
         --    (walhook migrate creates the tables in it). Set its password with\n\
         --    \\password {prole} and pass it in WALHOOK_PLATFORM_URL. When the platform\n\
         --    database lives on another server, run this part there.\n\
         DO $$\n\
         BEGIN\n\
         \x20 IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = {prole_lit}) THEN\n\
         \x20   CREATE ROLE {platform} LOGIN;\n\
         \x20 END IF;\n\
         END $$;\n\
         SELECT format('CREATE DATABASE %I OWNER %I', {db_lit}, {prole_lit})\n\
         \x20WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = {db_lit}) \\gexec\n\
         \\connect {db_psql}\n\
         CREATE SCHEMA IF NOT EXISTS walhook AUTHORIZATION {platform};\n\
         GRANT CONNECT, TEMPORARY ON DATABASE {db_ident} TO {platform};",
        prole = t.platform_role,
        prole_lit = sql_literal(&t.platform_role),
        db_lit = sql_literal(&t.platform_database),
        db_ident = quote_ident(&t.platform_database),
        db_psql = sql_literal(&t.platform_database),
    );
    out
}
