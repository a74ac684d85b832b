-- The watermark queue on PostgreSQL: a FIFO whose dequeue range-scans from a low watermark.
--
-- Why: a plain FIFO dequeue walks its primary key from the start. Every item dequeued
-- before leaves a dead heap row and a dead index entry there; while any snapshot that
-- could still see them stays open (a REPEATABLE READ report, pg_dump, a replica with
-- hot_standby_feedback), VACUUM cannot remove them and index scans cannot mark them
-- dead, so each dequeue walks all of them again: dequeue cost grows with the number of
-- items dequeued since that snapshot, and a drain becomes quadratic. This dequeue starts
-- at `id >= low` instead, so it walks at most the ghosts left since `low` last moved.
--
-- Where the watermark lives (the stored row must never be a hot spot: updating it on
-- every dequeue would give it one dead version per dequeue for every reader to walk):
--  * working value: in the consumer's session (a custom setting, reverted with its
--    transaction on rollback), read and written by every dequeue at no MVCC cost;
--  * <queue>_watermark: one row, a hint for new sessions, persisted at most once a
--    second per consumer; `epoch` changes when correct_watermark() rewrites it, and
--    every session adopts the corrected value at its next move.
--
-- How it moves, every 100th dequeue call of a session, and why it never passes an item
-- that can still be dequeued:
--  1. enqueue assigns the transaction id BEFORE it draws an item id, so every drawn id
--     belongs to a transaction that is visible in snapshots taken after the draw;
--  2. at a move the session records a candidate: the sequence's next id (read first),
--     then the current snapshot's xmax. Every id below the candidate was drawn by a
--     transaction older than that xmax;
--  3. at the next move, if no transaction older than the recorded xmax is still running
--     (none in the current snapshot's in-progress list; the own one is never listed),
--     each of those ids is committed (its row visible now) or rolled back (never will
--     be). The watermark becomes least(candidate, the smallest id still present at or
--     above the old watermark): rows locked by other consumers still count as present,
--     so their rollback cannot strand them.
--  A long-running WRITING transaction therefore pauses the watermark (it stays correct
--  and the dequeue scans from the last safe point); read-only snapshots, the usual cause
--  of ghosts, do not. Insert into the table only through the enqueue functions, and do
--  not give the id sequence a CACHE above 1 (ids must be drawn in time order).
--
-- Sections are filled by queuectl.sqlfiles.render() with quoted identifiers only.

-- name: create_tables
-- The items (a FIFO table) and the one-row watermark hint.
CREATE TABLE {{items}} (
    id          bigint      GENERATED ALWAYS AS IDENTITY (SEQUENCE NAME {{items_seq}}) PRIMARY KEY,
    payload     bytea       NOT NULL,
    headers     jsonb,
    enqueued_at timestamptz NOT NULL DEFAULT now()
);

-- low: no item with a smaller id can still be dequeued (a hint for new sessions).
-- epoch: bumped whenever correct_watermark() changes low; sessions then adopt it.
-- pending_low/pending_xmax: correct_watermark's candidate from its previous run (step 2).
CREATE TABLE {{watermark}} (
    only_row     boolean     PRIMARY KEY DEFAULT true CHECK (only_row),
    low          bigint      NOT NULL DEFAULT 1,
    epoch        bigint      NOT NULL DEFAULT 0,
    pending_low  bigint,
    pending_xmax xid8,
    updated_at   timestamptz NOT NULL DEFAULT now(),
    corrected_at timestamptz
) WITH (fillfactor = 50);

INSERT INTO {{watermark}} DEFAULT VALUES;

-- name: create_functions
-- The SQL API, callable from any language.

-- enqueue one item; returns its id. pg_current_xact_id() first: see step 1 above.
CREATE FUNCTION {{fn_enqueue}}(p_payload bytea, p_headers jsonb DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql AS $fn$
DECLARE
    v_id bigint;
BEGIN
    PERFORM pg_current_xact_id();
    INSERT INTO {{items}} (payload, headers) VALUES (p_payload, p_headers) RETURNING id INTO v_id;
    RETURN v_id;
END
$fn$;

-- enqueue many items in one statement; ids are drawn in array order and returned in it.
CREATE FUNCTION {{fn_enqueue_many}}(p_payloads bytea[], p_headers jsonb[] DEFAULT NULL)
RETURNS SETOF bigint
LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM pg_current_xact_id();
    RETURN QUERY
    WITH src AS MATERIALIZED (
        SELECT nextval({{items_seq_regclass}}::regclass) AS id, u.payload, u.headers, u.ord
        FROM unnest(p_payloads, p_headers) WITH ORDINALITY AS u(payload, headers, ord)
        WHERE u.ord <= cardinality(p_payloads)
    ), ins AS (
        INSERT INTO {{items}} (id, payload, headers) OVERRIDING SYSTEM VALUE
        SELECT src.id, src.payload, src.headers FROM src
    )
    SELECT src.id FROM src ORDER BY src.ord;
END
$fn$;

-- name: create_correct_watermark
-- correct_watermark (watermark_0005 gave it its isolation check; history/watermark.sql keeps
-- watermark_0001's body). CREATE OR REPLACE: watermark_0001 runs it after create_functions.

-- correct_watermark: recompute the true low bound (the smallest id still in the table,
-- else the next id to be drawn) and fix the stored hint; sessions adopt a changed hint
-- at their next move. Meant for a job every few minutes: it walks the index from its
-- start, over every ghost, once per run.
--  * stored low too high (items below it are unreachable): lowered at once.
--  * stored low too low (dequeues walk needless ghosts): raised to the true bound, but
--    only over ids whose enqueue has settled: at once when no other transaction is
--    running, else up to the candidate this function recorded on its previous run once
--    every transaction older than that run has ended (so a busy queue takes two runs).
-- Returns one row: the old and new stored low, the true bound, whether it changed, why.
CREATE OR REPLACE FUNCTION {{fn_correct_watermark}}()
RETURNS TABLE (old_low bigint, new_low bigint, true_low bigint, changed boolean, reason text)
LANGUAGE plpgsql AS $fn$
DECLARE
    v_next   bigint;
    v_snap   pg_snapshot;
    v_row    record;
    v_true   bigint;
    v_new    bigint;
    v_reason text;
BEGIN
    IF current_setting('transaction_isolation') IN ('repeatable read', 'serializable') THEN
        RAISE EXCEPTION USING ERRCODE = 'QC400', MESSAGE = format(
            'queue %L: correct_watermark runs in READ COMMITTED transactions only (this one is %s): an older snapshot sees the items table empty once the compact job has rewritten it, and the mark would move past its items',
            {{queue_literal}}, current_setting('transaction_isolation'));
    END IF;
    SELECT CASE WHEN s.is_called THEN s.last_value + 1 ELSE s.last_value END INTO v_next FROM {{items_seq}} s;
    v_snap := pg_current_snapshot();
    SELECT w.low, w.epoch, w.pending_low, w.pending_xmax INTO v_row FROM {{watermark}} w FOR UPDATE;
    v_true := coalesce((SELECT min(i.id) FROM {{items}} i), v_next);
    IF v_row.low > v_true THEN
        v_new := v_true;
        v_reason := 'lowered: items below the stored watermark were unreachable';
    ELSIF v_row.low < v_true THEN
        IF NOT EXISTS (SELECT 1 FROM pg_snapshot_xip(v_snap)) THEN
            v_new := least(v_true, v_next);
            v_reason := 'raised: no other transaction was in flight';
        ELSIF v_row.pending_low IS NOT NULL
              AND NOT EXISTS (SELECT 1 FROM pg_snapshot_xip(v_snap) x WHERE x < v_row.pending_xmax) THEN
            v_new := greatest(v_row.low, least(v_true, v_row.pending_low));
            v_reason := 'raised up to the previous run''s settled candidate';
        ELSE
            v_new := v_row.low;
            v_reason := 'raise deferred: transactions that may hold enqueues were in flight; the next run completes it';
        END IF;
    ELSE
        v_new := v_row.low;
        v_reason := 'already correct';
    END IF;
    UPDATE {{watermark}} w SET
        low          = v_new,
        epoch        = w.epoch + CASE WHEN v_new <> v_row.low THEN 1 ELSE 0 END,
        pending_low  = v_next,
        pending_xmax = pg_snapshot_xmax(v_snap),
        updated_at   = clock_timestamp(),
        corrected_at = clock_timestamp();
    RETURN QUERY SELECT v_row.low, v_new, v_true, v_new <> v_row.low, v_reason;
END
$fn$;

-- name: create_dequeue
-- The dequeue (watermark_0005 installed it; history/watermark.sql keeps watermark_0001's and watermark_0002's).
-- dequeue and correct_watermark refuse a REPEATABLE READ or SERIALIZABLE transaction (SQLSTATE
-- QC400, watermark_0005): the compact job TRUNCATEs and refills the items table, which a
-- snapshot older than it sees empty, so a dequeue there could move its low mark past items it
-- cannot see and correct_watermark could raise the stored one past them. enqueue only inserts.

-- dequeue: ONE statement takes up to p_batch items at or above the session's watermark,
-- oldest first, skipping rows other consumers hold. Around it, every 100th call moves
-- the session's watermark (steps 2 and 3 above).
-- Session state, one custom setting 'queuectl.wm<items oid>' = 'low,calls,candidate,xmax,epoch'.
-- The DELETE finds the picked rows by `id = ANY (ARRAY(...))`: the array is computed once and
-- the planner counts on a handful of ids, so on a table of more than a few pages it goes
-- through the primary key. A join to the picks (watermark_0001) is planned from the pick's LIMIT,
-- which a generic plan cannot see: it assumes a tenth of the table and hashes the picks
-- against a sequential scan of the whole table (measured with generic plans: 1,775 buffers
-- per dequeue of 10 at 40,000 rows and 122 at 2,000, against 57 at both this way).
CREATE OR REPLACE FUNCTION {{fn_dequeue}}(p_batch integer DEFAULT 1)
RETURNS TABLE (id bigint, payload bytea, headers jsonb, enqueued_at timestamptz, dequeued_at timestamptz)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
DECLARE
    v_key    text := 'queuectl.wm' || {{items_regclass}}::regclass::oid;
    v_state  text[] := string_to_array(current_setting(v_key, true), ',');
    v_low    bigint;
    v_calls  integer;
    v_stored record;
BEGIN
    IF current_setting('transaction_isolation') IN ('repeatable read', 'serializable') THEN
        RAISE EXCEPTION USING ERRCODE = 'QC400', MESSAGE = format(
            'queue %L: dequeue runs in READ COMMITTED transactions only (this one is %s): an older snapshot sees the items table empty once the compact job has rewritten it, and the session''s mark would move past its items',
            {{queue_literal}}, current_setting('transaction_isolation'));
    END IF;
    IF v_state IS NULL OR cardinality(v_state) <> 5 THEN
        -- first dequeue of this session: start from the stored hint
        SELECT ARRAY[w.low::text, '0', '', '', w.epoch::text] INTO v_state FROM {{watermark}} w;
    END IF;
    v_low := v_state[1]::bigint;
    v_calls := v_state[2]::integer + 1;

    IF v_calls >= 100 THEN
        v_calls := 0;
        SELECT w.low, w.epoch, w.updated_at INTO v_stored FROM {{watermark}} w;
        IF v_stored.epoch::text <> v_state[5] THEN
            -- correct_watermark() rewrote the hint: adopt it, drop our candidate
            v_low := v_stored.low;
            v_state[3] := '';
            v_state[4] := '';
            v_state[5] := v_stored.epoch::text;
        ELSE
            IF v_state[3] <> '' AND NOT EXISTS (
                SELECT 1 FROM pg_snapshot_xip(pg_current_snapshot()) x WHERE x < v_state[4]::xid8
            ) THEN
                -- step 3: every id below the candidate is settled
                v_low := least(
                    v_state[3]::bigint,
                    coalesce((SELECT min(i.id) FROM {{items}} i WHERE i.id >= v_low), v_state[3]::bigint)
                );
                v_state[3] := '';
                -- persist rarely, never over a correction (epoch), never backwards
                IF v_low > v_stored.low AND v_stored.updated_at < clock_timestamp() - interval '1 second' THEN
                    UPDATE {{watermark}} w SET low = v_low, updated_at = clock_timestamp()
                    FROM (SELECT h.only_row FROM {{watermark}} h
                          WHERE h.epoch = v_stored.epoch AND h.low < v_low
                          FOR UPDATE SKIP LOCKED) h
                    WHERE w.only_row = h.only_row;
                END IF;
            END IF;
            IF v_state[3] = '' THEN
                -- step 2: the next candidate (sequence first, then the snapshot). While an
                -- older transaction still runs, the old candidate is kept instead.
                v_state[3] := (SELECT CASE WHEN s.is_called THEN s.last_value + 1 ELSE s.last_value END
                               FROM {{items_seq}} s)::text;
                v_state[4] := pg_snapshot_xmax(pg_current_snapshot())::text;
            END IF;
        END IF;
    END IF;
    PERFORM set_config(v_key, array_to_string(ARRAY[v_low::text, v_calls::text, v_state[3], v_state[4], v_state[5]], ','), false);

    RETURN QUERY
    WITH picked AS MATERIALIZED (
        SELECT i.id FROM {{items}} i
        WHERE i.id >= v_low
        ORDER BY i.id
        LIMIT greatest(p_batch, 0)
        FOR UPDATE SKIP LOCKED
    ), taken AS (
        DELETE FROM {{items}} i WHERE i.id = ANY (ARRAY(SELECT p.id FROM picked p))
        RETURNING i.id, i.payload, i.headers, i.enqueued_at
    )
    SELECT t.id, t.payload, t.headers, t.enqueued_at, now() FROM taken t ORDER BY t.id;
END
$fn$;

-- name: set_plan_guard
-- watermark_0004: the dequeue plans without sequential scans and JIT (reset_plan_guard removes
-- exactly these two settings), as reliable_0008 does for the reliable queue (sql/postgresql/reliable.sql,
-- set_plan_guard, says why). A session that cached its generic plan while the items table
-- was empty or held a page (analysed) read the grown table whole at every dequeue until
-- the next ANALYZE: measured at 20,000 rows 900-1,850 shared buffers per dequeue(10)
-- against 52-58 in a new session. A later revision that replaces the function (CREATE OR REPLACE resets
-- its SET clauses) must run this section again.
-- correct_watermark (the scheduler's job, a long-lived session) looks rows up the same way.
ALTER FUNCTION {{fn_dequeue}}(integer) SET enable_seqscan = off SET jit = off;
ALTER FUNCTION {{fn_correct_watermark}}() SET enable_seqscan = off SET jit = off;

-- name: reset_plan_guard
-- watermark_0004 downgrade: the functions plan with the session's settings again.
ALTER FUNCTION {{fn_dequeue}}(integer) RESET enable_seqscan RESET jit;
ALTER FUNCTION {{fn_correct_watermark}}() RESET enable_seqscan RESET jit;

-- name: drop_functions
-- Remove the SQL API.
DROP FUNCTION IF EXISTS {{fn_correct_watermark}}();
DROP FUNCTION IF EXISTS {{fn_dequeue}}(integer);
DROP FUNCTION IF EXISTS {{fn_enqueue_many}}(bytea[], jsonb[]);
DROP FUNCTION IF EXISTS {{fn_enqueue}}(bytea, jsonb);

-- name: drop_tables
-- Remove the queue's tables (and with them their indexes and sequence).
DROP TABLE IF EXISTS {{watermark}};
DROP TABLE IF EXISTS {{items}};

-- name: enqueue
-- Client call: one item.
SELECT {{fn_enqueue}}(:payload, CAST(:headers AS jsonb)) AS id

-- name: enqueue_many
-- Client call: many items in one round trip.
SELECT id FROM {{fn_enqueue_many}}(CAST(:payloads AS bytea[]), CAST(:headers AS jsonb[])) AS id

-- name: dequeue
-- Client call: take (delete and return) up to :batch items.
SELECT * FROM {{fn_dequeue}}(:batch)

-- name: correct_watermark
-- Client call: the 5-minute correction.
SELECT * FROM {{fn_correct_watermark}}()

-- name: stored_watermark
-- The stored hint, for health and tests.
SELECT low, epoch, updated_at, corrected_at FROM {{watermark}}

-- name: counts
-- Depth for `queuectl list`: every row in the table is waiting (dequeued rows are deleted).
SELECT 0 AS status, false AS scheduled, count(*) AS n FROM {{items}}
