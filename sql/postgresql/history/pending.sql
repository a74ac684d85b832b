-- pending sections that later revisions replaced on PostgreSQL, each named for the revision that
-- installed it: a queue installed at an older revision runs it, and so does the downgrade
-- that puts the body back. What a fresh install creates today is in ../pending.sql.

-- name: create_dequeue_0001
-- pending_0001's dequeue (a section of its own, so that pending_0002 replaces it and its
-- downgrade restores it).

-- dequeue: ONE statement takes up to p_batch due items, earliest due first (then id).
-- The pick is a MATERIALIZED CTE so the planner cannot flatten it into the DELETE.
CREATE OR REPLACE FUNCTION {{fn_dequeue}}(p_batch integer DEFAULT 1)
RETURNS TABLE (
    id bigint, payload bytea, headers jsonb, enqueued_at timestamptz, dequeued_at timestamptz,
    due_at timestamptz
)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH picked AS MATERIALIZED (
        SELECT i.id FROM {{items}} i
        WHERE i.due_at <= now()
        ORDER BY i.due_at, i.id
        LIMIT greatest(p_batch, 0)
        FOR UPDATE SKIP LOCKED
    ), taken AS (
        DELETE FROM {{items}} i USING picked WHERE i.id = picked.id
        RETURNING i.id, i.payload, i.headers, i.enqueued_at, i.due_at
    )
    SELECT t.id, t.payload, t.headers, t.enqueued_at, now(), t.due_at
    FROM taken t ORDER BY t.due_at, t.id;
END
$fn$;

-- name: create_dequeue_0002
-- pending_0002's dequeue: the same rows, deleted through the primary key however
-- many the planner expects the pick to return.

-- dequeue: ONE statement takes up to p_batch due items, earliest due first (then id).
-- The pick is a MATERIALIZED CTE so the planner cannot flatten it into the DELETE.
-- The DELETE finds the picked rows by `id = ANY (ARRAY(...))`: the array is computed once and
-- the planner counts on a handful of ids, so on a table of more than a few pages it goes
-- through the primary key. A join to the picks (pending_0001) is planned from the pick's LIMIT,
-- which a generic plan cannot see: it assumes a tenth of the table and hashes the picks
-- against a sequential scan of the whole table (measured with generic plans: 1,854 buffers
-- per dequeue of 10 at 40,000 rows and 126 at 2,000, against 57 at both this way).
CREATE OR REPLACE FUNCTION {{fn_dequeue}}(p_batch integer DEFAULT 1)
RETURNS TABLE (
    id bigint, payload bytea, headers jsonb, enqueued_at timestamptz, dequeued_at timestamptz,
    due_at timestamptz
)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH picked AS MATERIALIZED (
        SELECT i.id FROM {{items}} i
        WHERE i.due_at <= now()
        ORDER BY i.due_at, i.id
        LIMIT greatest(p_batch, 0)
        FOR UPDATE SKIP LOCKED
    ), taken AS (
        DELETE FROM {{items}} i WHERE i.id = ANY (ARRAY(SELECT p.id FROM picked p))
        RETURNING i.id, i.payload, i.headers, i.enqueued_at, i.due_at
    )
    SELECT t.id, t.payload, t.headers, t.enqueued_at, now(), t.due_at
    FROM taken t ORDER BY t.due_at, t.id;
END
$fn$;

-- name: create_dequeue_0004
-- pending_0004's dequeue: pending_0002's, with the DELETE bounded in every plan. The DELETE
-- also names the picked due times: a plan built for an empty table (a generic plan cached
-- while the queue was drained and analysed, where every index path costs the same) chose
-- to find the picked ids by walking the whole due index and filtering it (measured: 815
-- shared buffers per dequeue(10) at 20,000 rows against 54 in a new session, with
-- enable_seqscan off). With both arrays, either index the planner picks, the primary key
-- or (due_at, id), is searched for the picked values only. Everything else is
-- pending_0002's dequeue, unchanged.
CREATE OR REPLACE FUNCTION {{fn_dequeue}}(p_batch integer DEFAULT 1)
RETURNS TABLE (
    id bigint, payload bytea, headers jsonb, enqueued_at timestamptz, dequeued_at timestamptz,
    due_at timestamptz
)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH picked AS MATERIALIZED (
        SELECT i.id, i.due_at FROM {{items}} i
        WHERE i.due_at <= now()
        ORDER BY i.due_at, i.id
        LIMIT greatest(p_batch, 0)
        FOR UPDATE SKIP LOCKED
    ), taken AS (
        DELETE FROM {{items}} i WHERE i.id = ANY (ARRAY(SELECT p.id FROM picked p))
                                 AND i.due_at = ANY (ARRAY(SELECT p.due_at FROM picked p))
        RETURNING i.id, i.payload, i.headers, i.enqueued_at, i.due_at
    )
    SELECT t.id, t.payload, t.headers, t.enqueued_at, now(), t.due_at
    FROM taken t ORDER BY t.due_at, t.id;
END
$fn$;
