-- The ring buffer queue on SQL Server: a preallocated table of slots. The same sections as
-- sql/postgresql/ring.sql, whose header explains the design; in short:
--
-- <queue>_ring holds `size` rows, created at install and never inserted or deleted again:
-- push and pop only UPDATE them (WITH ROWLOCK: one key lock per operation, no page locks,
-- so neighbouring slots stay independent). Every message has a position drawn from one of
-- two SEQUENCE objects (push_seq, pop_seq; CACHE 1000, so drawing a value costs no log
-- write); position v lives in slot v % size, and a slot records the position it holds
-- (msg_id) and its state: 0 EMPTY (popped), 1 FULL, 2 SKIPPED (tombstone), 3 RESCUED.
-- A slot is free for position v when it holds v - size in any state but FULL.
--
-- Sequence values are not transactional, and CACHE loses the unused cached values when
-- the server stops uncleanly: both leave positions that no push will ever fill. A pop
-- waiting for such a hole, and the push one lap later, would stall; ring_repair writes a
-- tombstone into a slot free for longer than the grace, so pops skip it and pushes find
-- the slot free. It also re-pushes messages whose pop claimed them and vanished.
--
-- A pop never reads a push that has not committed: its UPDATE uses UPDLOCK, READPAST,
-- so a slot locked by an open push is skipped (treated as "not there yet"), never read.
-- Claims a push or pop keeps for its next call (a full ring, an empty queue) live in the
-- session (SESSION_CONTEXT, keyed by the procedure's object id; not transactional: a
-- rollback leaves it as it was set); ring_release gives them up, tombstoning a claim whose
-- slot is free for it and, since ring_0002, re-pushing at once a message whose push
-- committed at the session's own pop claim after its last pop (otherwise orphaned until
-- ring_repair's grace has passed).
--
-- Procedures that read catalog metadata (sys.sequences, OBJECT_ID) run WITH EXECUTE AS
-- OWNER: metadata visibility follows the caller, and a role granted only EXECUTE
-- (`queuectl grant`) would see no sequence and no table.
--
-- Batches inside a section are separated by GO lines (see reliable.sql). Sections are
-- filled by queuectl.sqlfiles.render() with quoted identifiers only.

-- name: create_tables
-- The slots (all of them, now), and the two position sequences.
CREATE TABLE {{ring}} (
    slot       int            NOT NULL PRIMARY KEY CLUSTERED,
    msg_id     bigint         NOT NULL,
    state      smallint       NOT NULL DEFAULT 0 CHECK (state BETWEEN 0 AND 3),
    payload    varbinary(max) NULL,
    headers    nvarchar(max)  NULL,
    pushed_at  datetime2(6)   NULL,
    changed_at datetime2(6)   NOT NULL DEFAULT SYSUTCDATETIME()
);
GO
-- slot s starts as "position s - size was popped": free for the first lap's position s.
-- The numbers come from a cross join of a catalog view with itself (millions of rows).
WITH numbers AS (
    SELECT TOP ({{size}}) ROW_NUMBER() OVER (ORDER BY (SELECT NULL)) - 1 AS g
    FROM sys.all_columns AS a CROSS JOIN sys.all_columns AS b
)
INSERT INTO {{ring}} (slot, msg_id, state)
SELECT CAST(g AS int), g - {{size}}, 0 FROM numbers;
GO
CREATE SEQUENCE {{push_seq}} AS bigint START WITH 0 MINVALUE 0 INCREMENT BY 1 CACHE 1000;
GO
CREATE SEQUENCE {{pop_seq}} AS bigint START WITH 0 MINVALUE 0 INCREMENT BY 1 CACHE 1000;

-- name: create_functions
-- The SQL API as stored procedures, callable from any language.

-- push (enqueue) one message; returns its position (id), or NULL if the ring stayed full
-- for @timeout seconds (the claimed position is kept for this session's next push).
CREATE PROCEDURE {{fn_enqueue}}
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
    DECLARE @pause_ms int = 1, @held bigint, @pause datetime;
    WHILE 1 = 1
    BEGIN
        IF @pos IS NULL
            SET @pos = NEXT VALUE FOR {{push_seq}};
        UPDATE r SET msg_id = @pos, state = 1, payload = @payload, headers = @headers,
                     pushed_at = SYSUTCDATETIME(), changed_at = SYSUTCDATETIME()
        FROM {{ring}} AS r WITH (UPDLOCK, READPAST, ROWLOCK)
        WHERE r.slot = @pos % {{size}} AND r.msg_id = @pos - {{size}} AND r.state <> 1;
        IF @@ROWCOUNT = 1
        BEGIN
            EXEC sys.sp_set_session_context @key = @key, @value = NULL;
            SELECT @pos AS id;
            RETURN;
        END
        SELECT @held = h.msg_id FROM {{ring}} AS h WHERE h.slot = @pos % {{size}};
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
GO
-- push many messages, one position each, in input order; returns their positions. Stops
-- early when the ring stays full for @timeout seconds (fewer positions come back).
-- @items is a JSON array of {"payload": "<hex>", "headers": {...} | null}.
CREATE PROCEDURE {{fn_enqueue_many}}
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
-- pop (dequeue) up to @batch messages in position order. Waits up to @timeout seconds for
-- the first one only; returns what it has as soon as the next is not there yet.
CREATE PROCEDURE {{fn_dequeue}}
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
    DECLARE @pause_ms int = 1, @taken int = 0, @held bigint, @held_state smallint, @pause datetime;
    DECLARE @out TABLE (id bigint NOT NULL PRIMARY KEY, payload varbinary(max) NULL,
                        headers nvarchar(max) NULL, enqueued_at datetime2(6) NULL,
                        dequeued_at datetime2(6) NOT NULL);
    WHILE @taken < @batch
    BEGIN
        IF @pos IS NULL
            SET @pos = NEXT VALUE FOR {{pop_seq}};
        UPDATE r SET state = 0, payload = NULL, headers = NULL, changed_at = SYSUTCDATETIME()
        OUTPUT @pos, deleted.payload, deleted.headers, deleted.pushed_at, SYSUTCDATETIME()
        INTO @out (id, payload, headers, enqueued_at, dequeued_at)
        FROM {{ring}} AS r WITH (UPDLOCK, READPAST, ROWLOCK)
        WHERE r.slot = @pos % {{size}} AND r.msg_id = @pos AND r.state = 1;
        IF @@ROWCOUNT = 1
        BEGIN
            SELECT @taken += 1, @pos = NULL;
            CONTINUE;
        END
        SELECT @held = h.msg_id, @held_state = h.state FROM {{ring}} AS h WHERE h.slot = @pos % {{size}};
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
GO
-- ring_repair: the recovery path for holes and dead poppers (see the header). Slots are
-- left alone while locked (READPAST: someone is pushing or popping them right now) or
-- changed within @grace_seconds. Returns one row per action: tombstone (item_id = the
-- skipped position), rescue (item_id = old position, new_item_id = new position), or
-- deferred (a rescue found no free slot; the message stays and waits for the next run).
CREATE PROCEDURE {{fn_ring_repair}}
    @grace_seconds float = 30,
    @timeout       float = 1.0
WITH EXECUTE AS OWNER
AS
BEGIN
    SET NOCOUNT ON;
    SET XACT_ABORT ON;
    DECLARE @cutoff datetime2(6) = DATEADD(millisecond,
        -CAST(ROUND(COALESCE(@grace_seconds, 30) * 1000e0, 0) AS int), SYSUTCDATETIME());
    DECLARE @push_high bigint, @pop_high bigint, @slot int, @msg bigint, @new bigint;
    DECLARE @payload varbinary(max), @headers nvarchar(max);
    DECLARE @actions TABLE (action nvarchar(16) NOT NULL, item_id bigint NULL,
                            new_item_id bigint NULL, slot int NOT NULL);
    -- the highest position each side has handed out (-1: none yet; last_used_value is
    -- NULL until the first draw, SQL Server 2017+)
    SELECT @push_high = COALESCE(CAST(s.last_used_value AS bigint), -1)
    FROM sys.sequences AS s WHERE s.object_id = OBJECT_ID({{push_seq_regclass}});
    SELECT @pop_high = COALESCE(CAST(s.last_used_value AS bigint), -1)
    FROM sys.sequences AS s WHERE s.object_id = OBJECT_ID({{pop_seq_regclass}});

    -- holes: a free slot whose next position(s) were claimed by pushes that never wrote.
    UPDATE r SET msg_id = r.msg_id + {{size}} * ((@push_high - r.msg_id) / {{size}}),
                 state = 2, payload = NULL, headers = NULL, changed_at = SYSUTCDATETIME()
    OUTPUT N'tombstone', inserted.msg_id, NULL, inserted.slot INTO @actions
    FROM {{ring}} AS r WITH (UPDLOCK, READPAST, ROWLOCK)
    WHERE r.state <> 1 AND r.msg_id + {{size}} <= @push_high AND r.changed_at < @cutoff;

    -- orphans: FULL slots whose position a pop already claimed, waiting past the grace.
    WHILE 1 = 1
    BEGIN
        SET @slot = NULL;
        BEGIN TRANSACTION;
        SELECT TOP (1) @slot = o.slot, @msg = o.msg_id, @payload = o.payload, @headers = o.headers
        FROM {{ring}} AS o WITH (UPDLOCK, READPAST, ROWLOCK)
        WHERE o.state = 1 AND o.msg_id <= @pop_high AND o.changed_at < @cutoff
        ORDER BY o.msg_id;
        IF @slot IS NULL
        BEGIN
            COMMIT TRANSACTION;
            BREAK;
        END
        -- one try at a new position: claimed and filled only if its slot is free now
        SET @new = NEXT VALUE FOR {{push_seq}};
        UPDATE r SET msg_id = @new, state = 1, payload = @payload, headers = @headers,
                     pushed_at = SYSUTCDATETIME(), changed_at = SYSUTCDATETIME()
        FROM {{ring}} AS r WITH (UPDLOCK, READPAST, ROWLOCK)
        WHERE r.slot = @new % {{size}} AND r.msg_id = @new - {{size}} AND r.state <> 1;
        IF @@ROWCOUNT = 0
        BEGIN
            -- the ring is full there: keep the orphan; the unused position becomes a hole
            -- that a later run tombstones
            ROLLBACK TRANSACTION;
            INSERT INTO @actions VALUES (N'deferred', @msg, NULL, @slot);
            BREAK;
        END
        UPDATE {{ring}} SET state = 3, payload = NULL, headers = NULL, changed_at = SYSUTCDATETIME()
        WHERE slot = @slot;
        COMMIT TRANSACTION;
        INSERT INTO @actions VALUES (N'rescue', @msg, @new, @slot);
    END
    SELECT action, item_id, new_item_id, slot FROM @actions;
END

-- name: create_ring_release_0001
-- ring_release as ring_0001 made it: give up this session's kept claims (a client closing
-- its connection); a claim whose slot is free for it is tombstoned at once. Returns the
-- released positions. A section of its own, so that ring_0002 replaces it
-- (create_ring_release_0002) and its downgrade restores it.
CREATE PROCEDURE {{fn_ring_release}}
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
-- ring_0002's ring_release: give up this session's kept claims, as ring_0001's does, and
-- close the race that version leaves to ring_repair (sql/postgresql/ring.sql explains it):
-- a pop claim whose slot holds its position FULL (the push committed after this session's
-- last pop looked) holds this session's own message, so it is re-pushed at once, without
-- the grace, as ring_repair rescues an orphan: the old slot marked RESCUED and the push
-- procedure called, waiting up to @timeout seconds for a free slot, in one transaction.
-- If the ring stays full that long, a rollback to the savepoint leaves the message FULL
-- for ring_repair. One row per claim: side, item_id, tombstoned (ring_0001's columns),
-- new_item_id (the rescued message's new id) and outcome: tombstoned, rescued, deferred
-- (the ring stayed full) or left (the slot was not free for the claim: ring_repair's).
CREATE PROCEDURE {{fn_ring_release}}
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
                EXEC {{fn_enqueue}} @payload = @payload, @headers = @headers, @timeout = @timeout;
                SELECT @new = p.id FROM @pushed AS p;
                IF @new IS NULL
                BEGIN
                    -- the ring stayed full: the message stays FULL at @pos for ring_repair.
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

-- name: drop_ring_release_0002
-- Remove ring_0002's ring_release.
DROP PROCEDURE IF EXISTS {{fn_ring_release}};

-- name: drop_functions
-- Remove the SQL API.
DROP PROCEDURE IF EXISTS {{fn_ring_repair}};
DROP PROCEDURE IF EXISTS {{fn_dequeue}};
DROP PROCEDURE IF EXISTS {{fn_enqueue_many}};
DROP PROCEDURE IF EXISTS {{fn_enqueue}};

-- name: drop_tables
-- Remove the slots and the sequences.
DROP TABLE IF EXISTS {{ring}};
DROP SEQUENCE IF EXISTS {{pop_seq}};
DROP SEQUENCE IF EXISTS {{push_seq}};

-- name: enqueue
-- Client call: push one message (NULL id: the ring stayed full).
EXEC {{fn_enqueue}} @payload = :payload, @headers = :headers, @timeout = :timeout

-- name: enqueue_many
-- Client call: push many messages in one round trip (:items is the JSON array above).
EXEC {{fn_enqueue_many}} @items = :items, @timeout = :timeout

-- name: dequeue
-- Client call: pop up to :batch messages, waiting up to :timeout seconds for the first.
EXEC {{fn_dequeue}} @batch = :batch, @timeout = :timeout

-- name: ring_repair
-- Client call: the recovery path (tombstone holes, rescue orphans).
EXEC {{fn_ring_repair}} @grace_seconds = :grace, @timeout = :timeout

-- name: ring_release
-- Client call: give up this session's kept claims (ring_0002: and rescue a message that
-- arrived at the pop claim, with the procedure's default timeout). No argument: the same
-- call serves a queue still at ring_0001, whose procedure returns three columns.
EXEC {{fn_ring_release}}

-- name: counts
-- Depth for `queuectl list`: the FULL slots.
SELECT CAST(0 AS smallint) AS status, CAST(0 AS bit) AS scheduled, COUNT_BIG(*) AS n
FROM {{ring}} WHERE state = 1
