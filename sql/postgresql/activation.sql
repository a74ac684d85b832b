-- Activation on PostgreSQL: a queue announces new items on its LISTEN/NOTIFY channel, so
-- idle consumers sleep on a socket instead of polling and wake within milliseconds.
--
-- The channel is "<schema>.<queue>" (QueueNames.channel: validated names, shortened with a
-- hash past 63 bytes). The payload is always empty: a notification means "look", never
-- "here is item 42", so a lost or duplicated one costs latency or one empty dequeue, never
-- an item.
--
-- Sections are filled by queuectl.sqlfiles.render() with quoted identifiers only.

-- name: create_reliable_notify
-- Notify only when a consumer may be waiting, and never wait for a lock to decide.
--
-- Why: PostgreSQL serialises the commits of all transactions that issued NOTIFY (a
-- database-wide lock taken before the commit record and held until it is flushed), so
-- concurrent single-item producers that all notify stop sharing WAL flushes. While the
-- consumers are busy nobody needs the announcement: a busy consumer looks again by itself.
--
-- The protocol, two advisory locks per queue (two-int4 keys: a class constant, and the
-- queue's channel hashed to a non-negative int4; a collision with another queue only
-- costs a spare notification or poll):
--   "waiting"   (class 1902347383, 'qctw') held SHARED, session-level, by every consumer
--               session that may go to sleep on the channel ({{fn_wait_begin}}), given up
--               when it finds work again ({{fn_wait_end}}).
--   "in flight" (class 1902343273, 'qcti') held SHARED by every enqueueing transaction
--               from its INSERT statement until it commits or rolls back.
-- A producer, after each enqueueing INSERT statement: takes "in flight" (shared, until its
-- transaction ends), then probes "waiting" (pg_try_advisory_lock, exclusive, released at
-- once when it got it): if a consumer holds it, NOTIFY as before; if not, no notification.
-- A consumer, before the empty dequeue that lets it sleep: takes "waiting" (shared), then
-- probes "in flight" (exclusive try, released at once). Got it: every enqueue that probed
-- "waiting" before this registration has ended (locks are released only after the commit
-- is visible), so the dequeue that follows sees its rows, and every later enqueue sees
-- the registration and notifies: sleeping is safe. Not got: an enqueue that may have
-- missed the registration is still open; the consumer looks again shortly instead of
-- sleeping (queuectl.worker: 20 ms, doubling while it lasts).
-- Spare notifications are possible (two producers probing at the same instant), missed
-- ones are not. Costs: two lock-manager calls per enqueueing statement instead of a
-- serialised commit; a consumer pays one call when it goes idle and one when it gets busy.
-- A plain LISTEN session that never calls {{fn_wait_begin}} is no longer woken, except
-- while some registered consumer waits: it still finds items by polling.
--
-- Why: any role that can connect may take any advisory lock, and these keys are easy to
-- compute (and pg_locks shows them while consumers hold "waiting"). A session holding
-- "in flight" exclusively made every enqueue wait in pg_advisory_xact_lock_shared, and one
-- holding "waiting" exclusively made every consumer wait in {{fn_wait_begin}}, forever.
-- So both only try. A producer that cannot take "in flight" (shared) notifies: a spare
-- notification, which the protocol allows; it never skips one it owes, since it skips only
-- after holding "in flight" and finding no consumer in "waiting", as before. A consumer
-- that cannot register in "waiting" reports that sleeping is not safe, so it looks again
-- soon instead of sleeping. Such a session costs notifications and polls, not progress.
-- (The lock an honest party holds exclusively is only a try-probe, released at once.)
CREATE OR REPLACE FUNCTION {{fn_notify}}() RETURNS trigger
LANGUAGE plpgsql AS $fn$
DECLARE
    v_key integer := hashtext({{channel_literal}}) & 2147483647;
BEGIN
    -- nested, not AND: SQL does not promise the order in which AND evaluates its sides
    IF pg_try_advisory_xact_lock_shared(1902343273, v_key) THEN
        IF pg_try_advisory_lock(1902347383, v_key) THEN
            PERFORM pg_advisory_unlock(1902347383, v_key);
            RETURN NULL;
        END IF;
    END IF;
    PERFORM pg_notify({{channel_literal}}, '');
    RETURN NULL;
END
$fn$;

CREATE OR REPLACE FUNCTION {{fn_wait_begin}}() RETURNS boolean
LANGUAGE plpgsql AS $fn$
DECLARE
    v_key integer := hashtext({{channel_literal}}) & 2147483647;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_locks
                   WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND mode = 'ShareLock'
                     AND classid = 1902347383 AND objid = v_key::oid AND objsubid = 2)
       AND NOT pg_try_advisory_lock_shared(1902347383, v_key) THEN
        RETURN false;
    END IF;
    IF pg_try_advisory_lock(1902343273, v_key) THEN
        PERFORM pg_advisory_unlock(1902343273, v_key);
        RETURN true;
    END IF;
    RETURN false;
END
$fn$;

-- The consumer session found work: producers need not announce to it any more.
-- Returns whether it was registered.
CREATE OR REPLACE FUNCTION {{fn_wait_end}}() RETURNS boolean
LANGUAGE plpgsql AS $fn$
DECLARE
    v_key integer := hashtext({{channel_literal}}) & 2147483647;
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_locks
               WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND mode = 'ShareLock'
                 AND classid = 1902347383 AND objid = v_key::oid AND objsubid = 2) THEN
        RETURN pg_advisory_unlock_shared(1902347383, v_key);
    END IF;
    RETURN false;
END
$fn$;

-- name: create_notify_trigger
-- One notification per enqueueing transaction.
-- A statement-level AFTER INSERT trigger on meta fires once per INSERT statement, whatever
-- its row count (enqueue_many's 10,000 rows cost one call), and PostgreSQL drops a
-- notification identical (same channel, same payload) to one already pending in the
-- transaction, so ten single enqueues in one transaction still deliver one notification
-- at commit, and none on rollback. A trigger rather than a pg_notify call inside the
-- enqueue functions: it costs one after-trigger event per statement (no per-row work,
-- no transition table), it also covers rows inserted by plain INSERTs or by functions a
-- later revision adds, and this revision leaves the enqueue functions untouched, so its
-- downgrade is two DROPs instead of a second copy of those functions.
CREATE TRIGGER {{notify_trigger}}
    AFTER INSERT ON {{meta}}
    FOR EACH STATEMENT EXECUTE FUNCTION {{fn_notify}}();

-- name: drop_reliable_notify
-- reliable_0002 downgrade: no more notifications; consumers fall back to polling.
DROP TRIGGER IF EXISTS {{notify_trigger}} ON {{meta}};
DROP FUNCTION IF EXISTS {{fn_notify}}();

-- name: drop_wait_functions
-- Remove the consumer registration calls (the downgrade to notifying in every enqueueing
-- transaction).
DROP FUNCTION IF EXISTS {{fn_wait_begin}}();
DROP FUNCTION IF EXISTS {{fn_wait_end}}();

-- name: listen
-- A consumer's dedicated autocommit connection subscribes to the queue's channel.
LISTEN {{channel}}

-- name: unlisten
UNLISTEN {{channel}}

-- name: wait_begin
-- reliable_0006+: register this LISTEN session as a consumer that may sleep; true when
-- sleeping after one more empty dequeue is safe (see create_reliable_notify_0006).
SELECT {{fn_wait_begin}}()

-- name: wait_end
SELECT {{fn_wait_end}}()

-- name: notify
-- Wake the queue's consumers without inserting (after a worker gives items back at shutdown).
SELECT pg_notify({{channel_literal}}, '')

-- name: seat_take
-- The looker's seat (queuectl.worker, "Many consumers"): one session per queue at a time
-- LISTENs and registers in "waiting", so a notification signals one backend instead of
-- every consumer's (PostgreSQL signals every backend that LISTENs in the database at each
-- notification, whatever its channel). A session-level exclusive advisory lock (class
-- 1902343283, 'qcts'; the same key as "waiting" and "in flight"), only ever tried: a wait
-- in the lock manager would hold the statement's snapshot, and the xmin horizon, for as
-- long as it waits. The seat goes with its session, so a consumer that dies (SIGKILL)
-- frees it when its backend sees the connection close. True: this session is the looker.
SELECT pg_try_advisory_lock(1902343283, hashtext({{channel_literal}}) & 2147483647)

-- name: seat_leave
-- The looker gives its seat up (it stays busy, or it stops); it has UNLISTENed first.
SELECT pg_advisory_unlock(1902343283, hashtext({{channel_literal}}) & 2147483647)
