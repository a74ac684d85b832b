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
-- Since ring_0008 every call but subscriptions() first refuses a REPEATABLE READ or
-- SERIALIZABLE transaction (SQLSTATE QC400, in the reliable queue's form): the compact job
-- (jobs/compact.py) TRUNCATEs and refills the tables, which a snapshot older than it sees
-- empty, so a pop would give up its claims and a push would find the ring full. The check is
-- one current_setting() call (docs/kinds.md, "Size while a snapshot is held open").
--
-- Updates never touch an indexed column (only the slot primary key is indexed) and the
-- table has fillfactor 50, so PostgreSQL can keep every update HOT (heap-only: no new
-- index entry, old versions pruned within the page).
--
-- A message over the ring's slot_bytes lives in the side table <queue>_ring_large, the only
-- table of the ring with inserts and deletes: its push inserts it, its pop deletes it, and the
-- slot holds a pointer (large_id). A message over max_payload_bytes is refused (QC413).
-- create_large_table explains why, with the measurements.
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
-- Fan-out (since ring_0006; create_subscription_tables has the design): a ring installed
-- with `fanout` gives every message to each of its named subscriptions, whose consumers
-- compete within the subscription (claims with leases, acknowledged by (id, tries)). Its
-- slots are PUBLISHED (4) or PASSED (5), never FULL: publish() writes them, the
-- subscriptions read them, and a slot is free once every subscription acknowledged it.
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

-- name: create_large_table
-- The side table for messages larger than a slot's in-row width (since ring_0007), and the
-- slot's pointer to it.
--
-- A message whose payload + headers (as text) is over slot_bytes is inserted here by its
-- push and deleted by its pop, in the pop's own statement; the slot holds its id in large_id
-- and no payload. A rescue (ring_repair, ring_release) moves the pointer to the message's new
-- slot, never the payload. So the slots' rows stay narrow whatever the messages, and are
-- never TOASTed at the default width. What that buys, measured (bench/lab/ring_large.py: 64
-- slots, 100 laps of push full and pop empty, autovacuum off for the run, random payloads):
--  * a payload TOASTed in the slot's row (over ~2 kB) costs what a row here costs: TOAST rows
--    are inserted at the push and deleted at the pop, never updated in place, so neither HOT
--    nor the fillfactor helps, and the TOAST table grows by every byte pushed until a vacuum
--    (4,000 bytes: 34 MB; 65,536 bytes: 427 MB, for rings holding at most 256 kB and 4 MB);
--    this table does the same (35 MB and 428 MB; 632 kB and 4.9 MB after a VACUUM). The
--    price of large messages is the same on either path: dead rows and a vacuum to reclaim
--    them, confined to the large messages; this table has its own autovacuum settings below.
--  * the slots themselves: an update is HOT only while its page has room for the new version,
--    and under a pinned xmin horizon (a REPEATABLE READ snapshot held through the laps) page
--    pruning frees nothing, so the slots' heap grows by every version's width: 2.1 MB with
--    200-byte payloads, 12.8 MB with 1,900-byte ones kept in the row, 0.9-1.0 MB with a
--    pointer (to a TOAST value or to this table). A narrow slot keeps that growth small.
--  * the cost: one more insert and index entry per large message (about 30% more server time
--    for a batch of 64 4,000-byte messages pushed and popped, on a noisy machine), and a size
--    check per push call.
-- slot_bytes' default, 1,800, keeps a slot row with its other columns (and the headers'
-- binary form, a little longer than their text) under the 2,032-byte TOAST threshold.
-- ADD COLUMN without a default changes only the catalog (no rewrite); it takes an ACCESS
-- EXCLUSIVE lock for that moment, so pushes and pops wait for it briefly.
ALTER TABLE {{ring}} ADD COLUMN large_id bigint;

CREATE TABLE {{ring_large}} (
    id      bigint GENERATED ALWAYS AS IDENTITY (SEQUENCE NAME {{ring_large_seq}})
            CONSTRAINT {{ring_large_pkey}} PRIMARY KEY,
    payload bytea,
    headers jsonb
);
-- Every row is inserted once and deleted once: the table is all churn, so its vacuum (and
-- its TOAST table's, which hold payloads over ~2 kB) runs without cost delay, as the slots'
-- TOAST table does (set_autovacuum explains why).
ALTER TABLE {{ring_large}} SET (autovacuum_vacuum_cost_delay = 0, toast.autovacuum_vacuum_cost_delay = 0);

-- name: drop_large_table
-- Back to messages in the slots' rows (ring_0007's downgrade): every message waiting in the
-- side table goes back into its slot, then the table and the pointer go. The slots are locked
-- first so no push or pop runs between the move and the drop.
LOCK TABLE {{ring}} IN EXCLUSIVE MODE;
UPDATE {{ring}} r SET payload = l.payload, headers = l.headers, large_id = NULL
FROM {{ring_large}} l WHERE r.large_id = l.id;
DROP TABLE {{ring_large}};
ALTER TABLE {{ring}} DROP COLUMN large_id;

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
-- Sizes (since ring_0007): a message (payload + headers as text) over max_payload_bytes refuses
-- the whole call (SQLSTATE QC413, one line) before anything is written; one over slot_bytes
-- goes to the side table (create_large_table) and its slot gets the pointer. The side rows of
-- messages the call could not push (the ring stayed full) are deleted before it returns.
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
    v_over     bigint;    -- the first message over max_payload_bytes (its ordinal)
    v_big      bigint;    -- how many are over slot_bytes
    v_large    bigint[];  -- their side-table ids, by ordinal
    v_i        bigint;
    v_id       bigint;
BEGIN
    IF current_setting('transaction_isolation') IN ('repeatable read', 'serializable') THEN
        RAISE EXCEPTION USING ERRCODE = 'QC400', MESSAGE = format(
            'queue %L: enqueue_many runs in READ COMMITTED transactions only (this one is %s): an older snapshot sees the ring''s tables empty once the compact job has rewritten them',
            {{queue_literal}}, current_setting('transaction_isolation'));
    END IF;
    IF v_n = 0 THEN
        RETURN;
    END IF;
    SELECT min(m.ord) FILTER (WHERE m.bytes > {{max_payload_bytes}}), count(*) FILTER (WHERE m.bytes > {{slot_bytes}})
    INTO v_over, v_big
    FROM (SELECT u.ord, coalesce(octet_length(u.payload), 0)::bigint + coalesce(octet_length(u.headers::text), 0) AS bytes
          FROM unnest(p_payloads, p_headers) WITH ORDINALITY AS u(payload, headers, ord)
          WHERE u.ord <= v_n) m;
    IF v_over IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'QC413', MESSAGE = format(
            'queue %L: message %s of %s is %s bytes (payload %s + headers %s), over max_payload_bytes %s: nothing was enqueued',
            {{queue_literal}}, v_over, v_n,
            coalesce(octet_length(p_payloads[v_over]), 0) + coalesce(octet_length(p_headers[v_over]::text), 0),
            coalesce(octet_length(p_payloads[v_over]), 0), coalesce(octet_length(p_headers[v_over]::text), 0),
            {{max_payload_bytes}});
    END IF;
    IF v_big > 0 THEN
        -- one INSERT per large message: RETURNING does not pair ids with their ordinals, and
        -- the payload's own write dwarfs a statement's cost at these sizes
        FOR v_i IN
            SELECT u.ord FROM unnest(p_payloads, p_headers) WITH ORDINALITY AS u(payload, headers, ord)
            WHERE u.ord <= v_n
              AND coalesce(octet_length(u.payload), 0) + coalesce(octet_length(u.headers::text), 0) > {{slot_bytes}}
        LOOP
            INSERT INTO {{ring_large}} (payload, headers) VALUES (p_payloads[v_i], p_headers[v_i])
            RETURNING id INTO v_id;
            v_large[v_i] := v_id;
            p_payloads[v_i] := NULL;
            p_headers[v_i] := NULL;
        END LOOP;
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
                headers = p_headers[run.ord], large_id = v_large[run.ord],
                pushed_at = clock_timestamp(), changed_at = clock_timestamp()
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
                headers = p_headers[v_off + v_done + run.ord], large_id = v_large[v_off + v_done + run.ord],
                pushed_at = clock_timestamp(), changed_at = clock_timestamp()
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
    IF v_big > 0 THEN
        -- the messages not pushed leave nothing behind in the side table
        DELETE FROM {{ring_large}} WHERE id = ANY (v_large[v_off + v_done + 1:]);
    END IF;
    RETURN;
END
$fn$;

-- name: create_enqueue
-- The single push, enqueue (since ring_0003).
-- push one message; NULL when the ring stayed full for p_timeout (the claim is kept for
-- this session's next push). With no kept claim it takes one position and one UPDATE, as
-- ring_0001's push did (a single push pays for none of the batch push's bookkeeping, which
-- doubled its server time at batch 1); anything else is the batch push of one, and so is a
-- message over slot_bytes or max_payload_bytes (since ring_0007: the batch push checks sizes
-- and writes the side table).
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
    IF current_setting('transaction_isolation') IN ('repeatable read', 'serializable') THEN
        RAISE EXCEPTION USING ERRCODE = 'QC400', MESSAGE = format(
            'queue %L: enqueue runs in READ COMMITTED transactions only (this one is %s): an older snapshot sees the ring''s tables empty once the compact job has rewritten them',
            {{queue_literal}}, current_setting('transaction_isolation'));
    END IF;
    IF coalesce(current_setting(v_key, true), '') = ''
       AND coalesce(octet_length(p_payload), 0) + coalesce(octet_length(p_headers::text), 0)
           <= least({{slot_bytes}}, {{max_payload_bytes}}) THEN
        v_pos := nextval({{push_seq_regclass}}::regclass);
        UPDATE {{ring}} r
        SET msg_id = v_pos, state = 1, payload = p_payload, headers = p_headers, large_id = NULL,
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
-- A message in the side table (since ring_0007) is deleted from it by the statement that takes
-- its slot and returned as if it had been in the slot.
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
    IF current_setting('transaction_isolation') IN ('repeatable read', 'serializable') THEN
        RAISE EXCEPTION USING ERRCODE = 'QC400', MESSAGE = format(
            'queue %L: dequeue runs in READ COMMITTED transactions only (this one is %s): an older snapshot sees the ring''s tables empty once the compact job has rewritten them',
            {{queue_literal}}, current_setting('transaction_isolation'));
    END IF;
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
        UPDATE {{ring}} r SET state = 0, payload = NULL, headers = NULL, large_id = NULL, changed_at = clock_timestamp()
        FROM claims c, {{ring}} o
        WHERE c.n <= p_batch AND o.slot = mod(c.pos, {{size}}) AND o.msg_id = c.pos AND o.state = 1
          AND r.slot = o.slot AND r.msg_id = c.pos AND r.state = 1
        RETURNING c.pos, o.payload, o.headers, o.pushed_at, o.large_id
    ), big AS (
        DELETE FROM {{ring_large}} l USING taken t WHERE l.id = t.large_id
        RETURNING l.id, l.payload, l.headers
    ), kept AS (
        -- not pushed yet (the slot holds an earlier lap), or FULL past this batch; the
        -- skipped and rescued ones are dropped
        SELECT set_config(v_key, coalesce(string_agg(c.pos::text, ',' ORDER BY c.pos), ''), false) AS done
        FROM claims c JOIN {{ring}} s ON s.slot = mod(c.pos, {{size}})
        WHERE c.pos NOT IN (SELECT t.pos FROM taken t) AND (s.msg_id < c.pos OR (s.msg_id = c.pos AND s.state = 1))
    )
    SELECT t.pos, CASE WHEN t.large_id IS NULL THEN t.payload ELSE b.payload END,
           CASE WHEN t.large_id IS NULL THEN t.headers ELSE b.headers END, t.pushed_at, now()
    FROM taken t LEFT JOIN big b ON b.id = t.large_id
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
            SELECT s.slot, c.pos, s.payload, s.headers, s.pushed_at, s.large_id
            FROM unnest(v_claims) AS c(pos)
            JOIN {{ring}} s ON s.slot = mod(c.pos, {{size}})
            WHERE s.msg_id = c.pos AND s.state = 1
            ORDER BY c.pos
            LIMIT v_need
            FOR UPDATE OF s SKIP LOCKED
        ), u AS (
            UPDATE {{ring}} r SET state = 0, payload = NULL, headers = NULL, large_id = NULL, changed_at = clock_timestamp()
            FROM f WHERE r.slot = f.slot
            RETURNING r.slot
        ), big AS (
            DELETE FROM {{ring_large}} l USING f WHERE l.id = f.large_id
            RETURNING l.id, l.payload, l.headers
        )
        SELECT f.pos, CASE WHEN f.large_id IS NULL THEN f.payload ELSE b.payload END,
               CASE WHEN f.large_id IS NULL THEN f.headers ELSE b.headers END, f.pushed_at, now()
        FROM f JOIN u ON u.slot = f.slot LEFT JOIN big b ON b.id = f.large_id ORDER BY f.pos;
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
-- A rescued message in the side table keeps its row there: the rescue re-pushes the slot's
-- empty message and moves the pointer to the new slot, which its transaction holds locked
-- (since ring_0007).
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
    IF current_setting('transaction_isolation') IN ('repeatable read', 'serializable') THEN
        RAISE EXCEPTION USING ERRCODE = 'QC400', MESSAGE = format(
            'queue %L: ring_repair runs in READ COMMITTED transactions only (this one is %s): an older snapshot sees the ring''s tables empty once the compact job has rewritten them',
            {{queue_literal}}, current_setting('transaction_isolation'));
    END IF;
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
        SELECT o.slot, o.msg_id, o.payload, o.headers, o.large_id FROM {{ring}} o
        WHERE o.state = 1 AND o.msg_id <= v_pop_high AND o.changed_at < clock_timestamp() - p_grace
        ORDER BY o.msg_id
        FOR UPDATE SKIP LOCKED
    LOOP
        BEGIN
            UPDATE {{ring}} r SET state = 3, payload = NULL, headers = NULL, large_id = NULL,
                                  changed_at = clock_timestamp()
            WHERE r.slot = v_orphan.slot;
            v_new := {{fn_enqueue}}(v_orphan.payload, v_orphan.headers, p_timeout);
            IF v_new IS NULL THEN
                RAISE EXCEPTION USING ERRCODE = 'QR001', MESSAGE = 'ring full';
            END IF;
            IF v_orphan.large_id IS NOT NULL THEN
                UPDATE {{ring}} r SET large_id = v_orphan.large_id
                WHERE r.slot = mod(v_new, {{size}}) AND r.msg_id = v_new;
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
-- one row per claim (push claims first, oldest first). A rescued message in the side table
-- keeps its row there, as in ring_repair: the pointer moves to the new slot (since ring_0007).
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
    IF current_setting('transaction_isolation') IN ('repeatable read', 'serializable') THEN
        RAISE EXCEPTION USING ERRCODE = 'QC400', MESSAGE = format(
            'queue %L: ring_release runs in READ COMMITTED transactions only (this one is %s): an older snapshot sees the ring''s tables empty once the compact job has rewritten them',
            {{queue_literal}}, current_setting('transaction_isolation'));
    END IF;
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
            SELECT s.payload, s.headers, s.large_id INTO v_msg FROM {{ring}} s
            WHERE s.slot = mod(v_pos, {{size}}) AND s.msg_id = v_pos AND s.state = 1
            FOR UPDATE SKIP LOCKED;
            IF FOUND THEN
                BEGIN
                    UPDATE {{ring}} r SET state = 3, payload = NULL, headers = NULL, large_id = NULL,
                                          changed_at = clock_timestamp()
                    WHERE r.slot = mod(v_pos, {{size}});
                    new_item_id := {{fn_enqueue}}(v_msg.payload, v_msg.headers, p_timeout);
                    IF new_item_id IS NULL THEN
                        RAISE EXCEPTION USING ERRCODE = 'QR001', MESSAGE = 'ring full';
                    END IF;
                    IF v_msg.large_id IS NOT NULL THEN
                        UPDATE {{ring}} r SET large_id = v_msg.large_id
                        WHERE r.slot = mod(new_item_id, {{size}}) AND r.msg_id = new_item_id;
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

-- name: create_subscription_tables
-- Fan-out (since ring_0006): named subscriptions, each of which reads every message pushed
-- after it was added, in order, with competing consumers inside it. A ring installed with
-- `fanout` takes its pushes through publish() and its pops through the subscriptions only;
-- a ring without it (the default) keeps these tables empty and works as above.
--
-- <queue>_subs: one row per subscription. next_pos is its cursor, the next position to hand
-- out; it is a column, not a sequence, so that a claim and the cursor's move commit together
-- (a consumer that dies mid-claim leaves no hole, unlike the pop's non-transactional
-- sequence). The price: the consumers of one subscription take turns on that row for the
-- length of one claim statement (not while they process). scan_at: when the claims of the
-- subscription are next looked at for expired leases. A subscription dropped for lagging
-- keeps its row (dropped_at set) until unsubscribe removes it. The defaults of lag_limit and
-- drop_when_behind are the ring's install settings ({{sub_lag_limit}}, {{sub_drop}}: half the
-- ring and no, unless installed with others).
--
-- <queue>_sub_slots: `size` rows per subscription, written at subscribe and then only
-- UPDATEd: row (sub, s) holds the last position of slot s handed to the subscription (pos),
-- its lease (lease_until; NULL once acknowledged) and the claim's count of tries, which is
-- also the claim's token: an ack names (position, tries), so the ack of a consumer whose
-- lease expired and whose message another consumer took again matches nothing. No indexed
-- column changes (the key is (sub_id, slot)), so every update can be HOT if its page has
-- room. fillfactor 30, not the slots' 50: a claim of a batch updates every row of a page in
-- one statement, and versions that statement just replaced cannot be pruned before it ends;
-- measured (tests/test_ring_fanout.py, batches of 512 over 1,024 slots, 3 subscriptions) at
-- 50: 346 of 147,456 updates were not HOT; at 30: none. ~15 MB per subscription at 65,536 slots.
--
-- A slot is free for position v when the ring's slot holds v - size and every active
-- subscription that started at or before v - size has acknowledged v - size there (the
-- LMAX Disruptor's gating on the slowest consumer, kept per slot instead of as one
-- sequence per consumer, because competing consumers acknowledge out of order).
CREATE TABLE {{subs}} (
    sub_id           integer     PRIMARY KEY,
    name             text        NOT NULL UNIQUE,
    start_pos        bigint      NOT NULL,
    next_pos         bigint      NOT NULL,
    lag_limit        bigint      NOT NULL DEFAULT {{sub_lag_limit}} CHECK (lag_limit >= 1),
    drop_when_behind boolean     NOT NULL DEFAULT ({{sub_drop}} = 1),
    scan_at          timestamptz NOT NULL DEFAULT now(),
    created_at       timestamptz NOT NULL DEFAULT now(),
    dropped_at       timestamptz
) WITH (fillfactor = 50);

CREATE TABLE {{sub_slots}} (
    sub_id      integer     NOT NULL,
    slot        integer     NOT NULL,
    pos         bigint      NOT NULL,
    lease_until timestamptz,
    tries       integer     NOT NULL DEFAULT 0,
    PRIMARY KEY (sub_id, slot)
) WITH (fillfactor = 30);

-- name: drop_subscription_tables
-- Remove the subscriptions (ring_0006's downgrade).
DROP TABLE IF EXISTS {{sub_slots}};
DROP TABLE IF EXISTS {{subs}};

-- name: make_fanout
-- Turn a ring that has never been used into a fan-out ring (ring_0006, for a ring installed
-- with `fanout`). Two more slot states:
--   4 PUBLISHED  position msg_id holds a message for the subscriptions (payload kept until
--                the slot is reused: subscriptions read it, nobody empties it)
--   5 PASSED     position msg_id never got a message (a fan-out tombstone)
-- Every slot starts PUBLISHED at slot - size, a position no subscription wants: free.
-- The guard trigger keeps the other functions of the ring from breaking a fan-out slot: a
-- plain push into it fails with advice; a tombstone (ring_repair, ring_release) goes in as
-- PASSED where no subscription still waits for the slot's message, else is not written
-- (the BEFORE trigger returns NULL). The plain pop takes FULL slots only, so it finds
-- nothing here. The WHEN clause is evaluated without calling the function, so publish and
-- the subscriptions' own updates (which keep the state at 4 or 5) pay nothing for it.
DO $make$
DECLARE
    c record;
BEGIN
    IF EXISTS (SELECT 1 FROM {{ring}} WHERE state <> 0 OR msg_id >= 0) THEN
        RAISE EXCEPTION 'ring % has been used: only a new ring can fan out', {{ring_regclass}};
    END IF;
    FOR c IN SELECT conname FROM pg_constraint WHERE conrelid = {{ring_regclass}}::regclass AND contype = 'c' LOOP
        EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', {{ring_regclass}}::regclass, c.conname);
    END LOOP;
END
$make$;
ALTER TABLE {{ring}} ADD CHECK (state BETWEEN 0 AND 5);
UPDATE {{ring}} SET state = 4;
CREATE TRIGGER fanout_guard BEFORE UPDATE ON {{ring}}
    FOR EACH ROW WHEN (OLD.state >= 4 AND NEW.state < 4) EXECUTE FUNCTION {{fn_fanout_guard}}();

-- name: unmake_fanout
-- Back to a plain ring (ring_0006's downgrade of a fan-out ring): each message that an
-- active subscription has not acknowledged becomes FULL, for the plain pop, once; the
-- others are EMPTY, the fan-out tombstones SKIPPED. The pop sequence restarts at the
-- oldest such message (or past the pushes), so plain pops do not walk the consumed ones.
DROP TRIGGER IF EXISTS fanout_guard ON {{ring}};
UPDATE {{ring}} r
SET state = CASE
        WHEN r.state = 5 THEN 2
        WHEN EXISTS (SELECT 1 FROM {{subs}} u JOIN {{sub_slots}} k ON k.sub_id = u.sub_id AND k.slot = r.slot
                     WHERE u.dropped_at IS NULL AND u.start_pos <= r.msg_id
                       AND NOT (k.pos = r.msg_id AND k.lease_until IS NULL)) THEN 1
        ELSE 0 END
WHERE r.state >= 4;
UPDATE {{ring}} SET payload = NULL, headers = NULL WHERE state <> 1;
SELECT setval({{pop_seq_regclass}}::regclass,
              coalesce((SELECT min(msg_id) FROM {{ring}} WHERE state = 1),
                       (SELECT CASE WHEN s.is_called THEN s.last_value + 1 ELSE s.last_value END FROM {{push_seq}} s)),
              false);
DO $unmake$
DECLARE
    c record;
BEGIN
    FOR c IN SELECT conname FROM pg_constraint WHERE conrelid = {{ring_regclass}}::regclass AND contype = 'c' LOOP
        EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', {{ring_regclass}}::regclass, c.conname);
    END LOOP;
END
$unmake$;
ALTER TABLE {{ring}} ADD CHECK (state BETWEEN 0 AND 3);

-- name: create_fanout_guard
-- The guard trigger's function (make_fanout explains it). A tombstone that goes in replaces
-- a message every subscription is done with: the message's side-table row (since ring_0007)
-- goes with it, as when publish reuses the slot.
CREATE OR REPLACE FUNCTION {{fn_fanout_guard}}() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    IF NEW.state = 1 THEN
        RAISE EXCEPTION USING ERRCODE = 'QR003',
            MESSAGE = format('ring %I.%I fans out: push with %I.%I', TG_TABLE_SCHEMA, TG_TABLE_NAME,
                             TG_TABLE_SCHEMA, regexp_replace(TG_TABLE_NAME, '_ring$', '_publish')),
            HINT = 'a fan-out ring takes its messages through publish() and gives them out through subscriptions';
    END IF;
    IF OLD.state = 5 OR NOT EXISTS (
        SELECT 1 FROM {{subs}} u JOIN {{sub_slots}} k ON k.sub_id = u.sub_id AND k.slot = OLD.slot
        WHERE u.dropped_at IS NULL AND u.start_pos <= OLD.msg_id
          AND NOT (k.pos = OLD.msg_id AND k.lease_until IS NULL)) THEN
        IF OLD.large_id IS NOT NULL THEN
            DELETE FROM {{ring_large}} l WHERE l.id = OLD.large_id;
        END IF;
        NEW.state := 5;
        NEW.payload := NULL;
        NEW.headers := NULL;
        NEW.large_id := NULL;
        RETURN NEW;
    END IF;
    RETURN NULL;
END
$fn$;

-- name: refresh_fanout_guard
-- Nothing on PostgreSQL: the trigger calls the guard function by name, so CREATE OR REPLACE
-- of create_fanout_guard already changes what it runs (SQL Server's trigger holds the text it
-- was made with: see there). Empty on purpose.

-- name: create_publish
-- The fan-out push, publish (since ring_0006): enqueue_many's claims and rules (the session
-- keeps the claims it could not write, under the same setting, so ring_release gives them
-- up), with the fan-out free test: the slot holds v - size, PUBLISHED or PASSED, and every
-- active subscription that started at or before v - size acknowledged it. The producer's
-- back-pressure is so the slowest subscription. Before it claims, it drops the
-- subscriptions that asked to be dropped when behind and are (lag = positions pushed that
-- the subscription has not been handed, over its lag_limit), so a stopped subscription
-- stops the producer only if it did not ask for that.
-- Sizes (since ring_0007): enqueue_many's checks (a message over max_payload_bytes refuses
-- the call with QC413 before anything is written; one over slot_bytes goes to the side table
-- and the slot gets the pointer; the side rows of messages not published are deleted before
-- it returns). A fan-out slot keeps its message until the slot is reused, since every
-- subscription reads it, so the side row of the message a slot held is deleted by the
-- statement that reuses the slot: by then every subscription has acknowledged it (the free
-- test), and no sub_take reaches it any more.
CREATE OR REPLACE FUNCTION {{fn_publish}}(
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
    v_deadline timestamptz;
    v_pause    double precision := 0.001;
    v_over     bigint;    -- the first message over max_payload_bytes (its ordinal)
    v_big      bigint;    -- how many are over slot_bytes
    v_large    bigint[];  -- their side-table ids, by ordinal
    v_i        bigint;
    v_id       bigint;
BEGIN
    IF current_setting('transaction_isolation') IN ('repeatable read', 'serializable') THEN
        RAISE EXCEPTION USING ERRCODE = 'QC400', MESSAGE = format(
            'queue %L: publish runs in READ COMMITTED transactions only (this one is %s): an older snapshot sees the ring''s tables empty once the compact job has rewritten them',
            {{queue_literal}}, current_setting('transaction_isolation'));
    END IF;
    IF v_n = 0 THEN
        RETURN;
    END IF;
    SELECT min(m.ord) FILTER (WHERE m.bytes > {{max_payload_bytes}}), count(*) FILTER (WHERE m.bytes > {{slot_bytes}})
    INTO v_over, v_big
    FROM (SELECT u.ord, coalesce(octet_length(u.payload), 0)::bigint + coalesce(octet_length(u.headers::text), 0) AS bytes
          FROM unnest(p_payloads, p_headers) WITH ORDINALITY AS u(payload, headers, ord)
          WHERE u.ord <= v_n) m;
    IF v_over IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'QC413', MESSAGE = format(
            'queue %L: message %s of %s is %s bytes (payload %s + headers %s), over max_payload_bytes %s: nothing was enqueued',
            {{queue_literal}}, v_over, v_n,
            coalesce(octet_length(p_payloads[v_over]), 0) + coalesce(octet_length(p_headers[v_over]::text), 0),
            coalesce(octet_length(p_payloads[v_over]), 0), coalesce(octet_length(p_headers[v_over]::text), 0),
            {{max_payload_bytes}});
    END IF;
    IF v_big > 0 THEN
        -- one INSERT per large message, as in enqueue_many
        FOR v_i IN
            SELECT u.ord FROM unnest(p_payloads, p_headers) WITH ORDINALITY AS u(payload, headers, ord)
            WHERE u.ord <= v_n
              AND coalesce(octet_length(u.payload), 0) + coalesce(octet_length(u.headers::text), 0) > {{slot_bytes}}
        LOOP
            INSERT INTO {{ring_large}} (payload, headers) VALUES (p_payloads[v_i], p_headers[v_i])
            RETURNING id INTO v_id;
            v_large[v_i] := v_id;
            p_payloads[v_i] := NULL;
            p_headers[v_i] := NULL;
        END LOOP;
    END IF;
    v_deadline := clock_timestamp() + make_interval(secs => greatest(coalesce(p_timeout, 0), 0));
    v_claims := v_kept[1:v_n] || ARRAY(
        SELECT nextval({{push_seq_regclass}}::regclass)
        FROM generate_series(1, v_n - least(cardinality(v_kept), v_n)));
    v_kept := v_kept[v_n + 1:];
    LOOP
        -- drop the droppable subscriptions that are behind (no row is locked unless one is)
        UPDATE {{subs}} u SET dropped_at = clock_timestamp()
        WHERE u.dropped_at IS NULL AND u.drop_when_behind
          AND u.next_pos < (SELECT CASE WHEN s.is_called THEN s.last_value ELSE s.last_value - 1 END FROM {{push_seq}} s)
                           + 1 - u.lag_limit;
        RETURN QUERY
        WITH c AS (
            SELECT u.pos, u.ord FROM unnest(v_claims[v_done + 1:]) WITH ORDINALITY AS u(pos, ord)
        ), locked AS MATERIALIZED (
            SELECT s.slot, c.pos, c.ord, s.large_id AS old_large FROM c
            JOIN {{ring}} s ON s.slot = mod(c.pos, {{size}})
            WHERE s.msg_id = c.pos - {{size}} AND s.state >= 4
              AND (s.state = 5 OR NOT EXISTS (
                  SELECT 1 FROM {{subs}} u JOIN {{sub_slots}} k ON k.sub_id = u.sub_id AND k.slot = s.slot
                  WHERE u.dropped_at IS NULL AND u.start_pos <= s.msg_id
                    AND NOT (k.pos = s.msg_id AND k.lease_until IS NULL)))
            FOR UPDATE OF s SKIP LOCKED
        ), run AS (
            SELECT l.slot, l.pos, l.ord, l.old_large FROM locked l
            WHERE l.ord < coalesce((SELECT min(c.ord) FROM c WHERE c.ord NOT IN (SELECT ord FROM locked)), v_n - v_done + 1)
        ), written AS (
            UPDATE {{ring}} r
            SET msg_id = run.pos, state = 4, payload = p_payloads[v_done + run.ord],
                headers = p_headers[v_done + run.ord], large_id = v_large[v_done + run.ord],
                pushed_at = clock_timestamp(), changed_at = clock_timestamp()
            FROM run WHERE r.slot = run.slot
            RETURNING run.pos, run.ord
        ), freed AS (
            -- the reused slots' previous messages: every subscription is done with them
            DELETE FROM {{ring_large}} l USING run WHERE l.id = run.old_large
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
    IF v_big > 0 THEN
        -- the messages not published leave nothing behind in the side table
        DELETE FROM {{ring_large}} WHERE id = ANY (v_large[v_done + 1:]);
    END IF;
    RETURN;
END
$fn$;

-- name: create_subscribe
-- subscribe (since ring_0006): add a subscription online. It sees every message pushed
-- after it: its cursor starts past the highest position pushers have claimed, read under a
-- SHARE ROW EXCLUSIVE lock on the slots. That lock waits for the pushes in flight and holds
-- new ones back until this commits, so every position at or past the start is written by a
-- push whose free test sees the new subscription (and a position claimed earlier but written
-- later is below the start: not the subscription's). Pops and pushes wait for the lock
-- meanwhile: one short transaction. lag_limit and drop_when_behind, when NULL, take the
-- columns' defaults: the ring's install settings (create_subscription_tables). Its `size` slot rows are inserted here; that is the only time they grow.
CREATE OR REPLACE FUNCTION {{fn_subscribe}}(
    p_name             text,
    p_lag_limit        bigint  DEFAULT NULL,
    p_drop_when_behind boolean DEFAULT NULL
) RETURNS TABLE (name text, start_pos bigint, lag_limit bigint, drop_when_behind boolean)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
DECLARE
    v_id    integer;
    v_start bigint;
    v_limit bigint;
    v_drop  boolean;
BEGIN
    IF current_setting('transaction_isolation') IN ('repeatable read', 'serializable') THEN
        RAISE EXCEPTION USING ERRCODE = 'QC400', MESSAGE = format(
            'queue %L: subscribe runs in READ COMMITTED transactions only (this one is %s): an older snapshot sees the ring''s tables empty once the compact job has rewritten them',
            {{queue_literal}}, current_setting('transaction_isolation'));
    END IF;
    IF p_name IS NULL OR p_name !~ '^[a-z][a-z0-9_]{0,47}$' THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('invalid subscription name %L: 1-48 lowercase letters, digits and underscores, starting with a letter', p_name);
    END IF;
    IF p_lag_limit < 1 OR p_lag_limit > {{size}} THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('lag limit must be from 1 to the ring''s size (%s), got %s', {{size}}, p_lag_limit);
    END IF;
    IF (SELECT r.state FROM {{ring}} r WHERE r.slot = 0) < 4 THEN
        RAISE EXCEPTION USING ERRCODE = 'QR003',
            MESSAGE = format('ring %s does not fan out: install it with fanout to subscribe', {{ring_regclass}});
    END IF;
    LOCK TABLE {{ring}} IN SHARE ROW EXCLUSIVE MODE;
    IF EXISTS (SELECT 1 FROM {{subs}} u WHERE u.name = p_name) THEN
        RAISE EXCEPTION USING ERRCODE = '42710', MESSAGE = format('subscription %L exists', p_name);
    END IF;
    SELECT CASE WHEN s.is_called THEN s.last_value + 1 ELSE s.last_value END INTO v_start FROM {{push_seq}} s;
    SELECT coalesce(max(u.sub_id), 0) + 1 INTO v_id FROM {{subs}} u;
    INSERT INTO {{subs}} AS u (sub_id, name, start_pos, next_pos) VALUES (v_id, p_name, v_start, v_start)
    RETURNING u.lag_limit, u.drop_when_behind INTO v_limit, v_drop;
    v_limit := coalesce(p_lag_limit, v_limit);
    v_drop := coalesce(p_drop_when_behind, v_drop);
    UPDATE {{subs}} u SET lag_limit = v_limit, drop_when_behind = v_drop WHERE u.sub_id = v_id;
    INSERT INTO {{sub_slots}} (sub_id, slot, pos)
    SELECT v_id, g, -1 FROM generate_series(0, {{size}} - 1) AS g;
    RETURN QUERY SELECT p_name, v_start, v_limit, v_drop;
END
$fn$;

-- name: create_unsubscribe
-- unsubscribe (since ring_0006): remove a subscription (active or dropped) and its slot
-- rows; the producer no longer waits for it. Its consumers' next call fails. True if it
-- existed.
CREATE OR REPLACE FUNCTION {{fn_unsubscribe}}(p_name text) RETURNS boolean
LANGUAGE plpgsql AS $fn$
DECLARE
    v_id integer;
BEGIN
    IF current_setting('transaction_isolation') IN ('repeatable read', 'serializable') THEN
        RAISE EXCEPTION USING ERRCODE = 'QC400', MESSAGE = format(
            'queue %L: unsubscribe runs in READ COMMITTED transactions only (this one is %s): an older snapshot sees the ring''s tables empty once the compact job has rewritten them',
            {{queue_literal}}, current_setting('transaction_isolation'));
    END IF;
    DELETE FROM {{subs}} u WHERE u.name = p_name RETURNING u.sub_id INTO v_id;
    IF v_id IS NULL THEN
        RETURN false;
    END IF;
    DELETE FROM {{sub_slots}} k WHERE k.sub_id = v_id;
    RETURN true;
END
$fn$;

-- name: create_subscriptions
-- subscriptions (since ring_0006): one row per subscription, for `queuectl subscriptions`
-- and health. lag: positions pushed that it has not been handed (what its lag_limit
-- bounds); behind: lag over the limit, or dropped. claimed: messages handed out and not
-- acknowledged (expired: of those, leases past), oldest_claim: the lowest of them. Reads
-- each subscription's `size` slot rows: a monitoring call, not a per-message one.
CREATE OR REPLACE FUNCTION {{fn_subscriptions}}()
RETURNS TABLE (name text, start_pos bigint, next_pos bigint, lag bigint, lag_limit bigint, behind boolean,
               drop_when_behind boolean, dropped_at timestamptz, claimed bigint, expired bigint,
               oldest_claim bigint, created_at timestamptz)
LANGUAGE sql STABLE AS $fn$
    SELECT u.name, u.start_pos, u.next_pos, h.high + 1 - u.next_pos, u.lag_limit,
           u.dropped_at IS NOT NULL OR h.high + 1 - u.next_pos > u.lag_limit,
           u.drop_when_behind, u.dropped_at, c.claimed, c.expired, c.oldest, u.created_at
    FROM {{subs}} u
    CROSS JOIN (SELECT CASE WHEN s.is_called THEN s.last_value ELSE s.last_value - 1 END AS high FROM {{push_seq}} s) h
    CROSS JOIN LATERAL (
        SELECT count(*) FILTER (WHERE k.lease_until IS NOT NULL) AS claimed,
               count(*) FILTER (WHERE k.lease_until < now()) AS expired,
               min(k.pos) FILTER (WHERE k.lease_until IS NOT NULL) AS oldest
        FROM {{sub_slots}} k WHERE k.sub_id = u.sub_id) c
    ORDER BY u.name
$fn$;

-- name: create_sub_take
-- A subscription's pop, sub_take (since ring_0006): up to p_batch messages of
-- subscription p_name, each leased for p_lease seconds; id is the position, tries the
-- claim's token for sub_done/sub_return. First the claims whose lease expired (looked for once
-- a second per subscription: the scan reads its `size` slot rows, and an index on the lease
-- would make every claim and ack a non-HOT update), then new positions from the cursor:
-- from next_pos on, the PUBLISHED ones are claimed, the PASSED ones (and those a tombstone
-- moved past) skipped, and the cursor stops at the first position not published yet, or
-- whose publish has not committed (the snapshot shows the slot's previous lap: never read).
-- The claim and the cursor's move are one statement under the cursor row's lock. Waits up
-- to p_timeout seconds while nothing is there, holding no lock: the cursor row is read
-- without one first and locked only when there is something to take.
-- A message in the side table (since ring_0007) is read through its slot's pointer in the
-- statement that claims it, and stays there: the other subscriptions read it too, and the
-- publish that reuses the slot deletes it (create_publish).
CREATE OR REPLACE FUNCTION {{fn_sub_take}}(
    p_name    text,
    p_batch   integer          DEFAULT 1,
    p_lease   double precision DEFAULT 30,
    p_timeout double precision DEFAULT 0
) RETURNS TABLE (id bigint, payload bytea, headers jsonb, enqueued_at timestamptz, dequeued_at timestamptz,
                 tries integer)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
DECLARE
    v_sub      integer;
    v_next     bigint;
    v_scan     timestamptz;
    v_high     bigint;
    v_got      integer;
    v_n        integer;
    v_win      bigint[];
    v_lease    interval := make_interval(secs => greatest(coalesce(p_lease, 0), 0));
    v_deadline timestamptz := clock_timestamp() + make_interval(secs => greatest(coalesce(p_timeout, 0), 0));
    v_pause    double precision := 0.001;
BEGIN
    IF current_setting('transaction_isolation') IN ('repeatable read', 'serializable') THEN
        RAISE EXCEPTION USING ERRCODE = 'QC400', MESSAGE = format(
            'queue %L: sub_take runs in READ COMMITTED transactions only (this one is %s): an older snapshot sees the ring''s tables empty once the compact job has rewritten them',
            {{queue_literal}}, current_setting('transaction_isolation'));
    END IF;
    IF p_batch IS NULL OR p_batch < 1 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'batch must be at least 1';
    END IF;
    LOOP
        SELECT u.sub_id, u.next_pos, u.scan_at INTO v_sub, v_next, v_scan
        FROM {{subs}} u WHERE u.name = p_name AND u.dropped_at IS NULL;
        IF NOT FOUND THEN
            RAISE EXCEPTION USING ERRCODE = 'QR002',
                MESSAGE = format('ring %s has no active subscription %L', {{ring_regclass}}, p_name);
        END IF;
        SELECT CASE WHEN s.is_called THEN s.last_value ELSE s.last_value - 1 END INTO v_high FROM {{push_seq}} s;
        IF v_scan <= clock_timestamp() OR (v_next <= v_high AND EXISTS (
                SELECT 1 FROM {{ring}} r WHERE r.slot = mod(v_next, {{size}}) AND r.msg_id >= v_next)) THEN
            SELECT u.next_pos, u.scan_at INTO v_next, v_scan
            FROM {{subs}} u WHERE u.sub_id = v_sub AND u.dropped_at IS NULL FOR UPDATE;
            IF NOT FOUND THEN
                CONTINUE;  -- dropped meanwhile: the read above reports it
            END IF;
            v_got := 0;
            IF v_scan <= clock_timestamp() THEN
                -- claims whose lease expired: taken again, with one more try (a new token)
                RETURN QUERY
                WITH e AS MATERIALIZED (
                    SELECT k.slot FROM {{sub_slots}} k
                    WHERE k.sub_id = v_sub AND k.lease_until < clock_timestamp()
                    ORDER BY k.pos LIMIT p_batch
                    FOR UPDATE SKIP LOCKED
                ), again AS (
                    UPDATE {{sub_slots}} k SET lease_until = clock_timestamp() + v_lease, tries = k.tries + 1
                    FROM e WHERE k.sub_id = v_sub AND k.slot = e.slot AND k.lease_until < clock_timestamp()
                    RETURNING k.pos, k.slot, k.tries
                )
                SELECT a.pos, CASE WHEN r.large_id IS NULL THEN r.payload ELSE l.payload END,
                       CASE WHEN r.large_id IS NULL THEN r.headers ELSE l.headers END, r.pushed_at, now(), a.tries
                FROM again a JOIN {{ring}} r ON r.slot = a.slot LEFT JOIN {{ring_large}} l ON l.id = r.large_id
                ORDER BY a.pos;
                GET DIAGNOSTICS v_got = ROW_COUNT;
                IF v_got < p_batch THEN
                    UPDATE {{subs}} u SET scan_at = clock_timestamp() + interval '1 second' WHERE u.sub_id = v_sub;
                END IF;
            END IF;
            IF v_got < p_batch AND v_next <= v_high THEN
                v_n := least(p_batch - v_got, v_high - v_next + 1)::integer;
                v_win := ARRAY(SELECT generate_series(v_next, v_next + v_n - 1));
                RETURN QUERY
                WITH w AS MATERIALIZED (
                    SELECT g.pos, r.slot, r.msg_id, r.state, r.payload, r.headers, r.pushed_at, r.large_id
                    FROM unnest(v_win) AS g(pos) JOIN {{ring}} r ON r.slot = mod(g.pos, {{size}})
                ), stop AS (
                    -- the first position not published (or not committed) yet
                    SELECT coalesce(min(w.pos), v_next + v_n) AS at FROM w WHERE w.msg_id < w.pos
                ), c AS MATERIALIZED (
                    SELECT w.* FROM w WHERE w.pos < (SELECT st.at FROM stop st) AND w.msg_id = w.pos AND w.state = 4
                ), claimed AS (
                    UPDATE {{sub_slots}} k SET pos = c.pos, lease_until = clock_timestamp() + v_lease, tries = 1
                    FROM c WHERE k.sub_id = v_sub AND k.slot = c.slot
                    RETURNING k.pos, k.tries
                ), moved AS (
                    UPDATE {{subs}} u SET next_pos = (SELECT st.at FROM stop st) WHERE u.sub_id = v_sub
                )
                SELECT c.pos, CASE WHEN c.large_id IS NULL THEN c.payload ELSE l.payload END,
                       CASE WHEN c.large_id IS NULL THEN c.headers ELSE l.headers END, c.pushed_at, now(), cl.tries
                FROM c JOIN claimed cl ON cl.pos = c.pos LEFT JOIN {{ring_large}} l ON l.id = c.large_id
                ORDER BY c.pos;
                GET DIAGNOSTICS v_n = ROW_COUNT;
                v_got := v_got + v_n;
            END IF;
            -- something taken, or the cursor's lock held for nothing (another consumer of
            -- the subscription took it first, or only tombstones were there): return rather
            -- than wait holding it
            RETURN;
        END IF;
        EXIT WHEN clock_timestamp() >= v_deadline;
        PERFORM pg_sleep(least(v_pause, greatest(extract(epoch FROM v_deadline - clock_timestamp()), 0)));
        v_pause := least(v_pause * 2, 0.05);
    END LOOP;
END
$fn$;

-- name: create_sub_done
-- sub_done (since ring_0006): acknowledge messages of a subscription by (id, tries); returns
-- the ids acknowledged. A claim taken again since (its lease expired, another consumer has
-- it under a higher tries) or acknowledged already is not touched: its id is not returned.
-- An ack after the lease expired but before another consumer took the message counts.
CREATE OR REPLACE FUNCTION {{fn_sub_done}}(p_name text, p_ids bigint[], p_tries integer[])
RETURNS SETOF bigint
LANGUAGE plpgsql AS $fn$
BEGIN
    IF current_setting('transaction_isolation') IN ('repeatable read', 'serializable') THEN
        RAISE EXCEPTION USING ERRCODE = 'QC400', MESSAGE = format(
            'queue %L: sub_done runs in READ COMMITTED transactions only (this one is %s): an older snapshot sees the ring''s tables empty once the compact job has rewritten them',
            {{queue_literal}}, current_setting('transaction_isolation'));
    END IF;
    RETURN QUERY
    WITH done AS (
        UPDATE {{sub_slots}} k SET lease_until = NULL
        FROM {{subs}} u, unnest(p_ids, p_tries) AS a(pos, tries)
        WHERE u.name = p_name AND k.sub_id = u.sub_id AND k.slot = mod(a.pos, {{size}})
          AND k.pos = a.pos AND k.tries = a.tries AND k.lease_until IS NOT NULL
        RETURNING k.pos
    )
    SELECT done.pos FROM done;
END
$fn$;

-- name: create_sub_return
-- sub_return (since ring_0006): give claimed messages back to the subscription at once (their
-- lease ends now; the next sub_take of any of its consumers takes them again, with one
-- more try); same matching and result as sub_done.
CREATE OR REPLACE FUNCTION {{fn_sub_return}}(p_name text, p_ids bigint[], p_tries integer[])
RETURNS SETOF bigint
LANGUAGE plpgsql AS $fn$
BEGIN
    IF current_setting('transaction_isolation') IN ('repeatable read', 'serializable') THEN
        RAISE EXCEPTION USING ERRCODE = 'QC400', MESSAGE = format(
            'queue %L: sub_return runs in READ COMMITTED transactions only (this one is %s): an older snapshot sees the ring''s tables empty once the compact job has rewritten them',
            {{queue_literal}}, current_setting('transaction_isolation'));
    END IF;
    RETURN QUERY
    WITH given AS (
        UPDATE {{sub_slots}} k SET lease_until = '-infinity'
        FROM {{subs}} u, unnest(p_ids, p_tries) AS a(pos, tries)
        WHERE u.name = p_name AND k.sub_id = u.sub_id AND k.slot = mod(a.pos, {{size}})
          AND k.pos = a.pos AND k.tries = a.tries AND k.lease_until IS NOT NULL
        RETURNING k.pos, k.sub_id
    ), look AS (
        UPDATE {{subs}} u SET scan_at = now() WHERE u.sub_id IN (SELECT g.sub_id FROM given g)
    )
    SELECT g.pos FROM given g;
END
$fn$;

-- name: drop_subscription_functions
-- Remove the fan-out API (ring_0006's downgrade).
DROP FUNCTION IF EXISTS {{fn_publish}}(bytea[], jsonb[], double precision);
DROP FUNCTION IF EXISTS {{fn_subscribe}}(text, bigint, boolean);
DROP FUNCTION IF EXISTS {{fn_unsubscribe}}(text);
DROP FUNCTION IF EXISTS {{fn_subscriptions}}();
DROP FUNCTION IF EXISTS {{fn_sub_take}}(text, integer, double precision, double precision);
DROP FUNCTION IF EXISTS {{fn_sub_done}}(text, bigint[], integer[]);
DROP FUNCTION IF EXISTS {{fn_sub_return}}(text, bigint[], integer[]);
DROP FUNCTION IF EXISTS {{fn_fanout_guard}}();

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

-- name: publish
-- Client call: push many messages to a fan-out ring's subscriptions in one round trip.
SELECT id FROM {{fn_publish}}(CAST(:payloads AS bytea[]), CAST(:headers AS jsonb[]),
                              CAST(:timeout AS double precision)) AS id

-- name: sub_take
-- Client call: up to :batch messages of subscription :name, leased for :lease seconds.
SELECT * FROM {{fn_sub_take}}(:name, :batch, CAST(:lease AS double precision), CAST(:timeout AS double precision))

-- name: sub_done
-- Client call: acknowledge messages of subscription :name by (id, tries).
SELECT id FROM {{fn_sub_done}}(:name, CAST(:ids AS bigint[]), CAST(:tries AS integer[])) AS id

-- name: sub_return
-- Client call: give claimed messages back to subscription :name at once.
SELECT id FROM {{fn_sub_return}}(:name, CAST(:ids AS bigint[]), CAST(:tries AS integer[])) AS id

-- name: subscribe
-- Client call: add subscription :name (NULL options: the ring's defaults).
SELECT * FROM {{fn_subscribe}}(:name, CAST(:lag_limit AS bigint), CAST(:drop_when_behind AS boolean))

-- name: unsubscribe
-- Client call: remove subscription :name.
SELECT {{fn_unsubscribe}}(:name) AS removed

-- name: subscriptions
-- Client call: the subscriptions and their lag.
SELECT * FROM {{fn_subscriptions}}()

-- name: counts
-- Depth for `queuectl list`: the FULL slots.
SELECT 0 AS status, false AS scheduled, count(*) AS n FROM {{ring}} WHERE state = 1
