-- The watermark-claim probe's statements (bench/lab/wm_claim.py): a prototype of the reliable
-- queue's claim that starts its index walks past the dead prefix, installed in the probe's own
-- schema beside a reliable queue installed at the head revision (its tables are the product's,
-- unchanged). Read by lab_helpers.probe_sql(section, values, WM_SQL).
--
-- Placeholders: the queue's template values (QueueNames.template_values()) plus
--   {{lab}}         the probe's schema (quoted)
--   {{wm_*}}        the prototype functions, {{lab}}."<queue>_<name>"
--   {{epoch}}       {{lab}}."<queue>_epoch", one row bumped by release
--   {{meta_oid}}    the meta table's oid (an int: the session settings' key)
--   {{ready_bound}} 1: the ready walk starts at the session's per-priority bounds; 0: at the
--                   index's start, as the product does
--   {{lease_bound}} 1: the expired-lease walk starts at the session's lease bound; 0: at the start
--   {{move_every}}  the bounds move every this many calls of a session
--
-- The bounds and why they never pass an item that can still be claimed (the proof):
--  B(p), per priority p, on the ready index key (due_at, id); L on leased_until. A claim walks
--  the ready index from (p, B(p)) for each priority it knows, and the gaps between known
--  priorities from their start (an unknown priority is never skipped); the expired walk walks
--  leased_until from L. Invariant: no row that is, or will become, READY with key below
--  (p, B(p)), or PROCESSING with leased_until below L, exists except through release (below).
--  1. Every write that makes a READY or PROCESSING version takes its time from clock_timestamp()
--     AFTER its transaction has an id: enqueue and nack call pg_current_xact_id() first; the claim
--     has one already (FOR UPDATE SKIP LOCKED wrote its row locks before the UPDATE computes
--     leased_until); extend_lease calls it first. Delays, backoffs and leases are clamped to >= 0.
--     So a version written by a transaction whose id was assigned after time t has due_at >= t
--     (READY) or leased_until >= t (PROCESSING).
--  2. At a move the session records a candidate: c = clock_timestamp(), THEN the current
--     snapshot's xmax. Every transaction id >= xmax is assigned after c.
--  3. At a later move, once no transaction id below the recorded xmax is in progress (the current
--     snapshot's xip list), every version a transaction below xmax wrote is committed or aborted
--     for good, and a statement run now sees it. The new bounds are
--       B(p) = the smallest key of a status-0 row of priority p in [old B(p), (c, -inf)), else (c, -inf)
--       L    = the smallest leased_until of a status-1 row in [old L, c), else c
--     each read walking only [old bound, c), so a move walks the entries of about one move's
--     claims (the range above c may hold a long run of acked items' dead entries: leases end
--     lease_seconds after their claim), and read WITHOUT skip locked: rows other consumers hold count as present, so the rollback of a
--     claim (the row goes back to READY at its old key, its READY version never stopped being the
--     committed one) cannot strand it. Rows below the old bounds: the invariant, by induction.
--     Rows written later by ids >= xmax: at or above c by 1 and 2.
--  Release puts an item back to READY with its old due_at (it keeps its place), below B(p): it
--  bumps the one-row epoch table; a session that sees a new epoch at its next move resets its
--  ready bounds to the index's start (and skips step 3 in that move), so a released item waits at
--  most two moves of each session (a move: every {{move_every}} calls).
--  A long WRITING transaction (one holding an id) pauses the moves (the bounds stay correct, the
--  walks grow while it runs); read-only snapshots, the usual holders of the horizon, do not.
--  The session state lives in custom settings, which a rollback reverts with the transaction.

-- name: wm_schema
CREATE SCHEMA IF NOT EXISTS {{lab}}

-- name: wm_drop
DROP TABLE IF EXISTS {{epoch}};
DROP FUNCTION IF EXISTS {{wm_dequeue}}(integer, double precision, text);
DROP FUNCTION IF EXISTS {{wm_ack}}(bigint[], text);
DROP FUNCTION IF EXISTS {{wm_nack}}(bigint[], text, text, double precision, double precision);
DROP FUNCTION IF EXISTS {{wm_release}}(bigint[], text);
DROP FUNCTION IF EXISTS {{wm_extend_lease}}(bigint[], double precision, text);
DROP FUNCTION IF EXISTS {{wm_enqueue_many}}(bytea[], smallint[], interval[]);

-- name: wm_install
-- The prototype API over the installed queue's tables.
CREATE TABLE {{epoch}} (only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row), epoch bigint NOT NULL DEFAULT 0);
INSERT INTO {{epoch}} DEFAULT VALUES;

-- enqueue: the product's enqueue_many (no size check, no titles or headers: the probe sends none),
-- with due_at from the clock after the transaction has its id (step 1), delays clamped to >= 0.
CREATE FUNCTION {{wm_enqueue_many}}(p_payloads bytea[], p_priorities smallint[] DEFAULT NULL,
                                    p_delays interval[] DEFAULT NULL)
RETURNS SETOF bigint
LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM pg_current_xact_id();
    RETURN QUERY
    WITH src AS MATERIALIZED (
        SELECT nextval({{meta_seq_regclass}}::regclass) AS id, u.payload, u.priority, u.delay, u.ord
        FROM unnest(p_payloads, p_priorities, p_delays) WITH ORDINALITY AS u(payload, priority, delay, ord)
        WHERE u.ord <= cardinality(p_payloads)
    ), m AS (
        INSERT INTO {{meta}} (id, priority, due_at)
        OVERRIDING SYSTEM VALUE
        SELECT src.id, coalesce(src.priority, 0),
               clock_timestamp() + greatest(coalesce(src.delay, interval '0'), interval '0')
        FROM src
    ), d AS (
        INSERT INTO {{data}} (id, payload) SELECT src.id, src.payload FROM src
    )
    SELECT src.id FROM src ORDER BY src.ord;
END
$fn$;

-- ack: the product's, with finished_at from the clock after the transaction has its id, so
-- that the archive's bound (wm_archive_batch) has the same proof as the claim's.
CREATE FUNCTION {{wm_ack}}(p_ids bigint[], p_worker text DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql AS $fn$
DECLARE
    v_count integer;
BEGIN
    PERFORM pg_current_xact_id();
    UPDATE {{meta}} m
    SET status = 2, finished_at = clock_timestamp(), leased_until = NULL
    WHERE m.id = ANY (p_ids) AND m.status::integer = 1
      AND (p_worker IS NULL OR m.lease_owner = p_worker);
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END
$fn$;

-- nack: the product's, with the backoff counted from the clock after the transaction has its id.
CREATE FUNCTION {{wm_nack}}(p_ids bigint[], p_error text DEFAULT NULL, p_worker text DEFAULT NULL,
                            p_base_seconds double precision DEFAULT 1, p_max_seconds double precision DEFAULT 3600)
RETURNS TABLE (id bigint, status smallint, due_at timestamptz)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
BEGIN
    PERFORM pg_current_xact_id();
    RETURN QUERY
    UPDATE {{meta}} m SET
        status       = CASE WHEN m.attempts >= m.max_attempts THEN 3 ELSE 0 END,
        due_at       = CASE WHEN m.attempts >= m.max_attempts THEN m.due_at
                            ELSE clock_timestamp() + make_interval(secs => greatest(least(
                                coalesce(p_base_seconds, 1) * power(2, least(greatest(m.attempts - 1, 0), 40)),
                                coalesce(p_max_seconds, 3600)), 0)) END,
        finished_at  = CASE WHEN m.attempts >= m.max_attempts THEN clock_timestamp() END,
        leased_until = NULL,
        last_error   = p_error
    WHERE m.id = ANY (p_ids) AND m.status::integer = 1
      AND (p_worker IS NULL OR m.lease_owner = p_worker)
    RETURNING m.id, m.status, m.due_at;
END
$fn$;

-- release: the product's (the item keeps its due_at), and the epoch bumped in the same
-- transaction so that every session's ready bounds go back to the start at its next move.
CREATE FUNCTION {{wm_release}}(p_ids bigint[], p_worker text DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql AS $fn$
DECLARE
    v_count integer := {{fn_release}}(p_ids, p_worker);
BEGIN
    IF v_count > 0 THEN
        UPDATE {{epoch}} SET epoch = epoch + 1;
    END IF;
    RETURN v_count;
END
$fn$;

-- extend_lease: the product's, the new lease counted from the clock after the transaction has its id.
CREATE FUNCTION {{wm_extend_lease}}(p_ids bigint[], p_lease_seconds double precision DEFAULT 30,
                                    p_worker text DEFAULT NULL)
RETURNS TABLE (id bigint, leased_until timestamptz)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
BEGIN
    PERFORM pg_current_xact_id();
    RETURN QUERY
    UPDATE {{meta}} m
    SET leased_until = clock_timestamp() + make_interval(secs => greatest(coalesce(p_lease_seconds, 30), 0))
    WHERE m.id = ANY (p_ids) AND m.status::integer = 1
      AND (p_worker IS NULL OR m.lease_owner = p_worker)
    RETURNING m.id, m.leased_until;
END
$fn$;

-- dequeue: the product's claim (same CTEs, same updates), its two walks started at the bounds.
-- Session state: settings 'queuectl_lab.wm<meta oid>_<field>': calls, rp/rd/ri (the ready bounds:
-- priorities ascending, due_at, id), lease (L), ct/cx (the candidate: clock, xmax), epoch.
CREATE FUNCTION {{wm_dequeue}}(
    p_batch         integer          DEFAULT 1,
    p_lease_seconds double precision DEFAULT 30,
    p_worker        text             DEFAULT NULL
) RETURNS TABLE (
    id bigint, priority smallint, due_at timestamptz, title text, attempts integer,
    max_attempts integer, enqueued_at timestamptz, dequeued_at timestamptz,
    leased_until timestamptz, payload bytea, headers jsonb
)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
DECLARE
    k       text := 'queuectl_lab.wm{{meta_oid}}_';
    v_calls integer := coalesce(nullif(current_setting(k || 'calls', true), ''), '0')::integer + 1;
    v_rp    smallint[] := coalesce(nullif(current_setting(k || 'rp', true), ''), '{}')::smallint[];
    v_rd    timestamptz[] := coalesce(nullif(current_setting(k || 'rd', true), ''), '{}')::timestamptz[];
    v_ri    bigint[] := coalesce(nullif(current_setting(k || 'ri', true), ''), '{}')::bigint[];
    v_lease timestamptz := coalesce(nullif(current_setting(k || 'lease', true), ''), '-infinity')::timestamptz;
    v_ct    timestamptz := nullif(current_setting(k || 'ct', true), '')::timestamptz;
    v_cx    xid8 := nullif(current_setting(k || 'cx', true), '')::xid8;
    v_epoch bigint := nullif(current_setting(k || 'epoch', true), '')::bigint;
    v_now_epoch bigint;
    v_moved boolean := false;
    v_row   record;
    v_lp smallint[] := '{}'; v_ld timestamptz[] := '{}'; v_li bigint[] := '{}';
    v_hp smallint[] := '{}'; v_hd timestamptz[] := '{}'; v_hi bigint[] := '{}';
    v_prev  integer := -32768;
    v_seen  smallint[] := '{}';
    v_p     smallint;
    v_pos   integer;
    c_min   CONSTANT bigint := -9223372036854775808;
    c_max   CONSTANT bigint := 9223372036854775807;
BEGIN
    IF v_calls >= {{move_every}} THEN
        v_calls := 0;
        v_moved := true;
        SELECT e.epoch INTO v_now_epoch FROM {{epoch}} e;
        IF v_epoch IS DISTINCT FROM v_now_epoch THEN
            -- a release (or the session's first move): the ready walk starts at the index's start
            v_rd := array_fill('-infinity'::timestamptz, ARRAY[cardinality(v_rp)]);
            v_ri := array_fill(c_min, ARRAY[cardinality(v_rp)]);
            v_epoch := v_now_epoch;
            v_ct := NULL;
        ELSIF v_ct IS NOT NULL AND NOT EXISTS (
            SELECT 1 FROM pg_snapshot_xip(pg_current_snapshot()) x WHERE x < v_cx
        ) THEN
            -- step 3: the candidate has settled
            IF {{ready_bound}} = 1 THEN
                FOR i IN 1 .. cardinality(v_rp) LOOP
                    SELECT m.due_at, m.id INTO v_row FROM {{meta}} m
                    WHERE m.status = 0 AND m.priority = v_rp[i] AND (m.due_at, m.id) >= (v_rd[i], v_ri[i])
                      AND m.due_at < v_ct
                    ORDER BY m.due_at, m.id
                    LIMIT 1;
                    IF NOT FOUND THEN
                        v_rd[i] := v_ct;
                        v_ri[i] := c_min;
                    ELSE
                        v_rd[i] := v_row.due_at;
                        v_ri[i] := v_row.id;
                    END IF;
                END LOOP;
            END IF;
            IF {{lease_bound}} = 1 THEN
                v_lease := least(v_ct, coalesce((
                    SELECT m.leased_until FROM {{meta}} m
                    WHERE m.status = 1 AND m.leased_until >= v_lease AND m.leased_until < v_ct
                    ORDER BY m.leased_until LIMIT 1), v_ct));
            END IF;
            v_ct := NULL;
        END IF;
        IF v_ct IS NULL THEN
            -- step 2: the clock first, then the snapshot
            v_ct := clock_timestamp();
            v_cx := pg_snapshot_xmax(pg_current_snapshot());
        END IF;
    END IF;

    -- the walk's segments: each known priority from its bound, every gap between them from its start
    FOR i IN 1 .. cardinality(v_rp) LOOP
        IF v_rp[i] > v_prev THEN
            v_lp := v_lp || v_prev::smallint; v_ld := v_ld || '-infinity'::timestamptz; v_li := v_li || c_min;
            v_hp := v_hp || (v_rp[i] - 1)::smallint; v_hd := v_hd || 'infinity'::timestamptz; v_hi := v_hi || c_max;
        END IF;
        v_lp := v_lp || v_rp[i]; v_ld := v_ld || v_rd[i]; v_li := v_li || v_ri[i];
        v_hp := v_hp || v_rp[i]; v_hd := v_hd || 'infinity'::timestamptz; v_hi := v_hi || c_max;
        v_prev := v_rp[i] + 1;
    END LOOP;
    IF v_prev <= 32767 THEN
        v_lp := v_lp || v_prev::smallint; v_ld := v_ld || '-infinity'::timestamptz; v_li := v_li || c_min;
        v_hp := v_hp || 32767::smallint; v_hd := v_hd || 'infinity'::timestamptz; v_hi := v_hi || c_max;
    END IF;

    RETURN QUERY
        WITH expired AS MATERIALIZED (
            SELECT m.id FROM {{meta}} m
            WHERE m.status = 1 AND m.leased_until >= v_lease AND m.leased_until < now()
            ORDER BY m.leased_until
            LIMIT greatest(p_batch, 0)
            FOR UPDATE SKIP LOCKED
        ), ready AS MATERIALIZED (
            SELECT r.id
            FROM unnest(v_lp, v_ld, v_li, v_hp, v_hd, v_hi) AS s(lp, ld, li, hp, hd, hi)
            CROSS JOIN LATERAL (
                SELECT m.id FROM {{meta}} m
                WHERE m.status = 0 AND m.due_at <= now()
                  AND (m.priority, m.due_at, m.id) >= (s.lp, s.ld, s.li)
                  AND (m.priority, m.due_at, m.id) <= (s.hp, s.hd, s.hi)
                ORDER BY m.priority, m.due_at, m.id
                LIMIT greatest(p_batch, 0)
                FOR UPDATE SKIP LOCKED
            ) r
            LIMIT greatest(p_batch - (SELECT count(*) FROM expired), 0)
        ), claimed AS (
            UPDATE {{meta}} m SET
                status       = CASE WHEN m.status = 1 AND m.attempts >= m.max_attempts THEN 3 ELSE 1 END,
                attempts     = CASE WHEN m.status = 1 AND m.attempts >= m.max_attempts THEN m.attempts
                                    ELSE m.attempts + 1 END,
                lease_owner  = CASE WHEN m.status = 1 AND m.attempts >= m.max_attempts THEN m.lease_owner
                                    ELSE p_worker END,
                leased_until = CASE WHEN m.status = 1 AND m.attempts >= m.max_attempts THEN NULL
                                    ELSE clock_timestamp() + make_interval(secs => greatest(coalesce(p_lease_seconds, 30), 0)) END,
                dequeued_at  = CASE WHEN m.status = 1 AND m.attempts >= m.max_attempts THEN m.dequeued_at
                                    ELSE now() END,
                finished_at  = CASE WHEN m.status = 1 AND m.attempts >= m.max_attempts THEN clock_timestamp() END,
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
        ), seen AS MATERIALIZED (
            -- priorities claimed for the first time, handed to the code below through a setting
            SELECT set_config(k || 'seen', coalesce((SELECT array_agg(DISTINCT c.priority) FROM claimed c
                                                     WHERE NOT c.priority = ANY (v_rp))::text, ''), false) AS s
        )
        SELECT c.id, c.priority, c.due_at, c.title, c.attempts, c.max_attempts, c.enqueued_at,
               c.dequeued_at, c.leased_until, p.payload, p.headers
        FROM claimed c JOIN payloads p ON p.id = c.id CROSS JOIN seen
        WHERE c.status = 1
        ORDER BY c.priority, c.due_at, c.id;
    v_seen := coalesce(nullif(current_setting(k || 'seen', true), ''), '{}')::smallint[];

    -- priorities claimed for the first time get a segment of their own, from the index's start
    IF cardinality(v_seen) > 0 THEN
        v_moved := true;
        PERFORM set_config(k || 'seen', '', false);
    END IF;
    FOREACH v_p IN ARRAY v_seen LOOP
        v_pos := coalesce((SELECT count(*) FROM unnest(v_rp) u WHERE u < v_p), 0) + 1;
        v_rp := v_rp[1:v_pos - 1] || v_p || v_rp[v_pos:];
        v_rd := v_rd[1:v_pos - 1] || '-infinity'::timestamptz || v_rd[v_pos:];
        v_ri := v_ri[1:v_pos - 1] || c_min || v_ri[v_pos:];
    END LOOP;
    IF {{ready_bound}} = 0 THEN
        v_rp := '{}'; v_rd := '{}'; v_ri := '{}';
    END IF;

    PERFORM set_config(k || 'calls', v_calls::text, false);
    IF v_moved THEN  -- the rest changes at moves (and when a priority is seen) only
        PERFORM set_config(k || 'rp', v_rp::text, false), set_config(k || 'rd', v_rd::text, false),
                set_config(k || 'ri', v_ri::text, false), set_config(k || 'lease', v_lease::text, false),
                set_config(k || 'ct', coalesce(v_ct::text, ''), false),
                set_config(k || 'cx', coalesce(v_cx::text, ''), false),
                set_config(k || 'epoch', coalesce(v_epoch::text, ''), false);
    END IF;
    RETURN;
END
$fn$;
ALTER FUNCTION {{wm_dequeue}}(integer, double precision, text) SET enable_seqscan = off SET jit = off;
ALTER FUNCTION {{wm_nack}}(bigint[], text, text, double precision, double precision) SET enable_seqscan = off SET jit = off;
ALTER FUNCTION {{wm_extend_lease}}(bigint[], double precision, text) SET enable_seqscan = off SET jit = off;
ALTER FUNCTION {{wm_ack}}(bigint[], text) SET enable_seqscan = off SET jit = off;

-- name: wm_archive_batch
-- The archive job's batch (sql/postgresql/jobs.sql archive_batch, unchanged but for the bound):
-- both picks start at :bound on finished_at, the archive session's bound, which moves as the
-- claim's do (every write of finished_at takes it from the clock after its transaction has an
-- id: ack, nack and the claim's last-attempt expiry above), so the finished index's prefix of
-- rows already moved (dead, and kept while the horizon is pinned) is not walked again.
WITH done AS MATERIALIZED (
    SELECT m.id FROM {{meta}} m
    WHERE m.status = 2 AND m.finished_at >= CAST(:bound AS timestamptz)
      AND m.finished_at < now() - make_interval(secs => :min_age_seconds)
    ORDER BY m.status, m.finished_at
    LIMIT :batch
    FOR UPDATE SKIP LOCKED
), dead AS MATERIALIZED (
    SELECT m.id FROM {{meta}} m
    WHERE m.status = 3 AND m.finished_at >= CAST(:bound AS timestamptz)
      AND m.finished_at < now() - make_interval(secs => :dead_min_age_seconds)
    ORDER BY m.status, m.finished_at
    LIMIT greatest(:batch - (SELECT count(*) FROM done), 0)
    FOR UPDATE SKIP LOCKED
), picked AS (
    SELECT id FROM done UNION ALL SELECT id FROM dead
), moved_data AS (
    DELETE FROM {{data}} d WHERE d.id = ANY (ARRAY(SELECT p.id FROM picked p))
    RETURNING d.id, d.payload, d.headers
), moved AS (
    DELETE FROM {{meta}} m WHERE m.id = ANY (ARRAY(SELECT p.id FROM picked p))
    RETURNING m.id, m.priority, m.due_at, m.status, m.title, m.attempts, m.max_attempts,
              m.lease_owner, m.enqueued_at, m.dequeued_at, m.finished_at, m.last_error
)
INSERT INTO {{history}} (id, priority, due_at, status, title, attempts, max_attempts,
                         lease_owner, enqueued_at, dequeued_at, finished_at, last_error,
                         payload, headers, archived_at)
SELECT m.id, m.priority, m.due_at, m.status, m.title, m.attempts, m.max_attempts,
       m.lease_owner, m.enqueued_at, m.dequeued_at, m.finished_at, m.last_error,
       d.payload, d.headers, now()
FROM moved m LEFT JOIN moved_data d ON d.id = m.id

-- name: wm_archive_settled
-- Step 3's test for the archive session: no transaction below the candidate's xmax is running.
SELECT NOT EXISTS (SELECT 1 FROM pg_snapshot_xip(pg_current_snapshot()) x WHERE x < CAST(:cx AS xid8)) AS settled

-- name: wm_archive_move
-- Step 3 for the archive's bound: the smallest finished_at of a finished row in [bound, c), else c.
SELECT least(
    (SELECT m.finished_at FROM {{meta}} m WHERE m.status = 2 AND m.finished_at >= CAST(:bound AS timestamptz)
        AND m.finished_at < CAST(:ct AS timestamptz) ORDER BY m.status, m.finished_at LIMIT 1),
    (SELECT m.finished_at FROM {{meta}} m WHERE m.status = 3 AND m.finished_at >= CAST(:bound AS timestamptz)
        AND m.finished_at < CAST(:ct AS timestamptz) ORDER BY m.status, m.finished_at LIMIT 1),
    CAST(:ct AS timestamptz))::text AS bound

-- name: wm_archive_clock
-- Step 2, first half: the clock (read before the snapshot of wm_archive_xmax).
SELECT clock_timestamp()::text AS ct

-- name: wm_archive_xmax
SELECT pg_snapshot_xmax(pg_current_snapshot())::text AS cx

-- name: index_sample
-- Per index of the queue's tables: entries returned by its scans (each one a heap tuple
-- visited: dead entries are returned and their heap tuple checked while the horizon is pinned)
-- and buffers; per table: heap buffers and dead rows; sizes. A new transaction per sample
-- (statistics are cached for a transaction's duration).
SELECT i.indexrelname AS name, i.idx_scan, i.idx_tup_read, i.idx_tup_fetch,
       io.idx_blks_hit + io.idx_blks_read AS blocks, pg_relation_size(i.indexrelid) AS bytes
FROM pg_stat_user_indexes i JOIN pg_statio_user_indexes io USING (indexrelid)
WHERE i.relid = ANY (CAST(:tables AS text[])::regclass[])

-- name: table_sample
SELECT t.relname AS name, t.n_dead_tup, t.n_live_tup, t.autovacuum_count,
       io.heap_blks_hit + io.heap_blks_read AS heap_blocks, pg_total_relation_size(t.relid) AS bytes
FROM pg_stat_user_tables t JOIN pg_statio_user_tables io USING (relid)
WHERE t.relid = ANY (CAST(:tables AS text[])::regclass[])

-- name: statement_sample
-- pg_stat_statements (tracking nested statements) for the statements naming the queue's meta
-- table: the claim, ack, enqueue, archive and the prototype's moves, told apart by the caller.
SELECT s.queryid, s.query, s.calls, s.shared_blks_hit + s.shared_blks_read AS blocks, s.total_exec_time AS ms
FROM pg_stat_statements s
WHERE s.dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND strpos(s.query, :meta) > 0

-- name: statements_on
CREATE EXTENSION IF NOT EXISTS pg_stat_statements

-- name: meta_oid
SELECT to_regclass(:meta)::oid

-- name: client_enqueue_product
-- The clients' calls (psycopg parameters); {{q_*}}: the design's functions, the product's or the prototype's.
SELECT count(*) FROM {{fn_enqueue_many}}(%s::bytea[], NULL, %s::smallint[], %s::interval[])

-- name: client_enqueue_wm
SELECT count(*) FROM {{wm_enqueue_many}}(%s::bytea[], %s::smallint[], %s::interval[])

-- name: client_enqueue_ids
SELECT * FROM {{wm_enqueue_many}}(%s::bytea[], %s::smallint[], %s::interval[])

-- name: client_dequeue
SELECT id, priority, enqueued_at, due_at FROM {{q_dequeue}}(%s, %s, %s)

-- name: client_ack
SELECT {{q_ack}}(%s::bigint[], %s)

-- name: client_nack
SELECT count(*) FROM {{q_nack}}(%s::bigint[], 'probe', %s, %s, %s)

-- name: client_release
SELECT {{q_release}}(%s::bigint[], %s)

-- name: client_release_product
-- The check's control: the product's release, which does not bump the epoch.
SELECT {{fn_release}}(%s::bigint[], %s)

-- name: vacuum_meta
-- The drain's start: a filled queue, vacuumed and analysed (as autovacuum leaves it).
VACUUM ANALYZE {{meta}}

-- name: hold_table
CREATE TABLE IF NOT EXISTS {{lab}}.bystander (id integer PRIMARY KEY);
INSERT INTO {{lab}}.bystander VALUES (1) ON CONFLICT DO NOTHING

-- name: hold_read
SELECT count(*) FROM {{lab}}.bystander
