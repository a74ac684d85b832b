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
-- A pop never reads a push that has not committed: its UPDATE reads with READPAST, so a
-- slot locked by an open push is skipped (treated as "not there yet"), never read.
-- Claims a push or pop keeps for its next call (a full ring, an empty queue) live in the
-- session (SESSION_CONTEXT, keyed by the procedure's object id; not transactional: a
-- rollback leaves it as it was set); ring_release gives them up, tombstoning a claim whose
-- slot is free for it and, since ring_0002, re-pushing at once a message whose push
-- committed at the session's own pop claim after its last pop (otherwise orphaned until
-- ring_repair's grace has passed).
--
-- Locks and waits. No procedure backs off (WAITFOR) while it holds a lock on the ring:
--  * the push (ring_push, which enqueue and enqueue_many call) writes each run of slots in a
--    short transaction of its own and commits it before it backs off, and inside a caller's
--    transaction (@@TRANCOUNT > 0 at the back-off) it does not wait at all: the slots it
--    wrote stay locked until the caller commits, and pops skip them (READPAST) meanwhile;
--  * procedures call the push with EXEC and an OUTPUT parameter (the ids), never with
--    INSERT ... EXEC: that INSERT is one transaction around the whole call, so the push's
--    COMMIT would only lower @@TRANCOUNT and its locks would last through its back-off,
--    keeping away the very pop that frees the slot it waits for;
--  * the pop backs off only while it has taken nothing, and it reads slots it does not
--    take without keeping a lock on them (no UPDLOCK: an UPDATE releases the update lock of
--    a row that does not qualify), so even inside a caller's transaction (the client's
--    processing()) it waits holding no lock on the ring;
--  * ring_release's rescue and ring_repair's rescues run in a transaction of their own
--    (the old slot stays locked until the new one is written) and so never wait: one try.
-- Transaction locking and row versioning guide: "If the data row doesn't meet the update
-- criteria, the update lock is released on that row"
-- (https://learn.microsoft.com/en-us/sql/relational-databases/sql-server-transaction-locking-and-row-versioning-guide).
--
-- Read committed snapshot (RCSI). Every read of the ring that chooses what to write or to
-- skip is a locking read: UPDLOCK, or READCOMMITTEDLOCK (a read-committed read with shared
-- locks even when READ_COMMITTED_SNAPSHOT is ON). Under RCSI a plain read, READPAST or not,
-- reads the last committed version of a locked slot instead of skipping it, and READPAST is
-- what makes an uncommitted push "not there yet" (table hints: READPAST, READCOMMITTEDLOCK,
-- https://learn.microsoft.com/en-us/sql/t-sql/queries/hints-transact-sql-table; NServiceBus's
-- SQL transport reads its queue WITH (UPDLOCK, READPAST, ROWLOCK, READCOMMITTEDLOCK) for
-- this reason). The target rows of an UPDATE
-- are read with update locks under RCSI too (the same guide: "a blocking scan where an
-- update (U) lock is acquired on the data row"), so an UPDATE ... WHERE slot = ... needs no
-- hint. READCOMMITTEDLOCK also holds a read to READ COMMITTED's rule (locks released row by
-- row) when the caller's session runs at REPEATABLE READ or SERIALIZABLE. SNAPSHOT isolation
-- is refused: READPAST raises error 650 there. A read that may see a version says so in a
-- comment starting "version read:".
--
-- Procedures that read catalog metadata (sys.sequences, OBJECT_ID) run WITH EXECUTE AS
-- OWNER: metadata visibility follows the caller, and a role granted only EXECUTE
-- (`queuectl grant`) would see no sequence and no table. ring_push needs no grant of its
-- own: enqueue, enqueue_many and ring_release reach it by ownership chaining (grant.sql).
--
-- Batches inside a section are separated by GO lines (see reliable.sql). Sections are
-- filled by queuectl.sqlfiles.render() with quoted identifiers only.

-- name: create_tables
-- The slots (all of them, now), and the two position sequences.
--
-- Row width and page splits. A slot's row grows when a push writes its payload and shrinks
-- when the pop empties it, so a page filled with empty rows splits as soon as its rows fill
-- up. An empty slot is 37 bytes in the row (4 header, 30 of fixed columns: slot 4, msg_id 8,
-- state 2, pushed_at 8, changed_at 8, 2 column count, 1 null bitmap; trailing NULL payload
-- and headers take no bytes) plus 2 of the page's slot array: 39. A FULL slot adds 6 bytes
-- (variable-column count and two offsets) and the payload and headers themselves (headers in
-- UTF-16); row versioning (RCSI, or a readable secondary) adds 14 bytes to a row it updates.
-- A page holds 8,096 bytes of rows and slot array. The clustered index is built with
-- FILLFACTOR 20: about 41 empty slots per page (8,096 x 20 % / 39), which all fit FULL when
-- each holds up to 8,096 / 41 - 45 = 152 bytes of payload and headers (138 with row
-- versioning): a ring of small messages never splits a page, full or empty. The seed is
-- INSERTed (the fill factor does not apply to DML) and the index then rebuilt, which packs
-- each page to the fill factor; REBUILD and REORGANIZE keep to it afterwards (both use the
-- index's stored fill factor), so maintenance does not pack the empty slots back to full
-- pages that the next lap would split again. Larger messages split a page once, and the ring
-- settles at the density its messages need. The cost: five times the pages of a packed
-- ring (65,536 slots: about 1,600 pages, 12.5 MB; the largest ring, 16 Mi slots: about 3.3 GB).
-- The popped slot's payload is set to NULL, not kept as padding: a popped message should not
-- linger in the table, and the next payload need not be the same size.
-- A payload that does not fit in the row (a varbinary(max) over 8,000 bytes, or one that
-- would take the row past 8,060) goes to LOB pages with a 24-byte pointer in the row, so a
-- row never grows past about 8,060 bytes. 'large value types out of row' stays OFF: ON would
-- give every row a fixed width (a 16-byte pointer) but write and free a LOB page for every
-- message, small ones included.
CREATE TABLE {{ring}} (
    slot       int            NOT NULL PRIMARY KEY CLUSTERED WITH (FILLFACTOR = 20),
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
-- the INSERT packed its pages full: rebuild them at the index's FILLFACTOR (above)
ALTER INDEX ALL ON {{ring}} REBUILD;
GO
CREATE SEQUENCE {{push_seq}} AS bigint START WITH 0 MINVALUE 0 INCREMENT BY 1 CACHE 1000;
GO
CREATE SEQUENCE {{pop_seq}} AS bigint START WITH 0 MINVALUE 0 INCREMENT BY 1 CACHE 1000;

-- name: create_large_table
-- The side table for messages larger than a slot's in-row width (since ring_0007;
-- sql/postgresql/ring.sql: create_large_table explains the design and has the measurements).
-- A message whose payload + headers (DATALENGTH: headers are nvarchar, two bytes per UTF-16
-- code unit) is over slot_bytes is inserted here by the push, in the transaction that writes
-- its slot, and deleted by the pop in the transaction that empties it; the slot holds its id
-- in large_id and no payload. A rescue moves the pointer. Here the gain is the slots' pages:
-- a FULL slot holds its payload in the row up to 8,000 bytes (create_tables), so a ring of
-- messages of a few kB keeps one or two slots per page and splits pages as its rows grow;
-- with the pointer a row stays narrow. The pointer adds 8 bytes to every slot (45 bytes
-- empty, 47 with the page's slot array: about 34 empty slots per page at FILLFACTOR 20, which
-- all fit FULL up to ~185 bytes of in-row payload and headers each).
-- Rows here are inserted once and deleted once: ghost cleanup reclaims them, and their LOB
-- pages (a payload over 8,000 bytes) are deallocated with them.
-- ADD of a NULL column without a default changes only metadata (a schema-modification lock
-- for that moment, no row is rewritten).
ALTER TABLE {{ring}} ADD large_id bigint NULL;
GO
CREATE TABLE {{ring_large}} (
    id      bigint         IDENTITY(1, 1) NOT NULL PRIMARY KEY CLUSTERED,
    payload varbinary(max) NULL,
    headers nvarchar(max)  NULL
);

-- name: drop_large_table
-- Back to messages in the slots' rows (ring_0007's downgrade): every message waiting in the
-- side table goes back into its slot, then the table and the pointer go. TABLOCKX holds the
-- slots until the migration's transaction ends, so no push or pop runs between the move and
-- the drop (nor, with the procedures replaced in the same transaction, reads a slot whose
-- payload is still in the side table).
UPDATE {{ring}} WITH (TABLOCKX)
SET payload = l.payload, headers = l.headers, large_id = NULL
FROM {{ring_large}} AS l
WHERE l.id = large_id;
GO
DROP TABLE {{ring_large}};
GO
ALTER TABLE {{ring}} DROP COLUMN large_id;

-- name: create_enqueue_many
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
-- Sizes (since ring_0007): a message (payload + headers, DATALENGTH) over max_payload_bytes
-- refuses the whole call with error 50413 (the client's PayloadTooLarge, one line) before a
-- position is drawn; the messages of a run over slot_bytes are inserted into the side table
-- (create_large_table) inside the run's transaction, before its UPDATE takes any slot lock,
-- so a side row exists exactly when its slot was written (a run rolled back to its savepoint
-- takes its side rows with it).
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
    DECLARE @large TABLE (ord int NOT NULL PRIMARY KEY, id bigint NOT NULL);  -- side-table ids by message
    DECLARE @over int, @big int, @payload_bytes bigint, @headers_bytes bigint, @refused nvarchar(400);
    INSERT INTO @src (ord, payload, headers)
    SELECT CAST(j.[key] AS int), CONVERT(varbinary(max), v.payload_hex, 2), v.headers
    FROM OPENJSON(@items) AS j
    CROSS APPLY OPENJSON(j.[value]) WITH (
        payload_hex nvarchar(max) '$.payload',
        headers     nvarchar(max) '$.headers' AS JSON
    ) AS v;
    SELECT @n = COUNT(*) FROM @src;
    SELECT TOP (1) @over = s.ord, @payload_bytes = s.payload_bytes, @headers_bytes = s.headers_bytes
    FROM (SELECT src.ord, CAST(ISNULL(DATALENGTH(src.payload), 0) AS bigint) AS payload_bytes,
                 CAST(ISNULL(DATALENGTH(src.headers), 0) AS bigint) AS headers_bytes
          FROM @src AS src) AS s
    WHERE s.payload_bytes + s.headers_bytes > {{max_payload_bytes}}
    ORDER BY s.ord;
    IF @over IS NOT NULL
    BEGIN
        SET @refused = CONCAT(N'queue ''', {{queue_literal}}, N''': message ', @over + 1, N' of ', @n, N' is ',
            @payload_bytes + @headers_bytes, N' bytes (payload ', @payload_bytes, N' + headers ', @headers_bytes,
            N'), over max_payload_bytes ', {{max_payload_bytes}}, N': nothing was enqueued');
        THROW 50413, @refused, 1;
    END;
    SELECT @big = COUNT(*) FROM @src AS s
    WHERE ISNULL(DATALENGTH(s.payload), 0) + ISNULL(DATALENGTH(s.headers), 0) > {{slot_bytes}};
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
            IF @big > 0
                -- the run's messages over slot_bytes, into the side table first (MERGE: its
                -- OUTPUT pairs each new id with the message's ordinal, INSERT's cannot)
                MERGE INTO {{ring_large}} AS l
                USING (SELECT s.ord, s.payload, s.headers FROM @src AS s
                       WHERE s.ord >= @done AND s.ord < @done + @want
                         AND ISNULL(DATALENGTH(s.payload), 0) + ISNULL(DATALENGTH(s.headers), 0) > {{slot_bytes}}) AS m
                ON 1 = 0
                WHEN NOT MATCHED THEN INSERT (payload, headers) VALUES (m.payload, m.headers)
                OUTPUT m.ord, inserted.id INTO @large (ord, id);
            -- READCOMMITTEDLOCK, READPAST, no UPDLOCK: each slot is re-checked under the
            -- UPDATE's own update lock, a slot locked now is skipped (not waited for), and a
            -- slot that is no longer free keeps no lock (see the header)
            UPDATE r SET msg_id = w.pos, state = 1,
                         payload = CASE WHEN g.id IS NULL THEN s.payload END,
                         headers = CASE WHEN g.id IS NULL THEN s.headers END, large_id = g.id,
                         pushed_at = SYSUTCDATETIME(), changed_at = SYSUTCDATETIME()
            OUTPUT w.ord, inserted.msg_id INTO @written (ord, id)
            FROM {{ring}} AS r WITH (READCOMMITTEDLOCK, READPAST, ROWLOCK)
            JOIN (
                SELECT c.pos, @done - 1 + ROW_NUMBER() OVER (ORDER BY c.pos) AS ord
                FROM @claims AS c
                WHERE @stop IS NULL OR c.pos < @stop
            ) AS w ON r.slot = w.pos % {{size}}
            JOIN @src AS s ON s.ord = w.ord
            LEFT JOIN @large AS g ON g.ord = w.ord
            WHERE r.msg_id = w.pos - {{size}} AND r.state <> 1;
            SET @run = @@ROWCOUNT;
            IF @run < @want
            BEGIN
                -- a slot of the run changed since the probe: undo the run, try again. A table
                -- variable keeps its rows through a rollback: forget the run's outputs too.
                ROLLBACK TRANSACTION ring_run;
                DELETE FROM @written WHERE ord >= @done;
                DELETE FROM @large WHERE ord >= @done;
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

-- name: create_enqueue
-- The single push, enqueue (since ring_0003).
-- push one message: ring_push of one (one row, column id; NULL when the ring stayed full
-- for @timeout: the claim is kept for this session's next push). The message travels as
-- ring_push's JSON array and its id comes back in the OUTPUT parameter.
CREATE OR ALTER PROCEDURE {{fn_enqueue}}
    @payload varbinary(max),
    @headers nvarchar(max) = NULL,
    @timeout float         = 1.0
AS
BEGIN
    SET NOCOUNT ON; SET ROWCOUNT 0;
    DECLARE @ids nvarchar(max);
    DECLARE @items nvarchar(max) = (
        SELECT CONVERT(varchar(max), @payload, 2) AS payload, JSON_QUERY(@headers) AS headers
        FOR JSON PATH
    );
    EXEC {{fn_ring_push}} @items = @items, @timeout = @timeout, @ids = @ids OUTPUT;
    SELECT CAST(@ids AS bigint) AS id;
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
-- No transaction open while it waits: each take (the UPDATE that empties the slots and, since
-- ring_0007, the DELETE of their side-table messages) is one short transaction that commits
-- before any back-off (nothing waits inside it; XACT_ABORT rolls both back on an error), and
-- inside a caller's transaction (processing()) it holds, while it waits, no lock on the ring:
-- it has taken nothing, and its reads keep no lock on the slots they pass over (the header).
-- A side-table message is returned as if it had been in the slot.
CREATE OR ALTER PROCEDURE {{fn_dequeue}}
    @batch   int   = 1,
    @timeout float = 0
WITH EXECUTE AS OWNER
AS
BEGIN
    SET NOCOUNT ON; SET ROWCOUNT 0;
    SET XACT_ABORT ON;
    DECLARE @key sysname = CONCAT(N'queuectl.rpop.', OBJECT_ID({{ring_regclass}}));
    DECLARE @deadline datetime2(6) = DATEADD(millisecond,
        CAST(ROUND(CASE WHEN @timeout > 0 THEN @timeout ELSE 0 END * 1000e0, 0) AS int), SYSUTCDATETIME());
    DECLARE @pause_ms int = 4,  -- WAITFOR takes a datetime (1/300 s): 1 ms would round to no wait
            @pause datetime, @taken int = 0, @got int, @need int, @have int;
    DECLARE @more bigint, @first sql_variant, @kept nvarchar(4000);
    DECLARE @claims TABLE (pos bigint NOT NULL PRIMARY KEY);
    DECLARE @out TABLE (id bigint NOT NULL PRIMARY KEY, payload varbinary(max) NULL,
                        headers nvarchar(max) NULL, enqueued_at datetime2(6) NULL,
                        dequeued_at datetime2(6) NOT NULL, large_id bigint NULL);
    DECLARE @big TABLE (id bigint NOT NULL PRIMARY KEY, payload varbinary(max) NULL, headers nvarchar(max) NULL);
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
        BEGIN TRANSACTION;
        WITH full_slots AS (
            SELECT TOP (@need) r.msg_id, r.state, r.payload, r.headers, r.pushed_at, r.changed_at, r.large_id
            FROM @claims AS c
            JOIN {{ring}} AS r WITH (READCOMMITTEDLOCK, READPAST, ROWLOCK) ON r.slot = c.pos % {{size}}
            WHERE r.msg_id = c.pos AND r.state = 1
            ORDER BY c.pos
        )
        UPDATE full_slots SET state = 0, payload = NULL, headers = NULL, large_id = NULL, changed_at = SYSUTCDATETIME()
        OUTPUT deleted.msg_id, deleted.payload, deleted.headers, deleted.pushed_at, SYSUTCDATETIME(), deleted.large_id
        INTO @out (id, payload, headers, enqueued_at, dequeued_at, large_id);
        SET @got = @@ROWCOUNT;
        -- the side table's messages among those just taken (earlier rounds' rows are gone)
        IF @got > 0
            DELETE l
            OUTPUT deleted.id, deleted.payload, deleted.headers INTO @big (id, payload, headers)
            FROM {{ring_large}} AS l WITH (ROWLOCK)
            JOIN @out AS o ON o.large_id = l.id;
        COMMIT TRANSACTION;
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
    SELECT o.id, CASE WHEN o.large_id IS NULL THEN o.payload ELSE b.payload END AS payload,
           CASE WHEN o.large_id IS NULL THEN o.headers ELSE b.headers END AS headers,
           o.enqueued_at, o.dequeued_at
    FROM @out AS o LEFT JOIN @big AS b ON b.id = o.large_id
    ORDER BY o.id;
END

-- name: create_ring_repair
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
    DECLARE @payload varbinary(max), @headers nvarchar(max), @large bigint;
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
            -- large_id: a side-table message moves by its pointer (since ring_0007)
            SELECT @msg = o.msg_id, @payload = o.payload, @headers = o.headers, @large = o.large_id
            FROM {{ring}} AS o WITH (UPDLOCK, READPAST, ROWLOCK)
            WHERE o.slot = @slot AND o.state = 1 AND o.msg_id <= @pop_high AND o.changed_at < @cutoff;
            IF @msg IS NULL
            BEGIN
                COMMIT TRANSACTION;  -- taken, rescued or busy since the walk saw it
                CONTINUE;
            END
            -- one try at a new position: claimed and filled only if its slot is free now
            SET @new = NEXT VALUE FOR {{push_seq}};
            UPDATE r SET msg_id = @new, state = 1, payload = @payload, headers = @headers, large_id = @large,
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
            UPDATE {{ring}} SET state = 3, payload = NULL, headers = NULL, large_id = NULL,
                                changed_at = SYSUTCDATETIME()
            WHERE slot = @slot;
            COMMIT TRANSACTION;
            INSERT INTO @actions VALUES (N'rescue', @msg, @new, @slot);
        END
        IF @found < 1000 BREAK;  -- the walk reached the last slot
    END
    SELECT action, item_id, new_item_id, slot FROM @actions;
END

-- name: create_ring_release
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
    DECLARE @large bigint;
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
        SELECT @slot = o.slot, @payload = o.payload, @headers = o.headers, @large = o.large_id
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
        UPDATE {{ring}} SET state = 3, payload = NULL, headers = NULL, large_id = NULL,
                            changed_at = SYSUTCDATETIME()
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
            -- a side-table message: ring_push wrote the slot's empty message; its pointer
            -- moves to the new slot, which this transaction holds (since ring_0007)
            IF @large IS NOT NULL
                UPDATE {{ring}} SET large_id = @large WHERE slot = @new % {{size}} AND msg_id = @new;
            COMMIT TRANSACTION;
            INSERT INTO @out (side, item_id, tombstoned, new_item_id, outcome)
            VALUES (N'pop', @pos, 0, @new, N'rescued');
        END
    END
    EXEC sys.sp_set_session_context @key = @k_pop, @value = NULL;
    SELECT side, item_id, tombstoned, new_item_id, outcome FROM @out ORDER BY seq;
END

-- name: create_subscription_tables
-- Fan-out (since ring_0006): sql/postgresql/ring.sql, create_subscription_tables, has the
-- design; the tables are the same. <queue>_sub_slots is updated in place and never on a key
-- column, like the slots: FILLFACTOR 30 leaves each page room for its rows' row versions
-- (RCSI) and for the lease column going from NULL to a value, so claims and acks do not split
-- pages.
CREATE TABLE {{subs}} (
    sub_id           int           NOT NULL PRIMARY KEY CLUSTERED,
    name             nvarchar(48)  NOT NULL UNIQUE,
    start_pos        bigint        NOT NULL,
    next_pos         bigint        NOT NULL,
    lag_limit        bigint        NOT NULL DEFAULT {{sub_lag_limit}} CHECK (lag_limit >= 1),
    drop_when_behind bit           NOT NULL DEFAULT {{sub_drop}},
    scan_at          datetime2(6)  NOT NULL DEFAULT SYSUTCDATETIME(),
    created_at       datetime2(6)  NOT NULL DEFAULT SYSUTCDATETIME(),
    dropped_at       datetime2(6)  NULL
);
GO
CREATE TABLE {{sub_slots}} (
    sub_id      int          NOT NULL,
    slot        int          NOT NULL,
    pos         bigint       NOT NULL,
    lease_until datetime2(6) NULL,
    tries       int          NOT NULL DEFAULT 0,
    PRIMARY KEY CLUSTERED (sub_id, slot) WITH (FILLFACTOR = 30)
);

-- name: drop_subscription_tables
-- Remove the subscriptions (ring_0006's downgrade).
DROP TABLE IF EXISTS {{sub_slots}};
GO
DROP TABLE IF EXISTS {{subs}};

-- name: make_fanout
-- Turn a ring never used into a fan-out ring (sql/postgresql/ring.sql, make_fanout): states 4
-- PUBLISHED and 5 PASSED, every slot PUBLISHED at slot - size, and the guard trigger
-- (create_fanout_guard). The slots' CHECK
-- constraint has a generated name: found in sys.check_constraints and replaced through
-- dynamic SQL, the table named by QUOTENAME of its parts.
DECLARE @ring int = OBJECT_ID({{ring_regclass}});
DECLARE @table nvarchar(300) = CONCAT(QUOTENAME(OBJECT_SCHEMA_NAME(@ring)), N'.', QUOTENAME(OBJECT_NAME(@ring)));
DECLARE @name sysname, @sql nvarchar(max);
IF EXISTS (SELECT 1 FROM {{ring}} WITH (READCOMMITTEDLOCK, ROWLOCK) WHERE state <> 0 OR msg_id >= 0)
    THROW 50003, N'only a new ring can fan out: this one has been used', 1;
SELECT @name = c.name FROM sys.check_constraints AS c WHERE c.parent_object_id = @ring;
IF @name IS NOT NULL
BEGIN
    SET @sql = CONCAT(N'ALTER TABLE ', @table, N' DROP CONSTRAINT ', QUOTENAME(@name));
    EXEC sys.sp_executesql @sql;
END
SET @sql = CONCAT(N'ALTER TABLE ', @table, N' ADD CHECK (state BETWEEN 0 AND 5)');
EXEC sys.sp_executesql @sql;
GO
UPDATE {{ring}} SET state = 4;
GO
EXEC {{fn_fanout_guard}} @enable = 1;

-- name: unmake_fanout
-- Back to a plain ring (sql/postgresql/ring.sql, unmake_fanout): the guard trigger dropped,
-- each message an active subscription has not acknowledged FULL for the plain pop, the
-- others EMPTY, the fan-out tombstones SKIPPED, the pop sequence restarted at the oldest
-- FULL message (or past the pushes), the CHECK constraint back to 0..3.
EXEC {{fn_fanout_guard}} @enable = 0;
GO
UPDATE r
SET state = CASE
        WHEN r.state = 5 THEN 2
        WHEN EXISTS (SELECT 1 FROM {{subs}} AS u JOIN {{sub_slots}} AS k ON k.sub_id = u.sub_id AND k.slot = r.slot
                     WHERE u.dropped_at IS NULL AND u.start_pos <= r.msg_id
                       AND NOT (k.pos = r.msg_id AND k.lease_until IS NULL)) THEN 1
        ELSE 0 END
FROM {{ring}} AS r WITH (UPDLOCK, ROWLOCK)
WHERE r.state >= 4;
GO
UPDATE {{ring}} SET payload = NULL, headers = NULL WHERE state <> 1;
GO
DECLARE @restart bigint, @sql nvarchar(max);
DECLARE @seq int = OBJECT_ID({{pop_seq_regclass}});
SELECT @restart = MIN(r.msg_id) FROM {{ring}} AS r WITH (READCOMMITTEDLOCK, ROWLOCK) WHERE r.state = 1;
IF @restart IS NULL
    SELECT @restart = COALESCE(CAST(s.last_used_value AS bigint), -1) + 1
    FROM sys.sequences AS s WHERE s.object_id = OBJECT_ID({{push_seq_regclass}});
SET @sql = CONCAT(N'ALTER SEQUENCE ', QUOTENAME(OBJECT_SCHEMA_NAME(@seq)), N'.', QUOTENAME(OBJECT_NAME(@seq)),
                  N' RESTART WITH ', @restart);
EXEC sys.sp_executesql @sql;
GO
DECLARE @ring int = OBJECT_ID({{ring_regclass}});
DECLARE @table nvarchar(300) = CONCAT(QUOTENAME(OBJECT_SCHEMA_NAME(@ring)), N'.', QUOTENAME(OBJECT_NAME(@ring)));
DECLARE @name sysname, @sql nvarchar(max);
SELECT @name = c.name FROM sys.check_constraints AS c WHERE c.parent_object_id = @ring;
IF @name IS NOT NULL
BEGIN
    SET @sql = CONCAT(N'ALTER TABLE ', @table, N' DROP CONSTRAINT ', QUOTENAME(@name));
    EXEC sys.sp_executesql @sql;
END
SET @sql = CONCAT(N'ALTER TABLE ', @table, N' ADD CHECK (state BETWEEN 0 AND 3)');
EXEC sys.sp_executesql @sql;

-- name: create_fanout_guard
-- The guard (sql/postgresql/ring.sql, make_fanout explains it). SQL Server has no BEFORE
-- trigger that can skip a row: an AFTER UPDATE trigger on the slots, created (@enable = 1) or
-- dropped (@enable = 0) by this procedure through dynamic SQL, does the same once the
-- statement has run, inside its transaction: a plain push that wrote FULL over a fan-out
-- slot raises (THROW rolls the statement's transaction back); a tombstone (ring_repair,
-- ring_release) becomes PASSED where no active subscription still waits for the slot's
-- message, and is undone (the slot's previous row put back from `deleted`) where one does.
-- The trigger's own UPDATEs keep the state at 4 or 5, so its condition does not hold for
-- them (and RECURSIVE_TRIGGERS is off by default). ring_repair's OUTPUT is written before the
-- trigger runs: on SQL Server it may list a tombstone the guard undid. A tombstone that stays
-- replaces a message every subscription is done with: that message's side-table row (since
-- ring_0007) is deleted with it, as when publish reuses the slot; the tombstones leave
-- large_id as it was, so an undone one keeps its pointer. The trigger's text names the side
-- table: ring_0007's upgrade and downgrade run refresh_fanout_guard to remake it.
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
    DECLARE @large nvarchar(300) = CONCAT(@schema, N'.', QUOTENAME(OBJECT_NAME(OBJECT_ID({{ring_large_regclass}}))));
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
    DECLARE @passed TABLE (large_id bigint NULL);
    UPDATE r SET state = 5, payload = NULL, headers = NULL, large_id = NULL
    OUTPUT d.large_id INTO @passed (large_id)
    FROM ', @table, N' AS r JOIN inserted AS i ON i.slot = r.slot JOIN deleted AS d ON d.slot = i.slot
    WHERE d.state >= 4 AND i.state < 4 AND (d.state = 5 OR NOT EXISTS (
        SELECT 1 FROM ', @subs, N' AS u JOIN ', @slots, N' AS k ON k.sub_id = u.sub_id AND k.slot = d.slot
        WHERE u.dropped_at IS NULL AND u.start_pos <= d.msg_id AND NOT (k.pos = d.msg_id AND k.lease_until IS NULL)));
    DELETE FROM ', @large, N' WHERE id IN (SELECT p.large_id FROM @passed AS p);
    UPDATE r SET msg_id = d.msg_id, state = d.state, payload = d.payload, headers = d.headers,
                 large_id = d.large_id, pushed_at = d.pushed_at, changed_at = d.changed_at
    FROM ', @table, N' AS r JOIN inserted AS i ON i.slot = r.slot JOIN deleted AS d ON d.slot = i.slot
    WHERE d.state >= 4 AND i.state < 4 AND r.state < 4;
END');
    EXEC sys.sp_executesql @sql;
END

-- name: refresh_fanout_guard
-- Remake a fan-out ring's guard trigger from the guard procedure now installed (ring_0007's
-- upgrade and downgrade, after create_fanout_guard): the trigger's text is made by the
-- procedure, so replacing the procedure alone leaves the old trigger running.
EXEC {{fn_fanout_guard}} @enable = 1;

-- name: create_publish
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
-- Sizes (since ring_0007): ring_push's checks (error 50413 before a position is drawn; the
-- run's messages over slot_bytes MERGEd into the side table inside the run's transaction).
-- A fan-out slot keeps its message until the slot is reused, since every subscription reads
-- it: the run's UPDATE outputs the pointers of the messages it replaces (every subscription
-- is done with them: the free test) and the run's transaction deletes their side rows.
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
    -- @written.replaced: the pointer of the message a written slot held before
    DECLARE @written TABLE (ord int NOT NULL PRIMARY KEY, id bigint NOT NULL, replaced bigint NULL);
    DECLARE @large TABLE (ord int NOT NULL PRIMARY KEY, id bigint NOT NULL);  -- side-table ids by message
    DECLARE @over int, @big int, @payload_bytes bigint, @headers_bytes bigint, @refused nvarchar(400);
    INSERT INTO @src (ord, payload, headers)
    SELECT CAST(j.[key] AS int), CONVERT(varbinary(max), v.payload_hex, 2), v.headers
    FROM OPENJSON(@items) AS j
    CROSS APPLY OPENJSON(j.[value]) WITH (payload_hex nvarchar(max) '$.payload', headers nvarchar(max) '$.headers' AS JSON) AS v;
    SELECT @n = COUNT(*) FROM @src;
    IF @n = 0 RETURN;
    IF @n > 200 THROW 50004, N'publish takes at most 200 messages per call', 1;
    SELECT TOP (1) @over = s.ord, @payload_bytes = s.payload_bytes, @headers_bytes = s.headers_bytes
    FROM (SELECT src.ord, CAST(ISNULL(DATALENGTH(src.payload), 0) AS bigint) AS payload_bytes,
                 CAST(ISNULL(DATALENGTH(src.headers), 0) AS bigint) AS headers_bytes
          FROM @src AS src) AS s
    WHERE s.payload_bytes + s.headers_bytes > {{max_payload_bytes}}
    ORDER BY s.ord;
    IF @over IS NOT NULL
    BEGIN
        SET @refused = CONCAT(N'queue ''', {{queue_literal}}, N''': message ', @over + 1, N' of ', @n, N' is ',
            @payload_bytes + @headers_bytes, N' bytes (payload ', @payload_bytes, N' + headers ', @headers_bytes,
            N'), over max_payload_bytes ', {{max_payload_bytes}}, N': nothing was enqueued');
        THROW 50413, @refused, 1;
    END;
    SELECT @big = COUNT(*) FROM @src AS s
    WHERE ISNULL(DATALENGTH(s.payload), 0) + ISNULL(DATALENGTH(s.headers), 0) > {{slot_bytes}};
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
            IF @big > 0
                -- the run's messages over slot_bytes, into the side table first (ring_push's MERGE)
                MERGE INTO {{ring_large}} AS l
                USING (SELECT s.ord, s.payload, s.headers FROM @src AS s
                       WHERE s.ord >= @done AND s.ord < @done + @run
                         AND ISNULL(DATALENGTH(s.payload), 0) + ISNULL(DATALENGTH(s.headers), 0) > {{slot_bytes}}) AS m
                ON 1 = 0
                WHEN NOT MATCHED THEN INSERT (payload, headers) VALUES (m.payload, m.headers)
                OUTPUT m.ord, inserted.id INTO @large (ord, id);
            UPDATE r
            SET msg_id = c.pos, state = 4, payload = CASE WHEN g.id IS NULL THEN p.payload END,
                headers = CASE WHEN g.id IS NULL THEN p.headers END, large_id = g.id,
                pushed_at = SYSUTCDATETIME(), changed_at = SYSUTCDATETIME()
            OUTPUT p.ord, inserted.msg_id, deleted.large_id INTO @written (ord, id, replaced)
            FROM @claims AS c
            JOIN @src AS p ON p.ord = c.n
            LEFT JOIN @large AS g ON g.ord = c.n
            JOIN {{ring}} AS r WITH (UPDLOCK, ROWLOCK) ON r.slot = c.pos % {{size}}
            WHERE c.n >= @done AND c.n < @done + @run AND r.msg_id = c.pos - {{size}} AND r.state >= 4
              AND (r.state = 5 OR NOT EXISTS (
                  SELECT 1 FROM {{subs}} AS u JOIN {{sub_slots}} AS k ON k.sub_id = u.sub_id AND k.slot = r.slot
                  WHERE u.dropped_at IS NULL AND u.start_pos <= r.msg_id
                    AND NOT (k.pos = r.msg_id AND k.lease_until IS NULL)));
            SET @wrote = @@ROWCOUNT;
            IF @wrote < @run
            BEGIN
                -- a table variable keeps its rows through a rollback: forget the run's outputs
                ROLLBACK TRANSACTION run;
                DELETE FROM @written WHERE ord >= @done;
                DELETE FROM @large WHERE ord >= @done;
                SET @wrote = 0;
            END
            ELSE
                DELETE FROM {{ring_large}} WITH (ROWLOCK)
                WHERE id IN (SELECT w.replaced FROM @written AS w WHERE w.ord >= @done);
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

-- name: create_subscribe
-- subscribe (since ring_0006): sql/postgresql/ring.sql's subscribe. The start position is
-- read under an update lock on the whole slots table (UPDLOCK, TABLOCK, HOLDLOCK: it conflicts
-- with the intent-exclusive lock of every push, in a transaction of its own:
-- pushes in flight finish first, new ones wait until this commits), so every position at or
-- past the start is written by a publish whose free test sees the subscription. One short
-- transaction; no wait inside it but the lock's.
CREATE OR ALTER PROCEDURE {{fn_subscribe}}
    @name             nvarchar(48),
    @lag_limit        bigint = NULL,
    @drop_when_behind bit    = NULL
WITH EXECUTE AS OWNER
AS
BEGIN
    SET NOCOUNT ON; SET ROWCOUNT 0;
    SET XACT_ABORT ON;
    DECLARE @id int, @start bigint, @state smallint;
    IF @name IS NULL OR @name LIKE N'%[^a-z0-9_]%' COLLATE Latin1_General_BIN2
       OR LEFT(@name, 1) NOT LIKE N'[a-z]' COLLATE Latin1_General_BIN2
        THROW 50005, N'invalid subscription name: 1-48 lowercase letters, digits and underscores, starting with a letter', 1;
    IF @lag_limit < 1 OR @lag_limit > {{size}}
        THROW 50005, N'lag limit must be from 1 to the ring''s size', 1;
    SELECT @state = r.state FROM {{ring}} AS r WITH (READCOMMITTEDLOCK, ROWLOCK) WHERE r.slot = 0;
    IF @state < 4
        THROW 50003, N'this ring does not fan out: install it with fanout to subscribe', 1;
    BEGIN TRANSACTION;
    SELECT @state = COUNT(*) FROM {{ring}} WITH (UPDLOCK, TABLOCK, HOLDLOCK) WHERE slot = 0;
    IF EXISTS (SELECT 1 FROM {{subs}} WITH (UPDLOCK, HOLDLOCK) WHERE name = @name)
        THROW 50006, N'subscription exists', 1;
    SELECT @start = COALESCE(CAST(s.last_used_value AS bigint), -1) + 1
    FROM sys.sequences AS s WHERE s.object_id = OBJECT_ID({{push_seq_regclass}});
    SELECT @id = COALESCE(MAX(sub_id), 0) + 1 FROM {{subs}} WITH (UPDLOCK, HOLDLOCK);
    INSERT INTO {{subs}} (sub_id, name, start_pos, next_pos) VALUES (@id, @name, @start, @start);
    UPDATE {{subs}} SET lag_limit = COALESCE(@lag_limit, lag_limit),
                        drop_when_behind = COALESCE(@drop_when_behind, drop_when_behind)
    WHERE sub_id = @id;
    WITH numbers AS (
        SELECT TOP ({{size}}) ROW_NUMBER() OVER (ORDER BY (SELECT NULL)) - 1 AS g
        FROM sys.all_columns AS a CROSS JOIN sys.all_columns AS b
    )
    INSERT INTO {{sub_slots}} (sub_id, slot, pos) SELECT @id, CAST(g AS int), -1 FROM numbers;
    COMMIT TRANSACTION;
    SELECT name, start_pos, lag_limit, drop_when_behind FROM {{subs}} WHERE sub_id = @id;
END

-- name: create_unsubscribe
-- unsubscribe (since ring_0006): remove a subscription and its slot rows, in batches of
-- 4,000 (under the ~5,000 locks at which SQL Server escalates to a table lock, which would
-- stop every claim and ack of the other subscriptions). Result: removed (1 if it existed).
CREATE OR ALTER PROCEDURE {{fn_unsubscribe}}
    @name nvarchar(48)
WITH EXECUTE AS OWNER
AS
BEGIN
    SET NOCOUNT ON; SET ROWCOUNT 0;
    DECLARE @id int;
    DECLARE @gone TABLE (sub_id int NOT NULL);
    DELETE FROM {{subs}} OUTPUT deleted.sub_id INTO @gone (sub_id) WHERE name = @name;
    SELECT @id = sub_id FROM @gone;
    WHILE @id IS NOT NULL
    BEGIN
        DELETE TOP (4000) FROM {{sub_slots}} WITH (ROWLOCK) WHERE sub_id = @id;
        IF @@ROWCOUNT < 4000 BREAK;
    END
    SELECT CAST(CASE WHEN @id IS NULL THEN 0 ELSE 1 END AS bit) AS removed;
END

-- name: create_subscriptions
-- subscriptions (since ring_0006): sql/postgresql/ring.sql's subscriptions. version read:
-- a monitoring call reads the subscriptions and their slot rows as committed (under RCSI,
-- versions), never the slots table.
CREATE OR ALTER PROCEDURE {{fn_subscriptions}}
WITH EXECUTE AS OWNER
AS
BEGIN
    SET NOCOUNT ON; SET ROWCOUNT 0;
    DECLARE @high bigint;
    SELECT @high = COALESCE(CAST(s.last_used_value AS bigint), -1)
    FROM sys.sequences AS s WHERE s.object_id = OBJECT_ID({{push_seq_regclass}});
    SELECT u.name, u.start_pos, u.next_pos, @high + 1 - u.next_pos AS lag, u.lag_limit,
           CAST(CASE WHEN u.dropped_at IS NOT NULL OR @high + 1 - u.next_pos > u.lag_limit THEN 1 ELSE 0 END AS bit) AS behind,
           u.drop_when_behind, u.dropped_at, c.claimed, c.expired, c.oldest AS oldest_claim, u.created_at
    FROM {{subs}} AS u
    CROSS APPLY (
        SELECT COUNT_BIG(k.lease_until) AS claimed,
               SUM(CASE WHEN k.lease_until < SYSUTCDATETIME() THEN 1 ELSE 0 END) AS expired,
               MIN(CASE WHEN k.lease_until IS NOT NULL THEN k.pos END) AS oldest
        FROM {{sub_slots}} AS k WHERE k.sub_id = u.sub_id) AS c
    ORDER BY u.name;
END

-- name: create_sub_take
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
            -- it (the producer waits for that), so its committed row is the message, and its
            -- side-table row (since ring_0007), which only the slot's reuse deletes, is there
            SELECT o.id, CASE WHEN r.large_id IS NULL THEN r.payload ELSE l.payload END AS payload,
                   CASE WHEN r.large_id IS NULL THEN r.headers ELSE l.headers END AS headers,
                   r.pushed_at AS enqueued_at, SYSUTCDATETIME() AS dequeued_at, o.tries
            FROM @out AS o JOIN {{ring}} AS r WITH (READCOMMITTEDLOCK, ROWLOCK) ON r.slot = o.slot
            LEFT JOIN {{ring_large}} AS l WITH (READCOMMITTEDLOCK, ROWLOCK) ON l.id = r.large_id
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

-- name: create_sub_done
-- sub_done (since ring_0006): sql/postgresql/ring.sql's sub_done; @ids and @tries are JSON
-- arrays of the same length. Result: the ids acknowledged.
CREATE OR ALTER PROCEDURE {{fn_sub_done}}
    @name  nvarchar(48),
    @ids   nvarchar(max),
    @tries nvarchar(max)
WITH EXECUTE AS OWNER
AS
BEGIN
    SET NOCOUNT ON; SET ROWCOUNT 0;
    UPDATE k SET lease_until = NULL
    OUTPUT inserted.pos AS id
    FROM {{subs}} AS u
    JOIN (SELECT CAST(i.[value] AS bigint) AS pos, CAST(t.[value] AS int) AS tries
          FROM OPENJSON(@ids) AS i JOIN OPENJSON(@tries) AS t ON t.[key] = i.[key]) AS a ON 1 = 1
    JOIN {{sub_slots}} AS k WITH (ROWLOCK) ON k.sub_id = u.sub_id AND k.slot = a.pos % {{size}}
    WHERE u.name = @name AND k.pos = a.pos AND k.tries = a.tries AND k.lease_until IS NOT NULL;
END

-- name: create_sub_return
-- sub_return (since ring_0006): sql/postgresql/ring.sql's sub_return (the lease ends now and
-- the subscription's next sub_take looks for expired claims). Result: the ids given back.
CREATE OR ALTER PROCEDURE {{fn_sub_return}}
    @name  nvarchar(48),
    @ids   nvarchar(max),
    @tries nvarchar(max)
WITH EXECUTE AS OWNER
AS
BEGIN
    SET NOCOUNT ON; SET ROWCOUNT 0;
    DECLARE @given TABLE (id bigint NOT NULL PRIMARY KEY);
    UPDATE k SET lease_until = CAST('0001-01-01' AS datetime2(6))
    OUTPUT inserted.pos INTO @given (id)
    FROM {{subs}} AS u
    JOIN (SELECT CAST(i.[value] AS bigint) AS pos, CAST(t.[value] AS int) AS tries
          FROM OPENJSON(@ids) AS i JOIN OPENJSON(@tries) AS t ON t.[key] = i.[key]) AS a ON 1 = 1
    JOIN {{sub_slots}} AS k WITH (ROWLOCK) ON k.sub_id = u.sub_id AND k.slot = a.pos % {{size}}
    WHERE u.name = @name AND k.pos = a.pos AND k.tries = a.tries AND k.lease_until IS NOT NULL;
    IF EXISTS (SELECT 1 FROM @given)
        UPDATE {{subs}} SET scan_at = SYSUTCDATETIME() WHERE name = @name;
    SELECT id FROM @given ORDER BY id;
END

-- name: drop_subscription_functions
-- Remove the fan-out API (ring_0006's downgrade).
DROP PROCEDURE IF EXISTS {{fn_publish}};
GO
DROP PROCEDURE IF EXISTS {{fn_subscribe}};
GO
DROP PROCEDURE IF EXISTS {{fn_unsubscribe}};
GO
DROP PROCEDURE IF EXISTS {{fn_subscriptions}};
GO
DROP PROCEDURE IF EXISTS {{fn_sub_take}};
GO
DROP PROCEDURE IF EXISTS {{fn_sub_done}};
GO
DROP PROCEDURE IF EXISTS {{fn_sub_return}};
GO
DROP PROCEDURE IF EXISTS {{fn_fanout_guard}};

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
DROP PROCEDURE IF EXISTS {{fn_ring_push}};

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

-- name: publish
-- Client call: push many messages to a fan-out ring's subscriptions (:items as enqueue_many's).
EXEC {{fn_publish}} @items = :items, @timeout = :timeout

-- name: sub_take
-- Client call: up to :batch messages of subscription :name, leased for :lease seconds.
EXEC {{fn_sub_take}} @name = :name, @batch = :batch, @lease = :lease, @timeout = :timeout

-- name: sub_done
-- Client call: acknowledge messages of subscription :name (:ids, :tries: JSON arrays).
EXEC {{fn_sub_done}} @name = :name, @ids = :ids, @tries = :tries

-- name: sub_return
-- Client call: give claimed messages back to subscription :name at once.
EXEC {{fn_sub_return}} @name = :name, @ids = :ids, @tries = :tries

-- name: subscribe
-- Client call: add subscription :name (NULL options: the ring's defaults).
EXEC {{fn_subscribe}} @name = :name, @lag_limit = :lag_limit, @drop_when_behind = :drop_when_behind

-- name: unsubscribe
-- Client call: remove subscription :name.
EXEC {{fn_unsubscribe}} @name = :name

-- name: subscriptions
-- Client call: the subscriptions and their lag.
EXEC {{fn_subscriptions}}

-- name: counts
-- Depth for `queuectl list`: the FULL slots. READPAST: a slot locked now (a push not
-- committed yet, a pop taking it, a processing() block holding it) is not counted and never
-- waited for; READCOMMITTEDLOCK makes READPAST skip it under RCSI too, shared row locks
-- released as the scan goes (one at a time, so no escalation).
SELECT CAST(0 AS smallint) AS status, CAST(0 AS bit) AS scheduled, COUNT_BIG(*) AS n
FROM {{ring}} WITH (READCOMMITTEDLOCK, READPAST, ROWLOCK) WHERE state = 1
