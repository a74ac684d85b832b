-- Statements the benchmarks in bench/ run besides the queues' own SQL API.

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
