-- The storage-health reader of the engine adapter (queuectl.engine.Adapter.storage_health)
-- on SQL Server: the same columns as sql/postgresql/storage.sql.

-- name: storage_health
-- One row per index (or heap) of the queue's tables (those of every kind): leaf pages, live rows, ghost records
-- (deleted rows the ghost cleanup task has not removed yet), version ghosts (kept for a
-- snapshot transaction), fragmentation and page density. SAMPLED mode, which on indexes
-- under 10,000 pages reads them in full. The tables are found by name in sys.objects first
-- (a NULL object id would make the DMF scan the whole database).
SELECT o.name AS table_name,
       i.name AS index_name,
       ps.page_count AS pages,
       ps.record_count AS live_rows,
       ps.ghost_record_count AS dead_rows,
       ps.version_ghost_record_count AS version_dead_rows,
       ps.avg_fragmentation_in_percent AS fragmentation_pct,
       ps.avg_page_space_used_in_percent AS page_density_pct
FROM sys.objects AS o
CROSS APPLY sys.dm_db_index_physical_stats(DB_ID(), o.object_id, NULL, NULL, 'SAMPLED') AS ps
JOIN sys.indexes AS i ON i.object_id = ps.object_id AND i.index_id = ps.index_id
WHERE o.schema_id = SCHEMA_ID(:schema)
  AND o.type = 'U'
  AND o.name IN (CONCAT(:queue, N'_meta'), CONCAT(:queue, N'_data'), CONCAT(:queue, N'_history'),
                 CONCAT(:queue, N'_items'), CONCAT(:queue, N'_watermark'), CONCAT(:queue, N'_ring'))
  AND ps.alloc_unit_type_desc = N'IN_ROW_DATA'
  AND ps.index_level = 0
ORDER BY o.name, ps.index_id

-- name: set_items_autovacuum
-- <kind>_0003 of the one-table kinds sets autovacuum storage parameters of the items table
-- on PostgreSQL. SQL Server has no per-table counterpart: a dequeue's deleted rows become
-- ghost records that the instance-wide ghost-cleanup task removes (every 5 s, no per-table
-- setting; dba.md 1.6), as reliable.sql's set_autovacuum says for the reliable queue.
-- Empty on purpose (no batch runs).

-- name: reset_items_autovacuum
-- <kind>_0003 downgrade: nothing was set (see set_items_autovacuum). Empty on purpose.
