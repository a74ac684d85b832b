-- The maintenance jobs' statements on PostgreSQL (queuectl.jobs.*), per reliable queue.
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

-- name: archive_batch
-- Move one batch of finished rows, with their payloads, from meta/data to history.
-- DONE rows older than :min_age_seconds and DEAD rows older than :dead_min_age_seconds,
-- oldest first, through the partial index on finished rows. SKIP LOCKED: never wait on a
-- row someone else holds. The two picks are MATERIALIZED so the planner cannot flatten
-- them into the DELETEs (a flattened plan may touch more rows than the LIMIT).
-- The data rows are deleted explicitly (the ON DELETE CASCADE then finds nothing left),
-- so their payloads reach history in the same statement.
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
-- The indexes of one of the queue's tables, with their size and validity.
SELECT c.relname AS index_name, i.indisvalid AS valid, pg_relation_size(c.oid) AS bytes,
       pg_relation_size(c.oid) / current_setting('block_size')::int AS pages,
       am.amname AS method
FROM pg_index i
JOIN pg_class c ON c.oid = i.indexrelid
JOIN pg_am am ON am.oid = c.relam
WHERE i.indrelid = CAST(:table_name AS regclass)
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

-- name: vacuum_meta
VACUUM (ANALYZE) {{meta}}

-- name: vacuum_data
VACUUM (ANALYZE) {{data}}

-- name: table_vitals
-- Cheap numbers from the statistics collector for one of the queue's tables.
SELECT s.n_live_tup, s.n_dead_tup,
       round(100.0 * s.n_dead_tup / nullif(s.n_live_tup + s.n_dead_tup, 0), 1) AS dead_pct,
       round(100.0 * s.n_tup_hot_upd / nullif(s.n_tup_upd, 0), 1) AS hot_pct,
       s.last_autovacuum, s.last_vacuum,
       pg_table_size(s.relid) AS table_bytes, pg_indexes_size(s.relid) AS index_bytes
FROM pg_stat_user_tables s
WHERE s.relid = CAST(:table_name AS regclass)

-- name: table_physical
-- pgstattuple_approx: exact dead tuples, estimated free space; skips all-visible pages.
SELECT a.table_len, a.scanned_percent, a.dead_tuple_count, a.dead_tuple_percent,
       a.approx_free_percent
FROM {{pgstattuple_schema}}.pgstattuple_approx(CAST(:table_name AS regclass)) a

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
