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
-- reliable_0002: one notification per enqueueing transaction.
-- A statement-level AFTER INSERT trigger on meta fires once per INSERT statement, whatever
-- its row count (enqueue_many's 10,000 rows cost one call), and PostgreSQL drops a
-- notification identical (same channel, same payload) to one already pending in the
-- transaction, so ten single enqueues in one transaction still deliver one notification
-- at commit, and none on rollback. A trigger rather than a pg_notify call inside the
-- enqueue functions: it costs one after-trigger event per statement (no per-row work,
-- no transition table), it also covers rows inserted by plain INSERTs or by functions a
-- later revision adds, and this revision leaves the enqueue functions untouched, so its
-- downgrade is two DROPs instead of a second copy of those functions.
CREATE FUNCTION {{fn_notify}}() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM pg_notify({{channel_literal}}, '');
    RETURN NULL;
END
$fn$;

CREATE TRIGGER {{notify_trigger}}
    AFTER INSERT ON {{meta}}
    FOR EACH STATEMENT EXECUTE FUNCTION {{fn_notify}}();

-- name: drop_reliable_notify
-- reliable_0002 downgrade: no more notifications; consumers fall back to polling.
DROP TRIGGER IF EXISTS {{notify_trigger}} ON {{meta}};
DROP FUNCTION IF EXISTS {{fn_notify}}();

-- name: listen
-- A consumer's dedicated autocommit connection subscribes to the queue's channel.
LISTEN {{channel}}

-- name: unlisten
UNLISTEN {{channel}}

-- name: notify
-- Wake the queue's consumers without inserting (after a worker gives items back at shutdown).
SELECT pg_notify({{channel_literal}}, '')
