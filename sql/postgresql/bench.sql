-- Statements `queuectl bench` runs besides the queues' own SQL API (the lab probes' own are
-- in bench/lab/sql/probes.sql, which the package does not install).

-- name: touch_items
-- Read one row of a destructive queue's table: inside a REPEATABLE READ transaction this
-- takes the snapshot for real (a BEGIN alone takes none), which then keeps every row
-- deleted after it from being cleaned up until the transaction ends.
SELECT count(*) AS n FROM (SELECT 1 FROM {{items}} LIMIT 1) AS one

-- name: vacuum_items
-- Start each run from a clean table: no dead rows, fresh statistics and visibility map.
VACUUM (ANALYZE) {{items}}

-- name: table_blocks
-- Buffer accesses (hits and reads, heap and indexes) on a destructive queue's table so
-- far: a measure of the work dequeues did that CPU contention from other programs does
-- not blur. Counters reach this view when a backend flushes them (at the latest when it
-- exits), so callers read until the value settles.
SELECT coalesce(heap_blks_hit, 0) + coalesce(heap_blks_read, 0)
     + coalesce(idx_blks_hit, 0) + coalesce(idx_blks_read, 0) AS blocks
FROM pg_statio_user_tables WHERE relid = {{items_regclass}}::regclass

-- name: backend_pid
-- The server process of this session (its CPU time is read from /proc when local).
SELECT pg_backend_pid() AS pid

-- SQL used only by `queuectl bench` (queuectl.bench): server facts, the ceiling
-- workloads, the pgbench scripts that drive a queue's own SQL API without Python, and a
-- one-table queue design used as the baseline of the `split` scenario.
--
-- Sections are filled by queuectl.sqlfiles.render() with quoted identifiers only. Words
-- written :like_this inside pgbench_* sections are pgbench variables (pgbench -D).

-- name: server_settings
-- The settings a reader needs to judge a benchmark figure.
SELECT name, setting, coalesce(unit, '') AS unit
FROM pg_settings
WHERE name = ANY (CAST(:names AS text[]))
ORDER BY name

-- name: create_commit_table
-- The single-row commit ceiling writes here: one narrow row per transaction.
CREATE TABLE IF NOT EXISTS {{commit_table}} (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    v  integer NOT NULL
)

-- name: drop_commit_table
DROP TABLE IF EXISTS {{commit_table}}

-- name: pgbench_select1
-- Ceiling: one round trip, no work.
SELECT 1;

-- name: pgbench_commit
-- Ceiling: one single-row insert per transaction (autocommit), i.e. one WAL flush each.
INSERT INTO {{commit_table}} (v) VALUES (1);

-- name: pgbench_reliable_enqueue_one
-- The Python client's `enqueue` call with its default arguments.
SELECT {{fn_enqueue}}(CAST(:payload AS bytea), CAST(NULL AS jsonb), CAST(0 AS smallint),
                      make_interval(secs => 0), NULL, CAST(NULL AS integer)) AS id;

-- name: pgbench_reliable_enqueue_many
-- The Python client's `enqueue_many` call with its default arguments (arrays of defaults
-- are sent as NULL).
SELECT id FROM {{fn_enqueue_many}}(CAST(:payloads AS bytea[]), CAST(NULL AS jsonb[]),
                                   CAST(NULL AS smallint[]), CAST(NULL AS interval[]),
                                   CAST(NULL AS text[]), CAST(NULL AS integer)) AS id;

-- name: pgbench_reliable_consume
-- The Python client's `dequeue` then `ack` calls; array_agg folds the claimed ids into one
-- pgbench variable (an empty queue gives an empty array, and ack of nothing is a no-op).
SELECT coalesce(array_agg(q.id), '{}') AS ids FROM {{fn_dequeue}}(:batch, NULL, :worker) AS q
\gset
SELECT {{fn_ack}}(CAST(:ids AS bigint[]), :worker) AS acked;

-- name: pgbench_reliable_ack_dequeue
-- The consumer loop of `--kind reliable_adq`: ack the previous claim and claim the next in
-- one call (reliable_0004). :ids starts as '{}' (-D) and then holds this client's last claim.
SELECT coalesce(array_agg(q.id), '{}') AS ids
FROM {{fn_ack_dequeue}}(CAST(:ids AS bigint[]), :batch, NULL, :worker) AS q
\gset

-- name: reliable_reset
-- Empty the queue between benchmark phases (bench queues only).
TRUNCATE {{data}}, {{meta}}

-- name: reliable_reset_rotation
-- After reliable_reset, on a queue at reliable_0012 or later with no archive job running:
-- every slot is empty, so every epoch before the current one is marked sealed and emptied
-- and the next switch counts ids from here. Each phase then starts as a fresh queue does
-- (its claims on one slot's tables), whatever state the archive job of the phase before
-- left the rotation in.
SELECT setval({{rot_sealed_regclass}}, e.last_value - 1, true),
       setval({{rot_emptied_regclass}}, e.last_value - 1, true),
       setval({{rot_start_regclass}}, (SELECT s.last_value FROM {{meta_seq}} s), true)
FROM {{rot_epoch}} e

-- name: reliable_analyze
-- The same after-fill step as onetable_analyze, for both tables of the split.
VACUUM (ANALYZE) {{meta}}, {{data}}

-- name: items_analyze
-- The same after-fill step for the items table of a one-table kind (heap, fifo, stack,
-- pending, watermark), as the lab's autovacuum probe (bench/lab/autovacuum.py) fills it.
VACUUM (ANALYZE) {{items}}

-- name: reliable_ready
-- Items waiting.
SELECT count(*) FROM {{meta}} WHERE status = 0

-- name: reliable_consumed
-- Acknowledged items and the server-side span from the first claim to the last ack:
-- a drain rate that does not depend on when a client noticed the queue was empty.
SELECT count(*) AS n,
       extract(epoch FROM max(finished_at) - min(dequeued_at)) AS seconds
FROM {{meta}} WHERE status = 2

-- name: table_stats
-- Churn and HOT updates per table since the statistics were last reset; a partitioned table
-- (a reliable queue's meta and data since reliable_0012) is the sum of its partitions.
SELECT t.name AS relname, sum(s.n_tup_ins)::bigint AS n_tup_ins, sum(s.n_tup_upd)::bigint AS n_tup_upd,
       sum(s.n_tup_hot_upd)::bigint AS n_tup_hot_upd, sum(s.n_tup_del)::bigint AS n_tup_del,
       sum(s.n_dead_tup)::bigint AS n_dead_tup, sum(s.n_live_tup)::bigint AS n_live_tup,
       sum(pg_total_relation_size(s.relid))::bigint AS total_bytes
FROM unnest(CAST(:tables AS text[])) AS t(name)
JOIN pg_class c ON c.relname = t.name AND c.relnamespace = CAST(:schema AS regnamespace)
JOIN LATERAL (SELECT p.relid FROM pg_partition_tree(c.oid) p WHERE p.isleaf
              UNION SELECT c.oid WHERE c.relkind = 'r') leaf ON true
JOIN pg_stat_user_tables s ON s.relid = leaf.relid
GROUP BY t.name
ORDER BY t.name

-- name: pgss_installed
SELECT count(*) FROM pg_extension WHERE extname = 'pg_stat_statements'

-- name: pgss_create
-- Needs the library preloaded (the embedded server does) and a privileged role.
CREATE EXTENSION IF NOT EXISTS pg_stat_statements

-- name: pgss_reset
SELECT pg_stat_statements_reset()

-- name: pgss_calls
-- Calls, rows and buffers of the top-level statements whose text names :pattern. The
-- buffers of a SQL function include those of the statements it runs.
SELECT calls, rows, shared_blks_hit, shared_blks_read, shared_blks_dirtied,
       shared_blks_written, total_exec_time, wal_bytes
FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND toplevel AND query LIKE :pattern

-- name: onetable_create
-- Baseline for the `split` scenario: the reliable queue's columns and payload in ONE
-- table, with the same constraints, indexes, storage parameters (fillfactor and
-- reliable_0007's autovacuum settings for the meta table), dequeue and ack as reliable.sql.
-- Any index the split has and this baseline lacks would make every split ack pay an index
-- insert the baseline does not: tests/test_bench.py compares the two tables' definitions.
-- The schema may not exist yet on a fresh server: this design is installed first, and
-- only the reliable queue's install (a migration) creates it.
CREATE SCHEMA IF NOT EXISTS {{schema}};

CREATE TABLE {{meta}} (
    id            bigint GENERATED ALWAYS AS IDENTITY (SEQUENCE NAME {{meta_seq}}) PRIMARY KEY,
    priority      smallint    NOT NULL DEFAULT 0,
    due_at        timestamptz NOT NULL DEFAULT now(),
    status        smallint    NOT NULL DEFAULT 0 CHECK (status BETWEEN 0 AND 3),
    title         text,
    attempts      integer     NOT NULL DEFAULT 0,
    max_attempts  integer     NOT NULL DEFAULT 5 CHECK (max_attempts > 0),
    lease_owner   text,
    leased_until  timestamptz,
    enqueued_at   timestamptz NOT NULL DEFAULT now(),
    dequeued_at   timestamptz,
    finished_at   timestamptz,
    last_error    text,
    payload       bytea NOT NULL,
    headers       jsonb
) WITH (
    fillfactor = 80,
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0,
    autovacuum_vacuum_insert_threshold = 1000,
    autovacuum_vacuum_cost_delay = 0
);

CREATE INDEX {{ready_idx}} ON {{meta}} (priority, due_at, id) WHERE status = 0;
CREATE INDEX {{leased_idx}} ON {{meta}} (leased_until) WHERE status = 1;
CREATE INDEX {{finished_idx}} ON {{meta}} (status, finished_at) WHERE status >= 2;

CREATE FUNCTION {{fn_enqueue_many}}(p_payloads bytea[]) RETURNS SETOF bigint
LANGUAGE sql AS $fn$
    INSERT INTO {{meta}} (payload) SELECT u.p FROM unnest(p_payloads) AS u(p) RETURNING id
$fn$;

-- The reliable dequeue (reliable.sql create_dequeue_0008) on one table: expired leases,
-- then READY rows, both picked in MATERIALIZED CTEs with SKIP LOCKED, one UPDATE ...
-- RETURNING of the picked ids found through the primary key, with the same SET list
-- (dead letter on an expired last attempt) and the same eleven columns back; the payload
-- comes from the updated row itself instead of a read of the data table. ack is the
-- reliable ack (reliable.sql create_lease_functions_0009: its lease check written
-- `m.status::integer = 1`, so only the primary key finds its rows). Both carry reliable_0008's plan guard (reliable.sql set_plan_guard), so
-- neither design is charged for it alone.
CREATE FUNCTION {{fn_dequeue}}(p_batch integer, p_lease_seconds double precision, p_worker text)
RETURNS TABLE (
    id bigint, priority smallint, due_at timestamptz, title text, attempts integer,
    max_attempts integer, enqueued_at timestamptz, dequeued_at timestamptz,
    leased_until timestamptz, payload bytea, headers jsonb
)
LANGUAGE plpgsql SET enable_seqscan = off SET jit = off AS $fn$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH expired AS MATERIALIZED (
        SELECT m.id FROM {{meta}} m
        WHERE m.status = 1 AND m.leased_until < now()
        ORDER BY m.leased_until
        LIMIT greatest(p_batch, 0)
        FOR UPDATE SKIP LOCKED
    ), ready AS MATERIALIZED (
        SELECT m.id FROM {{meta}} m
        WHERE m.status = 0 AND m.due_at <= now()
        ORDER BY m.priority, m.due_at, m.id
        LIMIT greatest(p_batch - (SELECT count(*) FROM expired), 0)
        FOR UPDATE SKIP LOCKED
    ), claimed AS (
        UPDATE {{meta}} m SET
            status       = CASE WHEN m.status = 1 AND m.attempts >= m.max_attempts THEN 3 ELSE 1 END,
            attempts     = CASE WHEN m.status = 1 AND m.attempts >= m.max_attempts THEN m.attempts
                                ELSE m.attempts + 1 END,
            lease_owner  = CASE WHEN m.status = 1 AND m.attempts >= m.max_attempts THEN m.lease_owner
                                ELSE p_worker END,
            leased_until = CASE WHEN m.status = 1 AND m.attempts >= m.max_attempts THEN NULL
                                ELSE now() + make_interval(secs => coalesce(p_lease_seconds, 30)) END,
            dequeued_at  = CASE WHEN m.status = 1 AND m.attempts >= m.max_attempts THEN m.dequeued_at
                                ELSE now() END,
            finished_at  = CASE WHEN m.status = 1 AND m.attempts >= m.max_attempts THEN now() END,
            last_error   = CASE WHEN m.status = 1 AND m.attempts >= m.max_attempts
                                THEN 'lease expired on its last attempt (' || m.attempts || ' of '
                                     || m.max_attempts || ')'
                                ELSE m.last_error END
        WHERE m.id = ANY (ARRAY(SELECT e.id FROM expired e UNION ALL SELECT r.id FROM ready r))
        RETURNING m.id, m.priority, m.due_at, m.title, m.attempts, m.max_attempts,
                  m.enqueued_at, m.dequeued_at, m.leased_until, m.payload, m.headers, m.status
    )
    SELECT c.id, c.priority, c.due_at, c.title, c.attempts, c.max_attempts, c.enqueued_at,
           c.dequeued_at, c.leased_until, c.payload, c.headers
    FROM claimed c
    WHERE c.status = 1
    ORDER BY c.priority, c.due_at, c.id;
END
$fn$;

CREATE FUNCTION {{fn_ack}}(p_ids bigint[], p_worker text) RETURNS integer
LANGUAGE plpgsql SET enable_seqscan = off SET jit = off AS $fn$
DECLARE
    v_count integer;
BEGIN
    UPDATE {{meta}} m
    SET status = 2, finished_at = now(), leased_until = NULL
    WHERE m.id = ANY (p_ids) AND m.status::integer = 1
      AND (p_worker IS NULL OR m.lease_owner = p_worker);
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END
$fn$;

-- name: onetable_drop
DROP FUNCTION IF EXISTS {{fn_ack}}(bigint[], text);
DROP FUNCTION IF EXISTS {{fn_dequeue}}(integer, double precision, text);
DROP FUNCTION IF EXISTS {{fn_enqueue_many}}(bytea[]);
DROP TABLE IF EXISTS {{meta}};

-- name: onetable_enqueue_many
SELECT id FROM {{fn_enqueue_many}}(CAST(:payloads AS bytea[])) AS id

-- name: onetable_dequeue
SELECT * FROM {{fn_dequeue}}(:batch, :lease_seconds, :worker)

-- name: onetable_ack
SELECT {{fn_ack}}(CAST(:ids AS bigint[]), :worker) AS acked

-- name: pgbench_onetable_enqueue_many
SELECT id FROM {{fn_enqueue_many}}(CAST(:payloads AS bytea[])) AS id;

-- name: pgbench_onetable_consume
-- The one-table session's `dequeue` then `ack` calls (pgbench_reliable_consume's twin).
SELECT coalesce(array_agg(q.id), '{}') AS ids FROM {{fn_dequeue}}(:batch, NULL, :worker) AS q
\gset
SELECT {{fn_ack}}(CAST(:ids AS bigint[]), :worker) AS acked;

-- name: onetable_reset
TRUNCATE {{meta}}

-- name: onetable_analyze
-- After the `split` pre-fill: start every design and size from statistics and a set
-- visibility map, as a live queue's tables are. Left to autovacuum, the first ANALYZE of
-- a fresh table lands in whichever phase is running when its naptime ends, and the
-- dequeue's plan could change mid-phase (before reliable_0005 the estimate of the picked
-- rows went from a handful to a tenth of the table, and the UPDATE's join to a hash join
-- over the whole table).
VACUUM (ANALYZE) {{meta}}

-- name: onetable_ready
SELECT count(*) FROM {{meta}} WHERE status = 0

-- name: onetable_consumed
SELECT count(*) AS n,
       extract(epoch FROM max(finished_at) - min(dequeued_at)) AS seconds
FROM {{meta}} WHERE status = 2

-- name: lean_create
-- The `ring` scenario's one-table queue, the common hand-written design ("one table:
-- SELECT ... FOR UPDATE SKIP LOCKED, UPDATE, DELETE"), lean: a row per message with its status and
-- lease, the pick and the claim in one statement, a DELETE at ack. Only what that design
-- needs: no priority, due time, attempts or dead letters (the reliable dequeue on one
-- table, onetable_create above, carries those and runs at about half this rate).
CREATE SCHEMA IF NOT EXISTS {{schema}};

CREATE TABLE {{meta}} (
    id           bigint GENERATED ALWAYS AS IDENTITY (SEQUENCE NAME {{meta_seq}}) PRIMARY KEY,
    status       smallint    NOT NULL DEFAULT 0,
    lease_owner  text,
    leased_until timestamptz,
    enqueued_at  timestamptz NOT NULL DEFAULT now(),
    payload      bytea       NOT NULL
) WITH (fillfactor = 80);

CREATE INDEX {{ready_idx}} ON {{meta}} (id) WHERE status = 0;

-- name: lean_drop
DROP TABLE IF EXISTS {{meta}};

-- name: lean_enqueue_many
INSERT INTO {{meta}} (payload) SELECT u.p FROM unnest(CAST(:payloads AS bytea[])) AS u(p) RETURNING id

-- name: lean_dequeue
WITH picked AS (
    SELECT m.id FROM {{meta}} m WHERE m.status = 0 ORDER BY m.id LIMIT :batch FOR UPDATE SKIP LOCKED
)
UPDATE {{meta}} m
SET status = 1, lease_owner = :worker, leased_until = now() + make_interval(secs => :lease_seconds)
FROM picked WHERE m.id = picked.id
RETURNING m.id, m.payload

-- name: lean_ack
DELETE FROM {{meta}} m WHERE m.id = ANY (CAST(:ids AS bigint[])) AND m.status = 1 AND m.lease_owner = :worker

-- name: lean_ready
SELECT count(*) FROM {{meta}} WHERE status = 0

-- name: create_database
-- A private database for the peers' tables (scenario `peers`).
CREATE DATABASE {{database}}

-- name: drop_database
DROP DATABASE IF EXISTS {{database}} WITH (FORCE)

-- name: soak_table
-- One soak sample of a queue's table: its sizes (total: heap, indexes and TOAST) and its
-- row churn so far, HOT updates among the updates (`queuectl bench --scenario ring --soak`).
SELECT pg_total_relation_size(s.relid) AS total_bytes, pg_relation_size(s.relid) AS heap_bytes,
       s.n_tup_ins, s.n_tup_upd, s.n_tup_hot_upd, s.n_tup_del, s.n_dead_tup
FROM pg_stat_user_tables s
WHERE s.relid = CAST(:table AS regclass)

-- name: soak_indexes
-- The size of each index of the sampled table.
SELECT CAST(i.indexrelid AS regclass)::text AS index_name, pg_relation_size(i.indexrelid) AS bytes
FROM pg_index i
WHERE i.indrelid = CAST(:table AS regclass)
ORDER BY 1

-- name: ring_pops
-- Positions handed out to pops so far: the ring has gone round once when this reaches its size.
SELECT CASE WHEN s.is_called THEN s.last_value + 1 ELSE s.last_value END AS pops FROM {{pop_seq}} s

-- name: sustained_tables
-- One sample of all of a queue's tables (`queuectl bench --scenario sustained`): dead row
-- versions not yet removed, total size (heap, indexes, TOAST) and autovacuum runs so far.
-- :tables are every table name the queue's kind may own; those that do not exist are
-- simply not in the view.
SELECT coalesce(sum(s.n_dead_tup), 0) AS dead_rows,
       coalesce(sum(pg_total_relation_size(s.relid)), 0) AS total_bytes,
       coalesce(sum(s.autovacuum_count), 0) AS autovacuum_runs
FROM pg_stat_user_tables s
WHERE s.schemaname = :schema AND s.relname = ANY (CAST(:tables AS text[]))

-- name: cost_fill
-- Enqueue :rows messages through the queue's own enqueue_many in one call (`queuectl bench
-- --scenario cost`): the payloads are taken in turn from :pool, a few dozen payloads sent
-- once per call, so a multi-million-row backlog is written by the server from one array
-- per chunk instead of crossing the network row by row. Every other argument is left to
-- the function's defaults, so this works on whatever tables the kind keeps.
SELECT count(*) AS n
FROM {{fn_enqueue_many}}(ARRAY(
    SELECT (CAST(:pool AS bytea[]))[1 + (g % cardinality(CAST(:pool AS bytea[])))]
    FROM generate_series(1, CAST(:rows AS bigint)) AS g
)) AS id

-- name: cost_vacuum
-- Before every claim+ack of `queuectl bench --scenario cost`: no dead rows, fresh statistics
-- and visibility map, and (INDEX_CLEANUP ON) no dead index entries either. A plain VACUUM
-- skips the indexes while fewer than 2 in 100 of the table's pages hold dead rows (PostgreSQL 14+),
-- which the 10,000 messages claimed from a backlog of millions never reach: the next claims
-- would walk the killed entries left at the head of the ready index (+5 shared buffers per
-- message at 1M ready with 10,000 left, measured), while a small backlog's are always removed.
VACUUM (ANALYZE, INDEX_CLEANUP ON) {{table}}

-- name: queue_tables
-- Which of :tables (every table name the queue's kind may own) exist in :schema.
SELECT s.relname FROM pg_stat_user_tables s
WHERE s.schemaname = :schema AND s.relname = ANY (CAST(:tables AS text[]))
ORDER BY s.relname

-- name: bystander_create
-- The sustained scenario's bystander: a table of ordinary rows in its own schema, unrelated
-- to any queue, whose range query is timed while the queues run. Its primary key is built
-- once the rows are in (bystander_fill), which is quicker than row by row.
CREATE SCHEMA IF NOT EXISTS {{bystander_schema}};

CREATE TABLE IF NOT EXISTS {{bystander}} (
    id      bigint NOT NULL,
    account bigint NOT NULL,
    amount  bigint NOT NULL
)

-- name: bystander_drop
DROP TABLE IF EXISTS {{bystander}}

-- name: bystander_rows
-- Rows the bystander holds.
SELECT count(*) FROM {{bystander}}

-- name: bystander_fill
-- Rows 1 to :rows of the bystander, then its primary key.
INSERT INTO {{bystander}} (id, account, amount)
SELECT g, g % 5000, g % 1000 FROM generate_series(1, CAST(:rows AS bigint)) AS g;

ALTER TABLE {{bystander}} ADD PRIMARY KEY (id)

-- name: bystander_analyze
-- Statistics and visibility map for the freshly filled bystander, as a live table has.
VACUUM (ANALYZE) {{bystander}}

-- name: bystander_query
-- The timed bystander query: a sum over a range of the primary key, as a report would read.
SELECT sum(amount) FROM {{bystander}} WHERE id BETWEEN :low AND :low + 9999

-- name: hold_snapshot
-- In a REPEATABLE READ transaction, read a table unrelated to the queues: the snapshot is
-- taken (a BEGIN alone takes none) and kept to the transaction's end, while no lock is
-- held on any queue table.
SELECT count(*) FROM (SELECT 1 FROM {{bystander}} LIMIT 1) AS one

-- name: hold_xid
-- The other common holder: a transaction that was given an id and then sits idle.
SELECT txid_current()

-- name: holder_horizon
-- What a session holds back: its snapshot's xmin, else its own transaction id, and how
-- many transactions old that is now.
SELECT CAST(coalesce(backend_xmin, backend_xid) AS text) AS horizon,
       age(coalesce(backend_xmin, backend_xid)) AS age
FROM pg_stat_activity WHERE pid = :pid

-- name: next_xid
-- The next transaction id to be given out (assigns none itself).
SELECT CAST(pg_snapshot_xmax(pg_current_snapshot()) AS text)

-- name: pgq_setup
-- PgQ, a peer of `queuectl bench --scenario sustained` (Debian's postgresql-15-pgq3): its
-- extension, one queue and one registered consumer, with the packaged defaults (3 event
-- tables rotated every 2 hours, a tick at 500 events or 3 s of lag, ticks made by pgqd).
CREATE EXTENSION IF NOT EXISTS pgq;
SELECT pgq.create_queue(:queue);
SELECT pgq.register_consumer(:queue, :consumer)

-- name: pgq_available
-- Whether this server has the PgQ extension's files.
SELECT count(*) FROM pg_available_extensions WHERE name = 'pgq'

-- name: pgq_drop
-- The peer's queue, its consumers and its event tables (the extension stays).
SELECT pgq.drop_queue(:queue, true)

-- name: pgq_enqueue
-- A producer's batch in one statement: one pgq.insert_event per message, the call PgQ's
-- Python client (pgq.insert_event) sends per event.
SELECT count(pgq.insert_event(:queue, 'bench', d)) FROM unnest(CAST(:data AS text[])) AS d

-- name: pgq_next_batch
-- The consumer's next batch (NULL: no tick since its last one), as pgq.Consumer asks for it.
SELECT pgq.next_batch(:queue, :consumer)

-- name: pgq_batch_events
SELECT ev_data FROM pgq.get_batch_events(:batch)

-- name: pgq_finish_batch
SELECT pgq.finish_batch(:batch)

-- name: pgq_tables
-- The queue's event tables (the parent first, then its rotated children) by name, in schema
-- pgq, and the tables PgQ updates per tick and batch.
SELECT array_cat(
           ARRAY(SELECT split_part(q.queue_data_pfx, '.', 2) || s
                 FROM unnest(ARRAY(SELECT '' UNION ALL SELECT '_' || g
                                   FROM generate_series(0, q.queue_ntables - 1) AS g)) AS s
                 ORDER BY s),
           ARRAY['tick', 'subscription', 'queue', 'consumer', 'retry_queue'])
FROM pgq.queue AS q WHERE q.queue_name = :queue

-- name: pgq_pending
-- Events the consumer has not finished, as PgQ counts them for its own status (a sample of
-- the backlog): those of ticks after its last finished batch (pending_events) and those no
-- tick covers yet (ev_new). Both are differences of the event sequence, so an insert in
-- flight while a tick is taken is counted in the wrong batch: pgq_left is the exact count.
SELECT coalesce(c.pending_events, 0) + coalesce(q.ev_new, 0)
FROM pgq.get_consumer_info(:queue, :consumer) AS c, pgq.get_queue_info(:queue) AS q

-- name: pgq_left
-- Events the consumer has not finished, exactly (the ledger at the end of a run): those whose
-- transaction the snapshot of its last finished tick does not see. {{pgq_events}} is the
-- queue's parent event table (its rotated children inherit from it).
SELECT count(*) FROM {{pgq_events}} AS e
WHERE NOT txid_visible_in_snapshot(e.ev_txid, (
    SELECT t.tick_snapshot
    FROM pgq.subscription AS s
    JOIN pgq.queue AS q ON q.queue_id = s.sub_queue
    JOIN pgq.consumer AS c ON c.co_id = s.sub_consumer
    JOIN pgq.tick AS t ON t.tick_queue = s.sub_queue AND t.tick_id = s.sub_last_tick
    WHERE q.queue_name = :queue AND c.co_name = :consumer))

-- name: pgqueuer_schema
-- PgQueuer, a peer of `queuectl bench --scenario sustained`, installs into its own schema
-- (the first on its connections' search_path), dropped with everything in it afterwards.
CREATE SCHEMA {{schema}}

-- name: pgqueuer_drop
DROP SCHEMA IF EXISTS {{schema}} CASCADE

-- name: pgqueuer_waiting
-- Jobs not yet picked.
SELECT count(*) FROM {{schema}}.pgqueuer WHERE status = 'queued'

-- name: pgqueuer_left
-- Jobs still in PgQueuer's queue table: waiting, or picked and not yet completed (it
-- deletes a job once its completion is written, in buffered batches).
SELECT count(*) FROM {{schema}}.pgqueuer

-- name: pgboss_drop
-- pg-boss, a peer of `queuectl bench --scenario sustained`: its own schema (made by its
-- start(), named for the bench so no application's pg-boss schema is touched), dropped with
-- everything in it.
DROP SCHEMA IF EXISTS {{schema}} CASCADE

-- name: pgboss_tables
-- The tables pg-boss keeps in its schema (its job tables, the default partition job_common
-- among them, and its bookkeeping: queue, queue_stats, version, ...); not the partitioned
-- parents, which hold no rows of their own.
SELECT coalesce(array_agg(c.relname ORDER BY c.relname), ARRAY[]::name[])
FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
WHERE n.nspname = :schema AND c.relkind = 'r'

-- name: pgboss_waiting
-- Jobs of the queue not yet fetched: created, or waiting for a retry.
SELECT count(*) FROM {{schema}}.job WHERE name = :queue AND state IN ('created', 'retry')

-- name: pgboss_left
-- Jobs of the queue not completed: waiting, or fetched and not yet completed (a completed
-- job stays in the table, state completed, until its deleteAfterSeconds have passed).
SELECT count(*) FROM {{schema}}.job WHERE name = :queue AND state IN ('created', 'retry', 'active')

-- name: pgboss_states
-- The queue's jobs by state, and how many ran more than once (retry_count > 0).
SELECT CAST(state AS text) AS state, count(*) AS jobs, count(*) FILTER (WHERE retry_count > 0) AS retried
FROM {{schema}}.job WHERE name = :queue GROUP BY state

-- name: sessions_by_name
-- The server pids of this database's sessions named :names (application_name), for a probe
-- that reads their CPU from /proc (bench/lab/archive_load.py).
SELECT pid, application_name FROM pg_stat_activity
WHERE datname = current_database() AND application_name = ANY (CAST(:names AS text[]))

-- name: seats_create
-- bench/lab/seats.py: the "seat" consumer protocol, created by the probe on its bench queue
-- (a prototype, not a migration). A seat is a session-level exclusive advisory lock per queue
-- (class 1902343283 'qcts' + p_seat, the queue's channel key): its holder is the only consumer
-- registered in "waiting" (activation.sql) and the only one that LISTENs, so a NOTIFY
-- signals one session; the others wait for the seat blocked in the lock manager (no CPU),
-- and a release wakes exactly the next waiter. One CALL per step, on the consumer's one
-- autocommit connection. p_mode:
--   0  look first (the last take was a full batch); nothing found: queue for the seat;
--   1  queue for the seat (blocking, at most p_wait_ms); seated: LISTEN, commit (a LISTEN
--      takes effect at commit, and a notification committed before it is skipped: the
--      registration must come after it), register, probe "in flight", look;
--   2  seated, registered, armed (a probe after the registration was clear): look;
--   3  seated, registered, not armed: probe "in flight", look;
--   4  seated, not registered (a producer's probe held "waiting" at that instant, or seated
--      and LISTENing by the caller's own statements: seats_line_call): register, probe, look;
--   6  look first only; nothing found: o_state 'empty' (the caller queues by itself).
-- With p_deck, at most one consumer waits for the seat: it holds the deck (class
-- 1902343383 'qcts' + 100 + p_seat) while it waits; one that finds the deck taken returns
-- 'full' and sleeps its poll back-off instead (a short line of the consumers that went idle
-- last, the others out of the rotation).
-- Work found while seated: unregister, UNLISTEN and give the seat up in the same call; with
-- p_keep, when registered and no other READY row is left, keep all three ('kept', or
-- 'kept_soon' when not armed: as 'soon'): the holder comes back to its socket after the
-- batch, and the others stay in line.
-- o_state: 'work' (o_ids, o_payloads), 'line' (no seat within p_wait_ms: call mode 1
-- again), 'listen' (seated and armed: sleep on the socket), 'soon' (an enqueue that may
-- have missed the registration is open: mode 3 shortly), 'unreg' (mode 4 shortly).
CREATE OR REPLACE PROCEDURE {{seat_proc}}(
    p_batch integer, p_lease double precision, p_worker text, p_mode integer, p_seat integer, p_wait_ms integer,
    p_keep boolean, p_deck boolean, INOUT o_state text DEFAULT NULL, INOUT o_ids bigint[] DEFAULT NULL, INOUT o_payloads bytea[] DEFAULT NULL)
LANGUAGE plpgsql AS $fn$
DECLARE
    v_key integer := hashtext({{channel_literal}}) & 2147483647;
    v_seat integer := 1902343283 + p_seat;
    v_reg boolean := p_mode IN (2, 3);
    v_clear boolean := p_mode = 2;
    v_lock_timeout text := current_setting('lock_timeout');
BEGIN
    IF p_mode IN (0, 6) THEN
        SELECT array_agg(d.id), array_agg(d.payload) INTO o_ids, o_payloads
        FROM {{fn_dequeue}}(p_batch, p_lease, p_worker) d;
        IF o_ids IS NOT NULL THEN
            o_state := 'work';
            RETURN;
        END IF;
        -- An empty claim may still hold row locks: READ COMMITTED locks the newest version
        -- of a row another claim took meanwhile, then finds it no longer READY and skips
        -- it, locked until this transaction ends. The seat holder's claim waits for such
        -- a lock; waiting for the seat with it held is a deadlock.
        IF p_mode = 6 THEN
            o_state := 'empty';
            RETURN;
        END IF;
        COMMIT;
    END IF;
    IF p_mode <= 1 THEN
        IF p_deck AND NOT pg_try_advisory_lock(v_seat + 100, v_key) THEN
            o_state := 'full';  -- someone waits for the seat already: sleep instead of queuing
            RETURN;
        END IF;
        PERFORM set_config('lock_timeout', p_wait_ms::text, true);  -- milliseconds
        BEGIN
            PERFORM pg_advisory_lock(v_seat, v_key);
        EXCEPTION WHEN lock_not_available THEN
            IF p_deck THEN
                PERFORM pg_advisory_unlock(v_seat + 100, v_key);
            END IF;
            o_state := 'line';
            RETURN;
        END;
        IF p_deck THEN
            PERFORM pg_advisory_unlock(v_seat + 100, v_key);  -- the next idle consumer waits on deck
        END IF;
        PERFORM set_config('lock_timeout', v_lock_timeout, true);
    END IF;
    IF p_mode IN (0, 1) THEN
        LISTEN {{channel}};
        COMMIT;
    END IF;
    IF NOT v_reg THEN
        v_reg := pg_try_advisory_lock_shared(1902347383, v_key);
    END IF;
    IF v_reg AND NOT v_clear AND pg_try_advisory_lock(1902343273, v_key) THEN
        PERFORM pg_advisory_unlock(1902343273, v_key);
        v_clear := true;
    END IF;
    SELECT array_agg(d.id), array_agg(d.payload) INTO o_ids, o_payloads
    FROM {{fn_dequeue}}(p_batch, p_lease, p_worker) d;
    IF o_ids IS NOT NULL AND p_keep AND v_reg
       AND NOT EXISTS (SELECT 1 FROM {{meta}} m WHERE m.status = 0 AND m.due_at <= now()) THEN
        -- nothing left for another consumer: stay seated, registered, listening
        o_state := CASE WHEN v_clear THEN 'kept' ELSE 'kept_soon' END;
        RETURN;
    END IF;
    IF o_ids IS NOT NULL THEN
        IF v_reg THEN
            PERFORM pg_advisory_unlock_shared(1902347383, v_key);
        END IF;
        UNLISTEN {{channel}};
        PERFORM pg_advisory_unlock(v_seat, v_key);
        o_state := 'work';
        RETURN;
    END IF;
    o_state := CASE WHEN NOT v_reg THEN 'unreg' WHEN v_clear THEN 'listen' ELSE 'soon' END;
END
$fn$;

-- The line of seats_line_call: an empty table whose lock the consumers queue for.
CREATE TABLE IF NOT EXISTS {{seat_line}} ();

-- name: seats_drop
DROP TABLE IF EXISTS {{seat_line}};
DROP PROCEDURE IF EXISTS {{seat_proc}}(integer, double precision, text, integer, integer, integer, boolean, boolean,
                                       text, bigint[], bytea[]);

-- name: seats_call
CALL {{seat_proc}}(%(batch)s, %(lease)s, %(worker)s, %(mode)s, %(seat)s, %(wait_ms)s, %(keep)s, %(deck)s)

-- name: seats_line_call
-- Queue for the seat without holding a snapshot (a variant of mode 1): a top-level LOCK
-- TABLE waits without one (once the session has the table in its caches: a first lookup
-- reads the catalog under a snapshot), where a wait inside a function or procedure holds
-- the statement's snapshot, and with it the xmin horizon, for as long as it waits. Only the head of the
-- line (the table lock's holder) waits for the seat itself, holding a snapshot for one
-- seat holder's tenure; its COMMIT lets the next one in, and commits its LISTEN before the
-- CALL registers (mode 4). One simple-query message (several statements, so no parameters:
-- the client merges the values; a CALL there runs in an implicit transaction block, where
-- a procedure may not COMMIT: mode 4 does not); a lock timeout fails it, and the client
-- then rolls back.
BEGIN; SET LOCAL lock_timeout = %(wait_ms)s; LOCK TABLE {{seat_line}} IN EXCLUSIVE MODE;
SELECT pg_advisory_lock(1902343283 + %(seat)s, hashtext({{channel_literal}}) & 2147483647);
LISTEN {{channel}}; COMMIT;
CALL {{seat_proc}}(%(batch)s, %(lease)s, %(worker)s, 4, %(seat)s, %(wait_ms)s, %(keep)s, false)

-- name: seats_sample
-- What the seats look like now: holders and waiters per seat class, and the oldest snapshot
-- a client backend holds (xids behind the next one).
SELECT (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid::bigint BETWEEN 1902343283 AND 1902343290
          AND granted) AS seated,
       (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid::bigint BETWEEN 1902343283 AND 1902343290
          AND NOT granted) AS in_line,
       (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid::bigint = 1902347383 AND granted)
          AS registered,
       (SELECT max(age(backend_xmin)) FROM pg_stat_activity WHERE backend_type = 'client backend'
          AND pid <> pg_backend_pid()) AS xmin_age
