-- The data pipeline (queuectl pipeline export / report) on SQL Server: the same sections as
-- sql/postgresql/pipeline.sql. NOT run live here (no SQL Server on these machines): parsed
-- offline only, and `queuectl pipeline export` refuses non-PostgreSQL sources for now.
--
-- Spark reads SQL Server through Microsoft's JDBC driver (mssql-jdbc jar, URL
-- jdbc:sqlserver://host:port;databaseName=db;encrypt=true), the read_new / read_late
-- subqueries below being its `dbtable`. History timestamps are datetime2(6) in UTC
-- (SYSUTCDATETIME()), so the bounds are UTC microseconds since the epoch.

-- name: export_window
-- The new bounds. archived_before stays below the start of every transaction still open
-- in this database (less a second), so an archive batch that began earlier and commits
-- later is read by the next run. Needs VIEW SERVER STATE (VIEW DATABASE STATE on Azure SQL)
-- for the DMVs; without it the statement fails, which the export reports. The DMV's
-- begin time is server local time: shifted to UTC by the current offset.
SELECT
    (SELECT MAX(id) FROM {{history}}) AS max_id,
    DATEADD(SECOND, -1, COALESCE(
        (SELECT CASE WHEN MIN(x.begin_utc) < SYSUTCDATETIME() THEN MIN(x.begin_utc) ELSE SYSUTCDATETIME() END
           FROM (SELECT DATEADD(MINUTE, DATEDIFF(MINUTE, GETDATE(), GETUTCDATE()),
                                CAST(t.transaction_begin_time AS datetime2(6))) AS begin_utc
                   FROM sys.dm_tran_session_transactions AS st
                   JOIN sys.dm_tran_active_transactions AS t ON t.transaction_id = st.transaction_id
                   JOIN sys.dm_exec_sessions AS s ON s.session_id = st.session_id
                  WHERE s.database_id = DB_ID() AND s.is_user_process = 1
                    AND st.session_id <> @@SPID) AS x),
        SYSUTCDATETIME())) AS archived_before,
    0 AS hidden_sessions;

-- name: window_rows
-- How many rows a run will read: new ids and late rows.
SELECT SUM(CASE WHEN id > {{after_id}} THEN 1 ELSE 0 END) AS new_rows,
       SUM(CASE WHEN id <= {{after_id}} THEN 1 ELSE 0 END) AS late_rows
FROM {{history}}
WHERE id <= {{upto_id}}
  AND archived_at < DATEADD(MICROSECOND, {{before_us}} % 1000000,
                            DATEADD(SECOND, {{before_us}} / 1000000, CAST('1970-01-01' AS datetime2(6))))
  AND (id > {{after_id}}
       OR archived_at >= DATEADD(MICROSECOND, {{after_before_us}} % 1000000,
                                 DATEADD(SECOND, {{after_before_us}} / 1000000, CAST('1970-01-01' AS datetime2(6)))));

-- name: read_new
-- Spark's JDBC source reads this subquery in id-range partitions (partitionColumn = id).
(SELECT id, priority, due_at, status, title, attempts, max_attempts, lease_owner,
        enqueued_at, dequeued_at, finished_at, last_error, payload, headers, archived_at
   FROM {{history}}
  WHERE id > {{after_id}} AND id <= {{upto_id}}
    AND archived_at < DATEADD(MICROSECOND, {{before_us}} % 1000000,
                              DATEADD(SECOND, {{before_us}} / 1000000, CAST('1970-01-01' AS datetime2(6))))) AS new_rows

-- name: read_late
-- Rows with already exported ids archived since the last run's bound: one partition.
(SELECT id, priority, due_at, status, title, attempts, max_attempts, lease_owner,
        enqueued_at, dequeued_at, finished_at, last_error, payload, headers, archived_at
   FROM {{history}}
  WHERE id <= {{after_id}}
    AND archived_at >= DATEADD(MICROSECOND, {{after_before_us}} % 1000000,
                               DATEADD(SECOND, {{after_before_us}} / 1000000, CAST('1970-01-01' AS datetime2(6))))
    AND archived_at < DATEADD(MICROSECOND, {{before_us}} % 1000000,
                              DATEADD(SECOND, {{before_us}} / 1000000, CAST('1970-01-01' AS datetime2(6))))) AS late_rows

-- name: get_export
-- What the catalog says a lake holds of a queue.
SELECT run_seq, exported_upto_id, archived_before, rows_exported, rows_purged, updated_at
FROM {{exports}}
WHERE queue = :queue AND lake = :lake;

-- name: record_export
-- Mirror the lake's newest commit record (idempotent). MERGE with HOLDLOCK: without it two
-- concurrent upserts can both take the insert branch.
MERGE {{exports}} WITH (HOLDLOCK) AS e
USING (SELECT :queue AS queue, :lake AS lake) AS k
   ON e.queue = k.queue AND e.lake = k.lake
WHEN MATCHED THEN
    UPDATE SET run_seq = :run_seq, exported_upto_id = :upto_id, archived_before = :archived_before,
               rows_exported = :rows_exported, updated_at = SYSUTCDATETIME()
WHEN NOT MATCHED THEN
    INSERT (queue, lake, run_seq, exported_upto_id, archived_before, rows_exported)
    VALUES (:queue, :lake, :run_seq, :upto_id, :archived_before, :rows_exported);

-- name: add_purged
-- Count rows purged from history after export.
UPDATE {{exports}} SET rows_purged = rows_purged + :purged, updated_at = SYSUTCDATETIME()
WHERE queue = :queue AND lake = :lake;

-- name: batch_lock_timeout
-- A purge batch waits at most this long for a row lock (SET LOCK_TIMEOUT takes a literal
-- in milliseconds, not a variable: rendered from a validated integer).
SET LOCK_TIMEOUT {{lock_timeout_ms}};

-- name: purge_batch
-- Delete one batch of exported rows in id order after :after_id; returns how many and the
-- highest id deleted. TOP (:batch) stays under the 5,000-lock escalation threshold.
-- READPAST needs a locking read to have locks to skip. Under READ_COMMITTED_SNAPSHOT a
-- DELETE still picks its rows with update locks, except where optimized locking is on
-- (always in Azure SQL Database): its lock after qualification tests rows on their last
-- committed version without locks, and honours lock hints. UPDLOCK keeps the pick a locking
-- read in every case, so READPAST skips rows another purge holds (guides:
-- https://learn.microsoft.com/en-us/sql/relational-databases/sql-server-transaction-locking-and-row-versioning-guide,
-- https://learn.microsoft.com/en-us/sql/relational-databases/performance/optimized-locking).
-- Plan: a range seek of the clustered primary key (index 1) on id in key order, which is
-- the ORDER BY, TOP stopping after :batch rows; INDEX + FORCESEEK leave no seek of the
-- archived_at index followed by a sort of every row it finds. Table hints:
-- https://learn.microsoft.com/en-us/sql/t-sql/queries/hints-transact-sql-table
DECLARE @gone TABLE (id bigint NOT NULL);
WITH doomed AS (
    SELECT TOP (:batch) id FROM {{history}} WITH (UPDLOCK, READPAST, ROWLOCK, INDEX(1), FORCESEEK)
    WHERE id > :after_id AND id <= :upto_id AND archived_at < :archived_before
    ORDER BY id
)
DELETE FROM doomed OUTPUT deleted.id INTO @gone;
SELECT COUNT(*) AS n, MAX(id) AS last_id FROM @gone;

-- name: history_checksum
-- Order-independent fingerprint of the exported part of a history: row count and the sum
-- of the first 60 bits (15 hex digits, zero-extended to a positive bigint) of
-- MD5(id:payload-hex), the same as the PostgreSQL side and the lake side.
SELECT COUNT_BIG(*) AS n,
       COALESCE(SUM(CAST(CONVERT(bigint, CONVERT(binary(8), CONCAT('0', LEFT(CONVERT(varchar(32),
           HASHBYTES('MD5', CONCAT(CAST(id AS varchar(20)), ':', LOWER(CONVERT(varchar(max), payload, 2)))), 2), 15)), 2))
           AS decimal(38, 0))), 0) AS checksum
FROM {{history}}
WHERE id <= :upto_id AND archived_at < :archived_before;

-- name: hourly_percentiles
-- Wait and processing time percentiles per hour of finished_at (PERCENTILE_CONT is a
-- window function in T-SQL: DISTINCT collapses it to one row per hour).
SELECT DISTINCT
       DATEADD(HOUR, DATEDIFF(HOUR, 0, finished_at), 0) AS hour,
       PERCENTILE_CONT(0.5) WITHIN GROUP (ORDER BY DATEDIFF_BIG(MICROSECOND, enqueued_at, dequeued_at) / 1e6)
           OVER (PARTITION BY DATEADD(HOUR, DATEDIFF(HOUR, 0, finished_at), 0)) AS wait_p50_s,
       PERCENTILE_CONT(0.9) WITHIN GROUP (ORDER BY DATEDIFF_BIG(MICROSECOND, enqueued_at, dequeued_at) / 1e6)
           OVER (PARTITION BY DATEADD(HOUR, DATEDIFF(HOUR, 0, finished_at), 0)) AS wait_p90_s,
       PERCENTILE_CONT(0.99) WITHIN GROUP (ORDER BY DATEDIFF_BIG(MICROSECOND, enqueued_at, dequeued_at) / 1e6)
           OVER (PARTITION BY DATEADD(HOUR, DATEDIFF(HOUR, 0, finished_at), 0)) AS wait_p99_s,
       PERCENTILE_CONT(0.5) WITHIN GROUP (ORDER BY DATEDIFF_BIG(MICROSECOND, dequeued_at, finished_at) / 1e6)
           OVER (PARTITION BY DATEADD(HOUR, DATEDIFF(HOUR, 0, finished_at), 0)) AS processing_p50_s,
       PERCENTILE_CONT(0.9) WITHIN GROUP (ORDER BY DATEDIFF_BIG(MICROSECOND, dequeued_at, finished_at) / 1e6)
           OVER (PARTITION BY DATEADD(HOUR, DATEDIFF(HOUR, 0, finished_at), 0)) AS processing_p90_s,
       PERCENTILE_CONT(0.99) WITHIN GROUP (ORDER BY DATEDIFF_BIG(MICROSECOND, dequeued_at, finished_at) / 1e6)
           OVER (PARTITION BY DATEADD(HOUR, DATEDIFF(HOUR, 0, finished_at), 0)) AS processing_p99_s
FROM {{history}}
WHERE finished_at IS NOT NULL AND dequeued_at IS NOT NULL
ORDER BY hour;

-- name: synthetic_history
-- Benchmarks and tests: :n finished rows with ids after :first_id, enqueued from :start over
-- :hours hours, 1-5 attempts, about 2% dead, payloads of about :payload_bytes bytes.
WITH digits AS (SELECT n FROM (VALUES (0), (1), (2), (3), (4), (5), (6), (7), (8), (9)) AS d(n)),
numbers AS (
    SELECT TOP (:n) ROW_NUMBER() OVER (ORDER BY (SELECT NULL)) AS i
    FROM digits a, digits b, digits c, digits d, digits e, digits f, digits g
),
g AS (
    SELECT :first_id + i AS id,
           DATEADD(MICROSECOND, CAST(((i - 1) * (:hours * 3600.0) / :n) * 1e6 AS bigint) % 1000000,
                   DATEADD(SECOND, CAST((i - 1) * (:hours * 3600.0) / :n AS bigint), CAST(:start AS datetime2(6)))) AS enq
    FROM numbers
)
INSERT INTO {{history}} (id, priority, due_at, status, title, attempts, max_attempts,
                         lease_owner, enqueued_at, dequeued_at, finished_at, last_error,
                         payload, headers)
SELECT id,
       CAST(id % 3 AS smallint),
       enq,
       CAST(CASE WHEN id % 50 = 0 THEN 3 ELSE 2 END AS smallint),
       CONCAT('item ', id),
       1 + CAST(id * 7 % 5 AS int),
       5,
       CONCAT('worker-', id % 4),
       enq,
       DATEADD(MILLISECOND, CAST(id * 37 % 1000 AS int) * 10, enq),
       DATEADD(MILLISECOND, CAST(id * 37 % 1000 AS int) * 10 + CAST(id * 13 % 5000 AS int), enq),
       CASE WHEN id % 50 = 0 THEN CONCAT('failed ', id % 5, ' times') END,
       CAST(REPLICATE(CONVERT(varchar(32), HASHBYTES('MD5', CAST(id AS varchar(20))), 2),
                      CASE WHEN :payload_bytes / 32 > 1 THEN :payload_bytes / 32 ELSE 1 END) AS varbinary(max)),
       CONCAT('{"n": ', id, '}')
FROM g;
