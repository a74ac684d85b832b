-- Queries over the toolkit's catalog schema as a whole.

-- name: schema_contents
-- What a schema still holds: relations (tables, indexes, sequences, views) and functions.
SELECT
    (SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
      WHERE n.nspname = :schema) AS relations,
    (SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
      WHERE n.nspname = :schema) AS functions

-- name: drop_schema
-- Drop the (empty) catalog schema; never CASCADE, so nothing of anyone else's goes with it.
DROP SCHEMA IF EXISTS {{schema}}

-- name: create_schema
-- The schema holding the catalog and the queues (the version tables live in it too).
CREATE SCHEMA IF NOT EXISTS {{schema}}

-- name: session_settings
-- Settings every install session and review script starts with: none needed on PostgreSQL.

-- name: row_versioning
-- SQL Server's read committed snapshot and snapshot isolation settings, reported at install
-- there. PostgreSQL reads snapshots always and its claims lock with FOR UPDATE SKIP LOCKED
-- whatever the isolation: nothing to report. Empty on purpose.
