-- The stack (LIFO) queue on PostgreSQL.
--
-- One table holds id (identity, so enqueue order), payload and headers. Dequeue is one
-- statement: DELETE the newest n rows it can lock (ORDER BY id DESC, FOR UPDATE SKIP
-- LOCKED), RETURNING them newest first.
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
-- The SQL API, callable from any language.

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

-- name: create_dequeue
-- The dequeue (stack_0002 installed it; history/stack.sql keeps stack_0001's for its downgrade).

-- dequeue: ONE statement takes up to p_batch items. The pick is a MATERIALIZED CTE so the
-- planner cannot flatten it into the DELETE (a flattened plan may delete more rows than the LIMIT).
-- Newest first: a backward scan of the primary key, skipping rows other consumers hold.
-- The DELETE finds the picked rows by `id = ANY (ARRAY(...))`: the array is computed once and
-- the planner counts on a handful of ids, so on a table of more than a few pages it goes
-- through the primary key. A join to the picks (stack_0001) is planned from the pick's LIMIT,
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
        ORDER BY i.id DESC
        LIMIT greatest(p_batch, 0)
        FOR UPDATE SKIP LOCKED
    ), taken AS (
        DELETE FROM {{items}} i WHERE i.id = ANY (ARRAY(SELECT p.id FROM picked p))
        RETURNING i.id, i.payload, i.headers, i.enqueued_at
    )
    SELECT t.id, t.payload, t.headers, t.enqueued_at, now() FROM taken t ORDER BY t.id DESC;
END
$fn$;

-- name: set_plan_guard
-- stack_0004: the dequeue plans without sequential scans and JIT (reset_plan_guard removes
-- exactly these two settings), as reliable_0008 does for the reliable queue (sql/postgresql/reliable.sql,
-- set_plan_guard, says why). A session that cached its generic plan while the items table
-- was empty or held a page (analysed) read the grown table whole at every dequeue until
-- the next ANALYZE: measured at 20,000 rows 900-1,850 shared buffers per dequeue(10)
-- against 52-58 in a new session. A later revision that replaces the function (CREATE OR REPLACE resets
-- its SET clauses) must run this section again.
ALTER FUNCTION {{fn_dequeue}}(integer) SET enable_seqscan = off SET jit = off;

-- name: reset_plan_guard
-- stack_0004 downgrade: the dequeue plans with the session's settings again.
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
