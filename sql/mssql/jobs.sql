-- The maintenance jobs' statements on SQL Server (queuectl.jobs.*), per queue: the batch
-- jobs serve reliable queues, the upkeep sections (indexes, statistics, kind_*) every kind.
-- Section names follow sql/postgresql/jobs.sql where the job is the same (table_indexes,
-- index_measure, table_vitals, table_physical, xmin_holders return PostgreSQL's columns
-- from DMVs); the index upkeep statements are SQL Server's own (ALTER INDEX, UPDATE
-- STATISTICS instead of REINDEX CONCURRENTLY and VACUUM). What to do with an index is
-- decided in Python (queuectl.jobs.upkeep), not here.
--
-- Every batch statement here is one short transaction of its own (XACT_ABORT: any error
-- rolls the whole batch back), so a killed job loses at most the batch in flight.
-- Batch sizes stay below 5,000 rows: SQL Server escalates to a table lock when one
-- statement holds 5,000 locks on one table or index reference, which would stall every
-- producer and consumer. The jobs default to 2,000 and refuse more than 4,000.

-- name: set_session_timeouts
-- Lock and deadlock behaviour of a maintenance session: wait at most lock_timeout_ms for
-- a lock (error 1222, retried by the job later), and lose deadlocks to application
-- sessions. SET LOCK_TIMEOUT takes no variable, so the value is a validated integer.
SET LOCK_TIMEOUT {{lock_timeout_ms}};
SET DEADLOCK_PRIORITY LOW;

-- name: reset_session_timeouts
-- Back to SQL Server's defaults (wait for locks without limit, normal deadlock priority),
-- before a connection that ran with set_session_timeouts goes back to the pool.
SET LOCK_TIMEOUT -1;
SET DEADLOCK_PRIORITY NORMAL;

-- name: set_local_timeouts
-- The per-batch limits of archive, stale reset and inspect (PostgreSQL sets them for one
-- transaction). SQL Server has no transaction-local lock timeout: the setting holds for
-- the job's session, which is the job's own connection, so it is the same as
-- set_session_timeouts. Rendered, not bound: inside sp_executesql (any statement with
-- parameters) a SET is undone when it returns. No statement timeout exists on the server
-- side; the jobs bound their work by batch size and lock waits.
SET LOCK_TIMEOUT {{lock_timeout_ms}};
SET DEADLOCK_PRIORITY LOW;

-- name: archive_batch
-- Move one batch of finished rows, with their payloads, from meta/data to history. On a
-- queue at reliable_0012 the job renders it once per generation slot ({{meta}}, {{data}}
-- and the index names are then that slot's: <queue>_meta is a view over the slots there).
-- DONE rows older than :min_age_seconds and DEAD rows older than :dead_min_age_seconds,
-- DONE first then DEAD, oldest first: an ordered seek of the filtered index on finished
-- rows, meta (status, finished_at) WHERE status >= 2 (reliable.sql, finished_idx).
--  1. The pick locks the batch's keys (UPDLOCK, held to COMMIT; READPAST skips rows
--     someone else holds) and deletes their data rows, keeping the payloads in @moved.
--  2. DELETE TOP (@batch) ... OUTPUT deleted.* INTO history moves the meta rows with
--     their payloads. The history table has no trigger, foreign key or CHECK constraint
--     (OUTPUT INTO refuses them). This TOP chooses nothing (DELETE TOP has no ORDER BY):
--     the join to @moved names the rows, the ordered pick in step 1 chose them.
-- Plans, pinned by hints (https://learn.microsoft.com/en-us/sql/t-sql/queries/hints-transact-sql-table):
-- the pick is a range seek of finished_idx (status >= 2) in key order, which is its ORDER
-- BY, reading only the index (id is its row locator), TOP stopping after @batch rows,
-- READPAST skipping keys others hold; the data and meta rows are then found by one seek of
-- each clustered primary key (index 1) per id. INDEX + FORCESEEK leave only those paths, so
-- no scan of meta or data reads, sorts or locks rows outside the batch. UPDLOCK makes the
-- pick a locking read with READ_COMMITTED_SNAPSHOT on too (reliable.sql, create_dequeue).
-- Returns one row: moved.
SET NOCOUNT ON; SET ROWCOUNT 0;
SET XACT_ABORT ON;
DECLARE @batch int = :batch;
DECLARE @now datetime2(6) = SYSUTCDATETIME();
DECLARE @done_before datetime2(6) = DATEADD(second, -CAST(:min_age_seconds AS int), @now);
DECLARE @dead_before datetime2(6) = DATEADD(second, -CAST(:dead_min_age_seconds AS int), @now);
DECLARE @moved TABLE (id bigint NOT NULL PRIMARY KEY, payload varbinary(max), headers nvarchar(max));
DECLARE @rows int;
IF @batch IS NULL OR @batch < 1 OR @batch > 4000
    THROW 50002, 'queuectl: archive batch must be 1 to 4000 rows (lock escalation starts at 5000)', 1;
BEGIN TRANSACTION;
WITH picked AS (
    SELECT TOP (@batch) m.id
    FROM {{meta}} AS m WITH (UPDLOCK, READPAST, ROWLOCK, INDEX({{finished_idx}}), FORCESEEK)
    WHERE m.status >= 2
      AND m.finished_at < CASE WHEN m.status = 2 THEN @done_before ELSE @dead_before END
    ORDER BY m.status, m.finished_at
)
DELETE d
OUTPUT deleted.id, deleted.payload, deleted.headers INTO @moved (id, payload, headers)
FROM {{data}} AS d WITH (ROWLOCK, INDEX(1), FORCESEEK)
JOIN picked AS p ON p.id = d.id;
DELETE TOP (@batch) m
OUTPUT deleted.id, deleted.priority, deleted.due_at, deleted.status, deleted.title,
       deleted.attempts, deleted.max_attempts, deleted.lease_owner, deleted.enqueued_at,
       deleted.dequeued_at, deleted.finished_at, deleted.last_error, mv.payload, mv.headers,
       @now
INTO {{history}} (id, priority, due_at, status, title, attempts, max_attempts, lease_owner,
                  enqueued_at, dequeued_at, finished_at, last_error, payload, headers,
                  archived_at)
FROM {{meta}} AS m WITH (ROWLOCK, INDEX(1), FORCESEEK)
JOIN @moved AS mv ON mv.id = m.id;
SET @rows = @@ROWCOUNT;
COMMIT TRANSACTION;
SELECT @rows AS moved;

-- name: purge_history_batch
-- Delete one batch of history rows archived more than :retention_seconds ago, oldest
-- first (an index on history (archived_at) makes this a seek). Returns one row: purged.
-- When the history is exported to a Parquet lake, only rows some lake holds may go.
-- Plan: a range seek of history_at_idx (archived_at < @before) in key order, which is the
-- ORDER BY, reading only the index (id is its row locator), TOP stopping after @batch
-- rows, READPAST skipping keys others hold; INDEX + FORCESEEK leave only that path. UPDLOCK
-- makes it a locking read with READ_COMMITTED_SNAPSHOT on too.
SET NOCOUNT ON; SET ROWCOUNT 0;
DECLARE @batch int = :batch;
DECLARE @before datetime2(6) = DATEADD(second, -CAST(:retention_seconds AS int), SYSUTCDATETIME());
IF @batch IS NULL OR @batch < 1 OR @batch > 4000
    THROW 50002, 'queuectl: purge batch must be 1 to 4000 rows (lock escalation starts at 5000)', 1;
WITH old AS (
    SELECT TOP (@batch) h.id
    FROM {{history}} AS h WITH (UPDLOCK, READPAST, ROWLOCK, INDEX({{history_at_idx}}), FORCESEEK)
    WHERE h.archived_at < @before
      AND (NOT EXISTS (SELECT 1 FROM {{exports}} AS e WHERE e.queue = :queue)
           OR EXISTS (SELECT 1 FROM {{exports}} AS e
                       WHERE e.queue = :queue AND h.id <= e.exported_upto_id
                         AND h.archived_at < e.archived_before))
    ORDER BY h.archived_at
)
DELETE FROM old;
SELECT @@ROWCOUNT AS purged;

-- name: reset_stale_batch
-- Expired leases: the consumer died or stalled. Rendered once per generation slot on a
-- queue at reliable_0012, as archive_batch. Back to READY (the expired attempt was
-- already counted when the item was claimed), or DEAD when that was its last attempt.
-- READPAST: a consumer still inside its transaction is skipped, never waited for.
-- Plan: the dequeue's first step (reliable.sql, create_dequeue): a range seek of leased_idx
-- (leased_until < @now) in key order, which is the ORDER BY, TOP stopping after @batch
-- rows; INDEX + FORCESEEK leave only that path. UPDLOCK makes it a locking read with
-- READ_COMMITTED_SNAPSHOT on too, so READPAST skips a consumer's rows in flight.
-- Returns the rows changed (id, status).
SET NOCOUNT ON; SET ROWCOUNT 0;
DECLARE @batch int = :batch;
DECLARE @now datetime2(6) = SYSUTCDATETIME();
WITH stale AS (
    SELECT TOP (@batch) m.id, m.status, m.attempts, m.max_attempts, m.lease_owner,
                        m.leased_until, m.finished_at, m.last_error
    FROM {{meta}} AS m WITH (UPDLOCK, READPAST, ROWLOCK, INDEX({{leased_idx}}), FORCESEEK)
    WHERE m.status = 1 AND m.leased_until < @now
    ORDER BY m.leased_until
)
UPDATE stale SET
    status       = CASE WHEN attempts >= max_attempts THEN 3 ELSE 0 END,
    finished_at  = CASE WHEN attempts >= max_attempts THEN @now END,
    last_error   = CONCAT(N'lease of ', COALESCE(lease_owner, N'an unknown consumer'),
                          N' expired at ', CONVERT(nvarchar(33), leased_until, 126),
                          N' UTC (attempt ', attempts, N' of ', max_attempts, N')'),
    lease_owner  = NULL,
    leased_until = NULL
OUTPUT inserted.id, inserted.status;

-- name: table_indexes
-- The indexes of one of the queue's tables (:table_name, its quoted two-part name), with
-- their size (used pages of all partitions) and state, as on PostgreSQL: valid = not
-- disabled; method 'btree' for rowstore clustered and nonclustered indexes (the ones
-- sys.dm_db_index_physical_stats measures and ALTER INDEX maintains). On SQL Server the
-- clustered index is the table itself: maintaining it compacts the table.
SELECT i.name AS index_name,
       CAST(CASE WHEN i.is_disabled = 0 THEN 1 ELSE 0 END AS bit) AS valid,
       COALESCE(SUM(ps.used_page_count), 0) * 8192 AS bytes,
       COALESCE(SUM(ps.used_page_count), 0) AS pages,
       CASE WHEN i.type IN (1, 2) THEN N'btree' ELSE LOWER(i.type_desc) END AS method
FROM sys.indexes AS i
LEFT JOIN sys.dm_db_partition_stats AS ps ON ps.object_id = i.object_id AND ps.index_id = i.index_id
WHERE i.object_id = OBJECT_ID(:table_name, N'U') AND i.index_id > 0 AND i.is_hypothetical = 0
GROUP BY i.name, i.is_disabled, i.type, i.type_desc
ORDER BY i.name

-- name: index_capabilities
-- What this server can do online (reference dba.md 1.7): online index operations exist in
-- EngineEdition 3 (Enterprise, Developer, Evaluation), 5 (Azure SQL Database) and 8
-- (Managed Instance); a resumable online rebuild from SQL Server 2017 (major version 14)
-- on, and always on Azure (which reports major version 12).
SELECT CAST(CASE WHEN CAST(SERVERPROPERTY('EngineEdition') AS int) IN (3, 5, 8)
                 THEN 1 ELSE 0 END AS bit) AS online_rebuild,
       CAST(CASE WHEN CAST(SERVERPROPERTY('EngineEdition') AS int) IN (5, 8)
                   OR (CAST(SERVERPROPERTY('EngineEdition') AS int) = 3
                       AND CAST(SERVERPROPERTY('ProductMajorVersion') AS int) >= 14)
                 THEN 1 ELSE 0 END AS bit) AS resumable_rebuild

-- name: index_measure
-- sys.dm_db_index_physical_stats of one index (:index_name of :table_name), leaf level,
-- in-row data, all partitions: leaf pages, fragmentation and page density (weighted by
-- pages), ghost and version-ghost records, live records, and what the decision needs
-- (ALLOW_PAGE_LOCKS: REORGANIZE fails without it; the fill factor, 0 meaning 100).
-- SAMPLED reads every page of an index under 10,000 pages and 1% above, so ghosts and
-- density are filled (LIMITED leaves them NULL). The ids are looked up first: the DMF
-- given a NULL object id would scan the whole database.
SET NOCOUNT ON; SET ROWCOUNT 0;
DECLARE @object_id int = OBJECT_ID(:table_name, N'U');
DECLARE @index_id int = (SELECT i.index_id FROM sys.indexes AS i
                         WHERE i.object_id = @object_id AND i.name = :index_name);
IF @object_id IS NULL OR @index_id IS NULL
    THROW 50004, 'queuectl: index not found on the queue table', 1;
SELECT SUM(ps.page_count) AS leaf_pages,
       SUM(ps.avg_fragmentation_in_percent * ps.page_count) / NULLIF(SUM(ps.page_count), 0)
                                                                  AS avg_fragmentation_in_percent,
       SUM(ps.avg_page_space_used_in_percent * ps.page_count) / NULLIF(SUM(ps.page_count), 0)
                                                                  AS avg_page_space_used_in_percent,
       SUM(ps.record_count) AS record_count,
       SUM(ps.ghost_record_count) AS ghost_record_count,
       SUM(ps.version_ghost_record_count) AS version_ghost_record_count,
       MAX(CAST(i.allow_page_locks AS int)) AS allow_page_locks,
       COALESCE(NULLIF(MAX(CAST(i.fill_factor AS int)), 0), 100) AS fill_factor
FROM sys.dm_db_index_physical_stats(DB_ID(), @object_id, @index_id, NULL, 'SAMPLED') AS ps
JOIN sys.indexes AS i ON i.object_id = ps.object_id AND i.index_id = ps.index_id
WHERE ps.alloc_unit_type_desc = N'IN_ROW_DATA' AND ps.index_level = 0;

-- name: reorganize_index
-- The light online fix, between the low and high thresholds (and above the high one where
-- the edition has no online rebuild): compacts the leaf level toward the fill factor and
-- reorders its pages, removing ghosts as it goes; always online, and interruptible
-- without losing the work done. Needs ALLOW_PAGE_LOCKS (the job checks it first).
ALTER INDEX {{index}} ON {{table}} REORGANIZE WITH (LOB_COMPACTION = ON)

-- name: update_index_statistics
-- REORGANIZE does not update statistics (a rebuild does, with a full scan): done after it.
UPDATE STATISTICS {{table}} {{index}}

-- name: rebuild_index_online
-- Above the high threshold, where the edition has online index operations but no
-- resumable rebuild: the index is rebuilt beside the old one while writes go on. Its
-- final schema lock waits at low priority for {{max_wait_minutes}} minute(s) and then the
-- rebuild gives up itself (ABORT_AFTER_WAIT = SELF) rather than block producers.
ALTER INDEX {{index}} ON {{table}} REBUILD WITH (
    ONLINE = ON (WAIT_AT_LOW_PRIORITY (MAX_DURATION = {{max_wait_minutes}} MINUTES, ABORT_AFTER_WAIT = SELF)))

-- name: rebuild_index_resumable
-- As rebuild_index_online, resumable: after {{max_duration_minutes}} minute(s) the rebuild
-- pauses (its work is kept, sys.index_resumable_operations shows it) and the next run
-- resumes it (paused_rebuilds, resume_rebuild), so one run never outlasts its time limit.
ALTER INDEX {{index}} ON {{table}} REBUILD WITH (
    ONLINE = ON (WAIT_AT_LOW_PRIORITY (MAX_DURATION = {{max_wait_minutes}} MINUTES, ABORT_AFTER_WAIT = SELF)),
    RESUMABLE = ON, MAX_DURATION = {{max_duration_minutes}} MINUTES)

-- name: paused_rebuilds
-- Resumable rebuilds of the table's indexes that paused (their time limit ran out, or a
-- failover or a PAUSE stopped them): both copies are maintained by every write until the
-- rebuild is resumed or aborted, so the job resumes them before anything else. Sizes as
-- in table_indexes.
SELECT r.name AS index_name,
       COALESCE((SELECT SUM(ps.used_page_count) FROM sys.dm_db_partition_stats AS ps
                 WHERE ps.object_id = r.object_id AND ps.index_id = r.index_id), 0) * 8192 AS bytes,
       r.percent_complete
FROM sys.index_resumable_operations AS r
WHERE r.object_id = OBJECT_ID(:table_name, N'U') AND r.state = 1
ORDER BY r.name

-- name: resume_rebuild
-- Continue a paused resumable rebuild, with the same time limit and low-priority wait.
ALTER INDEX {{index}} ON {{table}} RESUME WITH (
    MAX_DURATION = {{max_duration_minutes}} MINUTES,
    WAIT_AT_LOW_PRIORITY (MAX_DURATION = {{max_wait_minutes}} MINUTES, ABORT_AFTER_WAIT = SELF))

-- name: update_statistics_table
-- The counterpart of PostgreSQL's VACUUM (ANALYZE) step, for each of the queue's upkeep
-- tables ({{table}}, its two-part name): ghost cleanup needs no command, statistics do
-- (the dequeue's plan reads them). UPDATE STATISTICS takes only a schema stability lock,
-- which no INSERT, UPDATE or DELETE waits for.
UPDATE STATISTICS {{table}}

-- name: kind_ring
-- A ring's own numbers (its slots are updated in place, never inserted or deleted): slots
-- free (not FULL) and FULL; the positions the two sequences have handed out
-- (last_used_value is NULL until the first draw, SQL Server 2017+) and the gap between
-- them (pushes claimed minus pops claimed: messages waiting plus claims sessions keep;
-- below zero, pops wait ahead of the pushes); page splits of the clustered slots since
-- the index's metadata was last cached (leaf_allocation_count of
-- sys.dm_db_index_operational_stats: a ring at its FILLFACTOR 20 should show few, a growing
-- count means its messages outgrow the free space a page keeps). SQL Server has no HOT
-- updates: hot_update_pct is NULL. The count is a plain read (under READ_COMMITTED_SNAPSHOT
-- it reads versions and waits for no one; without it it waits at most the job's lock
-- timeout for a slot a push or pop holds).
SET NOCOUNT ON; SET ROWCOUNT 0;
SELECT COUNT_BIG(*) AS slots,
       COUNT_BIG(CASE WHEN r.state <> 1 THEN 1 END) AS free_slots,
       COUNT_BIG(CASE WHEN r.state = 1 THEN 1 END) AS full_slots,
       MAX(q.pushed) AS push_position,
       MAX(q.popped) AS pop_position,
       MAX(q.pushed) - MAX(q.popped) AS sequence_gap,
       CAST(NULL AS float) AS hot_update_pct,
       MAX(o.page_splits) AS page_splits
FROM {{ring}} AS r
CROSS JOIN (
    SELECT COALESCE((SELECT CAST(s.last_used_value AS bigint) FROM sys.sequences AS s
                     WHERE s.object_id = OBJECT_ID({{push_seq_regclass}})), -1) + 1 AS pushed,
           COALESCE((SELECT CAST(s.last_used_value AS bigint) FROM sys.sequences AS s
                     WHERE s.object_id = OBJECT_ID({{pop_seq_regclass}})), -1) + 1 AS popped
) AS q
OUTER APPLY (
    SELECT SUM(os.leaf_allocation_count) AS page_splits
    FROM sys.dm_db_index_operational_stats(DB_ID(), OBJECT_ID({{ring_regclass}}), 1, NULL) AS os
) AS o;

-- name: kind_pending
-- A pending queue's items by due time: due (takeable now), not due yet, and overdue (due
-- more than :overdue_s seconds ago and still waiting: consumers are not keeping up), with
-- the oldest due item's wait.
SELECT COUNT_BIG(CASE WHEN i.due_at <= SYSUTCDATETIME() THEN 1 END) AS due,
       COUNT_BIG(CASE WHEN i.due_at > SYSUTCDATETIME() THEN 1 END) AS not_due,
       COUNT_BIG(CASE WHEN i.due_at < DATEADD(second, -CAST(:overdue_s AS int), SYSUTCDATETIME())
                      THEN 1 END) AS overdue,
       DATEDIFF_BIG(microsecond, MIN(CASE WHEN i.due_at <= SYSUTCDATETIME() THEN i.due_at END),
                    SYSUTCDATETIME()) / 1e6 AS oldest_due_s
FROM {{items}} AS i

-- name: kind_watermark
-- A watermark queue's stored low mark against the oldest waiting item: the lag is the
-- ghosts a new session walks before its first find (below zero: the hint is above a
-- waiting item, which correct_watermark must fix).
SELECT w.low, h.head, h.head - w.low AS lag, w.epoch, w.updated_at, w.corrected_at
FROM {{watermark}} AS w
CROSS JOIN (SELECT MIN(i.id) AS head FROM {{items}} AS i) AS h

-- name: table_vitals
-- Cheap numbers for one of the queue's tables (:table_name), PostgreSQL's columns:
-- n_live_tup = rows of the heap or clustered index (sys.dm_db_partition_stats);
-- n_dead_tup = its ghost + version-ghost records (SAMPLED leaf level, only for tables of
-- at most 131,072 pages = 1 GB, else NULL); hot_pct, last_autovacuum, last_vacuum NULL
-- (no HOT updates, no VACUUM); table_bytes and index_bytes from used pages.
SET NOCOUNT ON; SET ROWCOUNT 0;
DECLARE @object_id int = OBJECT_ID(:table_name, N'U');
IF @object_id IS NULL
    THROW 50004, 'queuectl: queue table not found', 1;
WITH p AS (
    SELECT SUM(CASE WHEN ps.index_id IN (0, 1) THEN ps.row_count END) AS live_rows,
           COALESCE(SUM(CASE WHEN ps.index_id IN (0, 1) THEN ps.used_page_count END), 0) AS table_pages,
           COALESCE(SUM(CASE WHEN ps.index_id > 1 THEN ps.used_page_count END), 0) AS index_pages
    FROM sys.dm_db_partition_stats AS ps
    WHERE ps.object_id = @object_id
)
SELECT p.live_rows AS n_live_tup,
       g.ghosts AS n_dead_tup,
       ROUND(100.0 * g.ghosts / NULLIF(p.live_rows + g.ghosts, 0), 1) AS dead_pct,
       CAST(NULL AS float) AS hot_pct,
       CAST(NULL AS datetime2(6)) AS last_autovacuum,
       CAST(NULL AS datetime2(6)) AS last_vacuum,
       p.table_pages * 8192 AS table_bytes,
       p.index_pages * 8192 AS index_bytes
FROM p
OUTER APPLY (
    SELECT SUM(f.ghost_record_count + COALESCE(f.version_ghost_record_count, 0)) AS ghosts
    FROM sys.dm_db_index_physical_stats(DB_ID(), @object_id,
             CASE WHEN OBJECTPROPERTY(@object_id, 'TableHasClustIndex') = 1 THEN 1 ELSE 0 END,
             NULL, 'SAMPLED') AS f
    WHERE p.table_pages <= 131072
      AND f.index_level = 0 AND f.alloc_unit_type_desc = N'IN_ROW_DATA'
) AS g;

-- name: table_physical
-- pgstattuple_approx's columns for one table (:table_name), from the heap or clustered
-- index leaf in SAMPLED mode: approx_free_percent = 100 - page density, dead tuples =
-- ghost + version-ghost records and their share of the bytes.
SET NOCOUNT ON; SET ROWCOUNT 0;
DECLARE @object_id int = OBJECT_ID(:table_name, N'U');
IF @object_id IS NULL
    THROW 50004, 'queuectl: queue table not found', 1;
SELECT SUM(ps.page_count) * 8192 AS table_len,
       CASE WHEN SUM(ps.page_count) < 10000 THEN 100.0 ELSE 1.0 END AS scanned_percent,
       SUM(ps.ghost_record_count + COALESCE(ps.version_ghost_record_count, 0)) AS dead_tuple_count,
       100.0 * SUM((ps.ghost_record_count + COALESCE(ps.version_ghost_record_count, 0)) * ps.avg_record_size_in_bytes)
         / NULLIF(SUM(ps.page_count) * 8192.0, 0) AS dead_tuple_percent,
       100.0 - SUM(ps.avg_page_space_used_in_percent * ps.page_count) / NULLIF(SUM(ps.page_count), 0)
         AS approx_free_percent
FROM sys.dm_db_index_physical_stats(DB_ID(), @object_id,
         CASE WHEN OBJECTPROPERTY(@object_id, 'TableHasClustIndex') = 1 THEN 1 ELSE 0 END,
         NULL, 'SAMPLED') AS ps
WHERE ps.index_level = 0 AND ps.alloc_unit_type_desc = N'IN_ROW_DATA';

-- name: xmin_holders
-- What holds ghost cleanup back, PostgreSQL's columns (source, holder, xmin_age, seconds),
-- longest first: sessions with a transaction that wrote to this database (its deleted
-- rows stay ghosts until it ends) or a row-versioning (snapshot) transaction anywhere on
-- the instance (version ghosts newer than it are kept; the version store is shared);
-- availability replicas whose ghost low-water mark holds cleanup on this primary
-- (readable secondaries); prepared distributed transactions. xmin_age is NULL: SQL
-- Server's sequence numbers are not transaction ages. Without VIEW SERVER STATE: no rows.
SET NOCOUNT ON; SET ROWCOUNT 0;
IF COALESCE(HAS_PERMS_BY_NAME(NULL, NULL, 'VIEW SERVER STATE'), 0) = 1
    SELECT h.source, h.holder, h.xmin_age, h.seconds
    FROM (
        SELECT N'backend' AS source,
               CONCAT(N'session ', s.session_id, N' (',
                      CASE WHEN r.session_id IS NULL THEN N'idle in transaction' ELSE N'active' END,
                      N', ', s.login_name,
                      CASE WHEN snap.transaction_id IS NOT NULL THEN N', snapshot' ELSE N'' END, N')') AS holder,
               CAST(NULL AS bigint) AS xmin_age,
               DATEDIFF_BIG(millisecond, at.transaction_begin_time, GETDATE()) / 1e3 AS seconds
        FROM sys.dm_tran_session_transactions AS st
        JOIN sys.dm_tran_active_transactions AS at ON at.transaction_id = st.transaction_id
        JOIN sys.dm_exec_sessions AS s ON s.session_id = st.session_id
        LEFT JOIN sys.dm_exec_requests AS r ON r.session_id = s.session_id
        LEFT JOIN sys.dm_tran_active_snapshot_database_transactions AS snap
               ON snap.transaction_id = at.transaction_id
        WHERE s.session_id <> @@SPID AND s.is_user_process = 1
          AND (snap.transaction_id IS NOT NULL
               OR EXISTS (SELECT 1 FROM sys.dm_tran_database_transactions AS dt
                          WHERE dt.transaction_id = at.transaction_id AND dt.database_id = DB_ID()
                            AND dt.database_transaction_log_record_count > 0))
        UNION ALL
        SELECT N'replication_slot',
               CONCAT(N'availability replica ', ar.replica_server_name,
                      CASE WHEN rs.synchronization_state IN (1, 2) THEN N'' ELSE N' (not synchronizing)' END),
               CAST(NULL AS bigint), CAST(NULL AS float)
        FROM sys.dm_hadr_database_replica_states AS rs
        JOIN sys.availability_replicas AS ar ON ar.replica_id = rs.replica_id
        WHERE rs.database_id = DB_ID() AND rs.is_local = 0
          AND rs.low_water_mark_for_ghosts IS NOT NULL AND ar.secondary_role_allow_connections > 0
        UNION ALL
        SELECT N'prepared_xact', CONCAT(N'prepared transaction ', CAST(at.transaction_uow AS nvarchar(36))),
               CAST(NULL AS bigint),
               DATEDIFF_BIG(millisecond, at.transaction_begin_time, GETDATE()) / 1e3
        FROM sys.dm_tran_active_transactions AS at
        WHERE at.transaction_type = 4 AND (at.transaction_state = 5 OR at.dtc_state = 2)
          AND at.transaction_uow IS NOT NULL
    ) AS h
    ORDER BY h.seconds DESC;
ELSE
    SELECT CAST(NULL AS nvarchar(16)) AS source, CAST(NULL AS nvarchar(300)) AS holder,
           CAST(NULL AS bigint) AS xmin_age, CAST(NULL AS float) AS seconds
    WHERE 1 = 0;

-- name: version_store
-- How much row-version store this database holds (tempdb, or the persistent version
-- store with Accelerated Database Recovery, which this view does not cover), and
-- whether the database versions rows at all. SQL Server 2016 SP2 / 2017 and later.
SELECT d.is_read_committed_snapshot_on,
       d.snapshot_isolation_state_desc,
       (SELECT v.reserved_space_kb FROM sys.dm_tran_version_store_space_usage AS v
        WHERE v.database_id = DB_ID()) AS version_store_kb
FROM sys.databases AS d
WHERE d.database_id = DB_ID();

-- name: snapshot_holders
-- What keeps version ghosts alive: the oldest snapshot transactions (SNAPSHOT isolation,
-- RCSI statements, online index builds, triggers, MARS), longest running first. Ghost
-- cleanup cannot remove versions these may still read, so maintenance waits for them.
SELECT TOP (20)
       a.session_id, a.elapsed_time_seconds, a.is_snapshot, a.transaction_sequence_num,
       a.max_version_chain_traversed, s.login_name, s.host_name, s.program_name, s.status,
       s.open_transaction_count
FROM sys.dm_tran_active_snapshot_database_transactions AS a
LEFT JOIN sys.dm_exec_sessions AS s ON s.session_id = a.session_id
ORDER BY a.elapsed_time_seconds DESC;

-- name: rot_state
-- The generation rotation of a reliable queue (reliable_0012; sql/mssql/reliable.sql,
-- section create_rotator, holds the procedures and why they are safe): the same calls as
-- PostgreSQL's, so queuectl.jobs.archive runs the rotation on both engines. Each call below
-- is one transaction of its own; a step is marked done (rot_mark) only after it committed.
-- A call whose procedure returns its outcome in OUTPUT parameters selects them here, as
-- one row with PostgreSQL's columns.
EXEC {{fn_rot_state}}

-- name: rot_seal
-- Move the READY rows left in the previous epoch forward (NULL: nothing to seal; -1: more
-- than :limit there, the epoch stays open).
EXEC {{fn_rot_seal}} @limit = :limit

-- name: rot_mark
-- Record a committed step; one row, as PostgreSQL's call returns.
SET NOCOUNT ON; SET ROWCOUNT 0;
EXEC {{fn_rot_mark}} @what = :what, @epoch = :epoch;
SELECT CAST(1 AS int) AS marked;

-- name: rot_next_empty
-- The oldest sealed epoch still to be emptied (NULL: none).
SET NOCOUNT ON; SET ROWCOUNT 0;
DECLARE @epoch bigint;
EXEC {{fn_rot_next_empty}} @epoch = @epoch OUTPUT;
SELECT @epoch AS epoch;

-- name: rot_copy
-- Move a batch of a slot's finished rows to history under row locks (before its
-- truncate): ids above :after, at most :batch (4,000 at most: lock escalation).
SET NOCOUNT ON; SET ROWCOUNT 0;
DECLARE @copied bigint, @last_id bigint;
EXEC {{fn_rot_copy}} @slot = :slot, @after = :after, @batch = :batch, @copied = @copied OUTPUT,
                     @last_id = @last_id OUTPUT;
SELECT @copied AS copied, @last_id AS last_id;

-- name: rot_empty
-- Move what finished since to history, the unfinished rows forward, and truncate the slot,
-- under the procedure's LOCK_TIMEOUT 50 (error 1222 when the slot stays locked; the job
-- retries). SET LOCK_TIMEOUT takes a constant only, so the procedure holds the job's 50 ms
-- (archive.py: EMPTY_LOCK_TIMEOUT_MS); the job's lock_timeout_ms value is not read here.
EXEC {{fn_rot_empty}}

-- name: rot_switch
-- New rows to the next epoch once the current one has had :items ids (NULL: not yet).
EXEC {{fn_rot_switch}} @items = :items

-- name: compact_probe
-- Compaction (queuectl.jobs.compact) is PostgreSQL's: there a pinned xmin horizon keeps every
-- dead row version in the queue's own tables, and only a new file (TRUNCATE) frees them. On
-- SQL Server an UPDATE writes the row in place and, under READ_COMMITTED_SNAPSHOT or SNAPSHOT
-- isolation, copies the previous version to the version store (tempdb, or the persistent
-- version store with accelerated database recovery): the ring's slots keep their size however
-- long a snapshot stays open, and what grows is the version store, which no work on the
-- queue's tables shrinks. The DELETE-drained kinds differ: a deleted row stays a ghost record
-- while a snapshot may still read it, so a long snapshot transaction keeps their ghosts in the
-- table's pages (sys.dm_db_index_physical_stats: version_ghost_record_count; health's
-- version_store and snapshot_holders name the holder; https://www.red-gate.com/simple-talk/sql/performance/read-committed-snapshot-isolation-high-version_ghost_record_count/),
-- and the ghost cleanup task removes them within seconds of its end. A T-SQL compaction of
-- those tables is not built: the job does nothing on SQL Server. Empty on purpose.

-- name: compact_ring
-- PostgreSQL only (see compact_probe). Empty on purpose.

-- name: compact_items
-- PostgreSQL only (see compact_probe). Empty on purpose.

-- name: compact_result
-- PostgreSQL only (see compact_probe). Empty on purpose.
