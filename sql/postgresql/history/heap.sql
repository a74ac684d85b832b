-- heap sections that later revisions replaced on PostgreSQL, each named for the revision that
-- installed it: a queue installed at an older revision runs it, and so does the downgrade
-- that puts the body back. What a fresh install creates today is in ../heap.sql.

-- name: create_dequeue_0001
-- heap_0001's dequeue, which joined the picks (put back by heap_0002's downgrade).

-- dequeue: ONE statement takes up to p_batch items. The pick is a MATERIALIZED CTE so the
-- planner cannot flatten it into the DELETE (a flattened plan may delete more rows than the LIMIT).
-- No ORDER BY: any unlocked rows will do, so the scan stops at the first ones it can lock.
CREATE OR REPLACE FUNCTION {{fn_dequeue}}(p_batch integer DEFAULT 1)
RETURNS TABLE (id bigint, payload bytea, headers jsonb, enqueued_at timestamptz, dequeued_at timestamptz)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH picked AS MATERIALIZED (
        SELECT i.id FROM {{items}} i
        LIMIT greatest(p_batch, 0)
        FOR UPDATE SKIP LOCKED
    ), taken AS (
        DELETE FROM {{items}} i USING picked WHERE i.id = picked.id
        RETURNING i.id, i.payload, i.headers, i.enqueued_at
    )
    SELECT t.id, t.payload, t.headers, t.enqueued_at, now() FROM taken t;
END
$fn$;
