-- The storage-health reader of the engine adapter (queuectl.engine.Adapter.storage_health)
-- on PostgreSQL: the same columns as sql/mssql/storage.sql, from the cheap statistics
-- (no page scan). version_dead_rows and page_density_pct are SQL Server notions: NULL here;
-- the inspect job measures density with pgstattuple.

-- name: storage_health
-- One row per table (index_name NULL) and per index of the queue's tables (those of
-- every kind: meta, data, history, items, watermark, ring; a reliable queue's generation
-- slots meta0-2 and data0-2 since reliable_0012, whose parents hold no rows): pages, live and dead tuples
-- (tables), and nothing PostgreSQL cannot say without reading pages.
SELECT c.relname::text AS table_name,
       NULL::text AS index_name,
       c.relpages::bigint AS pages,
       s.n_live_tup AS live_rows,
       s.n_dead_tup AS dead_rows,
       NULL::bigint AS version_dead_rows,
       NULL::double precision AS fragmentation_pct,
       NULL::double precision AS page_density_pct
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
WHERE n.nspname = :schema AND c.relkind = 'r'
  AND c.relname IN (:queue || '_meta', :queue || '_data', :queue || '_history',
                    :queue || '_meta0', :queue || '_meta1', :queue || '_meta2',
                    :queue || '_data0', :queue || '_data1', :queue || '_data2',
                    :queue || '_items', :queue || '_watermark', :queue || '_ring')
UNION ALL
SELECT t.relname::text, c.relname::text, c.relpages::bigint, NULL, NULL, NULL, NULL, NULL
FROM pg_index i
JOIN pg_class c ON c.oid = i.indexrelid
JOIN pg_class t ON t.oid = i.indrelid
JOIN pg_namespace n ON n.oid = t.relnamespace
WHERE n.nspname = :schema AND t.relkind = 'r'
  AND t.relname IN (:queue || '_meta', :queue || '_data', :queue || '_history',
                    :queue || '_meta0', :queue || '_meta1', :queue || '_meta2',
                    :queue || '_data0', :queue || '_data1', :queue || '_data2',
                    :queue || '_items', :queue || '_watermark', :queue || '_ring')
ORDER BY 1, 2 NULLS FIRST

-- name: set_items_autovacuum
-- <kind>_0003 of the one-table kinds (heap, fifo, stack, pending, watermark): autovacuum
-- storage parameters of the items table (reset_items_autovacuum removes exactly these).
-- Every item is inserted once and deleted once by its dequeue: one dead row per message,
-- all of them where the dequeue starts (the head of the primary key for fifo and
-- watermark, its tail for stack, the first heap pages for heap, the earliest due_at for
-- pending). A dequeue walks the dead index entries it meets until VACUUM removes them or
-- an index scan marks them dead (which a snapshot held open prevents; that is what the
-- watermark kind is for), and the server's default trigger (50 + 0.2 x reltuples dead
-- rows) lets a deep backlog collect a fifth of its size there first. Scale factor 0 and a
-- threshold of 1,000 dead rows make every autovacuum round (autovacuum_naptime, a server
-- setting) vacuum the table as soon as there is real churn, however deep the backlog is;
-- no cost delay, because a throttled vacuum (the default 2 ms: ~40 MB/s of dirtied pages
-- at most) falls furthest behind exactly when the table churns fastest, and its TOAST
-- table (large payloads) follows the same parameters. Inserts and ANALYZE keep the
-- server's defaults: every row is deleted soon after its insert, so the dead-row trigger
-- comes first, and the dequeues do not depend on the statistics (<kind>_0002).
-- The same values as reliable_0007's meta table (sql/postgresql/reliable.sql says how
-- those were measured). Measured on these kinds (bench/autovacuum.py --kind fifo, 90 s,
-- and --kind heap, 60 s: 2 producers, 2 consumers, batch 50, backlog 50,000, 300-byte
-- payloads, the settings against the server's defaults alternately, 2 repeats; quiet
-- machine): fifo 33,439 against 22,913 msg/s, dequeue(50) 2.99 against 4.36 ms, median
-- dead rows 1.02M against 1.35M, 1.5 against 0.5 finished autovacuums per run; heap
-- 61,732 against 47,899 msg/s, dequeue(50) 1.61 against 2.06 ms.
-- The watermark kind's one-row hint table is updated HOT at most once a second per
-- consumer and keeps the server's settings.
-- ALTER TABLE ... SET takes SHARE UPDATE EXCLUSIVE: producers and consumers are not
-- blocked; a running autovacuum of the table is waited for (or cancels itself).
ALTER TABLE {{items}} SET (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_cost_delay = 0
);

-- name: reset_items_autovacuum
-- <kind>_0003 downgrade of the one-table kinds: back to the server's autovacuum settings
-- (exactly the parameters set_items_autovacuum set; anything else stays as it is).
ALTER TABLE {{items}} RESET (
    autovacuum_vacuum_scale_factor,
    autovacuum_vacuum_threshold,
    autovacuum_vacuum_cost_delay
);
