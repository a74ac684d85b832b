-- Least privilege on SQL Server (`queuectl grant`): roles get EXECUTE on the queue's
-- procedures and nothing on its tables.
--
-- Ownership chaining does the rest: the procedures and the tables they use share the
-- schema's owner, so SQL Server checks the caller's EXECUTE permission on the procedure
-- and no permission on the tables inside it. (The procedures that read catalog metadata
-- run WITH EXECUTE AS OWNER, see watermark.sql and ring.sql.) SQL Server grants nothing
-- on new procedures to public, so there is nothing to revoke. {{function_literals}} are
-- the queue's own procedure names (validated identifiers as string literals).

-- name: role_exists
-- Whether a database principal (user or role) of that name exists.
SELECT CASE WHEN DATABASE_PRINCIPAL_ID(:role) IS NULL THEN 0 ELSE 1 END AS n

-- name: secure_functions
-- Nothing to change on SQL Server: procedures run with ownership chaining already.

-- name: resecure_functions
-- Nothing to restore on SQL Server: CREATE OR ALTER PROCEDURE keeps the procedure's
-- permissions, and EXECUTE AS OWNER is part of its text.

-- name: grant_execute
-- The principal may execute these procedures and read the catalog's registry (which
-- queues exist, their kind and settings: the client looks its queue up there).
DECLARE @sql nvarchar(max) = N'';
SELECT @sql += N'GRANT EXECUTE ON OBJECT::' + QUOTENAME(SCHEMA_NAME(o.schema_id)) + N'.'
               + QUOTENAME(o.name) + N' TO {{role}}; '
FROM sys.objects AS o
WHERE o.schema_id = SCHEMA_ID({{schema_literal}}) AND o.type = 'P'
  AND o.name IN ({{function_literals}});
EXEC sys.sp_executesql @sql;
GRANT SELECT ON OBJECT::{{schema}}.queues TO {{role}};
GRANT SELECT ON OBJECT::{{schema}}.alembic_version TO {{role}};

-- name: granted_functions
-- The queue procedures a principal may execute.
SELECT o.name AS function_name
FROM sys.objects AS o
WHERE o.schema_id = SCHEMA_ID({{schema_literal}}) AND o.type = 'P'
  AND o.name IN ({{function_literals}})
  AND EXISTS (SELECT 1 FROM sys.database_permissions AS p
              WHERE p.major_id = o.object_id AND p.permission_name = N'EXECUTE'
                AND p.state IN ('G', 'W') AND p.grantee_principal_id = DATABASE_PRINCIPAL_ID(:role))
ORDER BY 1
