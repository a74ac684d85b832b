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
-- (SESSION_CONTEXT, keyed by the procedure's object id), read and written by every
-- dequeue for free; <queue>_watermark holds one row, a hint for new sessions, written at
-- most once a second per consumer and rewritten by correct_watermark (epoch changes; every
-- session adopts the corrected value at its next move).
--
-- How it moves, every 100th dequeue call of a session, and why it never passes an item
-- that can still be dequeued: at a move the session records a candidate, the sequence's
-- current value; at the NEXT move (100 calls later) every id up to that candidate was
-- drawn long ago, and its INSERT (which takes the row's key lock in the same statement as
-- the draw) has either committed or holds the key locked. The new low is the smaller of
-- the candidate + 1 and the smallest id still present at or above the old low, read with a
-- locking read that WAITS for uncommitted rows (no READPAST), so a rolled-back or
-- in-flight enqueue is never stepped over. Insert into the table only through the
-- enqueue procedures.
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
-- pending_low: correct_watermark's candidate from its previous run.
CREATE TABLE {{watermark}} (
    only_row     bit          NOT NULL PRIMARY KEY DEFAULT 1 CHECK (only_row = 1),
    low          bigint       NOT NULL DEFAULT 1,
    epoch        bigint       NOT NULL DEFAULT 0,
    pending_low  bigint       NULL,
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
    SET NOCOUNT ON;
    DECLARE @ids TABLE (id bigint NOT NULL);
    INSERT INTO {{items}} (payload, headers) OUTPUT inserted.id INTO @ids (id)
    VALUES (@payload, @headers);
    SELECT id FROM @ids;
END
GO
-- enqueue many items in one call; ids are drawn in input order and returned in it.
-- @items is a JSON array of {"payload": "<hex>", "headers": {...} | null}.
CREATE OR ALTER PROCEDURE {{fn_enqueue_many}}
    @items nvarchar(max)
AS
BEGIN
    SET NOCOUNT ON;
    SET XACT_ABORT ON;
    DECLARE @src TABLE (ord int NOT NULL PRIMARY KEY, id bigint NOT NULL,
                        payload varbinary(max) NOT NULL, headers nvarchar(max) NULL);
    INSERT INTO @src (ord, id, payload, headers)
    SELECT CAST(j.[key] AS int),
           NEXT VALUE FOR {{items_seq}} OVER (ORDER BY CAST(j.[key] AS int)),
           CONVERT(varbinary(max), v.payload_hex, 2), v.headers
    FROM OPENJSON(@items) AS j
    CROSS APPLY OPENJSON(j.[value]) WITH (
        payload_hex nvarchar(max) '$.payload',
        headers     nvarchar(max) '$.headers' AS JSON
    ) AS v;
    INSERT INTO {{items}} (id, payload, headers)
    SELECT s.id, s.payload, s.headers FROM @src AS s;
    SELECT s.id FROM @src AS s ORDER BY s.ord;
END
GO
-- correct_watermark: recompute the true low bound (the smallest id still in the table,
-- read with a locking read that waits for in-flight inserts, else the sequence's next
-- value) and fix the stored hint; sessions adopt a changed hint at their next move.
-- Meant for a job every 5 minutes: it walks the index from its start, over every ghost,
-- once per run.
--  * stored low too high (items below it are unreachable): lowered at once;
--  * stored low too low (dequeues walk needless ghosts): raised to the true bound, but
--    never past the candidate this procedure recorded on its previous run (ids drawn
--    before that run have long since inserted their rows), so a fresh raise takes two runs.
-- Returns one row: old_low, new_low, true_low, changed, reason.
CREATE OR ALTER PROCEDURE {{fn_correct_watermark}}
WITH EXECUTE AS OWNER
AS
BEGIN
    SET NOCOUNT ON;
    SET XACT_ABORT ON;
    DECLARE @next bigint, @old bigint, @pending bigint, @true bigint, @new bigint;
    DECLARE @reason nvarchar(200);
    SELECT @next = COALESCE(CAST(s.last_used_value AS bigint), 0) + 1
    FROM sys.sequences AS s WHERE s.object_id = OBJECT_ID({{items_seq_regclass}});
    BEGIN TRANSACTION;
    SELECT @old = w.low, @pending = w.pending_low
    FROM {{watermark}} AS w WITH (UPDLOCK, ROWLOCK);
    SELECT @true = COALESCE(MIN(i.id), @next) FROM {{items}} AS i WITH (READCOMMITTEDLOCK);
    IF @old > @true
        SELECT @new = @true, @reason = N'lowered: items below the stored watermark were unreachable';
    ELSE IF @old < @true AND @pending IS NOT NULL
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
        updated_at   = SYSUTCDATETIME(),
        corrected_at = SYSUTCDATETIME();
    COMMIT TRANSACTION;
    SELECT @old AS old_low, @new AS new_low, @true AS true_low,
           CAST(CASE WHEN @new <> @old THEN 1 ELSE 0 END AS bit) AS changed, @reason AS reason;
END

-- name: create_dequeue
-- The dequeue procedure, unchanged since watermark_0001 (CREATE OR ALTER: the downgrade of
-- watermark_0002 runs it again). It deletes through its TOP pick, with no
-- join to the picks, so watermark_0002's PostgreSQL change has nothing to fix here.

-- dequeue: ONE statement takes up to @batch items at or above the session's watermark,
-- oldest first, skipping rows other consumers hold. Around it, every 100th call moves the
-- session's watermark (see the header).
CREATE OR ALTER PROCEDURE {{fn_dequeue}}
    @batch int = 1
WITH EXECUTE AS OWNER
AS
BEGIN
    SET NOCOUNT ON;
    DECLARE @n int = CASE WHEN @batch > 0 THEN @batch ELSE 0 END;
    DECLARE @now datetime2(6) = SYSUTCDATETIME();
    DECLARE @k_low sysname = CONCAT(N'queuectl.wm.', @@PROCID, N'.low');
    DECLARE @k_calls sysname = CONCAT(N'queuectl.wm.', @@PROCID, N'.calls');
    DECLARE @k_cand sysname = CONCAT(N'queuectl.wm.', @@PROCID, N'.candidate');
    DECLARE @k_epoch sysname = CONCAT(N'queuectl.wm.', @@PROCID, N'.epoch');
    DECLARE @low bigint = CAST(SESSION_CONTEXT(@k_low) AS bigint);
    DECLARE @calls int = COALESCE(CAST(SESSION_CONTEXT(@k_calls) AS int), 0) + 1;
    DECLARE @cand bigint = CAST(SESSION_CONTEXT(@k_cand) AS bigint);
    DECLARE @epoch bigint = CAST(SESSION_CONTEXT(@k_epoch) AS bigint);
    DECLARE @s_low bigint, @s_epoch bigint, @s_updated datetime2(6), @present bigint;

    IF @low IS NULL
    BEGIN
        -- first dequeue of this session: start from the stored hint
        SELECT @low = w.low, @epoch = w.epoch FROM {{watermark}} AS w;
        SET @cand = NULL;
    END
    ELSE IF @calls >= 100
    BEGIN
        SET @calls = 0;
        SELECT @s_low = w.low, @s_epoch = w.epoch, @s_updated = w.updated_at FROM {{watermark}} AS w;
        IF @s_epoch <> @epoch
        BEGIN
            -- correct_watermark rewrote the hint: adopt it, drop our candidate
            SELECT @low = @s_low, @epoch = @s_epoch, @cand = NULL;
        END
        ELSE
        BEGIN
            IF @cand IS NOT NULL
            BEGIN
                -- every id up to the candidate is settled: move to the smaller of the
                -- candidate + 1 and the first id still present (a locking read: it waits
                -- for uncommitted inserts instead of stepping over them)
                SELECT @present = MIN(i.id) FROM {{items}} AS i WITH (READCOMMITTEDLOCK)
                WHERE i.id >= @low;
                SET @low = CASE WHEN @present IS NOT NULL AND @present < @cand + 1
                                THEN @present ELSE @cand + 1 END;
                -- persist rarely, never over a correction (epoch), never backwards
                IF @low > @s_low AND @s_updated < DATEADD(second, -1, @now)
                    UPDATE w SET low = @low, updated_at = @now
                    FROM {{watermark}} AS w WITH (ROWLOCK, READPAST)
                    WHERE w.epoch = @epoch AND w.low < @low;
            END
            -- the highest id drawn so far (last_used_value: NULL before the first draw)
            SELECT @cand = COALESCE(CAST(s.last_used_value AS bigint), 0)
            FROM sys.sequences AS s
            WHERE s.object_id = OBJECT_ID({{items_seq_regclass}});
        END
        EXEC sys.sp_set_session_context @key = @k_cand, @value = @cand;
    END
    EXEC sys.sp_set_session_context @key = @k_low, @value = @low;
    EXEC sys.sp_set_session_context @key = @k_calls, @value = @calls;
    EXEC sys.sp_set_session_context @key = @k_epoch, @value = @epoch;

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
