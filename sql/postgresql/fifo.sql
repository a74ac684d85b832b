-- The FIFO queue on PostgreSQL, lax (default) or strict (`install --kind fifo --strict`).
--
-- One table holds id (identity, so enqueue order), payload and headers. Dequeue is one
-- statement: DELETE the first n rows by id that it can lock, RETURNING them.
--
--  * lax: the pick uses FOR UPDATE SKIP LOCKED. Consumers never wait for each other; a
--    consumer whose transaction rolls back puts its rows back at the head after others
--    may already have taken later rows, so items can be processed out of order.
--  * strict: the pick uses plain FOR UPDATE in id order. A consumer waits on the head
--    rows held by another consumer's open transaction: if that transaction commits, the
--    rows are gone and the waiter continues with the next ones; if it rolls back, the
--    waiter gets the very same rows. No item is ever handed out while an earlier one is
--    still held, so items leave in id order even across rollbacks. The price: only one
--    consumer transaction holds the head at a time, so throughput is one batch per
--    (dequeue + processing + commit) time however many consumers run.
--
-- Sections are filled by queuectl.sqlfiles.render() with quoted identifiers only.

-- name: create_tables
-- The queue's one table; its primary key is the dequeue's index.
CREATE TABLE {{items}} (
    id          bigint      GENERATED ALWAYS AS IDENTITY (SEQUENCE NAME {{items_seq}}) PRIMARY KEY,
    payload     bytea       NOT NULL,
    headers     jsonb,
    enqueued_at timestamptz NOT NULL DEFAULT now()
);

-- name: create_functions
-- The SQL API shared by lax and strict FIFO queues (the dequeue is in the next sections).

-- enqueue one item; returns its id.
CREATE FUNCTION {{fn_enqueue}}(p_payload bytea, p_headers jsonb DEFAULT NULL)
RETURNS bigint
LANGUAGE sql AS $fn$
    INSERT INTO {{items}} (payload, headers) VALUES (p_payload, p_headers) RETURNING id
$fn$;

-- enqueue many items in one statement; ids are drawn in array order and returned in it.
CREATE FUNCTION {{fn_enqueue_many}}(p_payloads bytea[], p_headers jsonb[] DEFAULT NULL)
RETURNS SETOF bigint
LANGUAGE sql AS $fn$
    WITH src AS MATERIALIZED (
        SELECT nextval({{items_seq_regclass}}::regclass) AS id, u.payload, u.headers, u.ord
        FROM unnest(p_payloads, p_headers) WITH ORDINALITY AS u(payload, headers, ord)
        WHERE u.ord <= cardinality(p_payloads)
    ), ins AS (
        INSERT INTO {{items}} (id, payload, headers) OVERRIDING SYSTEM VALUE
        SELECT src.id, src.payload, src.headers FROM src
    )
    SELECT src.id FROM src ORDER BY src.ord
$fn$;

-- name: create_dequeue_lax
-- fifo_0002's lax dequeue: the same rows, deleted through the primary key however
-- many the planner expects the pick to return.
-- dequeue: ONE statement takes up to p_batch items. The pick is a MATERIALIZED CTE so the
-- planner cannot flatten it into the DELETE (a flattened plan may delete more rows than the LIMIT).
-- The DELETE finds the picked rows by `id = ANY (ARRAY(...))`: the array is computed once and
-- the planner counts on a handful of ids, so on a table of more than a few pages it goes
-- through the primary key. A join to the picks (fifo_0001) is planned from the pick's LIMIT,
-- which a generic plan cannot see: it assumes a tenth of the table and hashes the picks
-- against a sequential scan of the whole table (measured with generic plans: 1,775 buffers
-- per dequeue of 10 at 40,000 rows and 122 at 2,000, against 57 at both this way).
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
        DELETE FROM {{items}} i WHERE i.id = ANY (ARRAY(SELECT p.id FROM picked p))
        RETURNING i.id, i.payload, i.headers, i.enqueued_at
    )
    SELECT t.id, t.payload, t.headers, t.enqueued_at, now() FROM taken t ORDER BY t.id;
END
$fn$;

-- name: create_dequeue_strict
-- fifo_0002's strict dequeue: the same rows, deleted through the primary key however
-- many the planner expects the pick to return; consumers still wait for rows others hold
-- (no SKIP LOCKED).
-- dequeue: ONE statement takes up to p_batch items. The pick is a MATERIALIZED CTE so the
-- planner cannot flatten it into the DELETE (a flattened plan may delete more rows than the LIMIT).
-- Plain FOR UPDATE in id order: every consumer queues behind the holder of the head rows
-- and locks in the same order, so they cannot deadlock each other. In READ COMMITTED a
-- row deleted by the holder's commit is skipped and the scan goes on to the next rows.
-- The DELETE finds the picked rows by `id = ANY (ARRAY(...))`: the array is computed once and
-- the planner counts on a handful of ids, so on a table of more than a few pages it goes
-- through the primary key. A join to the picks (fifo_0001) is planned from the pick's LIMIT,
-- which a generic plan cannot see: it assumes a tenth of the table and hashes the picks
-- against a sequential scan of the whole table (measured with generic plans: 1,775 buffers
-- per dequeue of 10 at 40,000 rows and 122 at 2,000, against 57 at both this way).
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
        DELETE FROM {{items}} i WHERE i.id = ANY (ARRAY(SELECT p.id FROM picked p))
        RETURNING i.id, i.payload, i.headers, i.enqueued_at
    )
    SELECT t.id, t.payload, t.headers, t.enqueued_at, now() FROM taken t ORDER BY t.id;
END
$fn$;

-- name: set_plan_guard
-- fifo_0004: the dequeue plans without sequential scans and JIT (reset_plan_guard removes
-- exactly these two settings), as reliable_0008 does for the reliable queue (sql/postgresql/reliable.sql,
-- set_plan_guard, says why). A session that cached its generic plan while the items table
-- was empty or held a page (analysed) read the grown table whole at every dequeue until
-- the next ANALYZE: measured at 20,000 rows 900-1,850 shared buffers per dequeue(10)
-- against 52-58 in a new session. A later revision that replaces the function (CREATE OR REPLACE resets
-- its SET clauses) must run this section again.
ALTER FUNCTION {{fn_dequeue}}(integer) SET enable_seqscan = off SET jit = off;

-- name: reset_plan_guard
-- fifo_0004 downgrade: the dequeue plans with the session's settings again.
ALTER FUNCTION {{fn_dequeue}}(integer) RESET enable_seqscan RESET jit;

-- name: drop_functions
-- Remove the SQL API.
DROP FUNCTION IF EXISTS {{fn_dequeue}}(integer);
DROP FUNCTION IF EXISTS {{fn_enqueue_many}}(bytea[], jsonb[]);
DROP FUNCTION IF EXISTS {{fn_enqueue}}(bytea, jsonb);

-- name: drop_tables
-- Remove the queue's table (and with it its index and sequence).
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

-- name: counts
-- Depth for `queuectl list`: every row in the table is waiting (dequeued rows are deleted).
SELECT 0 AS status, false AS scheduled, count(*) AS n FROM {{items}}
