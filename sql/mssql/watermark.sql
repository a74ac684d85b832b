-- The watermark queue on SQL Server: a FIFO whose dequeue range-seeks from a low watermark.
-- The same sections as sql/postgresql/watermark.sql.
--
-- Why: a FIFO dequeue deletes at the head of the clustered index. A deleted row stays on
-- its page as a ghost record until the single ghost-cleanup task (every 5 s, a few pages
-- each time) removes it, and as a version ghost for as long as any snapshot transaction
-- (SNAPSHOT isolation, RCSI statements, readable secondaries) may still read it. A dequeue
-- that starts at the beginning of the index walks every one of those ghosts again; under
-- a busy queue with an open snapshot that walk grows without bound. This dequeue seeks
-- `id >= low` instead, so it walks only the ghosts left since `low` last moved.
--
-- Where the watermark lives: the working value in the consumer's session
-- (SESSION_CONTEXT, keyed by the procedure's object id), read and written by dequeues for
-- free; <queue>_watermark holds one row, a hint for new sessions, written at most once a
-- second per consumer and only outside a caller's transaction (inside one, the row's lock
-- would last until that transaction ends and stall every other session's move), and
-- rewritten by correct_watermark (epoch changes; every session adopts the corrected value
-- at its next move).
--
-- How it moves, and why it never passes an item that can still be dequeued. Every 100th
-- dequeue call of a session attempts a move, after that call's DELETE:
--  1. An id is drawn and its row inserted by ONE statement (enqueue: the column default;
--     enqueue_many: NEXT VALUE FOR ... OVER inside its INSERT ... SELECT). Even so, a drawn
--     id is not yet a row: an INSERT of many rows may draw all its ids before it inserts the
--     first (a sort between the two), and an insert can wait (a lock, a file growth).
--  2. At a move the session records a candidate, the highest id drawn so far
--     (sys.sequences.last_used_value), and then the time: every id up to the candidate was
--     drawn no later than that time.
--  3. GRACE: a later move uses the candidate only once it is older than
--     <queue>_watermark.grace_ms (5,000 ms unless a DBA changes it). This rests on one
--     assumption: every INSERT into the items table inserts each row within grace_ms of
--     drawing its id. Then every id up to the candidate is a row in the table (committed,
--     or uncommitted and key-locked by its transaction), a row deleted since, or an id that
--     never becomes a row (its statement failed).
--  4. The new low is the smallest of: the candidate + 1; the smallest id still present at
--     or above the old low; the smallest id this session deleted in a caller's transaction
--     that is still open (step 5). "Present" counts every row that can still be dequeued,
--     read twice: first WITH (NOLOCK), which sees uncommitted inserts (not uncommitted
--     deletes: those rows are ghosts to it), then WITH (READCOMMITTED), which under
--     READ_COMMITTED_SNAPSHOT reads row versions (a row whose DELETE has not committed is
--     still there, and nothing waits) and without it takes shared locks, released after
--     the read whatever the caller's isolation level, waiting for those rows (table hints,
--     READCOMMITTED: https://learn.microsoft.com/sql/t-sql/queries/hints-transact-sql-table).
--     In that order, a row cannot slip between the two reads. Every lock wait of a move is
--     bounded (SET LOCK_TIMEOUT 50 ms inside the procedure); when one runs out (error 1222)
--     the move does nothing: the old low and the candidate stay and the next move retries
--     (likewise error 601, a NOLOCK read that lost its page to ghost cleanup). Without
--     READ_COMMITTED_SNAPSHOT, consumers that keep their batch in a long transaction hold
--     moves back this way; the low stays correct.
--  5. ROLLBACK: SESSION_CONTEXT is not transactional. Rows this session deleted in a
--     caller's transaction still open are gone to its own reads and come back if that
--     transaction rolls back, after the session's low has moved. So each dequeue in a
--     transaction keeps the smallest id it deleted there, with CURRENT_TRANSACTION_ID(), and
--     a move made in the same transaction never passes it. Rows that other transactions
--     deleted count as present until their DELETE commits (step 4), so their rollback
--     cannot strand them either.
-- When the grace assumption fails (an INSERT took longer than grace_ms between drawing an
-- id and inserting its row), that item can end up below the sessions' lows: it is late, not
-- lost. correct_watermark records the smallest id present (head), lowers a stored low above
-- it (new epoch: every session adopts it at its next move), and a session whose own low is
-- above that head, while the head row still exists, goes back to it at its next move.
-- Raise grace_ms where enqueue statements can take that long (a very large enqueue_many, a
-- producer blocked inside its INSERT); a larger grace only makes the low trail the head
-- further. Insert into the table only through the enqueue procedures.
--
-- Procedures that read catalog metadata (sys.sequences, OBJECT_ID) run WITH EXECUTE AS
-- OWNER: metadata visibility follows the caller, and a role granted only EXECUTE
-- (`queuectl grant`) would see no sequence and no table.
--
-- Batches inside a section are separated by GO lines (see reliable.sql). Sections are
-- filled by queuectl.sqlfiles.render() with quoted identifiers only.

-- name: create_tables
-- The items (a FIFO table), their id sequence and the one-row watermark hint.
CREATE SEQUENCE {{items_seq}} AS bigint START WITH 1 INCREMENT BY 1 CACHE 1000;
GO
CREATE TABLE {{items}} (
    id          bigint         NOT NULL DEFAULT (NEXT VALUE FOR {{items_seq}}) PRIMARY KEY CLUSTERED,
    payload     varbinary(max) NOT NULL,
    headers     nvarchar(max)  NULL CHECK (headers IS NULL OR ISJSON(headers) = 1),
    enqueued_at datetime2(6)   NOT NULL DEFAULT SYSUTCDATETIME()
);
GO
-- low: no item with a smaller id can still be dequeued (a hint for new sessions).
-- epoch: bumped whenever correct_watermark changes low; sessions then adopt it.
-- pending_low: correct_watermark's candidate from its previous run (run at corrected_at).
-- head: the smallest id present at correct_watermark's last run; a session whose low is
--   above it while that row still exists goes back to it (the header's failure path).
-- grace_ms: how old a candidate must be before a move or a raise uses it (the header's
--   step 3); raise it where an enqueue statement can take longer.
CREATE TABLE {{watermark}} (
    only_row     bit          NOT NULL PRIMARY KEY DEFAULT 1 CHECK (only_row = 1),
    low          bigint       NOT NULL DEFAULT 1,
    epoch        bigint       NOT NULL DEFAULT 0,
    pending_low  bigint       NULL,
    head         bigint       NULL,
    grace_ms     int          NOT NULL DEFAULT 5000 CHECK (grace_ms >= 0),
    updated_at   datetime2(6) NOT NULL DEFAULT SYSUTCDATETIME(),
    corrected_at datetime2(6) NULL
);
GO
INSERT INTO {{watermark}} DEFAULT VALUES;

-- name: create_functions
-- The SQL API as stored procedures, callable from any language.

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
-- @items is a JSON array of {"payload": "<hex>", "headers": {...} | null}.
-- ONE statement draws the ids and inserts the rows (the header's step 1): a draw kept
-- apart from its INSERT (a table variable filled first) would leave drawn ids with no row
-- and no lock for as long as the caller's transaction likes. NEXT VALUE FOR ... OVER
-- (ORDER BY ...) is allowed in an INSERT ... SELECT without TOP, OFFSET or a subquery
-- around it (NEXT VALUE FOR, "Limitations and Restrictions":
-- https://learn.microsoft.com/sql/t-sql/functions/next-value-for-transact-sql). OUTPUT
-- cannot name the source's ordinal, but the OVER clause draws the ids in input order, so
-- ascending ids are the input order.
CREATE OR ALTER PROCEDURE {{fn_enqueue_many}}
    @items nvarchar(max)
AS
BEGIN
    SET NOCOUNT ON; SET ROWCOUNT 0;
    SET XACT_ABORT ON;
    DECLARE @ids TABLE (id bigint NOT NULL PRIMARY KEY);
    INSERT INTO {{items}} (id, payload, headers)
    OUTPUT inserted.id INTO @ids (id)
    SELECT NEXT VALUE FOR {{items_seq}} OVER (ORDER BY CAST(j.[key] AS int)),
           CONVERT(varbinary(max), v.payload_hex, 2), v.headers
    FROM OPENJSON(@items) AS j
    CROSS APPLY OPENJSON(j.[value]) WITH (
        payload_hex nvarchar(max) '$.payload',
        headers     nvarchar(max) '$.headers' AS JSON
    ) AS v;
    SELECT i.id FROM @ids AS i ORDER BY i.id;
END
GO
-- correct_watermark: recompute the true low bound (the smallest id that can still be
-- dequeued, else the sequence's next value) and fix the stored hint; sessions adopt a
-- changed hint at their next move. Meant for a job every 5 minutes: it walks the index from
-- its start, over every ghost, once per run, and does so BEFORE it locks the watermark row,
-- which it then holds only for a short compare-and-update (sessions' moves read that row).
--  * stored low too high (items below it are unreachable): lowered at once;
--  * stored low too low (dequeues walk needless ghosts): raised to the true bound, but
--    never past the candidate this procedure recorded on its previous run, and only once
--    that run is older than grace_ms (the header's step 3), so a fresh raise takes two runs;
--  * the walk's lock waits are bounded (5 s each): when one runs out, nothing is written
--    and the row says so (true_low NULL); the next run retries.
-- It also records the head it found, for sessions whose own low passed an item (header).
-- Returns one row: old_low, new_low, true_low, changed, reason.
CREATE OR ALTER PROCEDURE {{fn_correct_watermark}}
WITH EXECUTE AS OWNER
AS
BEGIN
    SET NOCOUNT ON; SET ROWCOUNT 0;
    -- Until the walk is read, a lock timeout (error 1222) must end only its statement, not a
    -- caller's transaction: XACT_ABORT is off here and set on for the update below.
    SET XACT_ABORT OFF;
    SET LOCK_TIMEOUT 5000;
    DECLARE @next bigint, @old bigint, @pending bigint, @corrected_at datetime2(6), @grace_ms int;
    DECLARE @dirty bigint, @committed bigint, @head bigint, @true bigint, @new bigint;
    DECLARE @reason nvarchar(200);
    -- the next id to be drawn, read before the walk: every smaller id was drawn by now
    SELECT @next = COALESCE(CAST(s.last_used_value AS bigint), 0) + 1
    FROM sys.sequences AS s WHERE s.object_id = OBJECT_ID({{items_seq_regclass}});
    BEGIN TRY
        -- the smallest id that can still be dequeued (the header's step 4): NOLOCK first
        -- sees uncommitted inserts; READCOMMITTED then sees rows whose DELETE has not
        -- committed (a row version under READ_COMMITTED_SNAPSHOT, else after a lock wait)
        SELECT @dirty = MIN(i.id) FROM {{items}} AS i WITH (NOLOCK);
        SELECT @committed = MIN(i.id) FROM {{items}} AS i WITH (READCOMMITTED);
    END TRY
    BEGIN CATCH
        IF ERROR_NUMBER() NOT IN (1222, 601) OR XACT_STATE() = -1
            THROW;
        SELECT @old = w.low FROM {{watermark}} AS w WITH (NOLOCK);
        SELECT @old AS old_low, @old AS new_low, CAST(NULL AS bigint) AS true_low,
               CAST(0 AS bit) AS changed,
               N'deferred: a lock wait of the walk ran out; the next run retries' AS reason;
        RETURN;
    END CATCH
    SET @head = CASE WHEN @committed IS NULL OR @dirty < @committed THEN @dirty ELSE @committed END;
    SET @true = COALESCE(@head, @next);
    SET XACT_ABORT ON;
    BEGIN TRANSACTION;
    SELECT @old = w.low, @pending = w.pending_low, @corrected_at = w.corrected_at, @grace_ms = w.grace_ms
    FROM {{watermark}} AS w WITH (UPDLOCK, ROWLOCK);
    IF @old > @true
        SELECT @new = @true, @reason = N'lowered: items below the stored watermark were unreachable';
    ELSE IF @old < @true AND @pending IS NOT NULL
            AND @corrected_at <= DATEADD(millisecond, -@grace_ms, SYSUTCDATETIME())
        SELECT @new = CASE WHEN @true < @pending THEN @true ELSE @pending END,
               @reason = N'raised up to the previous run''s settled candidate';
    ELSE IF @old < @true
        SELECT @new = @old, @reason = N'raise deferred: the next run completes it';
    ELSE
        SELECT @new = @old, @reason = N'already correct';
    IF @new < @old AND @old <= @true
        SET @new = @old;  -- never lower a correct watermark while raising
    UPDATE {{watermark}} SET
        low          = @new,
        epoch        = epoch + CASE WHEN @new <> @old THEN 1 ELSE 0 END,
        pending_low  = @next,
        head         = @head,
        updated_at   = SYSUTCDATETIME(),
        corrected_at = SYSUTCDATETIME();
    COMMIT TRANSACTION;
    SELECT @old AS old_low, @new AS new_low, @true AS true_low,
           CAST(CASE WHEN @new <> @old THEN 1 ELSE 0 END AS bit) AS changed, @reason AS reason;
END

-- name: create_correct_watermark
-- create_functions creates correct_watermark here. On PostgreSQL this section holds it so that
-- watermark_0005 can give it the isolation check against the compact job's TRUNCATE; SQL Server
-- has no compaction, so nothing is replaced. Empty on purpose.

-- name: create_dequeue
-- The dequeue procedure of every revision (CREATE OR ALTER: watermark_0001 and the downgrade
-- of watermark_0002 run it). It deletes through its TOP pick, with no join to the picks, so
-- watermark_0002's PostgreSQL change has nothing to fix here.

-- dequeue: ONE statement takes up to @batch items at or above the session's watermark,
-- oldest first, skipping rows other consumers hold. After it, every 100th call attempts a
-- move of the session's watermark (see the header, steps 2 to 5).
CREATE OR ALTER PROCEDURE {{fn_dequeue}}
    @batch int = 1
WITH EXECUTE AS OWNER
AS
BEGIN
    SET NOCOUNT ON; SET ROWCOUNT 0;
    DECLARE @n int = CASE WHEN @batch > 0 THEN @batch ELSE 0 END;
    DECLARE @now datetime2(6) = SYSUTCDATETIME();
    DECLARE @k_low sysname = CONCAT(N'queuectl.wm.', @@PROCID, N'.low');
    DECLARE @k_calls sysname = CONCAT(N'queuectl.wm.', @@PROCID, N'.calls');
    DECLARE @k_cand sysname = CONCAT(N'queuectl.wm.', @@PROCID, N'.candidate');
    DECLARE @k_cand_at sysname = CONCAT(N'queuectl.wm.', @@PROCID, N'.candidate_at');
    DECLARE @k_epoch sysname = CONCAT(N'queuectl.wm.', @@PROCID, N'.epoch');
    DECLARE @k_txn sysname = CONCAT(N'queuectl.wm.', @@PROCID, N'.txn');
    DECLARE @k_held sysname = CONCAT(N'queuectl.wm.', @@PROCID, N'.held');
    DECLARE @low bigint = CAST(SESSION_CONTEXT(@k_low) AS bigint);
    DECLARE @calls int = COALESCE(CAST(SESSION_CONTEXT(@k_calls) AS int), 0) + 1;
    DECLARE @epoch bigint = CAST(SESSION_CONTEXT(@k_epoch) AS bigint);
    DECLARE @cand bigint = CAST(SESSION_CONTEXT(@k_cand) AS bigint);
    DECLARE @cand_at datetime2(6) = CAST(SESSION_CONTEXT(@k_cand_at) AS datetime2(6));
    DECLARE @txn bigint, @held bigint, @taken_min bigint;
    DECLARE @s_low bigint, @s_epoch bigint, @s_updated datetime2(6), @s_head bigint, @grace_ms int;
    DECLARE @new bigint, @new_epoch bigint, @new_cand bigint, @new_cand_at datetime2(6);
    DECLARE @dirty bigint, @committed bigint;

    IF @low IS NULL
    BEGIN
        -- first dequeue of this session: start from the stored hint, with no candidate
        SELECT @low = w.low, @epoch = w.epoch FROM {{watermark}} AS w WITH (READCOMMITTED);
        SET @cand = NULL;
        EXEC sys.sp_set_session_context @key = @k_low, @value = @low;
        EXEC sys.sp_set_session_context @key = @k_epoch, @value = @epoch;
        EXEC sys.sp_set_session_context @key = @k_cand, @value = NULL;
    END

    DECLARE @taken TABLE (id bigint NOT NULL PRIMARY KEY, payload varbinary(max) NOT NULL,
                          headers nvarchar(max) NULL, enqueued_at datetime2(6) NOT NULL);
    WITH picked AS (
        SELECT TOP (@n) i.id, i.payload, i.headers, i.enqueued_at
        FROM {{items}} AS i WITH (UPDLOCK, READPAST, ROWLOCK)
        WHERE i.id >= @low
        ORDER BY i.id
    )
    DELETE FROM picked
    OUTPUT deleted.id, deleted.payload, deleted.headers, deleted.enqueued_at
    INTO @taken (id, payload, headers, enqueued_at);

    -- Inside a caller's transaction (explicit, or implicit as the ODBC driver's manual-commit
    -- mode opens), keep the smallest id deleted in it: a rollback puts those rows back, and
    -- no move made in the same transaction may pass them (the header's step 5).
    IF @@TRANCOUNT > 0
    BEGIN
        SELECT @taken_min = MIN(t.id) FROM @taken AS t;
        IF @taken_min IS NOT NULL
        BEGIN
            SET @txn = CURRENT_TRANSACTION_ID();
            SET @held = CAST(SESSION_CONTEXT(@k_held) AS bigint);
            IF CAST(SESSION_CONTEXT(@k_txn) AS bigint) = @txn AND @held < @taken_min
                SET @taken_min = @held;
            EXEC sys.sp_set_session_context @key = @k_txn, @value = @txn;
            EXEC sys.sp_set_session_context @key = @k_held, @value = @taken_min;
        END
    END

    IF @calls >= 100
    BEGIN
        SET @calls = 0;
        SET @held = NULL;
        IF @@TRANCOUNT > 0 AND CAST(SESSION_CONTEXT(@k_txn) AS bigint) = CURRENT_TRANSACTION_ID()
            SET @held = CAST(SESSION_CONTEXT(@k_held) AS bigint);
        -- Every lock wait of the move is bounded; a timeout (error 1222) ends only its
        -- statement (XACT_ABORT off, so a caller's transaction survives it) and the move
        -- then does nothing. Both settings end with the procedure; the DELETE above ran
        -- with the caller's.
        SET XACT_ABORT OFF;
        SET LOCK_TIMEOUT 50;
        BEGIN TRY
            SELECT @s_low = w.low, @s_epoch = w.epoch, @s_updated = w.updated_at,
                   @s_head = w.head, @grace_ms = w.grace_ms
            FROM {{watermark}} AS w WITH (READCOMMITTED);
            SELECT @new = @low, @new_epoch = @epoch, @new_cand = @cand, @new_cand_at = @cand_at;
            IF @s_epoch <> @epoch
            BEGIN
                -- correct_watermark rewrote the hint: adopt it, drop our candidate
                SELECT @new = @s_low, @new_epoch = @s_epoch, @new_cand = NULL, @new_cand_at = NULL;
            END
            ELSE
            BEGIN
                -- an item the last correction found below our low still exists: go back
                -- to it (the header's failure path)
                IF @s_head < @new
                   AND (EXISTS (SELECT 1 FROM {{items}} AS i WITH (NOLOCK) WHERE i.id = @s_head)
                        OR EXISTS (SELECT 1 FROM {{items}} AS i WITH (READCOMMITTED) WHERE i.id = @s_head))
                    SET @new = @s_head;
                IF @cand IS NOT NULL AND @cand_at <= DATEADD(millisecond, -@grace_ms, SYSUTCDATETIME())
                BEGIN
                    -- every id up to the candidate is a row, a deleted row or never a row
                    -- (steps 3 and 4): move to the smallest of the candidate + 1 and the
                    -- first id still present, NOLOCK first (uncommitted inserts), then
                    -- READCOMMITTED (uncommitted deletes: a row version, or a lock wait)
                    SELECT @dirty = MIN(i.id) FROM {{items}} AS i WITH (NOLOCK) WHERE i.id >= @new;
                    SELECT @committed = MIN(i.id) FROM {{items}} AS i WITH (READCOMMITTED) WHERE i.id >= @new;
                    SET @new = @cand + 1;
                    IF @dirty < @new SET @new = @dirty;
                    IF @committed < @new SET @new = @committed;
                    SET @new_cand = NULL;
                END
                IF @new_cand IS NULL
                BEGIN
                    -- the next candidate: the highest id drawn so far (last_used_value: NULL
                    -- before the first draw), then the time, read after it (step 2)
                    SELECT @new_cand = COALESCE(CAST(s.last_used_value AS bigint), 0)
                    FROM sys.sequences AS s
                    WHERE s.object_id = OBJECT_ID({{items_seq_regclass}});
                    SET @new_cand_at = SYSUTCDATETIME();
                END
            END
            IF @held < @new
                SET @new = @held;
            -- persist rarely, outside a caller's transaction, never over a correction
            -- (epoch), never backwards; READPAST: a row the correction holds is skipped
            IF @new > @s_low AND @s_updated < DATEADD(second, -1, @now) AND @@TRANCOUNT = 0
                UPDATE w SET low = @new, updated_at = SYSUTCDATETIME()
                FROM {{watermark}} AS w WITH (ROWLOCK, READPAST)
                WHERE w.epoch = @new_epoch AND w.low < @new;
            SELECT @low = @new, @epoch = @new_epoch, @cand = @new_cand, @cand_at = @new_cand_at;
            EXEC sys.sp_set_session_context @key = @k_low, @value = @low;
            EXEC sys.sp_set_session_context @key = @k_epoch, @value = @epoch;
            EXEC sys.sp_set_session_context @key = @k_cand, @value = @cand;
            EXEC sys.sp_set_session_context @key = @k_cand_at, @value = @cand_at;
        END TRY
        BEGIN CATCH
            IF ERROR_NUMBER() NOT IN (1222, 601) OR XACT_STATE() = -1
                THROW;
            -- a lock wait ran out (1222), or a NOLOCK read lost its place to a page that
            -- ghost cleanup freed (601): no move; the session's low and candidate stay as
            -- they were and the next move retries
        END CATCH
    END
    EXEC sys.sp_set_session_context @key = @k_calls, @value = @calls;

    -- OUTPUT returns rows in no defined order: hand the batch out in the queue's order,
    -- as PostgreSQL's dequeue does.
    SELECT t.id, t.payload, t.headers, t.enqueued_at, @now AS dequeued_at
    FROM @taken AS t ORDER BY t.id;
END

-- name: set_plan_guard
-- watermark_0004 on PostgreSQL keeps the dequeue's cached generic plan off sequential scans;
-- sql/mssql/reliable.sql, set_plan_guard, says why nothing is set here. Empty on purpose.

-- name: reset_plan_guard
-- watermark_0004 downgrade: nothing was set. Empty on purpose.

-- name: drop_functions
-- Remove the SQL API.
DROP PROCEDURE IF EXISTS {{fn_correct_watermark}};
DROP PROCEDURE IF EXISTS {{fn_dequeue}};
DROP PROCEDURE IF EXISTS {{fn_enqueue_many}};
DROP PROCEDURE IF EXISTS {{fn_enqueue}};

-- name: drop_tables
-- Remove the queue's tables (and with them their indexes), then its sequence.
DROP TABLE IF EXISTS {{watermark}};
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

-- name: correct_watermark
-- Client call: the 5-minute correction.
EXEC {{fn_correct_watermark}}

-- name: stored_watermark
-- The stored hint, for health and tests.
SELECT low, epoch, updated_at, corrected_at FROM {{watermark}}

-- name: counts
-- Depth for `queuectl list`: every row in the table is waiting (dequeued rows are deleted).
SELECT CAST(0 AS smallint) AS status, CAST(0 AS bit) AS scheduled, COUNT_BIG(*) AS n FROM {{items}}
