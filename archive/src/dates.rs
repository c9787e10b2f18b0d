//! UTC days: their bounds as instants, and `date` values to and from
//! Postgres without a chrono feature in tokio-postgres.

use chrono::{Duration, NaiveDate};
use tokio_postgres::types::ToSql;

/// The instants that bound a UTC day.
pub fn bounds(day: NaiveDate) -> (std::time::SystemTime, std::time::SystemTime) {
    let at = |d: NaiveDate| {
        let secs = d
            .and_hms_opt(0, 0, 0)
            .expect("midnight")
            .and_utc()
            .timestamp();
        std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs as u64)
    };
    (at(day), at(day + Duration::days(1)))
}

/// A `date` parameter and column without a chrono feature in
/// tokio-postgres: days since 2000-01-01, as Postgres sends them.
#[derive(Debug, Clone, Copy)]
pub struct NaiveDateSql(pub NaiveDate);

const PG_EPOCH: NaiveDate = match NaiveDate::from_ymd_opt(2000, 1, 1) {
    Some(d) => d,
    None => panic!("a valid date"),
};

impl ToSql for NaiveDateSql {
    fn to_sql(
        &self,
        _ty: &tokio_postgres::types::Type,
        out: &mut bytes::BytesMut,
    ) -> Result<tokio_postgres::types::IsNull, Box<dyn std::error::Error + Sync + Send>> {
        let days = (self.0 - PG_EPOCH).num_days();
        let days = i32::try_from(days)?;
        bytes::BufMut::put_i32(out, days);
        Ok(tokio_postgres::types::IsNull::No)
    }
    tokio_postgres::types::accepts!(DATE);
    tokio_postgres::types::to_sql_checked!();
}

impl<'a> tokio_postgres::types::FromSql<'a> for NaiveDateSql {
    fn from_sql(
        _ty: &tokio_postgres::types::Type,
        raw: &'a [u8],
    ) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        let days = i32::from_be_bytes(raw.try_into()?);
        Ok(NaiveDateSql(PG_EPOCH + Duration::days(i64::from(days))))
    }
    tokio_postgres::types::accepts!(DATE);
}
