//! Endpoint ownership checks: before an endpoint receives anything, its URL
//! must prove that whoever runs it holds the endpoint's signing secret.
//!
//! The check is a signed `POST` like a webhook (the same Standard Webhooks
//! headers, the endpoint's secrets), whose body is
//! `{"challenge":"…","endpoint_id":"ep_…","type":"webhook.verification"}`.
//! The endpoint passes by answering 2xx with
//!
//! ```text
//! {"proof": base64(HMAC-SHA256(key = the bytes of its whsec_ secret,
//!                              message = "walhook-verification.v1." + challenge))}
//! ```
//!
//! Why a proof and not an echo: any server that reflects what it is sent
//! (a request bin, a debugging endpoint, a misconfigured proxy) would pass
//! an echo, so a tenant could point webhooks at a URL it does not run. The
//! proof needs the secret, which only the tenant and the receiver it set up
//! hold; the challenge is fresh and never shown through the API, so a proof
//! cannot be prepared in advance and planted in the URL's query for a
//! reflecting server to return. The message is domain-separated
//! ([`PROOF_CONTEXT`]) so that no signature walhook sends (over
//! `id.timestamp.body`) can be replayed as a proof. During a rotation
//! overlap a proof by any active secret passes; proofs are compared in
//! constant time.
//!
//! Until the endpoint passes, its deliveries are made and wait, visible. A
//! failed check is tried again every [`VerifySettings::retry_every`], and
//! the endpoint's record says what to answer; a re-send through the API
//! asks with a new challenge at once.
//!
//! Every dispatcher node runs the check for the endpoints it sees waiting;
//! the first proof recorded verifies the endpoint (a check of an older
//! challenge verifies nothing).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use super::egress::{Egress, EgressResult, Outbound, signed};
use super::outcome::AttemptOutcome;
use crate::endpoint::{EndpointConfig, SubscriptionCache};
use crate::ids::EndpointId;
use crate::signing::{SigningSecret, VersionedSecret};
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

/// The domain separation of an ownership proof: the HMAC message is this
/// followed by the challenge. No Standard Webhooks signature signs a
/// message of this shape (theirs is `id.timestamp.body`).
pub const PROOF_CONTEXT: &str = "walhook-verification.v1.";

/// The longest answer the judge reads, in bytes: the egress keeps this much
/// of a response body as its excerpt (`EXCERPT_MAX_BYTES` of the HTTP
/// egress, checked equal in the end-to-end tests). A proof answer is about
/// 60 bytes.
pub const MAX_ANSWER_BYTES: usize = 1024;

/// What the endpoint's record says to answer, after why a check failed.
const HOW_TO_ANSWER: &str = "answer 2xx with {\"proof\":\"<base64 of HMAC-SHA256(key = the bytes after whsec_ in \
     the endpoint's secret, message = \"walhook-verification.v1.\" + challenge)>\"} \
     (docs/api.md, Endpoint ownership checks)";

/// The signed request that asks `endpoint` to prove it holds its secret
/// for `challenge`.
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

fn proof_mac(secret: &SigningSecret, challenge: &str) -> Hmac<Sha256> {
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(secret.expose_bytes())
        .expect("HMAC takes keys of any length");
    mac.update(PROOF_CONTEXT.as_bytes());
    mac.update(challenge.as_bytes());
    mac
}

/// The proof the holder of `secret` answers for `challenge`: base64
/// (standard alphabet, padded) of the HMAC.
pub fn ownership_proof(secret: &SigningSecret, challenge: &str) -> String {
    STANDARD.encode(proof_mac(secret, challenge).finalize().into_bytes())
}

/// The version of the secret among `secrets` whose proof of `challenge` is
/// `given`, compared in constant time (each secret is tried; the time does
/// not depend on where `given` differs).
fn proven_by(secrets: &[VersionedSecret], challenge: &str, given: &[u8]) -> Option<i32> {
    secrets
        .iter()
        .find(|s| proof_mac(&s.secret, challenge).verify_slice(given).is_ok())
        .map(|s| s.version)
}

/// Whether the answer passes the check: a 2xx whose body is a JSON object
/// with a `proof` of `challenge` by one of `secrets` (the endpoint's active
/// secrets). `Ok` holds the secret version that proved it; `Err` says what
/// came back instead and what to answer, for the endpoint's record (never
/// the body itself, nor the challenge).
pub fn judge(
    result: &EgressResult,
    challenge: &str,
    secrets: &[VersionedSecret],
) -> Result<i32, String> {
    let status = match result.outcome {
        AttemptOutcome::Delivered { status } => status,
        AttemptOutcome::Gone => {
            return Err(format!("the endpoint answered 410 Gone; {HOW_TO_ANSWER}"));
        }
        AttemptOutcome::Retryable { status, class, .. }
        | AttemptOutcome::Rejected { status, class } => {
            return Err(match status {
                Some(s) => format!(
                    "the endpoint answered {s} ({}); {HOW_TO_ANSWER}",
                    class.as_str()
                ),
                None => format!("no answer ({}); {HOW_TO_ANSWER}", class.as_str()),
            });
        }
    };
    let Some(body) = result.response_excerpt.as_deref() else {
        return Err(format!(
            "the endpoint answered {status} with an empty body; {HOW_TO_ANSWER}"
        ));
    };
    let answer = serde_json::from_str::<serde_json::Value>(body).ok();
    let Some(proof) = answer.as_ref().and_then(|a| a.get("proof")) else {
        return Err(if body.contains(challenge) {
            // The request (its body or its webhook-id header) came back:
            // any reflecting server does that, whoever runs it.
            format!(
                "the endpoint answered {status} with the challenge echoed back, which proves \
                 nothing (any server that reflects its request does it); {HOW_TO_ANSWER}"
            )
        } else if body.len() + crate::sanitize::ELLIPSIS.len() > MAX_ANSWER_BYTES
            && body.ends_with(crate::sanitize::ELLIPSIS)
        {
            format!(
                "the endpoint answered {status} with a body longer than {MAX_ANSWER_BYTES} bytes, \
                 of which only the start is read; {HOW_TO_ANSWER}"
            )
        } else {
            format!(
                "the endpoint answered {status} without a JSON object holding \"proof\"; {HOW_TO_ANSWER}"
            )
        });
    };
    let given = proof
        .as_str()
        .and_then(|p| STANDARD.decode(p.trim()).ok())
        .filter(|b| b.len() == 32)
        .ok_or_else(|| {
            format!(
                "the endpoint answered {status} with a \"proof\" that is not standard base64 \
                 of 32 bytes; {HOW_TO_ANSWER}"
            )
        })?;
    proven_by(secrets, challenge, &given).ok_or_else(|| {
        "the endpoint's proof does not match any active secret of the endpoint: compute it \
         with the secret (whsec_…) walhook showed when the endpoint was created or its \
         secret last rotated, over \"walhook-verification.v1.\" + the challenge of this request"
            .to_owned()
    })
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
    let mut checks: JoinSet<(EndpointId, String, Result<i32, String>)> = JoinSet::new();
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
                let result = match result {
                    Ok(version) => {
                        tracing::info!(endpoint_id = %id, secret_version = version, "endpoint verified: it answered the ownership proof");
                        Ok(())
                    }
                    Err(why) => {
                        tracing::warn!(endpoint_id = %id, "endpoint verification failed: {why}");
                        Err(why)
                    }
                };
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
                        let verdict = judge(&result, &challenge, &ep.secrets);
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

    fn versioned(version: i32, secret: &SigningSecret) -> VersionedSecret {
        VersionedSecret {
            version,
            secret: secret.clone(),
        }
    }

    /// The proof of a fixed secret and challenge, computed independently
    /// (Python: `base64.b64encode(hmac.new(base64.b64decode(
    /// "C2FVsBQIhrscChlQIMV+b5sSYspob7oD"), b"walhook-verification.v1.abc123",
    /// hashlib.sha256).digest())`), so that the documented receivers and
    /// this judge agree on the bytes.
    #[test]
    fn the_proof_has_a_known_answer() {
        let secret = SigningSecret::parse("whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD").unwrap();
        assert_eq!(
            ownership_proof(&secret, "abc123"),
            "Wqrm9XhpSVCHCGzq3LOPCfN1alVjqUuC8JeN9Ld9GGQ="
        );
    }

    #[test]
    fn only_a_2xx_proof_by_an_active_secret_passes() {
        let (old, new, stranger) = (
            SigningSecret::generate(),
            SigningSecret::generate(),
            SigningSecret::generate(),
        );
        let active = [versioned(2, &new), versioned(1, &old)];
        let answer = |s: &SigningSecret| format!(r#"{{"proof":"{}"}}"#, ownership_proof(s, "c1"));
        // Either secret of a rotation overlap proves it.
        assert_eq!(judge(&answered(200, &answer(&new)), "c1", &active), Ok(2));
        assert_eq!(judge(&answered(202, &answer(&old)), "c1", &active), Ok(1));
        // Extra members and whitespace are fine.
        let roomy = format!(
            "{{ \"challenge\": \"c1\",\n  \"proof\": \"{}\" }}",
            ownership_proof(&new, "c1")
        );
        assert_eq!(judge(&answered(200, &roomy), "c1", &active), Ok(2));
        // Another secret, another challenge, a non-2xx: no.
        let err = judge(&answered(200, &answer(&stranger)), "c1", &active).unwrap_err();
        assert!(err.contains("does not match any active secret"), "{err}");
        let other = format!(r#"{{"proof":"{}"}}"#, ownership_proof(&new, "c0"));
        assert!(judge(&answered(200, &other), "c1", &active).is_err());
        let err = judge(&answered(404, &answer(&new)), "c1", &active).unwrap_err();
        assert!(err.contains("404") && err.contains("\"proof\""), "{err}");
        // No secret, no proof.
        assert!(judge(&answered(200, &answer(&new)), "c1", &[]).is_err());
    }

    #[test]
    fn an_echo_of_the_request_does_not_pass_and_says_what_to_answer() {
        let secret = SigningSecret::generate();
        let active = [versioned(1, &secret)];
        let endpoint = EndpointConfig {
            id: EndpointId([7; 16]),
            tenant_id: crate::ids::TenantId::new("acme").unwrap(),
            url: "http://127.0.0.1:9/hook".into(),
            event_types: vec![],
            enabled: true,
            config_version: 1,
            rate_limit_per_sec: None,
            max_in_flight: None,
            secrets: active.to_vec().into(),
            retry: Default::default(),
            verification: None,
            ordering: Default::default(),
            created_at: crate::time::Timestamp(0),
            quarantine: None,
            history: vec![],
        };
        let request = challenge_request(&endpoint, "c0ffee", 1_700_000_000);
        // The body echoed.
        let body = String::from_utf8(request.body.to_vec()).unwrap();
        let err = judge(&answered(200, &body), "c0ffee", &active).unwrap_err();
        assert!(
            err.contains("echoed") && err.contains("walhook-verification.v1."),
            "{err}"
        );
        assert!(
            !err.contains("c0ffee"),
            "the record shows the challenge: {err}"
        );
        // The headers echoed, as JSON.
        let headers: serde_json::Map<String, serde_json::Value> = request
            .headers
            .iter()
            .map(|(k, v)| ((*k).to_owned(), serde_json::Value::String(v.clone())))
            .collect();
        let echoed = serde_json::Value::Object(headers).to_string();
        assert!(judge(&answered(200, &echoed), "c0ffee", &active).is_err());
        // The old answer, and nothing at all.
        let old = judge(
            &answered(200, r#"{"challenge":"c0ffee"}"#),
            "c0ffee",
            &active,
        );
        assert!(old.unwrap_err().contains("echoed"));
        let bare = EgressResult::bare(AttemptOutcome::Delivered { status: 204 });
        assert!(
            judge(&bare, "c0ffee", &active)
                .unwrap_err()
                .contains("empty body")
        );
        let err = judge(
            &answered(200, r#"{"proof":"not base64!"}"#),
            "c0ffee",
            &active,
        );
        assert!(err.unwrap_err().contains("standard base64"));
        let err = judge(&answered(200, "ok"), "c0ffee", &active).unwrap_err();
        assert!(err.contains("without a JSON object"), "{err}");
        // An answer longer than the excerpt the egress keeps is cut there,
        // and the record says so.
        let mut long = format!("{{\"padding\":\"{}", "x".repeat(2000));
        long.truncate(MAX_ANSWER_BYTES - crate::sanitize::ELLIPSIS.len());
        long.push_str(crate::sanitize::ELLIPSIS);
        let err = judge(&answered(200, &long), "c0ffee", &active).unwrap_err();
        assert!(err.contains("longer than 1024 bytes"), "{err}");
        // A record stays under the stored limit.
        assert!(err.len() < 512, "{}", err.len());
    }
}
