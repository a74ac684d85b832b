-- What `queuectl health` reads on PostgreSQL.
--
-- Every section is one statement over catalog or statistics views (or one pass over a
-- queue's own tables), so a report costs a fixed number of queries plus one per queue,
-- never one per row. Identifiers come from validated names through sqlfiles.render();
-- lists of relations are passed as bound text[] parameters and resolved with to_regclass.
--
-- The xmin horizon: VACUUM and index LP_DEAD hinting can only remove row versions older
-- than the oldest snapshot that may still need them. For ordinary tables that horizon is
-- per database (a session in another database does not hold our queue tables back), but
-- sessions without a database (walsenders), replication slots and hot-standby feedback
-- hold it for every database. Prepared transactions hold their own database's tables.

-- name: server
-- The server and this session's powers: version, recovery, pgstattuple, stats visibility;
-- and when autovacuum takes a table that has no settings of its own (it vacuums once dead
-- tuples pass threshold + scale_factor x live tuples, checking every naptime seconds).
SELECT current_database()                                   AS database,
       current_setting('server_version')                    AS server_version,
       current_setting('server_version_num')::int           AS server_version_num,
       pg_is_in_recovery()                                  AS in_recovery,
       (SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace
         WHERE e.extname = 'pgstattuple')                    AS pgstattuple_schema,
       EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'pgstattuple')
                                                            AS pgstattuple_available,
       (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)
         OR pg_has_role(current_user, 'pg_read_all_stats', 'MEMBER')
                                                            AS sees_all_sessions,
       current_setting('autovacuum')::boolean               AS autovacuum_on,
       current_setting('autovacuum_vacuum_threshold')::bigint AS autovacuum_vacuum_threshold,
       current_setting('autovacuum_vacuum_scale_factor')::float8
                                                            AS autovacuum_vacuum_scale_factor,
       (SELECT setting::int FROM pg_settings WHERE name = 'autovacuum_naptime')
                                                            AS autovacuum_naptime_s

-- name: session_limits
-- A report never waits long: bounded statements and lock waits (pgstatindex takes
-- ACCESS SHARE locks, which queue behind a pending ACCESS EXCLUSIVE).
SELECT set_config('statement_timeout', :statement_timeout, true),
       set_config('lock_timeout', :lock_timeout, true)

-- name: now
-- The report's timestamp, from the server clock (ages are computed there too).
SELECT now()

-- name: create_pgstattuple
-- Tried once per report when allowed: pgstatindex gives the measured leaf density.
CREATE EXTENSION IF NOT EXISTS pgstattuple

-- name: queue_reliable
-- One pass over a reliable queue's meta table, plus a bounded look at the newest history
-- rows (the archive job moves finished rows there, so recent completions live in both).
-- :history_scan bounds that look to the newest N archived rows through the primary key,
-- so the cost does not grow with the history table. An item counts as dequeued in the
-- window when its latest dequeue falls in it (a retried item counts once). A generation's
-- rows are copied to history before its truncate removes them from meta (reliable_0012:
-- for as long as a session holding the slot keeps the truncate waiting), so an archived
-- row still in meta is counted from meta only (at most :history_scan probes of meta's
-- primary keys).
WITH live AS (
    SELECT count(*) FILTER (WHERE status = 0 AND due_at <= now())            AS ready,
           count(*) FILTER (WHERE status = 0 AND due_at > now())             AS scheduled,
           count(*) FILTER (WHERE status = 1)                                AS processing,
           count(*) FILTER (WHERE status = 2)                                AS done,
           count(*) FILTER (WHERE status = 3)                                AS dead,
           count(*) FILTER (WHERE status = 1 AND leased_until < now())       AS stuck,
           min(leased_until) FILTER (WHERE status = 1 AND leased_until < now()) AS oldest_expired_lease,
           min(due_at) FILTER (WHERE status = 0 AND due_at <= now())         AS oldest_ready_due_at,
           count(*) FILTER (WHERE enqueued_at >= now() - make_interval(secs => :window_s)) AS enqueued,
           count(*) FILTER (WHERE dequeued_at >= now() - make_interval(secs => :window_s)) AS dequeued,
           count(*) FILTER (WHERE status = 2 AND finished_at >= now() - make_interval(secs => :window_s)) AS completed,
           count(*) FILTER (WHERE status = 3 AND finished_at >= now() - make_interval(secs => :window_s)) AS died
    FROM {{meta}}
), archived AS (
    SELECT count(*) FILTER (WHERE h.enqueued_at >= now() - make_interval(secs => :window_s)) AS enqueued,
           count(*) FILTER (WHERE h.dequeued_at >= now() - make_interval(secs => :window_s)) AS dequeued,
           count(*) FILTER (WHERE h.status = 2 AND h.finished_at >= now() - make_interval(secs => :window_s)) AS completed,
           count(*) FILTER (WHERE h.status = 3 AND h.finished_at >= now() - make_interval(secs => :window_s)) AS died
    FROM (SELECT id, enqueued_at, dequeued_at, finished_at, status FROM {{history}}
          ORDER BY id DESC LIMIT :history_scan) h
    WHERE NOT EXISTS (SELECT 1 FROM {{meta}} m WHERE m.id = h.id)
)
SELECT live.ready, live.scheduled, live.processing, live.done, live.dead, live.stuck,
       extract(epoch FROM now() - live.oldest_expired_lease)::float8 AS oldest_expired_lease_s,
       extract(epoch FROM now() - live.oldest_ready_due_at)::float8  AS oldest_ready_age_s,
       live.enqueued + archived.enqueued   AS enqueued_in_window,
       live.dequeued + archived.dequeued   AS dequeued_in_window,
       live.completed + archived.completed AS completed_in_window,
       live.died + archived.died           AS died_in_window
FROM live, archived

-- name: tables
-- Vital signs of the given tables (text[] of qualified names): tuples, churn, sizes,
-- vacuum/analyze times, fillfactor, and the table's own autovacuum storage parameters
-- ('name=value' text[], its TOAST table's as 'toast.name=value'; empty: the server's
-- settings apply). Missing tables are left out, and so are partitioned parents (a
-- reliable queue's generations are its tables; the parent holds no rows). Sizes need a lock on the
-- relation, so a table someone holds (or waits for) in ACCESS EXCLUSIVE mode gets NULL
-- sizes instead of stalling the report; pg_stat_user_tables needs no lock.
WITH exclusive AS MATERIALIZED (
    SELECT DISTINCT l.relation FROM pg_locks l
    WHERE l.locktype = 'relation' AND l.mode = 'AccessExclusiveLock'
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
)
SELECT t.name                                    AS qualified,
       c.oid                                     AS table_oid,
       c.relname                                 AS table_name,
       s.n_live_tup, s.n_dead_tup,
       s.n_tup_upd, s.n_tup_hot_upd,
       s.last_vacuum, s.last_autovacuum, s.last_analyze, s.last_autoanalyze,
       s.vacuum_count, s.autovacuum_count,
       x.relation IS NOT NULL                    AS locked,
       CASE WHEN x.relation IS NULL
            THEN pg_relation_size(c.oid) / current_setting('block_size')::bigint END AS pages,
       CASE WHEN x.relation IS NULL THEN pg_table_size(c.oid) END   AS table_bytes,
       CASE WHEN x.relation IS NULL THEN pg_indexes_size(c.oid) END AS index_bytes,
       coalesce((SELECT substr(o, 12)::int FROM unnest(c.reloptions) o
                 WHERE o LIKE 'fillfactor=%'), 100) AS fillfactor,
       ARRAY(SELECT o FROM unnest(c.reloptions) o WHERE o LIKE 'autovacuum\_%'
             UNION ALL
             SELECT 'toast.' || o FROM pg_class tc, unnest(tc.reloptions) o
             WHERE tc.oid = c.reltoastrelid AND o LIKE 'autovacuum\_%'
             ORDER BY 1) AS autovacuum_options
FROM unnest(CAST(:tables AS text[])) WITH ORDINALITY AS t(name, ord)
JOIN pg_class c ON c.oid = to_regclass(t.name) AND c.relkind = 'r'
JOIN pg_stat_user_tables s ON s.relid = c.oid
LEFT JOIN exclusive x ON x.relation = c.oid
ORDER BY t.ord

-- name: indexes
-- Every index of the given tables: size, validity, method, use, and leftovers of an
-- interrupted REINDEX CONCURRENTLY (_ccnew / _ccold). Locked indexes/tables: NULL size.
WITH exclusive AS MATERIALIZED (
    SELECT DISTINCT l.relation FROM pg_locks l
    WHERE l.locktype = 'relation' AND l.mode = 'AccessExclusiveLock'
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
)
SELECT t.name                                    AS qualified,
       ic.oid                                    AS index_oid,
       ic.relname                                AS index_name,
       am.amname                                 AS method,
       CASE WHEN NOT EXISTS (SELECT 1 FROM exclusive x WHERE x.relation IN (ic.oid, i.indrelid))
            THEN pg_relation_size(ic.oid) END    AS index_bytes,
       i.indisvalid                              AS valid,
       ic.relname ~ '_cc(new|old)[0-9]*$'        AS reindex_leftover,
       coalesce(si.idx_scan, 0)                  AS idx_scan,
       coalesce((SELECT substr(o, 12)::int FROM unnest(ic.reloptions) o
                 WHERE o LIKE 'fillfactor=%'), 90) AS fillfactor
FROM unnest(CAST(:tables AS text[])) WITH ORDINALITY AS t(name, ord)
JOIN pg_class tc ON tc.oid = to_regclass(t.name) AND tc.relkind = 'r'
JOIN pg_index i ON i.indrelid = tc.oid
JOIN pg_class ic ON ic.oid = i.indexrelid
JOIN pg_am am ON am.oid = ic.relam
LEFT JOIN pg_stat_user_indexes si ON si.indexrelid = ic.oid
ORDER BY t.ord, ic.relname

-- name: index_physical
-- pgstatindex for the given B-tree indexes (oid[]): leaf pages, density, fragmentation.
-- It reads the whole index, so the caller passes only indexes under a size cap.
SELECT x.oid AS index_oid, s.tree_level, s.index_size, s.leaf_pages, s.internal_pages,
       s.empty_pages, s.deleted_pages, s.avg_leaf_density, s.leaf_fragmentation
FROM unnest(CAST(:oids AS oid[])) AS x(oid),
     LATERAL {{pgstattuple_schema}}.pgstatindex(x.oid::regclass) s

-- name: table_physical
-- pgstattuple_approx for the given tables (oid[]): dead and free space from the pages that
-- are not all-visible (exact dead counts, estimated free space). Size-capped by the caller.
SELECT x.oid AS table_oid, s.table_len, s.scanned_percent, s.approx_tuple_percent,
       s.dead_tuple_count, s.dead_tuple_percent, s.approx_free_percent
FROM unnest(CAST(:oids AS oid[])) AS x(oid),
     LATERAL {{pgstattuple_schema}}.pgstattuple_approx(x.oid::regclass) s

-- name: sessions
-- Sessions that hold back cleanup or sit idle in a transaction: those in this database
-- and those without one (walsenders hold every database). Our own session and
-- autovacuum workers (transient, cannot be "ended" by a user) are left out.
SELECT a.pid, a.usename::text AS usename, a.application_name, a.client_addr::text AS client_addr,
       a.backend_type, a.state, a.datname::text AS datname,
       a.backend_xid::text AS backend_xid, a.backend_xmin::text AS backend_xmin,
       age(a.backend_xmin)                              AS xmin_age_xids,
       extract(epoch FROM now() - a.xact_start)::float8   AS xact_age_s,
       extract(epoch FROM now() - a.state_change)::float8 AS state_age_s,
       a.wait_event_type, a.wait_event,
       left(regexp_replace(a.query, '\s+', ' ', 'g'), 160) AS query
FROM pg_stat_activity a
WHERE a.pid <> pg_backend_pid()
  AND (a.datid = (SELECT oid FROM pg_database WHERE datname = current_database()) OR a.datid IS NULL)
  AND a.backend_type NOT IN ('autovacuum worker', 'autovacuum launcher')
  AND (a.backend_xmin IS NOT NULL OR a.backend_xid IS NOT NULL
       OR a.state IN ('idle in transaction', 'idle in transaction (aborted)'))
ORDER BY a.xact_start NULLS LAST

-- name: replication_slots
-- Every slot of the cluster: an xmin holds back cleanup in all databases, a catalog_xmin
-- holds system catalogs, and an inactive slot also keeps WAL.
SELECT s.slot_name::text AS slot_name, s.slot_type, s.database::text AS database, s.active,
       s.xmin::text AS xmin, age(s.xmin) AS xmin_age_xids,
       age(s.catalog_xmin) AS catalog_xmin_age_xids,
       CASE WHEN pg_is_in_recovery() OR s.restart_lsn IS NULL THEN NULL
            ELSE pg_wal_lsn_diff(pg_current_wal_lsn(), s.restart_lsn)::bigint END AS retained_wal_bytes
FROM pg_replication_slots s
ORDER BY s.slot_name

-- name: standby_feedback
-- Standbys with hot_standby_feedback report their oldest query's xmin to this server.
SELECT r.pid, r.application_name, r.client_addr::text AS client_addr, r.state,
       r.backend_xmin::text AS backend_xmin, age(r.backend_xmin) AS xmin_age_xids
FROM pg_stat_replication r
WHERE r.backend_xmin IS NOT NULL

-- name: prepared_xacts
-- Two-phase transactions prepared and never committed or rolled back, in any database.
SELECT p.gid, p.database::text AS database, p.owner::text AS owner,
       p.transaction::text AS xid, age(p.transaction) AS xid_age,
       extract(epoch FROM now() - p.prepared)::float8 AS age_s,
       p.database = current_database() AS this_database
FROM pg_prepared_xacts p
ORDER BY p.prepared

-- name: job_runs
-- The job-run history (written by the scheduler when it is installed): per job and queue,
-- the last run, the last success and the failures over the last :failure_window_s.
WITH ranked AS (
    SELECT r.job, r.queue, r.started_at, r.finished_at, r.rows, r.outcome, r.error,
           row_number() OVER (PARTITION BY r.job, r.queue ORDER BY r.started_at DESC) AS rn
    FROM {{job_runs}} r
    WHERE r.started_at >= now() - make_interval(secs => :lookback_s)
)
SELECT last.job, last.queue, last.started_at, last.finished_at, last.rows, last.outcome,
       left(last.error, 300) AS error,
       extract(epoch FROM last.finished_at - last.started_at)::float8 AS duration_s,
       (SELECT max(s.started_at) FROM ranked s
         WHERE s.job = last.job AND s.queue IS NOT DISTINCT FROM last.queue
           AND s.outcome = ANY (CAST(:success AS text[])))       AS last_success_at,
       (SELECT count(*) FROM ranked f
         WHERE f.job = last.job AND f.queue IS NOT DISTINCT FROM last.queue
           AND f.started_at >= now() - make_interval(secs => :failure_window_s)
           AND f.finished_at IS NOT NULL
           AND NOT (f.outcome = ANY (CAST(:not_failure AS text[])))) AS failures
FROM ranked last
WHERE last.rn = 1
ORDER BY last.job, last.queue NULLS FIRST

-- name: queue_items
-- Destructive kinds (heap, fifo, stack, watermark): every row in the items table is waiting;
-- dequeued rows are gone, so completions are not visible here (no rates but enqueues).
SELECT count(*) AS ready, 0 AS scheduled,
       extract(epoch FROM now() - min(enqueued_at))::float8 AS oldest_ready_age_s,
       count(*) FILTER (WHERE enqueued_at >= now() - make_interval(secs => :window_s)) AS enqueued_in_window
FROM {{items}}

-- name: queue_pending
-- Pending kind: items not yet due are scheduled; the oldest due item's age counts from its
-- due time (it could not be taken earlier).
SELECT count(*) FILTER (WHERE due_at <= now()) AS ready,
       count(*) FILTER (WHERE due_at > now())  AS scheduled,
       extract(epoch FROM now() - min(due_at) FILTER (WHERE due_at <= now()))::float8 AS oldest_ready_age_s,
       count(*) FILTER (WHERE enqueued_at >= now() - make_interval(secs => :window_s)) AS enqueued_in_window
FROM {{items}}

-- name: watermark_lag
-- Rows between the stored watermark (the hint new sessions start from) and the oldest
-- item still waiting: ghosts a new session walks before its first find. Negative means the
-- stored watermark is above a waiting item, which the correction job must fix (such items
-- are skipped by sessions starting from the hint).
SELECT w.low, (SELECT min(id) FROM {{items}}) AS head,
       (SELECT min(id) FROM {{items}}) - w.low AS lag
FROM {{watermark}} w

-- name: queue_ring
-- Ring kind: FULL slots are waiting messages; fill is FULL slots over all slots.
SELECT count(*) FILTER (WHERE state = 1) AS ready, 0 AS scheduled, count(*) AS slots,
       extract(epoch FROM now() - min(pushed_at) FILTER (WHERE state = 1))::float8 AS oldest_ready_age_s,
       count(*) FILTER (WHERE state = 1 AND pushed_at >= now() - make_interval(secs => :window_s)) AS enqueued_in_window
FROM {{ring}}

-- name: queue_rotation
-- A reliable queue's generations (reliable_0012): the ids drawn since the last switch (the
-- rotator keeps this near its rotate_items; it grows when no archive job runs, or when a
-- sealed generation cannot be emptied), and the oldest sealed generation still waiting to
-- be emptied (NULL: none waits).
SELECT s.last_id - s.start_id AS lag, CASE WHEN s.emptied < s.sealed THEN s.emptied + 1 END AS waiting_epoch
FROM {{fn_rot_state}}() s

-- name: rotation_stranded
-- The items stranded in a sealed generation still waiting to be emptied (slot :slot):
-- expired leases and due READY rows the seal passed over. No claim looks for them in a
-- sealed slot; the archive job's truncate moves them forward. How long the oldest has been
-- due: seconds since its lease expired, or since its due time. Through the parent (only
-- the slot's partition is read, the others pruned before the scan; the role needs SELECT
-- on the parent only) and the slot's ready and leased indexes.
SELECT count(*) AS stranded,
       extract(epoch FROM now() - min(CASE WHEN m.status = 1 THEN m.leased_until ELSE m.due_at END))::float8
           AS stranded_age_s
FROM {{meta}} m
WHERE m.slot = CAST(:slot AS smallint)
  AND ((m.status = 0 AND m.due_at <= now()) OR (m.status = 1 AND m.leased_until < now()))

-- name: rotation_blockers
-- Sessions holding a lock on the given tables (text[] of qualified names: the slot tables of
-- a generation waiting to be emptied), in a transaction older than :min_age_s: what keeps
-- its TRUNCATE waiting. A session that read the queue inside a long transaction (pg_dump, a
-- report) holds ACCESS SHARE until it ends. Oldest transaction first.
SELECT DISTINCT l.pid, a.usename::text AS usename, a.application_name, a.state, l.mode,
       extract(epoch FROM now() - a.xact_start)::float8 AS xact_age_s
FROM unnest(CAST(:tables AS text[])) AS t(name)
JOIN pg_locks l ON l.locktype = 'relation' AND l.relation = to_regclass(t.name) AND l.granted
JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.pid <> pg_backend_pid() AND a.xact_start < now() - make_interval(secs => :min_age_s)
ORDER BY xact_age_s DESC

