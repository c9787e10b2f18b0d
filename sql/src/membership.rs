//! The membership store: members of a stage and the partitions they hold
//! (`walhook.stage_members`, `walhook.stage_partitions`, migration 0025).
//!
//! Joins, renewals and claims of one group run one at a time under a
//! transaction-scoped advisory lock, so a member never sees a partition as
//! free while another is taking it, and a renewal's list of holdings is
//! never older than a claim that took one of them.
//!
//! Members with a fixed share (`walhook fanout --member I/N`) hold no
//! partition here, but they hold a lease of their own, in the group
//! `<group>#fixed/<N>` with slot I, under the same lock: a fixed member
//! does not start beside live joined members or beside fixed members of
//! another N, a joined member does not start beside live fixed members,
//! and of two processes given the same I/N the later takes the share and
//! the earlier stops at its next renewal. A member of either kind whose
//! lease lapsed while one of the other kind started loses its renewal.

use std::sync::LazyLock;
use std::time::Duration;

use walhook_pipeline::ids::Offset;
use walhook_pipeline::membership::{BoxFuture, Held, Member, MembershipStore};
use walhook_pipeline::store::StoreError as PipelineStoreError;

use crate::{Platform, StoreError};

/// The first key of the groups' advisory locks ("whkm").
const LOCK_SPACE: i32 = 0x7768_6b6d;

const LOCK: &str = "SELECT pg_advisory_xact_lock($1, hashtext($2))";

/// What follows a group's key in the groups of its fixed shares
/// (`<group>#fixed/<N>`).
const FIXED_MARK: &str = "#fixed/";

/// Whether row `m` of `stage_members` is a live fixed member of group $1.
fn live_fixed(m: &str) -> String {
    format!("starts_with({m}.grp, $1::text || '{FIXED_MARK}') AND {m}.lease_until > now()")
}

/// The live members with a fixed share of group $1, of any N: N, I and
/// the holder.
static LIVE_FIXED: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT substr(m.grp, length($1::text || '{FIXED_MARK}') + 1), m.slot, m.holder \
         FROM walhook.stage_members m WHERE {} ORDER BY 1, 2",
        live_fixed("m")
    )
});

/// The live members that joined group $1: slot and holder.
const LIVE_JOINED: &str = "\
SELECT slot, holder FROM walhook.stage_members WHERE grp = $1 AND lease_until > now() ORDER BY slot";

/// Takes the lowest slot held by no live member (among 0..=rows, one of
/// which is free), bumping its epoch.
const JOIN: &str = "\
WITH free AS ( \
    SELECT s FROM generate_series(0, (SELECT count(*) FROM walhook.stage_members WHERE grp = $1)::int) AS s \
    WHERE NOT EXISTS (SELECT 1 FROM walhook.stage_members m \
                      WHERE m.grp = $1 AND m.slot = s AND m.lease_until > now()) \
    ORDER BY s LIMIT 1) \
INSERT INTO walhook.stage_members (grp, slot, epoch, holder, lease_until) \
SELECT $1, s, 1, $2, now() + $3 * interval '1 millisecond' FROM free \
ON CONFLICT (grp, slot) DO UPDATE SET epoch = walhook.stage_members.epoch + 1, \
    holder = EXCLUDED.holder, joined_at = now(), lease_until = EXCLUDED.lease_until \
RETURNING slot, epoch";

static RENEW: LazyLock<String> = LazyLock::new(|| {
    format!(
        "WITH me AS ( \
            UPDATE walhook.stage_members SET lease_until = now() + $4 * interval '1 millisecond' \
            WHERE grp = $1 AND slot = $2 AND epoch = $3 \
              AND NOT EXISTS (SELECT 1 FROM walhook.stage_members f WHERE {}) \
            RETURNING 1) \
         SELECT EXISTS (SELECT 1 FROM me), \
            coalesce(array_agg(partition ORDER BY partition), '{{}}'), \
            coalesce(array_agg(changes ORDER BY partition), '{{}}') \
         FROM walhook.stage_partitions WHERE grp = $1 AND slot = $2 AND epoch = $3",
        live_fixed("f")
    )
});

/// A member is live while its lease runs.
const LIVE_MEMBER: &str = "\
EXISTS (SELECT 1 FROM walhook.stage_members m \
        WHERE m.grp = p.grp AND m.slot = $2 AND m.epoch = $3 AND m.lease_until > now())";

/// Gives back the partitions of member ($2, $3) of group $1 that the rest
/// of the `WHERE` names.
const FREE: &str = "\
UPDATE walhook.stage_partitions SET slot = NULL, epoch = NULL, changes = changes + 1, held_since = NULL \
WHERE grp = $1 AND slot = $2 AND epoch = $3";

/// Takes partition $4 for member ($2, $3) if that member is live and no
/// live member holds it; returns the new token.
static CLAIM: LazyLock<String> = LazyLock::new(|| {
    format!(
        "UPDATE walhook.stage_partitions p \
         SET slot = $2, epoch = $3, changes = p.changes + 1, held_since = now() \
         WHERE p.grp = $1 AND p.partition = $4 AND {LIVE_MEMBER} \
           AND (p.slot IS NULL OR NOT EXISTS ( \
                SELECT 1 FROM walhook.stage_members h \
                WHERE h.grp = p.grp AND h.slot = p.slot AND h.epoch = p.epoch AND h.lease_until > now())) \
         RETURNING p.changes"
    )
});

/// Records commit $6 of partition $4 if holding $5 is still the member's
/// and its lease live (one row) or not (none). Run before every commit of
/// a fan-out batch: prepared once per connection.
static FENCE_COMMIT: LazyLock<String> = LazyLock::new(|| {
    format!(
        "UPDATE walhook.stage_partitions p \
         SET committed = greatest(coalesce(p.committed, 0), $6), committed_at = now() \
         WHERE p.grp = $1 AND p.partition = $4 AND p.slot = $2 AND p.epoch = $3 \
           AND p.changes = $5 AND {LIVE_MEMBER}"
    )
});

impl Platform {
    /// Runs `statement` after taking `group`'s lock, in one transaction.
    async fn locked<T>(
        &self,
        group: &str,
        what: &'static str,
        run: impl AsyncFnOnce(&tokio_postgres::Transaction<'_>) -> Result<T, tokio_postgres::Error>,
    ) -> Result<T, StoreError> {
        let mut client = self.client().await?;
        let tx = client
            .transaction()
            .await
            .map_err(StoreError::query("begin"))?;
        tx.execute(LOCK, &[&LOCK_SPACE, &group])
            .await
            .map_err(StoreError::query("lock the group's membership"))?;
        let out = run(&tx).await.map_err(StoreError::query(what))?;
        crate::commit!(tx, client).map_err(StoreError::query("commit"))?;
        Ok(out)
    }
}

impl Platform {
    /// Takes share I of N (`walhook fanout --member I/N`) of `group`: a
    /// lease on slot I of `<group>#fixed/<N>`. Refused while members that
    /// joined the group, or fixed members of another N, are live. A live
    /// holder of the same I/N loses the share (it stops at its next
    /// renewal): returned with the new member, so that the caller can say
    /// whom it replaced.
    pub async fn take_fixed_share(
        &self,
        group: &str,
        holder: &str,
        (member, members): (u32, u32),
        lease: Duration,
    ) -> Result<(Member, Option<String>), StoreError> {
        let fixed = fixed_group(group, members);
        let n = members.to_string();
        let outcome = self
            .locked(group, "take a fixed share", async |tx| {
                let joined = tx.query(LIVE_JOINED, &[&group]).await?;
                if !joined.is_empty() {
                    return Ok(Err(format!(
                        "members that joined group {group} are live: {}. A fixed share would read partitions \
                         they hold, and the same events would be fanned out twice. Stop them, or run this \
                         process without --member; a member that stopped leaves at once, one that was killed \
                         when its lease ends ([log] member_lease)",
                        joined
                            .iter()
                            .map(|r| format!("slot {} ({})", r.get::<_, i32>(0), r.get::<_, String>(1)))
                            .collect::<Vec<_>>()
                            .join(", ")
                    )));
                }
                let others: Vec<_> = tx
                    .query(&*LIVE_FIXED, &[&group])
                    .await?
                    .into_iter()
                    .filter(|r| r.get::<_, String>(0) != n)
                    .collect();
                if !others.is_empty() {
                    return Ok(Err(format!(
                        "members with another count run in group {group}: {}. Members I/N and J/M with N \
                         other than M read overlapping partitions: give every fixed member the same N",
                        fixed_list(&others)
                    )));
                }
                let before: Option<String> = tx
                    .query_opt(
                        "SELECT holder FROM walhook.stage_members \
                         WHERE grp = $1 AND slot = $2 AND lease_until > now()",
                        &[&fixed, &int(member)],
                    )
                    .await?
                    .map(|r| r.get(0));
                let row = tx
                    .query_one(
                        "INSERT INTO walhook.stage_members (grp, slot, epoch, holder, lease_until) \
                         VALUES ($1, $2, 1, $3, now() + $4 * interval '1 millisecond') \
                         ON CONFLICT (grp, slot) DO UPDATE SET epoch = walhook.stage_members.epoch + 1, \
                             holder = EXCLUDED.holder, joined_at = now(), lease_until = EXCLUDED.lease_until \
                         RETURNING slot, epoch",
                        &[&fixed, &int(member), &holder, &millis(lease)],
                    )
                    .await?;
                Ok(Ok((
                    Member {
                        slot: number(row.get(0)),
                        epoch: row.get(1),
                    },
                    before,
                )))
            })
            .await?;
        outcome.map_err(|why| StoreError::Refused(format!("--member {member}/{members}: {why}")))
    }

    /// Renews a fixed share taken by [`Platform::take_fixed_share`]; false
    /// once another process took the same I/N, or a member joined the
    /// group while this lease had lapsed: the share is no longer this
    /// process's.
    pub async fn renew_fixed_share(
        &self,
        group: &str,
        members: u32,
        member: Member,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let fixed = fixed_group(group, members);
        self.locked(group, "renew a fixed share", async |tx| {
            tx.execute(
                &format!(
                    "UPDATE walhook.stage_members SET lease_until = now() + $4 * interval '1 millisecond' \
                     WHERE grp = $1 AND slot = $2 AND epoch = $3 \
                       AND NOT EXISTS ({LIVE_JOINED_EXISTS})"
                ),
                &[&fixed, &slot(member), &member.epoch, &millis(lease), &group],
            )
            .await
        })
        .await
        .map(|n| n == 1)
    }

    /// Gives a fixed share up at once (a process that stops), so that
    /// another mode can start without waiting for the lease.
    pub async fn leave_fixed_share(
        &self,
        group: &str,
        members: u32,
        member: Member,
    ) -> Result<(), StoreError> {
        self.client()
            .await?
            .execute(
                "UPDATE walhook.stage_members SET lease_until = now() \
                 WHERE grp = $1 AND slot = $2 AND epoch = $3",
                &[&fixed_group(group, members), &slot(member), &member.epoch],
            )
            .await
            .map_err(StoreError::query("give a fixed share up"))?;
        Ok(())
    }
}

/// A live member that joined group $5 (for a fixed share's renewal).
const LIVE_JOINED_EXISTS: &str =
    "SELECT 1 FROM walhook.stage_members j WHERE j.grp = $5 AND j.lease_until > now()";

/// The group of the fixed shares of `group` with `members` members.
fn fixed_group(group: &str, members: u32) -> String {
    format!("{group}{FIXED_MARK}{members}")
}

/// Fixed members as `member I/N (holder)`, from [`LIVE_FIXED`]'s rows.
fn fixed_list(rows: &[tokio_postgres::Row]) -> String {
    rows.iter()
        .map(|r| {
            format!(
                "member {}/{} ({})",
                r.get::<_, i32>(1),
                r.get::<_, String>(0),
                r.get::<_, String>(2)
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn millis(lease: Duration) -> f64 {
    lease.as_millis() as f64
}

/// A slot or partition number as Postgres's `integer`.
fn int(n: u32) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// An `integer` column holding a slot or partition number.
fn number(n: i32) -> u32 {
    u32::try_from(n).unwrap_or_default()
}

fn slot(member: Member) -> i32 {
    int(member.slot)
}

impl MembershipStore for Platform {
    fn join<'a>(
        &'a self,
        group: &'a str,
        holder: &'a str,
        partitions: u32,
        lease: Duration,
    ) -> BoxFuture<'a, Result<Member, PipelineStoreError>> {
        Box::pin(async move {
            let count = int(partitions);
            let row = self
                .locked(group, "join the group", async |tx| {
                    let fixed = tx.query(&*LIVE_FIXED, &[&group]).await?;
                    if !fixed.is_empty() {
                        return Ok(Err(fixed));
                    }
                    tx.execute(
                        "INSERT INTO walhook.stage_partitions (grp, partition) \
                         SELECT $1, generate_series(0, $2 - 1) ON CONFLICT DO NOTHING",
                        &[&group, &count],
                    )
                    .await?;
                    tx.query_one(JOIN, &[&group, &holder, &millis(lease)])
                        .await
                        .map(Ok)
                })
                .await?
                .map_err(|fixed| {
                    StoreError::Refused(format!(
                        "members with a fixed share (`walhook fanout --member I/N`) run in group {group}: {}. \
                         A member that joins would read the partitions they read, and the same events would be \
                         fanned out twice. Stop them, or give this process --member too; a member that stopped \
                         leaves its share at once, one that was killed when its lease ends ([log] member_lease)",
                        fixed_list(&fixed)
                    ))
                })?;
            Ok(Member {
                slot: number(row.get(0)),
                epoch: row.get(1),
            })
        })
    }

    fn renew<'a>(
        &'a self,
        group: &'a str,
        member: Member,
        lease: Duration,
    ) -> BoxFuture<'a, Result<Option<Held>, PipelineStoreError>> {
        Box::pin(async move {
            let row = self
                .locked(group, "renew the member's lease", async |tx| {
                    tx.query_one(
                        &*RENEW,
                        &[&group, &slot(member), &member.epoch, &millis(lease)],
                    )
                    .await
                })
                .await?;
            if !row.get::<_, bool>(0) {
                return Ok(None);
            }
            let partitions: Vec<i32> = row.get(1);
            let tokens: Vec<i64> = row.get(2);
            Ok(Some(
                partitions
                    .into_iter()
                    .zip(tokens)
                    .map(|(p, t)| (number(p), t))
                    .collect(),
            ))
        })
    }

    fn live<'a>(&'a self, group: &'a str) -> BoxFuture<'a, Result<Vec<u32>, PipelineStoreError>> {
        Box::pin(async move {
            let client = self.client().await?;
            let rows = client
                .query(
                    "SELECT slot FROM walhook.stage_members \
                     WHERE grp = $1 AND lease_until > now() ORDER BY slot",
                    &[&group],
                )
                .await
                .map_err(StoreError::query("list the live members"))?;
            Ok(rows.iter().map(|r| number(r.get(0))).collect())
        })
    }

    fn claim<'a>(
        &'a self,
        group: &'a str,
        member: Member,
        partition: u32,
    ) -> BoxFuture<'a, Result<Option<i64>, PipelineStoreError>> {
        Box::pin(async move {
            let p = int(partition);
            let row = self
                .locked(group, "claim a partition", async |tx| {
                    tx.query_opt(&*CLAIM, &[&group, &slot(member), &member.epoch, &p])
                        .await
                })
                .await?;
            Ok(row.map(|r| r.get(0)))
        })
    }

    fn release<'a>(
        &'a self,
        group: &'a str,
        member: Member,
        partition: u32,
        token: i64,
    ) -> BoxFuture<'a, Result<(), PipelineStoreError>> {
        Box::pin(async move {
            let p = int(partition);
            self.client()
                .await?
                .execute(
                    &format!("{FREE} AND partition = $4 AND changes = $5"),
                    &[&group, &slot(member), &member.epoch, &p, &token],
                )
                .await
                .map_err(StoreError::query("give a partition back"))?;
            Ok(())
        })
    }

    fn fence_commit<'a>(
        &'a self,
        group: &'a str,
        member: Member,
        partition: u32,
        token: i64,
        next: Offset,
    ) -> BoxFuture<'a, Result<bool, PipelineStoreError>> {
        Box::pin(async move {
            let p = int(partition);
            let next = i64::try_from(next.0).unwrap_or(i64::MAX);
            let what = "check the partition's holder before a commit";
            let client = self.client().await?;
            let statement = client
                .prepare_cached(&FENCE_COMMIT)
                .await
                .map_err(StoreError::query(what))?;
            let n = client
                .execute(
                    &statement,
                    &[&group, &slot(member), &member.epoch, &p, &token, &next],
                )
                .await
                .map_err(StoreError::query(what))?;
            Ok(n == 1)
        })
    }

    fn leave<'a>(
        &'a self,
        group: &'a str,
        member: Member,
    ) -> BoxFuture<'a, Result<(), PipelineStoreError>> {
        Box::pin(async move {
            self.locked(group, "leave the group", async |tx| {
                tx.execute(FREE, &[&group, &slot(member), &member.epoch])
                    .await?;
                tx.execute(
                    "UPDATE walhook.stage_members SET lease_until = now() \
                     WHERE grp = $1 AND slot = $2 AND epoch = $3",
                    &[&group, &slot(member), &member.epoch],
                )
                .await
            })
            .await?;
            Ok(())
        })
    }
}
