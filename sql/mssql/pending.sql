-- The pending queue on SQL Server: items become ready at their due time (UTC). The same
-- sections as sql/postgresql/pending.sql.
--
-- One table holds id, due_at, payload and headers, clustered on (due_at, id): the table's
-- own order is the dequeue's. Dequeue is ONE statement: DELETE through a CTE that picks the
-- earliest-due n rows whose due_at <= SYSUTCDATETIME() it can lock (READPAST), OUTPUT
-- deleted.* returns them. An item is never returned before its due time, on the server's
-- clock.
--
-- Batches inside a section are separated by GO lines (see reliable.sql). Sections are
-- filled by queuectl.sqlfiles.render() with quoted identifiers only.

-- name: create_tables
-- The queue's id sequence and its one table, clustered on (due_at, id).
--
-- The clustered index is the dequeue's order: the dequeue seeks the table itself from its
-- low end (due items first, then by id) and reads every column there, so it needs no
-- lookup, and each taken row leaves two indexes (this one and the primary key). Clustered
-- on id with a second index on (due_at, id), each taken row would cost a lookup into the
-- clustered index and deletes from both all the same. UNIQUE (id is): SQL Server adds no
-- uniquifier to the key. Items due now append at the high end; a delayed item lands inside
-- the index and may split a page there, the price of a dequeue that reads one index.
-- The primary key on id stays, nonclustered: ids are what enqueue returns and how a row is
-- named, and it keeps them unique.
CREATE SEQUENCE {{items_seq}} AS bigint START WITH 1 INCREMENT BY 1 CACHE 1000;
GO
CREATE TABLE {{items}} (
    id          bigint         NOT NULL DEFAULT (NEXT VALUE FOR {{items_seq}}) PRIMARY KEY NONCLUSTERED,
    due_at      datetime2(6)   NOT NULL DEFAULT SYSUTCDATETIME(),
    payload     varbinary(max) NOT NULL,
    headers     nvarchar(max)  NULL CHECK (headers IS NULL OR ISJSON(headers) = 1),
    enqueued_at datetime2(6)   NOT NULL DEFAULT SYSUTCDATETIME()
);
GO
CREATE UNIQUE CLUSTERED INDEX {{due_idx}} ON {{items}} (due_at, id);

-- name: create_functions
-- The SQL API as stored procedures, callable from any language.

-- enqueue one item, due at @due_at (UTC), else now + @delay_seconds, else now; returns its id.
CREATE OR ALTER PROCEDURE {{fn_enqueue}}
    @payload       varbinary(max),
    @headers       nvarchar(max) = NULL,
    @due_at        datetime2(6)  = NULL,
    @delay_seconds float         = NULL
AS
BEGIN
    SET NOCOUNT ON; SET ROWCOUNT 0;
    DECLARE @delay float = COALESCE(@delay_seconds, 0);
    DECLARE @ids TABLE (id bigint NOT NULL);
    INSERT INTO {{items}} (due_at, payload, headers)
    OUTPUT inserted.id INTO @ids (id)
    VALUES (COALESCE(@due_at, DATEADD(millisecond,
                CAST(ROUND((@delay - FLOOR(@delay / 86400e0) * 86400e0) * 1000e0, 0) AS int),
                DATEADD(day, CAST(FLOOR(@delay / 86400e0) AS int), SYSUTCDATETIME()))),
            @payload, @headers);
    SELECT id FROM @ids;
END
GO
-- enqueue many items in one call; ids come back in input order. @items is a JSON array
-- of {"payload": "<hex>", "headers": {...} | null, "due_at": "<ISO 8601 UTC>" | null,
-- "delay": seconds | null} (why JSON and not a table-valued parameter: reliable.sql).
CREATE OR ALTER PROCEDURE {{fn_enqueue_many}}
    @items nvarchar(max)
AS
BEGIN
    SET NOCOUNT ON; SET ROWCOUNT 0;
    SET XACT_ABORT ON;
    DECLARE @now datetime2(6) = SYSUTCDATETIME();
    DECLARE @src TABLE (ord int NOT NULL PRIMARY KEY, id bigint NOT NULL, due_at datetime2(6) NOT NULL,
                        payload varbinary(max) NOT NULL, headers nvarchar(max) NULL);
    INSERT INTO @src (ord, id, due_at, payload, headers)
    SELECT CAST(j.[key] AS int),
           NEXT VALUE FOR {{items_seq}} OVER (ORDER BY CAST(j.[key] AS int)),
           COALESCE(v.due_at, DATEADD(millisecond,
               CAST(ROUND((COALESCE(v.delay, 0) - FLOOR(COALESCE(v.delay, 0) / 86400e0) * 86400e0) * 1000e0, 0) AS int),
               DATEADD(day, CAST(FLOOR(COALESCE(v.delay, 0) / 86400e0) AS int), @now))),
           CONVERT(varbinary(max), v.payload_hex, 2), v.headers
    FROM OPENJSON(@items) AS j
    CROSS APPLY OPENJSON(j.[value]) WITH (
        payload_hex nvarchar(max) '$.payload',
        headers     nvarchar(max) '$.headers' AS JSON,
        due_at      datetime2(6)  '$.due_at',
        delay       float         '$.delay'
    ) AS v;
    INSERT INTO {{items}} (id, due_at, payload, headers)
    SELECT s.id, s.due_at, s.payload, s.headers FROM @src AS s;
    SELECT s.id FROM @src AS s ORDER BY s.ord;
END

-- name: create_dequeue
-- The dequeue procedure, unchanged since pending_0001 (CREATE OR ALTER: the downgrade of
-- pending_0002 runs it again). It deletes through its TOP pick, with no
-- join to the picks, so pending_0002's and pending_0004's PostgreSQL changes have nothing
-- to fix here.

-- dequeue: ONE statement takes up to @batch due items, earliest due first (then id),
-- skipping rows others hold.
--
-- The plan it needs, and the only one its hints leave: a range seek of the clustered index
-- {{due_idx}} (due_at, id) from its low end to due_at <= @now, read in key order (the ORDER
-- BY's order, so no sort), TOP stopping after @n rows; READPAST skips keys other consumers
-- hold, UPDLOCK locks each key taken until the transaction ends; every column is in the
-- clustered row (no lookup); the DELETE then removes each taken row from the clustered
-- index and the primary key. A sort before TOP would read every due row, and under UPDLOCK
-- lock each of them until commit: the index order makes the sort needless, and
-- INDEX + FORCESEEK rule out a scan of the table. FORCESEEK takes no index parameters on the
-- target of a DELETE (this CTE's table), hence INDEX (...), FORCESEEK. Table hints:
-- https://learn.microsoft.com/en-us/sql/t-sql/queries/hints-transact-sql-table
-- Row versioning: UPDLOCK takes update locks whatever READ_COMMITTED_SNAPSHOT says, so the
-- pick is a locking read with RCSI on too and READPAST skips rows in flight as with it off
-- (reliable.sql, create_dequeue, says why READCOMMITTEDLOCK is not added).
CREATE OR ALTER PROCEDURE {{fn_dequeue}}
    @batch int = 1
AS
BEGIN
    SET NOCOUNT ON; SET ROWCOUNT 0;
    DECLARE @n int = CASE WHEN @batch > 0 THEN @batch ELSE 0 END;
    DECLARE @now datetime2(6) = SYSUTCDATETIME();
    DECLARE @taken TABLE (id bigint NOT NULL PRIMARY KEY, payload varbinary(max) NOT NULL,
                          headers nvarchar(max) NULL, enqueued_at datetime2(6) NOT NULL,
                          due_at datetime2(6) NOT NULL);
    WITH picked AS (
        SELECT TOP (@n) i.id, i.payload, i.headers, i.enqueued_at, i.due_at
        FROM {{items}} AS i WITH (UPDLOCK, READPAST, ROWLOCK, INDEX({{due_idx}}), FORCESEEK)
        WHERE i.due_at <= @now
        ORDER BY i.due_at, i.id
    )
    DELETE FROM picked
    OUTPUT deleted.id, deleted.payload, deleted.headers, deleted.enqueued_at, deleted.due_at
    INTO @taken (id, payload, headers, enqueued_at, due_at);
    -- OUTPUT returns rows in no defined order: hand the batch out in the queue's order,
    -- as PostgreSQL's dequeue does.
    SELECT t.id, t.payload, t.headers, t.enqueued_at, @now AS dequeued_at, t.due_at
    FROM @taken AS t ORDER BY t.due_at, t.id;
END

-- name: set_plan_guard
-- pending_0004 on PostgreSQL keeps the dequeue's cached generic plan off sequential scans;
-- sql/mssql/reliable.sql, set_plan_guard, says why nothing is set here. Empty on purpose.

-- name: reset_plan_guard
-- pending_0004 downgrade: nothing was set. Empty on purpose.

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
EXEC {{fn_enqueue}} @payload = :payload, @headers = :headers, @due_at = :due_at, @delay_seconds = :delay

-- name: enqueue_many
-- Client call: many items in one round trip (:items is the JSON array described above).
EXEC {{fn_enqueue_many}} @items = :items

-- name: dequeue
-- Client call: take (delete and return) up to :batch items.
EXEC {{fn_dequeue}} @batch = :batch

-- name: counts
-- Depth for `queuectl list`: items not yet due count as scheduled.
SELECT CAST(0 AS smallint) AS status, s.scheduled, COUNT_BIG(*) AS n
FROM (SELECT CAST(CASE WHEN i.due_at > SYSUTCDATETIME() THEN 1 ELSE 0 END AS bit) AS scheduled
      FROM {{items}} AS i) AS s
GROUP BY s.scheduled
