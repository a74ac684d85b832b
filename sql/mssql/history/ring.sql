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
    SET NOCOUNT ON; SET ROWCOUNT 0;
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
    SET NOCOUNT ON; SET ROWCOUNT 0;
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
    SET NOCOUNT ON; SET ROWCOUNT 0;
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
    SET NOCOUNT ON; SET ROWCOUNT 0;
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
    SET NOCOUNT ON; SET ROWCOUNT 0;
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

-- name: create_enqueue_many_0003
-- The SQL API as stored procedures, callable from any language, one section per procedure:
-- the batch push (enqueue_many, this section, with the push itself, ring_push), the single
-- push (enqueue), the pop (dequeue), the recovery path (ring_repair) and the session's
-- release (ring_release). The push and the pop share the design below.
--
-- Set-based (since ring_0003; sql/postgresql/ring.sql explains why: one statement per position
-- cost as much server time per message at every batch size). A batch claims its positions with
-- one sequence call and writes or takes them with one UPDATE; the per-position rules stay: a
-- push writes only into a slot free for its position, a pop takes only a FULL slot holding its
-- position and never a push that has not committed (READPAST: a locked slot is "not there
-- yet"), positions ring_repair skipped or rescued are dropped, and claims that cannot be
-- served now are kept in the session for its next call. A session may keep several claims per
-- side: SESSION_CONTEXT holds them as a comma-separated list, oldest first (ring_0001/0002
-- kept one bigint, which reads as a list of one). Positions only grow, so "oldest first" is
-- also ascending order: the lists are read back with OPENJSON over "[list]" (SQL Server 2016+;
-- STRING_SPLIT's ordinal needs 2022) into tables keyed by position, and written with
-- STRING_AGG (2017+, as sys.sequences.last_used_value already is for ring_repair).
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
-- ring_push is SQL Server's own: PostgreSQL's functions call each other directly, T-SQL's
-- procedures hand results over through OUTPUT parameters (the header: never INSERT ... EXEC).

-- ring_push: push many messages in input order; @ids returns their positions, comma-separated
-- in input order (NULL: none), and no result set. Claims (the session's kept ones first, then
-- new ones) are written in one UPDATE for the longest run of them whose slots are free, from
-- the first unwritten one; when the next slot is not free (the ring is full there) it backs
-- off (4 ms doubling to 50 ms) and retries until @timeout, then returns the positions written
-- so far (always the first payloads: input order is kept) and keeps the unwritten claims for
-- the session's next push. PostgreSQL locks and writes a run in one statement; here a probe
-- finds the run (a locking read that keeps no lock: nothing is held between calls or while
-- waiting) and one UPDATE writes it, re-checking each slot under its update lock, in a short
-- transaction of its own that commits before any back-off. If a slot of the run changed in
-- between (ring_repair tombstoned the claim, or it is locked now), the UPDATE writes fewer
-- rows than the run: the run is rolled back to its savepoint, so the written positions stay
-- the first payloads, and tried again. Inside a caller's transaction it never waits (see the
-- header): what it cannot write at once is kept for the next push, as on a timeout.
-- @items is a JSON array of {"payload": "<hex>", "headers": {...} | null}, as before.
CREATE OR ALTER PROCEDURE {{fn_ring_push}}
    @items   nvarchar(max),
    @timeout float         = 1.0,
    @ids     nvarchar(max) = NULL OUTPUT
WITH EXECUTE AS OWNER
AS
BEGIN
    SET NOCOUNT ON; SET ROWCOUNT 0;
    SET XACT_ABORT ON;
    DECLARE @key sysname = CONCAT(N'queuectl.rpush.', OBJECT_ID({{ring_regclass}}));
    DECLARE @deadline datetime2(6) = DATEADD(millisecond,
        CAST(ROUND(CASE WHEN @timeout > 0 THEN @timeout ELSE 0 END * 1000e0, 0) AS int), SYSUTCDATETIME());
    DECLARE @pause_ms int = 4,  -- WAITFOR takes a datetime (1/300 s): 1 ms would round to no wait
            @pause datetime, @n int, @done int = 0, @run int, @want int, @draw int;
    DECLARE @first sql_variant, @pos bigint, @stop bigint, @kept nvarchar(4000);
    DECLARE @src TABLE (ord int NOT NULL PRIMARY KEY, payload varbinary(max) NULL,
                        headers nvarchar(max) NULL);
    -- @claims: this call's unwritten claims, in input order (ascending positions); @spare:
    -- kept claims this call has no payload for; @seen: the probe's view of the claims' slots
    -- (free for the claim; passed: the slot holds the claim's position or a later one, so the
    -- claim was tombstoned)
    DECLARE @claims TABLE (pos bigint NOT NULL PRIMARY KEY);
    DECLARE @spare TABLE (pos bigint NOT NULL PRIMARY KEY);
    DECLARE @seen TABLE (pos bigint NOT NULL PRIMARY KEY, free bit NOT NULL, passed bit NOT NULL);
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
        -- the probe: the claims' slots as they are now. READCOMMITTEDLOCK, READPAST: a slot
        -- locked now (a pop emptying it, ring_repair) is skipped, so it is neither free nor
        -- passed yet, also under RCSI; the shared locks go row by row, none is kept.
        DELETE FROM @seen;
        INSERT INTO @seen (pos, free, passed)
        SELECT c.pos,
               CASE WHEN s.msg_id = c.pos - {{size}} AND s.state <> 1 THEN 1 ELSE 0 END,
               CASE WHEN s.msg_id >= c.pos THEN 1 ELSE 0 END
        FROM @claims AS c
        JOIN {{ring}} AS s WITH (READCOMMITTEDLOCK, READPAST, ROWLOCK) ON s.slot = c.pos % {{size}};
        -- the run to write: the claims before the first one not seen free, so input order is
        -- never broken (the k-th claim of the run takes payload @done + k - 1)
        SELECT @stop = MIN(c.pos) FROM @claims AS c
        WHERE NOT EXISTS (SELECT 1 FROM @seen AS f WHERE f.pos = c.pos AND f.free = 1);
        SELECT @want = COUNT(*) FROM @claims AS c WHERE @stop IS NULL OR c.pos < @stop;
        SET @run = 0;
        IF @want > 0
        BEGIN
            BEGIN TRANSACTION;
            SAVE TRANSACTION ring_run;
            -- READCOMMITTEDLOCK, READPAST, no UPDLOCK: each slot is re-checked under the
            -- UPDATE's own update lock, a slot locked now is skipped (not waited for), and a
            -- slot that is no longer free keeps no lock (see the header)
            UPDATE r SET msg_id = w.pos, state = 1, payload = s.payload, headers = s.headers,
                         pushed_at = SYSUTCDATETIME(), changed_at = SYSUTCDATETIME()
            OUTPUT w.ord, inserted.msg_id INTO @written (ord, id)
            FROM {{ring}} AS r WITH (READCOMMITTEDLOCK, READPAST, ROWLOCK)
            JOIN (
                SELECT c.pos, @done - 1 + ROW_NUMBER() OVER (ORDER BY c.pos) AS ord
                FROM @claims AS c
                WHERE @stop IS NULL OR c.pos < @stop
            ) AS w ON r.slot = w.pos % {{size}}
            JOIN @src AS s ON s.ord = w.ord
            WHERE r.msg_id = w.pos - {{size}} AND r.state <> 1;
            SET @run = @@ROWCOUNT;
            IF @run < @want
            BEGIN
                -- a slot of the run changed since the probe: undo the run, try again. A table
                -- variable keeps its rows through a rollback: forget the run's outputs too.
                ROLLBACK TRANSACTION ring_run;
                DELETE FROM @written WHERE ord >= @done;
                SET @run = 0;
            END
            COMMIT TRANSACTION;
        END
        IF @run > 0
            DELETE FROM @claims WHERE @stop IS NULL OR pos < @stop;
        SET @done += @run;
        IF @done = @n BREAK;
        IF NOT EXISTS (SELECT 1 FROM @claims) CONTINUE;  -- 200 written: draw the next ones
        SELECT @pos = MIN(c.pos) FROM @claims AS c;
        IF EXISTS (SELECT 1 FROM @seen AS f WHERE f.pos = @pos AND f.passed = 1)
        BEGIN
            -- the claim was tombstoned (ring_repair: we looked dead; or our own release):
            -- drop it and claim a new position at the end, so positions stay in input order
            DELETE FROM @claims WHERE pos = @pos;
            INSERT INTO @claims (pos) VALUES (NEXT VALUE FOR {{push_seq}});
            CONTINUE;
        END
        -- full there (the slot still holds an unpopped earlier lap), or busy right now. No
        -- transaction of ours is open here; inside a caller's, do not wait (the header).
        IF @@TRANCOUNT > 0 OR SYSUTCDATETIME() >= @deadline BREAK;
        SET @pause = DATEADD(millisecond, @pause_ms, CAST(0 AS datetime));
        WAITFOR DELAY @pause;
        SET @pause_ms = CASE WHEN @pause_ms * 2 > 50 THEN 50 ELSE @pause_ms * 2 END;
    END
    -- keep the unwritten claims and the unused kept ones, oldest first (NULL: none)
    SELECT @kept = STRING_AGG(CAST(k.pos AS nvarchar(20)), N',') WITHIN GROUP (ORDER BY k.pos)
    FROM (SELECT c.pos FROM @claims AS c UNION ALL SELECT s.pos FROM @spare AS s) AS k;
    EXEC sys.sp_set_session_context @key = @key, @value = @kept;
    -- nvarchar(max): STRING_AGG of a shorter type fails past 8,000 bytes (a batch of ~400)
    SELECT @ids = STRING_AGG(CAST(w.id AS nvarchar(max)), N',') WITHIN GROUP (ORDER BY w.ord)
    FROM @written AS w;
END
GO
-- enqueue_many: ring_push's positions as rows, in input order (column id), as before.
CREATE OR ALTER PROCEDURE {{fn_enqueue_many}}
    @items   nvarchar(max),
    @timeout float = 1.0
WITH EXECUTE AS OWNER
AS
BEGIN
    SET NOCOUNT ON; SET ROWCOUNT 0;
    DECLARE @ids nvarchar(max);
    EXEC {{fn_ring_push}} @items = @items, @timeout = @timeout, @ids = @ids OUTPUT;
    SELECT CAST(j.[value] AS bigint) AS id
    FROM OPENJSON(CONCAT(N'[', @ids, N']')) AS j
    ORDER BY CAST(j.[key] AS int);
END

-- name: create_dequeue_0003
-- The pop, dequeue (since ring_0003; create_enqueue_many explains its claims).
-- pop up to @batch messages in position order. Claims (the session's kept ones first) are
-- topped up with one sequence call, but never past the positions pushers have claimed
-- (push_seq's high mark minus pop_seq's: a claim beyond that could only wait), and one
-- UPDATE takes every FULL slot among them. Claims whose push has not happened (or not
-- committed) are kept for the next pop; those ring_repair skipped or rescued are dropped.
-- Waits up to @timeout seconds only while it has nothing (an empty ring: it claims the
-- next position and waits for it); returns what it has as soon as nothing more is there.
-- No transaction of its own: in autocommit each statement commits by itself, and inside a
-- caller's transaction (processing()) it holds, while it waits, no lock on the ring: it
-- has taken nothing, and its reads keep no lock on the slots they pass over (the header).
CREATE OR ALTER PROCEDURE {{fn_dequeue}}
    @batch   int   = 1,
    @timeout float = 0
WITH EXECUTE AS OWNER
AS
BEGIN
    SET NOCOUNT ON; SET ROWCOUNT 0;
    DECLARE @key sysname = CONCAT(N'queuectl.rpop.', OBJECT_ID({{ring_regclass}}));
    DECLARE @deadline datetime2(6) = DATEADD(millisecond,
        CAST(ROUND(CASE WHEN @timeout > 0 THEN @timeout ELSE 0 END * 1000e0, 0) AS int), SYSUTCDATETIME());
    DECLARE @pause_ms int = 4,  -- WAITFOR takes a datetime (1/300 s): 1 ms would round to no wait
            @pause datetime, @taken int = 0, @got int, @need int, @have int;
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
        -- locked now is a push not committed yet (or ring_repair rescuing it): not there;
        -- READCOMMITTEDLOCK makes that so under RCSI too. No UPDLOCK: the UPDATE's own update
        -- lock is released from a claimed slot that is not FULL yet, where UPDLOCK would keep
        -- it to the end of a caller's transaction and keep that position's push out.
        WITH full_slots AS (
            SELECT TOP (@need) r.msg_id, r.state, r.payload, r.headers, r.pushed_at, r.changed_at
            FROM @claims AS c
            JOIN {{ring}} AS r WITH (READCOMMITTEDLOCK, READPAST, ROWLOCK) ON r.slot = c.pos % {{size}}
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
        -- looked at again, never waited for; READCOMMITTEDLOCK: skipped under RCSI too (a
        -- version would do no harm here, as any committed state drops only dead claims, but
        -- one rule for every read of the ring is easier to check), its locks released row
        -- by row.
        IF @got = @have
            DELETE FROM @claims;
        ELSE
            DELETE c
            FROM @claims AS c
            JOIN {{ring}} AS s WITH (READCOMMITTEDLOCK, READPAST, ROWLOCK) ON s.slot = c.pos % {{size}}
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

-- name: create_ring_repair_0001
-- The recovery path, ring_repair (since ring_0001).
-- ring_repair: the recovery path for holes and dead poppers (see the header). Slots are
-- left alone while locked (READPAST: someone is pushing or popping them right now) or
-- changed within @grace_seconds. Returns one row per action: tombstone (item_id = the
-- skipped position), rescue (item_id = old position, new_item_id = new position), or
-- deferred (a rescue found no free slot; the message stays and waits for the next run).
--
-- Bounded, and no table lock. The ring is walked in slot order, up to 1,000 candidates at a
-- step, by a read that keeps no lock (READCOMMITTEDLOCK, READPAST, ROWLOCK: shared row locks
-- released as it goes, so it holds one at a time; a locked slot is busy, not dead, and is
-- skipped); each candidate is then locked by its key and re-checked by the statement that
-- changes it. A tombstone statement locks at most 1,000 slots (TOP over the step's
-- candidates), a rescue 2 (the orphan and its new slot) in a transaction of its own: well
-- under the 5,000 locks one statement takes before SQL Server escalates them to a table lock,
-- which READPAST cannot skip and which would stop every push and pop until the repair ends
-- (escalation can still follow lock-memory pressure on the whole instance, which no bound
-- here prevents). LOCK_ESCALATION stays at its default: with every statement bounded it never
-- fires, and DISABLE would take away the instance's relief under lock-memory pressure.
-- No index for the search: an index on (state, changed_at), filtered or not, would be
-- written by every push and pop (both change state and changed_at) to serve a job that runs
-- every few minutes. The walk reads the clustered index once per run, in key order with no
-- sort (65,536 slots: about 1,600 pages at FILLFACTOR 20, see create_tables).
-- @timeout is the PostgreSQL function's wait for a rescue's free slot. Here a rescue runs
-- in its own transaction, holding the orphan's lock, and must not wait (the header): it is
-- one try, and the parameter is accepted for the shared signature and not used.
CREATE OR ALTER PROCEDURE {{fn_ring_repair}}
    @grace_seconds float = 30,
    @timeout       float = 1.0
WITH EXECUTE AS OWNER
AS
BEGIN
    SET NOCOUNT ON; SET ROWCOUNT 0;
    SET XACT_ABORT ON;
    DECLARE @cutoff datetime2(6) = DATEADD(millisecond,
        -CAST(ROUND(COALESCE(@grace_seconds, 30) * 1000e0, 0) AS int), SYSUTCDATETIME());
    DECLARE @push_high bigint, @pop_high bigint, @slot int, @msg bigint, @new bigint;
    DECLARE @payload varbinary(max), @headers nvarchar(max);
    DECLARE @after int = -1, @found int, @full bit = 0;
    -- one step's candidates: holes (orphan = 0) and orphans (orphan = 1), as the walk saw them
    DECLARE @candidates TABLE (slot int NOT NULL PRIMARY KEY, orphan bit NOT NULL, msg_id bigint NOT NULL);
    DECLARE @actions TABLE (action nvarchar(16) NOT NULL, item_id bigint NULL,
                            new_item_id bigint NULL, slot int NOT NULL);
    -- the highest position each side has handed out (-1: none yet; last_used_value is
    -- NULL until the first draw, SQL Server 2017+)
    SELECT @push_high = COALESCE(CAST(s.last_used_value AS bigint), -1)
    FROM sys.sequences AS s WHERE s.object_id = OBJECT_ID({{push_seq_regclass}});
    SELECT @pop_high = COALESCE(CAST(s.last_used_value AS bigint), -1)
    FROM sys.sequences AS s WHERE s.object_id = OBJECT_ID({{pop_seq_regclass}});

    WHILE 1 = 1
    BEGIN
        -- the next candidates after slot @after: holes, a free slot whose next position(s)
        -- were claimed by pushes that never wrote; orphans, FULL slots whose position a pop
        -- already claimed (none once a rescue found the ring full: no slot for them now)
        DELETE FROM @candidates;
        INSERT INTO @candidates (slot, orphan, msg_id)
        SELECT TOP (1000) r.slot, CASE WHEN r.state = 1 THEN 1 ELSE 0 END, r.msg_id
        FROM {{ring}} AS r WITH (READCOMMITTEDLOCK, READPAST, ROWLOCK)
        WHERE r.slot > @after AND r.changed_at < @cutoff
          AND ((r.state <> 1 AND r.msg_id + {{size}} <= @push_high)
               OR (r.state = 1 AND r.msg_id <= @pop_high AND @full = 0))
        ORDER BY r.slot;
        SET @found = @@ROWCOUNT;
        IF @found = 0 BREAK;
        SELECT @after = MAX(c.slot) FROM @candidates AS c;

        -- the holes, locked by key and re-checked (READPAST: one that became busy is left)
        UPDATE TOP (1000) r
        SET msg_id = r.msg_id + {{size}} * ((@push_high - r.msg_id) / {{size}}),
            state = 2, payload = NULL, headers = NULL, changed_at = SYSUTCDATETIME()
        OUTPUT N'tombstone', inserted.msg_id, NULL, inserted.slot INTO @actions
        FROM {{ring}} AS r WITH (READCOMMITTEDLOCK, READPAST, ROWLOCK)
        JOIN @candidates AS c ON c.slot = r.slot AND c.orphan = 0
        WHERE r.state <> 1 AND r.msg_id + {{size}} <= @push_high AND r.changed_at < @cutoff;

        -- the orphans, oldest position first, one transaction each
        WHILE @full = 0
        BEGIN
            SET @slot = NULL;
            SELECT TOP (1) @slot = c.slot FROM @candidates AS c WHERE c.orphan = 1 ORDER BY c.msg_id;
            IF @slot IS NULL BREAK;
            DELETE FROM @candidates WHERE slot = @slot;
            SET @msg = NULL;
            BEGIN TRANSACTION;
            -- a savepoint, not the whole transaction, is rolled back below: a caller's
            -- transaction around this call survives a deferred rescue
            SAVE TRANSACTION ring_rescue;
            SELECT @msg = o.msg_id, @payload = o.payload, @headers = o.headers
            FROM {{ring}} AS o WITH (UPDLOCK, READPAST, ROWLOCK)
            WHERE o.slot = @slot AND o.state = 1 AND o.msg_id <= @pop_high AND o.changed_at < @cutoff;
            IF @msg IS NULL
            BEGIN
                COMMIT TRANSACTION;  -- taken, rescued or busy since the walk saw it
                CONTINUE;
            END
            -- one try at a new position: claimed and filled only if its slot is free now
            SET @new = NEXT VALUE FOR {{push_seq}};
            UPDATE r SET msg_id = @new, state = 1, payload = @payload, headers = @headers,
                         pushed_at = SYSUTCDATETIME(), changed_at = SYSUTCDATETIME()
            FROM {{ring}} AS r WITH (READCOMMITTEDLOCK, READPAST, ROWLOCK)
            WHERE r.slot = @new % {{size}} AND r.msg_id = @new - {{size}} AND r.state <> 1;
            IF @@ROWCOUNT = 0
            BEGIN
                -- the ring is full there: keep the orphan; the unused position becomes a hole
                -- that a later run tombstones. No more rescues this run; the walk goes on
                -- for the holes.
                ROLLBACK TRANSACTION ring_rescue;
                COMMIT TRANSACTION;
                INSERT INTO @actions VALUES (N'deferred', @msg, NULL, @slot);
                SET @full = 1;
                BREAK;
            END
            UPDATE {{ring}} SET state = 3, payload = NULL, headers = NULL, changed_at = SYSUTCDATETIME()
            WHERE slot = @slot;
            COMMIT TRANSACTION;
            INSERT INTO @actions VALUES (N'rescue', @msg, @new, @slot);
        END
        IF @found < 1000 BREAK;  -- the walk reached the last slot
    END
    SELECT action, item_id, new_item_id, slot FROM @actions;
END

-- name: create_ring_release_0003
-- The session's release, ring_release: give up its kept claims (since ring_0003).

-- ring_release for a session that may keep several claims per side: ring_0002's rules
-- (sql/mssql/history/ring.sql: create_ring_release_0002), one row per claim, push claims
-- first, oldest first. A rescue pushes through ring_push (a JSON array of one; the new id
-- comes back in its OUTPUT parameter) inside the release's transaction, which holds the old
-- slot's lock until the message is written anew. So the rescue never waits: ring_push is
-- called with @timeout = 0 (and does not wait inside a transaction anyway, the header), one
-- try; when the ring is full there, the rescue is rolled back to its savepoint and the
-- message stays FULL at its position for ring_repair ('deferred'). @timeout is the
-- PostgreSQL function's wait for that slot, accepted for the shared signature and not used.
CREATE OR ALTER PROCEDURE {{fn_ring_release}}
    @timeout float = 0.1
WITH EXECUTE AS OWNER
AS
BEGIN
    SET NOCOUNT ON; SET ROWCOUNT 0;
    SET XACT_ABORT ON;
    DECLARE @k_push sysname = CONCAT(N'queuectl.rpush.', OBJECT_ID({{ring_regclass}}));
    DECLARE @k_pop sysname = CONCAT(N'queuectl.rpop.', OBJECT_ID({{ring_regclass}}));
    DECLARE @claims TABLE (pos bigint NOT NULL PRIMARY KEY);
    DECLARE @out TABLE (seq int IDENTITY(1, 1) PRIMARY KEY, side nvarchar(4) NOT NULL,
                        item_id bigint NOT NULL, tombstoned bit NOT NULL,
                        new_item_id bigint NULL, outcome nvarchar(10) NOT NULL);
    DECLARE @pos bigint, @done int, @slot int, @new bigint, @payload varbinary(max), @headers nvarchar(max);
    DECLARE @one nvarchar(max), @ids nvarchar(max);
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
        SET @ids = NULL;
        EXEC {{fn_ring_push}} @items = @one, @timeout = 0, @ids = @ids OUTPUT;
        SET @new = CAST(@ids AS bigint);
        IF @new IS NULL
        BEGIN
            -- the ring is full there: the message stays FULL at @pos for ring_repair. The push
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

-- name: create_fanout_guard_0006
-- The guard (sql/postgresql/ring.sql, make_fanout explains it). SQL Server has no BEFORE
-- trigger that can skip a row: an AFTER UPDATE trigger on the slots, created (@enable = 1) or
-- dropped (@enable = 0) by this procedure through dynamic SQL, does the same once the
-- statement has run, inside its transaction: a plain push that wrote FULL over a fan-out
-- slot raises (THROW rolls the statement's transaction back); a tombstone (ring_repair,
-- ring_release) becomes PASSED where no active subscription still waits for the slot's
-- message, and is undone (the slot's previous row put back from `deleted`) where one does.
-- The trigger's own UPDATEs keep the state at 4 or 5, so its condition does not hold for
-- them (and RECURSIVE_TRIGGERS is off by default). ring_repair's OUTPUT is written before the
-- trigger runs: on SQL Server it may list a tombstone the guard undid.
CREATE OR ALTER PROCEDURE {{fn_fanout_guard}}
    @enable bit
WITH EXECUTE AS OWNER
AS
BEGIN
    SET NOCOUNT ON; SET ROWCOUNT 0;
    DECLARE @ring int = OBJECT_ID({{ring_regclass}});
    DECLARE @schema nvarchar(130) = QUOTENAME(OBJECT_SCHEMA_NAME(@ring));
    DECLARE @table nvarchar(300) = CONCAT(@schema, N'.', QUOTENAME(OBJECT_NAME(@ring)));
    DECLARE @trigger nvarchar(300) = CONCAT(@schema, N'.', QUOTENAME(CONCAT(OBJECT_NAME(@ring), N'_fanout_guard')));
    DECLARE @subs nvarchar(300) = CONCAT(@schema, N'.', QUOTENAME(OBJECT_NAME(OBJECT_ID({{subs_regclass}}))));
    DECLARE @slots nvarchar(300) = CONCAT(@schema, N'.', QUOTENAME(OBJECT_NAME(OBJECT_ID({{sub_slots_regclass}}))));
    DECLARE @sql nvarchar(max);
    IF @enable = 0
    BEGIN
        SET @sql = CONCAT(N'DROP TRIGGER IF EXISTS ', @trigger);
        EXEC sys.sp_executesql @sql;
        RETURN;
    END
    SET @sql = CONCAT(N'CREATE OR ALTER TRIGGER ', @trigger, N' ON ', @table, N' AFTER UPDATE AS
BEGIN
    SET NOCOUNT ON; SET ROWCOUNT 0;
    IF EXISTS (SELECT 1 FROM inserted AS i JOIN deleted AS d ON d.slot = i.slot WHERE d.state >= 4 AND i.state = 1)
        THROW 50003, N''this ring fans out: push with its publish procedure'', 1;
    UPDATE r SET state = 5, payload = NULL, headers = NULL
    FROM ', @table, N' AS r JOIN inserted AS i ON i.slot = r.slot JOIN deleted AS d ON d.slot = i.slot
    WHERE d.state >= 4 AND i.state < 4 AND (d.state = 5 OR NOT EXISTS (
        SELECT 1 FROM ', @subs, N' AS u JOIN ', @slots, N' AS k ON k.sub_id = u.sub_id AND k.slot = d.slot
        WHERE u.dropped_at IS NULL AND u.start_pos <= d.msg_id AND NOT (k.pos = d.msg_id AND k.lease_until IS NULL)));
    UPDATE r SET msg_id = d.msg_id, state = d.state, payload = d.payload, headers = d.headers,
                 pushed_at = d.pushed_at, changed_at = d.changed_at
    FROM ', @table, N' AS r JOIN inserted AS i ON i.slot = r.slot JOIN deleted AS d ON d.slot = i.slot
    WHERE d.state >= 4 AND i.state < 4 AND r.state < 4;
END');
    EXEC sys.sp_executesql @sql;
END

-- name: create_publish_0006
-- The fan-out push, publish (since ring_0006): sql/postgresql/ring.sql's publish, with the
-- claims kept in the session under ring_push's key (ring_release gives them up). It first
-- drops the droppable subscriptions that are behind. Then, like ring_push: claims (the
-- session's kept ones first, then a range from the sequence) are written in one UPDATE for
-- the longest run of them whose slots are free in the fan-out sense, found by a locking read
-- that keeps no lock (READCOMMITTEDLOCK, READPAST: a slot locked now is not free), then
-- written in a short transaction of its own that re-checks each slot under its update lock;
-- if that UPDATE writes fewer rows than the run, the run is rolled back and tried again. It
-- backs off (WAITFOR) only outside any transaction: inside a caller's transaction it keeps
-- what it could not write for the next call, as on a timeout. @items: the JSON array of
-- enqueue_many; result: one row per position written, in input order.
CREATE OR ALTER PROCEDURE {{fn_publish}}
    @items   nvarchar(max),
    @timeout float = 1.0
WITH EXECUTE AS OWNER
AS
BEGIN
    SET NOCOUNT ON; SET ROWCOUNT 0;
    SET XACT_ABORT ON;
    DECLARE @key sysname = CONCAT(N'queuectl.rpush.', OBJECT_ID({{ring_regclass}}));
    DECLARE @deadline datetime2(6) = DATEADD(millisecond,
        CAST(ROUND(CASE WHEN @timeout > 0 THEN @timeout ELSE 0 END * 1000e0, 0) AS int), SYSUTCDATETIME());
    DECLARE @pause_ms int = 4, @pause datetime, @n int, @done int = 0, @run int, @wrote int, @draw int;
    DECLARE @first sql_variant, @high bigint, @kept nvarchar(4000);
    DECLARE @src TABLE (ord int NOT NULL PRIMARY KEY, payload varbinary(max) NULL, headers nvarchar(max) NULL);
    DECLARE @claims TABLE (n int NOT NULL PRIMARY KEY, pos bigint NOT NULL UNIQUE);
    DECLARE @free TABLE (pos bigint NOT NULL PRIMARY KEY);
    DECLARE @written TABLE (ord int NOT NULL PRIMARY KEY, id bigint NOT NULL);
    INSERT INTO @src (ord, payload, headers)
    SELECT CAST(j.[key] AS int), CONVERT(varbinary(max), v.payload_hex, 2), v.headers
    FROM OPENJSON(@items) AS j
    CROSS APPLY OPENJSON(j.[value]) WITH (payload_hex nvarchar(max) '$.payload', headers nvarchar(max) '$.headers' AS JSON) AS v;
    SELECT @n = COUNT(*) FROM @src;
    IF @n = 0 RETURN;
    IF @n > 200 THROW 50004, N'publish takes at most 200 messages per call', 1;
    -- claims: the kept ones first (ascending), then new ones from one range
    INSERT INTO @claims (n, pos)
    SELECT TOP (@n) ROW_NUMBER() OVER (ORDER BY CAST(k.[value] AS bigint)) - 1, CAST(k.[value] AS bigint)
    FROM OPENJSON(CONCAT(N'[', CAST(SESSION_CONTEXT(@key) AS nvarchar(4000)), N']')) AS k
    ORDER BY CAST(k.[value] AS bigint);
    SELECT @kept = STRING_AGG(k.[value], N',') FROM (
        SELECT k.[value] FROM OPENJSON(CONCAT(N'[', CAST(SESSION_CONTEXT(@key) AS nvarchar(4000)), N']')) AS k
        WHERE CAST(k.[value] AS bigint) NOT IN (SELECT pos FROM @claims)) AS k;
    SET @draw = @n - (SELECT COUNT(*) FROM @claims);
    IF @draw > 0
    BEGIN
        EXEC sys.sp_sequence_get_range @sequence_name = {{push_seq_regclass}}, @range_size = @draw,
                                       @range_first_value = @first OUTPUT;
        INSERT INTO @claims (n, pos)
        SELECT TOP (@draw) @n - @draw + ROW_NUMBER() OVER (ORDER BY (SELECT NULL)) - 1,
               CAST(@first AS bigint) + ROW_NUMBER() OVER (ORDER BY (SELECT NULL)) - 1
        FROM sys.all_columns;
    END
    WHILE @done < @n
    BEGIN
        -- the droppable subscriptions past their lag limit are dropped
        SELECT @high = COALESCE(CAST(s.last_used_value AS bigint), -1)
        FROM sys.sequences AS s WHERE s.object_id = OBJECT_ID({{push_seq_regclass}});
        UPDATE {{subs}} SET dropped_at = SYSUTCDATETIME()
        WHERE dropped_at IS NULL AND drop_when_behind = 1 AND next_pos < @high + 1 - lag_limit;
        -- the longest run of free slots from the first unwritten claim
        DELETE FROM @free;
        INSERT INTO @free (pos)
        SELECT c.pos FROM @claims AS c
        JOIN {{ring}} AS s WITH (READCOMMITTEDLOCK, READPAST, ROWLOCK) ON s.slot = c.pos % {{size}}
        WHERE c.n >= @done AND s.msg_id = c.pos - {{size}} AND s.state >= 4
          AND (s.state = 5 OR NOT EXISTS (
              SELECT 1 FROM {{subs}} AS u JOIN {{sub_slots}} AS k ON k.sub_id = u.sub_id AND k.slot = s.slot
              WHERE u.dropped_at IS NULL AND u.start_pos <= s.msg_id AND NOT (k.pos = s.msg_id AND k.lease_until IS NULL)));
        SELECT @run = COALESCE(MIN(c.n), @n) - @done FROM @claims AS c
        WHERE c.n >= @done AND c.pos NOT IN (SELECT pos FROM @free);
        IF @run > 0
        BEGIN
            BEGIN TRANSACTION;
            SAVE TRANSACTION run;
            UPDATE r
            SET msg_id = c.pos, state = 4, payload = p.payload, headers = p.headers,
                pushed_at = SYSUTCDATETIME(), changed_at = SYSUTCDATETIME()
            OUTPUT p.ord, inserted.msg_id INTO @written (ord, id)
            FROM @claims AS c
            JOIN @src AS p ON p.ord = c.n
            JOIN {{ring}} AS r WITH (UPDLOCK, ROWLOCK) ON r.slot = c.pos % {{size}}
            WHERE c.n >= @done AND c.n < @done + @run AND r.msg_id = c.pos - {{size}} AND r.state >= 4
              AND (r.state = 5 OR NOT EXISTS (
                  SELECT 1 FROM {{subs}} AS u JOIN {{sub_slots}} AS k ON k.sub_id = u.sub_id AND k.slot = r.slot
                  WHERE u.dropped_at IS NULL AND u.start_pos <= r.msg_id
                    AND NOT (k.pos = r.msg_id AND k.lease_until IS NULL)));
            SET @wrote = @@ROWCOUNT;
            IF @wrote < @run
            BEGIN
                ROLLBACK TRANSACTION run;
                DELETE FROM @written WHERE ord >= @done;
                SET @wrote = 0;
            END
            COMMIT TRANSACTION;
            SET @done += @wrote;
            IF @wrote > 0 CONTINUE;
        END
        -- a claim a tombstone passed (ring_repair, ring_release): replaced by a new position
        IF EXISTS (SELECT 1 FROM @claims AS c
                   JOIN {{ring}} AS h WITH (READCOMMITTEDLOCK, ROWLOCK) ON h.slot = c.pos % {{size}}
                   WHERE c.n = @done AND h.msg_id >= c.pos)
        BEGIN
            UPDATE @claims SET pos = NEXT VALUE FOR {{push_seq}} WHERE n = @done;
            CONTINUE;
        END
        IF SYSUTCDATETIME() >= @deadline OR @@TRANCOUNT > 0 BREAK;
        SET @pause = DATEADD(millisecond, @pause_ms, CAST(0 AS datetime));
        WAITFOR DELAY @pause;
        SET @pause_ms = CASE WHEN @pause_ms * 2 > 50 THEN 50 ELSE @pause_ms * 2 END;
    END
    SELECT @kept = CONCAT_WS(N',', NULLIF(STRING_AGG(CAST(c.pos AS nvarchar(20)), N',') WITHIN GROUP (ORDER BY c.pos), N''),
                             NULLIF(@kept, N''))
    FROM @claims AS c WHERE c.n >= @done;
    EXEC sys.sp_set_session_context @key = @key, @value = @kept;
    SELECT id FROM @written ORDER BY ord;
END

-- name: create_sub_take_0006
-- A subscription's pop, sub_take (since ring_0006): sql/postgresql/ring.sql's sub_take. The
-- cursor row is read without a lock first; only when there is something to take (the scan for
-- expired claims is due, or the slot of the next position holds it or a later one) does it
-- lock the row (UPDLOCK, ROWLOCK) in a short transaction of its own that claims and moves the
-- cursor, and commits before it returns: no WAITFOR inside it. The window of positions reads
-- the slots WITH (READCOMMITTEDLOCK, READPAST, ROWLOCK): a slot locked now is a publish not
-- committed yet, and the cursor stops there as at a position not published. Waits
-- (WAITFOR) only before the lock, and never inside a caller's transaction.
CREATE OR ALTER PROCEDURE {{fn_sub_take}}
    @name    nvarchar(48),
    @batch   int   = 1,
    @lease   float = 30,
    @timeout float = 0
WITH EXECUTE AS OWNER
AS
BEGIN
    SET NOCOUNT ON; SET ROWCOUNT 0;
    SET XACT_ABORT ON;
    DECLARE @deadline datetime2(6) = DATEADD(millisecond,
        CAST(ROUND(CASE WHEN @timeout > 0 THEN @timeout ELSE 0 END * 1000e0, 0) AS int), SYSUTCDATETIME());
    DECLARE @lease_ms int = CAST(ROUND(CASE WHEN @lease > 0 THEN @lease ELSE 0 END * 1000e0, 0) AS int);
    DECLARE @pause_ms int = 4, @pause datetime, @sub int, @next bigint, @scan datetime2(6), @high bigint,
            @got int = 0, @n int, @stop bigint;
    DECLARE @win TABLE (pos bigint NOT NULL PRIMARY KEY, slot int NOT NULL, msg_id bigint NULL, state smallint NULL);
    DECLARE @out TABLE (id bigint NOT NULL PRIMARY KEY, slot int NOT NULL, tries int NOT NULL);
    IF @batch IS NULL OR @batch < 1 THROW 50005, N'batch must be at least 1', 1;
    WHILE 1 = 1
    BEGIN
        SELECT @sub = sub_id, @next = next_pos, @scan = scan_at FROM {{subs}} WHERE name = @name AND dropped_at IS NULL;
        IF @@ROWCOUNT = 0 THROW 50002, N'this ring has no such active subscription', 1;
        SELECT @high = COALESCE(CAST(s.last_used_value AS bigint), -1)
        FROM sys.sequences AS s WHERE s.object_id = OBJECT_ID({{push_seq_regclass}});
        IF @scan <= SYSUTCDATETIME() OR (@next <= @high AND EXISTS (
               SELECT 1 FROM {{ring}} AS r WITH (READCOMMITTEDLOCK, READPAST, ROWLOCK)
               WHERE r.slot = @next % {{size}} AND r.msg_id >= @next))
        BEGIN
            BEGIN TRANSACTION;
            SELECT @next = next_pos, @scan = scan_at FROM {{subs}} WITH (UPDLOCK, ROWLOCK)
            WHERE sub_id = @sub AND dropped_at IS NULL;
            IF @@ROWCOUNT = 0
            BEGIN
                COMMIT TRANSACTION;
                CONTINUE;  -- dropped meanwhile: the read above reports it
            END
            IF @scan <= SYSUTCDATETIME()
            BEGIN
                UPDATE TOP (@batch) k
                SET lease_until = DATEADD(millisecond, @lease_ms, SYSUTCDATETIME()), tries = k.tries + 1
                OUTPUT inserted.pos, inserted.slot, inserted.tries INTO @out (id, slot, tries)
                FROM {{sub_slots}} AS k WITH (ROWLOCK, READPAST)
                WHERE k.sub_id = @sub AND k.lease_until < SYSUTCDATETIME();
                SET @got = @@ROWCOUNT;
                IF @got < @batch
                    UPDATE {{subs}} SET scan_at = DATEADD(second, 1, SYSUTCDATETIME()) WHERE sub_id = @sub;
            END
            IF @got < @batch AND @next <= @high
            BEGIN
                SET @n = CASE WHEN @batch - @got < @high - @next + 1 THEN @batch - @got ELSE CAST(@high - @next + 1 AS int) END;
                INSERT INTO @win (pos, slot, msg_id, state)
                SELECT g.pos, CAST(g.pos % {{size}} AS int), r.msg_id, r.state
                FROM (SELECT TOP (@n) @next + ROW_NUMBER() OVER (ORDER BY (SELECT NULL)) - 1 AS pos FROM sys.all_columns) AS g
                LEFT JOIN {{ring}} AS r WITH (READCOMMITTEDLOCK, READPAST, ROWLOCK) ON r.slot = g.pos % {{size}};
                -- the first position not published, or whose slot is locked now (READPAST: no row)
                SELECT @stop = COALESCE(MIN(w.pos), @next + @n) FROM @win AS w WHERE w.msg_id IS NULL OR w.msg_id < w.pos;
                UPDATE k SET pos = w.pos, lease_until = DATEADD(millisecond, @lease_ms, SYSUTCDATETIME()), tries = 1
                OUTPUT inserted.pos, inserted.slot, inserted.tries INTO @out (id, slot, tries)
                FROM @win AS w
                JOIN {{sub_slots}} AS k WITH (ROWLOCK) ON k.sub_id = @sub AND k.slot = w.slot
                WHERE w.pos < @stop AND w.msg_id = w.pos AND w.state = 4;
                UPDATE {{subs}} SET next_pos = @stop WHERE sub_id = @sub;
            END
            COMMIT TRANSACTION;
            -- version read: a claimed slot cannot change until the subscription acknowledges
            -- it (the producer waits for that), so its committed row is the message
            SELECT o.id, r.payload, r.headers, r.pushed_at AS enqueued_at, SYSUTCDATETIME() AS dequeued_at, o.tries
            FROM @out AS o JOIN {{ring}} AS r WITH (READCOMMITTEDLOCK, ROWLOCK) ON r.slot = o.slot
            ORDER BY o.id;
            RETURN;
        END
        IF SYSUTCDATETIME() >= @deadline OR @@TRANCOUNT > 0 BREAK;
        SET @pause = DATEADD(millisecond, @pause_ms, CAST(0 AS datetime));
        WAITFOR DELAY @pause;
        SET @pause_ms = CASE WHEN @pause_ms * 2 > 50 THEN 50 ELSE @pause_ms * 2 END;
    END
    SELECT o.id, CAST(NULL AS varbinary(max)) AS payload, CAST(NULL AS nvarchar(max)) AS headers,
           CAST(NULL AS datetime2(6)) AS enqueued_at, CAST(NULL AS datetime2(6)) AS dequeued_at, o.tries
    FROM @out AS o WHERE 1 = 0;
END
