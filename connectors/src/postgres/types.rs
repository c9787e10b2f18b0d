//! What a column's type is underneath: domains by their base type, arrays
//! by the array of their elements' base type.
//!
//! pgoutput names a column's declared type. A column of a domain over
//! `numeric(12,2)` arrives with the domain's OID, which [`super::value`]
//! does not know, so its values would be written as strings (`"12.50"`)
//! while a plain `numeric` column's are numbers. Each declared type is
//! therefore mapped to the type whose JSON form it takes:
//!
//! | declared type                    | written as                              |
//! |----------------------------------|-----------------------------------------|
//! | domain (over a domain, …)        | its base type                           |
//! | array of a domain                | the built-in array of the base type     |
//! | array of another type (enums, `uuid`, `inet`, composites, …) | `text[]`: a JSON array of strings |
//! | anything else                    | itself                                  |
//!
//! The map is read from `pg_type` when a stream starts, and again when a
//! relation names a user type it has not seen (a domain created since).

use std::collections::HashMap;

use tokio_postgres::Client;

use super::error::CaptureError;
use super::value::{array_element, oid};

/// The first OID Postgres gives to objects users create.
const FIRST_USER_OID: u32 = 16384;

/// `text[]`: arrays whose elements have no JSON form of their own.
const TEXT_ARRAY: u32 = 1009;

/// How deep a chain of domains may be before it is taken as a loop.
const MAX_DEPTH: usize = 32;

/// One `pg_type` row, as far as resolution needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TypeRow {
    /// The type's OID.
    pub oid: u32,
    /// A domain's base type (0 otherwise).
    pub base: u32,
    /// An array's element type (0 otherwise).
    pub element: u32,
    /// Whether the type is an array (`typcategory = 'A'`).
    pub array: bool,
    /// Whether its text form separates elements with commas (all but `box`).
    pub comma: bool,
}

/// Declared type OID → the OID whose JSON form its values take.
#[derive(Debug, Clone, Default)]
pub struct TypeMap {
    rows: HashMap<u32, TypeRow>,
    effective: HashMap<u32, u32>,
}

impl TypeMap {
    /// Builds the map from `pg_type` rows.
    pub fn from_rows(rows: impl IntoIterator<Item = TypeRow>) -> Self {
        let rows: HashMap<u32, TypeRow> = rows.into_iter().map(|r| (r.oid, r)).collect();
        let mut map = TypeMap {
            rows,
            effective: HashMap::new(),
        };
        let oids: Vec<u32> = map.rows.keys().copied().collect();
        for o in oids {
            let e = map.resolve(o);
            if e != o {
                map.effective.insert(o, e);
            }
        }
        map
    }

    /// Reads every domain, array and user type from the database.
    pub async fn load(client: &Client) -> Result<Self, CaptureError> {
        let rows = client
            .query(
                "SELECT oid::int8, typbasetype::int8, typelem::int8, typcategory = 'A', typdelim = ',' \
                 FROM pg_catalog.pg_type \
                 WHERE typtype = 'd' OR typcategory = 'A' OR oid >= 16384",
                &[],
            )
            .await
            .map_err(CaptureError::query("read the captured database's types"))?;
        Ok(Self::from_rows(rows.iter().map(|r| TypeRow {
            oid: r.get::<_, i64>(0) as u32,
            base: r.get::<_, i64>(1) as u32,
            element: r.get::<_, i64>(2) as u32,
            array: r.get(3),
            comma: r.get(4),
        })))
    }

    /// The OID whose JSON form values of `declared` take.
    pub fn effective(&self, declared: u32) -> u32 {
        self.effective.get(&declared).copied().unwrap_or(declared)
    }

    /// Whether `declared` is a user type this map has not read (created
    /// after it was loaded).
    pub fn is_unknown(&self, declared: u32) -> bool {
        declared >= FIRST_USER_OID && !self.rows.contains_key(&declared)
    }

    fn resolve(&self, declared: u32) -> u32 {
        let scalar = self.base_of(declared);
        let Some(row) = self.rows.get(&scalar) else {
            return scalar;
        };
        if !row.array || row.element == 0 || array_element(scalar).is_some() {
            return scalar;
        }
        let element = self.base_of(row.element);
        if let Some(array) = builtin_array_of(element) {
            return array;
        }
        if !row.comma || self.rows.get(&element).is_some_and(|e| e.array) {
            // `box[]` (`;`-separated): kept as the text Postgres prints.
            return scalar;
        }
        TEXT_ARRAY
    }

    /// Follows a chain of domains to the type underneath.
    fn base_of(&self, mut t: u32) -> u32 {
        for _ in 0..MAX_DEPTH {
            match self.rows.get(&t) {
                Some(row) if row.base != 0 => t = row.base,
                _ => return t,
            }
        }
        t
    }
}

/// The built-in array type of `element`, for element types with a JSON form
/// of their own (or a string form that arrays spell out element by element).
fn builtin_array_of(element: u32) -> Option<u32> {
    Some(match element {
        oid::BOOL => 1000,
        oid::BYTEA => 1001,
        oid::INT2 => 1005,
        oid::INT4 => 1007,
        oid::INT8 => 1016,
        oid::OID => 1028,
        oid::FLOAT4 => 1021,
        oid::FLOAT8 => 1022,
        oid::NUMERIC => 1231,
        oid::JSON => 199,
        oid::JSONB => 3807,
        oid::TIMESTAMP => 1115,
        oid::TIMESTAMPTZ => 1185,
        oid::TEXT => TEXT_ARRAY,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn domain(oid: u32, base: u32) -> TypeRow {
        TypeRow {
            oid,
            base,
            element: 0,
            array: false,
            comma: true,
        }
    }

    fn array(oid: u32, element: u32) -> TypeRow {
        TypeRow {
            oid,
            base: 0,
            element,
            array: true,
            comma: true,
        }
    }

    fn scalar(oid: u32) -> TypeRow {
        TypeRow {
            oid,
            base: 0,
            element: 0,
            array: false,
            comma: true,
        }
    }

    #[test]
    fn domains_arrays_and_user_types_resolve_to_what_they_are_written_as() {
        let map = TypeMap::from_rows([
            domain(20000, oid::NUMERIC),
            array(20001, 20000),
            domain(20002, 20000),
            array(20003, 20002),
            scalar(20004),
            array(20005, 20004),
            array(1231, oid::NUMERIC),
            array(1041, 869),
            TypeRow {
                comma: false,
                ..array(1020, 603)
            },
            domain(20006, 1041),
            domain(20007, oid::TIMESTAMPTZ),
        ]);
        assert_eq!(map.effective(20000), oid::NUMERIC, "domain over numeric");
        assert_eq!(map.effective(20001), 1231, "array of the domain");
        assert_eq!(map.effective(20002), oid::NUMERIC, "domain over a domain");
        assert_eq!(map.effective(20003), 1231);
        assert_eq!(map.effective(20004), 20004, "an enum stays itself");
        assert_eq!(map.effective(20005), TEXT_ARRAY, "enum[] as strings");
        assert_eq!(map.effective(1231), 1231, "numeric[] unchanged");
        assert_eq!(map.effective(1041), TEXT_ARRAY, "inet[] as strings");
        assert_eq!(map.effective(1020), 1020, "box[] keeps its text");
        assert_eq!(map.effective(20006), TEXT_ARRAY, "a domain over inet[]");
        assert_eq!(map.effective(20007), oid::TIMESTAMPTZ);
        assert_eq!(map.effective(oid::INT4), oid::INT4);
        assert!(map.is_unknown(30000));
        assert!(!map.is_unknown(20000));
        assert!(!map.is_unknown(oid::INT4), "built-ins are never looked up");
    }

    #[test]
    fn a_domain_loop_ends() {
        let map = TypeMap::from_rows([domain(20000, 20001), domain(20001, 20000)]);
        let _ = map.effective(20000);
    }
}
