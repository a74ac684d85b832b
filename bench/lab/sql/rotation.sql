-- The rotation probe's prototype (bench/lab/rotation.py): the reliable queue's meta and data
-- kept in a fixed ring of {{k}} generation slots (LIST partitions on `gen`), emptied by
-- TRUNCATE instead of row deletes, so the space and the index entries of finished items
-- are freed whatever the xmin horizon. Everything lives in the probe's own schema {{s}};
-- nothing here is product SQL. Read by lab_helpers.lab_sql("rotation", ...).
--
-- Epochs and slots. Generations are numbered by an ever-growing epoch; epoch e lives in
-- slot e % {{k}}. Four sequences hold the rotation state (sequences, not a table row: a
-- control row read by every claim and updated at every rotation would keep one dead
-- version per rotation under a pinned horizon, each walked by every reader):
--   epoch_cur        the epoch new items go to (enqueue, nack, release, stragglers);
--   epoch_sealed     every epoch <= it holds no READY row and can get none: claims walk
--                    only the epochs above it (at most two: a switch waits for the seal);
--   epoch_truncated  every epoch <= it has been copied to history and truncated; its slot
--                    may be reused (a switch needs slot (cur+1) % k free);
--   seal_bound       an xid (xid8 as bigint) above every transaction that could still
--                    write a READY row into an epoch below cur; 0 = not recorded yet.
-- Sequence reads are not MVCC reads: every session sees setval() at once.
--
-- Why no READY item is skipped forever or claimed twice (the proof the probe's
-- concurrency check exercises):
--  1. enqueue, nack and release take their transaction id (pg_current_xact_id()) BEFORE
--     the statement that reads epoch_cur and writes the row, so a writer that read an
--     epoch e < cur got its xid before the switch away from e;
--  2. the switch sets epoch_cur, then records seal_bound = xmax of a snapshot taken after
--     it: every such writer's xid is below seal_bound;
--  3. the seal runs only when the oldest running xid (pg_current_snapshot()'s xmin) is at
--     or above seal_bound: every writer that could target epoch cur-1 has ended. It then
--     moves every READY row of cur-1 to cur (DELETE + INSERT in one statement; the DELETE
--     waits on rows a claim holds and re-checks them: a claim that rolls back leaves a
--     READY row the sweep then moves; one that commits leaves it PROCESSING). Only after
--     that commits does epoch_sealed move, so a claim always walks a superset of the
--     epochs that can hold a claimable row (it reads epoch_sealed BEFORE epoch_cur);
--  4. after the seal no READY row can appear in cur-1: nack and release move rows to the
--     current epoch, an expired lease is re-leased in place (PROCESSING to PROCESSING), a
--     rolled-back claim of a row the sweep waited for is moved by the sweep;
--  5. the truncate locks the slot's meta and data ACCESS EXCLUSIVE (with lock_timeout:
--     it retries rather than queue producers and consumers behind it), so no other
--     transaction reads or writes them; it copies every DONE/DEAD row with its payload to
--     history and every other row (PROCESSING, and any READY row, as a backstop) to the
--     current epoch, then truncates: one transaction, so a failure rolls all of it back.
--     Statements lock before they take their snapshot (plpgsql: plan, lock, snapshot), so
--     a statement that waited for the truncate sees the moved rows, never the empty slot
--     without them;
--  6. rows move by DELETE + INSERT, never by an UPDATE of `gen` (a concurrent locker of a
--     row moved by an UPDATE gets an error; of a deleted row, a skip), and keep their id:
--     ack, nack, extend and release find them by id in whichever slot they are.
-- What is lost to old snapshots: TRUNCATE is not MVCC-safe. A REPEATABLE READ snapshot
-- older than the truncate that reads the slot afterwards sees it empty, and does not see
-- the copies in history or in the current slot either (inserted after it). Only reports
-- read like that; pg_dump locks every table first (and so blocks the rotation instead).

-- name: create
CREATE SCHEMA {{s}};
CREATE SEQUENCE {{s}}.id_seq;
CREATE SEQUENCE {{s}}.epoch_cur MINVALUE 0 START 0;
CREATE SEQUENCE {{s}}.epoch_sealed MINVALUE -1 START -1;
CREATE SEQUENCE {{s}}.epoch_truncated MINVALUE -1 START -1;
CREATE SEQUENCE {{s}}.seal_bound MINVALUE 0 START 1;
CREATE SEQUENCE {{s}}.epoch_start_id MINVALUE 0 START 0;  -- id_seq's value at the last switch
CREATE SEQUENCE {{s}}.epoch_start_ms MINVALUE 0 START 0;  -- when the last switch ran (unix ms)

CREATE TABLE {{s}}.meta (
    gen           smallint    NOT NULL,
    id            bigint      NOT NULL DEFAULT nextval({{seq_id_seq}}),
    priority      smallint    NOT NULL DEFAULT 0,
    due_at        timestamptz NOT NULL DEFAULT now(),
    status        smallint    NOT NULL DEFAULT 0 CHECK (status BETWEEN 0 AND 3),
    title         text,
    attempts      integer     NOT NULL DEFAULT 0,
    max_attempts  integer     NOT NULL DEFAULT 5,
    lease_owner   text,
    leased_until  timestamptz,
    enqueued_at   timestamptz NOT NULL DEFAULT now(),
    dequeued_at   timestamptz,
    finished_at   timestamptz,
    last_error    text,
    PRIMARY KEY (id, gen)
) PARTITION BY LIST (gen);
CREATE INDEX meta_ready ON {{s}}.meta (priority, due_at, id) WHERE status = 0;
CREATE INDEX meta_leased ON {{s}}.meta (leased_until) WHERE status = 1;
-- no finished index: finished rows leave with their whole slot

CREATE TABLE {{s}}.data (
    gen      smallint NOT NULL,
    id       bigint   NOT NULL,
    payload  bytea    NOT NULL,
    headers  jsonb,
    PRIMARY KEY (id, gen)
) PARTITION BY LIST (gen);

DO $do$
BEGIN
    FOR g IN 0..{{k}} - 1 LOOP
        EXECUTE format('CREATE TABLE %I.%I PARTITION OF %I.meta FOR VALUES IN (%s) WITH (fillfactor = 80)',
                       {{s_lit}}, 'meta_' || g, {{s_lit}}, g);
        EXECUTE format('CREATE TABLE %I.%I PARTITION OF %I.data FOR VALUES IN (%s)',
                       {{s_lit}}, 'data_' || g, {{s_lit}}, g);
    END LOOP;
END
$do$;

CREATE TABLE {{s}}.history (
    id bigint PRIMARY KEY, priority smallint NOT NULL, due_at timestamptz NOT NULL,
    status smallint NOT NULL, title text, attempts integer NOT NULL, max_attempts integer NOT NULL,
    lease_owner text, enqueued_at timestamptz NOT NULL, dequeued_at timestamptz,
    finished_at timestamptz, last_error text, payload bytea, headers jsonb,
    archived_at timestamptz NOT NULL DEFAULT now()
);

-- The slot new rows go to now (read per statement: a sequence read is never stale).
CREATE FUNCTION {{s}}.cur_slot() RETURNS smallint LANGUAGE sql VOLATILE AS
$$ SELECT (last_value % {{k}})::smallint FROM {{s}}.epoch_cur $$;

CREATE FUNCTION {{s}}.enqueue(
    p_payload bytea, p_headers jsonb DEFAULT NULL, p_priority smallint DEFAULT 0,
    p_delay interval DEFAULT interval '0', p_title text DEFAULT NULL, p_max_attempts integer DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql AS $fn$
DECLARE
    v_id bigint;
BEGIN
    PERFORM pg_current_xact_id();  -- proof step 1: the xid before the epoch is read
    WITH m AS (
        INSERT INTO {{s}}.meta (gen, priority, due_at, title, max_attempts)
        VALUES ({{s}}.cur_slot(), coalesce(p_priority, 0), now() + coalesce(p_delay, interval '0'), p_title,
                coalesce(p_max_attempts, 5))
        RETURNING id, gen
    )
    INSERT INTO {{s}}.data (gen, id, payload, headers)
    SELECT m.gen, m.id, p_payload, p_headers FROM m
    RETURNING id INTO v_id;
    RETURN v_id;
END
$fn$;

-- The claim: reliable_0011's, with the READY walk limited to the open epochs (one, or two
-- between a switch and its seal). epoch_sealed is read before epoch_cur (proof step 3).
CREATE FUNCTION {{s}}.dequeue(
    p_batch integer DEFAULT 1, p_lease_seconds double precision DEFAULT 30, p_worker text DEFAULT NULL
) RETURNS TABLE (
    id bigint, priority smallint, due_at timestamptz, title text, attempts integer,
    max_attempts integer, enqueued_at timestamptz, dequeued_at timestamptz,
    leased_until timestamptz, payload bytea, headers jsonb
)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
DECLARE
    v_sealed bigint := (SELECT last_value FROM {{s}}.epoch_sealed);
    v_cur    bigint := (SELECT last_value FROM {{s}}.epoch_cur);
    v_b      smallint := (v_cur % {{k}})::smallint;
    v_a      smallint := (CASE WHEN v_sealed >= v_cur - 1 THEN v_cur ELSE v_cur - 1 END % {{k}})::smallint;
BEGIN
    RETURN QUERY
    WITH expired AS MATERIALIZED (
        SELECT m.id FROM {{s}}.meta m
        WHERE m.status = 1 AND m.leased_until < now()
        ORDER BY m.leased_until
        LIMIT greatest(p_batch, 0)
        FOR UPDATE SKIP LOCKED
    ), ready AS MATERIALIZED (
        SELECT m.id FROM {{s}}.meta m
        WHERE m.gen IN (v_a, v_b) AND m.status = 0 AND m.due_at <= now()
        ORDER BY m.priority, m.due_at, m.id
        LIMIT greatest(p_batch - (SELECT count(*) FROM expired), 0)
        FOR UPDATE SKIP LOCKED
    ), claimed AS (
        UPDATE {{s}}.meta m SET
            status       = CASE WHEN m.status = 1 AND m.attempts >= m.max_attempts THEN 3 ELSE 1 END,
            attempts     = CASE WHEN m.status = 1 AND m.attempts >= m.max_attempts THEN m.attempts ELSE m.attempts + 1 END,
            lease_owner  = CASE WHEN m.status = 1 AND m.attempts >= m.max_attempts THEN m.lease_owner ELSE p_worker END,
            leased_until = CASE WHEN m.status = 1 AND m.attempts >= m.max_attempts THEN NULL
                                ELSE now() + make_interval(secs => coalesce(p_lease_seconds, 30)) END,
            dequeued_at  = CASE WHEN m.status = 1 AND m.attempts >= m.max_attempts THEN m.dequeued_at ELSE now() END,
            finished_at  = CASE WHEN m.status = 1 AND m.attempts >= m.max_attempts THEN now() END,
            last_error   = CASE WHEN m.status = 1 AND m.attempts >= m.max_attempts
                                THEN 'lease expired on its last attempt' ELSE m.last_error END
        WHERE m.id = ANY (ARRAY(SELECT e.id FROM expired e UNION ALL SELECT r.id FROM ready r))
        RETURNING m.id, m.priority, m.due_at, m.title, m.attempts, m.max_attempts,
                  m.enqueued_at, m.dequeued_at, m.leased_until, m.status
    ), payloads AS MATERIALIZED (
        SELECT d.id, d.payload, d.headers FROM {{s}}.data d
        WHERE d.id = ANY (ARRAY(SELECT c.id FROM claimed c WHERE c.status = 1))
    )
    SELECT c.id, c.priority, c.due_at, c.title, c.attempts, c.max_attempts, c.enqueued_at,
           c.dequeued_at, c.leased_until, p.payload, p.headers
    FROM claimed c JOIN payloads p ON p.id = c.id
    WHERE c.status = 1
    ORDER BY c.priority, c.due_at, c.id;
END
$fn$;

-- ack: in place, whichever slot the row is in.
CREATE FUNCTION {{s}}.ack(p_ids bigint[], p_worker text DEFAULT NULL) RETURNS integer
LANGUAGE plpgsql AS $fn$
DECLARE
    v_count integer;
BEGIN
    UPDATE {{s}}.meta m SET status = 2, finished_at = now(), leased_until = NULL
    WHERE m.id = ANY (p_ids) AND m.status::integer = 1 AND (p_worker IS NULL OR m.lease_owner = p_worker);
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END
$fn$;

CREATE FUNCTION {{s}}.extend_lease(p_ids bigint[], p_lease_seconds double precision DEFAULT 30,
                                   p_worker text DEFAULT NULL) RETURNS integer
LANGUAGE plpgsql AS $fn$
DECLARE
    v_count integer;
BEGIN
    UPDATE {{s}}.meta m SET leased_until = now() + make_interval(secs => p_lease_seconds)
    WHERE m.id = ANY (p_ids) AND m.status::integer = 1 AND (p_worker IS NULL OR m.lease_owner = p_worker);
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END
$fn$;

-- Leased rows back to READY in the CURRENT epoch (moved: proof steps 1, 4 and 6), with
-- their id, priority and (release) due_at, so they keep their place in the claim order.
-- p_backoff NULL: release (attempt given back, old due_at); else nack's backoff in seconds
-- (base * 2^(attempts-1), capped), and DEAD in place on the last attempt.
CREATE FUNCTION {{s}}.requeue(p_ids bigint[], p_error text, p_worker text,
                              p_base double precision, p_max double precision) RETURNS integer
LANGUAGE plpgsql AS $fn$
DECLARE
    v_dead integer;
    v_moved integer;
BEGIN
    PERFORM pg_current_xact_id();
    IF p_base IS NOT NULL THEN
        UPDATE {{s}}.meta m SET status = 3, finished_at = now(), leased_until = NULL, last_error = p_error
        WHERE m.id = ANY (p_ids) AND m.status::integer = 1 AND (p_worker IS NULL OR m.lease_owner = p_worker)
          AND m.attempts >= m.max_attempts;
        GET DIAGNOSTICS v_dead = ROW_COUNT;
    END IF;
    WITH gone AS (
        DELETE FROM {{s}}.meta m
        WHERE m.id = ANY (p_ids) AND m.status::integer = 1 AND (p_worker IS NULL OR m.lease_owner = p_worker)
          AND (p_base IS NULL OR m.attempts < m.max_attempts)
        RETURNING m.*
    ), back AS (
        INSERT INTO {{s}}.meta (gen, id, priority, due_at, status, title, attempts, max_attempts, lease_owner,
                                leased_until, enqueued_at, dequeued_at, finished_at, last_error)
        SELECT {{s}}.cur_slot(), g.id, g.priority,
               CASE WHEN p_base IS NULL THEN g.due_at
                    ELSE now() + make_interval(secs => least(p_base * power(2, least(greatest(g.attempts - 1, 0), 40)), p_max)) END,
               0, g.title, CASE WHEN p_base IS NULL THEN greatest(g.attempts - 1, 0) ELSE g.attempts END,
               g.max_attempts, NULL, NULL, g.enqueued_at, g.dequeued_at, NULL,
               CASE WHEN p_base IS NULL THEN g.last_error ELSE p_error END
        FROM gone g
        RETURNING 1
    ), dgone AS (
        DELETE FROM {{s}}.data d WHERE d.id = ANY (ARRAY(SELECT g.id FROM gone g))
        RETURNING d.id, d.payload, d.headers
    ), dback AS (
        INSERT INTO {{s}}.data (gen, id, payload, headers)
        SELECT {{s}}.cur_slot(), dg.id, dg.payload, dg.headers FROM dgone dg
    )
    SELECT count(*) INTO v_moved FROM back;
    RETURN coalesce(v_dead, 0) + v_moved;
END
$fn$;

-- reliable_0008's plan guard, for the same reasons (set_plan_guard in reliable.sql).
ALTER FUNCTION {{s}}.dequeue(integer, double precision, text) SET enable_seqscan = off SET jit = off;
ALTER FUNCTION {{s}}.ack(bigint[], text) SET enable_seqscan = off SET jit = off;
ALTER FUNCTION {{s}}.extend_lease(bigint[], double precision, text) SET enable_seqscan = off SET jit = off;
ALTER FUNCTION {{s}}.requeue(bigint[], text, text, double precision, double precision) SET enable_seqscan = off SET jit = off;

-- The rotation state in one row, for the rotator and the probe's samples.
CREATE FUNCTION {{s}}.rot_state(
    OUT cur bigint, OUT sealed bigint, OUT truncated bigint, OUT bound bigint,
    OUT start_id bigint, OUT start_ms bigint, OUT last_id bigint
) LANGUAGE sql VOLATILE AS $$
    SELECT (SELECT last_value FROM {{s}}.epoch_cur), (SELECT last_value FROM {{s}}.epoch_sealed),
           (SELECT last_value FROM {{s}}.epoch_truncated), (SELECT last_value FROM {{s}}.seal_bound),
           (SELECT last_value FROM {{s}}.epoch_start_id), (SELECT last_value FROM {{s}}.epoch_start_ms),
           (SELECT last_value FROM {{s}}.id_seq)
$$;

-- Switch new items to the next epoch when the current one holds p_items items or is
-- p_seconds old, the previous one is sealed and the next slot is free. Returns the new
-- epoch, or NULL (nothing to do, or not possible yet: the reason is in the probe's log).
CREATE FUNCTION {{s}}.rot_switch(p_items bigint, p_seconds double precision) RETURNS bigint
LANGUAGE plpgsql AS $fn$
DECLARE
    st record := {{s}}.rot_state();
    v_now_ms bigint := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;
BEGIN
    IF st.sealed < st.cur - 1 OR st.truncated < st.cur + 1 - {{k}} THEN
        RETURN NULL;
    END IF;
    IF st.last_id - st.start_id < p_items AND v_now_ms - st.start_ms < p_seconds * 1000 THEN
        RETURN NULL;
    END IF;
    PERFORM setval({{seq_seal_bound}}, 0, true);   -- unknown until recorded below
    PERFORM setval({{seq_epoch_start_id}}, st.last_id, true);
    PERFORM setval({{seq_epoch_start_ms}}, v_now_ms, true);
    PERFORM setval({{seq_epoch_cur}}, st.cur + 1, true);
    -- proof step 2: a snapshot taken after the switch; its xmax is above every xid
    -- assigned before it (this statement's own snapshot is new: the function is volatile)
    PERFORM setval({{seq_seal_bound}}, pg_snapshot_xmax(pg_current_snapshot())::text::bigint, true);
    RETURN st.cur + 1;
END
$fn$;

-- Seal epoch cur-1 (proof step 3): returns how many READY rows moved to cur, or NULL if
-- there is nothing to seal or a writer older than the switch still runs. The caller marks
-- the epoch sealed (rot_mark) only after this transaction committed.
CREATE FUNCTION {{s}}.rot_seal() RETURNS bigint
LANGUAGE plpgsql AS $fn$
DECLARE
    st record := {{s}}.rot_state();
    v_old smallint;
    v_moved bigint;
BEGIN
    IF st.sealed >= st.cur - 1 THEN
        RETURN NULL;
    END IF;
    IF st.bound = 0 THEN  -- a switch interrupted before it recorded its bound: any later xmax is safe
        PERFORM setval({{seq_seal_bound}}, pg_snapshot_xmax(pg_current_snapshot())::text::bigint, true);
        RETURN NULL;
    END IF;
    IF pg_snapshot_xmin(pg_current_snapshot())::text::bigint < st.bound THEN
        RETURN NULL;
    END IF;
    v_old := ((st.cur - 1) % {{k}})::smallint;
    WITH gone AS (
        DELETE FROM {{s}}.meta m WHERE m.gen = v_old AND m.status = 0 RETURNING m.*
    ), back AS (
        INSERT INTO {{s}}.meta SELECT {{s}}.cur_slot(), g.id, g.priority, g.due_at, g.status, g.title, g.attempts,
            g.max_attempts, g.lease_owner, g.leased_until, g.enqueued_at, g.dequeued_at, g.finished_at, g.last_error
        FROM gone g RETURNING 1
    ), dgone AS (
        DELETE FROM {{s}}.data d WHERE d.gen = v_old AND d.id = ANY (ARRAY(SELECT g.id FROM gone g))
        RETURNING d.id, d.payload, d.headers
    ), dback AS (
        INSERT INTO {{s}}.data (gen, id, payload, headers) SELECT {{s}}.cur_slot(), dg.id, dg.payload, dg.headers FROM dgone dg
    )
    SELECT count(*) INTO v_moved FROM back;
    RETURN v_moved;
END
$fn$;

-- Record a step the caller's previous transaction completed (a separate transaction:
-- sequences are not rolled back, so they move only once the work is committed).
CREATE FUNCTION {{s}}.rot_mark(p_what text, p_epoch bigint) RETURNS void
LANGUAGE plpgsql AS $fn$
BEGIN
    IF p_what = 'sealed' AND (SELECT last_value FROM {{s}}.epoch_sealed) < p_epoch THEN
        PERFORM setval({{seq_epoch_sealed}}, p_epoch, true);
    ELSIF p_what = 'truncated' AND (SELECT last_value FROM {{s}}.epoch_truncated) < p_epoch THEN
        PERFORM setval({{seq_epoch_truncated}}, p_epoch, true);
    END IF;
END
$fn$;

-- Copy the DONE/DEAD rows of a slot, with their payloads, to history, those not there yet.
CREATE FUNCTION {{s}}.archive_slot(p_slot smallint) RETURNS bigint
LANGUAGE plpgsql AS $fn$
DECLARE
    v_copied bigint;
BEGIN
    INSERT INTO {{s}}.history (id, priority, due_at, status, title, attempts, max_attempts, lease_owner,
                               enqueued_at, dequeued_at, finished_at, last_error, payload, headers)
    SELECT m.id, m.priority, m.due_at, m.status, m.title, m.attempts, m.max_attempts, m.lease_owner,
           m.enqueued_at, m.dequeued_at, m.finished_at, m.last_error, d.payload, d.headers
    FROM {{s}}.meta m JOIN {{s}}.data d ON d.id = m.id AND d.gen = m.gen
    WHERE m.gen = p_slot AND m.status >= 2
      AND NOT EXISTS (SELECT 1 FROM {{s}}.history h WHERE h.id = m.id);
    GET DIAGNOSTICS v_copied = ROW_COUNT;
    RETURN v_copied;
END
$fn$;

-- Archive the oldest sealed epoch's finished rows ahead of its truncate, without its lock
-- (DONE and DEAD rows never change again), so the truncate copies only what finished
-- since. Returns the rows copied, or NULL when no sealed epoch waits.
CREATE FUNCTION {{s}}.rot_precopy() RETURNS bigint
LANGUAGE plpgsql AS $fn$
DECLARE
    st record := {{s}}.rot_state();
BEGIN
    IF st.truncated + 1 > st.sealed THEN
        RETURN NULL;
    END IF;
    RETURN {{s}}.archive_slot(((st.truncated + 1) % {{k}})::smallint);
END
$fn$;

-- Archive and empty the oldest sealed epoch (proof step 5), under lock_timeout (ms).
-- Returns NULL when no sealed epoch waits; raises lock_not_available (55P03) when the
-- slot's tables stay locked past the timeout (the caller retries later).
CREATE FUNCTION {{s}}.rot_truncate(p_lock_timeout_ms integer, OUT epoch bigint, OUT copied bigint,
                                   OUT moved bigint, OUT lock_ms double precision, OUT work_ms double precision,
                                   OUT copy_ms double precision, OUT truncate_ms double precision)
LANGUAGE plpgsql AS $fn$
DECLARE
    st record := {{s}}.rot_state();
    v_slot smallint;
    v_cur smallint;
    t0 timestamptz;
    t1 timestamptz;
BEGIN
    epoch := st.truncated + 1;
    IF epoch > st.sealed THEN
        epoch := NULL;
        RETURN;
    END IF;
    v_slot := (epoch % {{k}})::smallint;
    v_cur := (st.cur % {{k}})::smallint;
    PERFORM set_config('lock_timeout', p_lock_timeout_ms || 'ms', true);
    t0 := clock_timestamp();
    EXECUTE format('LOCK TABLE %I.%I, %I.%I IN ACCESS EXCLUSIVE MODE',
                   {{s_lit}}, 'meta_' || v_slot, {{s_lit}}, 'data_' || v_slot);
    t1 := clock_timestamp();
    lock_ms := extract(epoch FROM t1 - t0) * 1000;
    copied := {{s}}.archive_slot(v_slot);
    copy_ms := extract(epoch FROM clock_timestamp() - t1) * 1000;
    INSERT INTO {{s}}.data (gen, id, payload, headers)
    SELECT v_cur, d.id, d.payload, d.headers
    FROM {{s}}.data d JOIN {{s}}.meta m ON m.id = d.id AND m.gen = d.gen
    WHERE d.gen = v_slot AND m.status < 2;
    INSERT INTO {{s}}.meta SELECT v_cur, m.id, m.priority, m.due_at, m.status, m.title, m.attempts,
        m.max_attempts, m.lease_owner, m.leased_until, m.enqueued_at, m.dequeued_at, m.finished_at, m.last_error
    FROM {{s}}.meta m WHERE m.gen = v_slot AND m.status < 2;
    GET DIAGNOSTICS moved = ROW_COUNT;
    t0 := clock_timestamp();
    EXECUTE format('TRUNCATE %I.%I, %I.%I', {{s_lit}}, 'meta_' || v_slot, {{s_lit}}, 'data_' || v_slot);
    truncate_ms := extract(epoch FROM clock_timestamp() - t0) * 1000;
    work_ms := extract(epoch FROM clock_timestamp() - t1) * 1000;
END
$fn$;

-- name: drop
DROP SCHEMA IF EXISTS {{s}} CASCADE;

-- name: slot_stats
-- Per slot of the rotated queue: rows by status, dead rows, sizes (meta and data with
-- indexes and TOAST), and index entries returned by scans of the ready and leased
-- indexes so far (entries a claim walks: live, and dead ones not yet killed).
SELECT c.relname, (regexp_match(c.relname, '_(\d+)$'))[1]::int AS slot,
       s.n_live_tup, s.n_dead_tup, pg_total_relation_size(c.oid) AS bytes,
       coalesce((SELECT sum(i.idx_tup_read) FROM pg_stat_user_indexes i
                 WHERE i.relid = c.oid AND i.indexrelname ~ '(ready|priority_due_at_id)'), 0) AS ready_read,
       coalesce((SELECT sum(i.idx_tup_read) FROM pg_stat_user_indexes i
                 WHERE i.relid = c.oid AND i.indexrelname ~ 'leased'), 0) AS leased_read,
       s.autovacuum_count
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_stat_user_tables s ON s.relid = c.oid
WHERE n.nspname = {{s_lit}} AND c.relkind = 'r' AND c.relname ~ '^(meta|data)_\d+$'
ORDER BY c.relname

-- name: queue_stats
-- The same totals for any queue: the named tables (a text[] parameter of qualified names),
-- dead rows, bytes, and index entries read from indexes whose name matches ready / leased.
SELECT sum(s.n_dead_tup) AS dead, sum(pg_total_relation_size(s.relid)) AS bytes,
       sum(s.autovacuum_count) AS autovacuums,
       coalesce(sum((SELECT sum(i.idx_tup_read) FROM pg_stat_user_indexes i
                     WHERE i.relid = s.relid AND i.indexrelname ~ '(ready|priority_due_at_id)')), 0) AS ready_read,
       coalesce(sum((SELECT sum(i.idx_tup_read) FROM pg_stat_user_indexes i
                     WHERE i.relid = s.relid AND i.indexrelname ~ 'leased')), 0) AS leased_read
FROM unnest(CAST(%s AS text[])) AS t(name)
JOIN pg_stat_user_tables s ON s.relid = to_regclass(t.name)

-- name: bystander
-- The unrelated table the pinning session reads (and a bystander query could time).
CREATE SCHEMA IF NOT EXISTS {{by}};
CREATE TABLE IF NOT EXISTS {{by}}.bystander (id int PRIMARY KEY, v text);
INSERT INTO {{by}}.bystander SELECT g, md5(g::text) FROM generate_series(1, 1000) g ON CONFLICT DO NOTHING

-- name: rotation_blockers
-- Who holds or waits for a lock on the rotated queue's slots: what health would report
-- when the truncate cannot get its lock (a pinning session that read the queue holds
-- ACCESS SHARE until it ends).
SELECT DISTINCT l.pid, c.relname, l.mode, l.granted, a.state, a.xact_start,
       now() - a.xact_start AS xact_age
FROM pg_locks l JOIN pg_class c ON c.oid = l.relation JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_stat_activity a ON a.pid = l.pid
WHERE n.nspname = {{s_lit}} AND c.relname ~ '^(meta|data)_\d+$' AND l.pid <> pg_backend_pid()
  AND a.xact_start < now() - interval '5 seconds'
ORDER BY a.xact_start

-- name: schema_create
-- The reliable queue's own schema for the probe (its queue is installed by the product).
CREATE SCHEMA IF NOT EXISTS {{schema}}

-- name: schema_drop
DROP SCHEMA IF EXISTS {{schema}} CASCADE

-- name: load_enqueue
-- The load's calls, the same for both designs ({{fn_*}}: the queue's functions).
SELECT {{fn_enqueue}}(%s)

-- name: load_dequeue
SELECT id, extract(epoch FROM enqueued_at) FROM {{fn_dequeue}}(%s, 30, %s)

-- name: load_ack
SELECT {{fn_ack}}(%s, %s)

-- name: load_explain
-- One dequeue(10) with its buffers, the function's own statements included (the caller
-- rolls it back).
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF) SELECT * FROM {{fn_dequeue}}(10)

-- name: history_bytes
SELECT pg_total_relation_size(to_regclass(%s))

-- name: pin_bystander
-- The pinning session's read of an unrelated table (its snapshot pins the xmin horizon).
SELECT count(*) FROM {{by}}.bystander

-- name: pin_queue
-- The pinning session's read of the queue (ACCESS SHARE on every slot until it ends).
SELECT count(*) FROM {{meta}}

-- name: server_settings
SELECT name, setting FROM pg_settings
WHERE name IN ('autovacuum', 'autovacuum_naptime', 'server_version', 'fsync', 'synchronous_commit')

-- name: rot_state
SELECT * FROM {{s}}.rot_state()

-- name: rot_seal
SELECT {{s}}.rot_seal()

-- name: rot_mark
SELECT {{s}}.rot_mark(%s, %s)

-- name: rot_precopy
SELECT {{s}}.rot_precopy()

-- name: rot_truncate
SELECT * FROM {{s}}.rot_truncate(%s)

-- name: rot_switch
SELECT {{s}}.rot_switch(%s, %s)

-- name: check_enqueue
-- The concurrency check's calls: an item with a priority and a delay (seconds).
SELECT {{s}}.enqueue(%s, NULL, %s, make_interval(secs => %s))

-- name: check_dequeue
-- A claim of 5 with a 2 s lease (dropped items come back soon).
SELECT id FROM {{s}}.dequeue(5, 2, %s)

-- name: check_nack
SELECT {{s}}.requeue(%s, 'failed', %s, 0.2, 1.0)

-- name: check_release
SELECT {{s}}.requeue(%s, NULL, %s, NULL, NULL)

-- name: check_seen
-- Rows of the queue in meta and in history, as the caller's snapshot sees them.
SELECT (SELECT count(*) FROM {{s}}.meta), (SELECT count(*) FROM {{s}}.history)

-- name: check_unfinished
SELECT count(*) FROM {{s}}.meta WHERE status < 2

-- name: check_ids
-- Every id in meta or history (an id twice is a duplicate).
SELECT id FROM {{s}}.meta UNION ALL SELECT id FROM {{s}}.history

-- name: check_by_status
SELECT status, count(*) FROM (SELECT status FROM {{s}}.meta UNION ALL SELECT status FROM {{s}}.history) x
GROUP BY 1

-- name: check_data_missing
-- meta rows without their payload in the same slot.
SELECT count(*) FROM {{s}}.meta m
WHERE NOT EXISTS (SELECT 1 FROM {{s}}.data d WHERE d.id = m.id AND d.gen = m.gen)
