-- The catalog's job tables (migration catalog_0002): the job-run history (SQL Agent's
-- sysjobhistory, in the catalog) and the health snapshots the inspect job records.
--
-- Names never end in a queue-object suffix (_meta, _data, _history, _version ...), so no
-- queue's objects can collide with them.

-- name: create_tables
-- One row per job run, written when the run starts (outcome 'running') and completed
-- when it ends: 'succeeded' or 'failed' (error says why); a run whose runner vanished is
-- marked 'abandoned' by the next runner that takes the same single-runner lock.
CREATE TABLE {{schema}}.job_runs (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job          text        NOT NULL,
    queue        text        NOT NULL,
    started_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    finished_at  timestamptz,
    outcome      text        NOT NULL DEFAULT 'running'
                 CHECK (outcome IN ('running', 'succeeded', 'failed', 'abandoned')),
    rows         bigint,
    error        text,
    summary      text,
    details      jsonb,
    trigger      text        NOT NULL DEFAULT 'manual',
    runner_host  text        NOT NULL,
    runner_pid   integer     NOT NULL,
    CHECK (outcome = 'running' OR finished_at IS NOT NULL)
);
CREATE INDEX job_runs_job_queue_started ON {{schema}}.job_runs (job, queue, started_at DESC);
CREATE INDEX job_runs_started ON {{schema}}.job_runs (started_at DESC);

-- One row per queue per inspect run: numbers to draw trends from (dead tuples, bloat,
-- fragmentation, what holds cleanup back). Columns are NULL when not measured (e.g.
-- physical numbers without the pgstattuple extension).
CREATE TABLE {{schema}}.health_snapshots (
    id                        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    taken_at                  timestamptz NOT NULL DEFAULT clock_timestamp(),
    queue                     text        NOT NULL,
    ready                     bigint,
    scheduled                 bigint,
    processing                bigint,
    done                      bigint,
    dead                      bigint,
    meta_live_tuples          bigint,
    meta_dead_tuples          bigint,
    meta_dead_pct             real,
    meta_hot_update_pct       real,
    meta_table_bytes          bigint,
    meta_index_bytes          bigint,
    meta_free_pct             real,
    data_live_tuples          bigint,
    data_dead_tuples          bigint,
    data_table_bytes          bigint,
    data_index_bytes          bigint,
    history_rows              bigint,
    history_bytes             bigint,
    min_index_leaf_density    real,
    max_index_fragmentation   real,
    index_bloat_pct           real,
    invalid_indexes           integer,
    last_autovacuum           timestamptz,
    last_vacuum               timestamptz,
    oldest_xmin_age           bigint,
    oldest_xact_seconds       double precision,
    oldest_xmin_holder        text,
    replication_slots_holding integer,
    oldest_slot_xmin_age      bigint,
    prepared_xacts            integer,
    oldest_prepared_seconds   double precision,
    details                   jsonb
);
CREATE INDEX health_snapshots_queue_taken ON {{schema}}.health_snapshots (queue, taken_at DESC);

-- name: drop_tables
-- Remove the job tables (downgrade of catalog_0002).
DROP TABLE IF EXISTS {{schema}}.health_snapshots;
DROP TABLE IF EXISTS {{schema}}.job_runs;

-- name: run_abandon
-- Called by a runner that holds the single-runner lock of (job, queue): any run still
-- 'running' for them lost its runner (killed, crashed, connection cut) without finishing.
UPDATE {{schema}}.job_runs
SET outcome = 'abandoned', finished_at = clock_timestamp(),
    error = 'the runner ' || runner_host || ':' || runner_pid || ' stopped before the run finished'
WHERE job = :job AND queue = :queue AND outcome = 'running'

-- name: run_start
-- A run begins (the runner holds the single-runner lock).
INSERT INTO {{schema}}.job_runs (job, queue, trigger, runner_host, runner_pid)
VALUES (:job, :queue, :trigger, :runner_host, :runner_pid)
RETURNING id, started_at

-- name: run_finish
-- A run ends, before the runner lets go of the lock.
UPDATE {{schema}}.job_runs
SET finished_at = clock_timestamp(), outcome = :outcome, rows = :rows, error = :error,
    summary = :summary, details = CAST(:details AS jsonb)
WHERE id = :id
RETURNING finished_at

-- name: runs_recent
-- The newest runs, optionally of one job and/or queue.
SELECT id, job, queue, started_at, finished_at, outcome, rows, error, summary, trigger,
       runner_host, runner_pid,
       extract(epoch FROM coalesce(finished_at, clock_timestamp()) - started_at) AS seconds
FROM {{schema}}.job_runs
WHERE (CAST(:job AS text) IS NULL OR job = :job)
  AND (CAST(:queue AS text) IS NULL OR queue = :queue)
ORDER BY started_at DESC, id DESC
LIMIT :limit

-- name: runs_last
-- The last run of every (job, queue).
SELECT DISTINCT ON (job, queue) job, queue, started_at, finished_at, outcome, rows, error
FROM {{schema}}.job_runs
ORDER BY job, queue, started_at DESC, id DESC

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
    CAST(:details AS jsonb))
RETURNING id, taken_at

-- name: runs_running
-- The (job, queue) pairs with a run still 'running': abandon_orphaned_runs tries each
-- one's single-runner lock, and a lock nobody holds means the runner died.
SELECT DISTINCT job, queue FROM {{schema}}.job_runs WHERE outcome = 'running'
