-- Single-runner locks (installers, maintenance jobs) on SQL Server: sp_getapplock with
-- @LockOwner = 'Session', so the lock outlives the many short transactions of a job run;
-- released by sp_releaseapplock or when the connection closes. Resource names compare
-- binary (case-sensitive) and are truncated at 255 characters; our keys are short ASCII.
-- sp_getapplock returns 0 (granted), 1 (granted after waiting), or < 0: -1 timeout,
-- -2 cancelled, -3 deadlock victim, -999 parameter error.

-- name: try_lock
-- Take the lock if free: 1 when taken, 0 at once when someone else holds it (timeout 0).
SET NOCOUNT ON;
DECLARE @rc int;
EXEC @rc = sys.sp_getapplock @Resource = :key, @LockMode = 'Exclusive',
                             @LockOwner = 'Session', @LockTimeout = 0;
SELECT CAST(CASE WHEN @rc >= 0 THEN 1 ELSE 0 END AS bit) AS acquired;

-- name: wait_lock
-- Take the lock, waiting as long as it takes (-1); anything but a grant is an error.
SET NOCOUNT ON;
DECLARE @rc int;
EXEC @rc = sys.sp_getapplock @Resource = :key, @LockMode = 'Exclusive',
                             @LockOwner = 'Session', @LockTimeout = -1;
IF @rc < 0
    THROW 50001, 'queuectl: sp_getapplock did not grant the lock', 1;
SELECT CAST(1 AS bit) AS acquired;

-- name: unlock
-- Release a lock this session holds (1 when released).
SET NOCOUNT ON;
DECLARE @rc int;
EXEC @rc = sys.sp_releaseapplock @Resource = :key, @LockOwner = 'Session';
SELECT CAST(CASE WHEN @rc = 0 THEN 1 ELSE 0 END AS bit) AS released;
