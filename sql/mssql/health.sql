-- What `queuectl health` reads on SQL Server: the same sections, and the same columns, as
-- sql/postgresql/health.sql, so queuectl.health grades both engines with one code path.
-- Where PostgreSQL's notion has no SQL Server meaning the column keeps its name and holds
-- the nearest SQL Server fact, or NULL/0, and the section says which.
--
-- Ghosts instead of dead tuples. A deleted row stays on its page as a ghost record until
-- the ghost cleanup task removes it (every few seconds, a few pages at a time), and as a
-- version ghost while any transaction that may read row versions still runs: snapshot
-- transactions and RCSI statements of ANY database (the version store in tempdb is shared
-- by the instance; with Accelerated Database Recovery it is per database), online index
-- builds, triggers, and the queries of readable secondaries (through the availability
-- group's ghost low-water mark). Those are SQL Server's "xmin horizon holders".
--
-- Times are UTC datetime2 (SYSUTCDATETIME(), like every queuectl table on SQL Server);
-- ages are computed on the server. Lists arrive as one JSON array (the adapter's
-- list_param) and are read with OPENJSON; identifiers come only from validated names
-- through sqlfiles.render().
--
-- Permissions: sessions, transactions, locks and availability-group state need VIEW
-- SERVER STATE (VIEW SERVER PERFORMANCE STATE on SQL Server 2022). Without it these
-- sections return no rows instead of failing, and `server` reports sees_all_sessions = 0.
-- Ghost counts and page density (sys.dm_db_index_physical_stats) need VIEW DATABASE STATE
-- or CONTROL on the table; without them they stay NULL.

-- name: server
-- The server and this session's powers. pgstattuple_schema names where the physical
-- measurement functions live: on SQL Server sys.dm_db_index_physical_stats, always
-- present in schema sys (so pgstattuple_available is 1 and nothing is ever created).
-- in_recovery: the database cannot be written (a readable secondary or a read-only
-- database), PostgreSQL's standby. autovacuum_on: the ghost cleanup task, which runs
-- unless trace flag 661 is set (a SELECT cannot read trace flags: reported as on);
-- PostgreSQL's autovacuum trigger settings have no counterpart (NULL).
-- server_version_num: major * 10000 + minor * 100 (16.0 -> 160000).
SELECT DB_NAME()                                                    AS "database",
       CAST(SERVERPROPERTY('ProductVersion') AS nvarchar(128))
         + N' ' + CAST(SERVERPROPERTY('Edition') AS nvarchar(128))  AS server_version,
       CAST(SERVERPROPERTY('ProductMajorVersion') AS int) * 10000
         + CAST(SERVERPROPERTY('ProductMinorVersion') AS int) * 100 AS server_version_num,
       CAST(CASE WHEN DATABASEPROPERTYEX(DB_NAME(), 'Updateability') = N'READ_ONLY'
                 THEN 1 ELSE 0 END AS bit)                          AS in_recovery,
       N'sys'                                                       AS pgstattuple_schema,
       CAST(1 AS bit)                                               AS pgstattuple_available,
       CAST(COALESCE(HAS_PERMS_BY_NAME(NULL, NULL, 'VIEW SERVER STATE'), 0) AS bit)
                                                                    AS sees_all_sessions,
       CAST(1 AS bit)                                               AS autovacuum_on,
       CAST(NULL AS bigint)                                         AS autovacuum_vacuum_threshold,
       CAST(NULL AS float)                                          AS autovacuum_vacuum_scale_factor,
       CAST(NULL AS int)                                            AS autovacuum_naptime_s

-- name: session_limits
-- A report never waits long for a lock. The value is rendered, not bound: a statement
-- with parameters runs inside sp_executesql, and SET LOCK_TIMEOUT made there is undone
-- when it returns. Unlike PostgreSQL's set_config(..., true) the setting lasts for the
-- session, i.e. for the report's connection. SQL Server has no server-side statement
-- timeout (the ODBC query timeout is the client's), so statement_timeout is not applied.
SET LOCK_TIMEOUT {{lock_timeout_ms}};

-- name: now
-- The report's timestamp, from the server clock, UTC like every stored time.
SELECT SYSUTCDATETIME() AS now

-- name: create_pgstattuple
-- Nothing to create on SQL Server: sys.dm_db_index_physical_stats is built in (`server`
-- reports it installed, so queuectl.health never runs this). Kept as a harmless no-op so
-- both engines define the same sections.
SELECT CAST(0 AS int) AS created

-- name: queue_reliable
-- One pass over a reliable queue's meta table, plus a bounded look at the newest history
-- rows (the archive job moves finished rows there, so recent completions live in both).
-- :history_scan bounds that look to the newest N archived rows through the primary key.
-- An item counts as dequeued in the window when its latest dequeue falls in it. A row is
-- never in both: rot_copy and archive_batch move rows (DELETE ... OUTPUT INTO history),
-- where PostgreSQL's rotation copies a generation before its truncate (its section leaves
-- out the archived rows still in meta). Plain committed reads: under read committed
-- snapshot they never wait; with locking read committed a row held by a consumer's open
-- transaction waits at most the session's LOCK_TIMEOUT (session_limits), and the queue is
-- then reported as not read.
WITH clock AS (
    SELECT SYSUTCDATETIME() AS now_utc,
           DATEADD(second, -CAST(:window_s AS int), SYSUTCDATETIME()) AS window_start
), live AS (
    SELECT COUNT_BIG(CASE WHEN m.status = 0 AND m.due_at <= c.now_utc THEN 1 END)     AS ready,
           COUNT_BIG(CASE WHEN m.status = 0 AND m.due_at > c.now_utc THEN 1 END)      AS scheduled,
           COUNT_BIG(CASE WHEN m.status = 1 THEN 1 END)                              AS processing,
           COUNT_BIG(CASE WHEN m.status = 2 THEN 1 END)                              AS done,
           COUNT_BIG(CASE WHEN m.status = 3 THEN 1 END)                              AS dead,
           COUNT_BIG(CASE WHEN m.status = 1 AND m.leased_until < c.now_utc THEN 1 END) AS stuck,
           MIN(CASE WHEN m.status = 1 AND m.leased_until < c.now_utc THEN m.leased_until END)
                                                                                    AS oldest_expired_lease,
           MIN(CASE WHEN m.status = 0 AND m.due_at <= c.now_utc THEN m.due_at END)  AS oldest_ready_due_at,
           COUNT_BIG(CASE WHEN m.enqueued_at >= c.window_start THEN 1 END)           AS enqueued,
           COUNT_BIG(CASE WHEN m.dequeued_at >= c.window_start THEN 1 END)           AS dequeued,
           COUNT_BIG(CASE WHEN m.status = 2 AND m.finished_at >= c.window_start THEN 1 END) AS completed,
           COUNT_BIG(CASE WHEN m.status = 3 AND m.finished_at >= c.window_start THEN 1 END) AS died
    FROM {{meta}} AS m
    CROSS JOIN clock AS c
), archived AS (
    SELECT COUNT_BIG(CASE WHEN h.enqueued_at >= c.window_start THEN 1 END)                  AS enqueued,
           COUNT_BIG(CASE WHEN h.dequeued_at >= c.window_start THEN 1 END)                  AS dequeued,
           COUNT_BIG(CASE WHEN h.status = 2 AND h.finished_at >= c.window_start THEN 1 END) AS completed,
           COUNT_BIG(CASE WHEN h.status = 3 AND h.finished_at >= c.window_start THEN 1 END) AS died
    FROM (SELECT TOP (:history_scan) hh.enqueued_at, hh.dequeued_at, hh.finished_at, hh.status
          FROM {{history}} AS hh
          ORDER BY hh.id DESC) AS h
    CROSS JOIN clock AS c
)
SELECT live.ready, live.scheduled, live.processing, live.done, live.dead, live.stuck,
       DATEDIFF_BIG(microsecond, live.oldest_expired_lease, c.now_utc) / 1e6 AS oldest_expired_lease_s,
       DATEDIFF_BIG(microsecond, live.oldest_ready_due_at, c.now_utc) / 1e6  AS oldest_ready_age_s,
       live.enqueued + archived.enqueued   AS enqueued_in_window,
       live.dequeued + archived.dequeued   AS dequeued_in_window,
       live.completed + archived.completed AS completed_in_window,
       live.died + archived.died           AS died_in_window
FROM live CROSS JOIN archived CROSS JOIN clock AS c

-- name: tables
-- Vital signs of the given tables (:tables, a JSON array of qualified names), in the
-- given order; missing tables are left out. Columns as on PostgreSQL:
--   n_live_tup    rows of the heap or clustered index (sys.dm_db_partition_stats);
--   n_dead_tup    ghost + version-ghost records of the heap or clustered index leaf,
--                 from sys.dm_db_index_physical_stats in SAMPLED mode (every page under
--                 10,000 pages, a 1% sample above); measured only for tables of at most
--                 131,072 pages (1 GB, so at most ~10 MB is read), else NULL;
--   n_tup_upd, n_tup_hot_upd: NULL (SQL Server has no HOT updates to rate);
--   last_vacuum, last_autovacuum, last_autoanalyze: NULL, vacuum_count and
--                 autovacuum_count 0 (no VACUUM: ghost cleanup keeps no per-table record);
--   last_analyze  the newest statistics update of the table (converted to UTC);
--   pages, table_bytes: used pages of the heap or clustered index (LOB and row-overflow
--                 included); index_bytes: used pages of the other indexes;
--   fillfactor    the clustered index's fill factor (0 means 100; a heap has none: 100);
--   autovacuum_options: NULL (no per-table autovacuum: one ghost-cleanup task serves the
--                 whole instance, with no per-table setting).
-- A table someone holds or waits for in Sch-M or X mode (DDL, an offline rebuild, a
-- table lock) gets locked = 1 and NULL sizes and ghosts instead of stalling the report.
SET NOCOUNT ON; SET ROWCOUNT 0;
DECLARE @sees_locks bit = COALESCE(HAS_PERMS_BY_NAME(NULL, NULL, 'VIEW SERVER STATE'), 0);
DECLARE @sees_pages bit = COALESCE(HAS_PERMS_BY_NAME(DB_NAME(), 'DATABASE', 'VIEW DATABASE STATE'), 0);
DECLARE @exclusive TABLE (object_id int NOT NULL PRIMARY KEY);
IF @sees_locks = 1
    INSERT INTO @exclusive (object_id)
    SELECT DISTINCT CAST(l.resource_associated_entity_id AS int)
    FROM sys.dm_tran_locks AS l
    WHERE l.resource_database_id = DB_ID()
      AND l.resource_type = N'OBJECT'
      AND l.request_mode IN (N'Sch-M', N'X');
WITH t AS (
    SELECT j.[value] AS name, CAST(j.[key] AS int) AS ord, OBJECT_ID(j.[value], N'U') AS object_id
    FROM OPENJSON(:tables) AS j
)
SELECT t.name                                        AS qualified,
       o.object_id                                   AS table_oid,
       o.name                                        AS table_name,
       p.live_rows                                   AS n_live_tup,
       g.ghosts                                      AS n_dead_tup,
       CAST(NULL AS bigint)                          AS n_tup_upd,
       CAST(NULL AS bigint)                          AS n_tup_hot_upd,
       CAST(NULL AS datetime2(6))                    AS last_vacuum,
       CAST(NULL AS datetime2(6))                    AS last_autovacuum,
       (SELECT DATEADD(minute, DATEDIFF(minute, SYSDATETIME(), SYSUTCDATETIME()),
                       CAST(MAX(STATS_DATE(st.object_id, st.stats_id)) AS datetime2(6)))
        FROM sys.stats AS st WHERE st.object_id = o.object_id) AS last_analyze,
       CAST(NULL AS datetime2(6))                    AS last_autoanalyze,
       CAST(0 AS bigint)                             AS vacuum_count,
       CAST(0 AS bigint)                             AS autovacuum_count,
       CAST(CASE WHEN x.object_id IS NULL THEN 0 ELSE 1 END AS bit) AS locked,
       p.table_pages                                 AS pages,
       p.table_pages * 8192                          AS table_bytes,
       p.index_pages * 8192                          AS index_bytes,
       COALESCE((SELECT NULLIF(CAST(i.fill_factor AS int), 0) FROM sys.indexes AS i
                 WHERE i.object_id = o.object_id AND i.index_id = 1), 100) AS "fillfactor",
       CAST(NULL AS nvarchar(max))                   AS autovacuum_options
FROM t
JOIN sys.objects AS o ON o.object_id = t.object_id
LEFT JOIN @exclusive AS x ON x.object_id = o.object_id
OUTER APPLY (
    SELECT SUM(CASE WHEN ps.index_id IN (0, 1) THEN ps.row_count END)              AS live_rows,
           COALESCE(SUM(CASE WHEN ps.index_id IN (0, 1) THEN ps.used_page_count END), 0) AS table_pages,
           COALESCE(SUM(CASE WHEN ps.index_id > 1 THEN ps.used_page_count END), 0)  AS index_pages
    FROM sys.dm_db_partition_stats AS ps
    WHERE ps.object_id = o.object_id AND x.object_id IS NULL
) AS p
OUTER APPLY (
    SELECT SUM(f.ghost_record_count + COALESCE(f.version_ghost_record_count, 0)) AS ghosts
    FROM sys.dm_db_index_physical_stats(DB_ID(), o.object_id,
             CASE WHEN OBJECTPROPERTY(o.object_id, 'TableHasClustIndex') = 1 THEN 1 ELSE 0 END,
             NULL, 'SAMPLED') AS f
    WHERE x.object_id IS NULL AND p.table_pages <= 131072
      AND (@sees_pages = 1 OR HAS_PERMS_BY_NAME(t.name, 'OBJECT', 'CONTROL') = 1)
      AND f.index_level = 0 AND f.alloc_unit_type_desc = N'IN_ROW_DATA'
) AS g
ORDER BY t.ord;

-- name: indexes
-- Every index of the given tables (:tables, a JSON array): size, validity, method, use.
--   index_oid       object_id * 1,000,000 + index_id: one number per index for
--                   index_physical (index ids stay below 1,000,000);
--   method          'btree' for rowstore clustered and nonclustered indexes (the ones
--                   index_physical measures), else the type (columnstore, xml, ...);
--   valid           not disabled;
--   reindex_leftover 0: an online rebuild on SQL Server is atomic and leaves no half-built
--                   copy behind (unlike an interrupted REINDEX CONCURRENTLY);
--   idx_scan        seeks + scans + lookups since the server started;
--   fillfactor      fill_factor, 0 meaning 100.
-- The clustered index is listed: on SQL Server it is the table, and its density and
-- fragmentation are the table's. Locked tables (Sch-M / X): NULL size.
SET NOCOUNT ON; SET ROWCOUNT 0;
DECLARE @sees_locks bit = COALESCE(HAS_PERMS_BY_NAME(NULL, NULL, 'VIEW SERVER STATE'), 0);
DECLARE @exclusive TABLE (object_id int NOT NULL PRIMARY KEY);
IF @sees_locks = 1
    INSERT INTO @exclusive (object_id)
    SELECT DISTINCT CAST(l.resource_associated_entity_id AS int)
    FROM sys.dm_tran_locks AS l
    WHERE l.resource_database_id = DB_ID()
      AND l.resource_type = N'OBJECT'
      AND l.request_mode IN (N'Sch-M', N'X');
WITH t AS (
    SELECT j.[value] AS name, CAST(j.[key] AS int) AS ord, OBJECT_ID(j.[value], N'U') AS object_id
    FROM OPENJSON(:tables) AS j
)
SELECT t.name                                                       AS qualified,
       CAST(i.object_id AS bigint) * 1000000 + i.index_id           AS index_oid,
       i.name                                                       AS index_name,
       CASE WHEN i.type IN (1, 2) THEN N'btree' ELSE LOWER(i.type_desc) END AS method,
       CASE WHEN x.object_id IS NULL
            THEN (SELECT SUM(ps.used_page_count) * 8192 FROM sys.dm_db_partition_stats AS ps
                  WHERE ps.object_id = i.object_id AND ps.index_id = i.index_id) END AS index_bytes,
       CAST(CASE WHEN i.is_disabled = 0 THEN 1 ELSE 0 END AS bit)  AS valid,
       CAST(0 AS bit)                                               AS reindex_leftover,
       COALESCE(u.user_seeks + u.user_scans + u.user_lookups, 0)    AS idx_scan,
       COALESCE(NULLIF(CAST(i.fill_factor AS int), 0), 100)         AS "fillfactor"
FROM t
JOIN sys.indexes AS i ON i.object_id = t.object_id AND i.index_id > 0 AND i.is_hypothetical = 0
LEFT JOIN @exclusive AS x ON x.object_id = i.object_id
LEFT JOIN sys.dm_db_index_usage_stats AS u
       ON u.database_id = DB_ID() AND u.object_id = i.object_id AND u.index_id = i.index_id
ORDER BY t.ord, i.name;

-- name: index_physical
-- sys.dm_db_index_physical_stats in DETAILED mode for the given indexes (:oids, a JSON
-- array of index_oid from `indexes`): every level, like pgstatindex. It reads the whole
-- index, so the caller passes only indexes under a size cap. pgstatindex's columns:
--   tree_level = index_depth - 1, index_size in bytes, leaf_pages (level 0),
--   internal_pages (levels above), avg_leaf_density = avg_page_space_used_in_percent of
--   the leaf level, leaf_fragmentation = its avg_fragmentation_in_percent;
--   empty_pages, deleted_pages = 0: SQL Server frees emptied pages (their deleted rows
--   are the ghost counts below).
-- Then SQL Server's own leaf-level numbers: ghost_record_count,
-- version_ghost_record_count, avg_fragmentation_in_percent,
-- avg_page_space_used_in_percent, page_count. Percentages over several partitions are
-- weighted by pages.
SET NOCOUNT ON; SET ROWCOUNT 0;
WITH x AS (
    SELECT CAST(j.[value] AS bigint) AS index_oid FROM OPENJSON(:oids) AS j
)
SELECT x.index_oid,
       MAX(ps.index_depth) - 1                                                  AS tree_level,
       SUM(ps.page_count) * 8192                                                AS index_size,
       SUM(CASE WHEN ps.index_level = 0 THEN ps.page_count ELSE 0 END)          AS leaf_pages,
       SUM(CASE WHEN ps.index_level > 0 THEN ps.page_count ELSE 0 END)          AS internal_pages,
       CAST(0 AS bigint)                                                        AS empty_pages,
       CAST(0 AS bigint)                                                        AS deleted_pages,
       SUM(CASE WHEN ps.index_level = 0 THEN ps.avg_page_space_used_in_percent * ps.page_count END)
         / NULLIF(SUM(CASE WHEN ps.index_level = 0 THEN ps.page_count END), 0)  AS avg_leaf_density,
       SUM(CASE WHEN ps.index_level = 0 THEN ps.avg_fragmentation_in_percent * ps.page_count END)
         / NULLIF(SUM(CASE WHEN ps.index_level = 0 THEN ps.page_count END), 0)  AS leaf_fragmentation,
       SUM(CASE WHEN ps.index_level = 0 THEN ps.ghost_record_count END)         AS ghost_record_count,
       SUM(CASE WHEN ps.index_level = 0 THEN ps.version_ghost_record_count END) AS version_ghost_record_count,
       SUM(CASE WHEN ps.index_level = 0 THEN ps.avg_fragmentation_in_percent * ps.page_count END)
         / NULLIF(SUM(CASE WHEN ps.index_level = 0 THEN ps.page_count END), 0)  AS avg_fragmentation_in_percent,
       SUM(CASE WHEN ps.index_level = 0 THEN ps.avg_page_space_used_in_percent * ps.page_count END)
         / NULLIF(SUM(CASE WHEN ps.index_level = 0 THEN ps.page_count END), 0)  AS avg_page_space_used_in_percent,
       SUM(CASE WHEN ps.index_level = 0 THEN ps.page_count END)                 AS page_count
FROM x
CROSS APPLY sys.dm_db_index_physical_stats(DB_ID(), CAST(x.index_oid / 1000000 AS int),
                                           CAST(x.index_oid % 1000000 AS int), NULL, 'DETAILED') AS ps
WHERE ps.alloc_unit_type_desc = N'IN_ROW_DATA'
GROUP BY x.index_oid;

-- name: table_physical
-- pgstattuple_approx's columns for the given tables (:oids, a JSON array of object ids),
-- from the heap or clustered index leaf in SAMPLED mode (every page under 10,000 pages,
-- a 1% sample above: scanned_percent says which). Size-capped by the caller.
--   dead_tuple_count = ghost + version-ghost records, dead_tuple_percent their share of
--   the bytes (records x average record size), approx_tuple_percent the live records'
--   share, approx_free_percent = 100 - avg_page_space_used_in_percent.
-- Then the raw DMF numbers: ghost_record_count, version_ghost_record_count,
-- avg_fragmentation_in_percent, avg_page_space_used_in_percent, page_count.
SET NOCOUNT ON; SET ROWCOUNT 0;
WITH x AS (
    SELECT CAST(j.[value] AS int) AS table_oid FROM OPENJSON(:oids) AS j
), leaf AS (
    SELECT x.table_oid,
           SUM(ps.page_count)                                                   AS page_count,
           SUM(ps.record_count * ps.avg_record_size_in_bytes)                   AS live_bytes,
           SUM((ps.ghost_record_count + COALESCE(ps.version_ghost_record_count, 0))
               * ps.avg_record_size_in_bytes)                                   AS ghost_bytes,
           SUM(ps.ghost_record_count)                                           AS ghost_record_count,
           SUM(ps.version_ghost_record_count)                                   AS version_ghost_record_count,
           SUM(ps.avg_fragmentation_in_percent * ps.page_count) / NULLIF(SUM(ps.page_count), 0)
                                                                                AS avg_fragmentation_in_percent,
           SUM(ps.avg_page_space_used_in_percent * ps.page_count) / NULLIF(SUM(ps.page_count), 0)
                                                                                AS avg_page_space_used_in_percent
    FROM x
    CROSS APPLY sys.dm_db_index_physical_stats(DB_ID(), x.table_oid,
                    CASE WHEN OBJECTPROPERTY(x.table_oid, 'TableHasClustIndex') = 1 THEN 1 ELSE 0 END,
                    NULL, 'SAMPLED') AS ps
    WHERE ps.index_level = 0 AND ps.alloc_unit_type_desc = N'IN_ROW_DATA'
    GROUP BY x.table_oid
)
SELECT leaf.table_oid,
       leaf.page_count * 8192                                                   AS table_len,
       CASE WHEN leaf.page_count < 10000 THEN 100.0 ELSE 1.0 END                AS scanned_percent,
       100.0 * leaf.live_bytes / NULLIF(leaf.page_count * 8192.0, 0)            AS approx_tuple_percent,
       leaf.ghost_record_count + COALESCE(leaf.version_ghost_record_count, 0)   AS dead_tuple_count,
       100.0 * leaf.ghost_bytes / NULLIF(leaf.page_count * 8192.0, 0)           AS dead_tuple_percent,
       100.0 - leaf.avg_page_space_used_in_percent                              AS approx_free_percent,
       leaf.ghost_record_count, leaf.version_ghost_record_count, leaf.avg_fragmentation_in_percent,
       leaf.avg_page_space_used_in_percent, leaf.page_count
FROM leaf;

-- name: sessions
-- Sessions that hold back ghost cleanup or sit idle in a transaction: every user session
-- with an open transaction in this database, and every one holding a row-versioning
-- transaction anywhere on the instance (the tempdb version store is shared). Our own
-- session and system tasks are left out. One row per session: its oldest transaction.
--   backend_xid   the transaction id when it has written to this database (its deleted
--                 rows stay ghosts until it ends), else NULL;
--   backend_xmin  its transaction sequence number when it is a row-versioning transaction
--                 (sys.dm_tran_active_snapshot_database_transactions): version ghosts
--                 newer than it are kept; else NULL;
--   xmin_age_xids NULL (sequence numbers are not transaction ids; xact_age_s is graded);
--   state         'active' (a request runs), 'idle in transaction' or 'idle';
--   state_age_s   since the request started, or since the last one ended;
--   wait_event_type 'Lock' for LCK_M_* waits; wait_event the wait type.
-- Without VIEW SERVER STATE the transaction views are not readable: no rows.
SET NOCOUNT ON; SET ROWCOUNT 0;
IF COALESCE(HAS_PERMS_BY_NAME(NULL, NULL, 'VIEW SERVER STATE'), 0) = 1
    SELECT CAST(h.session_id AS int)                                   AS pid,
           h.login_name                                                AS usename,
           h.program_name                                              AS application_name,
           c.client_net_address                                        AS client_addr,
           N'user session'                                             AS backend_type,
           CASE WHEN r.session_id IS NOT NULL THEN N'active' ELSE N'idle in transaction' END AS state,
           DB_NAME(h.database_id)                                      AS datname,
           CASE WHEN h.wrote_here = 1 THEN CAST(h.transaction_id AS nvarchar(20)) END AS backend_xid,
           CAST(h.transaction_sequence_num AS nvarchar(20))            AS backend_xmin,
           CAST(NULL AS bigint)                                        AS xmin_age_xids,
           DATEDIFF_BIG(millisecond, h.transaction_begin_time, GETDATE()) / 1e3 AS xact_age_s,
           DATEDIFF_BIG(millisecond, COALESCE(r.start_time, h.last_request_end_time), GETDATE()) / 1e3
                                                                       AS state_age_s,
           CASE WHEN r.wait_type LIKE N'LCK[_]M[_]%' THEN N'Lock'
                WHEN r.wait_type IS NOT NULL THEN N'Wait' END          AS wait_event_type,
           r.wait_type                                                 AS wait_event,
           LEFT(REPLACE(REPLACE(REPLACE(q.text, NCHAR(13), N' '), NCHAR(10), N' '), NCHAR(9), N' '), 160)
                                                                       AS query
    FROM (
        SELECT s.session_id, s.login_name, s.program_name, s.database_id, s.last_request_end_time,
               at.transaction_id, at.transaction_begin_time, snap.transaction_sequence_num,
               CASE WHEN EXISTS (SELECT 1 FROM sys.dm_tran_database_transactions AS dt
                                 WHERE dt.transaction_id = at.transaction_id AND dt.database_id = DB_ID()
                                   AND dt.database_transaction_log_record_count > 0)
                    THEN 1 ELSE 0 END AS wrote_here,
               CASE WHEN EXISTS (SELECT 1 FROM sys.dm_tran_database_transactions AS dd
                                 WHERE dd.transaction_id = at.transaction_id AND dd.database_id = DB_ID())
                    THEN 1 ELSE 0 END AS in_this_database,
               ROW_NUMBER() OVER (PARTITION BY s.session_id ORDER BY at.transaction_begin_time) AS rn
        FROM sys.dm_exec_sessions AS s
        JOIN sys.dm_tran_session_transactions AS st ON st.session_id = s.session_id
        JOIN sys.dm_tran_active_transactions AS at ON at.transaction_id = st.transaction_id
        LEFT JOIN sys.dm_tran_active_snapshot_database_transactions AS snap
               ON snap.transaction_id = at.transaction_id
        WHERE s.session_id <> @@SPID AND s.is_user_process = 1
    ) AS h
    LEFT JOIN sys.dm_exec_requests AS r ON r.session_id = h.session_id
    LEFT JOIN sys.dm_exec_connections AS c ON c.session_id = h.session_id AND c.parent_connection_id IS NULL
    OUTER APPLY sys.dm_exec_sql_text(c.most_recent_sql_handle) AS q
    WHERE h.rn = 1
      AND (h.in_this_database = 1 OR h.database_id = DB_ID() OR h.transaction_sequence_num IS NOT NULL)
    ORDER BY h.transaction_begin_time;
ELSE
    SELECT CAST(NULL AS int) AS pid, CAST(NULL AS nvarchar(128)) AS usename,
           CAST(NULL AS nvarchar(128)) AS application_name, CAST(NULL AS nvarchar(48)) AS client_addr,
           CAST(NULL AS nvarchar(32)) AS backend_type, CAST(NULL AS nvarchar(32)) AS state,
           CAST(NULL AS nvarchar(128)) AS datname, CAST(NULL AS nvarchar(20)) AS backend_xid,
           CAST(NULL AS nvarchar(20)) AS backend_xmin, CAST(NULL AS bigint) AS xmin_age_xids,
           CAST(NULL AS float) AS xact_age_s, CAST(NULL AS float) AS state_age_s,
           CAST(NULL AS nvarchar(32)) AS wait_event_type, CAST(NULL AS nvarchar(60)) AS wait_event,
           CAST(NULL AS nvarchar(160)) AS query
    WHERE 1 = 0;

-- name: replication_slots
-- PostgreSQL's slots retain WAL for a consumer; SQL Server's nearest is an availability
-- group's secondary replica of this database, which the primary keeps log for until the
-- replica has received it. One row per remote replica, as a physical slot:
--   active             the replica is connected and synchronizing;
--   retained_wal_bytes log not yet sent to it (log_send_queue_size, KB);
--   xmin               its ghost low-water mark (readable secondaries hold ghost cleanup
--                      on the primary through it); xmin_age_xids and
--                      catalog_xmin_age_xids NULL (not transaction ids; see
--                      standby_feedback).
-- Transactional replication and change data capture also keep log (log_reuse_wait_desc
-- = REPLICATION) but hold no ghosts and show no consumer inside the database: not listed.
-- No availability group, or no VIEW SERVER STATE: no rows.
SET NOCOUNT ON; SET ROWCOUNT 0;
IF COALESCE(HAS_PERMS_BY_NAME(NULL, NULL, 'VIEW SERVER STATE'), 0) = 1
    SELECT ar.replica_server_name                                     AS slot_name,
           N'physical'                                                AS slot_type,
           DB_NAME(rs.database_id)                                    AS "database",
           CAST(CASE WHEN rs.synchronization_state IN (1, 2) AND ars.connected_state = 1
                     THEN 1 ELSE 0 END AS bit)                        AS active,
           CAST(rs.low_water_mark_for_ghosts AS nvarchar(20))         AS xmin,
           CAST(NULL AS bigint)                                       AS xmin_age_xids,
           CAST(NULL AS bigint)                                       AS catalog_xmin_age_xids,
           rs.log_send_queue_size * 1024                              AS retained_wal_bytes
    FROM sys.dm_hadr_database_replica_states AS rs
    JOIN sys.availability_replicas AS ar ON ar.replica_id = rs.replica_id
    LEFT JOIN sys.dm_hadr_availability_replica_states AS ars ON ars.replica_id = rs.replica_id
    WHERE rs.database_id = DB_ID() AND rs.is_local = 0
    ORDER BY ar.replica_server_name;
ELSE
    SELECT CAST(NULL AS nvarchar(256)) AS slot_name, CAST(NULL AS nvarchar(16)) AS slot_type,
           CAST(NULL AS nvarchar(128)) AS "database", CAST(NULL AS bit) AS active,
           CAST(NULL AS nvarchar(20)) AS xmin, CAST(NULL AS bigint) AS xmin_age_xids,
           CAST(NULL AS bigint) AS catalog_xmin_age_xids, CAST(NULL AS bigint) AS retained_wal_bytes
    WHERE 1 = 0;

-- name: standby_feedback
-- hot_standby_feedback's counterpart: queries on a readable secondary hold ghost cleanup
-- of this primary through the replica's ghost low-water mark. One row per remote replica
-- of this database that reports one. xmin_age_xids is NULL (the mark is not a
-- transaction id: compare backend_xmin over time; a mark that stops moving while the
-- primary's advances is the secondary's long query).
SET NOCOUNT ON; SET ROWCOUNT 0;
IF COALESCE(HAS_PERMS_BY_NAME(NULL, NULL, 'VIEW SERVER STATE'), 0) = 1
    SELECT CAST(NULL AS int)                                          AS pid,
           ar.replica_server_name                                     AS application_name,
           ar.endpoint_url                                            AS client_addr,
           rs.synchronization_state_desc                              AS state,
           CAST(rs.low_water_mark_for_ghosts AS nvarchar(20))         AS backend_xmin,
           CAST(NULL AS bigint)                                       AS xmin_age_xids
    FROM sys.dm_hadr_database_replica_states AS rs
    JOIN sys.availability_replicas AS ar ON ar.replica_id = rs.replica_id
    WHERE rs.database_id = DB_ID() AND rs.is_local = 0
      AND rs.low_water_mark_for_ghosts IS NOT NULL
      AND ar.secondary_role_allow_connections > 0
    ORDER BY ar.replica_server_name;
ELSE
    SELECT CAST(NULL AS int) AS pid, CAST(NULL AS nvarchar(256)) AS application_name,
           CAST(NULL AS nvarchar(128)) AS client_addr, CAST(NULL AS nvarchar(60)) AS state,
           CAST(NULL AS nvarchar(20)) AS backend_xmin, CAST(NULL AS bigint) AS xmin_age_xids
    WHERE 1 = 0;

-- name: prepared_xacts
-- Two-phase transactions prepared and never resolved: distributed (MS DTC or XA)
-- transactions prepared and waiting for their coordinator (transaction_type 4,
-- transaction_state 5 or dtc_state 2), in any database. In doubt ones hold their locks
-- and ghosts until resolved (KILL 'unit of work id' WITH COMMIT | ROLLBACK).
--   gid = the unit of work id; xid = the transaction id; xid_age NULL.
SET NOCOUNT ON; SET ROWCOUNT 0;
IF COALESCE(HAS_PERMS_BY_NAME(NULL, NULL, 'VIEW SERVER STATE'), 0) = 1
    SELECT CAST(at.transaction_uow AS nvarchar(36))                   AS gid,
           DB_NAME(dt.database_id)                                    AS "database",
           s.login_name                                               AS owner,
           CAST(at.transaction_id AS nvarchar(20))                    AS xid,
           CAST(NULL AS bigint)                                       AS xid_age,
           DATEDIFF_BIG(millisecond, at.transaction_begin_time, GETDATE()) / 1e3 AS age_s,
           CAST(CASE WHEN dt.database_id = DB_ID() THEN 1 ELSE 0 END AS bit) AS this_database
    FROM sys.dm_tran_active_transactions AS at
    OUTER APPLY (SELECT TOP (1) d.database_id FROM sys.dm_tran_database_transactions AS d
                 WHERE d.transaction_id = at.transaction_id
                 ORDER BY CASE WHEN d.database_id = DB_ID() THEN 0 ELSE 1 END) AS dt
    LEFT JOIN sys.dm_tran_session_transactions AS st ON st.transaction_id = at.transaction_id
    LEFT JOIN sys.dm_exec_sessions AS s ON s.session_id = st.session_id
    WHERE at.transaction_type = 4 AND (at.transaction_state = 5 OR at.dtc_state = 2)
      AND at.transaction_uow IS NOT NULL
    ORDER BY at.transaction_begin_time;
ELSE
    SELECT CAST(NULL AS nvarchar(36)) AS gid, CAST(NULL AS nvarchar(128)) AS "database",
           CAST(NULL AS nvarchar(128)) AS owner, CAST(NULL AS nvarchar(20)) AS xid,
           CAST(NULL AS bigint) AS xid_age, CAST(NULL AS float) AS age_s,
           CAST(NULL AS bit) AS this_database
    WHERE 1 = 0;

-- name: job_runs
-- The job-run history (written by the scheduler when it is installed): per job and queue,
-- the last run, the last success and the failures over the last :failure_window_s.
-- :success and :not_failure are JSON arrays of outcomes.
WITH ranked AS (
    SELECT r.job, r.queue, r.started_at, r.finished_at, r."rows", r.outcome, r.error,
           ROW_NUMBER() OVER (PARTITION BY r.job, r.queue ORDER BY r.started_at DESC) AS rn
    FROM {{job_runs}} AS r
    WHERE r.started_at >= DATEADD(second, -CAST(:lookback_s AS int), SYSUTCDATETIME())
)
SELECT latest.job, latest.queue, latest.started_at, latest.finished_at, latest."rows", latest.outcome,
       LEFT(latest.error, 300) AS error,
       DATEDIFF_BIG(microsecond, latest.started_at, latest.finished_at) / 1e6 AS duration_s,
       (SELECT MAX(s.started_at) FROM ranked AS s
         WHERE s.job = latest.job
           AND (s.queue = latest.queue OR (s.queue IS NULL AND latest.queue IS NULL))
           AND s.outcome IN (SELECT ok.[value] FROM OPENJSON(:success) AS ok)) AS last_success_at,
       (SELECT COUNT_BIG(*) FROM ranked AS f
         WHERE f.job = latest.job
           AND (f.queue = latest.queue OR (f.queue IS NULL AND latest.queue IS NULL))
           AND f.started_at >= DATEADD(second, -CAST(:failure_window_s AS int), SYSUTCDATETIME())
           AND f.finished_at IS NOT NULL
           AND f.outcome NOT IN (SELECT nf.[value] FROM OPENJSON(:not_failure) AS nf)) AS failures
FROM ranked AS latest
WHERE latest.rn = 1
ORDER BY latest.job, latest.queue

-- name: queue_items
-- Destructive kinds (heap, fifo, stack, watermark): every row in the items table is waiting;
-- dequeued rows are gone, so completions are not visible here (no rates but enqueues).
SELECT COUNT_BIG(*) AS ready, 0 AS scheduled,
       DATEDIFF_BIG(microsecond, MIN(i.enqueued_at), SYSUTCDATETIME()) / 1e6 AS oldest_ready_age_s,
       COUNT_BIG(CASE WHEN i.enqueued_at >= DATEADD(second, -CAST(:window_s AS int), SYSUTCDATETIME())
                      THEN 1 END) AS enqueued_in_window
FROM {{items}} AS i

-- name: queue_pending
-- Pending kind: items not yet due are scheduled; the oldest due item's age counts from its
-- due time (it could not be taken earlier).
SELECT COUNT_BIG(CASE WHEN i.due_at <= SYSUTCDATETIME() THEN 1 END) AS ready,
       COUNT_BIG(CASE WHEN i.due_at > SYSUTCDATETIME() THEN 1 END)  AS scheduled,
       DATEDIFF_BIG(microsecond, MIN(CASE WHEN i.due_at <= SYSUTCDATETIME() THEN i.due_at END),
                    SYSUTCDATETIME()) / 1e6 AS oldest_ready_age_s,
       COUNT_BIG(CASE WHEN i.enqueued_at >= DATEADD(second, -CAST(:window_s AS int), SYSUTCDATETIME())
                      THEN 1 END) AS enqueued_in_window
FROM {{items}} AS i

-- name: watermark_lag
-- Rows between the stored watermark (the hint new sessions start from) and the oldest
-- item still waiting: ghosts a new session walks before its first find. Negative means the
-- stored watermark is above a waiting item, which the correction job must fix (such items
-- are skipped by sessions starting from the hint).
SELECT w.low, head.id AS head, head.id - w.low AS lag
FROM {{watermark}} AS w
CROSS JOIN (SELECT MIN(i.id) AS id FROM {{items}} AS i) AS head

-- name: queue_ring
-- Ring kind: FULL slots (state 1) are waiting messages; fill is FULL slots over all slots.
SELECT COUNT_BIG(CASE WHEN r.state = 1 THEN 1 END) AS ready, 0 AS scheduled, COUNT_BIG(*) AS slots,
       DATEDIFF_BIG(microsecond, MIN(CASE WHEN r.state = 1 THEN r.pushed_at END), SYSUTCDATETIME()) / 1e6
         AS oldest_ready_age_s,
       COUNT_BIG(CASE WHEN r.state = 1
                       AND r.pushed_at >= DATEADD(second, -CAST(:window_s AS int), SYSUTCDATETIME())
                      THEN 1 END) AS enqueued_in_window
FROM {{ring}} AS r

-- name: queue_rotation
-- A reliable queue's generations (reliable_0012; sql/mssql/reliable.sql's header): the ids
-- drawn since the last switch (the rotator keeps this near its rotate_items; it grows when
-- no archive job runs, or when a sealed generation cannot be emptied), and the oldest sealed
-- generation still waiting to be emptied (NULL: none waits). Read from the rotation's
-- sequences as the rot_state procedure reads them; a sequence the role may not see reads as
-- NULL, and so does the lag.
SELECT i.last_id - r.start_id AS lag,
       CASE WHEN r.emptied < r.sealed THEN r.emptied + 1 END AS waiting_epoch
FROM (SELECT (SELECT CAST(s.current_value AS bigint) FROM sys.sequences AS s
              WHERE s.object_id = OBJECT_ID({{rot_sealed_regclass}})) AS sealed,
             (SELECT CAST(s.current_value AS bigint) FROM sys.sequences AS s
              WHERE s.object_id = OBJECT_ID({{rot_emptied_regclass}})) AS emptied,
             (SELECT CAST(s.current_value AS bigint) FROM sys.sequences AS s
              WHERE s.object_id = OBJECT_ID({{rot_start_regclass}})) AS start_id) AS r
CROSS JOIN (SELECT COALESCE((SELECT CAST(s.last_used_value AS bigint) FROM sys.sequences AS s
                             WHERE s.object_id = OBJECT_ID({{meta_seq_regclass}})), 0) AS last_id) AS i

-- name: rotation_stranded
-- The items stranded in a sealed generation still waiting to be emptied (slot :slot):
-- expired leases and due READY rows the seal passed over. No claim looks for them in a
-- sealed slot; the archive job's truncate moves them forward. How long the oldest has been
-- due: seconds since its lease expired, or since its due time. Only the slot's own table
-- is read (each arm's test of :slot is a startup filter), through its ready and leased
-- indexes; the role needs SELECT on the slot tables (the meta view does not carry the slot).
SELECT COUNT_BIG(*) AS stranded,
       DATEDIFF_BIG(millisecond, MIN(CASE WHEN m.status = 1 THEN m.leased_until ELSE m.due_at END),
                    SYSUTCDATETIME()) / 1e3 AS stranded_age_s
FROM (SELECT m0.status, m0.due_at, m0.leased_until FROM {{meta0}} AS m0 WHERE :slot = 0
      UNION ALL
      SELECT m1.status, m1.due_at, m1.leased_until FROM {{meta1}} AS m1 WHERE :slot = 1
      UNION ALL
      SELECT m2.status, m2.due_at, m2.leased_until FROM {{meta2}} AS m2 WHERE :slot = 2) AS m
WHERE (m.status = 0 AND m.due_at <= SYSUTCDATETIME()) OR (m.status = 1 AND m.leased_until < SYSUTCDATETIME());

-- name: rotation_blockers
-- Sessions holding a granted lock on the given tables (:tables, their qualified names
-- joined by commas: the slot tables of a generation waiting to be emptied), in a
-- transaction older than :min_age_s: what keeps its TRUNCATE (a schema modification lock)
-- waiting. Any lock on the table counts: a reader's intent-shared lock is enough to block
-- it. Oldest transaction first. Without VIEW SERVER STATE the lock and transaction views
-- are not readable: no rows.
SET NOCOUNT ON; SET ROWCOUNT 0;
IF COALESCE(HAS_PERMS_BY_NAME(NULL, NULL, 'VIEW SERVER STATE'), 0) = 1
    SELECT CAST(b.session_id AS int) AS pid, b.login_name AS usename, b.program_name AS application_name,
           b.state, b.request_mode AS mode, b.xact_age_s
    FROM (
        SELECT DISTINCT s.session_id, s.login_name, s.program_name,
               CASE WHEN r.session_id IS NOT NULL THEN N'active' ELSE N'idle in transaction' END AS state,
               l.request_mode,
               DATEDIFF_BIG(millisecond, at.transaction_begin_time, GETDATE()) / 1e3 AS xact_age_s
        FROM STRING_SPLIT(:tables, N',') AS t
        JOIN sys.dm_tran_locks AS l
          ON l.resource_type = N'OBJECT' AND l.resource_database_id = DB_ID()
         AND l.resource_associated_entity_id = OBJECT_ID(t.value) AND l.request_status = N'GRANT'
        JOIN sys.dm_exec_sessions AS s ON s.session_id = l.request_session_id
        JOIN sys.dm_tran_session_transactions AS st ON st.session_id = s.session_id
        JOIN sys.dm_tran_active_transactions AS at ON at.transaction_id = st.transaction_id
        LEFT JOIN sys.dm_exec_requests AS r ON r.session_id = s.session_id
        WHERE s.session_id <> @@SPID
          AND at.transaction_begin_time < DATEADD(millisecond, -CAST(:min_age_s * 1000 AS int), GETDATE())
    ) AS b
    ORDER BY b.xact_age_s DESC;
ELSE
    SELECT CAST(NULL AS int) AS pid, CAST(NULL AS nvarchar(128)) AS usename,
           CAST(NULL AS nvarchar(128)) AS application_name, CAST(NULL AS nvarchar(32)) AS state,
           CAST(NULL AS nvarchar(60)) AS mode, CAST(NULL AS float) AS xact_age_s
    WHERE 1 = 0;
