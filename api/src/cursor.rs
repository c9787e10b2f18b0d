//! Opaque, stable pagination cursors.
//!
//! A cursor is URL-safe base64 of `v1|<listing>|<filter digest>|<position>`:
//! the position is the last row's keyset (`created_at` in microseconds and
//! id, or an audit id); the digest binds the cursor to the filters it was
//! made with, so a cursor reused with other filters is refused instead of
//! silently skipping rows. Callers must treat cursors as opaque.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::error::ApiError;

/// The longest cursor accepted.
const MAX_CURSOR_LEN: usize = 512;

fn digest(filters: &str) -> String {
    Sha256::digest(filters.as_bytes())[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The cursor after `position` in `listing` under `filters`.
pub fn encode(listing: &str, filters: &str, position: &str) -> String {
    URL_SAFE_NO_PAD.encode(format!("v1|{listing}|{}|{position}", digest(filters)))
}

fn invalid(message: &str) -> ApiError {
    ApiError::field("query.cursor", message)
}

/// The position in `cursor`, checked against `listing` and `filters`.
pub fn decode(cursor: &str, listing: &str, filters: &str) -> Result<String, ApiError> {
    let not_ours = || {
        invalid("is not a cursor of this listing; pass next_cursor from a previous page unchanged")
    };
    if cursor.len() > MAX_CURSOR_LEN {
        return Err(not_ours());
    }
    let bytes = URL_SAFE_NO_PAD.decode(cursor).map_err(|_| not_ours())?;
    let text = String::from_utf8(bytes).map_err(|_| not_ours())?;
    // Positions go into queries: a forged cursor must not carry NUL (which
    // Postgres refuses in text) or other control characters there.
    if walhook_pipeline::sanitize::first_unsafe(&text, walhook_pipeline::sanitize::Lines::Escape)
        .is_some()
    {
        return Err(not_ours());
    }
    let mut parts = text.splitn(4, '|');
    let (Some("v1"), Some(l), Some(d), Some(position)) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(not_ours());
    };
    if l != listing {
        return Err(not_ours());
    }
    if d != digest(filters) {
        return Err(invalid(
            "was made with other filters; repeat the filters of the first page, or start again without a cursor",
        ));
    }
    Ok(position.to_owned())
}

/// The row id a `cursor` of an id-ordered listing names (`None` without a
/// cursor): for listings paged by a growing integer id.
pub fn decode_id(
    cursor: Option<&str>,
    listing: &str,
    filters: &str,
) -> Result<Option<i64>, ApiError> {
    let Some(c) = cursor else {
        return Ok(None);
    };
    decode(c, listing, filters)?
        .parse::<i64>()
        .map(Some)
        .map_err(|_| invalid("is damaged; pass next_cursor unchanged"))
}

/// A keyset position: microseconds since 1970 and an id.
pub fn keyset(at: SystemTime, id: Uuid) -> String {
    let micros = match at.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_micros() as i128,
        Err(e) => -(e.duration().as_micros() as i128),
    };
    format!("{micros}:{}", id.simple())
}

/// Parses [`keyset`]'s form.
pub fn parse_keyset(position: &str) -> Result<(SystemTime, Uuid), ApiError> {
    let bad = || invalid("is damaged; pass next_cursor from a previous page unchanged");
    let (micros, id) = position.split_once(':').ok_or_else(bad)?;
    let micros: i64 = micros.parse().map_err(|_| bad())?;
    let id = Uuid::try_parse(id).map_err(|_| bad())?;
    let at = if micros >= 0 {
        UNIX_EPOCH + Duration::from_micros(micros as u64)
    } else {
        UNIX_EPOCH - Duration::from_micros(micros.unsigned_abs())
    };
    Ok((at, id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_binds_filters() {
        let at = UNIX_EPOCH + Duration::from_micros(1_795_947_104_123_456);
        let id = Uuid::new_v4();
        let c = encode("deliveries", "status=failed", &keyset(at, id));
        let pos = decode(&c, "deliveries", "status=failed").unwrap();
        assert_eq!(parse_keyset(&pos).unwrap(), (at, id));
        assert!(decode(&c, "deliveries", "status=succeeded").is_err());
        assert!(decode(&c, "endpoints", "status=failed").is_err());
        assert!(decode("not a cursor!", "deliveries", "").is_err());
        assert!(decode(&URL_SAFE_NO_PAD.encode("v1|deliveries"), "deliveries", "").is_err());
        let forged = URL_SAFE_NO_PAD.encode(format!("v1|tenants|{}|a\0b", digest("")));
        assert!(decode(&forged, "tenants", "").is_err());
        let e = decode("zzz", "deliveries", "").unwrap_err().problem();
        assert_eq!(e.status, 422);
        assert_eq!(e.errors[0].field, "query.cursor");
    }
}
