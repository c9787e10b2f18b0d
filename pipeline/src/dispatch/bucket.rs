//! A token bucket: an endpoint's requests-per-second limit.

use std::time::Duration;

use crate::time::Timestamp;

/// Tokens refill at `rate` per second up to `burst`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    at: Timestamp,
}

impl TokenBucket {
    /// A full bucket for `per_second` requests per second (burst equal to
    /// one second's worth, at least one).
    pub fn new(per_second: u32, now: Timestamp) -> Self {
        let rate = f64::from(per_second.max(1));
        TokenBucket {
            rate,
            burst: rate.max(1.0),
            tokens: rate.max(1.0),
            at: now,
        }
    }

    /// The configured rate.
    pub fn rate(&self) -> u32 {
        self.rate as u32
    }

    fn refill(&mut self, now: Timestamp) {
        if now > self.at {
            let secs = now.since(self.at).as_secs_f64();
            self.tokens = (self.tokens + secs * self.rate).min(self.burst);
            self.at = now;
        }
    }

    /// Takes a token at `now`; `Err(t)` says when one will be there.
    pub fn take(&mut self, now: Timestamp) -> Result<(), Timestamp> {
        self.refill(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            let wait = (1.0 - self.tokens) / self.rate;
            Err(now.plus(Duration::from_secs_f64(wait).max(Duration::from_micros(1))))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allows_the_rate_and_no_more() {
        let mut b = TokenBucket::new(10, Timestamp(0));
        for _ in 0..10 {
            b.take(Timestamp(0)).unwrap();
        }
        let next = b.take(Timestamp(0)).unwrap_err();
        assert_eq!(next, Timestamp(100_000));
        assert!(b.take(Timestamp(100_000)).is_ok());
        // Over ten seconds: about a hundred more, never more than the burst.
        let mut n = 0;
        for ms in 0..10_000 {
            if b.take(Timestamp(100_000 + ms * 1000)).is_ok() {
                n += 1;
            }
        }
        assert!((99..=101).contains(&n), "{n}");
    }
}
