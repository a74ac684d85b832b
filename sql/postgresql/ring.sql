-- The ring buffer queue on PostgreSQL: a preallocated table of slots.
--
-- <queue>_ring holds `size` rows, created at install and never inserted or deleted
-- again: push and pop only UPDATE them. Every message has a position, drawn from one of
-- two sequences (push_seq for pushes, pop_seq for pops); position v lives in slot
-- v mod size, and a slot records the position it holds now (msg_id) and its state:
--   0 EMPTY     position msg_id was popped
--   1 FULL      position msg_id holds a message waiting for its pop
--   2 SKIPPED   position msg_id never got a message (a tombstone written by ring_repair)
--   3 RESCUED   position msg_id's message was moved to a new position by ring_repair
-- A slot is free for position v when it holds v - size in any state but FULL.
--
-- push: take a position v (the session's kept claim, else nextval(push_seq)); update slot
--   v mod size if it is free for v; else the ring is full there: back off (1 ms doubling
--   to 50 ms) and retry until p_timeout, then return NULL and KEEP the claim in the
--   session for its next push (so a full ring does not leave holes).
-- pop: take a position v (the session's kept claim, else nextval(pop_seq)); update the
--   slot holding v if it is FULL; if that slot has moved past v (SKIPPED, RESCUED) take
--   the next position; else v is not pushed yet (queue empty, or pop ran ahead of push):
--   back off and retry until p_timeout, then return nothing and KEEP v for the next pop,
--   so no message is skipped. The pop's pick uses FOR UPDATE SKIP LOCKED and reads only
--   committed versions: a slot whose push has not committed still shows v - size to it.
--
-- Since ring_0003 a batch does the same in bulk: a push of
-- n claims n positions with one nextval() series and writes them with one UPDATE, a pop
-- claims up to n (never past what pushers have claimed) and takes every FULL one with one
-- UPDATE; the session may then keep several claims per side (a comma-separated list).
-- Since ring_0005 each of them is one statement in the common case,
-- and the pop takes its slots by UPDATE alone (no lock pass before it).
--
-- Updates never touch an indexed column (only the slot primary key is indexed) and the
-- table has fillfactor 50, so PostgreSQL can keep every update HOT (heap-only: no new
-- index entry, old versions pruned within the page).
--
-- Sequences are not transactional. What that leaves behind, and the repair:
--  * a PUSH that claims v and then dies, or rolls back, or is tombstoned: slot v mod size
--    stays at v - size, so pop v waits, and push v + size would find the slot never
--    freed for it one lap later. ring_repair() writes a tombstone (SKIPPED at v) into
--    such a slot once it has been free for longer than its grace: pops skip it, pushes
--    one lap later find the slot free. A live pusher whose claim was tombstoned notices
--    (the slot shows v or later) and takes a new position; its message was never stored.
--  * a POP that claims v and then dies (its session ends), or rolls back after taking
--    the message: message v stays FULL and no pop will ask for v again, so it would be
--    lost and its slot blocked for the next lap. ring_repair() finds FULL slots whose
--    position was already claimed by a pop (v <= pop_seq's last value) and that have
--    waited longer than the grace, re-pushes each message at a new position (its id
--    changes) and marks the old slot RESCUED, in one transaction per message. A live
--    popper that merely kept its claim and comes back later sees RESCUED and moves on,
--    so every message is still delivered exactly once.
--  * ring_release() (the Python client's close()) gives up the session's claims. A claim
--    whose slot is free for it is tombstoned at once (safe: the claim is ours, and a
--    push that later draws the same position sees the tombstone and takes the next one).
--    A pop claim whose message arrived in the meantime (its push committed between the
--    session's last pop and the release, so the slot holds it FULL) would be orphaned:
--    the claim is ours, so release rescues the message at once, as ring_repair does but
--    without the grace (since ring_0002). Otherwise (the ring is full at that slot, or
--    stays full for the rescue's push) the position is left to ring_repair() as above.
--  * a rescued message lands at a new push position; if the pop claim for that position
--    is itself abandoned, the next ring_repair() run moves it again.
--
-- Sections are filled by queuectl.sqlfiles.render() with quoted identifiers only.

-- name: create_tables
-- The slots (all of them, now), and the two position sequences.
CREATE TABLE {{ring}} (
    slot       integer     PRIMARY KEY,
    msg_id     bigint      NOT NULL,
    state      smallint    NOT NULL DEFAULT 0 CHECK (state BETWEEN 0 AND 3),
    payload    bytea,
    headers    jsonb,
    pushed_at  timestamptz,
    changed_at timestamptz NOT NULL DEFAULT now()
) WITH (fillfactor = 50);
-- fillfactor 50: half of every page stays free for the new versions of its rows, so an
-- update finds room on the same page and stays HOT; pruning frees the old versions.

-- slot s starts as "position s - size was popped": free for the first lap's position s.
INSERT INTO {{ring}} (slot, msg_id, state)
SELECT g, g - {{size}}, 0 FROM generate_series(0, {{size}} - 1) AS g;

CREATE SEQUENCE {{push_seq}} AS bigint MINVALUE 0 START 0;
CREATE SEQUENCE {{pop_seq}} AS bigint MINVALUE 0 START 0;

-- name: create_enqueue_many
-- The SQL API, callable from any language, one section per function: the batch push
-- (enqueue_many, this section), the single push (enqueue), the pop (dequeue), the recovery
-- path (ring_repair) and the session's release (ring_release). The batch push and the pop
-- share the design below.
--
-- Set-based (since ring_0003). ring_0001's functions took one position per statement, so a
-- batch of 100 cost 100 UPDATEs (and, for a pop, as many sequence reads and slot checks)
-- whatever the batch: measured at 83-84 us of server time per message and side at every batch
-- size. Here a batch claims its positions with one nextval() series and writes or takes them
-- with one UPDATE; the per-position rules stay: a push writes only into a slot free for its
-- position, a pop takes only a FULL slot holding its position and never a push that has not
-- committed (FOR UPDATE SKIP LOCKED: a locked slot is "not there yet"), positions ring_repair
-- skipped or rescued are dropped, and claims that cannot be served now are kept in the session
-- for its next call, so neither a full ring nor an empty one leaves a hole. A session may now
-- keep several claims per side: the setting holds them as a comma-separated list, oldest first
-- (ring_0001/0002 kept one; a single value reads as a list of one). Same signatures and result
-- columns as before, so CREATE OR REPLACE keeps each function's EXECUTE grants (the migration
-- then restores SECURITY DEFINER where `queuectl grant` had set it: grant.sql,
-- resecure_functions).
--
-- One statement in the common case (since ring_0005). ring_0003's batch push and pop ran five
-- to six statements per call (the claims' nextval() series, a lock pass of FOR UPDATE SKIP
-- LOCKED and then the UPDATE, the claims looked up again, set_config), and each plpgsql
-- statement pays its own executor start. Measured at batch 10 (pgbench, 8 clients, each a push
-- of 10 then a pop of 10, alternating rounds): ring_0003 ran at 0.79x the fifo kind's SQL;
-- with this push and pop, 0.97x.
-- The rules are ring_0003's, and so are the signatures (CREATE OR REPLACE keeps grants):
--  * pop: claims are topped up (never past the pushers' positions), the FULL slots among
--    the first p_batch of them are taken by one UPDATE, and the claims still to come are
--    kept in the session setting, all in one statement. No lock pass: the UPDATE reads
--    the slots in its snapshot, where a push that has not committed still shows the
--    slot's previous lap, so it is "not there yet" as before and never waited for. The
--    one wait left: a FULL slot that ring_repair or a closing session is rescuing right
--    now; the UPDATE waits for that rescue, sees RESCUED and leaves the claim to be
--    dropped. (Nobody else writes a FULL slot: only the pop holding its position.) When
--    that statement takes nothing and p_timeout > 0, ring_0003's waiting loop follows.
--  * push: with no kept claim, one statement claims p_payloads' positions, writes the
--    longest run of them whose slots are free (as ring_0003 does) and keeps the unwritten
--    claims in the session; when some are left, ring_0003's loop takes over the rest.
-- The setting is written by a CTE that the final SELECT gates on (a one-time filter,
-- evaluated even when no row comes back: a plain join would skip it when none is taken).
-- Claim arrays are built by unnest(), which the planner counts as a few rows; a
-- generate_series() bounded by a variable counts as 1,000 and hashed the whole ring
-- (measured: the push at 1.6 ms per call instead of 1.0).

-- push many messages in array order; returns their positions. Claims (the session's kept
-- ones first, then new ones) are written in one UPDATE for the longest run of them whose
-- slots are free, from the first unwritten one; when the next slot is not free (the ring
-- is full there) it backs off (1 ms doubling to 50 ms) and retries until p_timeout, then
-- returns the positions written so far (always the first payloads: array order is kept)
-- and keeps the unwritten claims for the session's next push.
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
    v_off      integer := 0;  -- payloads the first statement wrote
    v_claims   bigint[];
    v_done     integer := 0;
    v_run      integer;
    v_pos      bigint;
    v_held     bigint;
    v_deadline timestamptz;
    v_pause    double precision := 0.001;
BEGIN
    IF v_n = 0 THEN
        RETURN;
    END IF;
    IF cardinality(v_kept) = 0 THEN
        -- one statement: claim, lock the free slots, write the longest run from the first
        -- claim, keep the unwritten claims (in array order) for the loop below
        RETURN QUERY
        WITH c AS MATERIALIZED (
            SELECT nextval({{push_seq_regclass}}::regclass) AS pos, g.ord
            FROM unnest(array_fill(0, ARRAY[v_n])) WITH ORDINALITY AS g(z, ord)
        ), locked AS MATERIALIZED (
            SELECT s.slot, c.pos, c.ord FROM c
            JOIN {{ring}} s ON s.slot = mod(c.pos, {{size}})
            WHERE s.msg_id = c.pos - {{size}} AND s.state <> 1
            FOR UPDATE OF s SKIP LOCKED
        ), run AS (
            SELECT l.slot, l.pos, l.ord FROM locked l
            WHERE l.ord < coalesce((SELECT min(c.ord) FROM c WHERE c.ord NOT IN (SELECT ord FROM locked)), v_n + 1)
        ), written AS (
            UPDATE {{ring}} r
            SET msg_id = run.pos, state = 1, payload = p_payloads[run.ord],
                headers = p_headers[run.ord], pushed_at = clock_timestamp(), changed_at = clock_timestamp()
            FROM run WHERE r.slot = run.slot
            RETURNING run.pos, run.ord
        ), rest AS (
            SELECT set_config(v_key, coalesce(string_agg(c.pos::text, ',' ORDER BY c.ord), ''), false) AS done
            FROM c WHERE c.ord NOT IN (SELECT w.ord FROM written w)
        )
        SELECT w.pos FROM written w WHERE (SELECT r.done FROM rest r) IS NOT NULL ORDER BY w.ord;
        GET DIAGNOSTICS v_off = ROW_COUNT;
        IF v_off = v_n THEN
            RETURN;
        END IF;
        -- the rest of the payloads go through ring_0003's loop with the claims just kept
        v_kept := string_to_array(current_setting(v_key), ',')::bigint[];
        v_n := v_n - v_off;
    END IF;
    v_deadline := clock_timestamp() + make_interval(secs => greatest(coalesce(p_timeout, 0), 0));
    v_claims := v_kept[1:v_n] || ARRAY(
        SELECT nextval({{push_seq_regclass}}::regclass)
        FROM generate_series(1, v_n - least(cardinality(v_kept), v_n)));
    v_kept := v_kept[v_n + 1:];
    LOOP
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
            SET msg_id = run.pos, state = 1, payload = p_payloads[v_off + v_done + run.ord],
                headers = p_headers[v_off + v_done + run.ord], pushed_at = clock_timestamp(), changed_at = clock_timestamp()
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
            -- the claim was tombstoned: drop it and claim a new position at the end
            v_claims := v_claims[1:v_done] || v_claims[v_done + 2:] || nextval({{push_seq_regclass}}::regclass);
            CONTINUE;
        END IF;
        EXIT WHEN clock_timestamp() >= v_deadline;
        PERFORM pg_sleep(least(v_pause, greatest(extract(epoch FROM v_deadline - clock_timestamp()), 0)));
        v_pause := least(v_pause * 2, 0.05);
    END LOOP;
    PERFORM set_config(v_key, array_to_string(v_claims[v_done + 1:] || v_kept, ','), false);
    RETURN;
END
$fn$;

-- name: create_enqueue
-- The single push, enqueue (since ring_0003).
-- push one message; NULL when the ring stayed full for p_timeout (the claim is kept for
-- this session's next push). With no kept claim it takes one position and one UPDATE, as
-- ring_0001's push did (a single push pays for none of the batch push's bookkeeping, which
-- doubled its server time at batch 1); anything else is the batch push of one.
CREATE OR REPLACE FUNCTION {{fn_enqueue}}(
    p_payload bytea,
    p_headers jsonb            DEFAULT NULL,
    p_timeout double precision DEFAULT 1.0
) RETURNS bigint
LANGUAGE plpgsql AS $fn$
DECLARE
    v_key text := 'queuectl.rpush' || {{ring_regclass}}::regclass::oid;
    v_pos bigint;
BEGIN
    IF coalesce(current_setting(v_key, true), '') = '' THEN
        v_pos := nextval({{push_seq_regclass}}::regclass);
        UPDATE {{ring}} r
        SET msg_id = v_pos, state = 1, payload = p_payload, headers = p_headers,
            pushed_at = clock_timestamp(), changed_at = clock_timestamp()
        FROM (SELECT f.slot FROM {{ring}} f
              WHERE f.slot = mod(v_pos, {{size}}) AND f.msg_id = v_pos - {{size}} AND f.state <> 1
              FOR UPDATE SKIP LOCKED) f
        WHERE r.slot = f.slot;
        IF FOUND THEN
            RETURN v_pos;
        END IF;
        -- not free for it now: the batch push of one takes the claim first and waits
        PERFORM set_config(v_key, v_pos::text, false);
    END IF;
    SELECT max(pushed.id) INTO v_pos
    FROM {{fn_enqueue_many}}(ARRAY[p_payload], ARRAY[p_headers], p_timeout) AS pushed(id);
    RETURN v_pos;
END
$fn$;

-- name: create_dequeue
-- The pop, dequeue (since ring_0005; create_enqueue_many explains its claims and its one
-- statement).
-- pop up to p_batch messages in position order. Claims (the session's kept ones first)
-- are topped up with one nextval() series, but never past the positions pushers have
-- claimed (push_seq's high mark minus pop_seq's: a claim beyond that could only wait), and
-- one UPDATE takes every FULL slot among them. Claims whose push has not happened (or not
-- committed) are kept for the next pop; those ring_repair skipped or rescued are dropped.
-- Waits up to p_timeout seconds only while it has nothing (an empty ring: it claims the
-- next position and waits for it); returns what it has as soon as nothing more is there.
CREATE OR REPLACE FUNCTION {{fn_dequeue}}(p_batch integer DEFAULT 1, p_timeout double precision DEFAULT 0)
RETURNS TABLE (id bigint, payload bytea, headers jsonb, enqueued_at timestamptz, dequeued_at timestamptz)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
DECLARE
    v_key      text := 'queuectl.rpop' || {{ring_regclass}}::regclass::oid;
    v_claims   bigint[] := coalesce(string_to_array(nullif(current_setting(v_key, true), ''), ',')::bigint[], '{}');
    v_deadline timestamptz;
    v_pause    double precision := 0.001;
    v_taken    integer := 0;
    v_got      integer;
    v_need     integer;
    v_more     bigint;
BEGIN
    -- one statement: top up, take, keep
    RETURN QUERY
    WITH more AS MATERIALIZED (
        -- as many as the batch lacks, never past the pushers' positions; with no claim at
        -- all, at least one (nothing pushed beyond the pops: it claims the next position
        -- and keeps it, as ring_0003's pop does)
        SELECT nextval({{pop_seq_regclass}}::regclass) AS pos
        FROM unnest(array_fill(0, ARRAY[greatest(
            CASE WHEN cardinality(v_claims) = 0 AND p_batch >= 1 THEN 1 ELSE 0 END,
            least(p_batch - cardinality(v_claims),
                  (SELECT CASE WHEN s.is_called THEN s.last_value ELSE s.last_value - 1 END FROM {{push_seq}} s)
                - (SELECT CASE WHEN s.is_called THEN s.last_value ELSE s.last_value - 1 END FROM {{pop_seq}} s)))::integer]))
    ), claims AS MATERIALIZED (
        SELECT k.pos, k.n FROM unnest(v_claims || ARRAY(SELECT m.pos FROM more m)) WITH ORDINALITY AS k(pos, n)
    ), taken AS (
        -- o: the slot as the snapshot shows it, for the message's columns (the UPDATE's
        -- RETURNING shows the emptied slot); r must still hold the same FULL position
        UPDATE {{ring}} r SET state = 0, payload = NULL, headers = NULL, changed_at = clock_timestamp()
        FROM claims c, {{ring}} o
        WHERE c.n <= p_batch AND o.slot = mod(c.pos, {{size}}) AND o.msg_id = c.pos AND o.state = 1
          AND r.slot = o.slot AND r.msg_id = c.pos AND r.state = 1
        RETURNING c.pos, o.payload, o.headers, o.pushed_at
    ), kept AS (
        -- not pushed yet (the slot holds an earlier lap), or FULL past this batch; the
        -- skipped and rescued ones are dropped
        SELECT set_config(v_key, coalesce(string_agg(c.pos::text, ',' ORDER BY c.pos), ''), false) AS done
        FROM claims c JOIN {{ring}} s ON s.slot = mod(c.pos, {{size}})
        WHERE c.pos NOT IN (SELECT t.pos FROM taken t) AND (s.msg_id < c.pos OR (s.msg_id = c.pos AND s.state = 1))
    )
    SELECT t.pos, t.payload, t.headers, t.pushed_at, now() FROM taken t
    WHERE (SELECT k.done FROM kept k) IS NOT NULL
    ORDER BY t.pos;
    GET DIAGNOSTICS v_got = ROW_COUNT;
    IF v_got > 0 OR coalesce(p_timeout, 0) <= 0 THEN
        RETURN;
    END IF;
    -- nothing there and the caller waits: ring_0003's loop, from the claims just kept
    v_claims := coalesce(string_to_array(nullif(current_setting(v_key, true), ''), ',')::bigint[], '{}');
    v_deadline := clock_timestamp() + make_interval(secs => greatest(p_timeout, 0));
    LOOP
        v_need := p_batch - v_taken;
        IF cardinality(v_claims) = 0 AND v_taken = 0 AND v_need = 1 THEN
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
        v_claims := CASE WHEN v_got = cardinality(v_claims) THEN '{}' ELSE ARRAY(
            SELECT c.pos FROM unnest(v_claims) AS c(pos)
            JOIN {{ring}} s ON s.slot = mod(c.pos, {{size}})
            WHERE s.msg_id < c.pos OR (s.msg_id = c.pos AND s.state = 1)
            ORDER BY c.pos) END;
        EXIT WHEN v_taken >= p_batch;
        CONTINUE WHEN v_got > 0 OR cardinality(v_claims) = 0;
        EXIT WHEN v_taken > 0 OR clock_timestamp() >= v_deadline;
        PERFORM pg_sleep(least(v_pause, greatest(extract(epoch FROM v_deadline - clock_timestamp()), 0)));
        v_pause := least(v_pause * 2, 0.05);
    END LOOP;
    PERFORM set_config(v_key, array_to_string(v_claims, ','), false);
    RETURN;
END
$fn$;

-- name: create_ring_repair
-- The recovery path, ring_repair (since ring_0001).
-- ring_repair: the recovery path for dead pushers and poppers (see the header). Slots
-- are left alone while locked (someone is pushing or popping them right now) or changed
-- within p_grace. Rescued messages are re-pushed (waiting up to p_timeout for a free
-- slot each); when the ring stays full, the remaining ones wait for the next run.
-- Returns one row per action: tombstone (item_id = the skipped position), rescue (item_id
-- = old position, new_item_id = new position), or deferred (a rescue found no free slot).
CREATE OR REPLACE FUNCTION {{fn_ring_repair}}(
    p_grace   interval         DEFAULT interval '30 seconds',
    p_timeout double precision DEFAULT 1.0
) RETURNS TABLE (action text, item_id bigint, new_item_id bigint, slot integer)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
DECLARE
    v_push_high bigint;
    v_pop_high  bigint;
    v_orphan    record;
    v_new       bigint;
BEGIN
    -- the highest position each side has handed out (-1: none yet)
    SELECT CASE WHEN s.is_called THEN s.last_value ELSE s.last_value - 1 END INTO v_push_high FROM {{push_seq}} s;
    SELECT CASE WHEN s.is_called THEN s.last_value ELSE s.last_value - 1 END INTO v_pop_high FROM {{pop_seq}} s;

    -- holes: a free slot whose next position(s) were claimed by pushes that never wrote.
    -- The tombstone goes to the highest such position of the slot (all laps at once).
    RETURN QUERY
    UPDATE {{ring}} r
    SET msg_id = r.msg_id + {{size}} * ((v_push_high - r.msg_id) / {{size}}),
        state = 2, payload = NULL, headers = NULL, changed_at = clock_timestamp()
    FROM (SELECT c.slot FROM {{ring}} c
          WHERE c.state <> 1 AND c.msg_id + {{size}} <= v_push_high
            AND c.changed_at < clock_timestamp() - p_grace
          FOR UPDATE SKIP LOCKED) c
    WHERE r.slot = c.slot
    RETURNING 'tombstone'::text, r.msg_id, NULL::bigint, r.slot;

    -- orphans: FULL slots whose position a pop already claimed, waiting past the grace.
    FOR v_orphan IN
        SELECT o.slot, o.msg_id, o.payload, o.headers FROM {{ring}} o
        WHERE o.state = 1 AND o.msg_id <= v_pop_high AND o.changed_at < clock_timestamp() - p_grace
        ORDER BY o.msg_id
        FOR UPDATE SKIP LOCKED
    LOOP
        BEGIN
            UPDATE {{ring}} r SET state = 3, payload = NULL, headers = NULL, changed_at = clock_timestamp()
            WHERE r.slot = v_orphan.slot;
            v_new := {{fn_enqueue}}(v_orphan.payload, v_orphan.headers, p_timeout);
            IF v_new IS NULL THEN
                RAISE EXCEPTION USING ERRCODE = 'QR001', MESSAGE = 'ring full';
            END IF;
            action := 'rescue'; item_id := v_orphan.msg_id; new_item_id := v_new; slot := v_orphan.slot;
            RETURN NEXT;
        EXCEPTION WHEN SQLSTATE 'QR001' THEN
            -- the ring stayed full: the orphan stays where it is (this block rolled back)
            action := 'deferred'; item_id := v_orphan.msg_id; new_item_id := NULL; slot := v_orphan.slot;
            RETURN NEXT;
            EXIT;
        END;
    END LOOP;
END
$fn$;

-- name: create_ring_release
-- The session's release, ring_release: give up its kept claims (since ring_0003).

-- ring_release for a session that may keep several claims per side: ring_0002's rules,
-- one row per claim (push claims first, oldest first).
CREATE OR REPLACE FUNCTION {{fn_ring_release}}(p_timeout double precision DEFAULT 0.1)
RETURNS TABLE (side text, item_id bigint, tombstoned boolean, new_item_id bigint, outcome text)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
DECLARE
    v_push   text := 'queuectl.rpush' || {{ring_regclass}}::regclass::oid;
    v_pop    text := 'queuectl.rpop' || {{ring_regclass}}::regclass::oid;
    v_claims bigint[];
    v_pos    bigint;
    v_msg    record;
BEGIN
    v_claims := coalesce(string_to_array(nullif(current_setting(v_push, true), ''), ',')::bigint[], '{}');
    -- cleared before a rescue below pushes: that push must draw a position of its own
    PERFORM set_config(v_push, '', false);
    FOREACH v_pos IN ARRAY v_claims LOOP
        -- our own claim: safe to tombstone at once when its slot is free for it
        UPDATE {{ring}} r SET msg_id = v_pos, state = 2, payload = NULL, headers = NULL,
                              changed_at = clock_timestamp()
        WHERE r.slot = mod(v_pos, {{size}}) AND r.msg_id = v_pos - {{size}} AND r.state <> 1;
        side := 'push'; item_id := v_pos; tombstoned := FOUND; new_item_id := NULL;
        outcome := CASE WHEN tombstoned THEN 'tombstoned' ELSE 'left' END;
        RETURN NEXT;
    END LOOP;
    v_claims := coalesce(string_to_array(nullif(current_setting(v_pop, true), ''), ',')::bigint[], '{}');
    FOREACH v_pos IN ARRAY v_claims LOOP
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
            -- v's push committed after our last pop looked: the message is ours, re-push
            -- it now. SKIP LOCKED: a slot locked now is ring_repair rescuing it already.
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
                    new_item_id := NULL;
                    outcome := 'deferred';
                END;
            END IF;
        END IF;
        RETURN NEXT;
    END LOOP;
    PERFORM set_config(v_pop, '', false);
END
$fn$;

-- name: drop_ring_release
-- Remove ring_0002's ring_release.
DROP FUNCTION IF EXISTS {{fn_ring_release}}(double precision);

-- name: set_autovacuum
-- Autovacuum storage parameters (since ring_0004; reset_autovacuum removes exactly these).
-- The slots need none: their updates are HOT, and page pruning, not VACUUM, frees the old
-- versions. Measured (bench/autovacuum.py --kind ring: 65,536 slots, a quarter full, 2
-- producers + 2 consumers, batch 50, 60 s per side, 2 repeats, alternating): with 300-byte
-- payloads, slots given scale factor 0, threshold 1,000 and no cost delay ran 54,066
-- against 53,423 msg/s, 52.2 against 52.3 MB, HOT 99.38% against 99.35% with the server's
-- defaults: no difference, so the slots keep the server's settings. Their n_dead_tup
-- (60,000-115,000) counts versions pruning already freed, and passes the default trigger
-- (50 + 0.2 x 65,536) either way.
-- Payloads over ~2 kB are another matter: they live in the TOAST table, where every push
-- inserts and every pop deletes them (TOAST rows are never updated in place: neither HOT
-- nor the fillfactor helps there). At 4,000 bytes the TOAST table grew by 50-90 MB/s, more
-- than a vacuum throttled at the default 2 ms can clean (it dirties at most ~40 MB/s:
-- cost limit 200, 20 per dirtied page). Throttled, its vacuum had not finished after 60 s
-- in 3 of 4 runs; unthrottled, it finished 10-20 s after it started, the space it freed
-- was reused, and the table held ~35% fewer dead rows (median 594,152 against 909,624;
-- 3.08 against 3.32 GB at the end; 11,768 against 10,395 msg/s, on a machine shared with
-- another benchmark). A first run that also gave the slots the settings above ended at
-- 4.38 against 5.46 GB. So: no cost delay on the TOAST table, its own parameter (a TOAST
-- table with parameters of its own no longer follows the slots' for autovacuum); the
-- slots keep the server's settings. Between autovacuum rounds (autovacuum_naptime, 1 min
-- by default, a server setting) the TOAST table still grows by a round's churn.
-- ALTER TABLE ... SET takes SHARE UPDATE EXCLUSIVE: pushes and pops are not blocked.
ALTER TABLE {{ring}} SET (toast.autovacuum_vacuum_cost_delay = 0);

-- name: reset_autovacuum
-- Back to the server's autovacuum settings: resets exactly what set_autovacuum set (the
-- fillfactor stays; ring_0004's downgrade).
ALTER TABLE {{ring}} RESET (toast.autovacuum_vacuum_cost_delay);

-- name: drop_functions
-- Remove the SQL API.
DROP FUNCTION IF EXISTS {{fn_ring_repair}}(interval, double precision);
DROP FUNCTION IF EXISTS {{fn_dequeue}}(integer, double precision);
DROP FUNCTION IF EXISTS {{fn_enqueue_many}}(bytea[], jsonb[], double precision);
DROP FUNCTION IF EXISTS {{fn_enqueue}}(bytea, jsonb, double precision);

-- name: drop_tables
-- Remove the slots and the sequences.
DROP TABLE IF EXISTS {{ring}};
DROP SEQUENCE IF EXISTS {{pop_seq}};
DROP SEQUENCE IF EXISTS {{push_seq}};

-- name: enqueue
-- Client call: push one message (NULL id: the ring stayed full).
SELECT {{fn_enqueue}}(:payload, CAST(:headers AS jsonb), CAST(:timeout AS double precision)) AS id

-- name: enqueue_many
-- Client call: push many messages in one round trip.
SELECT id FROM {{fn_enqueue_many}}(CAST(:payloads AS bytea[]), CAST(:headers AS jsonb[]),
                                   CAST(:timeout AS double precision)) AS id

-- name: dequeue
-- Client call: pop up to :batch messages, waiting up to :timeout seconds for the first.
SELECT * FROM {{fn_dequeue}}(:batch, CAST(:timeout AS double precision))

-- name: ring_repair
-- Client call: the recovery path (tombstone holes, rescue orphans).
SELECT * FROM {{fn_ring_repair}}(make_interval(secs => :grace), CAST(:timeout AS double precision))

-- name: ring_release
-- Client call: give up this session's kept claims, and rescue a message that arrived at
-- the pop claim with the function's default timeout (since ring_0002). No argument and `*`:
-- the same call serves a queue still at ring_0001, whose function has three columns.
SELECT * FROM {{fn_ring_release}}()

-- name: counts
-- Depth for `queuectl list`: the FULL slots.
SELECT 0 AS status, false AS scheduled, count(*) AS n FROM {{ring}} WHERE state = 1
