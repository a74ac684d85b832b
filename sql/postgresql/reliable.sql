-- The reliable status queue on PostgreSQL.
--
-- Layout: <queue>_meta holds only what dequeue searches and updates (small rows, so a
-- dequeue touches few pages); <queue>_data holds the payload, written once at enqueue and
-- read once at dequeue; <queue>_history receives finished rows.
--
-- status codes (smallint, so the ready index stays narrow):
--   0 READY       waiting; "scheduled" while due_at > now()
--   1 PROCESSING  leased to lease_owner until leased_until
--   2 DONE        acknowledged (finished_at set); moved to history later
--   3 DEAD        failed max_attempts times (last_error says why)
--
-- Generations (reliable_0012). meta and data are LIST-partitioned on `slot` into three
-- generation tables each (<queue>_meta0..2, <queue>_data0..2). New rows go to the current
-- epoch's slot (epoch e lives in slot e % 3); the archive job (queuectl.jobs.archive) is
-- the rotator: it switches new rows to the next epoch every few thousand items, moves the
-- READY rows left in the previous one forward ("seal"), copies an old epoch's finished
-- rows to history and empties its tables with TRUNCATE. A truncate frees space and index
-- entries whatever the xmin horizon: a queue drained while someone holds a snapshot open
-- for an hour keeps its size and its claim cost, where row deletes leave dead versions
-- that every claim walks until VACUUM may remove them (bench/lab/no-decay.md measures
-- both). The rotation state is four sequences, not a row: a control row updated at every
-- rotation would keep one dead version per rotation under a pinned horizon, read by every
-- claim.
--   <queue>_rot_epoch    the epoch new rows go to;
--   <queue>_rot_sealed   every epoch <= it holds no READY row the claims must see: claims
--                        walk the READY rows of the epochs above it only (one, or two
--                        between a switch and its seal);
--   <queue>_rot_emptied  every epoch <= it has been copied to history and truncated (its
--                        slot is free for epoch + 3);
--   <queue>_rot_start    the id sequence's value at the last switch.
-- Why nothing is lost or claimed twice:
--  1. A row never changes slot by an UPDATE: it moves by DELETE + INSERT with its id, in
--     one statement (a concurrent locker of a deleted row skips it; of a row moved by an
--     UPDATE of the partition key it would get an error). ack, nack, extend_lease and
--     release find a row by id in whichever slot it is: on the current slot's own tables
--     first, then on the parents for the ids not found there (reliable_0013; an UPDATE
--     that keeps a row in its slot moves nothing, so nack and release of a row of the
--     current epoch update it in place).
--  2. A writer (enqueue, enqueue_many, nack, release) reads the epoch, inserts, then reads
--     the epoch again; if a switch came in between it moves its own rows (uncommitted,
--     seen by no one else) to the new epoch's slot (rot_move). A writer that read the epoch
--     before a switch and commits after the seal leaves a READY row in a sealed epoch: the
--     claims do not see it until the truncate moves it forward (5), so it is late by one
--     rotation, never lost. (reliable_0012 needs no xid bound: a transaction that holds an
--     xid elsewhere, idle in transaction, does not stop the rotation.)
--  3. The seal moves only READY rows, which it locks first, skipping those another
--     transaction holds (a claimed row stays where it is, PROCESSING; a skipped READY row is
--     late by one rotation, as in 2), and is marked only once it has committed (sequences
--     are not transactional), so the claims' READY walk always covers every epoch that can
--     still hold a READY row other than a late or skipped one.
--  4. Finished rows never change again: the precopy copies them to history without a lock
--     (an id already there is passed over; a second rotator that copies the same ids at the
--     same moment fails its batch with unique_violation and sends it again).
--  5. The truncate locks the slot's meta and data tables ACCESS EXCLUSIVE under a short
--     lock_timeout (it retries rather than queue claims and acks behind it), copies what
--     finished since the precopy, moves every unfinished row (PROCESSING, and READY rows of
--     late writers) to the current epoch and truncates, in one transaction. A statement
--     that waited for the lock takes its snapshot after it (plpgsql: lock, then snapshot),
--     so it sees the moved rows, never the empty slot without them.
-- What TRUNCATE costs: it is not MVCC-safe. A REPEATABLE READ or SERIALIZABLE snapshot
-- older than a truncate sees the emptied slot empty and not the copies (inserted after
-- it): reports that need one consistent view read history. A session that read the
-- queue's tables and stays in its transaction (pg_dump) holds ACCESS SHARE on them: no
-- truncate can proceed, the queue stays correct and decays as a single table would, and
-- health names that session.
--
-- Sections are filled by queuectl.sqlfiles.render() with quoted identifiers only.

-- name: create_tables
-- The queue's tables and indexes as reliable_0001 creates them; reliable_0012
-- (create_rotation) makes meta and data the generation layout.
CREATE TABLE {{meta}} (
    id            bigint GENERATED ALWAYS AS IDENTITY (SEQUENCE NAME {{meta_seq}}) PRIMARY KEY,
    priority      smallint    NOT NULL DEFAULT 0,
    due_at        timestamptz NOT NULL DEFAULT now(),
    status        smallint    NOT NULL DEFAULT 0 CHECK (status BETWEEN 0 AND 3),
    title         text,
    attempts      integer     NOT NULL DEFAULT 0,
    max_attempts  integer     NOT NULL DEFAULT {{max_attempts}} CHECK (max_attempts > 0),
    lease_owner   text,
    leased_until  timestamptz,
    enqueued_at   timestamptz NOT NULL DEFAULT now(),
    dequeued_at   timestamptz,
    finished_at   timestamptz,
    last_error    text
) WITH (fillfactor = 80);
-- fillfactor leaves room on each page for the status updates of ack/nack.

CREATE TABLE {{data}} (
    id       bigint PRIMARY KEY REFERENCES {{meta}} (id) ON DELETE CASCADE,
    payload  bytea NOT NULL,
    headers  jsonb
);

-- Only READY rows are in this index, so its size follows the backlog, not the table.
CREATE INDEX {{ready_idx}} ON {{meta}} (priority, due_at, id) WHERE status = 0;

-- Only PROCESSING rows: finds expired leases without scanning the ready backlog.
CREATE INDEX {{leased_idx}} ON {{meta}} (leased_until) WHERE status = 1;

-- Only finished rows (DONE, DEAD): the archive job picks its batches here, oldest first,
-- without walking the ready backlog or re-reading rows it cannot move yet.
CREATE INDEX {{finished_idx}} ON {{meta}} (status, finished_at) WHERE status >= 2;

CREATE TABLE {{history}} (
    id            bigint PRIMARY KEY,
    priority      smallint    NOT NULL,
    due_at        timestamptz NOT NULL,
    status        smallint    NOT NULL,
    title         text,
    attempts      integer     NOT NULL,
    max_attempts  integer     NOT NULL,
    lease_owner   text,
    enqueued_at   timestamptz NOT NULL,
    dequeued_at   timestamptz,
    finished_at   timestamptz,
    last_error    text,
    payload       bytea,
    headers       jsonb,
    archived_at   timestamptz NOT NULL DEFAULT now()
);

-- History retention purges oldest-archived first, in small batches.
CREATE INDEX {{history_at_idx}} ON {{history}} (archived_at);

-- name: create_rotation
-- reliable_0012: the existing meta and data tables become slot 0 of the partitioned layout
-- (renamed, with their rows and indexes: nothing is copied), slots 1 and 2 are created
-- empty with the same indexes and storage parameters, and the parents get the old names,
-- so every reader of <queue>_meta and <queue>_data (counts, health, the archive job) reads
-- all slots. Changes on the way:
--  * the id column loses its identity (PostgreSQL 15 cannot route inserts into a
--    partitioned table with one); a plain sequence of the same name, at the same position,
--    is its default;
--  * the data table's foreign key to meta goes: a key into a partitioned table would need
--    the slot in its primary key, and the rotation moves a row's payload with it (every
--    statement that writes meta writes data in the same statement);
--  * the notify trigger moves to the parent (a statement trigger on a partition does not
--    fire for an insert through the parent).
-- ALTER TABLE RENAME, ADD COLUMN with a constant default (no rewrite) and ATTACH PARTITION
-- take ACCESS EXCLUSIVE on the old tables; ATTACH reads slot 0 once to check its rows are
-- in slot 0: seconds for a queue of millions of rows, during which producers and consumers
-- wait. The downgrade (drop_rotation) puts the single tables back.
CREATE SEQUENCE {{rot_epoch}} MINVALUE 0 START 0;
CREATE SEQUENCE {{rot_sealed}} MINVALUE -1 START -1;
CREATE SEQUENCE {{rot_emptied}} MINVALUE -1 START -1;
CREATE SEQUENCE {{rot_start}} MINVALUE 0 START 0;

DO $do$
DECLARE
    v_next bigint;
    v_fkey name;
BEGIN
    SELECT CASE WHEN is_called THEN last_value + 1 ELSE last_value END INTO v_next FROM {{meta_seq}};
    ALTER TABLE {{meta}} ALTER COLUMN id DROP IDENTITY;
    CREATE SEQUENCE {{meta_seq}};
    PERFORM setval({{meta_seq_regclass}}, v_next, false);
    PERFORM setval({{rot_start_regclass}}, v_next - 1, true);
    FOR v_fkey IN SELECT c.conname FROM pg_constraint c
                  WHERE c.conrelid = {{data_regclass}}::regclass AND c.contype = 'f' LOOP
        EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', {{data_regclass}}, v_fkey);
    END LOOP;
END
$do$;

DROP TRIGGER IF EXISTS {{notify_trigger}} ON {{meta}};
ALTER TABLE {{meta}} RENAME TO {{meta0_name}};
ALTER INDEX {{schema}}.{{meta_pkey}} RENAME TO {{meta0_pkey}};
ALTER INDEX {{schema}}.{{ready_idx}} RENAME TO {{meta0_ready}};
ALTER INDEX {{schema}}.{{leased_idx}} RENAME TO {{meta0_leased}};
ALTER INDEX {{schema}}.{{finished_idx}} RENAME TO {{meta0_finished}};
ALTER TABLE {{meta0}} ADD COLUMN slot smallint NOT NULL DEFAULT 0;
ALTER TABLE {{data}} RENAME TO {{data0_name}};
ALTER INDEX {{schema}}.{{data_pkey}} RENAME TO {{data0_pkey}};
ALTER TABLE {{data0}} ADD COLUMN slot smallint NOT NULL DEFAULT 0;

CREATE TABLE {{meta}} (LIKE {{meta0}} INCLUDING DEFAULTS) PARTITION BY LIST (slot);
ALTER TABLE {{meta}} ALTER COLUMN id SET DEFAULT nextval({{meta_seq_regclass}}::regclass),
                     ALTER COLUMN slot DROP DEFAULT;
ALTER SEQUENCE {{meta_seq}} OWNED BY {{meta}}.id;
CREATE TABLE {{data}} (LIKE {{data0}}) PARTITION BY LIST (slot);
CREATE INDEX {{ready_idx}} ON ONLY {{meta}} (priority, due_at, id) WHERE status = 0;
CREATE INDEX {{leased_idx}} ON ONLY {{meta}} (leased_until) WHERE status = 1;
CREATE INDEX {{finished_idx}} ON ONLY {{meta}} (status, finished_at) WHERE status >= 2;

-- Slots 1 and 2: the same columns, checks, indexes and storage parameters as slot 0
-- (set_autovacuum says why those; under rotation a slot's dead rows leave with its
-- truncate, so vacuum matters less, but a queue whose rotation is held up still needs it).
CREATE TABLE {{meta1}} (LIKE {{meta0}} INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
ALTER TABLE {{meta1}} ADD CONSTRAINT {{meta1_pkey}} PRIMARY KEY (id);
CREATE INDEX {{meta1_ready}} ON {{meta1}} (priority, due_at, id) WHERE status = 0;
CREATE INDEX {{meta1_leased}} ON {{meta1}} (leased_until) WHERE status = 1;
CREATE INDEX {{meta1_finished}} ON {{meta1}} (status, finished_at) WHERE status >= 2;
CREATE TABLE {{meta2}} (LIKE {{meta0}} INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
ALTER TABLE {{meta2}} ADD CONSTRAINT {{meta2_pkey}} PRIMARY KEY (id);
CREATE INDEX {{meta2_ready}} ON {{meta2}} (priority, due_at, id) WHERE status = 0;
CREATE INDEX {{meta2_leased}} ON {{meta2}} (leased_until) WHERE status = 1;
CREATE INDEX {{meta2_finished}} ON {{meta2}} (status, finished_at) WHERE status >= 2;
CREATE TABLE {{data1}} (LIKE {{data0}} INCLUDING DEFAULTS);
ALTER TABLE {{data1}} ADD CONSTRAINT {{data1_pkey}} PRIMARY KEY (id);
CREATE TABLE {{data2}} (LIKE {{data0}} INCLUDING DEFAULTS);
ALTER TABLE {{data2}} ADD CONSTRAINT {{data2_pkey}} PRIMARY KEY (id);
-- Slots 1 and 2 take slot 0's storage parameters, whoever set them (fillfactor 80 and
-- reliable_0007's autovacuum settings, and a DBA's own): pg_class keeps them as name=value,
-- the form ALTER TABLE ... SET takes.
DO $do$
DECLARE
    v_meta text := (SELECT array_to_string(c.reloptions, ', ') FROM pg_class c WHERE c.oid = {{meta0_regclass}}::regclass);
    v_data text := (SELECT array_to_string(c.reloptions, ', ') FROM pg_class c WHERE c.oid = {{data0_regclass}}::regclass);
BEGIN
    IF v_meta IS NOT NULL THEN
        EXECUTE 'ALTER TABLE ' || {{meta1_regclass}} || ' SET (' || v_meta || ')';
        EXECUTE 'ALTER TABLE ' || {{meta2_regclass}} || ' SET (' || v_meta || ')';
    END IF;
    IF v_data IS NOT NULL THEN
        EXECUTE 'ALTER TABLE ' || {{data1_regclass}} || ' SET (' || v_data || ')';
        EXECUTE 'ALTER TABLE ' || {{data2_regclass}} || ' SET (' || v_data || ')';
    END IF;
END
$do$;
ALTER TABLE {{meta1}} ALTER COLUMN slot SET DEFAULT 1;
ALTER TABLE {{meta2}} ALTER COLUMN slot SET DEFAULT 2;
ALTER TABLE {{data1}} ALTER COLUMN slot SET DEFAULT 1;
ALTER TABLE {{data2}} ALTER COLUMN slot SET DEFAULT 2;

-- ATTACH finds each slot's matching index for every index of the parent and attaches it.
ALTER TABLE {{meta}} ATTACH PARTITION {{meta0}} FOR VALUES IN (0);
ALTER TABLE {{meta}} ATTACH PARTITION {{meta1}} FOR VALUES IN (1);
ALTER TABLE {{meta}} ATTACH PARTITION {{meta2}} FOR VALUES IN (2);
ALTER TABLE {{data}} ATTACH PARTITION {{data0}} FOR VALUES IN (0);
ALTER TABLE {{data}} ATTACH PARTITION {{data1}} FOR VALUES IN (1);
ALTER TABLE {{data}} ATTACH PARTITION {{data2}} FOR VALUES IN (2);

-- name: drop_rotation
-- reliable_0012 downgrade: back to one meta and one data table. Slot 0's tables take the
-- rows of slots 1 and 2 (copied: the one step that costs what the queue holds), lose their
-- slot column, get back their names, the identity (at the sequence's position) and the
-- foreign key. Run after drop_rotator and before the functions of reliable_0011 come back.
-- The rotation state goes first: every call reads it before it locks the tables, so the
-- downgrade takes its locks in the same order (dropped after the tables, a call that has
-- read it would wait for a table the downgrade holds while the downgrade waits to drop it:
-- a deadlock). A call that starts after the drop fails whole on the missing sequence, and
-- the client says so (StatementCanceled).
DROP SEQUENCE IF EXISTS {{rot_epoch}}, {{rot_sealed}}, {{rot_emptied}}, {{rot_start}};
DROP TRIGGER IF EXISTS {{notify_trigger}} ON {{meta}};
ALTER TABLE {{meta}} DETACH PARTITION {{meta0}};
ALTER TABLE {{data}} DETACH PARTITION {{data0}};
INSERT INTO {{meta0}} (id, priority, due_at, status, title, attempts, max_attempts, lease_owner, leased_until,
                       enqueued_at, dequeued_at, finished_at, last_error)
SELECT id, priority, due_at, status, title, attempts, max_attempts, lease_owner, leased_until,
       enqueued_at, dequeued_at, finished_at, last_error FROM {{meta}};
INSERT INTO {{data0}} (id, payload, headers) SELECT id, payload, headers FROM {{data}};
DO $do$
DECLARE
    v_next bigint;
BEGIN
    SELECT CASE WHEN is_called THEN last_value + 1 ELSE last_value END INTO v_next FROM {{meta_seq}};
    DROP TABLE {{meta}};
    DROP TABLE {{data}};
    DROP SEQUENCE IF EXISTS {{meta_seq}};
    ALTER TABLE {{meta0}} DROP COLUMN slot;
    ALTER TABLE {{data0}} DROP COLUMN slot;
    ALTER TABLE {{meta0}} ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (SEQUENCE NAME {{meta_seq}});
    PERFORM setval({{meta_seq_regclass}}, v_next, false);
END
$do$;
ALTER TABLE {{meta0}} RENAME TO {{meta_name}};
ALTER INDEX {{schema}}.{{meta0_pkey}} RENAME TO {{meta_pkey}};
ALTER INDEX {{schema}}.{{meta0_ready}} RENAME TO {{ready_idx}};
ALTER INDEX {{schema}}.{{meta0_leased}} RENAME TO {{leased_idx}};
ALTER INDEX {{schema}}.{{meta0_finished}} RENAME TO {{finished_idx}};
ALTER TABLE {{data0}} RENAME TO {{data_name}};
ALTER INDEX {{schema}}.{{data0_pkey}} RENAME TO {{data_pkey}};
ALTER TABLE {{data}} ADD FOREIGN KEY (id) REFERENCES {{meta}} (id) ON DELETE CASCADE;

-- name: create_functions
-- The SQL API, callable from any language, on the generation layout (reliable_0013).
-- ack, extend_lease, nack and release run on the current slot's own tables first (their
-- per-slot calls: create_claim_calls, create_lease_calls), where nearly every lease is, and
-- then on the partitioned parents for the ids not found there: a row is found by id in
-- whichever slot it is (header, 1). A statement on the parents locks every slot's tables,
-- and waits behind a truncate's ACCESS EXCLUSIVE on any slot: there extend_lease takes 7
-- relation locks and nack and release 15 once the session plans them generically, 16 and
-- 24 in a session's first calls (custom plans lock every index of every slot), past the 16
-- a backend takes on its fast path (bench/lab/ack_plan.py --parts lease). On the current slot's tables each takes 3 (the
-- slot's meta table, its primary key, the epoch sequence), as the ack, and never meets a
-- truncate (only sealed epochs' slots are emptied).
-- The fallback gets only the ids the slot's call did not find, so nothing is changed twice,
-- and it runs after the slot's statement: a row the truncate moved into the current slot
-- meanwhile is seen there (header, 5: a statement that waited for the lock takes its
-- snapshot after it).
-- Updates go by the primary keys only, `m.status::integer = 1` so the leased index's
-- predicate is not matched (reliable_0009; set_plan_guard has the figures).
-- nack and release give a row back to the claims in the current epoch: a row in the
-- current slot is updated in place (it stays in its slot, rule 1 holds), a row in an older
-- slot moves, with its id, priority and payload, by DELETE + INSERT in one statement
-- (header, 1); if a switch came after the epoch was read, rot_follow moves the rows on
-- (header, 2). nack's last attempt makes the row DEAD in place.
-- The calls on leased items and the claim refuse to run in a REPEATABLE READ or
-- SERIALIZABLE transaction (SQLSTATE QC400): its snapshot may predate a truncate, so an
-- ack would miss its row (moved to the current epoch after the snapshot) and the item would
-- run again. enqueue needs no snapshot of the queue and runs at any level.
CREATE OR REPLACE FUNCTION {{fn_ack}}(p_ids bigint[], p_worker text DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql AS $fn$
DECLARE
    v_slot  smallint := ((SELECT last_value FROM {{rot_epoch}}) % 3)::smallint;
    v_count integer;
BEGIN
    IF current_setting('transaction_isolation') IN ('repeatable read', 'serializable') THEN
        RAISE EXCEPTION USING ERRCODE = 'QC400', MESSAGE = format(
            'queue %L: ack runs in READ COMMITTED transactions only (this one is %s): an older snapshot does not see rows the rotation moved',
            {{queue_literal}}, current_setting('transaction_isolation'));
    END IF;
    -- the current slot's tables first (most leases are there); the rest in every slot
    IF v_slot = 0 THEN
        v_count := {{fn_ack_in0}}(p_ids, p_worker);
    ELSIF v_slot = 1 THEN
        v_count := {{fn_ack_in1}}(p_ids, p_worker);
    ELSE
        v_count := {{fn_ack_in2}}(p_ids, p_worker);
    END IF;
    IF v_count < cardinality(p_ids) THEN
        v_count := v_count + {{fn_ack_in}}(p_ids, p_worker);
    END IF;
    RETURN v_count;
END
$fn$;

CREATE OR REPLACE FUNCTION {{fn_extend_lease}}(
    p_ids           bigint[],
    p_lease_seconds double precision DEFAULT {{lease_seconds}},
    p_worker        text             DEFAULT NULL
) RETURNS TABLE (id bigint, leased_until timestamptz)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
DECLARE
    v_slot  smallint := ((SELECT last_value FROM {{rot_epoch}}) % 3)::smallint;
    v_ids   bigint[];
    v_until timestamptz[];
    v_rest  bigint[];
BEGIN
    IF current_setting('transaction_isolation') IN ('repeatable read', 'serializable') THEN
        RAISE EXCEPTION USING ERRCODE = 'QC400', MESSAGE = format(
            'queue %L: extend_lease runs in READ COMMITTED transactions only (this one is %s): an older snapshot does not see rows the rotation moved',
            {{queue_literal}}, current_setting('transaction_isolation'));
    END IF;
    IF v_slot = 0 THEN
        SELECT array_agg(e.id), array_agg(e.leased_until) INTO v_ids, v_until
        FROM {{fn_extend_in0}}(p_ids, p_lease_seconds, p_worker) e;
    ELSIF v_slot = 1 THEN
        SELECT array_agg(e.id), array_agg(e.leased_until) INTO v_ids, v_until
        FROM {{fn_extend_in1}}(p_ids, p_lease_seconds, p_worker) e;
    ELSE
        SELECT array_agg(e.id), array_agg(e.leased_until) INTO v_ids, v_until
        FROM {{fn_extend_in2}}(p_ids, p_lease_seconds, p_worker) e;
    END IF;
    RETURN QUERY SELECT u.e_id, u.e_until FROM unnest(v_ids, v_until) AS u(e_id, e_until);
    v_rest := ARRAY(SELECT unnest(p_ids) EXCEPT SELECT unnest(v_ids));
    IF cardinality(v_rest) > 0 THEN
        RETURN QUERY
        UPDATE {{meta}} m
        SET leased_until = now() + make_interval(secs => coalesce(p_lease_seconds, {{lease_seconds}}))
        WHERE m.id = ANY (v_rest) AND m.status::integer = 1
          AND (p_worker IS NULL OR m.lease_owner = p_worker)
        RETURNING m.id, m.leased_until;
    END IF;
END
$fn$;

-- Move rows (meta and data, every column, same id) from whatever slot they are in to slot
-- p_to; p_status, when given, limits the move to rows still in that status when the DELETE
-- reaches them (it re-checks rows another transaction changed meanwhile). Returns the
-- number of meta rows moved. Used by the writers to follow a switch (their own rows), by
-- the seal (status 0) and by the truncate (under its lock).
CREATE OR REPLACE FUNCTION {{fn_rot_move}}(p_ids bigint[], p_to smallint, p_status smallint DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql AS $fn$
DECLARE
    v_moved bigint;
BEGIN
    WITH gone AS (
        DELETE FROM {{meta}} m
        WHERE m.id = ANY (p_ids) AND m.slot <> p_to AND (p_status IS NULL OR m.status = p_status)
        RETURNING m.id, m.priority, m.due_at, m.status, m.title, m.attempts, m.max_attempts, m.lease_owner,
                  m.leased_until, m.enqueued_at, m.dequeued_at, m.finished_at, m.last_error
    ), back AS (
        INSERT INTO {{meta}} (slot, id, priority, due_at, status, title, attempts, max_attempts, lease_owner,
                              leased_until, enqueued_at, dequeued_at, finished_at, last_error)
        SELECT p_to, g.id, g.priority, g.due_at, g.status, g.title, g.attempts, g.max_attempts, g.lease_owner,
               g.leased_until, g.enqueued_at, g.dequeued_at, g.finished_at, g.last_error
        FROM gone g
        RETURNING 1
    ), dgone AS (
        DELETE FROM {{data}} d WHERE d.id = ANY (ARRAY(SELECT g.id FROM gone g)) AND d.slot <> p_to
        RETURNING d.id, d.payload, d.headers
    ), dback AS (
        INSERT INTO {{data}} (slot, id, payload, headers)
        SELECT p_to, dg.id, dg.payload, dg.headers FROM dgone dg
    )
    SELECT count(*) INTO v_moved FROM back;
    RETURN v_moved;
END
$fn$;

-- A writer's rows inserted into epoch p_epoch's slot follow the switches that came since
-- it read the epoch (header, 2). The rows are the caller's own, uncommitted.
CREATE OR REPLACE FUNCTION {{fn_rot_follow}}(p_ids bigint[], p_epoch bigint)
RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    v_now bigint := (SELECT last_value FROM {{rot_epoch}});
BEGIN
    WHILE v_now <> p_epoch LOOP
        PERFORM {{fn_rot_move}}(p_ids, (v_now % 3)::smallint, 0::smallint);
        p_epoch := v_now;
        v_now := (SELECT last_value FROM {{rot_epoch}});
    END LOOP;
END
$fn$;

CREATE OR REPLACE FUNCTION {{fn_nack}}(
    p_ids          bigint[],
    p_error        text             DEFAULT NULL,
    p_worker       text             DEFAULT NULL,
    p_base_seconds double precision DEFAULT {{backoff_base_seconds}},
    p_max_seconds  double precision DEFAULT {{backoff_max_seconds}}
) RETURNS TABLE (id bigint, status smallint, due_at timestamptz)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
DECLARE
    v_epoch bigint := (SELECT last_value FROM {{rot_epoch}});
    v_ids   bigint[];
    v_st    smallint[];
    v_due   timestamptz[];
    v_rest  bigint[];
BEGIN
    IF current_setting('transaction_isolation') IN ('repeatable read', 'serializable') THEN
        RAISE EXCEPTION USING ERRCODE = 'QC400', MESSAGE = format(
            'queue %L: nack runs in READ COMMITTED transactions only (this one is %s): an older snapshot does not see rows the rotation moved',
            {{queue_literal}}, current_setting('transaction_isolation'));
    END IF;
    IF v_epoch % 3 = 0 THEN
        SELECT array_agg(n.id), array_agg(n.status), array_agg(n.due_at) INTO v_ids, v_st, v_due
        FROM {{fn_nack_in0}}(p_ids, p_error, p_worker, p_base_seconds, p_max_seconds) n;
    ELSIF v_epoch % 3 = 1 THEN
        SELECT array_agg(n.id), array_agg(n.status), array_agg(n.due_at) INTO v_ids, v_st, v_due
        FROM {{fn_nack_in1}}(p_ids, p_error, p_worker, p_base_seconds, p_max_seconds) n;
    ELSE
        SELECT array_agg(n.id), array_agg(n.status), array_agg(n.due_at) INTO v_ids, v_st, v_due
        FROM {{fn_nack_in2}}(p_ids, p_error, p_worker, p_base_seconds, p_max_seconds) n;
    END IF;
    RETURN QUERY SELECT u.n_id, u.n_status, u.n_due FROM unnest(v_ids, v_st, v_due) AS u(n_id, n_status, n_due);
    v_rest := ARRAY(SELECT unnest(p_ids) EXCEPT SELECT unnest(v_ids));
    IF cardinality(v_rest) > 0 THEN
        RETURN QUERY
        WITH dead AS (
            UPDATE {{meta}} m
            SET status = 3, finished_at = now(), leased_until = NULL, last_error = p_error
            WHERE m.id = ANY (v_rest) AND m.status::integer = 1
              AND (p_worker IS NULL OR m.lease_owner = p_worker) AND m.attempts >= m.max_attempts
            RETURNING m.id, m.status, m.due_at
        ), gone AS (
            DELETE FROM {{meta}} m
            WHERE m.id = ANY (v_rest) AND m.status::integer = 1
              AND (p_worker IS NULL OR m.lease_owner = p_worker) AND m.attempts < m.max_attempts
            RETURNING m.id, m.priority, m.title, m.attempts, m.max_attempts, m.enqueued_at, m.dequeued_at
        ), back AS (
            INSERT INTO {{meta}} (slot, id, priority, due_at, status, title, attempts, max_attempts,
                                  enqueued_at, dequeued_at, last_error)
            SELECT (v_epoch % 3)::smallint, g.id, g.priority,
                   now() + make_interval(secs => least(
                       coalesce(p_base_seconds, {{backoff_base_seconds}})
                           * power(2, least(greatest(g.attempts - 1, 0), 40)),
                       coalesce(p_max_seconds, {{backoff_max_seconds}}))),
                   0, g.title, g.attempts, g.max_attempts, g.enqueued_at, g.dequeued_at, p_error
            FROM gone g
            RETURNING id, status, due_at
        ), dgone AS (
            DELETE FROM {{data}} d WHERE d.id = ANY (ARRAY(SELECT g.id FROM gone g))
            RETURNING d.id, d.payload, d.headers
        ), dback AS (
            INSERT INTO {{data}} (slot, id, payload, headers)
            SELECT (v_epoch % 3)::smallint, dg.id, dg.payload, dg.headers FROM dgone dg
        )
        SELECT * FROM dead UNION ALL SELECT * FROM back;
    END IF;
    PERFORM {{fn_rot_follow}}(p_ids, v_epoch);
END
$fn$;

CREATE OR REPLACE FUNCTION {{fn_release}}(p_ids bigint[], p_worker text DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql AS $fn$
DECLARE
    v_epoch bigint := (SELECT last_value FROM {{rot_epoch}});
    v_ids   bigint[];
    v_rest  bigint[];
    v_count integer;
BEGIN
    IF current_setting('transaction_isolation') IN ('repeatable read', 'serializable') THEN
        RAISE EXCEPTION USING ERRCODE = 'QC400', MESSAGE = format(
            'queue %L: release runs in READ COMMITTED transactions only (this one is %s): an older snapshot does not see rows the rotation moved',
            {{queue_literal}}, current_setting('transaction_isolation'));
    END IF;
    IF v_epoch % 3 = 0 THEN
        v_ids := ARRAY(SELECT r.id FROM {{fn_release_in0}}(p_ids, p_worker) r);
    ELSIF v_epoch % 3 = 1 THEN
        v_ids := ARRAY(SELECT r.id FROM {{fn_release_in1}}(p_ids, p_worker) r);
    ELSE
        v_ids := ARRAY(SELECT r.id FROM {{fn_release_in2}}(p_ids, p_worker) r);
    END IF;
    v_count := cardinality(v_ids);
    v_rest := ARRAY(SELECT unnest(p_ids) EXCEPT SELECT unnest(v_ids));
    IF cardinality(v_rest) > 0 THEN
        WITH gone AS (
            DELETE FROM {{meta}} m
            WHERE m.id = ANY (v_rest) AND m.status::integer = 1
              AND (p_worker IS NULL OR m.lease_owner = p_worker)
            RETURNING m.id, m.priority, m.due_at, m.title, m.attempts, m.max_attempts, m.enqueued_at,
                      m.dequeued_at, m.last_error
        ), back AS (
            INSERT INTO {{meta}} (slot, id, priority, due_at, status, title, attempts, max_attempts,
                                  enqueued_at, dequeued_at, last_error)
            SELECT (v_epoch % 3)::smallint, g.id, g.priority, g.due_at, 0, g.title, greatest(g.attempts - 1, 0),
                   g.max_attempts, g.enqueued_at, g.dequeued_at, g.last_error
            FROM gone g
            RETURNING 1
        ), dgone AS (
            DELETE FROM {{data}} d WHERE d.id = ANY (ARRAY(SELECT g.id FROM gone g))
            RETURNING d.id, d.payload, d.headers
        ), dback AS (
            INSERT INTO {{data}} (slot, id, payload, headers)
            SELECT (v_epoch % 3)::smallint, dg.id, dg.payload, dg.headers FROM dgone dg
        )
        SELECT v_count + count(*) INTO v_count FROM back;
    END IF;
    PERFORM {{fn_rot_follow}}(p_ids, v_epoch);
    RETURN v_count;
END
$fn$;

-- name: create_claim_calls
-- reliable_0012: the claim and the ack on one set of tables, rendered four times: on the
-- partitioned parents (<queue>_claim_in, <queue>_ack_in: every slot) and on each slot's own
-- tables (<queue>_claim_in0..2, <queue>_ack_in0..2). dequeue and ack (create_dequeue,
-- create_functions) call the current slot's while every READY row is in the current epoch,
-- the parents' otherwise (and ack for the ids the slot's call did not find). Why: a statement on the
-- parents locks and opens every slot table and every index of each when it starts (26
-- relation locks per claim, past the 16 a backend takes without the shared lock manager,
-- against 7 on reliable_0011's single tables): the SQL cycle ran at 0.66x reliable_0011's
-- rate at batch 1 under 8 clients. A slot's claim takes 9, its ack 3, and the cycle runs
-- at 1.00x (bench/lab/ack_plan.py). The claim is reliable_0008's one statement
-- (create_dequeue says what it does); p_open lists the slots whose READY rows it walks
-- (pruned when the executor starts; on a slot's own tables, a filter every row passes).
-- Both plan once per session (force_generic_plan), through indexes (set_plan_guard says why
-- no sequential scan and no JIT). plpgsql's own choice replanned the claim at every call:
-- after five custom plans it keeps the generic one only if that looks no dearer, and a
-- custom plan knows the LIMIT (p_batch) where the generic one assumes a tenth of the table.
-- Measured (pgbench, one client, dequeue(1) + ack, 60,000 rows): with generic plans
-- reliable_0011's cycle ran 1.2-1.3x its rate, a slot's 1.4-1.7x.
-- The claims also plan without a sort since reliable_0016 (set_sort_guard: ALTER FUNCTION,
-- which a CREATE OR REPLACE of these undoes).
CREATE OR REPLACE FUNCTION {{claim_fn}}(
    p_open          smallint[],
    p_batch         integer,
    p_lease_seconds double precision,
    p_worker        text
) RETURNS TABLE (
    id bigint, priority smallint, due_at timestamptz, title text, attempts integer,
    max_attempts integer, enqueued_at timestamptz, dequeued_at timestamptz,
    leased_until timestamptz, payload bytea, headers jsonb
)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET jit = off
AS $fn$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH expired AS MATERIALIZED (
        SELECT m.id FROM {{claim_meta}} m
        WHERE m.status = 1 AND m.leased_until < now()
        ORDER BY m.leased_until
        LIMIT greatest(p_batch, 0)
        FOR UPDATE SKIP LOCKED
    ), ready AS MATERIALIZED (
        SELECT m.id FROM {{claim_meta}} m
        WHERE m.slot = ANY (p_open) AND m.status = 0 AND m.due_at <= now()
        ORDER BY m.priority, m.due_at, m.id
        LIMIT greatest(p_batch - (SELECT count(*) FROM expired), 0)
        FOR UPDATE SKIP LOCKED
    ), claimed AS (
        UPDATE {{claim_meta}} m SET
            status       = CASE WHEN m.status = 1 AND m.attempts >= m.max_attempts THEN 3 ELSE 1 END,
            attempts     = CASE WHEN m.status = 1 AND m.attempts >= m.max_attempts THEN m.attempts
                                ELSE m.attempts + 1 END,
            lease_owner  = CASE WHEN m.status = 1 AND m.attempts >= m.max_attempts THEN m.lease_owner
                                ELSE p_worker END,
            leased_until = CASE WHEN m.status = 1 AND m.attempts >= m.max_attempts THEN NULL
                                ELSE now() + make_interval(secs => coalesce(p_lease_seconds, {{lease_seconds}})) END,
            dequeued_at  = CASE WHEN m.status = 1 AND m.attempts >= m.max_attempts THEN m.dequeued_at
                                ELSE now() END,
            finished_at  = CASE WHEN m.status = 1 AND m.attempts >= m.max_attempts THEN now() END,
            last_error   = CASE WHEN m.status = 1 AND m.attempts >= m.max_attempts
                                THEN 'lease expired on its last attempt (' || m.attempts || ' of '
                                     || m.max_attempts || ')'
                                ELSE m.last_error END
        WHERE m.id = ANY (ARRAY(SELECT e.id FROM expired e UNION ALL SELECT r.id FROM ready r))
        RETURNING m.id, m.priority, m.due_at, m.title, m.attempts, m.max_attempts,
                  m.enqueued_at, m.dequeued_at, m.leased_until, m.status
    ), payloads AS MATERIALIZED (
        SELECT d.id, d.payload, d.headers FROM {{claim_data}} d
        WHERE d.id = ANY (ARRAY(SELECT c.id FROM claimed c WHERE c.status = 1))
    )
    SELECT c.id, c.priority, c.due_at, c.title, c.attempts, c.max_attempts, c.enqueued_at,
           c.dequeued_at, c.leased_until, p.payload, p.headers
    FROM claimed c JOIN payloads p ON p.id = c.id
    WHERE c.status = 1
    ORDER BY c.priority, c.due_at, c.id;
END
$fn$;

-- The ack on these tables: the leased rows among p_ids (of p_worker, when given) become DONE.
CREATE OR REPLACE FUNCTION {{ack_fn}}(p_ids bigint[], p_worker text)
RETURNS integer
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET jit = off
AS $fn$
DECLARE
    v_count integer;
BEGIN
    UPDATE {{claim_meta}} m
    SET status = 2, finished_at = now(), leased_until = NULL
    WHERE m.id = ANY (p_ids) AND m.status::integer = 1
      AND (p_worker IS NULL OR m.lease_owner = p_worker);
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END
$fn$;

-- name: create_lease_calls
-- reliable_0013: extend_lease, nack and release on one slot's own tables, rendered three
-- times (<queue>_extend_in0..2, <queue>_nack_in0..2, <queue>_release_in0..2; create_functions
-- calls the current slot's, then falls back on the parents). Each is one UPDATE of the slot's
-- meta table by primary key: 3 relation locks per call with the caller's read of the epoch
-- sequence, all on the fast path, against 7 to 24 on the parents (create_functions).
-- nack and release leave the row in place, READY again: it is in the
-- current epoch already, and an UPDATE that keeps the slot moves nothing (header, 1); its
-- payload is not touched, where a move rewrites it into the slot it came from. The values
-- each sets are those the parents' move writes: nack's backoff from the attempts made, DEAD
-- on the last attempt with the lease owner kept; release gives the attempt back; both clear
-- the lease. Plans as create_claim_calls' (once per session, through the primary key).
CREATE OR REPLACE FUNCTION {{extend_fn}}(p_ids bigint[], p_lease_seconds double precision, p_worker text)
RETURNS TABLE (id bigint, leased_until timestamptz)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET jit = off
AS $fn$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    UPDATE {{lease_meta}} m
    SET leased_until = now() + make_interval(secs => coalesce(p_lease_seconds, {{lease_seconds}}))
    WHERE m.id = ANY (p_ids) AND m.status::integer = 1
      AND (p_worker IS NULL OR m.lease_owner = p_worker)
    RETURNING m.id, m.leased_until;
END
$fn$;

CREATE OR REPLACE FUNCTION {{nack_fn}}(p_ids bigint[], p_error text, p_worker text,
                                      p_base_seconds double precision, p_max_seconds double precision)
RETURNS TABLE (id bigint, status smallint, due_at timestamptz)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET jit = off
AS $fn$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    UPDATE {{lease_meta}} m
    SET status       = CASE WHEN m.attempts >= m.max_attempts THEN 3 ELSE 0 END,
        finished_at  = CASE WHEN m.attempts >= m.max_attempts THEN now() END,
        due_at       = CASE WHEN m.attempts >= m.max_attempts THEN m.due_at
                            ELSE now() + make_interval(secs => least(
                                coalesce(p_base_seconds, {{backoff_base_seconds}})
                                    * power(2, least(greatest(m.attempts - 1, 0), 40)),
                                coalesce(p_max_seconds, {{backoff_max_seconds}}))) END,
        lease_owner  = CASE WHEN m.attempts >= m.max_attempts THEN m.lease_owner END,
        leased_until = NULL,
        last_error   = p_error
    WHERE m.id = ANY (p_ids) AND m.status::integer = 1
      AND (p_worker IS NULL OR m.lease_owner = p_worker)
    RETURNING m.id, m.status, m.due_at;
END
$fn$;

CREATE OR REPLACE FUNCTION {{release_fn}}(p_ids bigint[], p_worker text)
RETURNS TABLE (id bigint)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET jit = off
AS $fn$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    UPDATE {{lease_meta}} m
    SET status = 0, attempts = greatest(m.attempts - 1, 0), lease_owner = NULL, leased_until = NULL
    WHERE m.id = ANY (p_ids) AND m.status::integer = 1
      AND (p_worker IS NULL OR m.lease_owner = p_worker)
    RETURNING m.id;
END
$fn$;

-- name: drop_lease_calls
-- reliable_0013 downgrade, after reliable_0012's functions are back: the per-slot
-- extend_lease, nack and release.
DROP FUNCTION IF EXISTS {{fn_extend_in0}}(bigint[], double precision, text);
DROP FUNCTION IF EXISTS {{fn_extend_in1}}(bigint[], double precision, text);
DROP FUNCTION IF EXISTS {{fn_extend_in2}}(bigint[], double precision, text);
DROP FUNCTION IF EXISTS {{fn_nack_in0}}(bigint[], text, text, double precision, double precision);
DROP FUNCTION IF EXISTS {{fn_nack_in1}}(bigint[], text, text, double precision, double precision);
DROP FUNCTION IF EXISTS {{fn_nack_in2}}(bigint[], text, text, double precision, double precision);
DROP FUNCTION IF EXISTS {{fn_release_in0}}(bigint[], text);
DROP FUNCTION IF EXISTS {{fn_release_in1}}(bigint[], text);
DROP FUNCTION IF EXISTS {{fn_release_in2}}(bigint[], text);

-- name: create_dequeue
-- reliable_0015: reliable_0008's one-statement claim on the generation layout. Expired leases first, then
-- READY rows by priority, due time and id, SKIP LOCKED; the claim itself is
-- create_claim_calls' (one statement, on the current slot's tables or on the parents).
-- The READY walk covers the open epochs' slots only (one, or two between a switch and its
-- seal): the dead READY entries of sealed epochs, which a pinned horizon keeps, are never
-- walked. rot_sealed is read before rot_epoch (header, 3).
-- While the previous epoch is sealed, every READY row is in the current slot and the claim
-- runs on that slot's tables alone. A claim short of a batch is done there, unless a switch
-- came meanwhile: then the rest is looked for in the open slots (the new epoch's READY rows).
-- It never looks in a sealed slot that the archive job has yet to empty: a lease that
-- expired there is claimed again once the truncate has moved the row forward (header, 5),
-- late by at most one pass of the job, as on SQL Server. reliable_0012's claim looked in
-- every slot for such leases whenever it came back short of a batch while an older slot
-- waited for its truncate: with many consumers and little backlog most claims are short, so
-- in that window, once or twice in every pass of the job, they locked every slot's tables
-- and queued behind the truncate's lock (bench/lab/RESULTS.md: "the archive job beside a
-- full-speed cycle").
CREATE OR REPLACE FUNCTION {{fn_dequeue}}(
    p_batch         integer          DEFAULT 1,
    p_lease_seconds double precision DEFAULT {{lease_seconds}},
    p_worker        text             DEFAULT NULL
) RETURNS TABLE (
    id bigint, priority smallint, due_at timestamptz, title text, attempts integer,
    max_attempts integer, enqueued_at timestamptz, dequeued_at timestamptz,
    leased_until timestamptz, payload bytea, headers jsonb
)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
DECLARE
    v_sealed bigint := (SELECT last_value FROM {{rot_sealed}});
    v_epoch  bigint := (SELECT last_value FROM {{rot_epoch}});
    v_slot   smallint := (v_epoch % 3)::smallint;
    v_lease  double precision := coalesce(p_lease_seconds, {{lease_seconds}});
    v_got    integer := 0;
BEGIN
    IF current_setting('transaction_isolation') IN ('repeatable read', 'serializable') THEN
        RAISE EXCEPTION USING ERRCODE = 'QC400', MESSAGE = format(
            'queue %L: dequeue runs in READ COMMITTED transactions only (this one is %s): an older snapshot does not see rows the rotation moved',
            {{queue_literal}}, current_setting('transaction_isolation'));
    END IF;
    IF v_sealed >= v_epoch - 1 THEN
        IF v_slot = 0 THEN
            RETURN QUERY SELECT * FROM {{fn_claim_in0}}(ARRAY[v_slot], p_batch, v_lease, p_worker);
        ELSIF v_slot = 1 THEN
            RETURN QUERY SELECT * FROM {{fn_claim_in1}}(ARRAY[v_slot], p_batch, v_lease, p_worker);
        ELSE
            RETURN QUERY SELECT * FROM {{fn_claim_in2}}(ARRAY[v_slot], p_batch, v_lease, p_worker);
        END IF;
        GET DIAGNOSTICS v_got = ROW_COUNT;
        IF v_got >= p_batch THEN
            RETURN;
        END IF;
        -- short of a batch: done unless a switch came meanwhile
        IF (SELECT last_value FROM {{rot_epoch}}) = v_epoch THEN
            RETURN;
        END IF;
        v_sealed := (SELECT last_value FROM {{rot_sealed}});
        v_epoch := (SELECT last_value FROM {{rot_epoch}});
    END IF;
    RETURN QUERY SELECT * FROM {{fn_claim_in}}(
        CASE WHEN v_sealed >= v_epoch - 1 THEN ARRAY[(v_epoch % 3)::smallint]
             ELSE ARRAY[((v_epoch - 1) % 3)::smallint, (v_epoch % 3)::smallint] END,
        p_batch - v_got, v_lease, p_worker);
END
$fn$;

-- name: create_enqueue_functions
-- reliable_0010's enqueue and enqueue_many (the size check, QC413) on the generation
-- layout: rows go to the current epoch's slot and follow a switch that came meanwhile
-- (header, 2).

-- enqueue one item; returns its id.
CREATE OR REPLACE FUNCTION {{fn_enqueue}}(
    p_payload      bytea,
    p_headers      jsonb    DEFAULT NULL,
    p_priority     smallint DEFAULT 0,
    p_delay        interval DEFAULT interval '0',
    p_title        text     DEFAULT NULL,
    p_max_attempts integer  DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql AS $fn$
DECLARE
    v_id bigint;
    v_payload bigint := octet_length(p_payload);
    v_title   bigint := coalesce(octet_length(p_title), 0);
    v_headers bigint := coalesce(octet_length(p_headers::text), 0);
    v_epoch   bigint;
BEGIN
    IF v_payload + v_title + v_headers > {{max_payload_bytes}} THEN
        RAISE EXCEPTION USING ERRCODE = 'QC413', MESSAGE = format(
            'queue %L: message of %s bytes (payload %s + title %s + headers %s) is over max_payload_bytes %s: nothing was enqueued',
            {{queue_literal}}, v_payload + v_title + v_headers, v_payload, v_title, v_headers, {{max_payload_bytes}});
    END IF;
    v_epoch := (SELECT last_value FROM {{rot_epoch}});
    WITH m AS (
        INSERT INTO {{meta}} (slot, priority, due_at, title, max_attempts)
        VALUES ((v_epoch % 3)::smallint, coalesce(p_priority, 0), now() + coalesce(p_delay, interval '0'),
                p_title, coalesce(p_max_attempts, {{max_attempts}}))
        RETURNING id, slot
    )
    INSERT INTO {{data}} (slot, id, payload, headers)
    SELECT m.slot, m.id, p_payload, p_headers FROM m
    RETURNING id INTO v_id;
    IF (SELECT last_value FROM {{rot_epoch}}) <> v_epoch THEN
        PERFORM {{fn_rot_follow}}(ARRAY[v_id], v_epoch);
    END IF;
    RETURN v_id;
END
$fn$;

-- enqueue many items in one statement; ids come back in the order of the arrays.
-- Shorter optional arrays are padded with NULL (defaults); ids are drawn from the id
-- sequence first so each payload is paired with its own id.
CREATE OR REPLACE FUNCTION {{fn_enqueue_many}}(
    p_payloads      bytea[],
    p_headers       jsonb[]    DEFAULT NULL,
    p_priorities    smallint[] DEFAULT NULL,
    p_delays        interval[] DEFAULT NULL,
    p_titles        text[]     DEFAULT NULL,
    p_max_attempts  integer    DEFAULT NULL
) RETURNS SETOF bigint
LANGUAGE plpgsql AS $fn$
DECLARE
    v_ord bigint;
    v_payload bigint;
    v_title bigint;
    v_headers bigint;
    v_epoch bigint;
    v_ids bigint[];
BEGIN
    -- the first message over the limit refuses the whole call, before anything is written
    SELECT s.ord, s.payload, s.title, s.headers INTO v_ord, v_payload, v_title, v_headers
    FROM (
        SELECT u.ord, octet_length(u.payload)::bigint AS payload,
               coalesce(octet_length(u.title), 0)::bigint AS title,
               coalesce(octet_length(u.headers::text), 0)::bigint AS headers
        FROM unnest(p_payloads, p_headers, p_titles) WITH ORDINALITY AS u(payload, headers, title, ord)
        WHERE u.ord <= cardinality(p_payloads)
    ) s
    WHERE s.payload + s.title + s.headers > {{max_payload_bytes}}
    ORDER BY s.ord
    LIMIT 1;
    IF v_ord IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'QC413', MESSAGE = format(
            'queue %L: message %s of %s is %s bytes (payload %s + title %s + headers %s), over max_payload_bytes %s: nothing was enqueued',
            {{queue_literal}}, v_ord, cardinality(p_payloads), v_payload + v_title + v_headers,
            v_payload, v_title, v_headers, {{max_payload_bytes}});
    END IF;
    v_epoch := (SELECT last_value FROM {{rot_epoch}});
    WITH src AS MATERIALIZED (
        SELECT nextval({{meta_seq_regclass}}::regclass) AS id, u.payload, u.headers,
               u.priority, u.delay, u.title, u.ord
        FROM unnest(p_payloads, p_headers, p_priorities, p_delays, p_titles)
             WITH ORDINALITY AS u(payload, headers, priority, delay, title, ord)
        WHERE u.ord <= cardinality(p_payloads)
    ), m AS (
        INSERT INTO {{meta}} (slot, id, priority, due_at, title, max_attempts)
        SELECT (v_epoch % 3)::smallint, src.id, coalesce(src.priority, 0), now() + coalesce(src.delay, interval '0'),
               src.title, coalesce(p_max_attempts, {{max_attempts}})
        FROM src
    ), d AS (
        INSERT INTO {{data}} (slot, id, payload, headers)
        SELECT (v_epoch % 3)::smallint, src.id, src.payload, src.headers FROM src
    )
    SELECT array_agg(src.id ORDER BY src.ord) INTO v_ids FROM src;
    IF (SELECT last_value FROM {{rot_epoch}}) <> v_epoch THEN
        PERFORM {{fn_rot_follow}}(v_ids, v_epoch);
    END IF;
    RETURN QUERY SELECT unnest(v_ids);
END
$fn$;

-- name: create_rotator
-- reliable_0012: the rotator's calls (queuectl.jobs.archive runs them, each in a
-- transaction of its own, and marks a step done with rot_mark only after it committed,
-- except a seal, its mark and the switch before them (when there is one): one
-- transaction, marked just before its commit).
-- Any other client may run them too: each checks the state itself and does nothing when
-- its step is not due, so two rotators at once cost retries, never rows.

-- The rotation state in one row.
CREATE OR REPLACE FUNCTION {{fn_rot_state}}(
    OUT epoch bigint, OUT sealed bigint, OUT emptied bigint, OUT start_id bigint, OUT last_id bigint
) LANGUAGE sql VOLATILE AS $$
    SELECT (SELECT last_value FROM {{rot_epoch}}), (SELECT last_value FROM {{rot_sealed}}),
           (SELECT last_value FROM {{rot_emptied}}), (SELECT last_value FROM {{rot_start}}),
           (SELECT last_value FROM {{meta_seq}})
$$;

-- Switch new rows to the next epoch once the current one has had p_items ids, the previous
-- one is sealed and the next slot is empty. Returns the new epoch, or NULL.
CREATE OR REPLACE FUNCTION {{fn_rot_switch}}(p_items bigint) RETURNS bigint
LANGUAGE plpgsql AS $fn$
DECLARE
    st record := {{fn_rot_state}}();
BEGIN
    IF st.sealed < st.epoch - 1 OR st.emptied < st.epoch - 1 OR st.last_id - st.start_id < p_items THEN
        RETURN NULL;
    END IF;
    PERFORM setval({{rot_start_regclass}}, st.last_id, true);
    PERFORM setval({{rot_epoch_regclass}}, st.epoch + 1, true);
    RETURN st.epoch + 1;
END
$fn$;

-- Seal epoch - 1 (header, 3): move its READY rows to the current epoch. Returns the rows
-- moved; NULL when there is nothing to seal; -1 when more than p_limit rows are READY there
-- (a backlog: the epoch stays open and is walked by the claims, rather than moved whole
-- at every rotation). The caller marks it sealed once this has committed.
-- The rows are locked first, SKIP LOCKED, so the seal never waits on a consumer. A DELETE
-- that meets a row claimed after its snapshot locks the row's newest version, finds it no
-- longer READY, skips it and keeps the lock to the end of its transaction: the row's ack
-- would wait on the seal while the seal waits on another ack of the same consumer's batch,
-- a deadlock the server breaks by failing the ack. A READY row skipped here (one a claim is
-- taking, or another mover moving) stays in the sealed slot until the truncate moves it
-- forward: late by one rotation, never lost.
CREATE OR REPLACE FUNCTION {{fn_rot_seal}}(p_limit integer) RETURNS bigint
LANGUAGE plpgsql AS $fn$
DECLARE
    st record := {{fn_rot_state}}();
    v_ids bigint[];
BEGIN
    IF st.sealed >= st.epoch - 1 THEN
        RETURN NULL;
    END IF;
    IF (SELECT count(*) FROM (SELECT FROM {{meta}} m
                              WHERE m.slot = ((st.epoch - 1) % 3)::smallint AND m.status = 0
                              LIMIT p_limit + 1) r) > p_limit THEN
        RETURN -1;
    END IF;
    v_ids := ARRAY(SELECT m.id FROM {{meta}} m
                   WHERE m.slot = ((st.epoch - 1) % 3)::smallint AND m.status = 0
                   LIMIT p_limit
                   FOR UPDATE SKIP LOCKED);
    RETURN {{fn_rot_move}}(v_ids, (st.epoch % 3)::smallint, 0::smallint);
END
$fn$;

-- Record a step the caller's previous transaction completed ('sealed' or 'emptied').
CREATE OR REPLACE FUNCTION {{fn_rot_mark}}(p_what text, p_epoch bigint) RETURNS void
LANGUAGE plpgsql AS $fn$
BEGIN
    IF p_what = 'sealed' AND (SELECT last_value FROM {{rot_sealed}}) < p_epoch THEN
        PERFORM setval({{rot_sealed_regclass}}, p_epoch, true);
    ELSIF p_what = 'emptied' AND (SELECT last_value FROM {{rot_emptied}}) < p_epoch THEN
        PERFORM setval({{rot_emptied_regclass}}, p_epoch, true);
    ELSIF p_what NOT IN ('sealed', 'emptied') THEN
        RAISE EXCEPTION 'rot_mark: unknown step %', p_what;
    END IF;
END
$fn$;

-- The oldest sealed epoch that is not emptied yet: its number, or NULL.
CREATE OR REPLACE FUNCTION {{fn_rot_next_empty}}() RETURNS bigint
LANGUAGE sql VOLATILE AS $$
    SELECT s.emptied + 1 FROM {{fn_rot_state}}() s WHERE s.emptied + 1 <= s.sealed
$$;

-- name: create_rot_copy
-- reliable_0018: the rotator's copy of a generation's finished rows to history, at about
-- three quarters of reliable_0017's cost a row (whose body is in history/reliable.sql; the
-- signature is the same). rot_empty calls it.

-- Copy finished rows of slot p_slot, with their payloads, to history: those with an id above
-- p_after, at most p_batch of them (NULL: all), in id order, so the archive job copies a
-- large generation in short transactions (a queue migrated with millions of rows in slot 0).
-- Returns how many were copied and the last id of the batch (the next call's p_after), or a
-- NULL last_id when the batch found fewer than p_batch finished rows (it read the slot's
-- finished rows to their end: there is no next batch) and always when p_batch is NULL.
-- Two statements: the batch's last id (a walk of the slot's primary key in id order that
-- stops after p_batch finished rows), then one INSERT of the finished rows up to it, joined
-- to their payloads. Each call is planned for its own arguments (force_custom_plan): a
-- generic plan (plpgsql's choice after five calls) knows neither the slot nor the batch, and
-- read every finished row of the slot above p_after and sorted them, at every batch. A row
-- finished between the two statements is copied too.
-- A row already in history is passed over before its payload is read (a pass that stopped
-- halfway leaves its generation copied in part, and the next precopies it again). The
-- look-up is a correlated subquery, not NOT EXISTS: the planner would make that an anti-join,
-- which it may run as a hash or merge join reading all of history, where a subquery is one
-- probe of history's primary key per row. There is no ON CONFLICT besides: it probed the key
-- again and made each insert speculative (a WAL record more a row), 2.3 us a row of the copy's
-- 9 (python bench/lab/copy_cost.py). Two rotators copying the same rows at once both find
-- them missing; the second waits on the first's uncommitted keys and fails with
-- unique_violation (23505) once the first commits, and the archive job sends the batch again
-- (it then finds the rows in history): a retry, never a row lost or copied twice.
-- p_copied_before (NULL: none) is a transaction horizon the caller took before a precopy
-- that then read the slot's finished rows to the end, batch after batch in id order, and
-- committed: every row that a transaction below the horizon finished was visible to each
-- batch, so it is in history, and it is not looked up there again. Such a row's version is
-- older than the horizon by its xmin: every transaction below a snapshot's xmin had ended
-- when the snapshot was taken (pg_snapshot_xmin), a subtransaction's xid is above its
-- parent's, and age() counts back from this transaction, so the older the greater. A row
-- finished later, or by a transaction open across the horizon, is looked up as before, and
-- so is a version that reads as frozen (age 2147483647). The truncate's look under its lock
-- then probes history for the few rows finished since the precopy, not for every row of the
-- generation: each probe reads history's heap (its new pages are not all-visible yet). For a
-- generation of 2,000 rows, 20 finished since: 2.2 ms under the lock against 7.0-7.3, about
-- 2.5 us a row (python bench/lab/empty_look.py).
-- The rows go into history in id order (the INSERT's ORDER BY; the executor inserts them as
-- its sort yields them): two rotators copying the same rows wait on each other's keys only
-- in one direction, from the lower ids up, so neither ever waits on a key the other is
-- waiting to insert (a deadlock), whatever order the join would yield them in (it may follow
-- the data table's physical order, where rot_move put stragglers after newer rows).
CREATE OR REPLACE FUNCTION {{fn_rot_copy}}(p_slot smallint, p_after bigint, p_batch integer,
                                         p_copied_before xid8 DEFAULT NULL,
                                         OUT copied bigint, OUT last_id bigint)
LANGUAGE plpgsql
SET plan_cache_mode = force_custom_plan
AS $fn$
DECLARE
    v_cut integer := age(p_copied_before::xid);
    v_upto bigint;
    v_found bigint;
BEGIN
    IF p_batch IS NOT NULL THEN
        SELECT max(b.id), count(*) INTO v_upto, v_found
        FROM (SELECT m.id FROM {{meta}} m
              WHERE m.slot = p_slot AND m.id > p_after AND m.status >= 2
              ORDER BY m.id
              LIMIT p_batch) b;
        IF v_upto IS NULL THEN
            copied := 0;
            RETURN;
        END IF;
    END IF;
    INSERT INTO {{history}} (id, priority, due_at, status, title, attempts, max_attempts, lease_owner,
                             enqueued_at, dequeued_at, finished_at, last_error, payload, headers, archived_at)
    SELECT m.id, m.priority, m.due_at, m.status, m.title, m.attempts, m.max_attempts, m.lease_owner,
           m.enqueued_at, m.dequeued_at, m.finished_at, m.last_error, d.payload, d.headers, now()
    FROM {{meta}} m LEFT JOIN {{data}} d ON d.id = m.id AND d.slot = p_slot
    WHERE m.slot = p_slot AND m.id > p_after AND (v_upto IS NULL OR m.id <= v_upto) AND m.status >= 2
      AND (v_cut IS NULL OR age(m.xmin) <= v_cut OR age(m.xmin) = 2147483647)
      AND (SELECT true FROM {{history}} h WHERE h.id = m.id) IS NULL
    ORDER BY m.id;
    GET DIAGNOSTICS copied = ROW_COUNT;
    last_id := CASE WHEN v_found = p_batch THEN v_upto END;
END
$fn$;

-- name: create_rot_empty
-- reliable_0017: the rotator's truncate, told which generation the caller precopied and
-- from which horizon (reliable_0012's body, without them, is in history/reliable.sql).
-- Created beside the older signature, as create_rot_copy is.

-- Archive and empty the oldest sealed epoch (header, 5) under lock_timeout p_lock_timeout_ms;
-- the caller has precopied it (rot_copy, without the lock). Returns the epoch emptied (the
-- caller marks it), or NULL when none waits; raises lock_not_available (55P03) when the
-- slot stays locked past the timeout. p_epoch and p_copied_before (both NULL: none): the
-- caller precopied epoch p_epoch from horizon p_copied_before (rot_copy says what that
-- promises); the copy under the lock then looks up only the rows finished since. The horizon
-- holds for that epoch only: were another one next to empty (another rotator emptied
-- p_epoch meanwhile), every finished row of it is looked up. A caller that names a horizon
-- vouches for its precopy: rows it says were copied are not looked up, and the truncate
-- drops them. `queuectl grant` gives the rotator's calls to no role (the queue's owner runs
-- the archive job); a DBA who grants this one grants that trust with it.
CREATE OR REPLACE FUNCTION {{fn_rot_empty}}(p_lock_timeout_ms integer, p_epoch bigint DEFAULT NULL,
                                          p_copied_before xid8 DEFAULT NULL,
                                          OUT epoch bigint, OUT copied bigint, OUT moved bigint)
LANGUAGE plpgsql AS $fn$
DECLARE
    v_slot smallint;
    v_ids bigint[];
BEGIN
    epoch := {{fn_rot_next_empty}}();
    IF epoch IS NULL THEN
        RETURN;
    END IF;
    v_slot := (epoch % 3)::smallint;
    PERFORM set_config('lock_timeout', p_lock_timeout_ms || 'ms', true);
    IF v_slot = 0 THEN
        LOCK TABLE {{meta0}}, {{data0}} IN ACCESS EXCLUSIVE MODE;
    ELSIF v_slot = 1 THEN
        LOCK TABLE {{meta1}}, {{data1}} IN ACCESS EXCLUSIVE MODE;
    ELSE
        LOCK TABLE {{meta2}}, {{data2}} IN ACCESS EXCLUSIVE MODE;
    END IF;
    -- Another rotator may have emptied this epoch while we waited for the lock, marked it
    -- and switched new rows into the same slot: the state is read again under the lock
    -- (a mark is set only after its truncate committed), and nothing is done if it moved on.
    IF {{fn_rot_next_empty}}() IS DISTINCT FROM epoch THEN
        epoch := NULL;
        RETURN;
    END IF;
    copied := (SELECT c.copied
               FROM {{fn_rot_copy}}(v_slot, 0, NULL, CASE WHEN epoch = p_epoch THEN p_copied_before END) c);
    v_ids := ARRAY(SELECT m.id FROM {{meta}} m WHERE m.slot = v_slot AND m.status < 2);
    moved := {{fn_rot_move}}(v_ids, ((SELECT last_value FROM {{rot_epoch}}) % 3)::smallint);
    IF v_slot = 0 THEN
        TRUNCATE {{meta0}}, {{data0}};
    ELSIF v_slot = 1 THEN
        TRUNCATE {{meta1}}, {{data1}};
    ELSE
        TRUNCATE {{meta2}}, {{data2}};
    END IF;
END
$fn$;

-- name: drop_rot_calls_unaware
-- reliable_0017 upgrade, after carry_function_grants: the rotator's copy and truncate
-- without the precopy's horizon.
DROP FUNCTION IF EXISTS {{fn_rot_copy}}(smallint, bigint, integer);
DROP FUNCTION IF EXISTS {{fn_rot_empty}}(integer);

-- name: drop_rot_calls_aware
-- reliable_0017 downgrade, after carry_function_grants: the rotator's copy and truncate
-- that take the precopy's horizon.
DROP FUNCTION IF EXISTS {{fn_rot_copy}}(smallint, bigint, integer, xid8);
DROP FUNCTION IF EXISTS {{fn_rot_empty}}(integer, bigint, xid8);

-- name: drop_rotator
-- reliable_0012 downgrade: the rotator's calls, the per-slot claims and acks.
DROP FUNCTION IF EXISTS {{fn_claim_in}}(smallint[], integer, double precision, text);
DROP FUNCTION IF EXISTS {{fn_claim_in0}}(smallint[], integer, double precision, text);
DROP FUNCTION IF EXISTS {{fn_claim_in1}}(smallint[], integer, double precision, text);
DROP FUNCTION IF EXISTS {{fn_claim_in2}}(smallint[], integer, double precision, text);
DROP FUNCTION IF EXISTS {{fn_ack_in}}(bigint[], text);
DROP FUNCTION IF EXISTS {{fn_ack_in0}}(bigint[], text);
DROP FUNCTION IF EXISTS {{fn_ack_in1}}(bigint[], text);
DROP FUNCTION IF EXISTS {{fn_ack_in2}}(bigint[], text);
DROP FUNCTION IF EXISTS {{fn_rot_empty}}(integer);
DROP FUNCTION IF EXISTS {{fn_rot_next_empty}}();
DROP FUNCTION IF EXISTS {{fn_rot_copy}}(smallint, bigint, integer);
DROP FUNCTION IF EXISTS {{fn_rot_mark}}(text, bigint);
DROP FUNCTION IF EXISTS {{fn_rot_seal}}(integer);
DROP FUNCTION IF EXISTS {{fn_rot_switch}}(bigint);
DROP FUNCTION IF EXISTS {{fn_rot_state}}();

-- name: drop_rotation_functions
-- reliable_0012 downgrade, after reliable_0011's functions are back: the writers' helpers.
DROP FUNCTION IF EXISTS {{fn_rot_follow}}(bigint[], bigint);
DROP FUNCTION IF EXISTS {{fn_rot_move}}(bigint[], smallint, smallint);

-- name: drop_functions
-- Remove the SQL API.
DROP FUNCTION IF EXISTS {{fn_release}}(bigint[], text);
DROP FUNCTION IF EXISTS {{fn_extend_lease}}(bigint[], double precision, text);
DROP FUNCTION IF EXISTS {{fn_nack}}(bigint[], text, text, double precision, double precision);
DROP FUNCTION IF EXISTS {{fn_ack}}(bigint[], text);
DROP FUNCTION IF EXISTS {{fn_dequeue}}(integer, double precision, text);
DROP FUNCTION IF EXISTS {{fn_enqueue_many}}(bytea[], jsonb[], smallint[], interval[], text[], integer);
DROP FUNCTION IF EXISTS {{fn_enqueue}}(bytea, jsonb, smallint, interval, text, integer);

-- name: drop_tables
-- Remove the queue's tables (and with them its indexes and sequence).
DROP TABLE IF EXISTS {{history}};
DROP TABLE IF EXISTS {{data}};
DROP TABLE IF EXISTS {{meta}};

-- name: create_ack_dequeue
-- reliable_0004: a consumer acks the batch it finished and claims its next batch in ONE
-- call, i.e. one round trip and one transaction (one commit, one WAL flush) where ack
-- then dequeue cost two of each. At batch 1 a message otherwise costs three commits
-- (enqueue, dequeue, ack); this makes it two. The ack and the claim are the ack and
-- dequeue functions above, run in that order in the caller's transaction, so their rules
-- (only the lease holder acks; expired leases first; SKIP LOCKED) are not restated here.
-- Returns the claimed batch only, like dequeue; a caller that needs to know how many of
-- its acks landed (how many items it still held) calls ack().
CREATE FUNCTION {{fn_ack_dequeue}}(
    p_ack_ids       bigint[],
    p_batch         integer          DEFAULT 1,
    p_lease_seconds double precision DEFAULT {{lease_seconds}},
    p_worker        text             DEFAULT NULL
) RETURNS TABLE (
    id bigint, priority smallint, due_at timestamptz, title text, attempts integer,
    max_attempts integer, enqueued_at timestamptz, dequeued_at timestamptz,
    leased_until timestamptz, payload bytea, headers jsonb
)
LANGUAGE plpgsql AS $fn$
BEGIN
    IF cardinality(p_ack_ids) > 0 THEN
        PERFORM {{fn_ack}}(p_ack_ids, p_worker);
    END IF;
    RETURN QUERY SELECT * FROM {{fn_dequeue}}(p_batch, p_lease_seconds, p_worker);
END
$fn$;

-- name: drop_ack_dequeue
-- reliable_0004 downgrade: consumers ack and dequeue in two calls again.
DROP FUNCTION IF EXISTS {{fn_ack_dequeue}}(bigint[], integer, double precision, text);

-- name: set_autovacuum
-- reliable_0007: autovacuum storage parameters per table role (reset_autovacuum removes
-- exactly these). PostgreSQL's defaults vacuum a table once 50 + 0.2 x reltuples rows are
-- dead, and a busy table is visited at most once per autovacuum_naptime (1 min) whatever
-- its settings: the parameters below decide WHICH naptime rounds vacuum a queue table,
-- not how often a round comes.
--
-- <queue>_meta: every message leaves three dead versions (dequeue and ack update an
--   indexed column, status, so neither is HOT; the archive deletes the row). The dead
--   READY versions sit at the head of the ready index, where every dequeue starts, and
--   stay there until VACUUM removes them (dba.md 2.9): a dequeue walks all of them. With
--   a scale factor the head may collect 20% of the backlog first (200,000 dead entries
--   under a backlog of 1,000,000 drained slowly). Scale factor 0 and a threshold of 1,000
--   dead rows (about 330 messages) make every naptime round vacuum it as soon as there is
--   any real churn, however deep the backlog is.
--   No cost delay: a throttled vacuum leaves the head dirty longest exactly when the
--   table is largest (a deep backlog, or a minute of churn at full speed).
--   Inserts: the same absolute trigger (PG13+), so a backlog that only grows (consumers
--   stopped) is still visited every round: visibility map, hint bits and freezing done in
--   the background instead of by the first consumers back.
--   ANALYZE keeps its defaults: a busy meta table passes 50 + 10% modifications in
--   seconds, so it is analysed every round already; a lower trigger would only add
--   analyses of quiet queues, each holding a snapshot (the xmin horizon, dba.md 2.3) for
--   its duration. The dequeue does not depend on the statistics (reliable_0005), so a
--   table analysed empty and then filled costs nothing.
-- <queue>_data: written once at enqueue, deleted by the archive (one dead row per
--   message, found only through the primary key: dead rows cost space, not dequeue
--   time). Scale factor 0 and the same threshold keep the table near its live size
--   instead of 20% above it. No cost delay either: this table (with its TOAST table)
--   churns the payload bytes as fast as the queue runs, and a vacuum throttled at the
--   default 2 ms can dirty at most ~40 MB/s (cost limit 200, 20 per dirtied page): a
--   fast queue with large payloads deletes more than that, so the vacuum would never
--   catch up (bench/autovacuum.py --kind ring --payload-bytes 4000 shows it on a TOAST
--   table). Its TOAST table follows all of these: autovacuum reads the main table's
--   parameters for a TOAST table that has none of its own.
-- <queue>_history: append-only, emptied from the oldest end by retention. What vacuum
--   does here is set the visibility map and freeze (PostgreSQL 13's insert-driven
--   vacuum) and, in passing, remove the rows retention purged (whose dead entries the
--   next purge would walk at the head of the archived_at index). An absolute insert
--   trigger (100,000 rows, scale factor 0) gives each vacuum a bounded slice of new
--   pages instead of 20% of an ever larger table; dead-row and analyze triggers keep
--   their defaults (retention deletes as fast as the archive inserts, so the insert
--   trigger comes first).
-- Measured (bench/autovacuum.py: 2 producers, 2 consumers and the archiver, batch 50, a
-- queue with these settings against one without, in turn, 2 repeats; on a machine shared
-- with another benchmark, so msg/s swung by a quarter between repeats):
--  * full speed, 300-byte payloads, backlog 50,000, 90 s per side (reliable_0007 against
--    reliable_0006): meta held a median of 899,520 dead rows against 1,498,132 (214
--    against 257 MB), data 142,538 against 479,100 (239 against 274 MB); 13,432 against
--    13,137 msg/s, dequeue(50) 5.88 against 6.28 ms. At this rate every table passes any
--    trigger within seconds, so autovacuum_naptime (a server setting) decides how often;
--    what changes is that the unthrottled vacuums finish (1.5 against 0.5 finished
--    autovacuums per run on each table; without the settings none had finished on any
--    table after 90 s in one repeat of two). A run before reliable_0006 existed (the
--    settings on reliable_0005) gave 809,990 against 1,309,575 dead rows in meta;
--  * a deep backlog drained slowly (200,000 waiting, 150 msg/s, 90 s per side; the
--    settings on reliable_0005, data still throttled): without the settings meta was never
--    vacuumed (dead rows rising to 39,362, on their way to 0.2 x 200,000), with them at
--    the first round: median 9,025 against 20,075; dequeue times equal within noise at
--    these counts;
--  * 4,000-byte payloads (backlog 20,000, 60 s per side; the settings on reliable_0005):
--    meta 593,599 against 828,892 dead rows, data with its TOAST table 1.51 against
--    1.76 GB, 9,636 against 9,286 msg/s.
-- ALTER TABLE ... SET takes SHARE UPDATE EXCLUSIVE: producers and consumers are not
-- blocked; a running autovacuum of the table is waited for (or cancels itself).
ALTER TABLE {{meta}} SET (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0,
    autovacuum_vacuum_insert_threshold = 1000,
    autovacuum_vacuum_cost_delay = 0
);
ALTER TABLE {{data}} SET (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_cost_delay = 0
);
ALTER TABLE {{history}} SET (
    autovacuum_vacuum_insert_scale_factor = 0,
    autovacuum_vacuum_insert_threshold = 100000
);

-- name: reset_autovacuum
-- reliable_0007 downgrade: back to the server's autovacuum settings (exactly the
-- parameters set_autovacuum set; fillfactor and anything else stay as they are).
ALTER TABLE {{meta}} RESET (
    autovacuum_vacuum_scale_factor,
    autovacuum_vacuum_threshold,
    autovacuum_vacuum_insert_scale_factor,
    autovacuum_vacuum_insert_threshold,
    autovacuum_vacuum_cost_delay
);
ALTER TABLE {{data}} RESET (
    autovacuum_vacuum_scale_factor,
    autovacuum_vacuum_threshold,
    autovacuum_vacuum_cost_delay
);
ALTER TABLE {{history}} RESET (
    autovacuum_vacuum_insert_scale_factor,
    autovacuum_vacuum_insert_threshold
);

-- name: set_plan_guard
-- reliable_0008: the functions that look rows up in the meta table plan without sequential
-- scans and without JIT (reset_plan_guard removes exactly these two settings).
-- plpgsql caches each statement's plan per session: after five custom plans it keeps a
-- generic one when that looks no dearer, and keeps it until the table's statistics or
-- definition change. A consumer session that plans while its queue is empty or holds a
-- page (analysed: a drained queue, once autovacuum has been by) gets generic plans that
-- read the meta and data tables whole (a sequential scan is the cheapest way to read one
-- page), and keeps them while a burst grows the tables, until autovacuum next analyses or
-- vacuums them (a naptime round at best; never while autovacuum is off or starved).
-- Measured (the session's plans cached on 0, 1 or 20 analysed
-- rows, then 20,000 rows enqueued and 500 leased, no ANALYZE): 1,101-1,470 shared buffers
-- per dequeue(10) against 139-160 in a new session, growing with the table (2,667-4,174 at
-- 60,000 rows); with this revision 149-151 (150-152 at 60,000).
-- With sequential scans disabled the planner goes through an index (the primary key, the
-- ready or the leased index) whatever the size of the table it plans for; a statement with
-- no index path still gets its sequential scan, at a cost estimate raised by 10^10, which
-- would make every call JIT-compile it (jit_above_cost is 100,000): measured on the heap
-- kind, whose pick has no index path, 42 ms per call instead of 0.22 ms. So JIT is off
-- too: these statements touch a few index pages and never gain from it. On an empty table
-- every index path costs the same, so the dequeue also reads its payloads by an array of
-- the claimed ids instead of a join (create_dequeue).
-- Cost (bench/plan_guard.py: pgbench, one client, dequeue(N) + ROLLBACK on 20,000
-- analysed rows, this revision and reliable_0007 in one run, alternating, medians of 5):
-- 0.94x / 0.95x / 0.88x the dequeue calls per second at N = 1 / 10 / 100 (runs spread by
-- +-10%: the SET clauses are applied at every call, the payloads go through an array);
-- forcing a custom plan per call instead (plan_cache_mode = force_custom_plan) cost
-- 0.55x / 0.50x / 0.68x. What it removes: every dequeue reading the whole backlog, for up
-- to an autovacuum round, whenever a burst follows a spell of polling an empty queue.
-- A function's SET clauses apply to its own statements only: callers, ack_dequeue
-- included, keep their settings. A later revision that replaces one of these functions
-- (CREATE OR REPLACE resets its SET clauses) must run this section again after it (a test
-- checks the installed head: tests/test_plan_guard.py).
ALTER FUNCTION {{fn_dequeue}}(integer, double precision, text) SET enable_seqscan = off SET jit = off;
ALTER FUNCTION {{fn_ack}}(bigint[], text) SET enable_seqscan = off SET jit = off;
ALTER FUNCTION {{fn_nack}}(bigint[], text, text, double precision, double precision) SET enable_seqscan = off SET jit = off;
ALTER FUNCTION {{fn_extend_lease}}(bigint[], double precision, text) SET enable_seqscan = off SET jit = off;
ALTER FUNCTION {{fn_release}}(bigint[], text) SET enable_seqscan = off SET jit = off;

-- name: reset_plan_guard
-- reliable_0008 downgrade: the functions plan with the session's settings again (exactly
-- the two settings set_plan_guard set; the search_path `queuectl grant` set stays).
ALTER FUNCTION {{fn_dequeue}}(integer, double precision, text) RESET enable_seqscan RESET jit;
ALTER FUNCTION {{fn_ack}}(bigint[], text) RESET enable_seqscan RESET jit;
ALTER FUNCTION {{fn_nack}}(bigint[], text, text, double precision, double precision) RESET enable_seqscan RESET jit;
ALTER FUNCTION {{fn_extend_lease}}(bigint[], double precision, text) RESET enable_seqscan RESET jit;
ALTER FUNCTION {{fn_release}}(bigint[], text) RESET enable_seqscan RESET jit;

-- name: set_sort_guard
-- reliable_0016: the claims (create_claim_calls: on the parents and on each slot's tables)
-- plan without a sort (reset_sort_guard removes exactly this setting). Their plans are
-- generic, made once per session and again after each truncate of a slot they name, that is
-- at the start of every generation, when the slot's row counts are unknown (a TRUNCATE
-- resets them). On a slot autovacuum has not analysed yet (every slot of a new queue, for a
-- while) the planner then counts a few READY rows and finds it cheapest to read them all
-- through a bitmap scan of the ready index and sort them for the batch; the plan stays for
-- the generation, and when a backlog stands there every claim reads and sorts the whole of
-- it. Measured: a new session's dequeue(10) on 20,000 READY rows of such a slot read 511
-- shared buffers against 128 with this setting, which is what it reads at 2,000 rows too;
-- beside a full-speed cycle with the archive job, 4 consumers on a standing backlog, a claim
-- on a slot's own tables took 1.6-2.8 ms against 0.5 ms with it (bench/lab/RESULTS.md: "a
-- claim planned at the start of a generation"). With sorts disabled the ready CTE walks the
-- ready index in its own order ((priority, due_at, id); a Merge Append of the slots' indexes
-- on the parents) and stops after the batch. The result's own ORDER BY (a batch of rows at
-- most) has no other way and keeps its sort, at a cost estimate raised by 10^10 that no
-- choice depends on; JIT is off on these functions already (set_plan_guard says why that
-- matters). A later revision that replaces the claims (CREATE OR REPLACE resets SET
-- clauses) must run this section again (a test checks the installed head:
-- tests/test_plan_guard.py).
ALTER FUNCTION {{fn_claim_in}}(smallint[], integer, double precision, text) SET enable_sort = off;
ALTER FUNCTION {{fn_claim_in0}}(smallint[], integer, double precision, text) SET enable_sort = off;
ALTER FUNCTION {{fn_claim_in1}}(smallint[], integer, double precision, text) SET enable_sort = off;
ALTER FUNCTION {{fn_claim_in2}}(smallint[], integer, double precision, text) SET enable_sort = off;

-- name: reset_sort_guard
-- reliable_0016 downgrade: the claims plan with sorts allowed again (their other SET clauses,
-- create_claim_calls', stay).
ALTER FUNCTION {{fn_claim_in}}(smallint[], integer, double precision, text) RESET enable_sort;
ALTER FUNCTION {{fn_claim_in0}}(smallint[], integer, double precision, text) RESET enable_sort;
ALTER FUNCTION {{fn_claim_in1}}(smallint[], integer, double precision, text) RESET enable_sort;
ALTER FUNCTION {{fn_claim_in2}}(smallint[], integer, double precision, text) RESET enable_sort;

-- name: enqueue
-- Client call: one item.
SELECT {{fn_enqueue}}(:payload, CAST(:headers AS jsonb), CAST(:priority AS smallint),
                      make_interval(secs => :delay), :title, CAST(:max_attempts AS integer)) AS id

-- name: enqueue_many
-- Client call: many items in one round trip.
SELECT id FROM {{fn_enqueue_many}}(CAST(:payloads AS bytea[]), CAST(:headers AS jsonb[]),
                                   CAST(:priorities AS smallint[]), CAST(:delays AS interval[]),
                                   CAST(:titles AS text[]), CAST(:max_attempts AS integer)) AS id

-- name: dequeue
-- Client call: claim a batch (the one statement is in the function above).
SELECT * FROM {{fn_dequeue}}(:batch, :lease_seconds, :worker)

-- name: ack
SELECT {{fn_ack}}(CAST(:ids AS bigint[]), :worker) AS acked

-- name: nack
SELECT * FROM {{fn_nack}}(CAST(:ids AS bigint[]), :error, :worker, :base_seconds, :max_seconds)

-- name: extend_lease
SELECT * FROM {{fn_extend_lease}}(CAST(:ids AS bigint[]), :lease_seconds, :worker)

-- name: release
SELECT {{fn_release}}(CAST(:ids AS bigint[]), :worker) AS released

-- name: ack_dequeue
-- Client call: ack what this worker finished (:ack_ids, may be empty) and claim the next batch.
SELECT * FROM {{fn_ack_dequeue}}(CAST(:ack_ids AS bigint[]), :batch, :lease_seconds, :worker)

-- name: counts
-- Items by status, for `queuectl list` and health; READY items not yet due count as scheduled.
SELECT status, (status = 0 AND due_at > now()) AS scheduled, count(*) AS n
FROM {{meta}} GROUP BY 1, 2
