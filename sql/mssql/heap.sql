-- The heap queue on SQL Server: no order is promised. The same sections as
-- sql/postgresql/heap.sql.
--
-- One table holds id, payload and headers. Dequeue is ONE statement: DELETE through a CTE
-- that takes whichever unlocked rows the scan meets first (TOP without ORDER BY,
-- READPAST), OUTPUT deleted.* returns them: the cheapest destructive read.
--
-- Batches inside a section are separated by GO lines (see reliable.sql). Sections are
-- filled by queuectl.sqlfiles.render() with quoted identifiers only.

-- name: create_tables
-- The queue's id sequence and its one table; the clustered primary key is the dequeue's
-- index for the id order.
-- Why not a heap (a table without a clustered index), as the kind's name and the seed
-- suggest: this queue is drained by DELETE, and SQL Server deallocates the pages a DELETE
-- empties in a heap only when the delete holds a table lock (TABLOCK), which would
-- serialise every consumer; with row or page locks, as READPAST dequeues take, the emptied
-- pages stay allocated to the heap, so a heap queue keeps the size of its largest backlog
-- and its scans read the empty pages. A clustered index gives them back as ghost cleanup
-- removes the deleted rows, and lets the scan start at the low end.
CREATE SEQUENCE {{items_seq}} AS bigint START WITH 1 INCREMENT BY 1 CACHE 1000;
GO
CREATE TABLE {{items}} (
    id          bigint         NOT NULL DEFAULT (NEXT VALUE FOR {{items_seq}}) PRIMARY KEY CLUSTERED,
    payload     varbinary(max) NOT NULL,
    headers     nvarchar(max)  NULL CHECK (headers IS NULL OR ISJSON(headers) = 1),
    enqueued_at datetime2(6)   NOT NULL DEFAULT SYSUTCDATETIME()
);

-- name: create_functions
-- The SQL API as stored procedures, callable from any language.

-- enqueue one item; returns its id.
CREATE OR ALTER PROCEDURE {{fn_enqueue}}
    @payload varbinary(max),
    @headers nvarchar(max) = NULL
AS
BEGIN
    SET NOCOUNT ON; SET ROWCOUNT 0;
    DECLARE @ids TABLE (id bigint NOT NULL);
    INSERT INTO {{items}} (payload, headers) OUTPUT inserted.id INTO @ids (id)
    VALUES (@payload, @headers);
    SELECT id FROM @ids;
END
GO
-- enqueue many items in one call; ids are drawn in input order and returned in it.
-- @items is a JSON array of {"payload": "<hex>", "headers": {...} | null} (why JSON and
-- not a table-valued parameter: reliable.sql).
CREATE OR ALTER PROCEDURE {{fn_enqueue_many}}
    @items nvarchar(max)
AS
BEGIN
    SET NOCOUNT ON; SET ROWCOUNT 0;
    SET XACT_ABORT ON;
    DECLARE @src TABLE (ord int NOT NULL PRIMARY KEY, id bigint NOT NULL,
                        payload varbinary(max) NOT NULL, headers nvarchar(max) NULL);
    INSERT INTO @src (ord, id, payload, headers)
    SELECT CAST(j.[key] AS int),
           NEXT VALUE FOR {{items_seq}} OVER (ORDER BY CAST(j.[key] AS int)),
           CONVERT(varbinary(max), v.payload_hex, 2), v.headers
    FROM OPENJSON(@items) AS j
    CROSS APPLY OPENJSON(j.[value]) WITH (
        payload_hex nvarchar(max) '$.payload',
        headers     nvarchar(max) '$.headers' AS JSON
    ) AS v;
    INSERT INTO {{items}} (id, payload, headers)
    SELECT s.id, s.payload, s.headers FROM @src AS s;
    SELECT s.id FROM @src AS s ORDER BY s.ord;
END

-- name: create_dequeue
-- The dequeue procedure, unchanged since heap_0001 (CREATE OR ALTER: the downgrade of
-- heap_0002 runs it again). It deletes through its TOP pick, with no
-- join to the picks, so heap_0002's PostgreSQL change has nothing to fix here.

-- dequeue: ONE statement takes up to @batch items: no ORDER BY, any unlocked rows will do,
-- so the scan stops at the first rows it can lock. Rows come back in no particular order.
-- The plan it needs: a scan of the clustered primary key (index 1), TOP stopping after @n
-- rows, so the scan reads little more than it takes; READPAST skips keys others hold,
-- UPDLOCK keeps each taken key locked until commit; no lookup, no sort (no ORDER BY). It is
-- the table's only index; WITH (INDEX(1)) keeps it so if an index is ever added. FORCESEEK
-- is not added: there is no predicate to seek on (error 8622). Table hints:
-- https://learn.microsoft.com/en-us/sql/t-sql/queries/hints-transact-sql-table
-- Row versioning: UPDLOCK takes update locks with READ_COMMITTED_SNAPSHOT on too, so
-- READPAST skips rows in flight as with it off (reliable.sql, create_dequeue).
CREATE OR ALTER PROCEDURE {{fn_dequeue}}
    @batch int = 1
AS
BEGIN
    SET NOCOUNT ON; SET ROWCOUNT 0;
    DECLARE @n int = CASE WHEN @batch > 0 THEN @batch ELSE 0 END;
    DECLARE @now datetime2(6) = SYSUTCDATETIME();
    WITH picked AS (
        SELECT TOP (@n) i.id, i.payload, i.headers, i.enqueued_at
        FROM {{items}} AS i WITH (UPDLOCK, READPAST, ROWLOCK, INDEX(1))
    )
    DELETE FROM picked
    OUTPUT deleted.id, deleted.payload, deleted.headers, deleted.enqueued_at, @now AS dequeued_at;
END

-- name: set_plan_guard
-- heap_0004 on PostgreSQL keeps the dequeue's cached generic plan off sequential scans;
-- sql/mssql/reliable.sql, set_plan_guard, says why nothing is set here. Empty on purpose.

-- name: reset_plan_guard
-- heap_0004 downgrade: nothing was set. Empty on purpose.

-- name: drop_functions
-- Remove the SQL API.
DROP PROCEDURE IF EXISTS {{fn_dequeue}};
DROP PROCEDURE IF EXISTS {{fn_enqueue_many}};
DROP PROCEDURE IF EXISTS {{fn_enqueue}};

-- name: drop_tables
-- Remove the queue's table (and with it its indexes), then its sequence.
DROP TABLE IF EXISTS {{items}};
DROP SEQUENCE IF EXISTS {{items_seq}};

-- name: enqueue
-- Client call: one item.
EXEC {{fn_enqueue}} @payload = :payload, @headers = :headers

-- name: enqueue_many
-- Client call: many items in one round trip (:items is the JSON array described above).
EXEC {{fn_enqueue_many}} @items = :items

-- name: dequeue
-- Client call: take (delete and return) up to :batch items.
EXEC {{fn_dequeue}} @batch = :batch

-- name: counts
-- Depth for `queuectl list`: every row in the table is waiting (dequeued rows are deleted).
SELECT CAST(0 AS smallint) AS status, CAST(0 AS bit) AS scheduled, COUNT_BIG(*) AS n FROM {{items}}
