//! Durations in config files: `"500ms"`, `"10s"`, `"5m"`, `"2h"`, `"1d"`, or
//! sums such as `"1m30s"`. Use with `#[serde(with = "walhook_pipeline::duration")]`.

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serializer};

/// Reads a duration such as `"10s"`.
pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let text = String::deserialize(d)?;
    parse(&text).map_err(serde::de::Error::custom)
}

/// Writes a duration in the form [`parse`] reads.
pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(&format_args!("{}ms", d.as_millis()))
}

/// Parses `"250ms"`, `"10s"`, `"5m"`, `"2h"`, `"1d"` or a sum such as
/// `"1m30s"`.
pub fn parse(text: &str) -> Result<Duration, String> {
    let bad = || {
        format!(
            "{text:?} is not a duration; write for example \"500ms\", \"10s\", \"5m\" or \"1h\""
        )
    };
    let mut total = Duration::ZERO;
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits == 0 {
            return Err(bad());
        }
        let n: u64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let seconds = |k: u64| n.checked_mul(k).map(Duration::from_secs).ok_or_else(bad);
        total += match unit {
            "ms" => Duration::from_millis(n),
            "s" => seconds(1)?,
            "m" => seconds(60)?,
            "h" => seconds(3600)?,
            "d" => seconds(86_400)?,
            _ => return Err(bad()),
        };
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units_and_sums() {
        assert_eq!(parse("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse("1d").unwrap(), Duration::from_secs(86_400));
        for bad in ["10", "soon", "", "5 s", "1y"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
