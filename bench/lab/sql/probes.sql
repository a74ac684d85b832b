-- The lab probes' own statements (bench/lab/*.py), besides the product bench's
-- sql/postgresql/bench.sql and the queues' own SQL API. Read by lab_helpers.probe_sql().

-- name: autovacuum_sample
-- One sample of the given tables (text[] of qualified names) for the autovacuum probe
-- (autovacuum.py): reltuples (what autovacuum's scale factors multiply), estimated
-- live and dead rows, inserts since the last vacuum, updates and HOT updates, heap
-- (with TOAST) and index sizes, how often autovacuum and autoanalyze ran, and the same
-- for the table's TOAST table (large payloads churn there, vacuumed on its own trigger);
-- the storage parameters of both, so a report says which settings it measured.
-- A new transaction per sample: the statistics are cached for a transaction's duration.
-- A partitioned table (a reliable queue's meta and data since reliable_0012) is the sum of
-- its partitions, with the storage parameters of the first (they all hold the same).
SELECT t.name AS qualified, sum(c.reltuples)::float8 AS reltuples, sum(s.n_live_tup)::bigint AS n_live_tup,
       sum(s.n_dead_tup)::bigint AS n_dead_tup, sum(s.n_ins_since_vacuum)::bigint AS n_ins_since_vacuum,
       sum(s.n_tup_upd)::bigint AS n_tup_upd, sum(s.n_tup_hot_upd)::bigint AS n_tup_hot_upd,
       (array_agg(coalesce(c.reloptions, '{}')::text ORDER BY c.relname))[1]::text[] AS reloptions,
       (array_agg(coalesce((SELECT tc.reloptions FROM pg_class tc WHERE tc.oid = c.reltoastrelid), '{}')::text
                  ORDER BY c.relname))[1]::text[] AS toast_reloptions,
       sum(pg_table_size(s.relid))::bigint AS table_bytes, sum(pg_indexes_size(s.relid))::bigint AS index_bytes,
       sum(s.autovacuum_count)::bigint AS autovacuum_count, sum(s.autoanalyze_count)::bigint AS autoanalyze_count,
       sum(coalesce(pg_total_relation_size(NULLIF(c.reltoastrelid, 0)), 0))::bigint AS toast_bytes,
       sum(coalesce(ts.n_dead_tup, 0))::bigint AS toast_dead, sum(coalesce(ts.autovacuum_count, 0))::bigint AS toast_autovacuum_count
FROM unnest(CAST(:tables AS text[])) WITH ORDINALITY AS t(name, ord)
JOIN LATERAL (SELECT p.relid FROM pg_partition_tree(to_regclass(t.name)) p WHERE p.isleaf
              UNION SELECT c0.oid FROM pg_class c0 WHERE c0.oid = to_regclass(t.name) AND c0.relkind = 'r') p ON true
JOIN pg_stat_user_tables s ON s.relid = p.relid
JOIN pg_class c ON c.oid = s.relid
LEFT JOIN pg_stat_all_tables ts ON ts.relid = c.reltoastrelid
GROUP BY t.name, t.ord
ORDER BY t.ord

-- name: set_naptime
-- The autovacuum probe's own throwaway server only: how often autovacuum visits each
-- database (ALTER SYSTEM cannot run in a transaction block; pg_reload_conf applies it).
ALTER SYSTEM SET autovacuum_naptime = {{naptime_s}}

-- name: reload_conf
SELECT pg_reload_conf()

-- name: plan_guard_no_autovacuum
-- The plan-guard probe (plan_guard.py): keep autovacuum off this table, so that no
-- ANALYZE replans the sessions the probe compares. The HOT bound probe (hot_bound.py
-- --autovacuum off) uses it to keep autovacuum out of its runs. A partitioned table (a
-- reliable queue's meta and data since reliable_0012) takes no storage parameters: its
-- partitions get the setting.
DO $do$
DECLARE
    r regclass;
BEGIN
    FOR r IN SELECT p.relid FROM pg_partition_tree('{{table}}') p WHERE p.isleaf
             UNION SELECT c.oid::regclass FROM pg_class c WHERE c.oid = '{{table}}'::regclass AND c.relkind = 'r'
    LOOP
        EXECUTE 'ALTER TABLE ' || r::text || ' SET (autovacuum_enabled = false)';
    END LOOP;
END
$do$

-- name: plan_guard_analyze
-- The plan-guard probe: statistics of the small (or filled) table, as autovacuum gives them.
ANALYZE {{table}}

-- name: plan_guard_explain_dequeue
-- The plan-guard probe: one dequeue(10) with its buffers, the function's own statements
-- included (the caller rolls it back).
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF) SELECT * FROM {{fn_dequeue}}(10)

-- name: plan_guard_pgbench_dequeue
-- The plan-guard probe's pgbench script: one dequeue of {{batch}}, rolled back, so every
-- call finds the same rows.
BEGIN;
SELECT count(*) FROM {{fn_dequeue}}({{batch}});
ROLLBACK;

-- name: hot_bound_drop_finished
-- The HOT bound probe (hot_bound.py), its `nofin` queue: a reliable queue without
-- the finished index, so the ack writes a heap row version and a primary-key entry only.
-- The archive job needs that index: this is a bound, not a design.
DROP INDEX {{schema}}.{{finished_idx}}

-- name: hot_bound_hot_layout
-- The HOT bound probe, its `hot` queue: a reliable queue reduced until its claim is a HOT
-- update. No index mentions status or the lease columns any more (the ready index has no
-- predicate; the leased and finished indexes are gone), the meta table keeps half of each
-- page free, and the dequeue no longer looks for expired leases first (without the leased
-- index that pick would scan the table). The dequeue keeps the installed one's plan guard,
-- which CREATE OR REPLACE resets, so it is set again below. The ack is a DELETE
-- (hot_bound_consume_delete): no history. It drops lookups and guarantees the queue needs:
-- a bound on what a HOT-able layout could buy, not a design.
DROP INDEX {{schema}}.{{finished_idx}};
DROP INDEX {{schema}}.{{leased_idx}};
DROP INDEX {{schema}}.{{ready_idx}};
CREATE INDEX {{ready_idx}} ON {{meta}} (priority, due_at, id);
ALTER TABLE {{meta}} SET (fillfactor = 50);
CREATE OR REPLACE FUNCTION {{fn_dequeue}}(
    p_batch         integer          DEFAULT 1,
    p_lease_seconds double precision DEFAULT 30,
    p_worker        text             DEFAULT NULL
) RETURNS TABLE (
    id bigint, priority smallint, due_at timestamptz, title text, attempts integer,
    max_attempts integer, enqueued_at timestamptz, dequeued_at timestamptz,
    leased_until timestamptz, payload bytea, headers jsonb
)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH ready AS MATERIALIZED (
        SELECT m.id FROM {{meta}} m
        WHERE m.status = 0 AND m.due_at <= now()
        ORDER BY m.priority, m.due_at, m.id
        LIMIT greatest(p_batch, 0)
        FOR UPDATE SKIP LOCKED
    ), claimed AS (
        UPDATE {{meta}} m SET
            status = 1, attempts = m.attempts + 1, lease_owner = p_worker,
            leased_until = now() + make_interval(secs => coalesce(p_lease_seconds, 30)),
            dequeued_at = now()
        WHERE m.id = ANY (ARRAY(SELECT r.id FROM ready r))
        RETURNING m.id, m.priority, m.due_at, m.title, m.attempts, m.max_attempts,
                  m.enqueued_at, m.dequeued_at, m.leased_until
    ), payloads AS MATERIALIZED (
        SELECT d.id, d.payload, d.headers FROM {{data}} d
        WHERE d.id = ANY (ARRAY(SELECT c.id FROM claimed c))
    )
    SELECT c.id, c.priority, c.due_at, c.title, c.attempts, c.max_attempts, c.enqueued_at,
           c.dequeued_at, c.leased_until, p.payload, p.headers
    FROM claimed c JOIN payloads p ON p.id = c.id
    ORDER BY c.priority, c.due_at, c.id;
END
$fn$;
ALTER FUNCTION {{fn_dequeue}} SET enable_seqscan = off SET jit = off;

-- name: hot_bound_consume_delete
-- The `hot` queue's consumer (pgbench_reliable_consume's twin): dequeue, then delete what
-- it claimed (the data rows go by the foreign key's cascade) instead of the ack.
SELECT coalesce(array_agg(q.id), '{}') AS ids FROM {{fn_dequeue}}(:batch, NULL, :worker) AS q
\gset
DELETE FROM {{meta}} WHERE id = ANY (CAST(:ids AS bigint[])) AND status = 1 AND lease_owner = :worker;

-- name: hot_bound_left
-- What a HOT bound run left in its queue, by status.
SELECT status, count(*) AS n FROM {{meta}} GROUP BY status ORDER BY status

-- name: checkpoints
-- Checkpoints the server has run so far (timed and requested): a run that spans one writes
-- a full page image at the first change of every page after it, and is slower for it.
SELECT checkpoints_timed + checkpoints_req AS n FROM pg_stat_bgwriter

-- name: ack_plan_blocks
-- Blocks of the meta table and of each of its indexes that this session fetched and has not
-- reported yet (pg_stat_get_xact_blocks_fetched): a difference taken inside one transaction
-- is that transaction's own (a backend reports only when idle outside a transaction). For
-- the ack cost probe (ack_plan.py). Of a partitioned meta table (reliable_0012), its
-- partitions and theirs (the probe adds the slots up).
WITH tables AS (
    SELECT CAST(:meta AS regclass)::oid AS oid
    UNION SELECT p.relid FROM pg_partition_tree(CAST(:meta AS regclass)) p WHERE p.isleaf
)
SELECT c.relname AS relation, pg_stat_get_xact_blocks_fetched(c.oid) AS blocks
FROM pg_class c
WHERE c.relkind IN ('r', 'i') AND (c.oid IN (SELECT oid FROM tables)
   OR c.oid IN (SELECT i.indexrelid FROM pg_index i WHERE i.indrelid IN (SELECT oid FROM tables)))
ORDER BY c.relname

-- name: ack_plan_relation_locks
-- The relation locks this session's transaction holds, and how many of them it took on the
-- fast path (at most 16 per backend; past them every lock goes through the shared lock
-- manager's partition locks): the lease-call probe's (ack_plan.py) count after one call.
SELECT count(DISTINCT l.relation) AS relations, count(*) FILTER (WHERE l.fastpath) AS fastpath, count(*) AS locks
FROM pg_locks l
WHERE l.pid = pg_backend_pid() AND l.locktype = 'relation' AND l.relation <> 'pg_locks'::regclass

-- name: ack_plan_consume_extend
-- The lease probe's heartbeat cycle (pgbench_reliable_consume's twin): dequeue, extend the
-- leases of what it claimed (a Worker's heartbeat), then ack.
SELECT coalesce(array_agg(q.id), '{}') AS ids FROM {{fn_dequeue}}(:batch, NULL, :worker) AS q
\gset
SELECT count(*) AS extended FROM {{fn_extend_lease}}(CAST(:ids AS bigint[]), 60, :worker);
SELECT {{fn_ack}}(CAST(:ids AS bigint[]), :worker) AS acked;

-- name: ack_plan_consume_nack
-- The lease probe's retry cycle: dequeue, then nack what it claimed with no backoff (the
-- items are READY again at once, DEAD on their last attempt).
SELECT coalesce(array_agg(q.id), '{}') AS ids FROM {{fn_dequeue}}(:batch, NULL, :worker) AS q
\gset
SELECT count(*) AS nacked FROM {{fn_nack}}(CAST(:ids AS bigint[]), 'again', :worker, 0, 0);

-- name: ack_plan_consume_release
-- The lease probe's give-back cycle: dequeue, then release what it claimed.
SELECT coalesce(array_agg(q.id), '{}') AS ids FROM {{fn_dequeue}}(:batch, NULL, :worker) AS q
\gset
SELECT {{fn_release}}(CAST(:ids AS bigint[]), :worker) AS released;

-- name: ack_plan_switch
-- Switch new rows to the next generation now (the rotator's switch with a threshold of one
-- id): the lease probe's items stay leased in the slot before.
SELECT {{fn_rot_switch}}(1)

-- name: consumers_ready_index_bytes
-- consumers_cpu.py, at a run's end: the size of the queue's ready indexes (every slot's),
-- which hold only READY rows' entries plus those of rows claimed since the last VACUUM that
-- no insert has cleared from their page.
SELECT coalesce(sum(pg_relation_size(p.relid)), 0)::bigint AS bytes
FROM pg_partition_tree(to_regclass({{ready_idx_literal}})) p
WHERE p.isleaf

-- name: consumers_head_look
-- consumers_cpu.py, at a run's end: what a look at the head of the READY rows reads (the
-- claim's walk, read-only: no row locked), from the plan's buffer counts.
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, FORMAT JSON)
SELECT m.id FROM {{meta}} m
WHERE m.status = 0 AND m.due_at <= now()
ORDER BY m.priority, m.due_at, m.id
LIMIT 10

-- name: replan_truncate
-- replan.py: empty slot 0's tables as the archive job's truncate does (new files: every
-- session's cached plans on them are invalid).
TRUNCATE {{meta0}}, {{data0}}

-- name: replan_claim
-- replan.py: the claim on slot 0's own tables, as dequeue calls it (batch 10).
SELECT * FROM {{fn_claim_in0}}(ARRAY[0]::smallint[], 10, 30, 'replan')

-- name: replan_ack
-- replan.py: the ack on slot 0's own tables, as ack calls it (ids that are not there).
SELECT {{fn_ack_in0}}(ARRAY[1, 2, 3]::bigint[], 'replan')

-- name: empty_look_switch
-- empty_look.py: new rows to the next epoch (a generation of at least 1 id).
SELECT {{fn_rot_switch}}(1) AS epoch

-- name: empty_look_seal
-- empty_look.py: seal the previous epoch (its READY rows move forward) and mark it sealed.
SELECT {{fn_rot_seal}}(100000) AS moved, {{fn_rot_mark}}('sealed', :epoch)

-- name: empty_look_horizon
-- empty_look.py: the horizon the archive job takes before its precopy (jobs.sql: rot_horizon).
SELECT pg_snapshot_xmin(pg_current_snapshot())::text AS horizon

-- name: empty_look_precopy
-- empty_look.py: one batch of the precopy, as the archive job runs it (jobs.sql: rot_copy).
SELECT * FROM {{fn_rot_copy}}(CAST(:slot AS smallint), :after, :batch)

-- name: empty_look_copy
-- empty_look.py: the copy rot_empty runs under its lock, without a horizon (every finished
-- row of the slot looked up in history) or with the precopy's (NULL: without).
SELECT * FROM {{fn_rot_copy}}(CAST(:slot AS smallint), 0, NULL, CAST(:horizon AS xid8))

-- name: copy_cost_batch
-- copy_cost.py: one batch of the archive job's precopy (jobs.sql: rot_copy).
SELECT * FROM {{fn_rot_copy}}(CAST(:slot AS smallint), :after, :batch)

-- name: copy_cost_vacuum
-- copy_cost.py: history's dead index entries, left by the previous round's rollback, gone
-- before the next round looks rows up there.
VACUUM {{history}}
