-- The reliable status queue on PostgreSQL.
--
-- Layout: <queue>_meta holds only what dequeue searches and updates (small rows, so a
-- dequeue touches few pages); <queue>_data holds the payload, written once at enqueue and
-- read once at dequeue; <queue>_history receives finished rows from the archive job.
--
-- status codes (smallint, so the ready index stays narrow):
--   0 READY       waiting; "scheduled" while due_at > now()
--   1 PROCESSING  leased to lease_owner until leased_until
--   2 DONE        acknowledged (finished_at set); the archive job moves it to history
--   3 DEAD        failed max_attempts times (last_error says why)
--
-- Sections are filled by queuectl.sqlfiles.render() with quoted identifiers only.

-- name: create_tables
-- The queue's tables and indexes.
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

-- name: create_functions
-- The SQL API, callable from any language (reliable_0009's): ack, nack, extend_lease and
-- release reach their rows through the primary key only, whatever the table's statistics. Each finds its items by `m.id = ANY (p_ids)`
-- and checks that they are still leased. Written `m.status = 1`, that check implies the
-- leased index's predicate (WHERE status = 1), so the planner may read that index too, and
-- the generic plan plpgsql keeps after five calls can (the benchmarks caught both forms):
--  * on a table not analysed since it was created or truncated, a BitmapAnd of the whole
--    leased index with the primary-key lookup;
--  * once analysed, an index scan of the whole leased index, filtered by id.
-- Either way every call reads every entry of the leased index: one per item leased now
-- (all consumers' batches, slow handlers' items) plus the dead entries of items leased
-- before, until a vacuum removes them. The cost of an ack grows with the number of items
-- in flight instead of with its own batch.
-- Written `m.status::integer = 1`, the check is the same test (status is a smallint) but
-- no longer matches the index predicate, so the primary key is the only index path left
-- (sequential scans are off in these functions, set_plan_guard) and the status is checked
-- on the rows it returns.
-- Measured (the lab's ack-plan probe):
--  * one ack(1), the table analysed while 20 items were leased, then 10,000 leased:
--    reliable_0008 1,032 blocks and 1,770 us per ack (it fetched every leased row to test
--    its id), this revision 10.1 blocks and 395 us; at 1,000 leased 109 against 10.1;
--  * the SQL full cycle under pgbench, 8 clients, both revisions alternating, medians of 5
--    rounds, at batch 1 / 10 / 100: autovacuum off (truncated, never analysed) 1.51x /
--    2.49x / 1.35x reliable_0008; autovacuum on 1.28x / 0.98x / 1.01x (level, or up to 9%
--    behind, in the rounds where reliable_0008's plan happened to be good).
-- tests/test_lease_plan.py checks that none of the four scans the leased index.
-- Nothing else changes; the downgrade runs create_functions again. Both re-run
-- set_plan_guard after (CREATE OR REPLACE resets a function's SET clauses).
CREATE OR REPLACE FUNCTION {{fn_ack}}(p_ids bigint[], p_worker text DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql AS $fn$
DECLARE
    v_count integer;
BEGIN
    UPDATE {{meta}} m
    SET status = 2, finished_at = now(), leased_until = NULL
    WHERE m.id = ANY (p_ids) AND m.status::integer = 1
      AND (p_worker IS NULL OR m.lease_owner = p_worker);
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
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
BEGIN
    RETURN QUERY
    UPDATE {{meta}} m SET
        status       = CASE WHEN m.attempts >= m.max_attempts THEN 3 ELSE 0 END,
        due_at       = CASE WHEN m.attempts >= m.max_attempts THEN m.due_at
                            ELSE now() + make_interval(secs => least(
                                coalesce(p_base_seconds, {{backoff_base_seconds}})
                                    * power(2, least(greatest(m.attempts - 1, 0), 40)),
                                coalesce(p_max_seconds, {{backoff_max_seconds}}))) END,
        finished_at  = CASE WHEN m.attempts >= m.max_attempts THEN now() END,
        leased_until = NULL,
        last_error   = p_error
    WHERE m.id = ANY (p_ids) AND m.status::integer = 1
      AND (p_worker IS NULL OR m.lease_owner = p_worker)
    RETURNING m.id, m.status, m.due_at;
END
$fn$;

CREATE OR REPLACE FUNCTION {{fn_extend_lease}}(
    p_ids           bigint[],
    p_lease_seconds double precision DEFAULT {{lease_seconds}},
    p_worker        text             DEFAULT NULL
) RETURNS TABLE (id bigint, leased_until timestamptz)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    UPDATE {{meta}} m
    SET leased_until = now() + make_interval(secs => coalesce(p_lease_seconds, {{lease_seconds}}))
    WHERE m.id = ANY (p_ids) AND m.status::integer = 1
      AND (p_worker IS NULL OR m.lease_owner = p_worker)
    RETURNING m.id, m.leased_until;
END
$fn$;

CREATE OR REPLACE FUNCTION {{fn_release}}(p_ids bigint[], p_worker text DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql AS $fn$
DECLARE
    v_count integer;
BEGIN
    UPDATE {{meta}} m
    SET status = 0, attempts = greatest(m.attempts - 1, 0), leased_until = NULL, lease_owner = NULL
    WHERE m.id = ANY (p_ids) AND m.status::integer = 1
      AND (p_worker IS NULL OR m.lease_owner = p_worker);
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END
$fn$;

-- name: create_dequeue
-- reliable_0008's dequeue: reliable_0005's, with the payloads read by the claimed ids as an
-- array (a MATERIALIZED CTE joined to the claimed rows in memory) instead of a join to the
-- data table. A plan built for an empty data table (a generic plan cached while the queue
-- was drained and analysed, where every path costs the same) joined by walking the data
-- table's primary key from its start and filtering it, once per claimed row; the array
-- search reads the claimed ids' index entries only, whichever plan it gets. Measured in
-- a session that cached its plans on an empty, analysed queue, then grew it (section
-- set_plan_guard has the figures). Everything else is
-- reliable_0005's dequeue, unchanged.
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
BEGIN
    RETURN QUERY
    WITH expired AS MATERIALIZED (
        SELECT m.id FROM {{meta}} m
        WHERE m.status = 1 AND m.leased_until < now()
        ORDER BY m.leased_until
        LIMIT greatest(p_batch, 0)
        FOR UPDATE SKIP LOCKED
    ), ready AS MATERIALIZED (
        SELECT m.id FROM {{meta}} m
        WHERE m.status = 0 AND m.due_at <= now()
        ORDER BY m.priority, m.due_at, m.id
        LIMIT greatest(p_batch - (SELECT count(*) FROM expired), 0)
        FOR UPDATE SKIP LOCKED
    ), claimed AS (
        UPDATE {{meta}} m SET
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
        SELECT d.id, d.payload, d.headers FROM {{data}} d
        WHERE d.id = ANY (ARRAY(SELECT c.id FROM claimed c WHERE c.status = 1))
    )
    SELECT c.id, c.priority, c.due_at, c.title, c.attempts, c.max_attempts, c.enqueued_at,
           c.dequeued_at, c.leased_until, p.payload, p.headers
    FROM claimed c JOIN payloads p ON p.id = c.id
    WHERE c.status = 1
    ORDER BY c.priority, c.due_at, c.id;
END
$fn$;

-- name: create_enqueue_functions
-- reliable_0010: the limit covers everything one message stores. enqueue and enqueue_many
-- refuse a message whose payload, title and headers together are over the queue's
-- max_payload_bytes, counted as stored: octet_length of the payload, of the title's UTF-8
-- and of the headers as the server writes jsonb out (the text headers::text gives). A
-- payload-only check let a queue limited to 100 bytes store a 5 MB title and 5 MB of
-- headers. SQLSTATE QC413 as before (the client raises PayloadTooLarge), with the three
-- sizes in the message; the check runs before any insert, so a refused call stores nothing,
-- with enqueue_many not even the messages within the limit. The signatures are reliable_0001's,
-- so grants and callers are untouched; the downgrade puts back
-- history/reliable.sql: create_enqueue_functions_0003.

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
BEGIN
    IF v_payload + v_title + v_headers > {{max_payload_bytes}} THEN
        RAISE EXCEPTION USING ERRCODE = 'QC413', MESSAGE = format(
            'queue %L: message of %s bytes (payload %s + title %s + headers %s) is over max_payload_bytes %s: nothing was enqueued',
            {{queue_literal}}, v_payload + v_title + v_headers, v_payload, v_title, v_headers, {{max_payload_bytes}});
    END IF;
    WITH m AS (
        INSERT INTO {{meta}} (priority, due_at, title, max_attempts)
        VALUES (coalesce(p_priority, 0), now() + coalesce(p_delay, interval '0'), p_title,
                coalesce(p_max_attempts, {{max_attempts}}))
        RETURNING id
    )
    INSERT INTO {{data}} (id, payload, headers)
    SELECT m.id, p_payload, p_headers FROM m
    RETURNING id INTO v_id;
    RETURN v_id;
END
$fn$;

-- enqueue many items in one statement; ids come back in the order of the arrays.
-- Shorter optional arrays are padded with NULL (defaults); ids are drawn from the
-- identity sequence first so each payload is paired with its own id.
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
    RETURN QUERY
    WITH src AS MATERIALIZED (
        SELECT nextval({{meta_seq_regclass}}::regclass) AS id, u.payload, u.headers,
               u.priority, u.delay, u.title, u.ord
        FROM unnest(p_payloads, p_headers, p_priorities, p_delays, p_titles)
             WITH ORDINALITY AS u(payload, headers, priority, delay, title, ord)
        WHERE u.ord <= cardinality(p_payloads)
    ), m AS (
        INSERT INTO {{meta}} (id, priority, due_at, title, max_attempts)
        OVERRIDING SYSTEM VALUE
        SELECT src.id, coalesce(src.priority, 0), now() + coalesce(src.delay, interval '0'),
               src.title, coalesce(p_max_attempts, {{max_attempts}})
        FROM src
    ), d AS (
        INSERT INTO {{data}} (id, payload, headers)
        SELECT src.id, src.payload, src.headers FROM src
    )
    SELECT src.id FROM src ORDER BY src.ord;
END
$fn$;

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
