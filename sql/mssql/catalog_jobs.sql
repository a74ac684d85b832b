-- The catalog's job tables on SQL Server (migration catalog_0002): the job-run history
-- (SQL Agent's sysjobhistory, in the catalog) and the health snapshots the inspect job
-- records. The same sections as sql/postgresql/catalog_jobs.sql; times are UTC datetime2.
-- "rows" and "trigger" are reserved words in T-SQL, hence quoted everywhere.

-- name: create_tables
-- One row per job run, written when the run starts (outcome 'running') and completed
-- when it ends: 'succeeded' or 'failed' (error says why); a run whose runner vanished is
-- marked 'abandoned' by the next runner that takes the same single-runner lock.
CREATE TABLE {{schema}}.job_runs (
    id           bigint IDENTITY(1, 1) NOT NULL PRIMARY KEY CLUSTERED,
    job          nvarchar(64)   NOT NULL,
    queue        nvarchar(128)  NOT NULL,
    started_at   datetime2(6)   NOT NULL DEFAULT SYSUTCDATETIME(),
    finished_at  datetime2(6)   NULL,
    outcome      nvarchar(16)   NOT NULL DEFAULT N'running'
                 CHECK (outcome IN (N'running', N'succeeded', N'failed', N'abandoned')),
    "rows"       bigint         NULL,
    error        nvarchar(max)  NULL,
    summary      nvarchar(max)  NULL,
    details      nvarchar(max)  NULL CHECK (details IS NULL OR ISJSON(details) = 1),
    "trigger"    nvarchar(64)   NOT NULL DEFAULT N'manual',
    runner_host  nvarchar(256)  NOT NULL,
    runner_pid   int            NOT NULL,
    CHECK (outcome = N'running' OR finished_at IS NOT NULL)
);
GO
CREATE INDEX job_runs_job_queue_started ON {{schema}}.job_runs (job, queue, started_at DESC);
GO
CREATE INDEX job_runs_started ON {{schema}}.job_runs (started_at DESC);
GO
-- One row per queue per inspect run: numbers to draw trends from. On SQL Server the
-- "dead" columns hold ghost records and the xmin columns stay NULL; the version-ghost
-- and version-store numbers go to details.
CREATE TABLE {{schema}}.health_snapshots (
    id                        bigint IDENTITY(1, 1) NOT NULL PRIMARY KEY CLUSTERED,
    taken_at                  datetime2(6)  NOT NULL DEFAULT SYSUTCDATETIME(),
    queue                     nvarchar(128) NOT NULL,
    ready                     bigint NULL,
    scheduled                 bigint NULL,
    processing                bigint NULL,
    done                      bigint NULL,
    dead                      bigint NULL,
    meta_live_tuples          bigint NULL,
    meta_dead_tuples          bigint NULL,
    meta_dead_pct             real NULL,
    meta_hot_update_pct       real NULL,
    meta_table_bytes          bigint NULL,
    meta_index_bytes          bigint NULL,
    meta_free_pct             real NULL,
    data_live_tuples          bigint NULL,
    data_dead_tuples          bigint NULL,
    data_table_bytes          bigint NULL,
    data_index_bytes          bigint NULL,
    history_rows              bigint NULL,
    history_bytes             bigint NULL,
    min_index_leaf_density    real NULL,
    max_index_fragmentation   real NULL,
    index_bloat_pct           real NULL,
    invalid_indexes           int NULL,
    last_autovacuum           datetime2(6) NULL,
    last_vacuum               datetime2(6) NULL,
    oldest_xmin_age           bigint NULL,
    oldest_xact_seconds       float NULL,
    oldest_xmin_holder        nvarchar(400) NULL,
    replication_slots_holding int NULL,
    oldest_slot_xmin_age      bigint NULL,
    prepared_xacts            int NULL,
    oldest_prepared_seconds   float NULL,
    details                   nvarchar(max) NULL CHECK (details IS NULL OR ISJSON(details) = 1)
);
GO
CREATE INDEX health_snapshots_queue_taken ON {{schema}}.health_snapshots (queue, taken_at DESC);

-- name: drop_tables
-- Remove the job tables (downgrade of catalog_0002).
DROP TABLE IF EXISTS {{schema}}.health_snapshots;
DROP TABLE IF EXISTS {{schema}}.job_runs;

-- name: run_abandon
-- Called by a runner that holds the single-runner lock of (job, queue): any run still
-- 'running' for them lost its runner (killed, crashed, connection cut) without finishing.
UPDATE {{schema}}.job_runs
SET outcome = N'abandoned', finished_at = SYSUTCDATETIME(),
    error = CONCAT(N'the runner ', runner_host, N'/', runner_pid, N' stopped before the run finished')
WHERE job = :job AND queue = :queue AND outcome = N'running'

-- name: run_start
-- A run begins (the runner holds the single-runner lock).
INSERT INTO {{schema}}.job_runs (job, queue, "trigger", runner_host, runner_pid)
OUTPUT inserted.id, inserted.started_at
VALUES (:job, :queue, :trigger, :runner_host, :runner_pid)

-- name: run_finish
-- A run ends, before the runner lets go of the lock.
UPDATE {{schema}}.job_runs
SET finished_at = SYSUTCDATETIME(), outcome = :outcome, "rows" = :rows, error = :error,
    summary = :summary, details = :details
OUTPUT inserted.finished_at
WHERE id = :id

-- name: runs_recent
-- The newest runs, optionally of one job and/or queue.
SELECT TOP (CAST(:limit AS int))
       id, job, queue, started_at, finished_at, outcome, "rows", error, summary, "trigger",
       runner_host, runner_pid,
       DATEDIFF_BIG(millisecond, started_at, COALESCE(finished_at, SYSUTCDATETIME())) / 1000e0 AS seconds
FROM {{schema}}.job_runs
WHERE (:job IS NULL OR job = :job)
  AND (:queue IS NULL OR queue = :queue)
ORDER BY started_at DESC, id DESC

-- name: runs_last
-- The last run of every (job, queue).
SELECT job, queue, started_at, finished_at, outcome, "rows", error
FROM (
    SELECT r.*, ROW_NUMBER() OVER (PARTITION BY r.job, r.queue
                                   ORDER BY r.started_at DESC, r.id DESC) AS newest
    FROM {{schema}}.job_runs AS r
) AS ranked
WHERE ranked.newest = 1
ORDER BY job, queue

-- name: snapshot_insert
-- One health snapshot (the inspect job).
INSERT INTO {{schema}}.health_snapshots (
    queue, ready, scheduled, processing, done, dead,
    meta_live_tuples, meta_dead_tuples, meta_dead_pct, meta_hot_update_pct,
    meta_table_bytes, meta_index_bytes, meta_free_pct,
    data_live_tuples, data_dead_tuples, data_table_bytes, data_index_bytes,
    history_rows, history_bytes,
    min_index_leaf_density, max_index_fragmentation, index_bloat_pct, invalid_indexes,
    last_autovacuum, last_vacuum,
    oldest_xmin_age, oldest_xact_seconds, oldest_xmin_holder,
    replication_slots_holding, oldest_slot_xmin_age, prepared_xacts, oldest_prepared_seconds,
    details)
OUTPUT inserted.id, inserted.taken_at
VALUES (
    :queue, :ready, :scheduled, :processing, :done, :dead,
    :meta_live_tuples, :meta_dead_tuples, :meta_dead_pct, :meta_hot_update_pct,
    :meta_table_bytes, :meta_index_bytes, :meta_free_pct,
    :data_live_tuples, :data_dead_tuples, :data_table_bytes, :data_index_bytes,
    :history_rows, :history_bytes,
    :min_index_leaf_density, :max_index_fragmentation, :index_bloat_pct, :invalid_indexes,
    :last_autovacuum, :last_vacuum,
    :oldest_xmin_age, :oldest_xact_seconds, :oldest_xmin_holder,
    :replication_slots_holding, :oldest_slot_xmin_age, :prepared_xacts, :oldest_prepared_seconds,
    :details)

-- name: runs_running
-- The (job, queue) pairs with a run still 'running': abandon_orphaned_runs tries each
-- one's single-runner lock, and a lock nobody holds means the runner died.
SELECT DISTINCT job, queue FROM {{schema}}.job_runs WHERE outcome = N'running'
