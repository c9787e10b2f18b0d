//! The operator token's strength, checked when the config is loaded, and a
//! generator for good ones (`walhook secrets generate-token`).
//!
//! The operator token manages every tenant and reads every tenant's audit
//! records, so it must carry at least 128 bits of entropy, as a random
//! 32-byte key would. Entropy cannot be measured from one string; what can
//! be done is to refuse every token that *cannot* carry that much or that is
//! obviously not random:
//!
//! - shorter than [`MIN_OPERATOR_TOKEN_LEN`] characters, or holding
//!   whitespace or control characters;
//! - drawn from too small an alphabet for its length (32 digits carry about
//!   106 bits at most: `len × log2(alphabet)` must reach 128, where the
//!   alphabet is the union of the character classes used; 32 hex digits,
//!   `openssl rand -hex 16`, are exactly 128);
//! - fewer than [`MIN_DISTINCT`] distinct characters;
//! - a short pattern repeated (a period of at most half its length:
//!   `aaaa…`, `abcabc…`, `passwordpassword`);
//! - mostly one character: the Shannon entropy of its character counts
//!   times its length under [`MIN_COUNTED_BITS`] (a random 32-hex-digit
//!   token scores above 91 in 300,000 draws; 29 × `a` and 7 more letters
//!   score 45);
//! - half of it or more one run of consecutive characters (`0123…`,
//!   `abcd…`, `zyxw…`).
//!
//! Each refusal names the field and the fix, and never quotes the token.

use std::collections::HashMap;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

use crate::settings::MIN_OPERATOR_TOKEN_LEN;

/// The entropy an operator token must be able to carry, in bits.
pub const MIN_ENTROPY_BITS: f64 = 128.0;

/// The fewest distinct characters accepted (a random 32-hex-digit token
/// has fewer than 8 about once in ten million draws).
pub const MIN_DISTINCT: usize = 8;

/// The least `len × Shannon entropy of the character counts` accepted.
pub const MIN_COUNTED_BITS: f64 = 80.0;

/// Random bytes in a generated token: 256 bits.
const GENERATED_BYTES: usize = 32;

/// A fresh operator token: 32 random bytes as URL-safe base64 without
/// padding (43 characters, 256 bits).
pub fn generate() -> String {
    URL_SAFE_NO_PAD.encode(rand::random::<[u8; GENERATED_BYTES]>())
}

/// Why a token is refused. The text never holds the token.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error(
    "[api].operator_token (or WALHOOK_API_OPERATOR_TOKEN) is too weak: it {why}; the operator \
     token must carry at least 128 bits of entropy: make one with `walhook secrets generate-token` \
     (256 random bits, URL-safe base64)"
)]
pub struct WeakToken {
    /// What is wrong with it.
    pub why: String,
}

fn weak(why: impl Into<String>) -> Result<(), WeakToken> {
    Err(WeakToken { why: why.into() })
}

/// Checks `token` against the rules of the module documentation.
pub fn check(token: &str) -> Result<(), WeakToken> {
    let chars: Vec<char> = token.chars().collect();
    let len = chars.len();
    if len < MIN_OPERATOR_TOKEN_LEN {
        return weak(format!(
            "is {len} characters long, fewer than the {MIN_OPERATOR_TOKEN_LEN} required"
        ));
    }
    if chars.iter().any(|c| c.is_whitespace() || c.is_control()) {
        return weak("holds whitespace or control characters");
    }
    let alphabet = alphabet_size(&chars);
    let ceiling = len as f64 * (alphabet as f64).log2();
    if ceiling < MIN_ENTROPY_BITS {
        let needed = (MIN_ENTROPY_BITS / (alphabet as f64).log2()).ceil();
        return weak(format!(
            "draws from an alphabet of {alphabet} characters, so its {len} characters carry \
             {ceiling:.0} bits at most (it would need {needed} of them)"
        ));
    }
    let mut counts: HashMap<char, usize> = HashMap::new();
    for c in &chars {
        *counts.entry(*c).or_default() += 1;
    }
    if counts.len() < MIN_DISTINCT {
        return weak(format!(
            "uses only {} distinct characters (at least {MIN_DISTINCT} expected of a random token)",
            counts.len()
        ));
    }
    if let Some(period) = (1..=len / 2).find(|p| (*p..len).all(|i| chars[i] == chars[i - p])) {
        return weak(format!("repeats a pattern of {period} characters"));
    }
    let counted: f64 = counts
        .values()
        .map(|&n| {
            let p = n as f64 / len as f64;
            -(n as f64) * p.log2()
        })
        .sum();
    if counted < MIN_COUNTED_BITS {
        return weak(format!(
            "is mostly the same few characters (its character counts give {counted:.0} bits)"
        ));
    }
    let run = longest_run(&chars);
    if run * 2 >= len {
        return weak(format!(
            "is mostly one run of {run} consecutive characters (like 0123… or abcd…)"
        ));
    }
    Ok(())
}

/// The size of the union of the character classes `chars` uses: hex
/// digits alone count 16, digits 10, lower and upper case letters 26 each,
/// and anything else the 33 printable ASCII symbols (or, for non-ASCII,
/// at least that).
fn alphabet_size(chars: &[char]) -> u32 {
    let hex_lower = chars.iter().all(|c| matches!(c, '0'..='9' | 'a'..='f'));
    let hex_upper = chars.iter().all(|c| matches!(c, '0'..='9' | 'A'..='F'));
    let has_letters = chars.iter().any(|c| c.is_ascii_alphabetic());
    if (hex_lower || hex_upper) && has_letters {
        return 16;
    }
    let mut size = 0;
    if chars.iter().any(char::is_ascii_digit) {
        size += 10;
    }
    if chars.iter().any(char::is_ascii_lowercase) {
        size += 26;
    }
    if chars.iter().any(char::is_ascii_uppercase) {
        size += 26;
    }
    if chars.iter().any(|c| !c.is_ascii_alphanumeric()) {
        size += 33;
    }
    size.max(1)
}

/// The longest run of characters each one code point above (or each one
/// below) the previous.
fn longest_run(chars: &[char]) -> usize {
    let mut longest = 1;
    for step in [1i64, -1] {
        let mut run = 1;
        for w in chars.windows(2) {
            if i64::from(u32::from(w[1])) - i64::from(u32::from(w[0])) == step {
                run += 1;
                longest = longest.max(run);
            } else {
                run = 1;
            }
        }
    }
    longest
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(token: &str) -> String {
        check(token).unwrap_err().to_string()
    }

    #[test]
    fn obviously_weak_tokens_are_refused_without_being_quoted() {
        for (token, says) in [
            ("a".repeat(32), "distinct characters"),
            ("short-but-random-Zq8".into(), "fewer than the 32"),
            ("31415926535897932384626433832795".into(), "alphabet of 10"),
            ("abc".repeat(11), "distinct characters"),
            ("passwordPASS1234".repeat(2), "pattern of 16"),
            ("0123456789abcdefghijklmnopqrstuvwxyz".into(), "consecutive"),
            ("aaaaaaaaaaaaaaaaaaaaaaaaaaaaabcdefgh".into(), "same few"),
            (
                "with space in the middle of it, 32+ long".into(),
                "whitespace",
            ),
        ] {
            let message = refused(&token);
            assert!(
                message.contains(says)
                    && message.contains("[api].operator_token")
                    && message.contains("walhook secrets generate-token"),
                "{token}: {message}"
            );
            assert!(!message.contains(&token), "the token was quoted: {message}");
        }
    }

    #[test]
    fn random_tokens_pass() {
        // `openssl rand -hex 16` (exactly 128 bits), `-hex 32`, generated
        // tokens, and the tokens of the repository's tests and benches.
        for _ in 0..2_000 {
            let hex16: String = rand::random::<[u8; 16]>()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            check(&hex16).unwrap_or_else(|e| panic!("{hex16}: {e}"));
            let generated = generate();
            assert_eq!(generated.len(), 43);
            check(&generated).unwrap_or_else(|e| panic!("{generated}: {e}"));
        }
        for token in [
            "test-operator-token-0123456789abcdef",
            "e2e-operator-token-0123456789abcdef01",
            "bench-operator-token-0123456789abcdef",
            "operator-token-0123456789abcdef0123",
        ] {
            check(token).unwrap_or_else(|e| panic!("{token}: {e}"));
        }
    }

    #[test]
    fn alphabets_are_the_classes_used() {
        let of = |s: &str| alphabet_size(&s.chars().collect::<Vec<_>>());
        assert_eq!(of("0123456789"), 10);
        assert_eq!(of("deadbeef00"), 16);
        assert_eq!(of("DEADBEEF00"), 16);
        assert_eq!(of("abcxyz"), 26);
        assert_eq!(of("abcXYZ09"), 62);
        assert_eq!(of("abc-_XYZ09"), 95);
        assert_eq!(longest_run(&"x0123y".chars().collect::<Vec<_>>()), 4);
        assert_eq!(longest_run(&"zyxwv".chars().collect::<Vec<_>>()), 5);
    }
}
