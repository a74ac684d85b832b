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

-- name: create_dequeue_0001
-- The dequeue procedure on the single meta and data tables, as reliable_0001 made it:
-- created by reliable_0001 and put back by the downgrade of reliable_0005.
--
-- The dequeue procedure, unchanged since reliable_0001 (CREATE OR ALTER: the downgrade of
-- reliable_0005 runs it again).
--
-- PostgreSQL's dequeue finds the picked rows through the primary key (a join to the picks
-- ran as a hash join over the whole meta table once the table had statistics) and reads the
-- payloads by the claimed ids as an array (a plan built for an empty table walked the data
-- table's whole primary key). Neither applies here: this procedure updates through the
-- TOP (@n) pick itself (the CTE is the UPDATE's target, no join to the picks), and joins the
-- data table to the ids it has just updated (OUTPUT into a table variable) by the clustered
-- primary key.

-- dequeue: claims up to @batch items and returns them with their payload.
--  1. Expired leases (their consumer died or stalled) go back to READY, or DEAD when that
--     was their last attempt: a bounded UPDATE through the filtered index on PROCESSING
--     rows, so the claim below reads only the ready index.
--  2. THE claim is ONE statement: the CTE picks up to @batch READY, due rows in
--     (priority, due_at, id) order with UPDLOCK, READPAST, ROWLOCK: concurrent consumers
--     skip each other's rows (READPAST), the picked keys stay locked until the update
--     (UPDLOCK), and no page or table lock blocks the others (ROWLOCK). UPDATE TOP has no
--     ORDER BY, hence the CTE: TOP with ORDER BY inside, the UPDATE through it. OUTPUT
--     returns the updated meta row joined to its payload in the same statement, into a
--     table variable (OUTPUT has no order): the batch is returned sorted from there.
-- The plans both statements need, pinned by their hints, are stated above each. A plan that
-- sorts before TOP would read every qualifying row first and, under UPDLOCK, lock each of
-- them until the transaction ends; an index whose key order is the ORDER BY, forced with
-- INDEX (...), makes the sort needless (table hints:
-- https://learn.microsoft.com/en-us/sql/t-sql/queries/hints-transact-sql-table).
-- Row versioning: UPDLOCK takes update locks whatever the database's READ_COMMITTED_SNAPSHOT
-- setting, so both picks are locking reads with RCSI on, and READPAST skips rows other
-- transactions hold exactly as with it off. READCOMMITTEDLOCK, which the table-hints page
-- names for READPAST under RCSI, is not added: beside UPDLOCK it is ignored (same page,
-- UPDLOCK), and the page allows one hint of the granularity group it shares with ROWLOCK.
-- READPAST is rejected under SNAPSHOT isolation (error 650): run consumers at READ
-- COMMITTED (the default), with RCSI on or off.
CREATE OR ALTER PROCEDURE {{fn_dequeue}}
    @batch         int           = 1,
    @lease_seconds float         = NULL,
    @worker        nvarchar(200) = NULL
AS
BEGIN
    SET NOCOUNT ON; SET ROWCOUNT 0;
    DECLARE @now datetime2(6) = SYSUTCDATETIME();
    DECLARE @n int = CASE WHEN @batch > 0 THEN @batch ELSE 0 END;
    -- leases are at most 7 days: the milliseconds fit DATEADD's int
    DECLARE @lease_ms int = CAST(ROUND(COALESCE(@lease_seconds, {{lease_seconds}}) * 1000e0, 0) AS int);

    -- Plan: a range seek of the filtered leased index {{leased_idx}} (leased_until)
    -- WHERE status = 1, from its low end to leased_until < @now, in key order (the ORDER BY),
    -- TOP stopping after @n rows, READPAST skipping keys others hold; each row taken is found
    -- by id in the clustered index, which the UPDATE writes anyway. INDEX + FORCESEEK leave
    -- only that seek (no scan of meta, no sort of every expired lease).
    WITH expired AS (
        SELECT TOP (@n) m.status, m.attempts, m.max_attempts, m.lease_owner, m.leased_until,
                        m.finished_at, m.last_error
        FROM {{meta}} AS m WITH (UPDLOCK, READPAST, ROWLOCK, INDEX({{leased_idx}}), FORCESEEK)
        WHERE m.status = 1 AND m.leased_until < @now
        ORDER BY m.leased_until
    )
    UPDATE expired SET
        status       = CASE WHEN attempts >= max_attempts THEN 3 ELSE 0 END,
        finished_at  = CASE WHEN attempts >= max_attempts THEN @now END,
        last_error   = CASE WHEN attempts >= max_attempts
                            THEN CONCAT(N'lease expired on its last attempt (', attempts,
                                        N' of ', max_attempts, N')')
                            ELSE last_error END,
        lease_owner  = CASE WHEN attempts >= max_attempts THEN lease_owner END,
        leased_until = NULL;

    DECLARE @claimed TABLE (
        id bigint NOT NULL PRIMARY KEY, priority smallint NOT NULL, due_at datetime2(6) NOT NULL,
        title nvarchar(400) NULL, attempts int NOT NULL, max_attempts int NOT NULL,
        enqueued_at datetime2(6) NOT NULL, dequeued_at datetime2(6) NULL,
        leased_until datetime2(6) NULL, payload varbinary(max) NOT NULL, headers nvarchar(max) NULL);
    -- Plan: an ordered scan of the filtered ready index {{ready_idx}} (priority, due_at, id)
    -- WHERE status = 0 in key order, which is the ORDER BY (no sort); due_at <= @now is
    -- tested on the index key, TOP stops after @n rows, READPAST skips keys other consumers
    -- hold and UPDLOCK keeps each taken key locked until commit. Each taken row is then found
    -- by id in the clustered index (a key lookup that the UPDATE needs anyway, since it writes
    -- that row: rows are looked up only once taken, so INCLUDE columns would save nothing)
    -- and moves from the ready index to the leased one. INDEX (...) rules out a scan of meta
    -- (rows of every status) and the sort it would need. FORCESEEK is not added: a seek needs
    -- a predicate on the leading key, priority, which the claim does not have (the hint would
    -- leave no plan: error 8622).
    WITH picked AS (
        -- every column the OUTPUT names: inserted.* of a CTE target has the CTE's columns
        SELECT TOP (@n) m.id, m.priority, m.due_at, m.status, m.title, m.attempts,
                        m.max_attempts, m.lease_owner, m.leased_until, m.enqueued_at,
                        m.dequeued_at
        FROM {{meta}} AS m WITH (UPDLOCK, READPAST, ROWLOCK, INDEX({{ready_idx}}))
        WHERE m.status = 0 AND m.due_at <= @now
        ORDER BY m.priority, m.due_at, m.id
    )
    UPDATE p SET
        status       = 1,
        attempts     = p.attempts + 1,
        lease_owner  = @worker,
        leased_until = DATEADD(millisecond, @lease_ms, @now),
        dequeued_at  = @now
    OUTPUT inserted.id, inserted.priority, inserted.due_at, inserted.title, inserted.attempts,
           inserted.max_attempts, inserted.enqueued_at, inserted.dequeued_at,
           inserted.leased_until, d.payload, d.headers
    INTO @claimed (id, priority, due_at, title, attempts, max_attempts, enqueued_at,
                   dequeued_at, leased_until, payload, headers)
    FROM picked AS p
    JOIN {{data}} AS d WITH (INDEX(1), FORCESEEK) ON d.id = p.id;
    -- The ORDER BY in the pick chooses WHICH rows (the oldest ready ones); OUTPUT returns
    -- them in no defined order. Hand the batch out in the queue's order, as PostgreSQL's
    -- dequeue does.
    SELECT c.id, c.priority, c.due_at, c.title, c.attempts, c.max_attempts, c.enqueued_at,
           c.dequeued_at, c.leased_until, c.payload, c.headers
    FROM @claimed AS c
    ORDER BY c.priority, c.due_at, c.id;
END

-- name: create_dequeue_0005
-- Empty: reliable_0005 changed PostgreSQL's dequeue only (create_dequeue_0001 says why SQL
-- Server's needs no change).

-- name: create_dequeue_0008
-- The single-table dequeue again (create_dequeue_0001's body): reliable_0008 changed
-- PostgreSQL's dequeue only, and the downgrade of reliable_0012 puts this body back.
--
-- The dequeue procedure, unchanged since reliable_0001 (CREATE OR ALTER: the downgrade of
-- reliable_0005 runs it again).
--
-- PostgreSQL's dequeue finds the picked rows through the primary key (a join to the picks
-- ran as a hash join over the whole meta table once the table had statistics) and reads the
-- payloads by the claimed ids as an array (a plan built for an empty table walked the data
-- table's whole primary key). Neither applies here: this procedure updates through the
-- TOP (@n) pick itself (the CTE is the UPDATE's target, no join to the picks), and joins the
-- data table to the ids it has just updated (OUTPUT into a table variable) by the clustered
-- primary key.

-- dequeue: claims up to @batch items and returns them with their payload.
--  1. Expired leases (their consumer died or stalled) go back to READY, or DEAD when that
--     was their last attempt: a bounded UPDATE through the filtered index on PROCESSING
--     rows, so the claim below reads only the ready index.
--  2. THE claim is ONE statement: the CTE picks up to @batch READY, due rows in
--     (priority, due_at, id) order with UPDLOCK, READPAST, ROWLOCK: concurrent consumers
--     skip each other's rows (READPAST), the picked keys stay locked until the update
--     (UPDLOCK), and no page or table lock blocks the others (ROWLOCK). UPDATE TOP has no
--     ORDER BY, hence the CTE: TOP with ORDER BY inside, the UPDATE through it. OUTPUT
--     returns the updated meta row joined to its payload in the same statement, into a
--     table variable (OUTPUT has no order): the batch is returned sorted from there.
-- The plans both statements need, pinned by their hints, are stated above each. A plan that
-- sorts before TOP would read every qualifying row first and, under UPDLOCK, lock each of
-- them until the transaction ends; an index whose key order is the ORDER BY, forced with
-- INDEX (...), makes the sort needless (table hints:
-- https://learn.microsoft.com/en-us/sql/t-sql/queries/hints-transact-sql-table).
-- Row versioning: UPDLOCK takes update locks whatever the database's READ_COMMITTED_SNAPSHOT
-- setting, so both picks are locking reads with RCSI on, and READPAST skips rows other
-- transactions hold exactly as with it off. READCOMMITTEDLOCK, which the table-hints page
-- names for READPAST under RCSI, is not added: beside UPDLOCK it is ignored (same page,
-- UPDLOCK), and the page allows one hint of the granularity group it shares with ROWLOCK.
-- READPAST is rejected under SNAPSHOT isolation (error 650): run consumers at READ
-- COMMITTED (the default), with RCSI on or off.
CREATE OR ALTER PROCEDURE {{fn_dequeue}}
    @batch         int           = 1,
    @lease_seconds float         = NULL,
    @worker        nvarchar(200) = NULL
AS
BEGIN
    SET NOCOUNT ON; SET ROWCOUNT 0;
    DECLARE @now datetime2(6) = SYSUTCDATETIME();
    DECLARE @n int = CASE WHEN @batch > 0 THEN @batch ELSE 0 END;
    -- leases are at most 7 days: the milliseconds fit DATEADD's int
    DECLARE @lease_ms int = CAST(ROUND(COALESCE(@lease_seconds, {{lease_seconds}}) * 1000e0, 0) AS int);

    -- Plan: a range seek of the filtered leased index {{leased_idx}} (leased_until)
    -- WHERE status = 1, from its low end to leased_until < @now, in key order (the ORDER BY),
    -- TOP stopping after @n rows, READPAST skipping keys others hold; each row taken is found
    -- by id in the clustered index, which the UPDATE writes anyway. INDEX + FORCESEEK leave
    -- only that seek (no scan of meta, no sort of every expired lease).
    WITH expired AS (
        SELECT TOP (@n) m.status, m.attempts, m.max_attempts, m.lease_owner, m.leased_until,
                        m.finished_at, m.last_error
        FROM {{meta}} AS m WITH (UPDLOCK, READPAST, ROWLOCK, INDEX({{leased_idx}}), FORCESEEK)
        WHERE m.status = 1 AND m.leased_until < @now
        ORDER BY m.leased_until
    )
    UPDATE expired SET
        status       = CASE WHEN attempts >= max_attempts THEN 3 ELSE 0 END,
        finished_at  = CASE WHEN attempts >= max_attempts THEN @now END,
        last_error   = CASE WHEN attempts >= max_attempts
                            THEN CONCAT(N'lease expired on its last attempt (', attempts,
                                        N' of ', max_attempts, N')')
                            ELSE last_error END,
        lease_owner  = CASE WHEN attempts >= max_attempts THEN lease_owner END,
        leased_until = NULL;

    DECLARE @claimed TABLE (
        id bigint NOT NULL PRIMARY KEY, priority smallint NOT NULL, due_at datetime2(6) NOT NULL,
        title nvarchar(400) NULL, attempts int NOT NULL, max_attempts int NOT NULL,
        enqueued_at datetime2(6) NOT NULL, dequeued_at datetime2(6) NULL,
        leased_until datetime2(6) NULL, payload varbinary(max) NOT NULL, headers nvarchar(max) NULL);
    -- Plan: an ordered scan of the filtered ready index {{ready_idx}} (priority, due_at, id)
    -- WHERE status = 0 in key order, which is the ORDER BY (no sort); due_at <= @now is
    -- tested on the index key, TOP stops after @n rows, READPAST skips keys other consumers
    -- hold and UPDLOCK keeps each taken key locked until commit. Each taken row is then found
    -- by id in the clustered index (a key lookup that the UPDATE needs anyway, since it writes
    -- that row: rows are looked up only once taken, so INCLUDE columns would save nothing)
    -- and moves from the ready index to the leased one. INDEX (...) rules out a scan of meta
    -- (rows of every status) and the sort it would need. FORCESEEK is not added: a seek needs
    -- a predicate on the leading key, priority, which the claim does not have (the hint would
    -- leave no plan: error 8622).
    WITH picked AS (
        -- every column the OUTPUT names: inserted.* of a CTE target has the CTE's columns
        SELECT TOP (@n) m.id, m.priority, m.due_at, m.status, m.title, m.attempts,
                        m.max_attempts, m.lease_owner, m.leased_until, m.enqueued_at,
                        m.dequeued_at
        FROM {{meta}} AS m WITH (UPDLOCK, READPAST, ROWLOCK, INDEX({{ready_idx}}))
        WHERE m.status = 0 AND m.due_at <= @now
        ORDER BY m.priority, m.due_at, m.id
    )
    UPDATE p SET
        status       = 1,
        attempts     = p.attempts + 1,
        lease_owner  = @worker,
        leased_until = DATEADD(millisecond, @lease_ms, @now),
        dequeued_at  = @now
    OUTPUT inserted.id, inserted.priority, inserted.due_at, inserted.title, inserted.attempts,
           inserted.max_attempts, inserted.enqueued_at, inserted.dequeued_at,
           inserted.leased_until, d.payload, d.headers
    INTO @claimed (id, priority, due_at, title, attempts, max_attempts, enqueued_at,
                   dequeued_at, leased_until, payload, headers)
    FROM picked AS p
    JOIN {{data}} AS d WITH (INDEX(1), FORCESEEK) ON d.id = p.id;
    -- The ORDER BY in the pick chooses WHICH rows (the oldest ready ones); OUTPUT returns
    -- them in no defined order. Hand the batch out in the queue's order, as PostgreSQL's
    -- dequeue does.
    SELECT c.id, c.priority, c.due_at, c.title, c.attempts, c.max_attempts, c.enqueued_at,
           c.dequeued_at, c.leased_until, c.payload, c.headers
    FROM @claimed AS c
    ORDER BY c.priority, c.due_at, c.id;
END

-- name: create_functions_0001
-- ack, nack, extend_lease and release on the single meta table, as reliable_0001 made them:
-- created by reliable_0001 and put back by the downgrade of reliable_0009.
--
-- The SQL API as stored procedures, callable from any language. CREATE OR ALTER keeps the
-- procedures' permissions when a revision runs this section again.
--
-- On PostgreSQL, ack, nack, extend_lease and release write their lease check so that it does
-- not match the leased index's predicate: plpgsql's cached generic plan read that whole
-- index on every call. These procedures take their ids from OPENJSON and check
-- `m.status = 1`, which matches the filtered leased index here too, and OPENJSON's row
-- estimate is a fixed guess, so the optimizer could scan the leased index or the table.
-- The plan they need: for each id of the list, one seek of the clustered primary key
-- (index 1, key id), the row checked (status, lease owner) and updated there; nothing else
-- is read or locked. WITH (INDEX(1), FORCESEEK) leaves only that access path (FORCESEEK
-- with an index but no column list: the parameterized form is refused on an UPDATE's
-- target; https://learn.microsoft.com/en-us/sql/t-sql/queries/hints-transact-sql-table).

-- ack: the items are done. Only the current lease holder (when @worker is given) may ack,
-- so a consumer whose lease expired and was taken over cannot finish the item twice.
-- @ids is a JSON array of ids. Returns one row: acked.
CREATE OR ALTER PROCEDURE {{fn_ack}}
    @ids    nvarchar(max),
    @worker nvarchar(200) = NULL
AS
BEGIN
    SET NOCOUNT ON; SET ROWCOUNT 0;
    UPDATE m SET status = 2, finished_at = SYSUTCDATETIME(), leased_until = NULL
    FROM {{meta}} AS m WITH (ROWLOCK, INDEX(1), FORCESEEK)
    WHERE m.id IN (SELECT i.id FROM OPENJSON(@ids) WITH (id bigint '$') AS i)
      AND m.status = 1
      AND (@worker IS NULL OR m.lease_owner = @worker);
    SELECT @@ROWCOUNT AS acked;
END
GO
-- nack: the attempt failed. The item is READY again after an exponential backoff
-- (@base_seconds * 2^(attempts-1), at most @max_seconds), or DEAD when its attempts are
-- used up. Returns each item's new status (id, status, due_at).
CREATE OR ALTER PROCEDURE {{fn_nack}}
    @ids          nvarchar(max),
    @error        nvarchar(4000) = NULL,
    @worker       nvarchar(200)  = NULL,
    @base_seconds float          = NULL,
    @max_seconds  float          = NULL
AS
BEGIN
    SET NOCOUNT ON; SET ROWCOUNT 0;
    DECLARE @now datetime2(6) = SYSUTCDATETIME();
    DECLARE @base float = COALESCE(@base_seconds, {{backoff_base_seconds}});
    DECLARE @max float = COALESCE(@max_seconds, {{backoff_max_seconds}});
    UPDATE m SET
        status       = CASE WHEN m.attempts >= m.max_attempts THEN 3 ELSE 0 END,
        due_at       = CASE WHEN m.attempts >= m.max_attempts THEN m.due_at
                            ELSE DATEADD(millisecond, s.ms, DATEADD(day, s.days, @now)) END,
        finished_at  = CASE WHEN m.attempts >= m.max_attempts THEN @now END,
        leased_until = NULL,
        last_error   = @error
    OUTPUT inserted.id, inserted.status, inserted.due_at
    FROM {{meta}} AS m WITH (ROWLOCK, INDEX(1), FORCESEEK)
    CROSS APPLY (
        SELECT @base * POWER(2e0, CASE WHEN m.attempts < 1 THEN 0
                                       WHEN m.attempts > 41 THEN 40
                                       ELSE m.attempts - 1 END) AS raw
    ) AS r
    CROSS APPLY (SELECT CASE WHEN r.raw < @max THEN r.raw ELSE @max END AS seconds) AS b
    CROSS APPLY (
        SELECT CAST(FLOOR(b.seconds / 86400e0) AS int) AS days,
               CAST(ROUND((b.seconds - FLOOR(b.seconds / 86400e0) * 86400e0) * 1000e0, 0) AS int) AS ms
    ) AS s
    WHERE m.id IN (SELECT i.id FROM OPENJSON(@ids) WITH (id bigint '$') AS i)
      AND m.status = 1
      AND (@worker IS NULL OR m.lease_owner = @worker);
END
GO
-- extend_lease: a slow handler keeps its items (heartbeat). Returns the items still held
-- (id, leased_until).
CREATE OR ALTER PROCEDURE {{fn_extend_lease}}
    @ids           nvarchar(max),
    @lease_seconds float         = NULL,
    @worker        nvarchar(200) = NULL
AS
BEGIN
    SET NOCOUNT ON; SET ROWCOUNT 0;
    DECLARE @lease_ms int = CAST(ROUND(COALESCE(@lease_seconds, {{lease_seconds}}) * 1000e0, 0) AS int);
    UPDATE m SET leased_until = DATEADD(millisecond, @lease_ms, SYSUTCDATETIME())
    OUTPUT inserted.id, inserted.leased_until
    FROM {{meta}} AS m WITH (ROWLOCK, INDEX(1), FORCESEEK)
    WHERE m.id IN (SELECT i.id FROM OPENJSON(@ids) WITH (id bigint '$') AS i)
      AND m.status = 1
      AND (@worker IS NULL OR m.lease_owner = @worker);
END
GO
-- release: give items back untouched (a consumer shutting down), without using up an
-- attempt. Returns one row: released.
CREATE OR ALTER PROCEDURE {{fn_release}}
    @ids    nvarchar(max),
    @worker nvarchar(200) = NULL
AS
BEGIN
    SET NOCOUNT ON; SET ROWCOUNT 0;
    UPDATE m SET
        status       = 0,
        attempts     = CASE WHEN m.attempts > 0 THEN m.attempts - 1 ELSE 0 END,
        leased_until = NULL,
        lease_owner  = NULL
    FROM {{meta}} AS m WITH (ROWLOCK, INDEX(1), FORCESEEK)
    WHERE m.id IN (SELECT i.id FROM OPENJSON(@ids) WITH (id bigint '$') AS i)
      AND m.status = 1
      AND (@worker IS NULL OR m.lease_owner = @worker);
    SELECT @@ROWCOUNT AS released;
END

-- name: create_functions_0009
-- The single-table procedures again (create_functions_0001's bodies): reliable_0009 changed
-- PostgreSQL's lease checks only, and the downgrade of reliable_0012 puts these bodies back.
--
-- The SQL API as stored procedures, callable from any language. CREATE OR ALTER keeps the
-- procedures' permissions when a revision runs this section again.
--
-- On PostgreSQL, ack, nack, extend_lease and release write their lease check so that it does
-- not match the leased index's predicate: plpgsql's cached generic plan read that whole
-- index on every call. These procedures take their ids from OPENJSON and check
-- `m.status = 1`, which matches the filtered leased index here too, and OPENJSON's row
-- estimate is a fixed guess, so the optimizer could scan the leased index or the table.
-- The plan they need: for each id of the list, one seek of the clustered primary key
-- (index 1, key id), the row checked (status, lease owner) and updated there; nothing else
-- is read or locked. WITH (INDEX(1), FORCESEEK) leaves only that access path (FORCESEEK
-- with an index but no column list: the parameterized form is refused on an UPDATE's
-- target; https://learn.microsoft.com/en-us/sql/t-sql/queries/hints-transact-sql-table).

-- ack: the items are done. Only the current lease holder (when @worker is given) may ack,
-- so a consumer whose lease expired and was taken over cannot finish the item twice.
-- @ids is a JSON array of ids. Returns one row: acked.
CREATE OR ALTER PROCEDURE {{fn_ack}}
    @ids    nvarchar(max),
    @worker nvarchar(200) = NULL
AS
BEGIN
    SET NOCOUNT ON; SET ROWCOUNT 0;
    UPDATE m SET status = 2, finished_at = SYSUTCDATETIME(), leased_until = NULL
    FROM {{meta}} AS m WITH (ROWLOCK, INDEX(1), FORCESEEK)
    WHERE m.id IN (SELECT i.id FROM OPENJSON(@ids) WITH (id bigint '$') AS i)
      AND m.status = 1
      AND (@worker IS NULL OR m.lease_owner = @worker);
    SELECT @@ROWCOUNT AS acked;
END
GO
-- nack: the attempt failed. The item is READY again after an exponential backoff
-- (@base_seconds * 2^(attempts-1), at most @max_seconds), or DEAD when its attempts are
-- used up. Returns each item's new status (id, status, due_at).
CREATE OR ALTER PROCEDURE {{fn_nack}}
    @ids          nvarchar(max),
    @error        nvarchar(4000) = NULL,
    @worker       nvarchar(200)  = NULL,
    @base_seconds float          = NULL,
    @max_seconds  float          = NULL
AS
BEGIN
    SET NOCOUNT ON; SET ROWCOUNT 0;
    DECLARE @now datetime2(6) = SYSUTCDATETIME();
    DECLARE @base float = COALESCE(@base_seconds, {{backoff_base_seconds}});
    DECLARE @max float = COALESCE(@max_seconds, {{backoff_max_seconds}});
    UPDATE m SET
        status       = CASE WHEN m.attempts >= m.max_attempts THEN 3 ELSE 0 END,
        due_at       = CASE WHEN m.attempts >= m.max_attempts THEN m.due_at
                            ELSE DATEADD(millisecond, s.ms, DATEADD(day, s.days, @now)) END,
        finished_at  = CASE WHEN m.attempts >= m.max_attempts THEN @now END,
        leased_until = NULL,
        last_error   = @error
    OUTPUT inserted.id, inserted.status, inserted.due_at
    FROM {{meta}} AS m WITH (ROWLOCK, INDEX(1), FORCESEEK)
    CROSS APPLY (
        SELECT @base * POWER(2e0, CASE WHEN m.attempts < 1 THEN 0
                                       WHEN m.attempts > 41 THEN 40
                                       ELSE m.attempts - 1 END) AS raw
    ) AS r
    CROSS APPLY (SELECT CASE WHEN r.raw < @max THEN r.raw ELSE @max END AS seconds) AS b
    CROSS APPLY (
        SELECT CAST(FLOOR(b.seconds / 86400e0) AS int) AS days,
               CAST(ROUND((b.seconds - FLOOR(b.seconds / 86400e0) * 86400e0) * 1000e0, 0) AS int) AS ms
    ) AS s
    WHERE m.id IN (SELECT i.id FROM OPENJSON(@ids) WITH (id bigint '$') AS i)
      AND m.status = 1
      AND (@worker IS NULL OR m.lease_owner = @worker);
END
GO
-- extend_lease: a slow handler keeps its items (heartbeat). Returns the items still held
-- (id, leased_until).
CREATE OR ALTER PROCEDURE {{fn_extend_lease}}
    @ids           nvarchar(max),
    @lease_seconds float         = NULL,
    @worker        nvarchar(200) = NULL
AS
BEGIN
    SET NOCOUNT ON; SET ROWCOUNT 0;
    DECLARE @lease_ms int = CAST(ROUND(COALESCE(@lease_seconds, {{lease_seconds}}) * 1000e0, 0) AS int);
    UPDATE m SET leased_until = DATEADD(millisecond, @lease_ms, SYSUTCDATETIME())
    OUTPUT inserted.id, inserted.leased_until
    FROM {{meta}} AS m WITH (ROWLOCK, INDEX(1), FORCESEEK)
    WHERE m.id IN (SELECT i.id FROM OPENJSON(@ids) WITH (id bigint '$') AS i)
      AND m.status = 1
      AND (@worker IS NULL OR m.lease_owner = @worker);
END
GO
-- release: give items back untouched (a consumer shutting down), without using up an
-- attempt. Returns one row: released.
CREATE OR ALTER PROCEDURE {{fn_release}}
    @ids    nvarchar(max),
    @worker nvarchar(200) = NULL
AS
BEGIN
    SET NOCOUNT ON; SET ROWCOUNT 0;
    UPDATE m SET
        status       = 0,
        attempts     = CASE WHEN m.attempts > 0 THEN m.attempts - 1 ELSE 0 END,
        leased_until = NULL,
        lease_owner  = NULL
    FROM {{meta}} AS m WITH (ROWLOCK, INDEX(1), FORCESEEK)
    WHERE m.id IN (SELECT i.id FROM OPENJSON(@ids) WITH (id bigint '$') AS i)
      AND m.status = 1
      AND (@worker IS NULL OR m.lease_owner = @worker);
    SELECT @@ROWCOUNT AS released;
END

-- name: create_enqueue_functions_0010
-- enqueue and enqueue_many on the single meta and data tables, as reliable_0010 made them:
-- created by reliable_0010 and put back by the downgrade of reliable_0012.
--
-- reliable_0010: the limit covers everything one message stores. enqueue and enqueue_many
-- refuse a message whose payload, title and headers together are over the queue's
-- max_payload_bytes, counted as stored: DATALENGTH of each (title and headers are nvarchar
-- here, two bytes per UTF-16 code unit). Error 50413 as before (the client raises
-- PayloadTooLarge), with the three sizes in the message, before anything is written, so a
-- refused call stores nothing. The title travels as nvarchar(max) (reliable_0003's
-- nvarchar(400) parameter cut a longer title silently): a title longer than the column's
-- 400 characters is now refused by the insert instead of stored shortened. CREATE OR
-- ALTER keeps the procedures' permissions (queuectl grant); the downgrade puts back
-- history/reliable.sql: create_enqueue_functions_0003.

-- enqueue one item; returns its id (one row, column id). Two inserts, one transaction:
-- XACT_ABORT rolls both back on any error (and the caller's transaction with them).
CREATE OR ALTER PROCEDURE {{fn_enqueue}}
    @payload       varbinary(max),
    @headers       nvarchar(max) = NULL,
    @priority      smallint      = 0,
    @delay_seconds float         = 0,
    @title         nvarchar(max) = NULL,
    @max_attempts  int           = NULL
AS
BEGIN
    SET NOCOUNT ON; SET ROWCOUNT 0;
    SET XACT_ABORT ON;
    DECLARE @payload_bytes bigint = DATALENGTH(@payload);
    DECLARE @title_bytes bigint = ISNULL(DATALENGTH(@title), 0);
    DECLARE @headers_bytes bigint = ISNULL(DATALENGTH(@headers), 0);
    IF @payload_bytes + @title_bytes + @headers_bytes > {{max_payload_bytes}}
    BEGIN
        DECLARE @refused nvarchar(400) = CONCAT(N'queue ''', {{queue_literal}}, N''': message of ',
            @payload_bytes + @title_bytes + @headers_bytes, N' bytes (payload ', @payload_bytes,
            N' + title ', @title_bytes, N' + headers ', @headers_bytes, N') is over max_payload_bytes ',
            {{max_payload_bytes}}, N': nothing was enqueued');
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
-- "priority": n, "delay": seconds, "title": "..."} (create_enqueue_functions says why JSON).
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
        title    nvarchar(max)  NULL
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
        title       nvarchar(max) '$.title'
    ) AS v;
    -- the first message over the limit refuses the whole call, before anything is written
    DECLARE @big_ord int, @payload_bytes bigint, @title_bytes bigint, @headers_bytes bigint, @count int;
    SELECT @count = COUNT(*) FROM @src;
    SELECT TOP (1) @big_ord = s.ord + 1, @payload_bytes = s.payload_bytes, @title_bytes = s.title_bytes,
                   @headers_bytes = s.headers_bytes
    FROM (
        SELECT src.ord, CAST(DATALENGTH(src.payload) AS bigint) AS payload_bytes,
               CAST(ISNULL(DATALENGTH(src.title), 0) AS bigint) AS title_bytes,
               CAST(ISNULL(DATALENGTH(src.headers), 0) AS bigint) AS headers_bytes
        FROM @src AS src
    ) AS s
    WHERE s.payload_bytes + s.title_bytes + s.headers_bytes > {{max_payload_bytes}}
    ORDER BY s.ord;
    IF @big_ord IS NOT NULL
    BEGIN
        DECLARE @refused nvarchar(400) = CONCAT(N'queue ''', {{queue_literal}}, N''': message ', @big_ord,
            N' of ', @count, N' is ', @payload_bytes + @title_bytes + @headers_bytes, N' bytes (payload ',
            @payload_bytes, N' + title ', @title_bytes, N' + headers ', @headers_bytes,
            N'), over max_payload_bytes ', {{max_payload_bytes}}, N': nothing was enqueued');
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
