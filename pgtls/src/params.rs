//! Taking the TLS parameters out of a connection string.
//!
//! tokio-postgres parses `sslmode` itself but knows only `disable`,
//! `prefer` and `require`, and refuses `sslrootcert` as an unknown option.
//! So walhook lifts those parameters out of the string (either form libpq
//! accepts: `postgres://…?sslmode=verify-full&sslrootcert=/ca.pem` or
//! `host=… sslmode=verify-full`) and hands the rest to tokio-postgres.
//! This is a parser of operator input: it never panics, and when the string
//! is malformed it leaves it as it is for tokio-postgres to refuse.

use std::ops::Range;

use percent_encoding::percent_decode_str;

/// One `key=value` parameter found in a connection string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Param {
    /// The key, decoded.
    pub key: String,
    /// The value, decoded (percent-decoded in a URL, unquoted in the
    /// key/value form).
    pub value: String,
    /// Where the parameter stands in the string, without separators.
    span: Range<usize>,
}

/// A connection string split into its parameters.
#[derive(Debug, Clone)]
pub(crate) struct Parsed {
    /// For a URL, where its query starts (the `?`); the key/value form has
    /// no such place.
    query_at: Option<usize>,
    /// The parameters, in order.
    pub params: Vec<Param>,
}

/// The parameters of `conn` (URL query or key/value form). `None` when the
/// string does not parse; tokio-postgres then reports the problem.
pub(crate) fn parse(conn: &str) -> Option<Parsed> {
    if conn.starts_with("postgres://") || conn.starts_with("postgresql://") {
        Some(url_params(conn))
    } else {
        keyword_params(conn).map(|params| Parsed {
            query_at: None,
            params,
        })
    }
}

/// `conn` without the parameters whose keys `remove` accepts.
pub(crate) fn without(conn: &str, parsed: &Parsed, remove: impl Fn(&str) -> bool) -> String {
    let kept = parsed.params.iter().filter(|p| !remove(&p.key));
    match parsed.query_at {
        // A URL's query is rebuilt from the items kept (a query left empty
        // loses its `?`).
        Some(q) => {
            let items: Vec<&str> = kept.map(|p| &conn[p.span.clone()]).collect();
            if items.is_empty() {
                conn[..q].to_owned()
            } else {
                format!("{}?{}", &conn[..q], items.join("&"))
            }
        }
        // The key/value form loses the removed items' text; the white space
        // around them stays, which the parser skips.
        None => {
            let mut out = String::with_capacity(conn.len());
            let mut at = 0;
            for p in parsed.params.iter().filter(|p| remove(&p.key)) {
                out.push_str(&conn[at..p.span.start]);
                at = p.span.end;
            }
            out.push_str(&conn[at..]);
            out
        }
    }
}

fn url_params(url: &str) -> Parsed {
    let Some(q) = url.find('?') else {
        return Parsed {
            query_at: None,
            params: Vec::new(),
        };
    };
    let mut params = Vec::new();
    let mut start = q + 1;
    while start <= url.len() {
        let end = url[start..].find('&').map_or(url.len(), |i| start + i);
        let item = &url[start..end];
        if !item.is_empty() {
            // An item without `=` is kept as it is, for tokio-postgres to
            // judge.
            let (k, v) = item.split_once('=').unwrap_or((item, ""));
            params.push(Param {
                key: percent_decode_str(k).decode_utf8_lossy().into_owned(),
                value: percent_decode_str(v).decode_utf8_lossy().into_owned(),
                span: start..end,
            });
        }
        start = end + 1;
    }
    Parsed {
        query_at: Some(q),
        params,
    }
}

/// libpq's `key = value` form, read as tokio-postgres reads it: values
/// bare up to white space or single quoted, `\\` escaping the next
/// character in both.
fn keyword_params(conn: &str) -> Option<Vec<Param>> {
    let mut it = conn.char_indices().peekable();
    let mut found = Vec::new();
    let skip_ws = |it: &mut std::iter::Peekable<std::str::CharIndices<'_>>| {
        while it.next_if(|(_, c)| c.is_whitespace()).is_some() {}
    };
    loop {
        skip_ws(&mut it);
        let Some(&(start, _)) = it.peek() else {
            return Some(found);
        };
        let mut key_end = start;
        while let Some((i, c)) = it.next_if(|(_, c)| !c.is_whitespace() && *c != '=') {
            key_end = i + c.len_utf8();
        }
        let key = &conn[start..key_end];
        skip_ws(&mut it);
        if key.is_empty() || it.next().map(|(_, c)| c) != Some('=') {
            return None;
        }
        skip_ws(&mut it);
        let mut value = String::new();
        let mut end = conn.len();
        if it.next_if(|(_, c)| *c == '\'').is_some() {
            loop {
                match it.next()? {
                    (i, '\'') => {
                        end = i + 1;
                        break;
                    }
                    (_, '\\') => value.push(it.next()?.1),
                    (_, c) => value.push(c),
                }
            }
        } else {
            while let Some((i, c)) = it.next_if(|(_, c)| !c.is_whitespace()) {
                end = i + c.len_utf8();
                if c == '\\' {
                    if let Some((j, escaped)) = it.next() {
                        end = j + escaped.len_utf8();
                        value.push(escaped);
                    }
                } else {
                    value.push(c);
                }
            }
            if value.is_empty() {
                return None;
            }
        }
        found.push(Param {
            key: key.to_owned(),
            value,
            span: start..end,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strip(conn: &str) -> (String, Vec<(String, String)>) {
        let parsed = parse(conn).expect("parses");
        let tls = |k: &str| k.starts_with("ssl");
        let rest = without(conn, &parsed, tls);
        let taken = parsed
            .params
            .into_iter()
            .filter(|p| tls(&p.key))
            .map(|p| (p.key, p.value))
            .collect();
        (rest, taken)
    }

    #[test]
    fn url_parameters_are_lifted_out() {
        let cases = [
            (
                "postgres://u:p@h:5432/db?sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem",
                "postgres://u:p@h:5432/db",
                vec![("sslmode", "verify-full"), ("sslrootcert", "/etc/ca.pem")],
            ),
            (
                "postgres://h/db?application_name=x&sslmode=require",
                "postgres://h/db?application_name=x",
                vec![("sslmode", "require")],
            ),
            (
                "postgres://h/db?sslmode=require&application_name=x",
                "postgres://h/db?application_name=x",
                vec![("sslmode", "require")],
            ),
            (
                "postgres://h/db?a=1&sslmode=require&b=2",
                "postgres://h/db?a=1&b=2",
                vec![("sslmode", "require")],
            ),
            ("postgres://h/db", "postgres://h/db", vec![]),
        ];
        for (url, rest, taken) in cases {
            let (got_rest, got_taken) = strip(url);
            assert_eq!(got_rest, rest, "{url}");
            let taken: Vec<(String, String)> = taken
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect();
            assert_eq!(got_taken, taken, "{url}");
        }
    }

    #[test]
    fn keyword_parameters_are_lifted_out() {
        let (rest, taken) = strip(
            "host=localhost sslmode = verify-full  sslrootcert='/my ca/\\'x\\'.pem' dbname=d",
        );
        assert_eq!(rest, "host=localhost    dbname=d");
        assert_eq!(
            taken,
            vec![
                ("sslmode".to_owned(), "verify-full".to_owned()),
                ("sslrootcert".to_owned(), "/my ca/'x'.pem".to_owned()),
            ]
        );
        let (rest, taken) = strip("host=h sslrootcert=/my\\ ca.pem\u{3000}dbname=d");
        assert_eq!(rest, "host=h \u{3000}dbname=d");
        assert_eq!(
            taken,
            vec![("sslrootcert".to_owned(), "/my ca.pem".to_owned())]
        );
        assert!(parse("host=h sslmode").is_none());
        assert!(parse("host=h sslmode=").is_none());
        assert!(parse("host='unterminated").is_none());
        assert!(parse("host=h x='\\").is_none());
    }

    #[test]
    fn never_panics_on_odd_input() {
        for s in [
            "",
            "?",
            "postgres://?",
            "postgres://h?&&=&",
            "postgres://h?=x",
            "==",
            "a='é\\é'",
            "a=\u{0}",
            "postgresql://h/d?sslmode",
        ] {
            if let Some(parsed) = parse(s) {
                let _ = without(s, &parsed, |_| true);
                let _ = without(s, &parsed, |_| false);
            }
        }
    }
}
