-- Single-runner locks (installers, maintenance jobs, pipeline exports) on SQL Server:
-- sp_getapplock with @LockOwner = 'Session', so the lock outlives the many short
-- transactions of a job run; released by sp_releaseapplock or when the connection closes.
-- Resource names compare binary (case-sensitive) and are truncated at 255 characters; our
-- keys are ASCII, at most ~200 characters. sp_getapplock returns 0 (granted), 1 (granted
-- after waiting), or < 0: -1 timeout, -2 cancelled, -3 deadlock victim, -999 parameter error.
--
-- queuectl's keys end in the catalog's lock seed (table lock_seed, readable by its owner
-- only: queuectl.locks), so a user who cannot read it cannot compute them;
-- sys.dm_tran_locks shows only a key's first 32 characters and a hash.

-- name: try_lock
-- Take the lock if free: 1 when taken, 0 at once when someone else holds it (timeout 0).
SET NOCOUNT ON; SET ROWCOUNT 0;
DECLARE @rc int;
EXEC @rc = sys.sp_getapplock @Resource = :key, @LockMode = 'Exclusive',
                             @LockOwner = 'Session', @LockTimeout = 0;
SELECT CAST(CASE WHEN @rc >= 0 THEN 1 ELSE 0 END AS bit) AS acquired;

-- name: unlock
-- Release a lock this session holds (1 when released).
SET NOCOUNT ON; SET ROWCOUNT 0;
DECLARE @rc int;
EXEC @rc = sys.sp_releaseapplock @Resource = :key, @LockOwner = 'Session';
SELECT CAST(CASE WHEN @rc = 0 THEN 1 ELSE 0 END AS bit) AS released;

-- name: holder
-- The session holding the lock (needs VIEW SERVER STATE or VIEW DATABASE STATE to see other
-- sessions; without it, no row). An application lock's resource_description reads
-- "<db id>:[<first 32 characters of the key>]:(<hash>)".
SELECT TOP (1) s.session_id AS pid, s.login_name AS role_name, s.program_name AS application_name,
       s.login_time AS backend_start
FROM sys.dm_tran_locks AS l
JOIN sys.dm_exec_sessions AS s ON s.session_id = l.request_session_id
WHERE l.resource_type = N'APPLICATION' AND l.request_status = N'GRANT'
  AND l.resource_database_id = DB_ID()
  AND CHARINDEX(N'[' + LEFT(:key, 32) + N']', l.resource_description) > 0;

-- name: read_seed
SELECT seed FROM {{schema}}.lock_seed WHERE id = 1;

-- name: create_seed
-- The catalog's lock seed (revision catalog_0004): two NEWID()s, 244 random bits; no
-- permission on the table for anyone but its owner (SQL Server grants none by default).
CREATE TABLE {{schema}}.lock_seed (
    id smallint NOT NULL CONSTRAINT lock_seed_pkey PRIMARY KEY CHECK (id = 1),
    seed nvarchar(64) NOT NULL
);
INSERT INTO {{schema}}.lock_seed (id, seed)
VALUES (1, REPLACE(CONVERT(nvarchar(36), NEWID()) + CONVERT(nvarchar(36), NEWID()), N'-', N''));

-- name: drop_seed
DROP TABLE IF EXISTS {{schema}}.lock_seed;
