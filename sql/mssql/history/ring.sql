-- Ring sections that later revisions replaced on SQL Server, each named for the revision that
-- installed it: a queue installed at an older revision runs it, and so does the downgrade
-- that puts the body back. A revision that changed only PostgreSQL has an empty section here, so
-- it runs nothing on SQL Server. What a fresh install creates today is in ../ring.sql.

-- name: create_enqueue_0001
-- The single push as ring_0001 made it: one position per statement. Every body here but
-- create_ring_release_0001's is CREATE OR ALTER, so that a downgrade restores it by running
-- its section again; ALTER keeps the procedures' EXECUTE grants.
-- push (enqueue) one message; returns its position (id), or NULL if the ring stayed full
-- for @timeout seconds (the claimed position is kept for this session's next push).
-- enqueue_many_0001 and ring_release_0002 call it through INSERT ... EXEC, whose INSERT is
-- one transaction around the whole call: so its reads keep no lock on a slot they do not
-- write (no UPDLOCK; READCOMMITTEDLOCK for RCSI, sql/mssql/ring.sql's header), and nothing
-- of the ring is locked while it backs off.
CREATE OR ALTER PROCEDURE {{fn_enqueue}}
    @payload varbinary(max),
    @headers nvarchar(max) = NULL,
    @timeout float         = 1.0
WITH EXECUTE AS OWNER
AS
BEGIN
    SET NOCOUNT ON;
    DECLARE @key sysname = CONCAT(N'queuectl.rpush.', OBJECT_ID({{ring_regclass}}));
    DECLARE @pos bigint = CAST(SESSION_CONTEXT(@key) AS bigint);
    DECLARE @deadline datetime2(6) = DATEADD(millisecond,
        CAST(ROUND(CASE WHEN @timeout > 0 THEN @timeout ELSE 0 END * 1000e0, 0) AS int), SYSUTCDATETIME());
    DECLARE @pause_ms int = 4,  -- WAITFOR takes a datetime (1/300 s): 1 ms would round to no wait
            @held bigint, @pause datetime;
    WHILE 1 = 1
    BEGIN
        IF @pos IS NULL
            SET @pos = NEXT VALUE FOR {{push_seq}};
        UPDATE r SET msg_id = @pos, state = 1, payload = @payload, headers = @headers,
                     pushed_at = SYSUTCDATETIME(), changed_at = SYSUTCDATETIME()
        FROM {{ring}} AS r WITH (READCOMMITTEDLOCK, READPAST, ROWLOCK)
        WHERE r.slot = @pos % {{size}} AND r.msg_id = @pos - {{size}} AND r.state <> 1;
        IF @@ROWCOUNT = 1
        BEGIN
            EXEC sys.sp_set_session_context @key = @key, @value = NULL;
            SELECT @pos AS id;
            RETURN;
        END
        -- locked now (a pop emptying it): @held stays NULL, so not passed; back off
        SET @held = NULL;
        SELECT @held = h.msg_id FROM {{ring}} AS h WITH (READCOMMITTEDLOCK, READPAST, ROWLOCK)
        WHERE h.slot = @pos % {{size}};
        IF @held >= @pos
        BEGIN
            SET @pos = NULL;  -- ring_repair tombstoned our claim (we looked dead): take a new one
            CONTINUE;
        END
        IF SYSUTCDATETIME() >= @deadline
        BEGIN
            EXEC sys.sp_set_session_context @key = @key, @value = @pos;
            SELECT CAST(NULL AS bigint) AS id;  -- full: the slot still holds an unpopped message
            RETURN;
        END
        SET @pause = DATEADD(millisecond, @pause_ms, CAST(0 AS datetime));
        WAITFOR DELAY @pause;
        SET @pause_ms = CASE WHEN @pause_ms * 2 > 50 THEN 50 ELSE @pause_ms * 2 END;
    END
END

-- name: create_enqueue_many_0001
-- The batch push as ring_0001 made it: the single push once per payload.
-- push many messages, one position each, in input order; returns their positions. Stops
-- early when the ring stays full for @timeout seconds (fewer positions come back).
-- @items is a JSON array of {"payload": "<hex>", "headers": {...} | null}.
CREATE OR ALTER PROCEDURE {{fn_enqueue_many}}
    @items   nvarchar(max),
    @timeout float = 1.0
AS
BEGIN
    SET NOCOUNT ON;
    DECLARE @src TABLE (ord int NOT NULL PRIMARY KEY, payload varbinary(max) NOT NULL,
                        headers nvarchar(max) NULL);
    DECLARE @out TABLE (ord int NOT NULL PRIMARY KEY, id bigint NULL);
    DECLARE @pushed TABLE (id bigint NULL);
    DECLARE @i int = 0, @count int, @payload varbinary(max), @headers nvarchar(max);
    INSERT INTO @src (ord, payload, headers)
    SELECT CAST(j.[key] AS int), CONVERT(varbinary(max), v.payload_hex, 2), v.headers
    FROM OPENJSON(@items) AS j
    CROSS APPLY OPENJSON(j.[value]) WITH (
        payload_hex nvarchar(max) '$.payload',
        headers     nvarchar(max) '$.headers' AS JSON
    ) AS v;
    SELECT @count = COUNT(*) FROM @src;
    WHILE @i < @count
    BEGIN
        SELECT @payload = s.payload, @headers = s.headers FROM @src AS s WHERE s.ord = @i;
        DELETE FROM @pushed;
        INSERT INTO @pushed (id) EXEC {{fn_enqueue}} @payload = @payload, @headers = @headers, @timeout = @timeout;
        INSERT INTO @out (ord, id) SELECT @i, p.id FROM @pushed AS p;
        IF (SELECT o.id FROM @out AS o WHERE o.ord = @i) IS NULL BREAK;
        SET @i += 1;
    END
    SELECT o.id FROM @out AS o WHERE o.id IS NOT NULL ORDER BY o.ord;
END
GO
-- SQL Server's push procedure of today's enqueue_many (sql/mssql/ring.sql), which nothing
-- calls at this revision: ring_0003's downgrade runs this section and leaves none behind.
DROP PROCEDURE IF EXISTS {{fn_ring_push}};

-- name: create_dequeue_0001
-- The pop as ring_0001 made it: one position per statement.
-- pop (dequeue) up to @batch messages in position order. Waits up to @timeout seconds for
-- the first one only; returns what it has as soon as the next is not there yet.
CREATE OR ALTER PROCEDURE {{fn_dequeue}}
    @batch   int   = 1,
    @timeout float = 0
WITH EXECUTE AS OWNER
AS
BEGIN
    SET NOCOUNT ON;
    DECLARE @key sysname = CONCAT(N'queuectl.rpop.', OBJECT_ID({{ring_regclass}}));
    DECLARE @pos bigint = CAST(SESSION_CONTEXT(@key) AS bigint);
    DECLARE @deadline datetime2(6) = DATEADD(millisecond,
        CAST(ROUND(CASE WHEN @timeout > 0 THEN @timeout ELSE 0 END * 1000e0, 0) AS int), SYSUTCDATETIME());
    DECLARE @pause_ms int = 4,  -- WAITFOR takes a datetime (1/300 s): 1 ms would round to no wait
            @taken int = 0, @held bigint, @held_state smallint, @pause datetime;
    DECLARE @out TABLE (id bigint NOT NULL PRIMARY KEY, payload varbinary(max) NULL,
                        headers nvarchar(max) NULL, enqueued_at datetime2(6) NULL,
                        dequeued_at datetime2(6) NOT NULL);
    WHILE @taken < @batch
    BEGIN
        IF @pos IS NULL
            SET @pos = NEXT VALUE FOR {{pop_seq}};
        -- no UPDLOCK: a slot not pushed yet keeps no lock of this pop (inside a caller's
        -- transaction it would keep that position's push out); READCOMMITTEDLOCK for RCSI
        UPDATE r SET state = 0, payload = NULL, headers = NULL, changed_at = SYSUTCDATETIME()
        OUTPUT @pos, deleted.payload, deleted.headers, deleted.pushed_at, SYSUTCDATETIME()
        INTO @out (id, payload, headers, enqueued_at, dequeued_at)
        FROM {{ring}} AS r WITH (READCOMMITTEDLOCK, READPAST, ROWLOCK)
        WHERE r.slot = @pos % {{size}} AND r.msg_id = @pos AND r.state = 1;
        IF @@ROWCOUNT = 1
        BEGIN
            SELECT @taken += 1, @pos = NULL;
            CONTINUE;
        END
        -- locked now (its push in flight, a rescue): @held stays NULL, so not skipped; wait
        SELECT @held = NULL, @held_state = NULL;
        SELECT @held = h.msg_id, @held_state = h.state
        FROM {{ring}} AS h WITH (READCOMMITTEDLOCK, READPAST, ROWLOCK) WHERE h.slot = @pos % {{size}};
        IF @held > @pos OR (@held = @pos AND @held_state <> 1)
        BEGIN
            SET @pos = NULL;  -- skipped or rescued by ring_repair: take the next position
            CONTINUE;
        END
        -- not pushed yet (or its push not committed): wait only while we have nothing
        IF @taken > 0 OR SYSUTCDATETIME() >= @deadline BREAK;
        SET @pause = DATEADD(millisecond, @pause_ms, CAST(0 AS datetime));
        WAITFOR DELAY @pause;
        SET @pause_ms = CASE WHEN @pause_ms * 2 > 50 THEN 50 ELSE @pause_ms * 2 END;
    END
    EXEC sys.sp_set_session_context @key = @key, @value = @pos;
    SELECT id, payload, headers, enqueued_at, dequeued_at FROM @out ORDER BY id;
END

-- name: create_ring_release_0001
-- ring_release as ring_0001 made it: give up this session's kept claims (a client closing
-- its connection); a claim whose slot is free for it is tombstoned at once. Returns the
-- released positions. A section of its own, so that ring_0002 replaces it
-- (create_ring_release_0002) and its downgrade restores it.
CREATE OR ALTER PROCEDURE {{fn_ring_release}}
WITH EXECUTE AS OWNER
AS
BEGIN
    SET NOCOUNT ON;
    DECLARE @k_push sysname = CONCAT(N'queuectl.rpush.', OBJECT_ID({{ring_regclass}}));
    DECLARE @k_pop sysname = CONCAT(N'queuectl.rpop.', OBJECT_ID({{ring_regclass}}));
    DECLARE @out TABLE (side nvarchar(4) NOT NULL, item_id bigint NOT NULL, tombstoned bit NOT NULL);
    DECLARE @pos bigint = CAST(SESSION_CONTEXT(@k_push) AS bigint);
    IF @pos IS NOT NULL
    BEGIN
        UPDATE {{ring}} SET msg_id = @pos, state = 2, payload = NULL, headers = NULL,
                            changed_at = SYSUTCDATETIME()
        WHERE slot = @pos % {{size}} AND msg_id = @pos - {{size}} AND state <> 1;
        INSERT INTO @out VALUES (N'push', @pos, CASE WHEN @@ROWCOUNT = 1 THEN 1 ELSE 0 END);
        EXEC sys.sp_set_session_context @key = @k_push, @value = NULL;
    END
    SET @pos = CAST(SESSION_CONTEXT(@k_pop) AS bigint);
    IF @pos IS NOT NULL
    BEGIN
        UPDATE {{ring}} SET msg_id = @pos, state = 2, payload = NULL, headers = NULL,
                            changed_at = SYSUTCDATETIME()
        WHERE slot = @pos % {{size}} AND msg_id = @pos - {{size}} AND state <> 1;
        INSERT INTO @out VALUES (N'pop', @pos, CASE WHEN @@ROWCOUNT = 1 THEN 1 ELSE 0 END);
        EXEC sys.sp_set_session_context @key = @k_pop, @value = NULL;
    END
    SELECT side, item_id, tombstoned FROM @out;
END

-- name: drop_ring_release_0001
-- Remove ring_0001's ring_release.
DROP PROCEDURE IF EXISTS {{fn_ring_release}};

-- name: create_ring_release_0002
-- ring_release as ring_0002 made it: give up this session's kept claims, as ring_0001's does,
-- and close the race that version leaves to ring_repair (sql/postgresql/ring.sql explains it):
-- a pop claim whose slot holds its position FULL (the push committed after this session's last
-- pop looked) holds this session's own message, so it is re-pushed at once, without the grace,
-- as ring_repair rescues an orphan: the old slot marked RESCUED and the push procedure called
-- in one transaction. That transaction holds the old slot's lock (and the INSERT ... EXEC
-- wraps the push in it), so the push is one try, @timeout = 0, never a wait: if the ring is
-- full there, a rollback to the savepoint leaves the message FULL for ring_repair. @timeout is
-- the PostgreSQL function's wait, accepted for the shared signature and not used. One row per
-- claim: side, item_id, tombstoned (ring_0001's columns), new_item_id (the rescued message's
-- new id) and outcome: tombstoned, rescued, deferred (the ring stayed full) or left (the slot
-- was not free for the claim: ring_repair's).
-- CREATE OR ALTER: ring_0003's downgrade runs this section again to restore it.
CREATE OR ALTER PROCEDURE {{fn_ring_release}}
    @timeout float = 0.1
WITH EXECUTE AS OWNER
AS
BEGIN
    SET NOCOUNT ON;
    SET XACT_ABORT ON;
    DECLARE @k_push sysname = CONCAT(N'queuectl.rpush.', OBJECT_ID({{ring_regclass}}));
    DECLARE @k_pop sysname = CONCAT(N'queuectl.rpop.', OBJECT_ID({{ring_regclass}}));
    DECLARE @out TABLE (side nvarchar(4) NOT NULL, item_id bigint NOT NULL, tombstoned bit NOT NULL,
                        new_item_id bigint NULL, outcome nvarchar(10) NOT NULL);
    DECLARE @pushed TABLE (id bigint NULL);
    DECLARE @pos bigint = CAST(SESSION_CONTEXT(@k_push) AS bigint);
    DECLARE @done int, @slot int, @new bigint, @payload varbinary(max), @headers nvarchar(max);
    IF @pos IS NOT NULL
    BEGIN
        -- our own claim: safe to tombstone at once when its slot is free for it
        UPDATE {{ring}} SET msg_id = @pos, state = 2, payload = NULL, headers = NULL,
                            changed_at = SYSUTCDATETIME()
        WHERE slot = @pos % {{size}} AND msg_id = @pos - {{size}} AND state <> 1;
        SET @done = @@ROWCOUNT;
        INSERT INTO @out VALUES (N'push', @pos, @done, NULL,
                                 CASE WHEN @done = 1 THEN N'tombstoned' ELSE N'left' END);
        -- cleared before a rescue below pushes: that push must draw a position of its own
        EXEC sys.sp_set_session_context @key = @k_push, @value = NULL;
    END
    SET @pos = CAST(SESSION_CONTEXT(@k_pop) AS bigint);
    IF @pos IS NOT NULL
    BEGIN
        -- a pop claim whose push has not happened yet: tombstone it before a push fills it.
        -- A push of @pos in flight holds the slot's key lock: this waits for its outcome.
        UPDATE {{ring}} SET msg_id = @pos, state = 2, payload = NULL, headers = NULL,
                            changed_at = SYSUTCDATETIME()
        WHERE slot = @pos % {{size}} AND msg_id = @pos - {{size}} AND state <> 1;
        IF @@ROWCOUNT = 1
            INSERT INTO @out VALUES (N'pop', @pos, 1, NULL, N'tombstoned');
        ELSE
        BEGIN
            -- the race: the push of @pos committed after our last pop looked. READPAST: a
            -- slot locked now is ring_repair rescuing it already, never waited for here.
            BEGIN TRANSACTION;
            SELECT @slot = o.slot, @payload = o.payload, @headers = o.headers
            FROM {{ring}} AS o WITH (UPDLOCK, READPAST, ROWLOCK)
            WHERE o.slot = @pos % {{size}} AND o.msg_id = @pos AND o.state = 1;
            IF @slot IS NULL
            BEGIN
                COMMIT TRANSACTION;
                INSERT INTO @out VALUES (N'pop', @pos, 0, NULL, N'left');
            END
            ELSE
            BEGIN
                -- a rollback to the savepoint undoes the rescue and keeps the slot's lock
                SAVE TRANSACTION ring_rescue;
                UPDATE {{ring}} SET state = 3, payload = NULL, headers = NULL, changed_at = SYSUTCDATETIME()
                WHERE slot = @slot;
                INSERT INTO @pushed (id)
                EXEC {{fn_enqueue}} @payload = @payload, @headers = @headers, @timeout = 0;
                SELECT @new = p.id FROM @pushed AS p;
                IF @new IS NULL
                BEGIN
                    -- the ring is full there: the message stays FULL at @pos for ring_repair.
                    -- The push kept the position it drew in the session, and session context
                    -- is not transactional: drop it (a hole, which ring_repair tombstones).
                    ROLLBACK TRANSACTION ring_rescue;
                    COMMIT TRANSACTION;
                    EXEC sys.sp_set_session_context @key = @k_push, @value = NULL;
                    INSERT INTO @out VALUES (N'pop', @pos, 0, NULL, N'deferred');
                END
                ELSE
                BEGIN
                    COMMIT TRANSACTION;
                    INSERT INTO @out VALUES (N'pop', @pos, 0, @new, N'rescued');
                END
            END
        END
        EXEC sys.sp_set_session_context @key = @k_pop, @value = NULL;
    END
    SELECT side, item_id, tombstoned, new_item_id, outcome FROM @out;
END

-- name: create_enqueue_many_0005
-- Empty: ring_0005 changed PostgreSQL's batch push and pop only (SQL Server's procedures
-- already take their slots in one UPDATE).

-- name: create_dequeue_0005
-- Empty: see create_enqueue_many_0005.
