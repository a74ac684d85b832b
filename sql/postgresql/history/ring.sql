-- Ring sections that later revisions replaced on PostgreSQL, each named for the revision that
-- installed it: a queue installed at an older revision runs it, and so does the downgrade
-- that puts the body back. What a fresh install creates today is in ../ring.sql.

-- name: create_enqueue_0001
-- The single push as ring_0001 made it: one position per statement. Every body here but
-- create_ring_release_0001's is CREATE OR REPLACE, so that a downgrade restores it by
-- running its section again.
-- push (enqueue) one message; returns its position (its id), or NULL if the ring stayed
-- full for p_timeout seconds (the claimed position is kept for this session's next push).
CREATE OR REPLACE FUNCTION {{fn_enqueue}}(
    p_payload bytea,
    p_headers jsonb            DEFAULT NULL,
    p_timeout double precision DEFAULT 1.0
) RETURNS bigint
LANGUAGE plpgsql AS $fn$
DECLARE
    v_key      text := 'queuectl.rpush' || {{ring_regclass}}::regclass::oid;
    v_pos      bigint := nullif(current_setting(v_key, true), '')::bigint;
    v_deadline timestamptz := clock_timestamp() + make_interval(secs => greatest(coalesce(p_timeout, 0), 0));
    v_pause    double precision := 0.001;
    v_held     bigint;
BEGIN
    LOOP
        IF v_pos IS NULL THEN
            v_pos := nextval({{push_seq_regclass}}::regclass);
        END IF;
        UPDATE {{ring}} r
        SET msg_id = v_pos, state = 1, payload = p_payload, headers = p_headers,
            pushed_at = clock_timestamp(), changed_at = clock_timestamp()
        FROM (SELECT f.slot FROM {{ring}} f
              WHERE f.slot = mod(v_pos, {{size}}) AND f.msg_id = v_pos - {{size}} AND f.state <> 1
              FOR UPDATE SKIP LOCKED) f
        WHERE r.slot = f.slot;
        IF FOUND THEN
            PERFORM set_config(v_key, '', false);
            RETURN v_pos;
        END IF;
        SELECT h.msg_id INTO v_held FROM {{ring}} h WHERE h.slot = mod(v_pos, {{size}});
        IF v_held >= v_pos THEN
            v_pos := NULL;  -- ring_repair tombstoned our claim (we looked dead): take a new one
            CONTINUE;
        END IF;
        IF clock_timestamp() >= v_deadline THEN
            PERFORM set_config(v_key, v_pos::text, false);
            RETURN NULL;  -- full: the slot still holds v - size unpopped
        END IF;
        PERFORM pg_sleep(least(v_pause, greatest(extract(epoch FROM v_deadline - clock_timestamp()), 0)));
        v_pause := least(v_pause * 2, 0.05);
    END LOOP;
END
$fn$;

-- name: create_enqueue_many_0001
-- The batch push as ring_0001 made it: the single push once per payload.
-- push many messages, one position each, in array order; returns their positions. Stops
-- early when the ring stays full for p_timeout seconds (fewer positions come back).
CREATE OR REPLACE FUNCTION {{fn_enqueue_many}}(
    p_payloads bytea[],
    p_headers  jsonb[]          DEFAULT NULL,
    p_timeout  double precision DEFAULT 1.0
) RETURNS SETOF bigint
LANGUAGE plpgsql AS $fn$
DECLARE
    v_pos bigint;
BEGIN
    FOR i IN 1 .. coalesce(cardinality(p_payloads), 0) LOOP
        v_pos := {{fn_enqueue}}(p_payloads[i], p_headers[i], p_timeout);
        EXIT WHEN v_pos IS NULL;
        RETURN NEXT v_pos;
    END LOOP;
END
$fn$;

-- name: create_dequeue_0001
-- The pop as ring_0001 made it: one position per statement.
-- pop (dequeue) up to p_batch messages in position order. Waits up to p_timeout seconds
-- for the first one only; returns what it has as soon as the next is not there yet.
CREATE OR REPLACE FUNCTION {{fn_dequeue}}(p_batch integer DEFAULT 1, p_timeout double precision DEFAULT 0)
RETURNS TABLE (id bigint, payload bytea, headers jsonb, enqueued_at timestamptz, dequeued_at timestamptz)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
DECLARE
    v_key      text := 'queuectl.rpop' || {{ring_regclass}}::regclass::oid;
    v_pos      bigint := nullif(current_setting(v_key, true), '')::bigint;
    v_deadline timestamptz := clock_timestamp() + make_interval(secs => greatest(coalesce(p_timeout, 0), 0));
    v_pause    double precision := 0.001;
    v_taken    integer := 0;
    v_got      record;
    v_held     record;
BEGIN
    WHILE v_taken < p_batch LOOP
        IF v_pos IS NULL THEN
            v_pos := nextval({{pop_seq_regclass}}::regclass);
        END IF;
        WITH f AS MATERIALIZED (
            SELECT s.slot, s.payload, s.headers, s.pushed_at FROM {{ring}} s
            WHERE s.slot = mod(v_pos, {{size}}) AND s.msg_id = v_pos AND s.state = 1
            FOR UPDATE SKIP LOCKED
        ), u AS (
            UPDATE {{ring}} r SET state = 0, payload = NULL, headers = NULL, changed_at = clock_timestamp()
            FROM f WHERE r.slot = f.slot
            RETURNING r.slot
        )
        SELECT f.payload, f.headers, f.pushed_at INTO v_got FROM f JOIN u ON u.slot = f.slot;
        IF FOUND THEN
            id := v_pos;
            payload := v_got.payload;
            headers := v_got.headers;
            enqueued_at := v_got.pushed_at;
            dequeued_at := now();
            RETURN NEXT;
            v_taken := v_taken + 1;
            v_pos := NULL;
            CONTINUE;
        END IF;
        SELECT h.msg_id, h.state INTO v_held FROM {{ring}} h WHERE h.slot = mod(v_pos, {{size}});
        IF v_held.msg_id > v_pos OR (v_held.msg_id = v_pos AND v_held.state <> 1) THEN
            v_pos := NULL;  -- skipped or rescued by ring_repair: take the next position
            CONTINUE;
        END IF;
        -- not pushed yet (or its push not committed): wait only while we have nothing
        EXIT WHEN v_taken > 0 OR clock_timestamp() >= v_deadline;
        PERFORM pg_sleep(least(v_pause, greatest(extract(epoch FROM v_deadline - clock_timestamp()), 0)));
        v_pause := least(v_pause * 2, 0.05);
    END LOOP;
    PERFORM set_config(v_key, coalesce(v_pos::text, ''), false);
    RETURN;
END
$fn$;

-- name: create_ring_release_0001
-- ring_release as ring_0001 made it: give up this session's kept claims (a client closing
-- its connection, or a pooled connection going back to its pool), tombstoning each one
-- whose slot is free for it. Returns the released positions. A section of its own, so
-- that ring_0002 replaces it (create_ring_release_0002) and its downgrade restores it.
CREATE FUNCTION {{fn_ring_release}}()
RETURNS TABLE (side text, item_id bigint, tombstoned boolean)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
DECLARE
    v_push text := 'queuectl.rpush' || {{ring_regclass}}::regclass::oid;
    v_pop  text := 'queuectl.rpop' || {{ring_regclass}}::regclass::oid;
    v_pos  bigint;
BEGIN
    v_pos := nullif(current_setting(v_push, true), '')::bigint;
    IF v_pos IS NOT NULL THEN
        -- our own claim: safe to tombstone at once when its slot is free for it
        UPDATE {{ring}} r SET msg_id = v_pos, state = 2, payload = NULL, headers = NULL,
                              changed_at = clock_timestamp()
        WHERE r.slot = mod(v_pos, {{size}}) AND r.msg_id = v_pos - {{size}} AND r.state <> 1;
        side := 'push'; item_id := v_pos; tombstoned := FOUND;
        RETURN NEXT;
        PERFORM set_config(v_push, '', false);
    END IF;
    v_pos := nullif(current_setting(v_pop, true), '')::bigint;
    IF v_pos IS NOT NULL THEN
        -- a pop claim whose push has not happened yet: tombstone the position before a
        -- push fills it (that push then takes the next position), so nothing is orphaned
        UPDATE {{ring}} r SET msg_id = v_pos, state = 2, payload = NULL, headers = NULL,
                              changed_at = clock_timestamp()
        WHERE r.slot = mod(v_pos, {{size}}) AND r.msg_id = v_pos - {{size}} AND r.state <> 1;
        side := 'pop'; item_id := v_pos; tombstoned := FOUND;
        RETURN NEXT;
        PERFORM set_config(v_pop, '', false);
    END IF;
END
$fn$;

-- name: drop_ring_release_0001
-- Remove ring_0001's ring_release.
DROP FUNCTION IF EXISTS {{fn_ring_release}}();

-- name: create_ring_release_0002
-- ring_release as ring_0002 made it: give up this session's kept claims, as ring_0001's does,
-- and close the race that version leaves to ring_repair: the push of the pop claim's position
-- v committed after this session's last pop looked for it. The slot then holds v FULL, so no
-- tombstone can go in, and no pop will ever ask for v again: the message is this session's
-- own, so it is re-pushed at once (no grace) at a new position, exactly as ring_repair rescues
-- an orphan: the old slot is marked RESCUED and the payload and headers go through the enqueue
-- function, waiting up to p_timeout seconds for a free slot. If the ring stays full that long,
-- the rescue rolls back and the message stays FULL at v for ring_repair (its grace, then the
-- same rescue); the position the failed push drew is a hole that ring_repair tombstones. One
-- row per claim:
--   outcome 'tombstoned': the slot was free for the claim, a tombstone went in;
--           'rescued':    a pop claim's message was re-pushed at new_item_id;
--           'deferred':   a pop claim's message stayed FULL (ring full): left to ring_repair;
--           'left':       the slot was not free for the claim (the ring full at that slot,
--                         or ring_repair already passed the position, or busy there now):
--                         whatever arrives there later is ring_repair's, as in ring_0001.
-- side, item_id and tombstoned are ring_0001's columns, unchanged.
-- CREATE OR REPLACE: ring_0003's downgrade runs this section again to restore it.
CREATE OR REPLACE FUNCTION {{fn_ring_release}}(p_timeout double precision DEFAULT 0.1)
RETURNS TABLE (side text, item_id bigint, tombstoned boolean, new_item_id bigint, outcome text)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
DECLARE
    v_push text := 'queuectl.rpush' || {{ring_regclass}}::regclass::oid;
    v_pop  text := 'queuectl.rpop' || {{ring_regclass}}::regclass::oid;
    v_pos  bigint;
    v_msg  record;
BEGIN
    v_pos := nullif(current_setting(v_push, true), '')::bigint;
    IF v_pos IS NOT NULL THEN
        -- our own claim: safe to tombstone at once when its slot is free for it
        UPDATE {{ring}} r SET msg_id = v_pos, state = 2, payload = NULL, headers = NULL,
                              changed_at = clock_timestamp()
        WHERE r.slot = mod(v_pos, {{size}}) AND r.msg_id = v_pos - {{size}} AND r.state <> 1;
        side := 'push'; item_id := v_pos; tombstoned := FOUND; new_item_id := NULL;
        outcome := CASE WHEN tombstoned THEN 'tombstoned' ELSE 'left' END;
        RETURN NEXT;
        -- cleared before a rescue below pushes: that push must draw a position of its own
        PERFORM set_config(v_push, '', false);
    END IF;
    v_pos := nullif(current_setting(v_pop, true), '')::bigint;
    IF v_pos IS NOT NULL THEN
        -- a pop claim whose push has not happened yet: tombstone the position before a
        -- push fills it (that push then takes the next position), so nothing is orphaned.
        -- A push of v in flight holds the slot's row lock: this waits for it, then sees
        -- its outcome (rolled back: the tombstone goes in; committed: v is FULL, below).
        UPDATE {{ring}} r SET msg_id = v_pos, state = 2, payload = NULL, headers = NULL,
                              changed_at = clock_timestamp()
        WHERE r.slot = mod(v_pos, {{size}}) AND r.msg_id = v_pos - {{size}} AND r.state <> 1;
        side := 'pop'; item_id := v_pos; tombstoned := FOUND; new_item_id := NULL;
        outcome := CASE WHEN tombstoned THEN 'tombstoned' ELSE 'left' END;
        IF NOT tombstoned THEN
            -- the race: v's push committed after our last pop looked. SKIP LOCKED: a slot
            -- locked now is ring_repair rescuing it already, never to be waited for here.
            SELECT s.payload, s.headers INTO v_msg FROM {{ring}} s
            WHERE s.slot = mod(v_pos, {{size}}) AND s.msg_id = v_pos AND s.state = 1
            FOR UPDATE SKIP LOCKED;
            IF FOUND THEN
                BEGIN
                    UPDATE {{ring}} r SET state = 3, payload = NULL, headers = NULL, changed_at = clock_timestamp()
                    WHERE r.slot = mod(v_pos, {{size}});
                    new_item_id := {{fn_enqueue}}(v_msg.payload, v_msg.headers, p_timeout);
                    IF new_item_id IS NULL THEN
                        RAISE EXCEPTION USING ERRCODE = 'QR001', MESSAGE = 'ring full';
                    END IF;
                    outcome := 'rescued';
                EXCEPTION WHEN SQLSTATE 'QR001' THEN
                    -- the ring stayed full: this block rolled back (the slot is FULL at v
                    -- again, and the push claim the enqueue kept is gone with it)
                    outcome := 'deferred';
                END;
            END IF;
        END IF;
        RETURN NEXT;
        PERFORM set_config(v_pop, '', false);
    END IF;
END
$fn$;

-- name: create_enqueue_many_0003
-- The batch push as ring_0003 made it: set-based (../ring.sql, create_enqueue_many, says how)
-- in a loop of statements, where ring_0005's push does the common case in one.
CREATE OR REPLACE FUNCTION {{fn_enqueue_many}}(
    p_payloads bytea[],
    p_headers  jsonb[]          DEFAULT NULL,
    p_timeout  double precision DEFAULT 1.0
) RETURNS SETOF bigint
LANGUAGE plpgsql AS $fn$
DECLARE
    v_key      text := 'queuectl.rpush' || {{ring_regclass}}::regclass::oid;
    v_kept     bigint[] := coalesce(string_to_array(nullif(current_setting(v_key, true), ''), ',')::bigint[], '{}');
    v_n        integer := coalesce(cardinality(p_payloads), 0);
    v_claims   bigint[];
    v_done     integer := 0;
    v_run      integer;
    v_pos      bigint;
    v_held     bigint;
    v_deadline timestamptz := clock_timestamp() + make_interval(secs => greatest(coalesce(p_timeout, 0), 0));
    v_pause    double precision := 0.001;
BEGIN
    IF v_n = 0 THEN
        RETURN;
    END IF;
    v_claims := v_kept[1:v_n] || ARRAY(
        SELECT nextval({{push_seq_regclass}}::regclass)
        FROM generate_series(1, v_n - least(cardinality(v_kept), v_n)));
    v_kept := v_kept[v_n + 1:];
    LOOP
        -- one statement: lock the slots free for the unwritten claims, and write the
        -- longest run of them from the first unwritten claim (ordinals below the first
        -- claim not locked), so array order is never broken
        RETURN QUERY
        WITH c AS (
            SELECT u.pos, u.ord FROM unnest(v_claims[v_done + 1:]) WITH ORDINALITY AS u(pos, ord)
        ), locked AS MATERIALIZED (
            SELECT s.slot, c.pos, c.ord FROM c
            JOIN {{ring}} s ON s.slot = mod(c.pos, {{size}})
            WHERE s.msg_id = c.pos - {{size}} AND s.state <> 1
            FOR UPDATE OF s SKIP LOCKED
        ), run AS (
            SELECT l.slot, l.pos, l.ord FROM locked l
            WHERE l.ord < coalesce((SELECT min(c.ord) FROM c WHERE c.ord NOT IN (SELECT ord FROM locked)), v_n - v_done + 1)
        ), written AS (
            UPDATE {{ring}} r
            SET msg_id = run.pos, state = 1, payload = p_payloads[v_done + run.ord],
                headers = p_headers[v_done + run.ord], pushed_at = clock_timestamp(), changed_at = clock_timestamp()
            FROM run WHERE r.slot = run.slot
            RETURNING run.pos, run.ord
        )
        SELECT w.pos FROM written w ORDER BY w.ord;
        GET DIAGNOSTICS v_run = ROW_COUNT;
        v_done := v_done + v_run;
        EXIT WHEN v_done = v_n;
        v_pos := v_claims[v_done + 1];
        SELECT h.msg_id INTO v_held FROM {{ring}} h WHERE h.slot = mod(v_pos, {{size}});
        IF v_held >= v_pos THEN
            -- the claim was tombstoned (ring_repair: we looked dead; or our own release):
            -- drop it and claim a new position at the end, so positions stay in array order
            v_claims := v_claims[1:v_done] || v_claims[v_done + 2:] || nextval({{push_seq_regclass}}::regclass);
            CONTINUE;
        END IF;
        -- full there (the slot still holds an unpopped earlier lap), or busy right now
        EXIT WHEN clock_timestamp() >= v_deadline;
        PERFORM pg_sleep(least(v_pause, greatest(extract(epoch FROM v_deadline - clock_timestamp()), 0)));
        v_pause := least(v_pause * 2, 0.05);
    END LOOP;
    PERFORM set_config(v_key, array_to_string(v_claims[v_done + 1:] || v_kept, ','), false);
    RETURN;
END
$fn$;

-- name: create_dequeue_0003
-- The pop as ring_0003 made it: set-based, with a lock pass (FOR UPDATE SKIP LOCKED) before
-- the UPDATE that takes the slots, where ring_0005's pop takes them by UPDATE alone.
CREATE OR REPLACE FUNCTION {{fn_dequeue}}(p_batch integer DEFAULT 1, p_timeout double precision DEFAULT 0)
RETURNS TABLE (id bigint, payload bytea, headers jsonb, enqueued_at timestamptz, dequeued_at timestamptz)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
DECLARE
    v_key      text := 'queuectl.rpop' || {{ring_regclass}}::regclass::oid;
    v_claims   bigint[] := coalesce(string_to_array(nullif(current_setting(v_key, true), ''), ',')::bigint[], '{}');
    v_deadline timestamptz := clock_timestamp() + make_interval(secs => greatest(coalesce(p_timeout, 0), 0));
    v_pause    double precision := 0.001;
    v_taken    integer := 0;
    v_got      integer;
    v_need     integer;
    v_more     bigint;
BEGIN
    LOOP
        v_need := p_batch - v_taken;
        IF cardinality(v_claims) = 0 AND v_taken = 0 AND v_need = 1 THEN
            -- a pop of one with no claim claims one position whatever is pushed (below, the
            -- case "nothing pushed beyond the pops"): no need to look at the sequences
            v_claims := ARRAY[nextval({{pop_seq_regclass}}::regclass)];
        ELSIF cardinality(v_claims) < v_need THEN
            SELECT (SELECT CASE WHEN s.is_called THEN s.last_value ELSE s.last_value - 1 END FROM {{push_seq}} s)
                 - (SELECT CASE WHEN s.is_called THEN s.last_value ELSE s.last_value - 1 END FROM {{pop_seq}} s)
            INTO v_more;
            v_more := least(v_need - cardinality(v_claims), v_more);
            IF v_more < 1 AND cardinality(v_claims) = 0 AND v_taken = 0 THEN
                v_more := 1;  -- nothing pushed beyond the pops: claim the next position, wait for it
            END IF;
            IF v_more > 0 THEN
                v_claims := v_claims || ARRAY(SELECT nextval({{pop_seq_regclass}}::regclass) FROM generate_series(1, v_more));
            END IF;
        END IF;
        EXIT WHEN cardinality(v_claims) = 0;
        RETURN QUERY
        WITH f AS MATERIALIZED (
            SELECT s.slot, c.pos, s.payload, s.headers, s.pushed_at
            FROM unnest(v_claims) AS c(pos)
            JOIN {{ring}} s ON s.slot = mod(c.pos, {{size}})
            WHERE s.msg_id = c.pos AND s.state = 1
            ORDER BY c.pos
            LIMIT v_need
            FOR UPDATE OF s SKIP LOCKED
        ), u AS (
            UPDATE {{ring}} r SET state = 0, payload = NULL, headers = NULL, changed_at = clock_timestamp()
            FROM f WHERE r.slot = f.slot
            RETURNING r.slot
        )
        SELECT f.pos, f.payload, f.headers, f.pushed_at, now() FROM f JOIN u ON u.slot = f.slot ORDER BY f.pos;
        GET DIAGNOSTICS v_got = ROW_COUNT;
        v_taken := v_taken + v_got;
        -- keep the claims still to come: not pushed yet (the slot holds an earlier lap), or
        -- FULL but locked now or past this batch; drop the taken, skipped and rescued ones
        -- (all of them taken: nothing to look up)
        v_claims := CASE WHEN v_got = cardinality(v_claims) THEN '{}' ELSE ARRAY(
            SELECT c.pos FROM unnest(v_claims) AS c(pos)
            JOIN {{ring}} s ON s.slot = mod(c.pos, {{size}})
            WHERE s.msg_id < c.pos OR (s.msg_id = c.pos AND s.state = 1)
            ORDER BY c.pos) END;
        EXIT WHEN v_taken >= p_batch;
        CONTINUE WHEN v_got > 0 OR cardinality(v_claims) = 0;
        -- nothing there yet: wait only while we have nothing
        EXIT WHEN v_taken > 0 OR clock_timestamp() >= v_deadline;
        PERFORM pg_sleep(least(v_pause, greatest(extract(epoch FROM v_deadline - clock_timestamp()), 0)));
        v_pause := least(v_pause * 2, 0.05);
    END LOOP;
    PERFORM set_config(v_key, array_to_string(v_claims, ','), false);
    RETURN;
END
$fn$;
