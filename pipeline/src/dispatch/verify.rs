//! Endpoint ownership checks: before an endpoint receives anything, its URL
//! must prove that whoever runs it asked for these webhooks.
//!
//! The check is a signed `POST` like a webhook (the same Standard Webhooks
//! headers, the endpoint's secrets), whose body is
//! `{"challenge":"…","endpoint_id":"ep_…","type":"webhook.verification"}`.
//! The endpoint passes by answering 2xx with the challenge in the body
//! (`{"challenge":"…"}` is the usual answer). Until then its deliveries are
//! made and wait, visible. A failed check is tried again every
//! [`VerifySettings::retry_every`]; a re-send through the API asks with a
//! new challenge at once.
//!
//! Every dispatcher node runs the check for the endpoints it sees waiting;
//! the first echo recorded verifies the endpoint (a check of an older
//! challenge verifies nothing).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::egress::{Egress, EgressResult, Outbound, signed};
use super::outcome::AttemptOutcome;
use crate::endpoint::{EndpointConfig, SubscriptionCache};
use crate::ids::EndpointId;
use crate::store::DispatchStore;

/// The `type` of a check's body.
pub const VERIFICATION_TYPE: &str = "webhook.verification";

/// Checks at most this many endpoints at once.
const MAX_CONCURRENT: usize = 32;

/// How the checker runs.
#[derive(Debug, Clone)]
pub struct VerifySettings {
    /// How often it looks for endpoints waiting for a check.
    pub interval: Duration,
    /// How long after a failed check the same challenge is sent again.
    pub retry_every: Duration,
}

impl Default for VerifySettings {
    fn default() -> Self {
        VerifySettings {
            interval: Duration::from_secs(1),
            retry_every: Duration::from_secs(60),
        }
    }
}

/// The signed request that asks `endpoint` to echo `challenge`.
pub fn challenge_request(
    endpoint: &EndpointConfig,
    challenge: &str,
    unix_seconds: i64,
) -> Outbound {
    let mut body = Vec::with_capacity(128);
    {
        let mut w = crate::canonical::JsonWriter::new(&mut body);
        w.begin_object();
        w.key("challenge");
        w.string(challenge);
        w.key("endpoint_id");
        w.string(&endpoint.id.to_string());
        w.key("type");
        w.string(VERIFICATION_TYPE);
        w.end_object();
    }
    signed(
        &endpoint.url,
        format!("verify_{challenge}"),
        &endpoint.secrets,
        unix_seconds,
        body.into(),
        [("walhook-event-type", VERIFICATION_TYPE.into())],
    )
}

/// Whether the answer passes the check: a 2xx whose body holds the
/// challenge. `Err` says what came back instead, for the endpoint's record.
pub fn judge(result: &EgressResult, challenge: &str) -> Result<(), String> {
    match result.outcome {
        AttemptOutcome::Delivered { status } => {
            if result
                .response_excerpt
                .as_deref()
                .is_some_and(|body| body.contains(challenge))
            {
                Ok(())
            } else {
                Err(format!(
                    "the endpoint answered {status} without the challenge in its body; \
                     answer the verification request with {{\"challenge\": \"<challenge>\"}}"
                ))
            }
        }
        AttemptOutcome::Gone => Err("the endpoint answered 410 Gone".into()),
        AttemptOutcome::Retryable { status, class, .. }
        | AttemptOutcome::Rejected { status, class } => Err(match status {
            Some(s) => format!("the endpoint answered {s} ({})", class.as_str()),
            None => format!("no answer ({})", class.as_str()),
        }),
    }
}

/// Checks endpoints waiting for one until `shutdown`.
pub async fn run<E: Egress, S: DispatchStore>(
    egress: Arc<E>,
    store: Arc<S>,
    directory: Arc<SubscriptionCache>,
    settings: VerifySettings,
    shutdown: CancellationToken,
) {
    // (endpoint, challenge) → when it was last sent; out: being sent now.
    let mut sent: HashMap<(EndpointId, String), Instant> = HashMap::new();
    let mut checks: JoinSet<(EndpointId, String, Result<(), String>)> = JoinSet::new();
    let mut tick = tokio::time::interval(settings.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => {
                checks.abort_all();
                return;
            }
            Some(done) = checks.join_next(), if !checks.is_empty() => {
                let Ok((id, challenge, result)) = done else { continue };
                match &result {
                    Ok(()) => tracing::info!(endpoint_id = %id, "endpoint verified: it echoed the challenge"),
                    Err(why) => tracing::warn!(endpoint_id = %id, "endpoint verification failed: {why}"),
                }
                if let Err(e) = store.record_verification(id, &challenge, result).await {
                    tracing::warn!(endpoint_id = %id, error = %e.chain(), "could not record an endpoint verification; it is sent again");
                    sent.remove(&(id, challenge));
                }
            }
            _ = tick.tick() => {
                let dir = directory.snapshot();
                let waiting: Vec<Arc<EndpointConfig>> = dir
                    .unverified()
                    .filter(|e| e.enabled && e.quarantine.is_none() && !e.secrets.is_empty())
                    .cloned()
                    .collect();
                // Forget checks of challenges no longer asked for.
                let current: std::collections::HashSet<(EndpointId, &str)> = waiting
                    .iter()
                    .filter_map(|e| Some((e.id, e.verification.as_ref()?.challenge.as_str())))
                    .collect();
                sent.retain(|(id, c), _| current.contains(&(*id, c.as_str())));
                for ep in waiting {
                    if checks.len() >= MAX_CONCURRENT {
                        break;
                    }
                    let challenge = ep.verification.as_ref().expect("filtered").challenge.clone();
                    let key = (ep.id, challenge.clone());
                    if sent.get(&key).is_some_and(|at| at.elapsed() < settings.retry_every) {
                        continue;
                    }
                    sent.insert(key, Instant::now());
                    let egress = egress.clone();
                    checks.spawn(async move {
                        let now = crate::time::Timestamp::now().unix_seconds();
                        let request = challenge_request(&ep, &challenge, now);
                        let result = egress.send(request).await;
                        let verdict = judge(&result, &challenge);
                        (ep.id, challenge, verdict)
                    });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dispatch::outcome::ErrorClass;

    fn answered(status: u16, body: &str) -> EgressResult {
        EgressResult {
            outcome: if (200..300).contains(&status) {
                AttemptOutcome::Delivered { status }
            } else {
                AttemptOutcome::Rejected {
                    status: Some(status),
                    class: ErrorClass::ClientError,
                }
            },
            response_sha256: None,
            response_excerpt: Some(body.into()),
        }
    }

    #[test]
    fn only_a_2xx_echoing_the_challenge_passes() {
        assert!(judge(&answered(200, r#"{"challenge":"abc123"}"#), "abc123").is_ok());
        assert!(judge(&answered(200, "abc123"), "abc123").is_ok());
        let err = judge(&answered(200, "ok"), "abc123").unwrap_err();
        assert!(err.contains("without the challenge"), "{err}");
        let err = judge(&answered(404, "abc123"), "abc123").unwrap_err();
        assert!(err.contains("404"), "{err}");
        let bare = EgressResult::bare(AttemptOutcome::Delivered { status: 204 });
        assert!(judge(&bare, "abc123").is_err());
    }
}
