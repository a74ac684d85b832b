-- fifo sections that later revisions replaced on PostgreSQL, each named for the revision that
-- installed it: a queue installed at an older revision runs it, and so does the downgrade
-- that puts the body back. What a fresh install creates today is in ../fifo.sql.

-- name: create_dequeue_lax_0001
-- The lax dequeue: oldest first, skipping rows other consumers hold (fifo_0001's; fifo_0002
-- replaces it and its downgrade restores it).
-- dequeue: ONE statement takes up to p_batch items. The pick is a MATERIALIZED CTE so the
-- planner cannot flatten it into the DELETE (a flattened plan may delete more rows than the LIMIT).
CREATE OR REPLACE FUNCTION {{fn_dequeue}}(p_batch integer DEFAULT 1)
RETURNS TABLE (id bigint, payload bytea, headers jsonb, enqueued_at timestamptz, dequeued_at timestamptz)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH picked AS MATERIALIZED (
        SELECT i.id FROM {{items}} i
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

-- name: create_dequeue_strict_0001
-- The strict dequeue: oldest first, waiting for rows other consumers hold (no SKIP LOCKED)
-- (fifo_0001's; fifo_0002 replaces it and its downgrade restores it).
-- dequeue: ONE statement takes up to p_batch items. The pick is a MATERIALIZED CTE so the
-- planner cannot flatten it into the DELETE (a flattened plan may delete more rows than the LIMIT).
-- Plain FOR UPDATE in id order: every consumer queues behind the holder of the head rows
-- and locks in the same order, so they cannot deadlock each other. In READ COMMITTED a
-- row deleted by the holder's commit is skipped and the scan goes on to the next rows.
CREATE OR REPLACE FUNCTION {{fn_dequeue}}(p_batch integer DEFAULT 1)
RETURNS TABLE (id bigint, payload bytea, headers jsonb, enqueued_at timestamptz, dequeued_at timestamptz)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH picked AS MATERIALIZED (
        SELECT i.id FROM {{items}} i
        ORDER BY i.id
        LIMIT greatest(p_batch, 0)
        FOR UPDATE
    ), taken AS (
        DELETE FROM {{items}} i USING picked WHERE i.id = picked.id
        RETURNING i.id, i.payload, i.headers, i.enqueued_at
    )
    SELECT t.id, t.payload, t.headers, t.enqueued_at, now() FROM taken t ORDER BY t.id;
END
$fn$;
