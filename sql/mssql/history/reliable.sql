-- Reliable queue sections that later revisions replaced on SQL Server, each named for the revision that
-- installed it: a queue installed at an older revision runs it, and so does the downgrade
-- that puts the body back. What a fresh install creates today is in ../reliable.sql.

-- name: create_enqueue_functions_0001
-- enqueue and enqueue_many as reliable_0001 made them (no payload limit): created by
-- reliable_0001 and put back by the downgrade of reliable_0003. CREATE OR ALTER keeps
-- the procedures' permissions (queuectl grant).

-- enqueue one item; returns its id (one row, column id). Two inserts, one transaction:
-- XACT_ABORT rolls both back on any error (and the caller's transaction with them).
CREATE OR ALTER PROCEDURE {{fn_enqueue}}
    @payload       varbinary(max),
    @headers       nvarchar(max) = NULL,
    @priority      smallint      = 0,
    @delay_seconds float         = 0,
    @title         nvarchar(400) = NULL,
    @max_attempts  int           = NULL
AS
BEGIN
    SET NOCOUNT ON; SET ROWCOUNT 0;
    SET XACT_ABORT ON;
    DECLARE @id bigint = NEXT VALUE FOR {{meta_seq}};
    DECLARE @delay float = COALESCE(@delay_seconds, 0);
    -- DATEADD takes an int: whole days, then the remaining milliseconds (delays up to years).
    DECLARE @due datetime2(6) = DATEADD(millisecond,
        CAST(ROUND((@delay - FLOOR(@delay / 86400e0) * 86400e0) * 1000e0, 0) AS int),
        DATEADD(day, CAST(FLOOR(@delay / 86400e0) AS int), SYSUTCDATETIME()));
    BEGIN TRANSACTION;
    INSERT INTO {{meta}} (id, priority, due_at, title, max_attempts)
    VALUES (@id, COALESCE(@priority, 0), @due, @title, COALESCE(@max_attempts, {{max_attempts}}));
    INSERT INTO {{data}} (id, payload, headers) VALUES (@id, @payload, @headers);
    COMMIT TRANSACTION;
    SELECT @id AS id;
END
GO
-- enqueue many items in one call; ids come back in input order.
-- Input: @items, a JSON array of objects {"payload": "<hex>", "headers": {...} | null,
-- "priority": n, "delay": seconds, "title": "..."}. JSON rather than a table-valued
-- parameter: any language and driver can send a string (pyodbc's TVP support and most
-- ORMs' cannot bind a TVP), and a TVP would need a user-defined table type that every
-- later change of the procedure's input has to drop and recreate. Payloads travel as hex
-- (CONVERT style 2), which JSON can carry and T-SQL decodes without XML tricks.
CREATE OR ALTER PROCEDURE {{fn_enqueue_many}}
    @items        nvarchar(max),
    @max_attempts int = NULL
AS
BEGIN
    SET NOCOUNT ON; SET ROWCOUNT 0;
    SET XACT_ABORT ON;
    DECLARE @now datetime2(6) = SYSUTCDATETIME();
    DECLARE @src TABLE (
        ord      int            NOT NULL PRIMARY KEY,
        id       bigint         NOT NULL,
        payload  varbinary(max) NOT NULL,
        headers  nvarchar(max)  NULL,
        priority smallint       NULL,
        delay    float          NULL,
        title    nvarchar(400)  NULL
    );
    -- Ids drawn from the sequence in input order, before anything is written.
    INSERT INTO @src (ord, id, payload, headers, priority, delay, title)
    SELECT CAST(j.[key] AS int),
           NEXT VALUE FOR {{meta_seq}} OVER (ORDER BY CAST(j.[key] AS int)),
           CONVERT(varbinary(max), v.payload_hex, 2), v.headers, v.priority, v.delay, v.title
    FROM OPENJSON(@items) AS j
    CROSS APPLY OPENJSON(j.[value]) WITH (
        payload_hex nvarchar(max) '$.payload',
        headers     nvarchar(max) '$.headers' AS JSON,
        priority    smallint      '$.priority',
        delay       float         '$.delay',
        title       nvarchar(400) '$.title'
    ) AS v;
    BEGIN TRANSACTION;
    INSERT INTO {{meta}} (id, priority, due_at, title, max_attempts)
    SELECT s.id, COALESCE(s.priority, 0),
           DATEADD(millisecond,
               CAST(ROUND((COALESCE(s.delay, 0) - FLOOR(COALESCE(s.delay, 0) / 86400e0) * 86400e0) * 1000e0, 0) AS int),
               DATEADD(day, CAST(FLOOR(COALESCE(s.delay, 0) / 86400e0) AS int), @now)),
           s.title, COALESCE(@max_attempts, {{max_attempts}})
    FROM @src AS s;
    INSERT INTO {{data}} (id, payload, headers)
    SELECT s.id, s.payload, s.headers FROM @src AS s;
    COMMIT TRANSACTION;
    SELECT s.id FROM @src AS s ORDER BY s.ord;
END

-- name: create_enqueue_functions_0003
-- reliable_0003: enqueue and enqueue_many refuse a payload larger than the queue's
-- max_payload_bytes with error 50413 (the client raises PayloadTooLarge), before anything
-- is written, so a refused call stores nothing: with enqueue_many, not even the payloads
-- within the limit.

-- enqueue one item; returns its id (one row, column id). Two inserts, one transaction:
-- XACT_ABORT rolls both back on any error (and the caller's transaction with them).
CREATE OR ALTER PROCEDURE {{fn_enqueue}}
    @payload       varbinary(max),
    @headers       nvarchar(max) = NULL,
    @priority      smallint      = 0,
    @delay_seconds float         = 0,
    @title         nvarchar(400) = NULL,
    @max_attempts  int           = NULL
AS
BEGIN
    SET NOCOUNT ON; SET ROWCOUNT 0;
    SET XACT_ABORT ON;
    IF DATALENGTH(@payload) > {{max_payload_bytes}}
    BEGIN
        DECLARE @refused nvarchar(400) = CONCAT(N'queue ''', {{queue_literal}}, N''': payload of ',
            DATALENGTH(@payload), N' bytes is over max_payload_bytes ', {{max_payload_bytes}},
            N': nothing was enqueued');
        THROW 50413, @refused, 1;
    END;
    DECLARE @id bigint = NEXT VALUE FOR {{meta_seq}};
    DECLARE @delay float = COALESCE(@delay_seconds, 0);
    -- DATEADD takes an int: whole days, then the remaining milliseconds (delays up to years).
    DECLARE @due datetime2(6) = DATEADD(millisecond,
        CAST(ROUND((@delay - FLOOR(@delay / 86400e0) * 86400e0) * 1000e0, 0) AS int),
        DATEADD(day, CAST(FLOOR(@delay / 86400e0) AS int), SYSUTCDATETIME()));
    BEGIN TRANSACTION;
    INSERT INTO {{meta}} (id, priority, due_at, title, max_attempts)
    VALUES (@id, COALESCE(@priority, 0), @due, @title, COALESCE(@max_attempts, {{max_attempts}}));
    INSERT INTO {{data}} (id, payload, headers) VALUES (@id, @payload, @headers);
    COMMIT TRANSACTION;
    SELECT @id AS id;
END
GO
-- enqueue many items in one call; ids come back in input order.
-- Input: @items, a JSON array of objects {"payload": "<hex>", "headers": {...} | null,
-- "priority": n, "delay": seconds, "title": "..."}. JSON rather than a table-valued
-- parameter: any language and driver can send a string (pyodbc's TVP support and most
-- ORMs' cannot bind a TVP), and a TVP would need a user-defined table type that every
-- later change of the procedure's input has to drop and recreate. Payloads travel as hex
-- (CONVERT style 2), which JSON can carry and T-SQL decodes without XML tricks.
CREATE OR ALTER PROCEDURE {{fn_enqueue_many}}
    @items        nvarchar(max),
    @max_attempts int = NULL
AS
BEGIN
    SET NOCOUNT ON; SET ROWCOUNT 0;
    SET XACT_ABORT ON;
    DECLARE @now datetime2(6) = SYSUTCDATETIME();
    DECLARE @src TABLE (
        ord      int            NOT NULL PRIMARY KEY,
        id       bigint         NOT NULL,
        payload  varbinary(max) NOT NULL,
        headers  nvarchar(max)  NULL,
        priority smallint       NULL,
        delay    float          NULL,
        title    nvarchar(400)  NULL
    );
    -- Ids drawn from the sequence in input order, before anything is written.
    INSERT INTO @src (ord, id, payload, headers, priority, delay, title)
    SELECT CAST(j.[key] AS int),
           NEXT VALUE FOR {{meta_seq}} OVER (ORDER BY CAST(j.[key] AS int)),
           CONVERT(varbinary(max), v.payload_hex, 2), v.headers, v.priority, v.delay, v.title
    FROM OPENJSON(@items) AS j
    CROSS APPLY OPENJSON(j.[value]) WITH (
        payload_hex nvarchar(max) '$.payload',
        headers     nvarchar(max) '$.headers' AS JSON,
        priority    smallint      '$.priority',
        delay       float         '$.delay',
        title       nvarchar(400) '$.title'
    ) AS v;
    -- the first payload over the limit refuses the whole call, before anything is written
    DECLARE @big_ord int, @big_bytes bigint, @count int;
    SELECT @count = COUNT(*) FROM @src;
    SELECT TOP (1) @big_ord = s.ord + 1, @big_bytes = DATALENGTH(s.payload)
    FROM @src AS s
    WHERE DATALENGTH(s.payload) > {{max_payload_bytes}}
    ORDER BY s.ord;
    IF @big_ord IS NOT NULL
    BEGIN
        DECLARE @refused nvarchar(400) = CONCAT(N'queue ''', {{queue_literal}}, N''': payload ', @big_ord,
            N' of ', @count, N' is ', @big_bytes, N' bytes, over max_payload_bytes ',
            {{max_payload_bytes}}, N': nothing was enqueued');
        THROW 50413, @refused, 1;
    END;
    BEGIN TRANSACTION;
    INSERT INTO {{meta}} (id, priority, due_at, title, max_attempts)
    SELECT s.id, COALESCE(s.priority, 0),
           DATEADD(millisecond,
               CAST(ROUND((COALESCE(s.delay, 0) - FLOOR(COALESCE(s.delay, 0) / 86400e0) * 86400e0) * 1000e0, 0) AS int),
               DATEADD(day, CAST(FLOOR(COALESCE(s.delay, 0) / 86400e0) AS int), @now)),
           s.title, COALESCE(@max_attempts, {{max_attempts}})
    FROM @src AS s;
    INSERT INTO {{data}} (id, payload, headers)
    SELECT s.id, s.payload, s.headers FROM @src AS s;
    COMMIT TRANSACTION;
    SELECT s.id FROM @src AS s ORDER BY s.ord;
END

-- name: create_dequeue_0005
-- Empty: reliable_0005 changed PostgreSQL's dequeue only (reliable.sql: create_dequeue says why SQL
-- Server's needs no change).

-- name: create_dequeue_0008
-- Empty: reliable_0008 changed PostgreSQL's dequeue only (reliable.sql: create_dequeue says why SQL
-- Server's needs no change).

-- name: create_functions_0009
-- Empty: reliable_0009 changed PostgreSQL's lease checks only (reliable.sql:
-- create_functions says why SQL Server's procedures are left as they are).

-- name: create_functions_0012
-- reliable_0012 replaces these functions on PostgreSQL only (the generation layout); SQL
-- Server keeps today's bodies (../reliable.sql: create_rotation says why). Empty on purpose.

-- name: create_dequeue_0012
-- As create_functions_0012: nothing to replace on SQL Server. Empty on purpose.

-- name: create_enqueue_functions_0012
-- As create_functions_0012: nothing to replace on SQL Server. Empty on purpose.

-- name: create_rotator_0012
-- As create_functions_0012: no rotator on SQL Server. Empty on purpose.

-- name: create_functions_0013
-- reliable_0013 replaces these functions on PostgreSQL only (extend_lease, nack and release on
-- the generation slots' tables); SQL Server keeps today's bodies (../reliable.sql:
-- create_rotation says why). Empty on purpose.
