-- The data pipeline (queuectl pipeline export / report) on PostgreSQL.
--
-- What a lake holds of a queue is described by two numbers kept in the lake's commit log
-- and mirrored in {{exports}}: every history row with id <= exported_upto_id and
-- archived_at < archived_before, and no other. A run widens both bounds, so it reads the
-- difference: new ids, plus "late" rows with old ids that were archived since (an item
-- retried for an hour finishes long after the items enqueued behind it).
--
-- Timestamps reach the JDBC read queries (which Spark sends as text, without binds) as
-- whole microseconds since the epoch, rendered from validated integers.

-- name: export_window
-- The new bounds. archived_before stays below the start of every transaction still open
-- in this database (less a second for the gap between a transaction's start and its
-- report in pg_stat_activity): an archive batch that began earlier and commits later
-- would otherwise insert rows below the bound after we read. Needs visibility of other
-- sessions' xact_start (same role as the archive job, or pg_read_all_stats).
SELECT
    (SELECT max(id) FROM {{history}}) AS max_id,
    least(statement_timestamp(),
          (SELECT min(a.xact_start) FROM pg_stat_activity a
            WHERE a.datname = current_database() AND a.backend_type = 'client backend'
              AND a.xact_start IS NOT NULL AND a.pid <> pg_backend_pid()))
        - interval '1 second' AS archived_before,
    (SELECT count(*) FROM pg_stat_activity a
      WHERE a.datname = current_database() AND a.backend_type = 'client backend'
        AND a.query = '<insufficient privilege>') AS hidden_sessions

-- name: window_rows
-- How many rows a run will read: new ids and late rows (for the progress display and the
-- commit record).
SELECT count(*) FILTER (WHERE id > {{after_id}}) AS new_rows,
       count(*) FILTER (WHERE id <= {{after_id}}) AS late_rows
FROM {{history}}
WHERE id <= {{upto_id}}
  AND archived_at < timestamptz 'epoch' + {{before_us}} * interval '1 microsecond'
  AND (id > {{after_id}}
       OR archived_at >= timestamptz 'epoch' + {{after_before_us}} * interval '1 microsecond')

-- name: read_new
-- Spark's JDBC source reads this subquery in id-range partitions (partitionColumn = id).
(SELECT id, priority, due_at, status, title, attempts, max_attempts, lease_owner,
        enqueued_at, dequeued_at, finished_at, last_error, payload, headers::text AS headers,
        archived_at
   FROM {{history}}
  WHERE id > {{after_id}} AND id <= {{upto_id}}
    AND archived_at < timestamptz 'epoch' + {{before_us}} * interval '1 microsecond') AS new_rows

-- name: read_late
-- Rows with already exported ids archived since the last run's bound: one partition.
(SELECT id, priority, due_at, status, title, attempts, max_attempts, lease_owner,
        enqueued_at, dequeued_at, finished_at, last_error, payload, headers::text AS headers,
        archived_at
   FROM {{history}}
  WHERE id <= {{after_id}}
    AND archived_at >= timestamptz 'epoch' + {{after_before_us}} * interval '1 microsecond'
    AND archived_at < timestamptz 'epoch' + {{before_us}} * interval '1 microsecond') AS late_rows

-- name: get_export
-- What the catalog says a lake holds of a queue.
SELECT run_seq, exported_upto_id, archived_before, rows_exported, rows_purged, updated_at
FROM {{exports}}
WHERE queue = :queue AND lake = :lake

-- name: record_export
-- Mirror the lake's newest commit record (idempotent: a rerun of a recovery writes the same).
INSERT INTO {{exports}} AS e (queue, lake, run_seq, exported_upto_id, archived_before, rows_exported)
VALUES (:queue, :lake, :run_seq, :upto_id, :archived_before, :rows_exported)
ON CONFLICT (queue, lake) DO UPDATE
SET run_seq = excluded.run_seq,
    exported_upto_id = excluded.exported_upto_id,
    archived_before = excluded.archived_before,
    rows_exported = excluded.rows_exported,
    updated_at = now()

-- name: add_purged
-- Count rows purged from history after export.
UPDATE {{exports}} SET rows_purged = rows_purged + :purged, updated_at = now()
WHERE queue = :queue AND lake = :lake

-- name: batch_lock_timeout
-- A purge batch waits at most this long for a row lock, then gives up (rolled back).
SELECT set_config('lock_timeout', :lock_timeout, true)

-- name: purge_batch
-- Delete one batch of exported rows, in id order after :after_id; returns how many and the
-- highest id deleted (the next batch starts there).
WITH doomed AS (
    SELECT id FROM {{history}}
    WHERE id > :after_id AND id <= :upto_id AND archived_at < :archived_before
    ORDER BY id
    LIMIT :batch
), gone AS (
    DELETE FROM {{history}} h USING doomed WHERE h.id = doomed.id
    RETURNING h.id
)
SELECT count(*) AS n, max(id) AS last_id FROM gone

-- name: history_checksum
-- Order-independent fingerprint of the exported part of a history: row count and the sum
-- of 60 bits of md5(id:payload-hex); the lake side computes the same in Spark.
SELECT count(*) AS n,
       coalesce(sum(('x' || substr(md5(id::text || ':' || coalesce(encode(payload, 'hex'), '')), 1, 15))::bit(60)::bigint), 0) AS checksum
FROM {{history}}
WHERE id <= :upto_id AND archived_at < :archived_before

-- name: hourly_percentiles
-- Wait and processing time percentiles per hour of finished_at, as the report computes them
-- from the lake (used to check the report against the database).
SELECT date_trunc('hour', finished_at AT TIME ZONE 'UTC') AS hour,
       percentile_cont(ARRAY[0.5, 0.9, 0.99]) WITHIN GROUP (
           ORDER BY extract(epoch FROM dequeued_at - enqueued_at)) AS wait_s,
       percentile_cont(ARRAY[0.5, 0.9, 0.99]) WITHIN GROUP (
           ORDER BY extract(epoch FROM finished_at - dequeued_at)) AS processing_s
FROM {{history}}
WHERE finished_at IS NOT NULL AND dequeued_at IS NOT NULL
GROUP BY 1
ORDER BY 1

-- name: synthetic_history
-- Benchmarks and tests: :n finished rows with ids after :first_id, enqueued from :start over
-- :hours hours, 1-5 attempts, about 2% dead, payloads of about :payload_bytes bytes.
INSERT INTO {{history}} (id, priority, due_at, status, title, attempts, max_attempts,
                         lease_owner, enqueued_at, dequeued_at, finished_at, last_error,
                         payload, headers)
SELECT g.id,
       (g.id % 3)::smallint,
       t.enq,
       CASE WHEN g.id % 50 = 0 THEN 3 ELSE 2 END::smallint,
       'item ' || g.id,
       1 + (g.id * 7 % 5)::int,
       5,
       'worker-' || (g.id % 4),
       t.enq,
       t.enq + make_interval(secs => (g.id * 37 % 1000) / 100.0),
       t.enq + make_interval(secs => (g.id * 37 % 1000) / 100.0 + (g.id * 13 % 5000) / 1000.0),
       CASE WHEN g.id % 50 = 0 THEN 'failed ' || (g.id % 5) || ' times' END,
       convert_to(repeat(md5(g.id::text), greatest(:payload_bytes / 32, 1)), 'UTF8'),
       jsonb_build_object('n', g.id)
FROM generate_series(:first_id + 1, :first_id + :n) AS g(id)
CROSS JOIN LATERAL (
    SELECT CAST(:start AS timestamptz)
           + make_interval(secs => (g.id - :first_id - 1) * (:hours * 3600.0) / :n) AS enq
) t
