-- The maintenance jobs' statements on PostgreSQL (queuectl.jobs.*), per queue: the batch
-- jobs serve reliable queues, the upkeep sections (indexes, VACUUM, kind_*) every kind.
--
-- Every batch statement here is one short transaction of its own: the job commits after
-- each batch, so a killed job loses at most the batch in flight, which rolls back whole.

-- name: set_local_timeouts
-- Timeouts for the current transaction only (SET LOCAL takes no bind parameters).
SELECT set_config('lock_timeout', :lock_timeout, true),
       set_config('statement_timeout', :statement_timeout, true)

-- name: set_session_timeouts
-- Timeouts for the session (for statements that cannot run in a transaction block).
SELECT set_config('lock_timeout', :lock_timeout, false),
       set_config('statement_timeout', :statement_timeout, false)

-- name: reset_session_timeouts
-- Back to the values RESET restores (the server's, the role's or the database's), before a
-- connection that ran with set_session_timeouts goes back to the pool.
SELECT set_config(s.name, s.reset_val, false) FROM pg_settings s
WHERE s.name IN ('lock_timeout', 'statement_timeout')

-- name: archive_batch
-- Move one batch of finished rows, with their payloads, from meta/data to history.
-- DONE rows older than :min_age_seconds and DEAD rows older than :dead_min_age_seconds,
-- oldest first, through the partial index on finished rows. SKIP LOCKED: never wait on a
-- row someone else holds. The two picks are MATERIALIZED so the planner cannot flatten
-- them into the DELETEs (a flattened plan may touch more rows than the LIMIT).
-- The data rows are deleted explicitly, so their payloads reach history in the same
-- statement. A row the rotation already copied to history (reliable_0012: an old
-- generation's finished rows are copied before its truncate) is deleted here and not
-- copied twice (ON CONFLICT DO NOTHING).
-- Both DELETEs find the picked rows by `id = ANY (ARRAY(...))`, through the primary keys. A
-- join to the picks was planned from the dead pick's LIMIT, whose subquery the planner
-- cannot estimate: it assumed a tenth of the DEAD rows old enough to go would be picked, and
-- with a backlog of them it hashed the picks against sequential scans of the whole meta and
-- data tables (measured, batch 100, all but 100 rows DEAD: 3,641 buffers per batch at 40,000
-- rows and 1,148 at 2,000, against 1,538 and 1,537 this way), a cost that grows with every
-- row not archived yet.
WITH done AS MATERIALIZED (
    SELECT m.id FROM {{meta}} m
    WHERE m.status = 2 AND m.finished_at < now() - make_interval(secs => :min_age_seconds)
    ORDER BY m.status, m.finished_at
    LIMIT :batch
    FOR UPDATE SKIP LOCKED
), dead AS MATERIALIZED (
    SELECT m.id FROM {{meta}} m
    WHERE m.status = 3 AND m.finished_at < now() - make_interval(secs => :dead_min_age_seconds)
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
ON CONFLICT (id) DO NOTHING

-- name: purge_history_batch
-- Delete one batch of history rows archived more than :retention_seconds ago, oldest first.
-- When the queue's history is exported to a Parquet lake (queuectl pipeline export), only
-- rows some lake already holds may go: retention must never delete what is not exported.
WITH old AS MATERIALIZED (
    SELECT h.id FROM {{history}} h
    WHERE h.archived_at < now() - make_interval(secs => :retention_seconds)
      AND (NOT EXISTS (SELECT 1 FROM {{exports}} e WHERE e.queue = :queue)
           OR EXISTS (SELECT 1 FROM {{exports}} e
                       WHERE e.queue = :queue AND h.id <= e.exported_upto_id
                         AND h.archived_at < e.archived_before))
    ORDER BY h.archived_at
    LIMIT :batch
    FOR UPDATE SKIP LOCKED
)
DELETE FROM {{history}} h USING old o WHERE h.id = o.id

-- name: reset_stale_batch
-- Expired leases: the consumer died or stalled. Back to READY (the expired attempt was
-- already counted when the item was claimed), or DEAD when that was its last attempt.
-- Through the partial index on PROCESSING rows; SKIP LOCKED never waits on a live consumer.
WITH stale AS MATERIALIZED (
    SELECT m.id FROM {{meta}} m
    WHERE m.status = 1 AND m.leased_until < now()
    ORDER BY m.leased_until
    LIMIT :batch
    FOR UPDATE SKIP LOCKED
)
UPDATE {{meta}} m SET
    status       = CASE WHEN m.attempts >= m.max_attempts THEN 3 ELSE 0 END,
    finished_at  = CASE WHEN m.attempts >= m.max_attempts THEN now() END,
    last_error   = 'lease of ' || coalesce(m.lease_owner, 'an unknown consumer') || ' expired at '
                   || m.leased_until || ' (attempt ' || m.attempts || ' of ' || m.max_attempts || ')',
    lease_owner  = NULL,
    leased_until = NULL
FROM stale s
WHERE m.id = s.id
RETURNING m.id, m.status

-- name: pgstattuple_schema
-- Where the pgstattuple extension is installed (no row: not installed).
SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace
WHERE e.extname = 'pgstattuple'

-- name: create_pgstattuple
-- Needs a role that may create the extension (superuser, or the database owner on
-- servers that mark it trusted).
CREATE EXTENSION IF NOT EXISTS pgstattuple

-- name: table_indexes
-- The indexes of one of the queue's tables, with their size and validity. Of a partitioned
-- table (a reliable queue's meta and data, reliable_0012), those of its partitions: they
-- hold the entries, and pgstatindex and REINDEX work on them (pg_partition_tree lists
-- nothing for a plain table: the table itself is added).
SELECT c.relname AS index_name, i.indisvalid AS valid, pg_relation_size(c.oid) AS bytes,
       pg_relation_size(c.oid) / current_setting('block_size')::int AS pages,
       am.amname AS method
FROM pg_index i
JOIN pg_class c ON c.oid = i.indexrelid
JOIN pg_am am ON am.oid = c.relam
WHERE i.indrelid IN (SELECT p.relid FROM pg_partition_tree(CAST(:table_name AS regclass)) p WHERE p.isleaf
                     UNION SELECT c.oid FROM pg_class c WHERE c.oid = CAST(:table_name AS regclass) AND c.relkind = 'r')
ORDER BY c.relname

-- name: index_measure
-- pgstatindex of one B-tree index: sizes, page classes, leaf density, fragmentation.
SELECT s.index_size, s.tree_level, s.internal_pages, s.leaf_pages, s.empty_pages,
       s.deleted_pages, s.avg_leaf_density, s.leaf_fragmentation
FROM {{pgstattuple_schema}}.pgstatindex(CAST(:index_name AS regclass)) s

-- name: drop_index_concurrently
-- Drop a leftover index of an interrupted REINDEX CONCURRENTLY without blocking writers.
DROP INDEX CONCURRENTLY IF EXISTS {{schema}}.{{index}}

-- name: reindex_concurrently
-- Rebuild one index online: writers keep going, the swap takes only brief locks.
REINDEX INDEX CONCURRENTLY {{schema}}.{{index}}

-- name: vacuum_table
-- The table step after the indexes, for each of the queue's upkeep tables ({{table}}, its
-- qualified name): VACUUM takes a SHARE UPDATE EXCLUSIVE lock, which no INSERT, UPDATE,
-- DELETE or SELECT waits for, so producers and consumers go on; it frees the dead rows
-- the horizon allows and refreshes the statistics the dequeue's plan reads.
VACUUM (ANALYZE) {{table}}

-- name: kind_ring
-- A ring's own numbers (its slots are updated in place, never inserted or deleted): slots
-- free (not FULL) and FULL; the positions the two sequences have handed out and the gap
-- between them (pushes claimed minus pops claimed: messages waiting plus claims sessions
-- keep; below zero, pops wait ahead of the pushes); the share of its updates that stayed
-- HOT (fillfactor 50 keeps a slot's new version on its page: no index entry, pruned in
-- place; a falling share means pages fill up and updates start to leave index entries).
SELECT count(*) AS slots,
       count(*) FILTER (WHERE r.state <> 1) AS free_slots,
       count(*) FILTER (WHERE r.state = 1) AS full_slots,
       max(q.pushed) AS push_position, max(q.popped) AS pop_position,
       max(q.pushed) - max(q.popped) AS sequence_gap,
       (SELECT round(100.0 * s.n_tup_hot_upd / nullif(s.n_tup_upd, 0), 1) FROM pg_stat_user_tables s
         WHERE s.relid = CAST({{ring_regclass}} AS regclass)) AS hot_update_pct,
       (SELECT s.n_tup_upd FROM pg_stat_user_tables s WHERE s.relid = CAST({{ring_regclass}} AS regclass)) AS updates
FROM {{ring}} r,
     (SELECT (SELECT CASE WHEN p.is_called THEN p.last_value + 1 ELSE p.last_value END FROM {{push_seq}} p) AS pushed,
             (SELECT CASE WHEN p.is_called THEN p.last_value + 1 ELSE p.last_value END FROM {{pop_seq}} p) AS popped) q

-- name: kind_pending
-- A pending queue's items by due time: due (takeable now), not due yet, and overdue (due
-- more than :overdue_s seconds ago and still waiting: consumers are not keeping up), with
-- the oldest due item's wait.
SELECT count(*) FILTER (WHERE i.due_at <= now()) AS due,
       count(*) FILTER (WHERE i.due_at > now()) AS not_due,
       count(*) FILTER (WHERE i.due_at < now() - make_interval(secs => :overdue_s)) AS overdue,
       extract(epoch FROM now() - min(i.due_at) FILTER (WHERE i.due_at <= now()))::float8 AS oldest_due_s
FROM {{items}} i

-- name: kind_watermark
-- A watermark queue's stored low mark against the oldest waiting item: the lag is the
-- ghosts a new session walks before its first find (below zero: the hint is above a
-- waiting item, which correct_watermark must fix).
SELECT w.low, h.head, h.head - w.low AS lag, w.epoch, w.updated_at, w.corrected_at
FROM {{watermark}} w, (SELECT min(i.id) AS head FROM {{items}} i) h

-- name: table_vitals
-- Cheap numbers from the statistics collector for one of the queue's tables (of a
-- partitioned one, its partitions summed; the latest vacuum of any of them).
SELECT sum(s.n_live_tup)::bigint AS n_live_tup, sum(s.n_dead_tup)::bigint AS n_dead_tup,
       round(100.0 * sum(s.n_dead_tup) / nullif(sum(s.n_live_tup + s.n_dead_tup), 0), 1) AS dead_pct,
       round(100.0 * sum(s.n_tup_hot_upd) / nullif(sum(s.n_tup_upd), 0), 1) AS hot_pct,
       max(s.last_autovacuum) AS last_autovacuum, max(s.last_vacuum) AS last_vacuum,
       sum(pg_table_size(s.relid))::bigint AS table_bytes, sum(pg_indexes_size(s.relid))::bigint AS index_bytes
FROM pg_stat_user_tables s
WHERE s.relid IN (SELECT p.relid FROM pg_partition_tree(CAST(:table_name AS regclass)) p WHERE p.isleaf
                  UNION SELECT c.oid FROM pg_class c WHERE c.oid = CAST(:table_name AS regclass) AND c.relkind = 'r')
HAVING count(*) > 0

-- name: table_physical
-- pgstattuple_approx: exact dead tuples, estimated free space; skips all-visible pages. Of a
-- partitioned table, its partitions together (percentages weighted by their sizes).
SELECT sum(a.table_len)::bigint AS table_len,
       coalesce(sum(a.scanned_percent * a.table_len) / nullif(sum(a.table_len), 0), 0) AS scanned_percent,
       sum(a.dead_tuple_count)::bigint AS dead_tuple_count,
       coalesce(sum(a.dead_tuple_percent * a.table_len) / nullif(sum(a.table_len), 0), 0) AS dead_tuple_percent,
       coalesce(sum(a.approx_free_percent * a.table_len) / nullif(sum(a.table_len), 0), 0) AS approx_free_percent
FROM (SELECT p.relid FROM pg_partition_tree(CAST(:table_name AS regclass)) p WHERE p.isleaf
      UNION SELECT c.oid FROM pg_class c WHERE c.oid = CAST(:table_name AS regclass) AND c.relkind = 'r') p(relid),
     LATERAL {{pgstattuple_schema}}.pgstattuple_approx(p.relid) a

-- name: xmin_holders
-- What holds the xmin horizon back (VACUUM cannot remove row versions newer than it):
-- sessions of this database with an old snapshot (backend_xmin) or an open transaction
-- that wrote (backend_xid: an idle-in-transaction session has no snapshot but still
-- holds the horizon at its own xid), replication slots, prepared transactions. Oldest first.
SELECT 'backend' AS source,
       'pid ' || a.pid || ' (' || coalesce(a.state, '?') || ', ' || coalesce(a.usename::text, '?') || ')' AS holder,
       greatest(age(a.backend_xmin), age(a.backend_xid)) AS xmin_age,
       extract(epoch FROM clock_timestamp() - a.xact_start) AS seconds
FROM pg_stat_activity a
WHERE (a.backend_xmin IS NOT NULL OR a.backend_xid IS NOT NULL) AND a.pid <> pg_backend_pid()
  AND a.datname = current_database()
UNION ALL
SELECT 'replication_slot', 'slot ' || s.slot_name || CASE WHEN s.active THEN '' ELSE ' (inactive)' END,
       greatest(age(s.xmin), age(s.catalog_xmin)), NULL
FROM pg_replication_slots s
WHERE s.xmin IS NOT NULL OR s.catalog_xmin IS NOT NULL
UNION ALL
SELECT 'prepared_xact', 'prepared transaction ' || p.gid, age(p.transaction),
       extract(epoch FROM clock_timestamp() - p.prepared)
FROM pg_prepared_xacts p
WHERE p.database = current_database()
ORDER BY xmin_age DESC NULLS LAST

-- name: rot_state
-- The generation rotation of a reliable queue (reliable_0012; sql/postgresql/reliable.sql,
-- section create_rotator, holds the calls and why they are safe). Each call below is one
-- transaction of its own; a step is marked done (rot_mark) only after it committed. One
-- exception: the archive job runs a seal and its mark as one transaction (with the switch
-- before them, when the seal follows one), the mark just before the commit
-- (queuectl.jobs.archive, Rotator._switch, says why; a failed commit leaves the moved rows
-- to the truncate).
SELECT * FROM {{fn_rot_state}}()

-- name: rot_seal
-- Move the READY rows left in the previous epoch forward (NULL: nothing to seal; -1: more
-- than :limit there, the epoch stays open).
SELECT {{fn_rot_seal}}(:limit) AS moved

-- name: rot_mark
SELECT {{fn_rot_mark}}(:what, :epoch)

-- name: rot_next_empty
-- The oldest sealed epoch still to be emptied (NULL: none).
SELECT {{fn_rot_next_empty}}() AS epoch

-- name: rot_copy
-- Copy a batch of a slot's finished rows to history without a lock (before its truncate):
-- ids above :after, at most :batch.
SELECT * FROM {{fn_rot_copy}}(CAST(:slot AS smallint), :after, :batch)

-- name: rot_empty
-- Copy what finished since, move the unfinished rows forward and truncate the slot, under
-- a lock_timeout of :lock_timeout_ms (55P03 when the slot stays locked).
SELECT * FROM {{fn_rot_empty}}(:lock_timeout_ms)

-- name: rot_horizon
-- The transaction horizon before a precopy (reliable_0017 or later): every transaction below
-- it has ended, so whatever one of them finished the precopy's batches read (rot_empty_since).
SELECT pg_snapshot_xmin(pg_current_snapshot())::text AS horizon

-- name: rot_empty_since
-- rot_empty at reliable_0017 or later, told the epoch the caller precopied and the horizon
-- it took before (rot_horizon): the copy under the lock looks up in history only the rows
-- finished since.
SELECT * FROM {{fn_rot_empty}}(:lock_timeout_ms, :epoch, CAST(:horizon AS xid8))

-- name: rot_switch
-- New rows to the next epoch once the current one has had :items ids (NULL: not yet).
SELECT {{fn_rot_switch}}(:items) AS epoch

-- name: compact_probe
-- Compaction (queuectl.jobs.compact): whether a queue's tables have outgrown their live
-- rows, from numbers the server keeps anyway, with no scan of the tables: each table's size
-- (heap, TOAST, free space and visibility maps) and the statistics collector's live and dead
-- row versions. While the xmin horizon is pinned nothing prunes or vacuums a dead version, so
-- the dead count grows by one per update or delete; a TRUNCATE resets both counts.
SELECT t.name, pg_table_size(c.oid)::bigint AS bytes,
       coalesce(s.n_live_tup, 0)::bigint AS live, coalesce(s.n_dead_tup, 0)::bigint AS dead
FROM unnest(CAST(:tables AS text[])) WITH ORDINALITY AS t(name, ord)
JOIN pg_class c ON c.oid = to_regclass(t.name)
LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
ORDER BY t.ord

-- name: compact_ring
-- Give a ring's tables new files holding only their live rows, in one transaction: the slots,
-- the side table of large messages and a fan-out ring's subscriptions and claim rows, those
-- flagged 1 ({{ring_due}}, {{large_due}}, {{subs_due}}, {{slots_due}}: the job's probe found them
-- over their bound; a table left out keeps its file, as truncating an empty or small table
-- frees nothing and costs new files under the lock). Every table is locked ACCESS EXCLUSIVE,
-- within the transaction's lock_timeout (55P03 when a session holds any of them: the job
-- retries later rather than queue every push and pop behind it), so the copies are of one
-- moment. The subscriptions first, the ring after, as a fan-out consumer's call reads them
-- (sub_take): locking the ring first, the job held it while it waited for a consumer's
-- subscriptions, the consumer's next read waited for the ring, and each stalled the other
-- until the job's lock_timeout (a deadlock past deadlock_timeout); beside two consumers
-- calling back to back, a compaction missed its locks for more than 10 s at times, and
-- 0.5 s at most in this order (tests/test_compact.py). A flagged table's rows are copied into an array, the table truncated and the rows
-- inserted back with their own values (ids of the identity column included), in the order
-- the scan read them (sorting them cost half as much again under the lock). A temporary table
-- copies as fast but writes ~35 catalog rows per compaction, dead versions a pinned horizon
-- keeps in pg_class, pg_attribute, pg_type and pg_depend (bench/lab/compact_cost.py: 42 ms
-- against 34 ms for 8,192 rows, 283 against 318 ms for 50,000, on a busy 2-core machine). Kept as they are: the
-- sequences (TRUNCATE without RESTART IDENTITY), the slots' positions and states (so every
-- claim a session keeps still names its slot), a slot's pointer into the side table, the
-- tables' reloptions, grants, indexes and triggers (the fan-out guard fires on UPDATE only:
-- the inserts pass it). A push or pop that waited for the lock takes its snapshot after it
-- and sees the rows back. More than {{max_rows}} rows in all: SQLSTATE 54000 and nothing
-- changes. The rows copied and the seconds the lock was held are left in the session setting
-- queuectl.compacted.
DO $compact$
DECLARE
    v_ring  {{ring}}[] := '{}';
    v_large {{ring_large}}[] := '{}';
    v_subs  {{subs}}[] := '{}';
    v_slots {{sub_slots}}[] := '{}';
    v_t0    timestamptz;
    v_rows  bigint;
BEGIN
    LOCK TABLE {{subs}}, {{sub_slots}}, {{ring}}, {{ring_large}} IN ACCESS EXCLUSIVE MODE;
    v_t0 := clock_timestamp();
    IF {{ring_due}} = 1 THEN
        v_ring := ARRAY(SELECT r FROM {{ring}} r LIMIT {{max_rows}} + 1);
    END IF;
    IF {{large_due}} = 1 THEN
        v_large := ARRAY(SELECT l FROM {{ring_large}} l LIMIT {{max_rows}} + 1);
    END IF;
    IF {{subs_due}} = 1 THEN
        v_subs := ARRAY(SELECT s FROM {{subs}} s LIMIT {{max_rows}} + 1);
    END IF;
    IF {{slots_due}} = 1 THEN
        v_slots := ARRAY(SELECT s FROM {{sub_slots}} s LIMIT {{max_rows}} + 1);
    END IF;
    v_rows := cardinality(v_ring) + cardinality(v_large) + cardinality(v_subs) + cardinality(v_slots);
    IF v_rows > {{max_rows}} THEN
        RAISE EXCEPTION 'ring % holds more than % rows: not compacted', {{ring_regclass}}, {{max_rows}}
            USING ERRCODE = '54000';
    END IF;
    IF {{ring_due}} = 1 THEN
        TRUNCATE {{ring}};
        INSERT INTO {{ring}} SELECT * FROM unnest(v_ring);
    END IF;
    IF {{large_due}} = 1 THEN
        TRUNCATE {{ring_large}};
        INSERT INTO {{ring_large}} OVERRIDING SYSTEM VALUE SELECT * FROM unnest(v_large);
    END IF;
    IF {{subs_due}} = 1 THEN
        TRUNCATE {{subs}};
        INSERT INTO {{subs}} SELECT * FROM unnest(v_subs);
    END IF;
    IF {{slots_due}} = 1 THEN
        TRUNCATE {{sub_slots}};
        INSERT INTO {{sub_slots}} SELECT * FROM unnest(v_slots);
    END IF;
    PERFORM set_config('queuectl.compacted',
                       v_rows || ' ' || extract(epoch FROM clock_timestamp() - v_t0), false);
END
$compact$

-- name: compact_items
-- The same for the one-table kinds (heap, fifo, stack, pending, watermark): their items
-- table, drained by DELETE, gets a new file holding the waiting items (ids, payloads, times
-- kept; the id sequence too). A watermark queue's hint row is left alone: it is rewritten at
-- most once a second per consumer, and its low mark and epoch stay valid (ids do not change).
-- More than {{max_rows}} waiting items: SQLSTATE 54000 and nothing changes (the copy under
-- the lock stays short; a backlog that large is compacted once it has drained below it).
DO $compact$
DECLARE
    v_items {{items}}[];
    v_t0    timestamptz;
BEGIN
    LOCK TABLE {{items}} IN ACCESS EXCLUSIVE MODE;
    v_t0 := clock_timestamp();
    v_items := ARRAY(SELECT i FROM {{items}} i LIMIT {{max_rows}} + 1);
    IF cardinality(v_items) > {{max_rows}} THEN
        RAISE EXCEPTION 'queue table % holds more than % items: not compacted', {{items_regclass}}, {{max_rows}}
            USING ERRCODE = '54000';
    END IF;
    TRUNCATE {{items}};
    INSERT INTO {{items}} OVERRIDING SYSTEM VALUE SELECT * FROM unnest(v_items);
    PERFORM set_config('queuectl.compacted',
                       cardinality(v_items) || ' ' || extract(epoch FROM clock_timestamp() - v_t0), false);
END
$compact$

-- name: compact_result
-- What the compaction above left in the session: rows copied, seconds under the lock.
SELECT current_setting('queuectl.compacted', true) AS compacted
