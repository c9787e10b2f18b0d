//! A Postgres connection string whose password never prints.
//!
//! [`DatabaseUrl`] holds `postgres://user:password@host/db` or the
//! key/value form `host=… password=…`; `Debug` and `Display` show it with
//! the password masked, so a config dumped with `{:?}` or an error that
//! quotes it cannot leak it. It deserializes from a plain string; the full
//! string comes out only through [`DatabaseUrl::expose`], to connect with.

use std::fmt;

/// A Postgres connection string (`postgres://user:password@host/db` or
/// `host=… password=…`) whose password is shown as `***`.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct DatabaseUrl(String);

impl DatabaseUrl {
    /// Wraps `url`.
    pub fn new(url: impl Into<String>) -> Self {
        DatabaseUrl(url.into())
    }

    /// The full connection string, password included (to connect with).
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The connection string with its password masked (to show).
    pub fn masked(&self) -> String {
        mask_password(&self.0)
    }
}

impl fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.masked())
    }
}

impl fmt::Display for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.masked())
    }
}

impl From<String> for DatabaseUrl {
    fn from(url: String) -> Self {
        DatabaseUrl(url)
    }
}

impl From<&str> for DatabaseUrl {
    fn from(url: &str) -> Self {
        DatabaseUrl(url.to_owned())
    }
}

impl<'de> serde::Deserialize<'de> for DatabaseUrl {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(DatabaseUrl)
    }
}

/// `url` with any password replaced by `***`: the userinfo password of a
/// URL, a `password=` query parameter, and a `password=` key of the
/// key/value form.
pub fn mask_password(url: &str) -> String {
    let mut out = url.to_owned();
    if let Some(scheme_end) = out.find("://") {
        let rest_start = scheme_end + 3;
        let authority_end = out[rest_start..]
            .find(['/', '?', '#'])
            .map_or(out.len(), |i| rest_start + i);
        if let Some(at) = out[rest_start..authority_end].rfind('@') {
            let userinfo = &out[rest_start..rest_start + at];
            if let Some(colon) = userinfo.find(':') {
                out.replace_range(rest_start + colon + 1..rest_start + at, "***");
            }
        }
    }
    mask_key_value(&out)
}

/// Masks the value after every `password=` (query string or key/value
/// form), up to the next `&`, space or end (a quoted value up to its
/// closing quote).
fn mask_key_value(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("password=") {
        let boundary = i == 0 || matches!(rest.as_bytes()[i - 1], b' ' | b'?' | b'&');
        out.push_str(&rest[..i + "password=".len()]);
        rest = &rest[i + "password=".len()..];
        if !boundary {
            continue;
        }
        let end = if let Some(quoted) = rest.strip_prefix('\'') {
            quoted.find('\'').map_or(rest.len(), |j| j + 2)
        } else {
            rest.find([' ', '&']).unwrap_or(rest.len())
        };
        out.push_str("***");
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn database_passwords_are_masked() {
        for (url, shown) in [
            (
                "postgres://walhook:hunter2@db:5432/walhook",
                "postgres://walhook:***@db:5432/walhook",
            ),
            (
                "postgresql://u:p%40ss@h/d?sslmode=require",
                "postgresql://u:***@h/d?sslmode=require",
            ),
            ("postgres://u@h/d", "postgres://u@h/d"),
            (
                "postgres://h/d?user=u&password=hunter2&sslmode=require",
                "postgres://h/d?user=u&password=***&sslmode=require",
            ),
            (
                "host=db user=u password=hunter2 dbname=d",
                "host=db user=u password=*** dbname=d",
            ),
            (
                "host=db password='a b c' dbname=d",
                "host=db password=*** dbname=d",
            ),
        ] {
            let u = DatabaseUrl::new(url);
            assert_eq!(u.masked(), shown, "{url}");
            assert!(!format!("{u:?}{u}").contains("hunter2"));
            assert_eq!(u.expose(), url);
        }
    }
}
