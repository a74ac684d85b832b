-- The compact_cost probe's statements (bench/lab/compact_cost.py).

-- name: hold
-- A REPEATABLE READ snapshot on a catalog table: the horizon stays pinned while it lasts.
SELECT count(*) FROM pg_class

-- name: compact_temp
-- The alternative to the product's array (sql/postgresql/jobs.sql: compact_items): the live
-- rows through a temporary table dropped at commit.
DO $compact$
DECLARE
    v_t0 timestamptz;
BEGIN
    LOCK TABLE {{items}} IN ACCESS EXCLUSIVE MODE;
    v_t0 := clock_timestamp();
    CREATE TEMPORARY TABLE compact_copy ON COMMIT DROP AS SELECT * FROM {{items}};
    TRUNCATE {{items}};
    INSERT INTO {{items}} OVERRIDING SYSTEM VALUE SELECT * FROM compact_copy ORDER BY id;
    PERFORM set_config('queuectl.compacted',
                       (SELECT count(*) FROM compact_copy) || ' ' || extract(epoch FROM clock_timestamp() - v_t0), false);
END
$compact$

-- name: catalog_dead
-- Dead versions in the catalog tables a temporary table writes to.
SELECT coalesce(sum(n_dead_tup), 0)::bigint AS dead FROM pg_stat_sys_tables
WHERE relname IN ('pg_class', 'pg_attribute', 'pg_type', 'pg_depend')
