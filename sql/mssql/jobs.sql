-- The maintenance jobs' statements on SQL Server (queuectl.jobs.*), per reliable queue.
-- Section names follow sql/postgresql/jobs.sql where the job is the same; the index
-- upkeep and inspection sections are SQL Server's own (DMVs instead of pgstattuple).
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
-- Move one batch of finished rows, with their payloads, from meta/data to history.
-- DONE rows older than :min_age_seconds and DEAD rows older than :dead_min_age_seconds,
-- DONE first then DEAD, oldest first: an ordered seek of the filtered index on finished
-- rows, meta (status, finished_at) WHERE status >= 2 (reliable.sql, finished_idx).
--  1. The pick locks the batch's keys (UPDLOCK, held to COMMIT; READPAST skips rows
--     someone else holds) and deletes their data rows, keeping the payloads in @moved.
--  2. DELETE TOP (@batch) ... OUTPUT deleted.* INTO history moves the meta rows with
--     their payloads. The history table has no trigger, foreign key or CHECK constraint
--     (OUTPUT INTO refuses them). This TOP chooses nothing (DELETE TOP has no ORDER BY):
--     the join to @moved names the rows, the ordered pick in step 1 chose them.
-- Returns one row: moved.
SET NOCOUNT ON;
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
    FROM {{meta}} AS m WITH (UPDLOCK, READPAST, ROWLOCK)
    WHERE m.status >= 2
      AND m.finished_at < CASE WHEN m.status = 2 THEN @done_before ELSE @dead_before END
    ORDER BY m.status, m.finished_at
)
DELETE d
OUTPUT deleted.id, deleted.payload, deleted.headers INTO @moved (id, payload, headers)
FROM {{data}} AS d WITH (ROWLOCK)
JOIN picked AS p ON p.id = d.id;
DELETE TOP (@batch) m
OUTPUT deleted.id, deleted.priority, deleted.due_at, deleted.status, deleted.title,
       deleted.attempts, deleted.max_attempts, deleted.lease_owner, deleted.enqueued_at,
       deleted.dequeued_at, deleted.finished_at, deleted.last_error, mv.payload, mv.headers,
       @now
INTO {{history}} (id, priority, due_at, status, title, attempts, max_attempts, lease_owner,
                  enqueued_at, dequeued_at, finished_at, last_error, payload, headers,
                  archived_at)
FROM {{meta}} AS m WITH (ROWLOCK)
JOIN @moved AS mv ON mv.id = m.id;
SET @rows = @@ROWCOUNT;
COMMIT TRANSACTION;
SELECT @rows AS moved;

-- name: purge_history_batch
-- Delete one batch of history rows archived more than :retention_seconds ago, oldest
-- first (an index on history (archived_at) makes this a seek). Returns one row: purged.
-- When the history is exported to a Parquet lake, only rows some lake holds may go.
SET NOCOUNT ON;
DECLARE @batch int = :batch;
DECLARE @before datetime2(6) = DATEADD(second, -CAST(:retention_seconds AS int), SYSUTCDATETIME());
IF @batch IS NULL OR @batch < 1 OR @batch > 4000
    THROW 50002, 'queuectl: purge batch must be 1 to 4000 rows (lock escalation starts at 5000)', 1;
WITH old AS (
    SELECT TOP (@batch) h.id
    FROM {{history}} AS h WITH (UPDLOCK, READPAST, ROWLOCK)
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
-- Expired leases: the consumer died or stalled. Back to READY (the expired attempt was
-- already counted when the item was claimed), or DEAD when that was its last attempt.
-- READPAST: a consumer still inside its transaction is skipped, never waited for.
-- Returns the rows changed (id, status).
SET NOCOUNT ON;
DECLARE @batch int = :batch;
DECLARE @now datetime2(6) = SYSUTCDATETIME();
WITH stale AS (
    SELECT TOP (@batch) m.id, m.status, m.attempts, m.max_attempts, m.lease_owner,
                        m.leased_until, m.finished_at, m.last_error
    FROM {{meta}} AS m WITH (UPDLOCK, READPAST, ROWLOCK)
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

-- name: index_physical
-- Physical state of every index (and heap) of the queue's tables, with the action the
-- reorganize job takes for it:
--  * fewer than :min_pages pages: nothing (too small to matter; 1000 in Ola Hallengren's
--    and the old Books Online rules, queuectl's default);
--  * fragmentation below :low_pct: nothing;
--  * from :low_pct to :high_pct: REORGANIZE (always online, interruptible);
--  * above :high_pct: REBUILD ONLINE where the edition has online index operations
--    (EngineEdition 3 = Enterprise/Developer/Evaluation, 5 = Azure SQL Database,
--    8 = Managed Instance), else REORGANIZE, and `note` says why.
-- REORGANIZE fails when page locks are disallowed: such an index is skipped with a note.
-- SAMPLED mode reads a 1% sample, and every page of an index under 10,000 pages, so the
-- ghost, version-ghost and page-density columns are filled (LIMITED leaves them NULL).
-- Objects are found by name in sys.objects first: dm_db_index_physical_stats with a NULL
-- object id would scan the whole database.
SET NOCOUNT ON;
DECLARE @low float = :low_pct;
DECLARE @high float = :high_pct;
DECLARE @min_pages bigint = :min_pages;
DECLARE @online bit = CASE WHEN CAST(SERVERPROPERTY('EngineEdition') AS int) IN (3, 5, 8)
                           THEN 1 ELSE 0 END;
SELECT o.name AS table_name,
       i.name AS index_name,
       ps.index_id,
       ps.partition_number,
       ps.index_type_desc,
       ps.page_count AS pages,
       ps.record_count AS live_rows,
       ps.ghost_record_count AS ghost_rows,
       ps.version_ghost_record_count AS version_ghost_rows,
       ps.avg_fragmentation_in_percent AS fragmentation_pct,
       ps.avg_page_space_used_in_percent AS page_density_pct,
       i.allow_page_locks,
       CASE WHEN ps.index_id = 0 OR ps.page_count < @min_pages
                 OR ps.avg_fragmentation_in_percent < @low THEN 'none'
            WHEN ps.avg_fragmentation_in_percent <= @high AND i.allow_page_locks = 1 THEN 'REORGANIZE'
            WHEN ps.avg_fragmentation_in_percent > @high AND @online = 1 THEN 'REBUILD ONLINE'
            WHEN i.allow_page_locks = 1 THEN 'REORGANIZE'
            ELSE 'none' END AS action,
       CASE WHEN ps.index_id = 0 THEN N'heap: no index to maintain'
            WHEN ps.page_count < @min_pages THEN N'fewer pages than the minimum'
            WHEN ps.avg_fragmentation_in_percent < @low THEN N'fragmentation below the low threshold'
            WHEN i.allow_page_locks = 0 AND (ps.avg_fragmentation_in_percent <= @high OR @online = 0)
                 THEN N'skipped: ALLOW_PAGE_LOCKS is OFF, so REORGANIZE would fail'
            WHEN ps.avg_fragmentation_in_percent > @high AND @online = 0
                 THEN N'above the high threshold, but this edition has no online rebuild: reorganizing instead'
            ELSE NULL END AS note
FROM sys.objects AS o
CROSS APPLY sys.dm_db_index_physical_stats(DB_ID(), o.object_id, NULL, NULL, 'SAMPLED') AS ps
JOIN sys.indexes AS i ON i.object_id = ps.object_id AND i.index_id = ps.index_id
WHERE o.schema_id = SCHEMA_ID(:schema)
  AND o.name IN (CONCAT(:queue, N'_meta'), CONCAT(:queue, N'_data'), CONCAT(:queue, N'_history'))
  AND ps.alloc_unit_type_desc = N'IN_ROW_DATA'
  AND ps.index_level = 0
ORDER BY o.name, ps.index_id, ps.partition_number;

-- name: maintain_index
-- Run the action index_physical chose for one index. Names are taken from sys.indexes by
-- the job and passed as values; QUOTENAME makes them identifiers, never SQL text.
-- REORGANIZE compacts the leaf level toward the fill factor and removes ghosts as it
-- goes; it does not update statistics, so they are updated afterwards. An online
-- rebuild waits at low priority for its final schema lock and gives up itself
-- (ABORT_AFTER_WAIT = SELF) rather than block producers and consumers behind it.
SET NOCOUNT ON;
DECLARE @target nvarchar(600) = QUOTENAME(:index_name) + N' ON ' + QUOTENAME(:schema) + N'.' + QUOTENAME(:table_name);
DECLARE @sql nvarchar(max) = CASE :action
    WHEN 'REORGANIZE' THEN N'ALTER INDEX ' + @target + N' REORGANIZE WITH (LOB_COMPACTION = ON); '
                           + N'UPDATE STATISTICS ' + QUOTENAME(:schema) + N'.' + QUOTENAME(:table_name)
                           + N' ' + QUOTENAME(:index_name)
    WHEN 'REBUILD ONLINE' THEN N'ALTER INDEX ' + @target + N' REBUILD WITH (ONLINE = ON '
                           + N'(WAIT_AT_LOW_PRIORITY (MAX_DURATION = '
                           + CAST(CAST(:max_wait_minutes AS int) AS nvarchar(10))
                           + N' MINUTES, ABORT_AFTER_WAIT = SELF)))'
    END;
IF @sql IS NULL
    THROW 50003, 'queuectl: unknown index action (REORGANIZE or REBUILD ONLINE)', 1;
EXEC sys.sp_executesql @sql;
SELECT @sql AS command;

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
