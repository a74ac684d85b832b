-- The reliable status queue on SQL Server (2017 or later, as every kind: DROP ... IF EXISTS
-- and OPENJSON are 2016's, compatibility level 130+; the ring's and the watermark's
-- sys.sequences.last_used_value and STRING_AGG are 2017's). The same sections as
-- sql/postgresql/reliable.sql.
--
-- Layout: <queue>_meta holds only what dequeue searches and updates (narrow rows, so a
-- dequeue touches few pages); <queue>_data holds the payload, written once at enqueue and
-- read once at dequeue; <queue>_history receives finished rows from the archive job.
--
-- status codes (smallint, so the ready index stays narrow):
--   0 READY       waiting; "scheduled" while due_at > SYSUTCDATETIME()
--   1 PROCESSING  leased to lease_owner until leased_until
--   2 DONE        acknowledged (finished_at set); the archive job moves it to history
--   3 DEAD        failed max_attempts times (last_error says why)
--
-- Times are datetime2(6) in UTC (SYSUTCDATETIME()): no time zone arithmetic in any
-- predicate, and pyodbc reads datetime2 natively.
--
-- Batches inside a section are separated by GO lines: the installer sends each batch on
-- its own, and `queuectl install --sql` prints them with GO (CREATE PROCEDURE must be the
-- first statement of its batch). Everything runs with QUOTED_IDENTIFIER and ANSI_NULLS ON
-- (catalog.sql:session_settings): the identifiers are double-quoted, and filtered indexes
-- need both settings in every session that writes the table, which procedures created
-- under them guarantee.
--
-- Every procedure and trigger of every T-SQL file, and the jobs' batches that move rows,
-- start with SET NOCOUNT ON (no "rows affected" messages between result sets) and
-- SET ROWCOUNT 0: a caller's session left at SET ROWCOUNT n would otherwise stop their
-- claims, moves and deletes after n rows, and refuse NEXT VALUE FOR altogether. A SET made
-- inside a procedure or trigger is undone when it returns, so the caller's setting is left
-- as it was (https://learn.microsoft.com/sql/t-sql/statements/set-rowcount-transact-sql,
-- https://learn.microsoft.com/sql/t-sql/statements/set-statements-transact-sql).
--
-- Sections are filled by queuectl.sqlfiles.render() with quoted identifiers only.

-- name: create_tables
-- The queue's id sequence, tables and indexes.

-- Ids come from a sequence (not IDENTITY) so enqueue_many can draw them in input order
-- before it writes (NEXT VALUE FOR ... OVER (ORDER BY ...)), as PostgreSQL's nextval does.
CREATE SEQUENCE {{meta_seq}} AS bigint START WITH 1 INCREMENT BY 1 CACHE 1000;
GO
-- FILLFACTOR 80 leaves room on each page for rows that grow when leased or nacked
-- (lease_owner, last_error), so ack/nack/dequeue updates split fewer pages after a
-- rebuild or reorganize compacts the table.
CREATE TABLE {{meta}} (
    id            bigint        NOT NULL DEFAULT (NEXT VALUE FOR {{meta_seq}}),
    priority      smallint      NOT NULL DEFAULT 0,
    due_at        datetime2(6)  NOT NULL DEFAULT SYSUTCDATETIME(),
    status        smallint      NOT NULL DEFAULT 0 CHECK (status BETWEEN 0 AND 3),
    title         nvarchar(400) NULL,
    attempts      int           NOT NULL DEFAULT 0,
    max_attempts  int           NOT NULL DEFAULT {{max_attempts}} CHECK (max_attempts > 0),
    lease_owner   nvarchar(200) NULL,
    leased_until  datetime2(6)  NULL,
    enqueued_at   datetime2(6)  NOT NULL DEFAULT SYSUTCDATETIME(),
    dequeued_at   datetime2(6)  NULL,
    finished_at   datetime2(6)  NULL,
    last_error    nvarchar(4000) NULL,
    PRIMARY KEY CLUSTERED (id) WITH (FILLFACTOR = 80)
);
GO
-- No ON DELETE CASCADE: the archive job deletes the data row first, then the meta row,
-- each with OUTPUT, so the payload reaches history in the same transaction.
CREATE TABLE {{data}} (
    id       bigint         NOT NULL PRIMARY KEY CLUSTERED,
    payload  varbinary(max) NOT NULL,
    headers  nvarchar(max)  NULL CHECK (headers IS NULL OR ISJSON(headers) = 1),
    FOREIGN KEY (id) REFERENCES {{meta}} (id)
);
GO
-- Only READY rows are in this filtered index, so its size follows the backlog, not the
-- table; the dequeue's ORDER BY is its key order, so the pick is an ordered range seek.
CREATE INDEX {{ready_idx}} ON {{meta}} (priority, due_at, id) WHERE status = 0;
GO
-- Only PROCESSING rows: finds expired leases without scanning the ready backlog.
CREATE INDEX {{leased_idx}} ON {{meta}} (leased_until) WHERE status = 1;
GO
-- Only finished rows (DONE, DEAD): the archive job picks its batches here, oldest first
-- (ORDER BY status, finished_at is the key order), without walking the ready backlog or
-- re-reading rows it cannot move yet.
CREATE INDEX {{finished_idx}} ON {{meta}} (status, finished_at) WHERE status >= 2;
GO
-- The OUTPUT ... INTO target of the archive job: no triggers, no foreign keys, no CHECK
-- constraints (SQL Server refuses them on an OUTPUT INTO table).
CREATE TABLE {{history}} (
    id            bigint         NOT NULL PRIMARY KEY CLUSTERED,
    priority      smallint       NOT NULL,
    due_at        datetime2(6)   NOT NULL,
    status        smallint       NOT NULL,
    title         nvarchar(400)  NULL,
    attempts      int            NOT NULL,
    max_attempts  int            NOT NULL,
    lease_owner   nvarchar(200)  NULL,
    enqueued_at   datetime2(6)   NOT NULL,
    dequeued_at   datetime2(6)   NULL,
    finished_at   datetime2(6)   NULL,
    last_error    nvarchar(4000) NULL,
    payload       varbinary(max) NULL,
    headers       nvarchar(max)  NULL,
    archived_at   datetime2(6)   NOT NULL DEFAULT SYSUTCDATETIME()
);
GO
-- History retention purges oldest-archived first, in small batches (purge_history_batch).
CREATE INDEX {{history_at_idx}} ON {{history}} (archived_at);

-- name: create_functions
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

-- name: create_dequeue
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

-- name: create_enqueue_functions
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

-- name: drop_functions
-- Remove the SQL API.
DROP PROCEDURE IF EXISTS {{fn_release}};
DROP PROCEDURE IF EXISTS {{fn_extend_lease}};
DROP PROCEDURE IF EXISTS {{fn_nack}};
DROP PROCEDURE IF EXISTS {{fn_ack}};
DROP PROCEDURE IF EXISTS {{fn_dequeue}};
DROP PROCEDURE IF EXISTS {{fn_enqueue_many}};
DROP PROCEDURE IF EXISTS {{fn_enqueue}};

-- name: drop_tables
-- Remove the queue's tables (and with them their indexes), then its sequence.
DROP TABLE IF EXISTS {{history}};
DROP TABLE IF EXISTS {{data}};
DROP TABLE IF EXISTS {{meta}};
DROP SEQUENCE IF EXISTS {{meta_seq}};

-- name: create_ack_dequeue
-- reliable_0004: a consumer acks the batch it finished and claims its next batch in ONE
-- call and one transaction (one round trip, one log flush at commit, where ack then
-- dequeue cost two of each). The ack is ack's UPDATE restated here, because ack returns
-- a result set (acked) that would come before the batch; the claim is the dequeue
-- procedure itself, whose OUTPUT is this procedure's only result set. XACT_ABORT: an
-- error anywhere rolls back both, so an ack never commits without the claim's outcome.
-- @ack_ids is a JSON array of ids (may be NULL or empty).
CREATE OR ALTER PROCEDURE {{fn_ack_dequeue}}
    @ack_ids       nvarchar(max) = NULL,
    @batch         int           = 1,
    @lease_seconds float         = NULL,
    @worker        nvarchar(200) = NULL
AS
BEGIN
    SET NOCOUNT ON; SET ROWCOUNT 0;
    SET XACT_ABORT ON;
    BEGIN TRANSACTION;
    -- The ack's plan is ack's: one seek of the clustered primary key per id (create_functions).
    IF @ack_ids IS NOT NULL
        UPDATE m SET status = 2, finished_at = SYSUTCDATETIME(), leased_until = NULL
        FROM {{meta}} AS m WITH (ROWLOCK, INDEX(1), FORCESEEK)
        WHERE m.id IN (SELECT i.id FROM OPENJSON(@ack_ids) WITH (id bigint '$') AS i)
          AND m.status = 1
          AND (@worker IS NULL OR m.lease_owner = @worker);
    EXEC {{fn_dequeue}} @batch = @batch, @lease_seconds = @lease_seconds, @worker = @worker;
    COMMIT TRANSACTION;
END
GO

-- name: drop_ack_dequeue
-- reliable_0004 downgrade: consumers ack and dequeue in two calls again.
DROP PROCEDURE IF EXISTS {{fn_ack_dequeue}};

-- name: set_autovacuum
-- reliable_0007 on PostgreSQL sets autovacuum storage parameters per table. SQL Server has
-- no per-table counterpart: deleted rows become ghost records that one instance-wide
-- ghost-cleanup task removes (every 5 s, no per-table setting; dba.md 1.6), and version
-- ghosts go when no snapshot needs them. The one per-table option the reference names for
-- queue tables, LOCK_ESCALATION, stays at its default: its advice is to keep each
-- statement under the 5,000 locks that trigger escalation, which the archive and purge
-- batches do (jobs.sql, dba.md 1.12). Statistics options: the reference gives none per
-- table, and the dequeue reads its filtered index, which it names in a hint, whatever the
-- statistics say.
-- Empty on purpose (no batch runs).

-- name: reset_autovacuum
-- reliable_0007 downgrade: nothing was set (see set_autovacuum). Empty on purpose.

-- name: set_plan_guard
-- reliable_0008 on PostgreSQL keeps the meta-table functions' cached generic plans off
-- sequential scans (a plan cached while the table held one page). SQL Server caches one
-- plan per procedure too, compiled for the first call's parameters and recompiled when the
-- statistics change (auto update after ~sqrt(1000 x rows) modifications on a large table,
-- 500 + 20% on a small one). Its procedures here name their access path in table hints
-- (INDEX, FORCESEEK: create_functions, create_dequeue), so a plan compiled while the table
-- was nearly empty cannot stay on a scan; nothing else is set. Empty on purpose (no batch
-- runs).

-- name: reset_plan_guard
-- reliable_0008 downgrade: nothing was set (see set_plan_guard). Empty on purpose.

-- name: enqueue
-- Client call: one item.
EXEC {{fn_enqueue}} @payload = :payload, @headers = :headers, @priority = :priority,
     @delay_seconds = :delay, @title = :title, @max_attempts = :max_attempts

-- name: enqueue_many
-- Client call: many items in one round trip (:items is the JSON array described above).
EXEC {{fn_enqueue_many}} @items = :items, @max_attempts = :max_attempts

-- name: dequeue
-- Client call: claim a batch (the one statement is in the procedure above).
EXEC {{fn_dequeue}} @batch = :batch, @lease_seconds = :lease_seconds, @worker = :worker

-- name: ack
EXEC {{fn_ack}} @ids = :ids, @worker = :worker

-- name: nack
EXEC {{fn_nack}} @ids = :ids, @error = :error, @worker = :worker,
     @base_seconds = :base_seconds, @max_seconds = :max_seconds

-- name: extend_lease
EXEC {{fn_extend_lease}} @ids = :ids, @lease_seconds = :lease_seconds, @worker = :worker

-- name: release
EXEC {{fn_release}} @ids = :ids, @worker = :worker

-- name: ack_dequeue
-- Client call: ack what this worker finished (:ack_ids, a JSON array) and claim the next batch.
EXEC {{fn_ack_dequeue}} @ack_ids = :ack_ids, @batch = :batch, @lease_seconds = :lease_seconds, @worker = :worker

-- name: counts
-- Items by status, for `queuectl list` and health; READY items not yet due count as scheduled.
SELECT m.status,
       CAST(CASE WHEN m.status = 0 AND m.due_at > SYSUTCDATETIME() THEN 1 ELSE 0 END AS bit) AS scheduled,
       COUNT_BIG(*) AS n
FROM {{meta}} AS m
GROUP BY m.status, CASE WHEN m.status = 0 AND m.due_at > SYSUTCDATETIME() THEN 1 ELSE 0 END

-- name: create_rotation
-- reliable_0012 on PostgreSQL partitions meta and data into generations emptied by TRUNCATE,
-- because PostgreSQL's row deletes leave dead versions that no VACUUM may remove while an
-- old snapshot is open (the xmin horizon), and every claim walks them. SQL Server deletes
-- in place: a deleted row becomes a ghost record that the ghost-cleanup task removes within
-- seconds, whatever other sessions hold, as long as no row versioning is in play. With it,
-- the same decay is possible: in a database with snapshot isolation or RCSI (off by
-- default; on in Azure SQL), a deleted row stays in the queue's own index pages as a
-- version ghost (sys.dm_db_index_physical_stats: version_ghost_record_count) while a
-- snapshot transaction, a long RCSI statement or a readable secondary of an availability
-- group may still need it, and READPAST claims walk those ghosts as PostgreSQL's walk dead
-- entries. The same shape would map to partition SWITCH OUT + TRUNCATE (the sliding-window
-- pattern); it is not built here, and no SQL Server runs on these machines to measure it.
-- The single tables stay. Empty on purpose (no batch runs).

-- name: drop_rotation
-- reliable_0012 downgrade: nothing was changed (see create_rotation). Empty on purpose.

-- name: create_claim_calls
-- reliable_0012: PostgreSQL's claim and ack on each generation slot's own tables (a
-- statement on its partitioned parents locks every slot). SQL Server keeps its single
-- tables (see create_rotation): nothing to add. Empty on purpose.

-- name: create_rotator
-- reliable_0012: no rotator on SQL Server (see create_rotation). Empty on purpose.

-- name: drop_rotator
-- reliable_0012 downgrade: nothing was created. Empty on purpose.

-- name: drop_rotation_functions
-- reliable_0012 downgrade: nothing was created. Empty on purpose.

-- name: create_lease_calls
-- reliable_0013: PostgreSQL's extend_lease, nack and release on each generation slot's own
-- tables (a statement on its partitioned parents locks every slot). SQL Server keeps its
-- single tables (see create_rotation): nothing to add. Empty on purpose.

-- name: drop_lease_calls
-- reliable_0013 downgrade: nothing was created. Empty on purpose.
