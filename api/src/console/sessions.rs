//! The console's session table: who is signed in, until when, and how
//! many sessions one credential and everyone together may hold.
//!
//! A credential (an API key, or the operator token) holds at most
//! [`MAX_SESSIONS_PER_CREDENTIAL`] sessions: signing in once more ends its
//! own oldest session, never anyone else's. The table as a whole holds at
//! most [`MAX_SESSIONS`]; when that many live sessions exist, a new sign-in
//! is refused (a 429 page) rather than signing someone else out. Expired
//! sessions are dropped whenever a session is added, so the table holds
//! live sessions only.

use std::collections::HashMap;
use std::time::Instant;

use super::Session;
use crate::ratelimit::CredentialKey;

/// Sessions one credential may hold; the oldest ends beyond.
pub(crate) const MAX_SESSIONS_PER_CREDENTIAL: usize = 20;

/// Sessions kept at most; beyond, sign-ins are refused.
pub(crate) const MAX_SESSIONS: usize = 10_000;

/// Every live session by id.
pub(crate) struct Sessions {
    by_id: HashMap<String, Session>,
    max_total: usize,
    per_credential: usize,
}

/// A session not added: the table is full of others' live sessions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Full {
    /// The most the table holds.
    pub(crate) max: usize,
}

impl Default for Sessions {
    fn default() -> Self {
        Sessions::with_caps(MAX_SESSIONS, MAX_SESSIONS_PER_CREDENTIAL)
    }
}

impl Sessions {
    /// A table of at most `max_total` sessions, `per_credential` per
    /// credential.
    pub(crate) fn with_caps(max_total: usize, per_credential: usize) -> Self {
        Sessions {
            by_id: HashMap::new(),
            max_total,
            per_credential: per_credential.max(1),
        }
    }

    /// The live session `id`; an expired one is removed.
    pub(crate) fn get(&mut self, id: &str, now: Instant) -> Option<Session> {
        match self.by_id.get(id) {
            Some(s) if s.expires > now => Some(s.clone()),
            Some(_) => {
                self.by_id.remove(id);
                None
            }
            None => None,
        }
    }

    /// Adds `session` as `id`: ends the credential's own oldest sessions
    /// beyond its cap (how many ended is returned), or refuses when the
    /// table is full of other live sessions.
    pub(crate) fn insert(
        &mut self,
        id: String,
        session: Session,
        now: Instant,
    ) -> Result<usize, Full> {
        self.by_id.retain(|_, s| s.expires > now);
        let owner = session.owner;
        let mut own: Vec<(Instant, String)> = self
            .by_id
            .iter()
            .filter(|(_, s)| s.owner == owner)
            .map(|(k, s)| (s.expires, k.clone()))
            .collect();
        let mut ended = 0;
        if own.len() >= self.per_credential {
            own.sort();
            for (_, k) in own.iter().take(own.len() + 1 - self.per_credential) {
                self.by_id.remove(k);
                ended += 1;
            }
        }
        if self.by_id.len() >= self.max_total {
            return Err(Full {
                max: self.max_total,
            });
        }
        self.by_id.insert(id, session);
        Ok(ended)
    }

    /// Ends session `id`.
    pub(crate) fn remove(&mut self, id: &str) {
        self.by_id.remove(id);
    }

    /// Live and expired sessions held now.
    pub(crate) fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Sessions held by `credential`.
    pub(crate) fn held_by(&self, credential: CredentialKey) -> usize {
        self.by_id
            .values()
            .filter(|s| s.owner == credential)
            .count()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::Who;
    use super::*;

    fn session(credential: &str, expires: Instant) -> Session {
        Session {
            credential: credential.to_owned(),
            owner: CredentialKey::of(credential),
            who: Who::Operator,
            csrf: String::new(),
            expires,
        }
    }

    #[test]
    fn a_credential_ends_only_its_own_oldest_sessions() {
        let t0 = Instant::now();
        let mut table = Sessions::with_caps(100, 3);
        let far = t0 + Duration::from_secs(3600);
        table
            .insert("op".into(), session("operator", far), t0)
            .unwrap();
        for i in 0..50u64 {
            let ended = table
                .insert(
                    format!("t{i}"),
                    session("whk_tenant", far + Duration::from_secs(i)),
                    t0,
                )
                .unwrap();
            assert_eq!(ended, usize::from(i >= 3), "sign-in {i}");
        }
        assert_eq!(table.held_by(CredentialKey::of("whk_tenant")), 3);
        assert!(table.get("op", t0).is_some());
        // The newest three are kept.
        assert!(table.get("t49", t0).is_some() && table.get("t47", t0).is_some());
        assert!(table.get("t46", t0).is_none());
    }

    #[test]
    fn a_full_table_refuses_instead_of_evicting_others() {
        let t0 = Instant::now();
        let mut table = Sessions::with_caps(4, 2);
        let far = t0 + Duration::from_secs(3600);
        for who in ["a", "b", "c", "d"] {
            table.insert(who.into(), session(who, far), t0).unwrap();
        }
        assert_eq!(
            table.insert("e".into(), session("e", far), t0),
            Err(Full { max: 4 })
        );
        assert_eq!(table.len(), 4);
        // A credential already holding a session may still renew it: its
        // own oldest makes room.
        let mut at_cap = Sessions::with_caps(2, 1);
        at_cap.insert("a1".into(), session("a", far), t0).unwrap();
        at_cap.insert("b1".into(), session("b", far), t0).unwrap();
        assert_eq!(at_cap.insert("a2".into(), session("a", far), t0), Ok(1));
        assert!(at_cap.get("b1", t0).is_some());
        // Expired sessions leave room.
        let later = far + Duration::from_secs(1);
        table
            .insert(
                "e".into(),
                session("e", later + Duration::from_secs(60)),
                later,
            )
            .unwrap();
        assert_eq!(table.len(), 1);
    }
}
