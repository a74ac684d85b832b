-- Queries over the toolkit's catalog schema as a whole, on SQL Server.
--
-- Identifiers arrive double-quoted from queuectl.names: every batch queuectl sends, and
-- every review script it prints, runs with SET QUOTED_IDENTIFIER ON (the ODBC driver's
-- default; sqlcmd needs -I). Filtered indexes need it as well.

-- name: schema_contents
-- What a schema still holds: objects of any type (tables, views, sequences, procedures,
-- functions, types...) and, separately, procedures and functions.
SELECT
    (SELECT COUNT(*) FROM sys.objects o WHERE o.schema_id = SCHEMA_ID(:schema)
        AND o.type NOT IN ('P', 'PC', 'FN', 'IF', 'TF', 'FS', 'FT')
        AND o.parent_object_id = 0)
    + (SELECT COUNT(*) FROM sys.types t WHERE t.schema_id = SCHEMA_ID(:schema)
        AND t.is_user_defined = 1) AS relations,
    (SELECT COUNT(*) FROM sys.objects o WHERE o.schema_id = SCHEMA_ID(:schema)
        AND o.type IN ('P', 'PC', 'FN', 'IF', 'TF', 'FS', 'FT')) AS functions

-- name: drop_schema
-- Drop the (empty) catalog schema; DROP SCHEMA fails while anything is left in it.
DROP SCHEMA IF EXISTS {{schema}}

-- name: create_schema
-- CREATE SCHEMA must be alone in its batch, hence the dynamic statement inside the IF
-- (the name is a validated identifier: it holds no quote of either kind).
IF SCHEMA_ID({{schema_literal}}) IS NULL
    EXEC (N'CREATE SCHEMA {{schema}}')

-- name: session_settings
-- Settings every install session and review script starts with. Double-quoted identifiers,
-- filtered indexes and procedures that write tables with filtered indexes all need
-- QUOTED_IDENTIFIER and ANSI_NULLS ON (a procedure keeps the values it was created with).
SET QUOTED_IDENTIFIER ON;
SET ANSI_NULLS ON;

-- name: row_versioning
-- The database's row-versioning settings, which `queuectl install` reports in one line
-- (queuectl.engine.mssql.row_versioning_report says what each changes). The connected
-- database's row of sys.databases is visible to any user of it, whatever else the login
-- may see.
SELECT DB_NAME() AS database_name,
       d.is_read_committed_snapshot_on,
       d.snapshot_isolation_state_desc
FROM sys.databases AS d
WHERE d.database_id = DB_ID()
