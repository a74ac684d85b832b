-- The pending queue on PostgreSQL: items become ready at their due time (UTC).
--
-- One table holds id, due_at, payload and headers, with an index on (due_at, id).
-- Dequeue is one statement: DELETE the earliest-due n rows whose due_at <= now() that it
-- can lock (FOR UPDATE SKIP LOCKED), RETURNING them earliest first. An item is never
-- returned before its due time; due times are compared on the server's clock.
--
-- Sections are filled by queuectl.sqlfiles.render() with quoted identifiers only.

-- name: create_tables
-- The queue's table and its due-time index (the dequeue reads it from its low end).
CREATE TABLE {{items}} (
    id          bigint      GENERATED ALWAYS AS IDENTITY (SEQUENCE NAME {{items_seq}}) PRIMARY KEY,
    due_at      timestamptz NOT NULL DEFAULT now(),
    payload     bytea       NOT NULL,
    headers     jsonb,
    enqueued_at timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX {{due_idx}} ON {{items}} (due_at, id);

-- name: create_functions
-- The SQL API, callable from any language.

-- enqueue one item, due at p_due_at, else now() + p_delay, else now(); returns its id.
CREATE FUNCTION {{fn_enqueue}}(
    p_payload bytea,
    p_headers jsonb       DEFAULT NULL,
    p_due_at  timestamptz DEFAULT NULL,
    p_delay   interval    DEFAULT NULL
) RETURNS bigint
LANGUAGE sql AS $fn$
    INSERT INTO {{items}} (due_at, payload, headers)
    VALUES (coalesce(p_due_at, now() + coalesce(p_delay, interval '0')), p_payload, p_headers)
    RETURNING id
$fn$;

-- enqueue many items in one statement; ids come back in the order of the arrays. A
-- shorter (or NULL) due_at / delay array leaves the missing items due now.
CREATE FUNCTION {{fn_enqueue_many}}(
    p_payloads bytea[],
    p_headers  jsonb[]       DEFAULT NULL,
    p_due_ats  timestamptz[] DEFAULT NULL,
    p_delays   interval[]    DEFAULT NULL
) RETURNS SETOF bigint
LANGUAGE sql AS $fn$
    WITH src AS MATERIALIZED (
        SELECT nextval({{items_seq_regclass}}::regclass) AS id, u.payload, u.headers,
               coalesce(u.due_at, now() + coalesce(u.delay, interval '0')) AS due_at, u.ord
        FROM unnest(p_payloads, p_headers, p_due_ats, p_delays)
             WITH ORDINALITY AS u(payload, headers, due_at, delay, ord)
        WHERE u.ord <= cardinality(p_payloads)
    ), ins AS (
        INSERT INTO {{items}} (id, due_at, payload, headers) OVERRIDING SYSTEM VALUE
        SELECT src.id, src.due_at, src.payload, src.headers FROM src
    )
    SELECT src.id FROM src ORDER BY src.ord
$fn$;

-- name: create_dequeue
-- pending_0005's dequeue: pending_0004's, with the DELETE finding the picked rows by their
-- row addresses (ctid), the pick's own. pending_0004's DELETE named the picked ids and due
-- times so that either index was searched for the picked values only; but a plan made for
-- an empty table (a session that planned after the compact job's TRUNCATE, or on a new
-- queue) ANDed two bitmap scans, one of the primary key by the picked ids and one of the due
-- index by the picked due times (`due_at = ANY`, the index's first column only), and the
-- rows of one enqueueing transaction share one due time (now()): that scan read every entry
-- of the burst (20,000 index rows for 10 picks). Measured: 132 shared buffers per
-- dequeue(10) after 20,000 rows enqueued in one call and 364 after 80,000, against 54 in a
-- new session; by row address 43 in both. A TID scan reads the picked rows' pages only,
-- whatever the planner counts, and no index path competes with it (no index condition is
-- left); a picked row stays at its address until this DELETE, as the pick locked it (FOR
-- UPDATE) and nothing updates an item. Everything else is pending_0004's dequeue, unchanged.
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
        SELECT i.ctid AS row_address FROM {{items}} i
        WHERE i.due_at <= now()
        ORDER BY i.due_at, i.id
        LIMIT greatest(p_batch, 0)
        FOR UPDATE SKIP LOCKED
    ), taken AS (
        DELETE FROM {{items}} i WHERE i.ctid = ANY (ARRAY(SELECT p.row_address FROM picked p))
        RETURNING i.id, i.payload, i.headers, i.enqueued_at, i.due_at
    )
    SELECT t.id, t.payload, t.headers, t.enqueued_at, now(), t.due_at
    FROM taken t ORDER BY t.due_at, t.id;
END
$fn$;

-- name: set_plan_guard
-- pending_0004: the dequeue plans without sequential scans and JIT (reset_plan_guard removes
-- exactly these two settings), as reliable_0008 does for the reliable queue (sql/postgresql/reliable.sql,
-- set_plan_guard, says why). A session that cached its generic plan while the items table
-- was empty or held a page (analysed) read the grown table whole at every dequeue until
-- the next ANALYZE: measured at 20,000 rows 900-1,850 shared buffers per dequeue(10)
-- against 52-58 in a new session. A later revision that replaces the function (CREATE OR REPLACE resets
-- its SET clauses) must run this section again.
ALTER FUNCTION {{fn_dequeue}}(integer) SET enable_seqscan = off SET jit = off;

-- name: reset_plan_guard
-- pending_0004 downgrade: the dequeue plans with the session's settings again.
ALTER FUNCTION {{fn_dequeue}}(integer) RESET enable_seqscan RESET jit;

-- name: drop_functions
-- Remove the SQL API.
DROP FUNCTION IF EXISTS {{fn_dequeue}}(integer);
DROP FUNCTION IF EXISTS {{fn_enqueue_many}}(bytea[], jsonb[], timestamptz[], interval[]);
DROP FUNCTION IF EXISTS {{fn_enqueue}}(bytea, jsonb, timestamptz, interval);

-- name: drop_tables
-- Remove the queue's table (and with it its indexes and sequence).
DROP TABLE IF EXISTS {{items}};

-- name: enqueue
-- Client call: one item.
SELECT {{fn_enqueue}}(:payload, CAST(:headers AS jsonb), CAST(:due_at AS timestamptz),
                      make_interval(secs => :delay)) AS id

-- name: enqueue_many
-- Client call: many items in one round trip.
SELECT id FROM {{fn_enqueue_many}}(CAST(:payloads AS bytea[]), CAST(:headers AS jsonb[]),
                                   CAST(:due_ats AS timestamptz[]), CAST(:delays AS interval[])) AS id

-- name: dequeue
-- Client call: take (delete and return) up to :batch due items.
SELECT * FROM {{fn_dequeue}}(:batch)

-- name: counts
-- Depth for `queuectl list`: items not yet due count as scheduled.
SELECT 0 AS status, (due_at > now()) AS scheduled, count(*) AS n FROM {{items}} GROUP BY 1, 2
