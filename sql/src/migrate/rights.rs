//! Whether the role walhook logs in as owns schema `walhook` and what is in
//! it: migrations alter the tables, fan-out creates day partitions and the
//! archive drops them, and each needs ownership. A schema migrated once as
//! another role (a superuser) is found here, with the statements that hand
//! it over (`walhook doctor`'s `platform.rights`).

use tokio_postgres::GenericClient;

use crate::StoreError;

/// The platform role's standing in schema `walhook`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rights {
    /// The role (`current_user`).
    pub role: String,
    /// It is a superuser (it may do anything; it should not need to).
    pub superuser: bool,
    /// It owns the schema (or the schema does not exist yet).
    pub owns_schema: bool,
    /// Tables, partitions and views in the schema owned by another role.
    pub foreign_relations: i64,
    /// Functions in the schema owned by another role.
    pub foreign_functions: i64,
}

impl Rights {
    /// Whether the role owns everything it must.
    pub fn owns_everything(&self) -> bool {
        self.owns_schema && self.foreign_relations == 0 && self.foreign_functions == 0
    }

    /// The SQL, for a superuser on the platform database, that gives the
    /// schema and everything in it to the role (partitions after their
    /// parents).
    pub fn fix_sql(&self) -> String {
        let ident = format!("\"{}\"", self.role.replace('"', "\"\""));
        let literal = format!("'{}'", self.role.replace('\'', "''"));
        format!(
            "ALTER SCHEMA walhook OWNER TO {ident}; \
             DO $$ DECLARE r record; BEGIN \
             FOR r IN SELECT c.oid::regclass AS t FROM pg_class c \
             WHERE c.relnamespace = 'walhook'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm') \
             ORDER BY c.relispartition LOOP \
             EXECUTE format('ALTER TABLE %s OWNER TO %I', r.t, {literal}); END LOOP; \
             FOR r IN SELECT f.oid::regprocedure AS f FROM pg_proc f \
             WHERE f.pronamespace = 'walhook'::regnamespace LOOP \
             EXECUTE format('ALTER FUNCTION %s OWNER TO %I', r.f, {literal}); END LOOP; END $$;"
        )
    }
}

/// Reads the role's standing, changing nothing.
pub async fn rights<C: GenericClient>(client: &C) -> Result<Rights, StoreError> {
    let row = client
        .query_one(
            "SELECT current_user::text, r.rolsuper, n.oid IS NULL OR n.nspowner = r.oid, \
                    (SELECT count(*) FROM pg_class c WHERE c.relnamespace = n.oid \
                        AND c.relkind IN ('r', 'p', 'v', 'm') AND c.relowner <> r.oid), \
                    (SELECT count(*) FROM pg_proc f \
                        WHERE f.pronamespace = n.oid AND f.proowner <> r.oid) \
               FROM pg_roles r LEFT JOIN pg_namespace n ON n.nspname = 'walhook' \
              WHERE r.rolname = current_user",
            &[],
        )
        .await
        .map_err(StoreError::query("read the platform role's rights"))?;
    Ok(Rights {
        role: row.get(0),
        superuser: row.get(1),
        owns_schema: row.get(2),
        foreign_relations: row.get(3),
        foreign_functions: row.get(4),
    })
}
