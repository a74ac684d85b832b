-- The storage-health reader of the engine adapter (queuectl.engine.Adapter.storage_health)
-- on PostgreSQL: the same columns as sql/mssql/storage.sql, from the cheap statistics
-- (no page scan). version_dead_rows and page_density_pct are SQL Server notions: NULL here;
-- the inspect job measures density with pgstattuple.

-- name: storage_health
-- One row per table (index_name NULL) and per index of the queue's tables (those of
-- every kind: meta, data, history, items, watermark, ring): pages, live and dead tuples
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
                    :queue || '_items', :queue || '_watermark', :queue || '_ring')
UNION ALL
SELECT t.relname::text, c.relname::text, c.relpages::bigint, NULL, NULL, NULL, NULL, NULL
FROM pg_index i
JOIN pg_class c ON c.oid = i.indexrelid
JOIN pg_class t ON t.oid = i.indrelid
JOIN pg_namespace n ON n.oid = t.relnamespace
WHERE n.nspname = :schema
  AND t.relname IN (:queue || '_meta', :queue || '_data', :queue || '_history',
                    :queue || '_items', :queue || '_watermark', :queue || '_ring')
ORDER BY 1, 2 NULLS FIRST
