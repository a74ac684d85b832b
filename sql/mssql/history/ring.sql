-- Ring sections that later revisions replaced on SQL Server, each named for the revision that
-- installed it: a queue installed at an older revision runs it, and so does the downgrade
-- that puts the body back. A revision that changed only PostgreSQL has an empty section here, so
-- it runs nothing on SQL Server. What a fresh install creates today is in ../ring.sql.

-- name: create_functions_0001
-- The SQL API as stored procedures, callable from any language: ring_0001's push and pop,
-- one position per statement. CREATE OR ALTER, so that ring_0003's downgrade restores them
-- by running this section again (ring_repair, unchanged since, is replaced by itself);
-- ALTER keeps the procedures' EXECUTE grants.

-- push (enqueue) one message; returns its position (id), or NULL if the ring stayed full
-- for @timeout seconds (the claimed position is kept for this session's next push).
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
CREATE OR ALTER PROCEDURE {{fn_ring_repair}}
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
-- (CREATE OR ALTER: ring_0003's downgrade runs this section again to restore it.)
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

-- name: create_functions_0003
-- ring_0003: set-based push and pop (sql/postgresql/ring.sql explains why: one statement
-- per position cost as much server time per message at every batch size). A batch claims
-- its positions with one sequence call and writes or takes them with one UPDATE; the
-- per-position rules stay: a push writes only into a slot free for its position, a pop
-- takes only a FULL slot holding its position and never a push that has not committed
-- (READPAST: a locked slot is "not there yet"), positions ring_repair skipped or rescued
-- are dropped, and claims that cannot be served now are kept in the session for its next
-- call. A session may keep several claims per side: SESSION_CONTEXT holds them as a
-- comma-separated list, oldest first (ring_0001/0002 kept one bigint, which reads as a
-- list of one). Positions only grow, so "oldest first" is also ascending order: the lists
-- are read back with OPENJSON over "[list]" (SQL Server 2016+; STRING_SPLIT's ordinal
-- needs 2022) into tables keyed by position, and written with STRING_AGG (2017+, as
-- sys.sequences.last_used_value already is for ring_repair).
-- A session context value holds at most 8000 bytes: nvarchar(4000), 200 positions of up to
-- 19 digits with their commas. So a call holds at most 200 claims per side at once; a
-- larger batch is served 200 positions at a time (a push draws the next ones when those
-- are written, a pop tops its claims up again after a take).
-- New positions come from sys.sp_sequence_get_range: one call per batch, as PostgreSQL's
-- one nextval() series, and the range is contiguous. NEXT VALUE FOR ... OVER (reliable.sql)
-- needs a row source of exactly the rows to number and is refused with TOP, which the pop
-- (whose count is computed) does not have. A position that replaces a tombstoned claim is
-- one NEXT VALUE FOR.
-- Same parameters and result columns as before; CREATE OR ALTER keeps the EXECUTE grants.

-- push many messages in input order; returns their positions. Claims (the session's kept
-- ones first, then new ones) are written in one UPDATE for the longest run of them whose
-- slots are free, from the first unwritten one; when the next slot is not free (the ring
-- is full there) it backs off (1 ms doubling to 50 ms) and retries until @timeout, then
-- returns the positions written so far (always the first payloads: input order is kept)
-- and keeps the unwritten claims for the session's next push. PostgreSQL locks and writes
-- a run in one statement; here a lock pass and the UPDATE share one short transaction (the
-- prefix is known only once the locks are taken), and each run commits on its own, so the
-- slots' locks are not held through the back-off (in autocommit, as the clients call it;
-- inside a caller's transaction, the caller's commit decides).
-- @items is a JSON array of {"payload": "<hex>", "headers": {...} | null}, as before.
CREATE OR ALTER PROCEDURE {{fn_enqueue_many}}
    @items   nvarchar(max),
    @timeout float = 1.0
WITH EXECUTE AS OWNER
AS
BEGIN
    SET NOCOUNT ON;
    SET XACT_ABORT ON;
    DECLARE @key sysname = CONCAT(N'queuectl.rpush.', OBJECT_ID({{ring_regclass}}));
    DECLARE @deadline datetime2(6) = DATEADD(millisecond,
        CAST(ROUND(CASE WHEN @timeout > 0 THEN @timeout ELSE 0 END * 1000e0, 0) AS int), SYSUTCDATETIME());
    DECLARE @pause_ms int = 1, @pause datetime, @n int, @done int = 0, @run int, @draw int;
    DECLARE @first sql_variant, @pos bigint, @held bigint, @stop bigint, @kept nvarchar(4000);
    DECLARE @src TABLE (ord int NOT NULL PRIMARY KEY, payload varbinary(max) NULL,
                        headers nvarchar(max) NULL);
    -- @claims: this call's unwritten claims, in input order (ascending positions); @spare:
    -- kept claims this call has no payload for; @free: the claims whose slots are locked
    DECLARE @claims TABLE (pos bigint NOT NULL PRIMARY KEY);
    DECLARE @spare TABLE (pos bigint NOT NULL PRIMARY KEY);
    DECLARE @free TABLE (pos bigint NOT NULL PRIMARY KEY);
    DECLARE @written TABLE (ord int NOT NULL PRIMARY KEY, id bigint NOT NULL);
    INSERT INTO @src (ord, payload, headers)
    SELECT CAST(j.[key] AS int), CONVERT(varbinary(max), v.payload_hex, 2), v.headers
    FROM OPENJSON(@items) AS j
    CROSS APPLY OPENJSON(j.[value]) WITH (
        payload_hex nvarchar(max) '$.payload',
        headers     nvarchar(max) '$.headers' AS JSON
    ) AS v;
    SELECT @n = COUNT(*) FROM @src;
    INSERT INTO @spare (pos)
    SELECT CAST(k.[value] AS bigint)
    FROM OPENJSON(CONCAT(N'[', CAST(SESSION_CONTEXT(@key) AS nvarchar(4000)), N']')) AS k;
    -- the kept claims go first, oldest first
    INSERT INTO @claims (pos) SELECT TOP (@n) s.pos FROM @spare AS s ORDER BY s.pos;
    DELETE s FROM @spare AS s WHERE EXISTS (SELECT 1 FROM @claims AS c WHERE c.pos = s.pos);
    WHILE @done < @n
    BEGIN
        -- new claims for the payloads without one, at most 200 held at once (see above)
        SELECT @draw = CASE WHEN @n - @done - c.n < 200 - c.n - s.n THEN @n - @done - c.n
                            ELSE 200 - c.n - s.n END
        FROM (SELECT COUNT(*) AS n FROM @claims) AS c CROSS JOIN (SELECT COUNT(*) AS n FROM @spare) AS s;
        IF @draw > 0
        BEGIN
            EXEC sys.sp_sequence_get_range @sequence_name = {{push_seq_regclass}}, @range_size = @draw,
                                           @range_first_value = @first OUTPUT;
            INSERT INTO @claims (pos)
            SELECT TOP (@draw) CAST(@first AS bigint) + ROW_NUMBER() OVER (ORDER BY (SELECT NULL)) - 1
            FROM sys.all_columns;
        END
        BEGIN TRANSACTION;
        -- lock the slots free for the unwritten claims. READPAST: a slot locked now (a pop
        -- emptying it, ring_repair) is not free yet; UPDLOCK holds the free ones until the
        -- write below, so the run stays free between the two statements.
        DELETE FROM @free;
        INSERT INTO @free (pos)
        SELECT c.pos
        FROM @claims AS c
        JOIN {{ring}} AS s WITH (UPDLOCK, READPAST, ROWLOCK) ON s.slot = c.pos % {{size}}
        WHERE s.msg_id = c.pos - {{size}} AND s.state <> 1;
        -- the run to write: the claims before the first one not locked free, so input
        -- order is never broken (the k-th claim of the run takes payload @done + k - 1)
        SELECT @stop = MIN(c.pos) FROM @claims AS c WHERE NOT EXISTS (SELECT 1 FROM @free AS f WHERE f.pos = c.pos);
        UPDATE r SET msg_id = w.pos, state = 1, payload = s.payload, headers = s.headers,
                     pushed_at = SYSUTCDATETIME(), changed_at = SYSUTCDATETIME()
        OUTPUT w.ord, inserted.msg_id INTO @written (ord, id)
        FROM {{ring}} AS r WITH (ROWLOCK)
        JOIN (
            SELECT c.pos, @done - 1 + ROW_NUMBER() OVER (ORDER BY c.pos) AS ord
            FROM @claims AS c
            WHERE @stop IS NULL OR c.pos < @stop
        ) AS w ON r.slot = w.pos % {{size}}
        JOIN @src AS s ON s.ord = w.ord;
        SET @run = @@ROWCOUNT;
        COMMIT TRANSACTION;
        DELETE FROM @claims WHERE @stop IS NULL OR pos < @stop;
        SET @done += @run;
        IF @done = @n BREAK;
        IF NOT EXISTS (SELECT 1 FROM @claims) CONTINUE;  -- 200 written: draw the next ones
        SELECT @pos = MIN(c.pos) FROM @claims AS c;
        SELECT @held = h.msg_id FROM {{ring}} AS h WHERE h.slot = @pos % {{size}};
        IF @held >= @pos
        BEGIN
            -- the claim was tombstoned (ring_repair: we looked dead; or our own release):
            -- drop it and claim a new position at the end, so positions stay in input order
            DELETE FROM @claims WHERE pos = @pos;
            INSERT INTO @claims (pos) VALUES (NEXT VALUE FOR {{push_seq}});
            CONTINUE;
        END
        -- full there (the slot still holds an unpopped earlier lap), or busy right now
        IF SYSUTCDATETIME() >= @deadline BREAK;
        SET @pause = DATEADD(millisecond, @pause_ms, CAST(0 AS datetime));
        WAITFOR DELAY @pause;
        SET @pause_ms = CASE WHEN @pause_ms * 2 > 50 THEN 50 ELSE @pause_ms * 2 END;
    END
    -- keep the unwritten claims and the unused kept ones, oldest first (NULL: none)
    SELECT @kept = STRING_AGG(CAST(k.pos AS nvarchar(20)), N',') WITHIN GROUP (ORDER BY k.pos)
    FROM (SELECT c.pos FROM @claims AS c UNION ALL SELECT s.pos FROM @spare AS s) AS k;
    EXEC sys.sp_set_session_context @key = @key, @value = @kept;
    SELECT w.id FROM @written AS w ORDER BY w.ord;
END
GO
-- push one message: the batch push of one (one row, column id; NULL when the ring stayed
-- full for @timeout: the claim is kept for this session's next push). The message travels
-- as enqueue_many's JSON array; INSERT ... EXEC reads its result, so this procedure cannot
-- itself be called by INSERT ... EXEC (SQL Server refuses nested INSERT ... EXEC): call
-- enqueue_many there, as ring_release does.
CREATE OR ALTER PROCEDURE {{fn_enqueue}}
    @payload varbinary(max),
    @headers nvarchar(max) = NULL,
    @timeout float         = 1.0
AS
BEGIN
    SET NOCOUNT ON;
    DECLARE @pushed TABLE (id bigint NOT NULL);
    DECLARE @items nvarchar(max) = (
        SELECT CONVERT(varchar(max), @payload, 2) AS payload, JSON_QUERY(@headers) AS headers
        FOR JSON PATH
    );
    INSERT INTO @pushed (id) EXEC {{fn_enqueue_many}} @items = @items, @timeout = @timeout;
    SELECT MAX(p.id) AS id FROM @pushed AS p;
END
GO
-- pop up to @batch messages in position order. Claims (the session's kept ones first) are
-- topped up with one sequence call, but never past the positions pushers have claimed
-- (push_seq's high mark minus pop_seq's: a claim beyond that could only wait), and one
-- UPDATE takes every FULL slot among them. Claims whose push has not happened (or not
-- committed) are kept for the next pop; those ring_repair skipped or rescued are dropped.
-- Waits up to @timeout seconds only while it has nothing (an empty ring: it claims the
-- next position and waits for it); returns what it has as soon as nothing more is there.
CREATE OR ALTER PROCEDURE {{fn_dequeue}}
    @batch   int   = 1,
    @timeout float = 0
WITH EXECUTE AS OWNER
AS
BEGIN
    SET NOCOUNT ON;
    DECLARE @key sysname = CONCAT(N'queuectl.rpop.', OBJECT_ID({{ring_regclass}}));
    DECLARE @deadline datetime2(6) = DATEADD(millisecond,
        CAST(ROUND(CASE WHEN @timeout > 0 THEN @timeout ELSE 0 END * 1000e0, 0) AS int), SYSUTCDATETIME());
    DECLARE @pause_ms int = 1, @pause datetime, @taken int = 0, @got int, @need int, @have int;
    DECLARE @more bigint, @first sql_variant, @kept nvarchar(4000);
    DECLARE @claims TABLE (pos bigint NOT NULL PRIMARY KEY);
    DECLARE @out TABLE (id bigint NOT NULL PRIMARY KEY, payload varbinary(max) NULL,
                        headers nvarchar(max) NULL, enqueued_at datetime2(6) NULL,
                        dequeued_at datetime2(6) NOT NULL);
    INSERT INTO @claims (pos)
    SELECT CAST(k.[value] AS bigint)
    FROM OPENJSON(CONCAT(N'[', CAST(SESSION_CONTEXT(@key) AS nvarchar(4000)), N']')) AS k;
    WHILE 1 = 1
    BEGIN
        SET @need = @batch - @taken;
        IF @need IS NULL OR @need < 1 BREAK;
        SELECT @have = COUNT(*) FROM @claims;
        IF @have < @need
        BEGIN
            -- the highest position each side has handed out (-1: none yet)
            SELECT @more = COALESCE(CAST(p.last_used_value AS bigint), -1) - COALESCE(CAST(q.last_used_value AS bigint), -1)
            FROM sys.sequences AS p CROSS JOIN sys.sequences AS q
            WHERE p.object_id = OBJECT_ID({{push_seq_regclass}}) AND q.object_id = OBJECT_ID({{pop_seq_regclass}});
            IF @more > @need - @have SET @more = @need - @have;
            IF @more > 200 - @have SET @more = 200 - @have;
            IF @more < 1 AND @have = 0 AND @taken = 0
                SET @more = 1;  -- nothing pushed beyond the pops: claim the next position, wait for it
            IF @more > 0
            BEGIN
                EXEC sys.sp_sequence_get_range @sequence_name = {{pop_seq_regclass}}, @range_size = @more,
                                               @range_first_value = @first OUTPUT;
                INSERT INTO @claims (pos)
                SELECT TOP (@more) CAST(@first AS bigint) + ROW_NUMBER() OVER (ORDER BY (SELECT NULL)) - 1
                FROM sys.all_columns;
                SET @have += @more;
            END
        END
        IF @have = 0 BREAK;
        -- take the FULL slots among the claims, first positions first. READPAST: a slot
        -- locked now is a push not committed yet (or ring_repair rescuing it): not there.
        WITH full_slots AS (
            SELECT TOP (@need) r.msg_id, r.state, r.payload, r.headers, r.pushed_at, r.changed_at
            FROM @claims AS c
            JOIN {{ring}} AS r WITH (UPDLOCK, READPAST, ROWLOCK) ON r.slot = c.pos % {{size}}
            WHERE r.msg_id = c.pos AND r.state = 1
            ORDER BY c.pos
        )
        UPDATE full_slots SET state = 0, payload = NULL, headers = NULL, changed_at = SYSUTCDATETIME()
        OUTPUT deleted.msg_id, deleted.payload, deleted.headers, deleted.pushed_at, SYSUTCDATETIME()
        INTO @out (id, payload, headers, enqueued_at, dequeued_at);
        SET @got = @@ROWCOUNT;
        SET @taken += @got;
        -- keep the claims still to come: not pushed yet (the slot holds an earlier lap), or
        -- FULL but locked now or past this batch; drop the taken, skipped and rescued ones
        -- (all of them taken: nothing to look up). READPAST: a slot locked now is kept and
        -- looked at again, never waited for.
        IF @got = @have
            DELETE FROM @claims;
        ELSE
            DELETE c
            FROM @claims AS c
            JOIN {{ring}} AS s WITH (READPAST) ON s.slot = c.pos % {{size}}
            WHERE s.msg_id > c.pos OR (s.msg_id = c.pos AND s.state <> 1);
        IF @taken >= @batch BREAK;
        IF @got > 0 OR NOT EXISTS (SELECT 1 FROM @claims) CONTINUE;
        -- nothing there yet: wait only while we have nothing
        IF @taken > 0 OR SYSUTCDATETIME() >= @deadline BREAK;
        SET @pause = DATEADD(millisecond, @pause_ms, CAST(0 AS datetime));
        WAITFOR DELAY @pause;
        SET @pause_ms = CASE WHEN @pause_ms * 2 > 50 THEN 50 ELSE @pause_ms * 2 END;
    END
    SELECT @kept = STRING_AGG(CAST(c.pos AS nvarchar(20)), N',') WITHIN GROUP (ORDER BY c.pos)
    FROM @claims AS c;
    EXEC sys.sp_set_session_context @key = @key, @value = @kept;
    SELECT id, payload, headers, enqueued_at, dequeued_at FROM @out ORDER BY id;
END
GO
-- ring_release for a session that may keep several claims per side: ring_0002's rules
-- (create_ring_release_0002 above), one row per claim, push claims first, oldest first.
-- A rescue pushes through enqueue_many (a JSON array of one): enqueue reads enqueue_many
-- with INSERT ... EXEC itself, and SQL Server refuses a nested INSERT ... EXEC.
CREATE OR ALTER PROCEDURE {{fn_ring_release}}
    @timeout float = 0.1
WITH EXECUTE AS OWNER
AS
BEGIN
    SET NOCOUNT ON;
    SET XACT_ABORT ON;
    DECLARE @k_push sysname = CONCAT(N'queuectl.rpush.', OBJECT_ID({{ring_regclass}}));
    DECLARE @k_pop sysname = CONCAT(N'queuectl.rpop.', OBJECT_ID({{ring_regclass}}));
    DECLARE @claims TABLE (pos bigint NOT NULL PRIMARY KEY);
    DECLARE @out TABLE (seq int IDENTITY(1, 1) PRIMARY KEY, side nvarchar(4) NOT NULL,
                        item_id bigint NOT NULL, tombstoned bit NOT NULL,
                        new_item_id bigint NULL, outcome nvarchar(10) NOT NULL);
    DECLARE @pushed TABLE (id bigint NULL);
    DECLARE @pos bigint, @done int, @slot int, @new bigint, @payload varbinary(max), @headers nvarchar(max);
    DECLARE @one nvarchar(max);
    INSERT INTO @claims (pos)
    SELECT CAST(k.[value] AS bigint)
    FROM OPENJSON(CONCAT(N'[', CAST(SESSION_CONTEXT(@k_push) AS nvarchar(4000)), N']')) AS k;
    -- cleared before a rescue below pushes: that push must draw a position of its own
    EXEC sys.sp_set_session_context @key = @k_push, @value = NULL;
    WHILE EXISTS (SELECT 1 FROM @claims)
    BEGIN
        SELECT @pos = MIN(c.pos) FROM @claims AS c;
        DELETE FROM @claims WHERE pos = @pos;
        -- our own claim: safe to tombstone at once when its slot is free for it
        UPDATE {{ring}} SET msg_id = @pos, state = 2, payload = NULL, headers = NULL,
                            changed_at = SYSUTCDATETIME()
        WHERE slot = @pos % {{size}} AND msg_id = @pos - {{size}} AND state <> 1;
        SET @done = @@ROWCOUNT;
        INSERT INTO @out (side, item_id, tombstoned, new_item_id, outcome)
        VALUES (N'push', @pos, @done, NULL, CASE WHEN @done = 1 THEN N'tombstoned' ELSE N'left' END);
    END
    INSERT INTO @claims (pos)
    SELECT CAST(k.[value] AS bigint)
    FROM OPENJSON(CONCAT(N'[', CAST(SESSION_CONTEXT(@k_pop) AS nvarchar(4000)), N']')) AS k;
    WHILE EXISTS (SELECT 1 FROM @claims)
    BEGIN
        SELECT @pos = MIN(c.pos) FROM @claims AS c;
        DELETE FROM @claims WHERE pos = @pos;
        -- a pop claim whose push has not happened yet: tombstone it before a push fills it.
        -- A push of @pos in flight holds the slot's key lock: this waits for its outcome.
        UPDATE {{ring}} SET msg_id = @pos, state = 2, payload = NULL, headers = NULL,
                            changed_at = SYSUTCDATETIME()
        WHERE slot = @pos % {{size}} AND msg_id = @pos - {{size}} AND state <> 1;
        IF @@ROWCOUNT = 1
        BEGIN
            INSERT INTO @out (side, item_id, tombstoned, new_item_id, outcome)
            VALUES (N'pop', @pos, 1, NULL, N'tombstoned');
            CONTINUE;
        END
        -- the race: the push of @pos committed after our last pop looked. READPAST: a slot
        -- locked now is ring_repair rescuing it already, never waited for here.
        SET @slot = NULL;
        BEGIN TRANSACTION;
        SELECT @slot = o.slot, @payload = o.payload, @headers = o.headers
        FROM {{ring}} AS o WITH (UPDLOCK, READPAST, ROWLOCK)
        WHERE o.slot = @pos % {{size}} AND o.msg_id = @pos AND o.state = 1;
        IF @slot IS NULL
        BEGIN
            COMMIT TRANSACTION;
            INSERT INTO @out (side, item_id, tombstoned, new_item_id, outcome)
            VALUES (N'pop', @pos, 0, NULL, N'left');
            CONTINUE;
        END
        -- a rollback to the savepoint undoes the rescue and keeps the slot's lock
        SAVE TRANSACTION ring_rescue;
        UPDATE {{ring}} SET state = 3, payload = NULL, headers = NULL, changed_at = SYSUTCDATETIME()
        WHERE slot = @slot;
        SET @one = (
            SELECT CONVERT(varchar(max), @payload, 2) AS payload, JSON_QUERY(@headers) AS headers
            FOR JSON PATH
        );
        DELETE FROM @pushed;
        INSERT INTO @pushed (id) EXEC {{fn_enqueue_many}} @items = @one, @timeout = @timeout;
        SET @new = (SELECT MAX(p.id) FROM @pushed AS p);
        IF @new IS NULL
        BEGIN
            -- the ring stayed full: the message stays FULL at @pos for ring_repair. The push
            -- kept the position it drew in the session, and session context is not
            -- transactional: drop it (a hole, which ring_repair tombstones).
            ROLLBACK TRANSACTION ring_rescue;
            COMMIT TRANSACTION;
            EXEC sys.sp_set_session_context @key = @k_push, @value = NULL;
            INSERT INTO @out (side, item_id, tombstoned, new_item_id, outcome)
            VALUES (N'pop', @pos, 0, NULL, N'deferred');
        END
        ELSE
        BEGIN
            COMMIT TRANSACTION;
            INSERT INTO @out (side, item_id, tombstoned, new_item_id, outcome)
            VALUES (N'pop', @pos, 0, @new, N'rescued');
        END
    END
    EXEC sys.sp_set_session_context @key = @k_pop, @value = NULL;
    SELECT side, item_id, tombstoned, new_item_id, outcome FROM @out ORDER BY seq;
END

-- name: create_functions_0005
-- Empty: ring_0005 changed PostgreSQL's push and pop only (SQL Server's procedures already
-- take their slots in one UPDATE).
