//! Incidents of fan-out, dispatch and the endpoint directory: one open row
//! per (stage, kind, subject), occurrences folded in.

use walhook_pipeline::incident::{IncidentStore, StageIncident};

use crate::{Platform, StoreError};

const UPSERT: &str = "\
INSERT INTO walhook.incidents (stage, kind, subject, detail, occurrences) \
SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::int8[]) \
ON CONFLICT (stage, kind, subject) WHERE resolved_at IS NULL DO UPDATE SET \
    occurrences = walhook.incidents.occurrences + EXCLUDED.occurrences, \
    detail = EXCLUDED.detail, last_seen = now() \
RETURNING subject, (xmax = 0) AS inserted";

impl Platform {
    /// Stores `incidents`; returns the subjects whose incident is new (no
    /// open one existed).
    pub async fn upsert_incidents(
        &self,
        client: &impl deadpool_postgres::GenericClient,
        incidents: &[StageIncident],
    ) -> Result<Vec<String>, StoreError> {
        if incidents.is_empty() {
            return Ok(Vec::new());
        }
        // One row per key: a statement may not touch a row twice.
        let mut folded: Vec<StageIncident> = Vec::with_capacity(incidents.len());
        for i in incidents {
            match folded
                .iter_mut()
                .find(|f| f.stage == i.stage && f.kind == i.kind && f.subject == i.subject)
            {
                Some(f) => {
                    f.occurrences += i.occurrences;
                    f.detail.clone_from(&i.detail);
                }
                None => folded.push(i.clone()),
            }
        }
        let stages: Vec<&str> = folded.iter().map(|i| i.stage.as_str()).collect();
        let kinds: Vec<&str> = folded.iter().map(|i| i.kind.as_str()).collect();
        let subjects: Vec<&str> = folded.iter().map(|i| i.subject.as_str()).collect();
        let details: Vec<&str> = folded.iter().map(|i| i.detail.as_str()).collect();
        let counts: Vec<i64> = folded
            .iter()
            .map(|i| i64::try_from(i.occurrences).unwrap_or(i64::MAX))
            .collect();
        let rows = client
            .query(UPSERT, &[&stages, &kinds, &subjects, &details, &counts])
            .await
            .map_err(StoreError::query("record incidents"))?;
        Ok(rows
            .iter()
            .filter(|r| r.get::<_, bool>(1))
            .map(|r| r.get(0))
            .collect())
    }

    /// Open incidents, newest first (operators, tests).
    pub async fn open_incidents(&self) -> Result<Vec<StoredIncident>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT stage, kind, subject, detail, occurrences FROM walhook.incidents \
                 WHERE resolved_at IS NULL ORDER BY last_seen DESC, id DESC",
                &[],
            )
            .await
            .map_err(StoreError::query("read incidents"))?;
        Ok(rows
            .iter()
            .map(|r| StoredIncident {
                stage: r.get(0),
                kind: r.get(1),
                subject: r.get(2),
                detail: r.get(3),
                occurrences: r.get(4),
            })
            .collect())
    }
}

/// An incident as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredIncident {
    /// `fanout`, `dispatch` or `directory`.
    pub stage: String,
    /// What happened.
    pub kind: String,
    /// What it is about.
    pub subject: String,
    /// The sentence for the operator.
    pub detail: String,
    /// How many times.
    pub occurrences: i64,
}

impl IncidentStore for Platform {
    async fn record_incidents(
        &self,
        incidents: &[StageIncident],
    ) -> Result<(), walhook_pipeline::store::StoreError> {
        let client = self.client().await?;
        self.upsert_incidents(&client, incidents).await?;
        Ok(())
    }
}
