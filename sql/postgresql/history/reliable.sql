-- Reliable queue sections that later revisions replaced on PostgreSQL, each named for the revision that
-- installed it: a queue installed at an older revision runs it, and so does the downgrade
-- that puts the body back. What a fresh install creates today is in ../reliable.sql.

-- name: create_functions_0001
-- reliable_0001's ack, nack, extend_lease and release, whose lease check the generic plan
-- could answer from the whole leased index (reliable_0009's downgrade puts them back).

-- ack: the items are done. Only the current lease holder (when p_worker is given) may
-- ack, so a consumer whose lease expired and was taken over cannot finish the item twice.
CREATE OR REPLACE FUNCTION {{fn_ack}}(p_ids bigint[], p_worker text DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql AS $fn$
DECLARE
    v_count integer;
BEGIN
    UPDATE {{meta}} m
    SET status = 2, finished_at = now(), leased_until = NULL
    WHERE m.id = ANY (p_ids) AND m.status = 1
      AND (p_worker IS NULL OR m.lease_owner = p_worker);
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END
$fn$;

-- nack: the attempt failed. The item is READY again after an exponential backoff
-- (p_base_seconds * 2^(attempts-1), at most p_max_seconds), or DEAD when its attempts
-- are used up. Returns each item's new status.
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
    WHERE m.id = ANY (p_ids) AND m.status = 1
      AND (p_worker IS NULL OR m.lease_owner = p_worker)
    RETURNING m.id, m.status, m.due_at;
END
$fn$;

-- extend_lease: a slow handler keeps its items (heartbeat). Returns the items still held.
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
    WHERE m.id = ANY (p_ids) AND m.status = 1
      AND (p_worker IS NULL OR m.lease_owner = p_worker)
    RETURNING m.id, m.leased_until;
END
$fn$;

-- release: give items back untouched (a consumer shutting down), without using up an attempt.
CREATE OR REPLACE FUNCTION {{fn_release}}(p_ids bigint[], p_worker text DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql AS $fn$
DECLARE
    v_count integer;
BEGIN
    UPDATE {{meta}} m
    SET status = 0, attempts = greatest(m.attempts - 1, 0), leased_until = NULL, lease_owner = NULL
    WHERE m.id = ANY (p_ids) AND m.status = 1
      AND (p_worker IS NULL OR m.lease_owner = p_worker);
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END
$fn$;

-- name: create_dequeue_0001
-- reliable_0001's dequeue (a section of its own, so that reliable_0005 replaces it and its
-- downgrade restores it).

-- dequeue: ONE statement claims up to p_batch items and returns them with their payload.
--  * expired leases are reclaimed first (their consumer died or stalled); one whose
--    attempts are used up goes DEAD instead of running again;
--  * then READY rows that are due, in (priority, due_at, id) order;
--  * both picks are MATERIALIZED CTEs with FOR UPDATE SKIP LOCKED: concurrent consumers
--    skip each other's rows, and the planner cannot flatten the pick into the UPDATE
--    (a flattened plan may update more rows than the LIMIT, as Oban found).
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
        FROM (SELECT e.id FROM expired e UNION ALL SELECT r.id FROM ready r) picked
        WHERE m.id = picked.id
        RETURNING m.id, m.priority, m.due_at, m.title, m.attempts, m.max_attempts,
                  m.enqueued_at, m.dequeued_at, m.leased_until, m.status
    )
    SELECT c.id, c.priority, c.due_at, c.title, c.attempts, c.max_attempts, c.enqueued_at,
           c.dequeued_at, c.leased_until, d.payload, d.headers
    FROM claimed c JOIN {{data}} d ON d.id = c.id
    WHERE c.status = 1
    ORDER BY c.priority, c.due_at, c.id;
END
$fn$;

-- name: create_dequeue_0005
-- reliable_0005's dequeue: the same claim, with the picked rows found through the primary key
-- whatever the table's statistics say.

-- dequeue: ONE statement claims up to p_batch items and returns them with their payload.
--  * expired leases are reclaimed first (their consumer died or stalled); one whose
--    attempts are used up goes DEAD instead of running again;
--  * then READY rows that are due, in (priority, due_at, id) order;
--  * both picks are MATERIALIZED CTEs with FOR UPDATE SKIP LOCKED: concurrent consumers
--    skip each other's rows, and the planner cannot flatten the pick into the UPDATE
--    (a flattened plan may update more rows than the LIMIT, as Oban found);
--  * the UPDATE finds the picked rows by `id = ANY (ARRAY(...))`: the array is computed
--    once and the planner counts on a handful of ids, so it goes through the primary key.
--    A join to the picks (reliable_0001) is planned from the ready pick's LIMIT, whose
--    subquery it cannot estimate: it assumes a tenth of the table, and once the table has
--    statistics it hashes the picks against a sequential scan of the whole meta table
--    (measured: 376 buffers and 4.0 ms per dequeue of 10 at 20,000 rows, against 155 and
--    0.14 ms this way), a cost that grows with every row not archived yet.
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
    )
    SELECT c.id, c.priority, c.due_at, c.title, c.attempts, c.max_attempts, c.enqueued_at,
           c.dequeued_at, c.leased_until, d.payload, d.headers
    FROM claimed c JOIN {{data}} d ON d.id = c.id
    WHERE c.status = 1
    ORDER BY c.priority, c.due_at, c.id;
END
$fn$;

-- name: create_enqueue_functions_0001
-- enqueue and enqueue_many as reliable_0001 made them (no payload limit): created by
-- reliable_0001 and put back by the downgrade of reliable_0003.

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
BEGIN
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
BEGIN
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

-- name: create_enqueue_functions_0003
-- reliable_0003: enqueue and enqueue_many refuse a payload larger than the queue's
-- max_payload_bytes with SQLSTATE QC413 (the client raises PayloadTooLarge). The check
-- runs before any insert, and the error aborts the statement, so a refused call stores
-- nothing: with enqueue_many, not even the payloads within the limit.

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
BEGIN
    IF octet_length(p_payload) > {{max_payload_bytes}} THEN
        RAISE EXCEPTION USING ERRCODE = 'QC413', MESSAGE = format(
            'queue %L: payload of %s bytes is over max_payload_bytes %s: nothing was enqueued',
            {{queue_literal}}, octet_length(p_payload), {{max_payload_bytes}});
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
    v_bytes integer;
BEGIN
    -- the first payload over the limit refuses the whole call, before anything is written
    SELECT u.ord, octet_length(u.payload) INTO v_ord, v_bytes
    FROM unnest(p_payloads) WITH ORDINALITY AS u(payload, ord)
    WHERE octet_length(u.payload) > {{max_payload_bytes}}
    ORDER BY u.ord
    LIMIT 1;
    IF v_ord IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'QC413', MESSAGE = format(
            'queue %L: payload %s of %s is %s bytes, over max_payload_bytes %s: nothing was enqueued',
            {{queue_literal}}, v_ord, cardinality(p_payloads), v_bytes, {{max_payload_bytes}});
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

-- name: create_functions_0009
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

-- name: create_dequeue_0008
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

-- name: create_enqueue_functions_0010
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

-- name: create_functions_0012
-- The SQL API, callable from any language, on the generation layout (reliable_0012's:
-- extend_lease, nack and release run on the partitioned parents; reliable_0013 runs them on
-- the current slot's tables first). ack and extend_lease update in place, by id, in
-- whichever slot the row is (reliable_0009's bodies: the primary keys only,
-- `m.status::integer = 1` so the leased index's predicate is not matched; set_plan_guard
-- has the figures). nack and release give a row back to the
-- claims: it moves, with its id, priority and payload, to the current epoch (header, 1 and
-- 2); nack's last attempt makes it DEAD in place.
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
BEGIN
    IF current_setting('transaction_isolation') IN ('repeatable read', 'serializable') THEN
        RAISE EXCEPTION USING ERRCODE = 'QC400', MESSAGE = format(
            'queue %L: extend_lease runs in READ COMMITTED transactions only (this one is %s): an older snapshot does not see rows the rotation moved',
            {{queue_literal}}, current_setting('transaction_isolation'));
    END IF;
    RETURN QUERY
    UPDATE {{meta}} m
    SET leased_until = now() + make_interval(secs => coalesce(p_lease_seconds, {{lease_seconds}}))
    WHERE m.id = ANY (p_ids) AND m.status::integer = 1
      AND (p_worker IS NULL OR m.lease_owner = p_worker)
    RETURNING m.id, m.leased_until;
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
BEGIN
    IF current_setting('transaction_isolation') IN ('repeatable read', 'serializable') THEN
        RAISE EXCEPTION USING ERRCODE = 'QC400', MESSAGE = format(
            'queue %L: nack runs in READ COMMITTED transactions only (this one is %s): an older snapshot does not see rows the rotation moved',
            {{queue_literal}}, current_setting('transaction_isolation'));
    END IF;
    RETURN QUERY
    WITH dead AS (
        UPDATE {{meta}} m
        SET status = 3, finished_at = now(), leased_until = NULL, last_error = p_error
        WHERE m.id = ANY (p_ids) AND m.status::integer = 1
          AND (p_worker IS NULL OR m.lease_owner = p_worker) AND m.attempts >= m.max_attempts
        RETURNING m.id, m.status, m.due_at
    ), gone AS (
        DELETE FROM {{meta}} m
        WHERE m.id = ANY (p_ids) AND m.status::integer = 1
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
    PERFORM {{fn_rot_follow}}(p_ids, v_epoch);
END
$fn$;

CREATE OR REPLACE FUNCTION {{fn_release}}(p_ids bigint[], p_worker text DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql AS $fn$
DECLARE
    v_epoch bigint := (SELECT last_value FROM {{rot_epoch}});
    v_count integer;
BEGIN
    IF current_setting('transaction_isolation') IN ('repeatable read', 'serializable') THEN
        RAISE EXCEPTION USING ERRCODE = 'QC400', MESSAGE = format(
            'queue %L: release runs in READ COMMITTED transactions only (this one is %s): an older snapshot does not see rows the rotation moved',
            {{queue_literal}}, current_setting('transaction_isolation'));
    END IF;
    WITH gone AS (
        DELETE FROM {{meta}} m
        WHERE m.id = ANY (p_ids) AND m.status::integer = 1
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
    SELECT count(*) INTO v_count FROM back;
    PERFORM {{fn_rot_follow}}(p_ids, v_epoch);
    RETURN v_count;
END
$fn$;

-- name: create_rot_copy_0012
-- reliable_0012's copy of a generation's finished rows to history: the INSERT takes the
-- join's order, which two rotators may not share (reliable_0014's downgrade puts it back).

-- Copy finished rows of slot p_slot, with their payloads, to history: those with an id above
-- p_after, at most p_batch of them (NULL: all), in id order, so the archive job copies a
-- large generation in short transactions (a queue migrated with millions of rows in slot 0).
-- Returns how many were copied and the last id looked at (the next call's p_after).
CREATE OR REPLACE FUNCTION {{fn_rot_copy}}(p_slot smallint, p_after bigint, p_batch integer,
                                         OUT copied bigint, OUT last_id bigint)
LANGUAGE plpgsql AS $fn$
BEGIN
    WITH picked AS MATERIALIZED (
        SELECT m.id, m.priority, m.due_at, m.status, m.title, m.attempts, m.max_attempts, m.lease_owner,
               m.enqueued_at, m.dequeued_at, m.finished_at, m.last_error
        FROM {{meta}} m
        WHERE m.slot = p_slot AND m.id > p_after AND m.status >= 2
        ORDER BY m.id
        LIMIT p_batch
    ), copied AS (
        INSERT INTO {{history}} (id, priority, due_at, status, title, attempts, max_attempts, lease_owner,
                                 enqueued_at, dequeued_at, finished_at, last_error, payload, headers, archived_at)
        SELECT p.id, p.priority, p.due_at, p.status, p.title, p.attempts, p.max_attempts, p.lease_owner,
               p.enqueued_at, p.dequeued_at, p.finished_at, p.last_error, d.payload, d.headers, now()
        FROM picked p LEFT JOIN {{data}} d ON d.id = p.id AND d.slot = p_slot
        ON CONFLICT (id) DO NOTHING
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM copied), (SELECT max(p.id) FROM picked p) INTO copied, last_id;
END
$fn$;

-- name: create_dequeue_0012
-- reliable_0012's claim on the generation layout (reliable_0015's downgrade puts it back). A
-- claim that found the current slot short of a batch looked in every slot (on the parents'
-- tables) while an older epoch was sealed but not yet emptied, for the expired leases there:
-- in that window, one or two of every pass of the archive job, such claims locked every
-- slot's tables and waited behind the truncate's lock.
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
        -- short of a batch: done if every other slot is emptied and no switch came meanwhile
        IF (SELECT last_value FROM {{rot_emptied}}) >= v_epoch - 1
           AND (SELECT last_value FROM {{rot_epoch}}) = v_epoch THEN
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

-- name: create_rot_copy_0014
-- reliable_0014's copy of a generation's finished rows to history, in id order
-- (reliable_0015's downgrade puts it back): it joined every finished row of the slot to its
-- payload before ON CONFLICT skipped those already copied, so the truncate's copy (under its
-- lock) read the payload of every row the precopy had copied.

-- Copy finished rows of slot p_slot, with their payloads, to history: those with an id above
-- p_after, at most p_batch of them (NULL: all), in id order, so the archive job copies a
-- large generation in short transactions (a queue migrated with millions of rows in slot 0).
-- Returns how many were copied and the last id looked at (the next call's p_after).
-- The rows go into history in id order (the ORDER BY of the INSERT's SELECT; the executor
-- inserts them as its sort yields them): two rotators copying the same generation insert
-- the same keys, and ON CONFLICT makes the second wait on the first's uncommitted key; in
-- the same order no two wait on each other, while in the join's order (which may follow the
-- data table's physical order, where rot_move put stragglers after newer rows) two could
-- each wait on a key the other inserted first, a deadlock.
CREATE OR REPLACE FUNCTION {{fn_rot_copy}}(p_slot smallint, p_after bigint, p_batch integer,
                                         OUT copied bigint, OUT last_id bigint)
LANGUAGE plpgsql AS $fn$
BEGIN
    WITH picked AS MATERIALIZED (
        SELECT m.id, m.priority, m.due_at, m.status, m.title, m.attempts, m.max_attempts, m.lease_owner,
               m.enqueued_at, m.dequeued_at, m.finished_at, m.last_error
        FROM {{meta}} m
        WHERE m.slot = p_slot AND m.id > p_after AND m.status >= 2
        ORDER BY m.id
        LIMIT p_batch
    ), copied AS (
        INSERT INTO {{history}} (id, priority, due_at, status, title, attempts, max_attempts, lease_owner,
                                 enqueued_at, dequeued_at, finished_at, last_error, payload, headers, archived_at)
        SELECT p.id, p.priority, p.due_at, p.status, p.title, p.attempts, p.max_attempts, p.lease_owner,
               p.enqueued_at, p.dequeued_at, p.finished_at, p.last_error, d.payload, d.headers, now()
        FROM picked p LEFT JOIN {{data}} d ON d.id = p.id AND d.slot = p_slot
        ORDER BY p.id
        ON CONFLICT (id) DO NOTHING
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM copied), (SELECT max(p.id) FROM picked p) INTO copied, last_id;
END
$fn$;

-- name: create_rot_empty_0012
-- reliable_0012's truncate, without the precopied epoch and its horizon (reliable_0017's
-- downgrade puts it back). reliable_0012 creates it with the other rotator calls
-- (create_rotator).

-- Archive and empty the oldest sealed epoch (header, 5) under lock_timeout p_lock_timeout_ms;
-- the caller has precopied it (rot_copy, without the lock). Returns the epoch emptied (the
-- caller marks it), or NULL when none waits; raises lock_not_available (55P03) when the
-- slot stays locked past the timeout.
CREATE OR REPLACE FUNCTION {{fn_rot_empty}}(p_lock_timeout_ms integer,
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
    copied := (SELECT c.copied FROM {{fn_rot_copy}}(v_slot, 0, NULL) c);
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

-- name: create_rot_copy_0015
-- reliable_0015's copy of a generation's finished rows to history, without the precopy's
-- horizon (reliable_0017's downgrade puts it back): the truncate's copy under its lock
-- looked up in history every finished row of the generation.

-- Copy finished rows of slot p_slot, with their payloads, to history: those with an id above
-- p_after, at most p_batch of them (NULL: all), in id order, so the archive job copies a
-- large generation in short transactions (a queue migrated with millions of rows in slot 0).
-- Returns how many were copied and the last id looked at (the next call's p_after).
-- A row already in history is passed over before its payload is read: the truncate copies
-- what finished since the precopy (p_after 0) under its lock, and reads history's primary key
-- once for each row the precopy copied, where reliable_0014 joined each to its payload first
-- and left it to ON CONFLICT. The look-up is a correlated subquery, not NOT EXISTS: the
-- planner would make that an anti-join, which it may run as a hash or merge join reading all
-- of history, where a subquery is one probe of history's primary key per row picked. Each
-- call is planned for its own arguments (force_custom_plan): the slot's own tables, and for a
-- batch a walk of the slot's primary key in id order that stops after p_batch finished rows.
-- A generic plan (plpgsql's choice after five calls) knows neither: it read every finished
-- row of the slot above p_after and sorted them, at every batch, so a precopy in batches of
-- 1,000 of a generation of 7,000 ids read 28,000 rows.
-- The rows go into history in id order (the ORDER BY of the INSERT's SELECT; the executor
-- inserts them as its sort yields them): two rotators copying the same generation insert
-- the same keys, and ON CONFLICT makes the second wait on the first's uncommitted key; in
-- the same order no two wait on each other, while in the join's order (which may follow the
-- data table's physical order, where rot_move put stragglers after newer rows) two could
-- each wait on a key the other inserted first, a deadlock.
CREATE OR REPLACE FUNCTION {{fn_rot_copy}}(p_slot smallint, p_after bigint, p_batch integer,
                                         OUT copied bigint, OUT last_id bigint)
LANGUAGE plpgsql
SET plan_cache_mode = force_custom_plan
AS $fn$
BEGIN
    WITH picked AS MATERIALIZED (
        SELECT m.id, m.priority, m.due_at, m.status, m.title, m.attempts, m.max_attempts, m.lease_owner,
               m.enqueued_at, m.dequeued_at, m.finished_at, m.last_error
        FROM {{meta}} m
        WHERE m.slot = p_slot AND m.id > p_after AND m.status >= 2
        ORDER BY m.id
        LIMIT p_batch
    ), fresh AS MATERIALIZED (
        SELECT p.* FROM picked p
        WHERE (SELECT true FROM {{history}} h WHERE h.id = p.id) IS NULL
    ), copied AS (
        INSERT INTO {{history}} (id, priority, due_at, status, title, attempts, max_attempts, lease_owner,
                                 enqueued_at, dequeued_at, finished_at, last_error, payload, headers, archived_at)
        SELECT p.id, p.priority, p.due_at, p.status, p.title, p.attempts, p.max_attempts, p.lease_owner,
               p.enqueued_at, p.dequeued_at, p.finished_at, p.last_error, d.payload, d.headers, now()
        FROM fresh p LEFT JOIN {{data}} d ON d.id = p.id AND d.slot = p_slot
        ORDER BY p.id
        ON CONFLICT (id) DO NOTHING
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM copied), (SELECT max(p.id) FROM picked p) INTO copied, last_id;
END
$fn$;

-- name: create_rot_copy_0017
-- reliable_0017's copy of a generation's finished rows to history (reliable_0018's downgrade
-- puts it back): its batch picked into a materialized CTE, looked up in history into another,
-- joined to the payloads and sorted, and inserted with ON CONFLICT DO NOTHING besides, the
-- last id looked at returned for every batch (a last call finds none). What the arguments
-- promise, p_copied_before's horizon included, is as the current rot_copy says
-- (reliable.sql: create_rot_copy); the rows go into history in id order, so two rotators
-- copying the same rows never deadlock on each other's keys.
CREATE OR REPLACE FUNCTION {{fn_rot_copy}}(p_slot smallint, p_after bigint, p_batch integer,
                                         p_copied_before xid8 DEFAULT NULL,
                                         OUT copied bigint, OUT last_id bigint)
LANGUAGE plpgsql
SET plan_cache_mode = force_custom_plan
AS $fn$
DECLARE
    v_cut integer := age(p_copied_before::xid);
BEGIN
    WITH picked AS MATERIALIZED (
        SELECT m.id, m.priority, m.due_at, m.status, m.title, m.attempts, m.max_attempts, m.lease_owner,
               m.enqueued_at, m.dequeued_at, m.finished_at, m.last_error
        FROM {{meta}} m
        WHERE m.slot = p_slot AND m.id > p_after AND m.status >= 2
          AND (v_cut IS NULL OR age(m.xmin) <= v_cut OR age(m.xmin) = 2147483647)
        ORDER BY m.id
        LIMIT p_batch
    ), fresh AS MATERIALIZED (
        SELECT p.* FROM picked p
        WHERE (SELECT true FROM {{history}} h WHERE h.id = p.id) IS NULL
    ), copied AS (
        INSERT INTO {{history}} (id, priority, due_at, status, title, attempts, max_attempts, lease_owner,
                                 enqueued_at, dequeued_at, finished_at, last_error, payload, headers, archived_at)
        SELECT p.id, p.priority, p.due_at, p.status, p.title, p.attempts, p.max_attempts, p.lease_owner,
               p.enqueued_at, p.dequeued_at, p.finished_at, p.last_error, d.payload, d.headers, now()
        FROM fresh p LEFT JOIN {{data}} d ON d.id = p.id AND d.slot = p_slot
        ORDER BY p.id
        ON CONFLICT (id) DO NOTHING
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM copied), (SELECT max(p.id) FROM picked p) INTO copied, last_id;
END
$fn$;
