-- Members of a stage on the shared log, and who holds each partition
-- (issue 31 item 2): `walhook fanout` without --member joins here, and
-- the partitions are shared out among the live members.
--
-- stage_members: one row per member slot of a group. A process joins by
-- taking the lowest slot whose lease lapsed (or a new one); taking a slot
-- bumps its epoch, so a process that held it before (frozen, or cut off
-- from this database) can neither renew it nor act for it again. The slot
-- also names the member's dispatcher node (<node_id>-fanout-<slot>), so a
-- process that takes a slot takes back what the slot's node held. Rows are
-- never deleted: a member that leaves lets its lease lapse at once, and the
-- epoch of a slot only grows.
--
-- stage_partitions: the holder of each partition, a (slot, epoch). A
-- partition is free when its holder is not a live member. A member commits
-- a partition's offset only after recording it here in a statement that
-- checks it still holds the partition under a live lease: the fence that
-- keeps a member that lost a partition from moving its offset.
--
-- Every change of membership or holding takes a transaction-scoped
-- advisory lock per group first, so two members never see each other's
-- partition as free at once.
CREATE TABLE walhook.stage_members (
    grp          text NOT NULL,
    slot         integer NOT NULL CHECK (slot >= 0),
    epoch        bigint NOT NULL CHECK (epoch > 0),
    holder       text NOT NULL,
    joined_at    timestamptz NOT NULL DEFAULT now(),
    lease_until  timestamptz NOT NULL,
    PRIMARY KEY (grp, slot)
);

CREATE TABLE walhook.stage_partitions (
    grp           text NOT NULL,
    partition     integer NOT NULL CHECK (partition >= 0),
    slot          integer,
    epoch         bigint,
    -- How many times the partition changed hands (taken or given back).
    changes       bigint NOT NULL DEFAULT 0,
    held_since    timestamptz,
    -- The last offset committed through the fence, and when.
    committed     bigint,
    committed_at  timestamptz,
    PRIMARY KEY (grp, partition),
    CHECK ((slot IS NULL) = (epoch IS NULL))
);
