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

-- name: create_enqueue_many
-- The SQL API as stored procedures, callable from any language, one section per procedure:
-- the batch push (enqueue_many, this section), the single push (enqueue), the pop (dequeue),
-- the recovery path (ring_repair) and the session's release (ring_release). The batch push
-- and the pop share the design below.
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
    DECLARE @pause_ms int = 4,  -- WAITFOR takes a datetime (1/300 s): 1 ms would round to no wait
            @pause datetime, @n int, @done int = 0, @run int, @draw int;
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

-- name: create_enqueue
-- The single push, enqueue (since ring_0003).
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

-- name: create_dequeue
-- The pop, dequeue (since ring_0003; create_enqueue_many explains its claims).
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

-- name: create_ring_repair
-- The recovery path, ring_repair (since ring_0001).
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

-- name: create_ring_release
-- The session's release, ring_release: give up its kept claims (since ring_0003).

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

-- name: drop_ring_release
-- Remove ring_0002's ring_release.
DROP PROCEDURE IF EXISTS {{fn_ring_release}};

-- name: set_autovacuum
-- Nothing on SQL Server, where ring_0004 takes the cost delay off the vacuum of the slots'
-- TOAST table on PostgreSQL. SQL Server has no per-table autovacuum (sql/mssql/reliable.sql: set_autovacuum says
-- more): large payloads are LOB pages that the instance's ghost cleanup reclaims, with no
-- per-table setting. Empty on purpose (no batch runs).

-- name: reset_autovacuum
-- Nothing to reset: set_autovacuum set nothing (ring_0004's downgrade). Empty on purpose.

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
-- Client call: give up this session's kept claims, and rescue a message that arrived at
-- the pop claim with the procedure's default timeout (since ring_0002). No argument: the same
-- call serves a queue still at ring_0001, whose procedure returns three columns.
EXEC {{fn_ring_release}}

-- name: counts
-- Depth for `queuectl list`: the FULL slots.
SELECT CAST(0 AS smallint) AS status, CAST(0 AS bit) AS scheduled, COUNT_BIG(*) AS n
FROM {{ring}} WHERE state = 1
