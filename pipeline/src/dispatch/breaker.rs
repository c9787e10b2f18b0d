//! The circuit breaker of one endpoint.
//!
//! `failure_threshold` consecutive retryable failures open the circuit: the
//! endpoint's deliveries stay pending (and visible) while it is open. After
//! the cool-down one probe attempt goes out (half-open); its success closes
//! the circuit, its failure opens it again for twice as long (up to
//! `max_cool_down`). Permanent rejections (4xx) show the endpoint is up and
//! count as neither.

use std::time::Duration;

use crate::time::Timestamp;

/// Breaker settings.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BreakerConfig {
    /// Consecutive failures that open the circuit.
    pub failure_threshold: u32,
    /// The first cool-down.
    #[serde(with = "crate::duration")]
    pub cool_down: Duration,
    /// The longest cool-down.
    #[serde(with = "crate::duration")]
    pub max_cool_down: Duration,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig {
            failure_threshold: 5,
            cool_down: Duration::from_secs(30),
            max_cool_down: Duration::from_secs(600),
        }
    }
}

/// The circuit's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Circuit {
    /// Attempts flow; `failures` in a row so far.
    Closed {
        /// Consecutive failures.
        failures: u32,
    },
    /// No attempts until `until`.
    Open {
        /// When a probe may go.
        until: Timestamp,
        /// The cool-down that opened it.
        cool_down: Duration,
    },
    /// One probe may go (or is out).
    HalfOpen {
        /// A probe is in flight.
        probing: bool,
        /// The cool-down before this probe.
        cool_down: Duration,
    },
}

impl Default for Circuit {
    fn default() -> Self {
        Circuit::Closed { failures: 0 }
    }
}

/// What a result did to the circuit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// It opened (until then).
    Opened(Timestamp),
    /// It closed.
    Closed,
}

/// How an attempt's result counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    /// 2xx.
    Success,
    /// A retryable failure (5xx, 408, 429, network, timeout).
    Failure,
    /// Neither (a 4xx rejection, an endpoint problem on our side).
    Neutral,
}

crate::stored_names! {
    /// A circuit's state without its details: what is stored across
    /// restarts and shown to operators.
    pub enum CircuitState as "circuit state" {
        /// Attempts go out.
        Closed = "closed",
        /// Attempts wait until the cool-down ends.
        Open = "open",
        /// One probe may go out; its result closes or reopens the circuit.
        HalfOpen = "half_open",
    }
}

impl Circuit {
    /// Its state as stored and shown.
    pub fn state(&self) -> CircuitState {
        match self {
            Circuit::Closed { .. } => CircuitState::Closed,
            Circuit::Open { .. } => CircuitState::Open,
            Circuit::HalfOpen { .. } => CircuitState::HalfOpen,
        }
    }

    /// Whether an attempt may start at `now`; `Err(Some(t))` means not
    /// before `t`, `Err(None)` means after the probe in flight.
    pub fn admits(&mut self, now: Timestamp) -> Result<(), Option<Timestamp>> {
        match *self {
            Circuit::Closed { .. } => Ok(()),
            Circuit::Open { until, cool_down } => {
                if now >= until {
                    *self = Circuit::HalfOpen {
                        probing: false,
                        cool_down,
                    };
                    Ok(())
                } else {
                    Err(Some(until))
                }
            }
            Circuit::HalfOpen { probing: false, .. } => Ok(()),
            Circuit::HalfOpen { probing: true, .. } => Err(None),
        }
    }

    /// An attempt started (a half-open circuit now has its probe out).
    pub fn started(&mut self) {
        if let Circuit::HalfOpen { probing, .. } = self {
            *probing = true;
        }
    }

    /// Applies an attempt's result at `now`.
    pub fn record(
        &mut self,
        health: Health,
        now: Timestamp,
        cfg: &BreakerConfig,
    ) -> Option<Transition> {
        match (*self, health) {
            (_, Health::Neutral) => {
                if let Circuit::HalfOpen { cool_down, .. } = *self {
                    // The probe was answered: the endpoint is up.
                    let _ = cool_down;
                    *self = Circuit::Closed { failures: 0 };
                    return Some(Transition::Closed);
                }
                None
            }
            (Circuit::Closed { .. }, Health::Success) => {
                *self = Circuit::Closed { failures: 0 };
                None
            }
            (Circuit::Closed { failures }, Health::Failure) => {
                let failures = failures + 1;
                if failures >= cfg.failure_threshold.max(1) {
                    let until = now.plus(cfg.cool_down);
                    *self = Circuit::Open {
                        until,
                        cool_down: cfg.cool_down,
                    };
                    Some(Transition::Opened(until))
                } else {
                    *self = Circuit::Closed { failures };
                    None
                }
            }
            (Circuit::HalfOpen { .. } | Circuit::Open { .. }, Health::Success) => {
                *self = Circuit::Closed { failures: 0 };
                Some(Transition::Closed)
            }
            (Circuit::HalfOpen { cool_down, .. }, Health::Failure) => {
                let cool_down = (cool_down * 2).min(cfg.max_cool_down.max(cfg.cool_down));
                let until = now.plus(cool_down);
                *self = Circuit::Open { until, cool_down };
                Some(Transition::Opened(until))
            }
            // A failure of an attempt that started before the circuit
            // opened: it is open already.
            (Circuit::Open { .. }, Health::Failure) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_probes_and_closes() {
        let cfg = BreakerConfig {
            failure_threshold: 3,
            cool_down: Duration::from_secs(10),
            max_cool_down: Duration::from_secs(40),
        };
        let mut c = Circuit::default();
        let t = |s: i64| Timestamp(s * 1_000_000);
        assert_eq!(c.record(Health::Failure, t(0), &cfg), None);
        assert_eq!(c.record(Health::Failure, t(1), &cfg), None);
        assert_eq!(
            c.record(Health::Failure, t(2), &cfg),
            Some(Transition::Opened(t(12)))
        );
        assert_eq!(c.admits(t(5)), Err(Some(t(12))));
        assert_eq!(c.admits(t(12)), Ok(()));
        c.started();
        assert_eq!(c.admits(t(12)), Err(None), "a second probe went out");
        assert_eq!(
            c.record(Health::Failure, t(13), &cfg),
            Some(Transition::Opened(t(33)))
        );
        assert_eq!(c.admits(t(33)), Ok(()));
        c.started();
        assert_eq!(
            c.record(Health::Success, t(34), &cfg),
            Some(Transition::Closed)
        );
        assert_eq!(c, Circuit::Closed { failures: 0 });
    }

    #[test]
    fn successes_reset_the_count() {
        let cfg = BreakerConfig {
            failure_threshold: 2,
            ..BreakerConfig::default()
        };
        let mut c = Circuit::default();
        c.record(Health::Failure, Timestamp(0), &cfg);
        c.record(Health::Success, Timestamp(1), &cfg);
        assert_eq!(c.record(Health::Failure, Timestamp(2), &cfg), None);
        assert_eq!(c.record(Health::Neutral, Timestamp(3), &cfg), None);
    }
}
