-- The FIFO queue on SQL Server, lax (default) or strict. The same sections as
-- sql/postgresql/fifo.sql.
--
-- One table holds id (from a sequence, so enqueue order), payload and headers. Dequeue is
-- ONE statement: DELETE through a CTE that picks the first n ids, OUTPUT deleted.*.
--  * lax: the pick uses READPAST: consumers never wait for each other; a consumer whose
--    transaction rolls back puts its rows back at the head after others may have taken
--    later rows, so items can be processed out of order.
--  * strict: no READPAST: a consumer waits on the head rows another consumer's open
--    transaction holds (UPDLOCK, in id order, so consumers cannot deadlock each other);
--    when that transaction commits the rows are gone and the waiter goes on with the
--    next ones, when it rolls back the waiter gets the very same rows. Items leave in id
--    order even across rollbacks, at the price of one consumer transaction at a time.
--
-- Batches inside a section are separated by GO lines (see reliable.sql). Sections are
-- filled by queuectl.sqlfiles.render() with quoted identifiers only.

-- name: create_tables
-- The queue's id sequence and its one table; the clustered primary key is the dequeue's
-- index for the id order.
CREATE SEQUENCE {{items_seq}} AS bigint START WITH 1 INCREMENT BY 1 CACHE 1000;
GO
CREATE TABLE {{items}} (
    id          bigint         NOT NULL DEFAULT (NEXT VALUE FOR {{items_seq}}) PRIMARY KEY CLUSTERED,
    payload     varbinary(max) NOT NULL,
    headers     nvarchar(max)  NULL CHECK (headers IS NULL OR ISJSON(headers) = 1),
    enqueued_at datetime2(6)   NOT NULL DEFAULT SYSUTCDATETIME()
);

-- name: create_functions
-- The SQL API shared by lax and strict FIFO queues (the dequeue is in the next sections).

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

-- name: create_dequeue_lax
-- The lax dequeue: oldest first, skipping rows other consumers hold.
-- (fifo_0001's; CREATE OR ALTER, so fifo_0002's downgrade can run it again.)
-- dequeue: ONE statement takes up to @batch items, oldest first; READPAST skips
-- rows other consumers hold.
-- The plan it needs: an ordered scan of the clustered primary key (index 1, key id) from
-- its low end, in key order, which is the ORDER BY (no sort), TOP stopping after @n rows;
-- READPAST skips keys other consumers hold, UPDLOCK keeps each taken key locked until
-- commit; the clustered row holds every column (no lookup). It is the table's only index,
-- so no other access path exists; WITH (INDEX(1)) keeps it so if an index is ever added.
-- A sort before TOP would read and lock every row: the key order makes it needless.
-- FORCESEEK is not added: there is no predicate to seek on (the hint would leave no plan,
-- error 8622). Table hints: https://learn.microsoft.com/en-us/sql/t-sql/queries/hints-transact-sql-table
-- Row versioning: UPDLOCK takes update locks with READ_COMMITTED_SNAPSHOT on too, so
-- READPAST skips rows in flight as with it off (reliable.sql, create_dequeue).
CREATE OR ALTER PROCEDURE {{fn_dequeue}}
    @batch int = 1
AS
BEGIN
    SET NOCOUNT ON; SET ROWCOUNT 0;
    DECLARE @n int = CASE WHEN @batch > 0 THEN @batch ELSE 0 END;
    DECLARE @now datetime2(6) = SYSUTCDATETIME();
    DECLARE @taken TABLE (id bigint NOT NULL PRIMARY KEY, payload varbinary(max) NOT NULL,
                          headers nvarchar(max) NULL, enqueued_at datetime2(6) NOT NULL);
    WITH picked AS (
        SELECT TOP (@n) i.id, i.payload, i.headers, i.enqueued_at
        FROM {{items}} AS i WITH (UPDLOCK, READPAST, ROWLOCK, INDEX(1))
        ORDER BY i.id
    )
    DELETE FROM picked
    OUTPUT deleted.id, deleted.payload, deleted.headers, deleted.enqueued_at
    INTO @taken (id, payload, headers, enqueued_at);
    -- OUTPUT returns rows in no defined order: hand the batch out in the queue's order,
    -- as PostgreSQL's dequeue does.
    SELECT t.id, t.payload, t.headers, t.enqueued_at, @now AS dequeued_at
    FROM @taken AS t ORDER BY t.id;
END

-- name: create_dequeue_strict
-- The strict dequeue: oldest first, waiting for rows other consumers hold (no READPAST).
-- (fifo_0001's; CREATE OR ALTER, so fifo_0002's downgrade can run it again.)
-- dequeue: ONE statement takes up to @batch items in id order. No READPAST: a consumer
-- waits for the head rows another consumer's transaction holds (see the header).
-- The plan it needs is the lax dequeue's (an ordered scan of the clustered primary key,
-- TOP stopping after @n rows), without READPAST: the scan waits at the first locked key.
-- A sort before TOP would lock, and so wait for, every row of the queue. UPDLOCK makes it a
-- locking read with READ_COMMITTED_SNAPSHOT on too, so it still waits for rows in flight.
CREATE OR ALTER PROCEDURE {{fn_dequeue}}
    @batch int = 1
AS
BEGIN
    SET NOCOUNT ON; SET ROWCOUNT 0;
    DECLARE @n int = CASE WHEN @batch > 0 THEN @batch ELSE 0 END;
    DECLARE @now datetime2(6) = SYSUTCDATETIME();
    DECLARE @taken TABLE (id bigint NOT NULL PRIMARY KEY, payload varbinary(max) NOT NULL,
                          headers nvarchar(max) NULL, enqueued_at datetime2(6) NOT NULL);
    WITH picked AS (
        SELECT TOP (@n) i.id, i.payload, i.headers, i.enqueued_at
        FROM {{items}} AS i WITH (UPDLOCK, ROWLOCK, INDEX(1))
        ORDER BY i.id
    )
    DELETE FROM picked
    OUTPUT deleted.id, deleted.payload, deleted.headers, deleted.enqueued_at
    INTO @taken (id, payload, headers, enqueued_at);
    -- OUTPUT returns rows in no defined order: hand the batch out in the queue's order,
    -- as PostgreSQL's dequeue does.
    SELECT t.id, t.payload, t.headers, t.enqueued_at, @now AS dequeued_at
    FROM @taken AS t ORDER BY t.id;
END

-- name: set_plan_guard
-- fifo_0004 on PostgreSQL keeps the dequeue's cached generic plan off sequential scans;
-- sql/mssql/reliable.sql, set_plan_guard, says why nothing is set here. Empty on purpose.

-- name: reset_plan_guard
-- fifo_0004 downgrade: nothing was set. Empty on purpose.

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
