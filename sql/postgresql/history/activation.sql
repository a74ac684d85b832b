-- Activation sections that later revisions replaced on PostgreSQL, each named for the revision
-- that installed it. What a fresh install creates today is in ../activation.sql.

-- name: create_reliable_notify_0002
-- reliable_0002's notify function: every enqueueing transaction notifies (the downgrade
-- of reliable_0006 puts it back, with drop_wait_functions).
CREATE OR REPLACE FUNCTION {{fn_notify}}() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM pg_notify({{channel_literal}}, '');
    RETURN NULL;
END
$fn$;

-- name: create_reliable_notify_0006
-- reliable_0006's notify and wait_begin: the same protocol, but they WAIT for the advisory
-- locks, so any session holding one exclusively stalled producers or consumers. reliable_0006
-- runs today's create_reliable_notify, then these over it; the downgrade of reliable_0011
-- runs these alone (wait_end is unchanged since).
CREATE OR REPLACE FUNCTION {{fn_notify}}() RETURNS trigger
LANGUAGE plpgsql AS $fn$
DECLARE
    v_key integer := hashtext({{channel_literal}}) & 2147483647;
BEGIN
    PERFORM pg_advisory_xact_lock_shared(1902343273, v_key);
    IF pg_try_advisory_lock(1902347383, v_key) THEN
        PERFORM pg_advisory_unlock(1902347383, v_key);
    ELSE
        PERFORM pg_notify({{channel_literal}}, '');
    END IF;
    RETURN NULL;
END
$fn$;

-- A consumer session is about to sleep on the channel: register it (once per session,
-- however often this is called) and say whether sleeping is safe (true), or whether an
-- enqueue that may not have seen the registration is still open (false: look again soon).
-- Call it on the session that LISTENs, then dequeue once more before sleeping.
CREATE OR REPLACE FUNCTION {{fn_wait_begin}}() RETURNS boolean
LANGUAGE plpgsql AS $fn$
DECLARE
    v_key integer := hashtext({{channel_literal}}) & 2147483647;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_locks
                   WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND mode = 'ShareLock'
                     AND classid = 1902347383 AND objid = v_key::oid AND objsubid = 2) THEN
        PERFORM pg_advisory_lock_shared(1902347383, v_key);
    END IF;
    IF pg_try_advisory_lock(1902343273, v_key) THEN
        PERFORM pg_advisory_unlock(1902343273, v_key);
        RETURN true;
    END IF;
    RETURN false;
END
$fn$;
