-- watermark sections that later revisions replaced on PostgreSQL, each named for the revision that
-- installed it: a queue installed at an older revision runs it, and so does the downgrade
-- that puts the body back. What a fresh install creates today is in ../watermark.sql.

-- name: create_dequeue_0001
-- watermark_0001's dequeue, which joined the picks (put back by watermark_0002's downgrade).

-- dequeue: ONE statement takes up to p_batch items at or above the session's watermark,
-- oldest first, skipping rows other consumers hold. Around it, every 100th call moves
-- the session's watermark (steps 2 and 3 above).
-- Session state, one custom setting 'queuectl.wm<items oid>' = 'low,calls,candidate,xmax,epoch'.
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
        DELETE FROM {{items}} i USING picked WHERE i.id = picked.id
        RETURNING i.id, i.payload, i.headers, i.enqueued_at
    )
    SELECT t.id, t.payload, t.headers, t.enqueued_at, now() FROM taken t ORDER BY t.id;
END
$fn$;

-- name: create_correct_watermark_0001
-- correct_watermark without the isolation check.

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


-- name: create_dequeue_0002
-- The dequeue (watermark_0002 installed it; history/watermark.sql keeps watermark_0001's for its downgrade).

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

