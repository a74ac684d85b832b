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
-- Generations (reliable_0012), as sql/postgresql/reliable.sql's header describes them, in
-- T-SQL: parse- and reference-checked, not run live (tests/test_mssql_offline.py,
-- tests/test_mssql_refs.py, tests/test_mssql_generations.py; the live tests need a server).
-- meta and data live in three generation slots, one table each (<queue>_meta0..2,
-- <queue>_data0..2); epoch e lives in slot e % 3. Enqueue inserts into the current epoch's
-- slot; ack and extend_lease update in place by id, in whichever slot the row is; nack and
-- release move the row (same id, priority, payload) into the current epoch's slot; the
-- archive job (queuectl.jobs.archive) is the rotator: it switches new rows to the next
-- epoch every few thousand ids, moves the READY rows left in the previous one forward (the
-- seal), moves an old epoch's finished rows to history and empties its tables with
-- TRUNCATE TABLE. <queue>_meta and <queue>_data are views over the three slots, for readers.
--
-- Why on SQL Server. A deleted row becomes a ghost record that the ghost cleanup task
-- removes within seconds (https://learn.microsoft.com/sql/relational-databases/ghost-record-cleanup-process-guide:
-- ghosts are kept for row-level locking and for snapshot isolation), unless row versioning
-- still needs it: READ_COMMITTED_SNAPSHOT or SNAPSHOT isolation with a long-running
-- snapshot transaction, a readable secondary of an availability group, or Accelerated
-- Database Recovery, whose persistent version store keeps versions in the database until
-- its cleaner passes the oldest active transaction (on, and not to be turned off, in Azure
-- SQL Database and Managed Instance, where RCSI is on by default too:
-- https://learn.microsoft.com/sql/relational-databases/accelerated-database-recovery-management,
-- https://learn.microsoft.com/sql/relational-databases/accelerated-database-recovery-troubleshoot).
-- Then ghosts and versions pile up in the queue's indexes and every READPAST claim walks
-- them: the decay of PostgreSQL's pinned xmin horizon. TRUNCATE TABLE deallocates a slot's
-- pages whatever versions exist, so the claim cost and the size stay bounded by the open
-- generations.
--
-- Per-slot tables, not one partitioned table. TRUNCATE TABLE ... WITH (PARTITIONS (n))
-- (SQL Server 2016+) empties one partition, but a truncate takes a schema modification
-- (Sch-M) lock on the table (https://learn.microsoft.com/sql/t-sql/statements/truncate-table-transact-sql:
-- "always locks the table (including a schema (SCH-M) lock)"), on the whole table also when
-- it names partitions (https://www.sqltabletalk.com/?p=834), and Sch-M conflicts with every
-- other lock, Sch-S included: every claim and ack on every slot would wait for each
-- truncate, as on PostgreSQL's partitioned parents. With a table per slot, a truncate
-- stops only the statements on the slot being emptied: no claim reads a sealed slot for
-- READY items, and only the acks of the few items still leased there wait. The claims'
-- plans need nothing partitioning gives: each slot table has its own filtered ready,
-- leased and finished indexes, and each statement names one slot's table and index in its
-- hints (INDEX, FORCESEEK), so no plan has to prune partitions. The cost is the text: T-SQL
-- names a table only as a literal, so a statement that may run on any slot is written once
-- per slot behind IF @slot = 0 / 1 / 2.
--
-- The rotation state is four sequences, not a row (a row updated at every rotation would
-- itself keep versions under RCSI), read from sys.sequences.current_value: the last value a
-- draw obligated, NEXT VALUE FOR or sp_sequence_get_range alike, and the start value until
-- the first draw, which is why create_rotation draws each once
-- (https://learn.microsoft.com/sql/relational-databases/system-catalog-views/sys-sequences-transact-sql):
--   <queue>_rot_epoch    the epoch new rows go to;
--   <queue>_rot_sealed   every epoch <= it holds no READY row the claims must see: the
--                        claims walk the READY rows of the epochs above it only (one, or
--                        two between a switch and its seal);
--   <queue>_rot_emptied  every epoch <= it has been moved to history and truncated (its slot
--                        is free for epoch + 3);
--   <queue>_rot_start    the id sequence's position at the last switch.
-- They advance only by drawing a value (NEXT VALUE FOR, sys.sp_sequence_get_range), never
-- by ALTER SEQUENCE (DDL, which takes a constant only), without a cache (a restart would
-- skip the cached values, and with them an epoch), and under an application lock
-- (sp_getapplock, owner Transaction) so two rotators cannot both advance one. Procedures
-- that read them run WITH EXECUTE AS OWNER: metadata visibility follows the caller, and a
-- role granted only EXECUTE (`queuectl grant`) would see no sequence (ring.sql says the same).
-- Why nothing is lost or claimed twice (PostgreSQL's rules 1-5, in T-SQL):
--  1. A row never changes slot by an UPDATE: it moves by DELETE ... OUTPUT and INSERT with
--     its id in one transaction (rot_move); a claim skips the deleted and the inserted rows
--     alike (READPAST) until it commits. ack, nack, extend_lease and release find a row by
--     id in whichever slot it is, the current slot first.
--  2. A writer (enqueue, enqueue_many, nack, release) reads the epoch, inserts, then reads
--     it again inside its transaction; if a switch came in between it moves its own rows
--     (uncommitted, locked by it) to the new epoch's slot (rot_follow). A writer that read
--     the epoch before a switch and commits after the seal leaves a READY row in a sealed
--     slot: the claims do not see it until the truncate moves it forward (5), so it is late
--     by one rotation, never lost.
--  3. The seal moves only READY rows, which it locks first (UPDLOCK, READPAST: a row a
--     claim is taking stays, late by one rotation, as in 2), and is marked only once it has
--     committed (sequence draws are not transactional), so the claims' READY walk always
--     covers every epoch that can still hold a READY row other than a late or skipped one.
--  4. Finished rows never change again: the precopy moves them to history in batches under
--     row locks (rot_copy), as archive_batch does.
--  5. The truncate locks the slot's meta and data tables (TABLOCKX, HOLDLOCK) under
--     LOCK_TIMEOUT 50 (error 1222: the job retries, rather than queue claims and acks
--     behind it), reads the state again, moves what finished since to history, moves every
--     unfinished row (PROCESSING, and READY rows of late writers) to the current epoch's
--     slot and truncates, in one transaction. A statement that waited for the table lock
--     reads the slot after the commit: the moved rows are in the current slot, the slot is
--     empty.
-- What TRUNCATE costs: a SNAPSHOT transaction that began before a slot's truncate fails
-- when it reads the slot after it (error 3961, the object was modified by a DDL statement:
-- https://learn.microsoft.com/sql/relational-databases/errors-events/mssqlserver-3961-database-engine-error;
-- TRUNCATE TABLE counts, https://dba.stackexchange.com/questions/66683); the
-- claims refuse SNAPSHOT anyway (READPAST, error 650), and reports that need one
-- consistent view read history. A session that holds a lock on a slot table (a long
-- transaction that read it with REPEATABLE READ or SERIALIZABLE, or a statement reading
-- the views for a long time) keeps that slot's truncate waiting: the queue stays correct
-- and decays as a single table would until it ends.
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
-- The SQL API as stored procedures, callable from any language, on the generation layout
-- (reliable_0012; the header says how it works and why nothing is lost or claimed twice).
-- CREATE OR ALTER keeps the procedures' permissions when a revision runs this section again.
--
-- ack and extend_lease update in place, by id, in whichever slot the row is: the current
-- slot's table first (most leases are there), the others only while ids are left. nack and
-- release give a row back to the claims: updated in place, then moved with its id, priority
-- and payload to the current epoch's slot (rot_move; header, 1 and 2); nack's last attempt
-- makes it DEAD where it is. One statement per slot table: T-SQL names a table only as a
-- literal, so each slot's statement is written out.
-- The plan each statement needs: for each id of the list, one seek of the slot's clustered
-- primary key (index 1, key id), the row checked (status, lease owner) and updated there;
-- nothing else is read or locked. WITH (INDEX(1), FORCESEEK) leaves only that access path
-- (FORCESEEK with an index but no column list: the parameterized form is refused on an
-- UPDATE's target; https://learn.microsoft.com/en-us/sql/t-sql/queries/hints-transact-sql-table).
-- OPENJSON's row estimate is a fixed guess, so without the hints the optimizer could scan
-- the leased index or the table.
-- Isolation: run these at READ COMMITTED (with READ_COMMITTED_SNAPSHOT on or off). A
-- SNAPSHOT transaction that began before a truncate fails when it reads the slot after it
-- (error 3961, header), so an ack in it cannot miss a moved row and report success; the
-- claim refuses SNAPSHOT anyway (READPAST, error 650; create_dequeue).

-- rot_move: move rows (meta and data, every column, same id) from whatever slot they are in
-- to slot @to; @status, when given, limits the move to rows in that status when the DELETE
-- reaches them. @moved returns the meta rows moved. One transaction: a concurrent claim
-- skips the deleted and the inserted rows alike (READPAST) until it commits. Used by the
-- writers to follow a switch (their own rows), by nack and release, by the seal (status 0,
-- rows it locked first) and by the truncate (under its table locks). Callers keep each call
-- under 5,000 rows: a statement that takes 5,000 row locks on one table escalates to a
-- table lock, which would stop every claim on the slot (dba.md 1.12).
CREATE OR ALTER PROCEDURE {{fn_rot_move}}
    @ids    nvarchar(max),
    @to     smallint,
    @status smallint = NULL,
    @moved  bigint   = NULL OUTPUT
AS
BEGIN
    SET NOCOUNT ON; SET ROWCOUNT 0;
    SET XACT_ABORT ON;
    DECLARE @m TABLE (
        id            bigint         NOT NULL PRIMARY KEY,
        priority      smallint       NOT NULL,
        due_at        datetime2(6)   NOT NULL,
        status        smallint       NOT NULL,
        title         nvarchar(400)  NULL,
        attempts      int            NOT NULL,
        max_attempts  int            NOT NULL,
        lease_owner   nvarchar(200)  NULL,
        leased_until  datetime2(6)   NULL,
        enqueued_at   datetime2(6)   NOT NULL,
        dequeued_at   datetime2(6)   NULL,
        finished_at   datetime2(6)   NULL,
        last_error    nvarchar(4000) NULL
    );
    DECLARE @d TABLE (id bigint NOT NULL PRIMARY KEY, payload varbinary(max) NOT NULL, headers nvarchar(max) NULL);
    BEGIN TRANSACTION;
    IF @to <> 0
    BEGIN
        DELETE m
        OUTPUT deleted.id, deleted.priority, deleted.due_at, deleted.status, deleted.title, deleted.attempts,
               deleted.max_attempts, deleted.lease_owner, deleted.leased_until, deleted.enqueued_at,
               deleted.dequeued_at, deleted.finished_at, deleted.last_error
        INTO @m (id, priority, due_at, status, title, attempts, max_attempts, lease_owner, leased_until, enqueued_at, dequeued_at, finished_at, last_error)
        FROM {{meta0}} AS m WITH (ROWLOCK, INDEX(1), FORCESEEK)
        WHERE m.id IN (SELECT i.id FROM OPENJSON(@ids) WITH (id bigint '$') AS i)
          AND (@status IS NULL OR m.status = @status);
    END
    IF @to <> 1
    BEGIN
        DELETE m
        OUTPUT deleted.id, deleted.priority, deleted.due_at, deleted.status, deleted.title, deleted.attempts,
               deleted.max_attempts, deleted.lease_owner, deleted.leased_until, deleted.enqueued_at,
               deleted.dequeued_at, deleted.finished_at, deleted.last_error
        INTO @m (id, priority, due_at, status, title, attempts, max_attempts, lease_owner, leased_until, enqueued_at, dequeued_at, finished_at, last_error)
        FROM {{meta1}} AS m WITH (ROWLOCK, INDEX(1), FORCESEEK)
        WHERE m.id IN (SELECT i.id FROM OPENJSON(@ids) WITH (id bigint '$') AS i)
          AND (@status IS NULL OR m.status = @status);
    END
    IF @to <> 2
    BEGIN
        DELETE m
        OUTPUT deleted.id, deleted.priority, deleted.due_at, deleted.status, deleted.title, deleted.attempts,
               deleted.max_attempts, deleted.lease_owner, deleted.leased_until, deleted.enqueued_at,
               deleted.dequeued_at, deleted.finished_at, deleted.last_error
        INTO @m (id, priority, due_at, status, title, attempts, max_attempts, lease_owner, leased_until, enqueued_at, dequeued_at, finished_at, last_error)
        FROM {{meta2}} AS m WITH (ROWLOCK, INDEX(1), FORCESEEK)
        WHERE m.id IN (SELECT i.id FROM OPENJSON(@ids) WITH (id bigint '$') AS i)
          AND (@status IS NULL OR m.status = @status);
    END
    IF @to <> 0
    BEGIN
        DELETE d
        OUTPUT deleted.id, deleted.payload, deleted.headers INTO @d (id, payload, headers)
        FROM {{data0}} AS d WITH (ROWLOCK, INDEX(1), FORCESEEK)
        WHERE d.id IN (SELECT g.id FROM @m AS g);
    END
    IF @to <> 1
    BEGIN
        DELETE d
        OUTPUT deleted.id, deleted.payload, deleted.headers INTO @d (id, payload, headers)
        FROM {{data1}} AS d WITH (ROWLOCK, INDEX(1), FORCESEEK)
        WHERE d.id IN (SELECT g.id FROM @m AS g);
    END
    IF @to <> 2
    BEGIN
        DELETE d
        OUTPUT deleted.id, deleted.payload, deleted.headers INTO @d (id, payload, headers)
        FROM {{data2}} AS d WITH (ROWLOCK, INDEX(1), FORCESEEK)
        WHERE d.id IN (SELECT g.id FROM @m AS g);
    END
    IF @to = 0
    BEGIN
        INSERT INTO {{meta0}} (id, priority, due_at, status, title, attempts, max_attempts, lease_owner, leased_until, enqueued_at, dequeued_at, finished_at, last_error)
        SELECT g.id, g.priority, g.due_at, g.status, g.title, g.attempts, g.max_attempts, g.lease_owner,
               g.leased_until, g.enqueued_at, g.dequeued_at, g.finished_at, g.last_error
        FROM @m AS g;
        INSERT INTO {{data0}} (id, payload, headers) SELECT g.id, g.payload, g.headers FROM @d AS g;
    END
    ELSE IF @to = 1
    BEGIN
        INSERT INTO {{meta1}} (id, priority, due_at, status, title, attempts, max_attempts, lease_owner, leased_until, enqueued_at, dequeued_at, finished_at, last_error)
        SELECT g.id, g.priority, g.due_at, g.status, g.title, g.attempts, g.max_attempts, g.lease_owner,
               g.leased_until, g.enqueued_at, g.dequeued_at, g.finished_at, g.last_error
        FROM @m AS g;
        INSERT INTO {{data1}} (id, payload, headers) SELECT g.id, g.payload, g.headers FROM @d AS g;
    END
    ELSE
    BEGIN
        INSERT INTO {{meta2}} (id, priority, due_at, status, title, attempts, max_attempts, lease_owner, leased_until, enqueued_at, dequeued_at, finished_at, last_error)
        SELECT g.id, g.priority, g.due_at, g.status, g.title, g.attempts, g.max_attempts, g.lease_owner,
               g.leased_until, g.enqueued_at, g.dequeued_at, g.finished_at, g.last_error
        FROM @m AS g;
        INSERT INTO {{data2}} (id, payload, headers) SELECT g.id, g.payload, g.headers FROM @d AS g;
    END
    SET @moved = (SELECT COUNT_BIG(*) FROM @m);
    COMMIT TRANSACTION;
END
GO
-- rot_follow: a writer's rows inserted into epoch @epoch's slot follow the switches that
-- came since it read the epoch (header, 2). The rows are the caller's own, uncommitted.
CREATE OR ALTER PROCEDURE {{fn_rot_follow}}
    @ids   nvarchar(max),
    @epoch bigint
WITH EXECUTE AS OWNER
AS
BEGIN
    SET NOCOUNT ON; SET ROWCOUNT 0;
    DECLARE @now bigint = (SELECT CAST(s.current_value AS bigint) FROM sys.sequences AS s
                        WHERE s.object_id = OBJECT_ID({{rot_epoch_regclass}}));
    DECLARE @to smallint;
    WHILE @now <> @epoch
    BEGIN
        SET @to = CAST(@now % 3 AS smallint);
        EXEC {{fn_rot_move}} @ids = @ids, @to = @to, @status = 0;
        SET @epoch = @now;
        SET @now = (SELECT CAST(s.current_value AS bigint) FROM sys.sequences AS s
                    WHERE s.object_id = OBJECT_ID({{rot_epoch_regclass}}));
    END
END
GO
-- ack: the items are done. Only the current lease holder (when @worker is given) may ack,
-- so a consumer whose lease expired and was taken over cannot finish the item twice.
-- @ids is a JSON array of ids. Returns one row: acked.
CREATE OR ALTER PROCEDURE {{fn_ack}}
    @ids    nvarchar(max),
    @worker nvarchar(200) = NULL
WITH EXECUTE AS OWNER
AS
BEGIN
    SET NOCOUNT ON; SET ROWCOUNT 0;
    DECLARE @epoch bigint = (SELECT CAST(s.current_value AS bigint) FROM sys.sequences AS s
                        WHERE s.object_id = OBJECT_ID({{rot_epoch_regclass}}));
    DECLARE @want int = (SELECT COUNT(*) FROM OPENJSON(@ids));
    DECLARE @acked int = 0;
    DECLARE @k int = 0, @s smallint;
    WHILE @k < 3 AND @acked < @want
    BEGIN
        SET @s = (CAST(@epoch % 3 AS smallint) + @k) % 3;
        IF @s = 0
        BEGIN
            UPDATE m SET status = 2, finished_at = SYSUTCDATETIME(), leased_until = NULL
            FROM {{meta0}} AS m WITH (ROWLOCK, INDEX(1), FORCESEEK)
            WHERE m.id IN (SELECT i.id FROM OPENJSON(@ids) WITH (id bigint '$') AS i)
              AND m.status = 1
              AND (@worker IS NULL OR m.lease_owner = @worker);
            SET @acked += @@ROWCOUNT;
        END
        ELSE IF @s = 1
        BEGIN
            UPDATE m SET status = 2, finished_at = SYSUTCDATETIME(), leased_until = NULL
            FROM {{meta1}} AS m WITH (ROWLOCK, INDEX(1), FORCESEEK)
            WHERE m.id IN (SELECT i.id FROM OPENJSON(@ids) WITH (id bigint '$') AS i)
              AND m.status = 1
              AND (@worker IS NULL OR m.lease_owner = @worker);
            SET @acked += @@ROWCOUNT;
        END
        ELSE
        BEGIN
            UPDATE m SET status = 2, finished_at = SYSUTCDATETIME(), leased_until = NULL
            FROM {{meta2}} AS m WITH (ROWLOCK, INDEX(1), FORCESEEK)
            WHERE m.id IN (SELECT i.id FROM OPENJSON(@ids) WITH (id bigint '$') AS i)
              AND m.status = 1
              AND (@worker IS NULL OR m.lease_owner = @worker);
            SET @acked += @@ROWCOUNT;
        END
        SET @k += 1;
    END
    SELECT @acked AS acked;
END
GO
-- nack: the attempt failed. The item is READY again after an exponential backoff
-- (@base_seconds * 2^(attempts-1), at most @max_seconds), in the current epoch's slot, or
-- DEAD (where it is) when its attempts are used up. Returns each item's new status
-- (id, status, due_at).
CREATE OR ALTER PROCEDURE {{fn_nack}}
    @ids          nvarchar(max),
    @error        nvarchar(4000) = NULL,
    @worker       nvarchar(200)  = NULL,
    @base_seconds float          = NULL,
    @max_seconds  float          = NULL
WITH EXECUTE AS OWNER
AS
BEGIN
    SET NOCOUNT ON; SET ROWCOUNT 0;
    SET XACT_ABORT ON;
    DECLARE @now datetime2(6) = SYSUTCDATETIME();
    DECLARE @base float = COALESCE(@base_seconds, {{backoff_base_seconds}});
    DECLARE @max float = COALESCE(@max_seconds, {{backoff_max_seconds}});
    DECLARE @epoch bigint = (SELECT CAST(s.current_value AS bigint) FROM sys.sequences AS s
                        WHERE s.object_id = OBJECT_ID({{rot_epoch_regclass}}));
    DECLARE @want int = (SELECT COUNT(*) FROM OPENJSON(@ids));
    DECLARE @done TABLE (id bigint NOT NULL PRIMARY KEY, status smallint NOT NULL, due_at datetime2(6) NOT NULL);
    DECLARE @back nvarchar(max), @to smallint = CAST(@epoch % 3 AS smallint);
    BEGIN TRANSACTION;
    DECLARE @k int = 0, @s smallint;
    WHILE @k < 3 AND (SELECT COUNT(*) FROM @done) < @want
    BEGIN
        SET @s = (@to + @k) % 3;
        IF @s = 0
        BEGIN
            UPDATE m SET
                status       = CASE WHEN m.attempts >= m.max_attempts THEN 3 ELSE 0 END,
                due_at       = CASE WHEN m.attempts >= m.max_attempts THEN m.due_at
                                    ELSE DATEADD(millisecond, b.ms, DATEADD(day, b.days, @now)) END,
                finished_at  = CASE WHEN m.attempts >= m.max_attempts THEN @now END,
                leased_until = NULL,
                last_error   = @error
            OUTPUT inserted.id, inserted.status, inserted.due_at INTO @done (id, status, due_at)
            FROM {{meta0}} AS m WITH (ROWLOCK, INDEX(1), FORCESEEK)
            CROSS APPLY (
                SELECT @base * POWER(2e0, CASE WHEN m.attempts < 1 THEN 0
                                               WHEN m.attempts > 41 THEN 40
                                               ELSE m.attempts - 1 END) AS raw
            ) AS r
            CROSS APPLY (SELECT CASE WHEN r.raw < @max THEN r.raw ELSE @max END AS seconds) AS c
            CROSS APPLY (
                SELECT CAST(FLOOR(c.seconds / 86400e0) AS int) AS days,
                       CAST(ROUND((c.seconds - FLOOR(c.seconds / 86400e0) * 86400e0) * 1000e0, 0) AS int) AS ms
            ) AS b
            WHERE m.id IN (SELECT i.id FROM OPENJSON(@ids) WITH (id bigint '$') AS i)
              AND m.status = 1
              AND (@worker IS NULL OR m.lease_owner = @worker);
        END
        ELSE IF @s = 1
        BEGIN
            UPDATE m SET
                status       = CASE WHEN m.attempts >= m.max_attempts THEN 3 ELSE 0 END,
                due_at       = CASE WHEN m.attempts >= m.max_attempts THEN m.due_at
                                    ELSE DATEADD(millisecond, b.ms, DATEADD(day, b.days, @now)) END,
                finished_at  = CASE WHEN m.attempts >= m.max_attempts THEN @now END,
                leased_until = NULL,
                last_error   = @error
            OUTPUT inserted.id, inserted.status, inserted.due_at INTO @done (id, status, due_at)
            FROM {{meta1}} AS m WITH (ROWLOCK, INDEX(1), FORCESEEK)
            CROSS APPLY (
                SELECT @base * POWER(2e0, CASE WHEN m.attempts < 1 THEN 0
                                               WHEN m.attempts > 41 THEN 40
                                               ELSE m.attempts - 1 END) AS raw
            ) AS r
            CROSS APPLY (SELECT CASE WHEN r.raw < @max THEN r.raw ELSE @max END AS seconds) AS c
            CROSS APPLY (
                SELECT CAST(FLOOR(c.seconds / 86400e0) AS int) AS days,
                       CAST(ROUND((c.seconds - FLOOR(c.seconds / 86400e0) * 86400e0) * 1000e0, 0) AS int) AS ms
            ) AS b
            WHERE m.id IN (SELECT i.id FROM OPENJSON(@ids) WITH (id bigint '$') AS i)
              AND m.status = 1
              AND (@worker IS NULL OR m.lease_owner = @worker);
        END
        ELSE
        BEGIN
            UPDATE m SET
                status       = CASE WHEN m.attempts >= m.max_attempts THEN 3 ELSE 0 END,
                due_at       = CASE WHEN m.attempts >= m.max_attempts THEN m.due_at
                                    ELSE DATEADD(millisecond, b.ms, DATEADD(day, b.days, @now)) END,
                finished_at  = CASE WHEN m.attempts >= m.max_attempts THEN @now END,
                leased_until = NULL,
                last_error   = @error
            OUTPUT inserted.id, inserted.status, inserted.due_at INTO @done (id, status, due_at)
            FROM {{meta2}} AS m WITH (ROWLOCK, INDEX(1), FORCESEEK)
            CROSS APPLY (
                SELECT @base * POWER(2e0, CASE WHEN m.attempts < 1 THEN 0
                                               WHEN m.attempts > 41 THEN 40
                                               ELSE m.attempts - 1 END) AS raw
            ) AS r
            CROSS APPLY (SELECT CASE WHEN r.raw < @max THEN r.raw ELSE @max END AS seconds) AS c
            CROSS APPLY (
                SELECT CAST(FLOOR(c.seconds / 86400e0) AS int) AS days,
                       CAST(ROUND((c.seconds - FLOOR(c.seconds / 86400e0) * 86400e0) * 1000e0, 0) AS int) AS ms
            ) AS b
            WHERE m.id IN (SELECT i.id FROM OPENJSON(@ids) WITH (id bigint '$') AS i)
              AND m.status = 1
              AND (@worker IS NULL OR m.lease_owner = @worker);
        END
        SET @k += 1;
    END
    SET @back = (SELECT CONCAT(N'[', STRING_AGG(CAST(r.id AS nvarchar(max)), N','), N']') FROM @done AS r WHERE r.status = 0);
    IF @back <> N'[]'
    BEGIN
        EXEC {{fn_rot_move}} @ids = @back, @to = @to, @status = 0;
        EXEC {{fn_rot_follow}} @ids = @back, @epoch = @epoch;
    END
    COMMIT TRANSACTION;
    SELECT r.id, r.status, r.due_at FROM @done AS r;
END
GO
-- extend_lease: a slow handler keeps its items (heartbeat). Returns the items still held
-- (id, leased_until).
CREATE OR ALTER PROCEDURE {{fn_extend_lease}}
    @ids           nvarchar(max),
    @lease_seconds float         = NULL,
    @worker        nvarchar(200) = NULL
WITH EXECUTE AS OWNER
AS
BEGIN
    SET NOCOUNT ON; SET ROWCOUNT 0;
    DECLARE @lease_ms int = CAST(ROUND(COALESCE(@lease_seconds, {{lease_seconds}}) * 1000e0, 0) AS int);
    DECLARE @epoch bigint = (SELECT CAST(s.current_value AS bigint) FROM sys.sequences AS s
                        WHERE s.object_id = OBJECT_ID({{rot_epoch_regclass}}));
    DECLARE @want int = (SELECT COUNT(*) FROM OPENJSON(@ids));
    DECLARE @held TABLE (id bigint NOT NULL PRIMARY KEY, leased_until datetime2(6) NULL);
    DECLARE @k int = 0, @s smallint;
    WHILE @k < 3 AND (SELECT COUNT(*) FROM @held) < @want
    BEGIN
        SET @s = (CAST(@epoch % 3 AS smallint) + @k) % 3;
        IF @s = 0
        BEGIN
            UPDATE m SET leased_until = DATEADD(millisecond, @lease_ms, SYSUTCDATETIME())
            OUTPUT inserted.id, inserted.leased_until INTO @held (id, leased_until)
            FROM {{meta0}} AS m WITH (ROWLOCK, INDEX(1), FORCESEEK)
            WHERE m.id IN (SELECT i.id FROM OPENJSON(@ids) WITH (id bigint '$') AS i)
              AND m.status = 1
              AND (@worker IS NULL OR m.lease_owner = @worker);
        END
        ELSE IF @s = 1
        BEGIN
            UPDATE m SET leased_until = DATEADD(millisecond, @lease_ms, SYSUTCDATETIME())
            OUTPUT inserted.id, inserted.leased_until INTO @held (id, leased_until)
            FROM {{meta1}} AS m WITH (ROWLOCK, INDEX(1), FORCESEEK)
            WHERE m.id IN (SELECT i.id FROM OPENJSON(@ids) WITH (id bigint '$') AS i)
              AND m.status = 1
              AND (@worker IS NULL OR m.lease_owner = @worker);
        END
        ELSE
        BEGIN
            UPDATE m SET leased_until = DATEADD(millisecond, @lease_ms, SYSUTCDATETIME())
            OUTPUT inserted.id, inserted.leased_until INTO @held (id, leased_until)
            FROM {{meta2}} AS m WITH (ROWLOCK, INDEX(1), FORCESEEK)
            WHERE m.id IN (SELECT i.id FROM OPENJSON(@ids) WITH (id bigint '$') AS i)
              AND m.status = 1
              AND (@worker IS NULL OR m.lease_owner = @worker);
        END
        SET @k += 1;
    END
    SELECT h.id, h.leased_until FROM @held AS h;
END
GO
-- release: give items back untouched (a consumer shutting down), without using up an
-- attempt; they move to the current epoch's slot. Returns one row: released.
CREATE OR ALTER PROCEDURE {{fn_release}}
    @ids    nvarchar(max),
    @worker nvarchar(200) = NULL
WITH EXECUTE AS OWNER
AS
BEGIN
    SET NOCOUNT ON; SET ROWCOUNT 0;
    SET XACT_ABORT ON;
    DECLARE @epoch bigint = (SELECT CAST(s.current_value AS bigint) FROM sys.sequences AS s
                        WHERE s.object_id = OBJECT_ID({{rot_epoch_regclass}}));
    DECLARE @want int = (SELECT COUNT(*) FROM OPENJSON(@ids));
    DECLARE @done TABLE (id bigint NOT NULL PRIMARY KEY);
    DECLARE @back nvarchar(max), @to smallint = CAST(@epoch % 3 AS smallint);
    BEGIN TRANSACTION;
    DECLARE @k int = 0, @s smallint;
    WHILE @k < 3 AND (SELECT COUNT(*) FROM @done) < @want
    BEGIN
        SET @s = (@to + @k) % 3;
        IF @s = 0
        BEGIN
            UPDATE m SET
                status       = 0,
                attempts     = CASE WHEN m.attempts > 0 THEN m.attempts - 1 ELSE 0 END,
                leased_until = NULL,
                lease_owner  = NULL
            OUTPUT inserted.id INTO @done (id)
            FROM {{meta0}} AS m WITH (ROWLOCK, INDEX(1), FORCESEEK)
            WHERE m.id IN (SELECT i.id FROM OPENJSON(@ids) WITH (id bigint '$') AS i)
              AND m.status = 1
              AND (@worker IS NULL OR m.lease_owner = @worker);
        END
        ELSE IF @s = 1
        BEGIN
            UPDATE m SET
                status       = 0,
                attempts     = CASE WHEN m.attempts > 0 THEN m.attempts - 1 ELSE 0 END,
                leased_until = NULL,
                lease_owner  = NULL
            OUTPUT inserted.id INTO @done (id)
            FROM {{meta1}} AS m WITH (ROWLOCK, INDEX(1), FORCESEEK)
            WHERE m.id IN (SELECT i.id FROM OPENJSON(@ids) WITH (id bigint '$') AS i)
              AND m.status = 1
              AND (@worker IS NULL OR m.lease_owner = @worker);
        END
        ELSE
        BEGIN
            UPDATE m SET
                status       = 0,
                attempts     = CASE WHEN m.attempts > 0 THEN m.attempts - 1 ELSE 0 END,
                leased_until = NULL,
                lease_owner  = NULL
            OUTPUT inserted.id INTO @done (id)
            FROM {{meta2}} AS m WITH (ROWLOCK, INDEX(1), FORCESEEK)
            WHERE m.id IN (SELECT i.id FROM OPENJSON(@ids) WITH (id bigint '$') AS i)
              AND m.status = 1
              AND (@worker IS NULL OR m.lease_owner = @worker);
        END
        SET @k += 1;
    END
    SET @back = (SELECT CONCAT(N'[', STRING_AGG(CAST(r.id AS nvarchar(max)), N','), N']') FROM @done AS r);
    IF @back <> N'[]'
    BEGIN
        EXEC {{fn_rot_move}} @ids = @back, @to = @to, @status = 0;
        EXEC {{fn_rot_follow}} @ids = @back, @epoch = @epoch;
    END
    COMMIT TRANSACTION;
    SELECT (SELECT COUNT(*) FROM @done) AS released;
END

-- name: create_dequeue
-- dequeue: claims up to @batch items and returns them with their payload, on the generation
-- layout (reliable_0012). The claims walk the open epochs' slots only: the current one, and
-- the previous one while it is not sealed (between a switch and its seal, or while a
-- backlog of more than the seal's limit keeps it open), the previous first (its rows are
-- older). A sealed slot's ghosts and row versions are never walked. rot_sealed is read
-- before rot_epoch (header, 3). Per open slot, two statements, each on that slot's tables:
--  1. Expired leases (their consumer died or stalled) go back to READY, or DEAD when that
--     was their last attempt: a bounded UPDATE through the slot's filtered index on
--     PROCESSING rows, so the claim below reads only the ready index. A lease that expired
--     in a sealed slot comes back when the truncate moves it forward (or the stale reset
--     job makes it READY there): late by at most one rotation.
--  2. THE claim is ONE statement: the CTE picks up to the rest of the batch of READY, due
--     rows in (priority, due_at, id) order with UPDLOCK, READPAST, ROWLOCK: concurrent
--     consumers skip each other's rows (READPAST), the picked keys stay locked until the
--     update (UPDLOCK), and no page or table lock blocks the others (ROWLOCK). UPDATE TOP
--     has no ORDER BY, hence the CTE: TOP with ORDER BY inside, the UPDATE through it.
--     OUTPUT returns the updated meta row joined to its payload in the same statement, into
--     a table variable (OUTPUT has no order): the batch is returned sorted from there.
-- The plans both statements need are pinned by their hints. A plan that sorts before TOP
-- would read every qualifying row first and, under UPDLOCK, lock each of them until the
-- transaction ends; an index whose key order is the ORDER BY, forced with INDEX (...),
-- makes the sort needless (https://learn.microsoft.com/en-us/sql/t-sql/queries/hints-transact-sql-table).
-- Row versioning: UPDLOCK takes update locks whatever the database's READ_COMMITTED_SNAPSHOT
-- setting, so both picks are locking reads with RCSI on, and READPAST skips rows other
-- transactions hold exactly as with it off. READCOMMITTEDLOCK, which the table-hints page
-- names for READPAST under RCSI, is not added: beside UPDLOCK it is ignored (same page,
-- UPDLOCK), and the page allows one hint of the granularity group it shares with ROWLOCK.
-- READPAST is rejected under SNAPSHOT isolation (error 650): run consumers at READ
-- COMMITTED (the default), with RCSI on or off.
-- A sealed slot the archive job has yet to empty is not looked in (as on PostgreSQL since
-- reliable_0015): a late writer's READY row or an expired lease there waits for the truncate,
-- which comes within one pass of the job.
CREATE OR ALTER PROCEDURE {{fn_dequeue}}
    @batch         int           = 1,
    @lease_seconds float         = NULL,
    @worker        nvarchar(200) = NULL
WITH EXECUTE AS OWNER
AS
BEGIN
    SET NOCOUNT ON; SET ROWCOUNT 0;
    DECLARE @now datetime2(6) = SYSUTCDATETIME();
    DECLARE @n int = CASE WHEN @batch > 0 THEN @batch ELSE 0 END;
    -- leases are at most 7 days: the milliseconds fit DATEADD's int
    DECLARE @lease_ms int = CAST(ROUND(COALESCE(@lease_seconds, {{lease_seconds}}) * 1000e0, 0) AS int);
    DECLARE @sealed bigint = (SELECT CAST(s.current_value AS bigint) FROM sys.sequences AS s
                        WHERE s.object_id = OBJECT_ID({{rot_sealed_regclass}}));
    DECLARE @epoch bigint = (SELECT CAST(s.current_value AS bigint) FROM sys.sequences AS s
                        WHERE s.object_id = OBJECT_ID({{rot_epoch_regclass}}));
    DECLARE @got int = 0;
    DECLARE @claimed TABLE (
        id bigint NOT NULL PRIMARY KEY, priority smallint NOT NULL, due_at datetime2(6) NOT NULL,
        title nvarchar(400) NULL, attempts int NOT NULL, max_attempts int NOT NULL,
        enqueued_at datetime2(6) NOT NULL, dequeued_at datetime2(6) NULL,
        leased_until datetime2(6) NULL, payload varbinary(max) NOT NULL, headers nvarchar(max) NULL
    );
    -- the open slots, oldest first: the previous epoch's while it is not sealed, the current one
    DECLARE @k bigint = CASE WHEN @sealed >= @epoch - 1 THEN @epoch ELSE @epoch - 1 END, @s smallint;
    WHILE @k <= @epoch AND @got < @n
    BEGIN
        SET @s = CAST(@k % 3 AS smallint);
        IF @s = 0
        BEGIN
            -- Plan: a range seek of {{meta0_leased}} (leased_until < @now) in key order, TOP
            -- stopping after @n - @got rows, READPAST skipping keys others hold.
            WITH expired AS (
                SELECT TOP (@n - @got) m.status, m.attempts, m.max_attempts, m.lease_owner, m.leased_until,
                                       m.finished_at, m.last_error
                FROM {{meta0}} AS m WITH (UPDLOCK, READPAST, ROWLOCK, INDEX({{meta0_leased}}), FORCESEEK)
                WHERE m.status = 1 AND m.leased_until < @now
                ORDER BY m.leased_until
            )
            UPDATE expired SET
                status       = CASE WHEN attempts >= max_attempts THEN 3 ELSE 0 END,
                finished_at  = CASE WHEN attempts >= max_attempts THEN @now END,
                last_error   = CONCAT(N'lease of ', COALESCE(lease_owner, N'an unknown consumer'),
                                      N' expired at ', CONVERT(nvarchar(33), leased_until, 126),
                                      N' UTC (attempt ', attempts, N' of ', max_attempts, N')'),
                lease_owner  = NULL,
                leased_until = NULL;
            -- THE claim, one statement: an ordered range seek of {{meta0_ready}} (priority, due_at,
            -- id) WHERE status = 0, which is the ORDER BY, TOP stopping after @n - @got rows.
            WITH picked AS (
                SELECT TOP (@n - @got) m.id, m.priority, m.due_at, m.status, m.title, m.attempts,
                                       m.max_attempts, m.lease_owner, m.leased_until, m.enqueued_at,
                                       m.dequeued_at
                FROM {{meta0}} AS m WITH (UPDLOCK, READPAST, ROWLOCK, INDEX({{meta0_ready}}))
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
            JOIN {{data0}} AS d WITH (INDEX(1), FORCESEEK) ON d.id = p.id;
            SET @got += @@ROWCOUNT;
        END
        ELSE IF @s = 1
        BEGIN
            -- Plan: a range seek of {{meta1_leased}} (leased_until < @now) in key order, TOP
            -- stopping after @n - @got rows, READPAST skipping keys others hold.
            WITH expired AS (
                SELECT TOP (@n - @got) m.status, m.attempts, m.max_attempts, m.lease_owner, m.leased_until,
                                       m.finished_at, m.last_error
                FROM {{meta1}} AS m WITH (UPDLOCK, READPAST, ROWLOCK, INDEX({{meta1_leased}}), FORCESEEK)
                WHERE m.status = 1 AND m.leased_until < @now
                ORDER BY m.leased_until
            )
            UPDATE expired SET
                status       = CASE WHEN attempts >= max_attempts THEN 3 ELSE 0 END,
                finished_at  = CASE WHEN attempts >= max_attempts THEN @now END,
                last_error   = CONCAT(N'lease of ', COALESCE(lease_owner, N'an unknown consumer'),
                                      N' expired at ', CONVERT(nvarchar(33), leased_until, 126),
                                      N' UTC (attempt ', attempts, N' of ', max_attempts, N')'),
                lease_owner  = NULL,
                leased_until = NULL;
            -- THE claim, one statement: an ordered range seek of {{meta1_ready}} (priority, due_at,
            -- id) WHERE status = 0, which is the ORDER BY, TOP stopping after @n - @got rows.
            WITH picked AS (
                SELECT TOP (@n - @got) m.id, m.priority, m.due_at, m.status, m.title, m.attempts,
                                       m.max_attempts, m.lease_owner, m.leased_until, m.enqueued_at,
                                       m.dequeued_at
                FROM {{meta1}} AS m WITH (UPDLOCK, READPAST, ROWLOCK, INDEX({{meta1_ready}}))
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
            JOIN {{data1}} AS d WITH (INDEX(1), FORCESEEK) ON d.id = p.id;
            SET @got += @@ROWCOUNT;
        END
        ELSE
        BEGIN
            -- Plan: a range seek of {{meta2_leased}} (leased_until < @now) in key order, TOP
            -- stopping after @n - @got rows, READPAST skipping keys others hold.
            WITH expired AS (
                SELECT TOP (@n - @got) m.status, m.attempts, m.max_attempts, m.lease_owner, m.leased_until,
                                       m.finished_at, m.last_error
                FROM {{meta2}} AS m WITH (UPDLOCK, READPAST, ROWLOCK, INDEX({{meta2_leased}}), FORCESEEK)
                WHERE m.status = 1 AND m.leased_until < @now
                ORDER BY m.leased_until
            )
            UPDATE expired SET
                status       = CASE WHEN attempts >= max_attempts THEN 3 ELSE 0 END,
                finished_at  = CASE WHEN attempts >= max_attempts THEN @now END,
                last_error   = CONCAT(N'lease of ', COALESCE(lease_owner, N'an unknown consumer'),
                                      N' expired at ', CONVERT(nvarchar(33), leased_until, 126),
                                      N' UTC (attempt ', attempts, N' of ', max_attempts, N')'),
                lease_owner  = NULL,
                leased_until = NULL;
            -- THE claim, one statement: an ordered range seek of {{meta2_ready}} (priority, due_at,
            -- id) WHERE status = 0, which is the ORDER BY, TOP stopping after @n - @got rows.
            WITH picked AS (
                SELECT TOP (@n - @got) m.id, m.priority, m.due_at, m.status, m.title, m.attempts,
                                       m.max_attempts, m.lease_owner, m.leased_until, m.enqueued_at,
                                       m.dequeued_at
                FROM {{meta2}} AS m WITH (UPDLOCK, READPAST, ROWLOCK, INDEX({{meta2_ready}}))
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
            JOIN {{data2}} AS d WITH (INDEX(1), FORCESEEK) ON d.id = p.id;
            SET @got += @@ROWCOUNT;
        END
        SET @k += 1;
    END;
    -- The ORDER BY in each pick chooses WHICH rows (the oldest ready ones); OUTPUT returns
    -- them in no defined order. Hand the batch out in the queue's order, as PostgreSQL's
    -- dequeue does.
    SELECT c.id, c.priority, c.due_at, c.title, c.attempts, c.max_attempts, c.enqueued_at,
           c.dequeued_at, c.leased_until, c.payload, c.headers
    FROM @claimed AS c
    ORDER BY c.priority, c.due_at, c.id;
END

-- name: create_enqueue_functions
-- reliable_0010's enqueue and enqueue_many (the size check, error 50413) on the generation
-- layout (reliable_0012): rows go to the current epoch's slot and follow a switch that came
-- meanwhile (header, 2).
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
WITH EXECUTE AS OWNER
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
    DECLARE @epoch bigint = (SELECT CAST(s.current_value AS bigint) FROM sys.sequences AS s
                             WHERE s.object_id = OBJECT_ID({{rot_epoch_regclass}}));
    DECLARE @slot smallint = CAST(@epoch % 3 AS smallint);
    IF @slot = 0
    BEGIN
        INSERT INTO {{meta0}} (id, priority, due_at, title, max_attempts)
        VALUES (@id, COALESCE(@priority, 0), @due, @title, COALESCE(@max_attempts, {{max_attempts}}));
        INSERT INTO {{data0}} (id, payload, headers) VALUES (@id, @payload, @headers);
    END
    ELSE IF @slot = 1
    BEGIN
        INSERT INTO {{meta1}} (id, priority, due_at, title, max_attempts)
        VALUES (@id, COALESCE(@priority, 0), @due, @title, COALESCE(@max_attempts, {{max_attempts}}));
        INSERT INTO {{data1}} (id, payload, headers) VALUES (@id, @payload, @headers);
    END
    ELSE
    BEGIN
        INSERT INTO {{meta2}} (id, priority, due_at, title, max_attempts)
        VALUES (@id, COALESCE(@priority, 0), @due, @title, COALESCE(@max_attempts, {{max_attempts}}));
        INSERT INTO {{data2}} (id, payload, headers) VALUES (@id, @payload, @headers);
    END
    DECLARE @mine nvarchar(max) = CONCAT(N'[', @id, N']');
    IF (SELECT CAST(s.current_value AS bigint) FROM sys.sequences AS s
        WHERE s.object_id = OBJECT_ID({{rot_epoch_regclass}})) <> @epoch
        EXEC {{fn_rot_follow}} @ids = @mine, @epoch = @epoch;
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
WITH EXECUTE AS OWNER
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
    DECLARE @epoch bigint = (SELECT CAST(s.current_value AS bigint) FROM sys.sequences AS s
                             WHERE s.object_id = OBJECT_ID({{rot_epoch_regclass}}));
    DECLARE @slot smallint = CAST(@epoch % 3 AS smallint);
    IF @slot = 0
    BEGIN
        INSERT INTO {{meta0}} (id, priority, due_at, title, max_attempts)
        SELECT s.id, COALESCE(s.priority, 0),
               DATEADD(millisecond,
                   CAST(ROUND((COALESCE(s.delay, 0) - FLOOR(COALESCE(s.delay, 0) / 86400e0) * 86400e0) * 1000e0, 0) AS int),
                   DATEADD(day, CAST(FLOOR(COALESCE(s.delay, 0) / 86400e0) AS int), @now)),
               s.title, COALESCE(@max_attempts, {{max_attempts}})
        FROM @src AS s;
        INSERT INTO {{data0}} (id, payload, headers)
        SELECT s.id, s.payload, s.headers FROM @src AS s;
    END
    ELSE IF @slot = 1
    BEGIN
        INSERT INTO {{meta1}} (id, priority, due_at, title, max_attempts)
        SELECT s.id, COALESCE(s.priority, 0),
               DATEADD(millisecond,
                   CAST(ROUND((COALESCE(s.delay, 0) - FLOOR(COALESCE(s.delay, 0) / 86400e0) * 86400e0) * 1000e0, 0) AS int),
                   DATEADD(day, CAST(FLOOR(COALESCE(s.delay, 0) / 86400e0) AS int), @now)),
               s.title, COALESCE(@max_attempts, {{max_attempts}})
        FROM @src AS s;
        INSERT INTO {{data1}} (id, payload, headers)
        SELECT s.id, s.payload, s.headers FROM @src AS s;
    END
    ELSE
    BEGIN
        INSERT INTO {{meta2}} (id, priority, due_at, title, max_attempts)
        SELECT s.id, COALESCE(s.priority, 0),
               DATEADD(millisecond,
                   CAST(ROUND((COALESCE(s.delay, 0) - FLOOR(COALESCE(s.delay, 0) / 86400e0) * 86400e0) * 1000e0, 0) AS int),
                   DATEADD(day, CAST(FLOOR(COALESCE(s.delay, 0) / 86400e0) AS int), @now)),
               s.title, COALESCE(@max_attempts, {{max_attempts}})
        FROM @src AS s;
        INSERT INTO {{data2}} (id, payload, headers)
        SELECT s.id, s.payload, s.headers FROM @src AS s;
    END
    DECLARE @mine nvarchar(max) = (SELECT CONCAT(N'[', STRING_AGG(CAST(s.id AS nvarchar(max)), N','), N']') FROM @src AS s);
    IF (SELECT CAST(s.current_value AS bigint) FROM sys.sequences AS s
        WHERE s.object_id = OBJECT_ID({{rot_epoch_regclass}})) <> @epoch
        EXEC {{fn_rot_follow}} @ids = @mine, @epoch = @epoch;
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
-- dequeue cost two of each). The ack and the claim are the ack and dequeue procedures
-- themselves, as on PostgreSQL, so this procedure names no table and serves the single
-- tables and the generation layout alike; ack's result set (acked) goes into a table
-- variable (INSERT ... EXEC), so the claimed batch is this procedure's only result set. XACT_ABORT: an
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
    -- The ack is the ack procedure itself, in this transaction; INSERT ... EXEC keeps its result
    -- set (acked) out of this procedure's, whose only result set is the claimed batch.
    DECLARE @acked TABLE (acked int);
    IF @ack_ids IS NOT NULL
        INSERT INTO @acked (acked) EXEC {{fn_ack}} @ids = @ack_ids, @worker = @worker;
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

-- name: set_sort_guard
-- reliable_0016 on PostgreSQL keeps the claims' cached plans from reading a slot's whole
-- ready set and sorting it for the batch (a plan made while the statistics counted few READY
-- rows). Here the claims name the ready index in a table hint (INDEX: create_dequeue) and
-- read it in its own (priority, due_at, id) order under TOP, which needs no sort; nothing
-- else is set. Checked offline only: no SQL Server ran these claims here. Empty on purpose
-- (no batch runs).

-- name: reset_sort_guard
-- reliable_0016 downgrade: nothing was set (see set_sort_guard). Empty on purpose.

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
-- reliable_0012 on SQL Server: the generation layout (the header says how it works and why
-- per-slot tables). The rotation state is four sequences, created without a cache (a
-- cached sequence skips values after a restart, which would skip an epoch) and drawn once
-- each, so that sys.sequences.current_value is the state from the start (before its first
-- draw a sequence reports its start value, which the first draw returns again). The slot tables have meta's and data's columns, checks, defaults,
-- fill factor and filtered indexes; data has no foreign key to meta (TRUNCATE TABLE refuses
-- a table a foreign key references, and every statement that moves a meta row moves its
-- payload in the same transaction). The single tables' rows go to slot 0, copied (T-SQL
-- renames tables only through sp_rename, and their unnamed constraints keep system names):
-- a queue installed at the head copies nothing, reliable_0001 made them empty in the same
-- install. <queue>_meta and <queue>_data then become views over the three slots, so every
-- reader of them (counts, health, reports) reads all slots unchanged; nothing writes
-- through them.
CREATE SEQUENCE {{rot_epoch}} AS bigint START WITH 0 MINVALUE 0 NO CACHE;
GO
CREATE SEQUENCE {{rot_sealed}} AS bigint START WITH -1 MINVALUE -1 NO CACHE;
GO
CREATE SEQUENCE {{rot_emptied}} AS bigint START WITH -1 MINVALUE -1 NO CACHE;
GO
CREATE SEQUENCE {{rot_start}} AS bigint START WITH 0 MINVALUE 0 NO CACHE;
GO
-- epoch 0, nothing sealed or emptied, epoch 0 counted from the id sequence's position
DECLARE @drawn bigint = NEXT VALUE FOR {{rot_epoch}};
SET @drawn = NEXT VALUE FOR {{rot_sealed}};
SET @drawn = NEXT VALUE FOR {{rot_emptied}};
SET @drawn = NEXT VALUE FOR {{rot_start}};
DECLARE @last bigint = COALESCE((SELECT CAST(s.last_used_value AS bigint) FROM sys.sequences AS s
                                 WHERE s.object_id = OBJECT_ID({{meta_seq_regclass}})), 0);
DECLARE @first sql_variant;
IF @last > 0
    EXEC sys.sp_sequence_get_range @sequence_name = {{rot_start_regclass}}, @range_size = @last,
                                   @range_first_value = @first OUTPUT;
GO
CREATE TABLE {{meta0}} (
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
CREATE TABLE {{data0}} (
    id       bigint         NOT NULL PRIMARY KEY CLUSTERED,
    payload  varbinary(max) NOT NULL,
    headers  nvarchar(max)  NULL CHECK (headers IS NULL OR ISJSON(headers) = 1)
);
GO
CREATE INDEX {{meta0_ready}} ON {{meta0}} (priority, due_at, id) WHERE status = 0;
GO
CREATE INDEX {{meta0_leased}} ON {{meta0}} (leased_until) WHERE status = 1;
GO
CREATE INDEX {{meta0_finished}} ON {{meta0}} (status, finished_at) WHERE status >= 2;
GO
CREATE TABLE {{meta1}} (
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
CREATE TABLE {{data1}} (
    id       bigint         NOT NULL PRIMARY KEY CLUSTERED,
    payload  varbinary(max) NOT NULL,
    headers  nvarchar(max)  NULL CHECK (headers IS NULL OR ISJSON(headers) = 1)
);
GO
CREATE INDEX {{meta1_ready}} ON {{meta1}} (priority, due_at, id) WHERE status = 0;
GO
CREATE INDEX {{meta1_leased}} ON {{meta1}} (leased_until) WHERE status = 1;
GO
CREATE INDEX {{meta1_finished}} ON {{meta1}} (status, finished_at) WHERE status >= 2;
GO
CREATE TABLE {{meta2}} (
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
CREATE TABLE {{data2}} (
    id       bigint         NOT NULL PRIMARY KEY CLUSTERED,
    payload  varbinary(max) NOT NULL,
    headers  nvarchar(max)  NULL CHECK (headers IS NULL OR ISJSON(headers) = 1)
);
GO
CREATE INDEX {{meta2_ready}} ON {{meta2}} (priority, due_at, id) WHERE status = 0;
GO
CREATE INDEX {{meta2_leased}} ON {{meta2}} (leased_until) WHERE status = 1;
GO
CREATE INDEX {{meta2_finished}} ON {{meta2}} (status, finished_at) WHERE status >= 2;
GO
INSERT INTO {{meta0}} (id, priority, due_at, status, title, attempts, max_attempts, lease_owner, leased_until, enqueued_at, dequeued_at, finished_at, last_error)
SELECT id, priority, due_at, status, title, attempts, max_attempts, lease_owner, leased_until, enqueued_at, dequeued_at, finished_at, last_error FROM {{meta}};
INSERT INTO {{data0}} (id, payload, headers) SELECT id, payload, headers FROM {{data}};
GO
DROP TABLE {{data}};
GO
DROP TABLE {{meta}};
GO
CREATE OR ALTER VIEW {{meta}} AS
SELECT id, priority, due_at, status, title, attempts, max_attempts, lease_owner, leased_until, enqueued_at, dequeued_at, finished_at, last_error FROM {{meta0}}
UNION ALL
SELECT id, priority, due_at, status, title, attempts, max_attempts, lease_owner, leased_until, enqueued_at, dequeued_at, finished_at, last_error FROM {{meta1}}
UNION ALL
SELECT id, priority, due_at, status, title, attempts, max_attempts, lease_owner, leased_until, enqueued_at, dequeued_at, finished_at, last_error FROM {{meta2}};
GO
CREATE OR ALTER VIEW {{data}} AS
SELECT id, payload, headers FROM {{data0}}
UNION ALL
SELECT id, payload, headers FROM {{data1}}
UNION ALL
SELECT id, payload, headers FROM {{data2}};

-- name: drop_rotation
-- reliable_0012 downgrade: back to one meta and one data table, as reliable_0001 made them
-- (create_tables), holding the rows of every slot (copied: the one step that costs what the
-- queue holds). Run after drop_rotator and before the procedures of reliable_0011 come back.
-- The rotation state goes first: every call reads it before it touches the tables.
DROP SEQUENCE IF EXISTS {{rot_epoch}};
DROP SEQUENCE IF EXISTS {{rot_sealed}};
DROP SEQUENCE IF EXISTS {{rot_emptied}};
DROP SEQUENCE IF EXISTS {{rot_start}};
DROP VIEW IF EXISTS {{data}};
DROP VIEW IF EXISTS {{meta}};
GO
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
CREATE TABLE {{data}} (
    id       bigint         NOT NULL PRIMARY KEY CLUSTERED,
    payload  varbinary(max) NOT NULL,
    headers  nvarchar(max)  NULL CHECK (headers IS NULL OR ISJSON(headers) = 1),
    FOREIGN KEY (id) REFERENCES {{meta}} (id)
);
GO
INSERT INTO {{meta}} (id, priority, due_at, status, title, attempts, max_attempts, lease_owner, leased_until, enqueued_at, dequeued_at, finished_at, last_error)
SELECT id, priority, due_at, status, title, attempts, max_attempts, lease_owner, leased_until, enqueued_at, dequeued_at, finished_at, last_error FROM {{meta0}}
UNION ALL
SELECT id, priority, due_at, status, title, attempts, max_attempts, lease_owner, leased_until, enqueued_at, dequeued_at, finished_at, last_error FROM {{meta1}}
UNION ALL
SELECT id, priority, due_at, status, title, attempts, max_attempts, lease_owner, leased_until, enqueued_at, dequeued_at, finished_at, last_error FROM {{meta2}};
INSERT INTO {{data}} (id, payload, headers)
SELECT id, payload, headers FROM {{data0}}
UNION ALL
SELECT id, payload, headers FROM {{data1}}
UNION ALL
SELECT id, payload, headers FROM {{data2}};
GO
DROP TABLE IF EXISTS {{data0}};
DROP TABLE IF EXISTS {{data1}};
DROP TABLE IF EXISTS {{data2}};
DROP TABLE IF EXISTS {{meta0}};
DROP TABLE IF EXISTS {{meta1}};
DROP TABLE IF EXISTS {{meta2}};
GO
CREATE INDEX {{ready_idx}} ON {{meta}} (priority, due_at, id) WHERE status = 0;
GO
CREATE INDEX {{leased_idx}} ON {{meta}} (leased_until) WHERE status = 1;
GO
CREATE INDEX {{finished_idx}} ON {{meta}} (status, finished_at) WHERE status >= 2;
-- name: create_claim_calls
-- reliable_0012 on PostgreSQL: the claim and the ack rendered once per slot and once on the
-- partitioned parents, as functions of their own. SQL Server's dequeue and ack hold each
-- slot's statement themselves (create_dequeue, create_functions): <queue>_meta is a view
-- here, which no claim may write through. Empty on purpose.

-- name: create_rotator
-- reliable_0012: the rotator's calls (queuectl.jobs.archive runs them through
-- jobs.sql's rot_* sections, each in a transaction of its own, and marks a step done with
-- rot_mark only after it committed). Any other client may run them too: each checks the
-- state itself and does nothing when its step is not due, so two rotators at once cost
-- retries, never rows. Sequence values are not transactional (NEXT VALUE FOR and
-- sp_sequence_get_range keep their effect when the transaction rolls back), as PostgreSQL's
-- setval: the marks come after the work they record has committed.

-- rot_state: the rotation state in one row (epoch, sealed, emptied, start_id, last_id).
CREATE OR ALTER PROCEDURE {{fn_rot_state}}
WITH EXECUTE AS OWNER
AS
BEGIN
    SET NOCOUNT ON; SET ROWCOUNT 0;
    DECLARE @epoch bigint = (SELECT CAST(s.current_value AS bigint) FROM sys.sequences AS s
                            WHERE s.object_id = OBJECT_ID({{rot_epoch_regclass}}));
    DECLARE @sealed bigint = (SELECT CAST(s.current_value AS bigint) FROM sys.sequences AS s
                            WHERE s.object_id = OBJECT_ID({{rot_sealed_regclass}}));
    DECLARE @emptied bigint = (SELECT CAST(s.current_value AS bigint) FROM sys.sequences AS s
                            WHERE s.object_id = OBJECT_ID({{rot_emptied_regclass}}));
    DECLARE @start_id bigint = (SELECT CAST(s.current_value AS bigint) FROM sys.sequences AS s
                            WHERE s.object_id = OBJECT_ID({{rot_start_regclass}}));
    DECLARE @last_id bigint = COALESCE((SELECT CAST(s.last_used_value AS bigint) FROM sys.sequences AS s
                                        WHERE s.object_id = OBJECT_ID({{meta_seq_regclass}})), 0);
    SELECT @epoch AS epoch, @sealed AS sealed, @emptied AS emptied, @start_id AS start_id, @last_id AS last_id;
END
GO
-- rot_switch: new rows go to the next epoch once the current one has had @items ids, the
-- previous one is sealed and the next slot is empty. Returns one row: epoch (the new one,
-- or NULL). The epoch and the start position advance by a draw (NEXT VALUE FOR, and
-- sp_sequence_get_range for the distance to the id sequence's position), under an
-- application lock, so two rotators cannot both advance them.
CREATE OR ALTER PROCEDURE {{fn_rot_switch}}
    @items bigint
WITH EXECUTE AS OWNER
AS
BEGIN
    SET NOCOUNT ON; SET ROWCOUNT 0;
    SET XACT_ABORT ON;
    DECLARE @rc int, @new bigint = NULL, @first sql_variant, @gap bigint;
    BEGIN TRANSACTION;
    -- one writer of the rotation state at a time (two rotators, a scheduler's and a
    -- person's, may run at once): the state is read again under this lock
    EXEC @rc = sys.sp_getapplock @Resource = {{rot_epoch_regclass}}, @LockMode = 'Exclusive',
                                 @LockOwner = 'Transaction';
    DECLARE @epoch bigint = (SELECT CAST(s.current_value AS bigint) FROM sys.sequences AS s
                            WHERE s.object_id = OBJECT_ID({{rot_epoch_regclass}}));
    DECLARE @sealed bigint = (SELECT CAST(s.current_value AS bigint) FROM sys.sequences AS s
                            WHERE s.object_id = OBJECT_ID({{rot_sealed_regclass}}));
    DECLARE @emptied bigint = (SELECT CAST(s.current_value AS bigint) FROM sys.sequences AS s
                            WHERE s.object_id = OBJECT_ID({{rot_emptied_regclass}}));
    DECLARE @start_id bigint = (SELECT CAST(s.current_value AS bigint) FROM sys.sequences AS s
                            WHERE s.object_id = OBJECT_ID({{rot_start_regclass}}));
    DECLARE @last_id bigint = COALESCE((SELECT CAST(s.last_used_value AS bigint) FROM sys.sequences AS s
                                        WHERE s.object_id = OBJECT_ID({{meta_seq_regclass}})), 0);
    IF @rc >= 0 AND @sealed >= @epoch - 1 AND @emptied >= @epoch - 1 AND @last_id - @start_id >= @items
    BEGIN
        SET @gap = @last_id - @start_id;
        IF @gap > 0
            EXEC sys.sp_sequence_get_range @sequence_name = {{rot_start_regclass}}, @range_size = @gap,
                                           @range_first_value = @first OUTPUT;
        SET @new = NEXT VALUE FOR {{rot_epoch}};
    END
    COMMIT TRANSACTION;
    SELECT @new AS epoch;
END
GO
-- rot_seal: seal epoch - 1 (header, 3): move its READY rows to the current epoch's slot.
-- Returns one row: moved (the rows moved; NULL when there is nothing to seal; -1 when more
-- than @limit rows are READY there: a backlog, and the epoch stays open, walked by the
-- claims, rather than moved whole at every rotation). The caller marks it sealed once this
-- has committed. The count and the picks skip rows others hold (READPAST), so the seal
-- never waits on a consumer; the count only decides whether a backlog keeps the epoch open,
-- so under READ_COMMITTED_SNAPSHOT its READPAST reads versions here on purpose (a row a
-- claim is taking may count as READY). The rows it moves are locked first (UPDLOCK); a
-- READY row skipped (one a claim is taking) stays in the sealed slot until the truncate
-- moves it forward: late by one rotation, never lost. 2,000 rows per move, so no statement
-- takes the 5,000 row locks that escalate to a table lock (each move is a transaction of its
-- own, nested in the caller's when it has one, as the job's has).
CREATE OR ALTER PROCEDURE {{fn_rot_seal}}
    @limit int
WITH EXECUTE AS OWNER
AS
BEGIN
    SET NOCOUNT ON; SET ROWCOUNT 0;
    SET XACT_ABORT ON;
    DECLARE @sealed bigint = (SELECT CAST(s.current_value AS bigint) FROM sys.sequences AS s
                            WHERE s.object_id = OBJECT_ID({{rot_sealed_regclass}}));
    DECLARE @epoch bigint = (SELECT CAST(s.current_value AS bigint) FROM sys.sequences AS s
                            WHERE s.object_id = OBJECT_ID({{rot_epoch_regclass}}));
    DECLARE @from smallint = CAST((@epoch + 2) % 3 AS smallint), @to smallint = CAST(@epoch % 3 AS smallint);
    DECLARE @ready int, @moved bigint = 0, @step bigint, @json nvarchar(max);
    DECLARE @ids TABLE (id bigint NOT NULL PRIMARY KEY);
    IF @sealed >= @epoch - 1
    BEGIN
        SELECT CAST(NULL AS bigint) AS moved;
        RETURN;
    END
    IF @from = 0
    BEGIN
        SET @ready = (SELECT COUNT(*) FROM (SELECT TOP (@limit + 1) m.id
                                            FROM {{meta0}} AS m WITH (READPAST, INDEX({{meta0_ready}}))
                                            WHERE m.status = 0) AS r);
    END
    ELSE IF @from = 1
    BEGIN
        SET @ready = (SELECT COUNT(*) FROM (SELECT TOP (@limit + 1) m.id
                                            FROM {{meta1}} AS m WITH (READPAST, INDEX({{meta1_ready}}))
                                            WHERE m.status = 0) AS r);
    END
    ELSE
    BEGIN
        SET @ready = (SELECT COUNT(*) FROM (SELECT TOP (@limit + 1) m.id
                                            FROM {{meta2}} AS m WITH (READPAST, INDEX({{meta2_ready}}))
                                            WHERE m.status = 0) AS r);
    END
    IF @ready > @limit
    BEGIN
        SELECT CAST(-1 AS bigint) AS moved;
        RETURN;
    END
    WHILE 1 = 1
    BEGIN
        DELETE FROM @ids;
        BEGIN TRANSACTION;
        IF @from = 0
        BEGIN
            INSERT INTO @ids (id)
            SELECT TOP (2000) m.id
            FROM {{meta0}} AS m WITH (UPDLOCK, READPAST, ROWLOCK, INDEX({{meta0_ready}}))
            WHERE m.status = 0;
        END
        ELSE IF @from = 1
        BEGIN
            INSERT INTO @ids (id)
            SELECT TOP (2000) m.id
            FROM {{meta1}} AS m WITH (UPDLOCK, READPAST, ROWLOCK, INDEX({{meta1_ready}}))
            WHERE m.status = 0;
        END
        ELSE
        BEGIN
            INSERT INTO @ids (id)
            SELECT TOP (2000) m.id
            FROM {{meta2}} AS m WITH (UPDLOCK, READPAST, ROWLOCK, INDEX({{meta2_ready}}))
            WHERE m.status = 0;
        END
        SET @json = (SELECT CONCAT(N'[', STRING_AGG(CAST(i.id AS nvarchar(max)), N','), N']') FROM @ids AS i);
        SET @step = 0;
        IF @json <> N'[]'
            EXEC {{fn_rot_move}} @ids = @json, @to = @to, @status = 0, @moved = @step OUTPUT;
        COMMIT TRANSACTION;
        SET @moved += @step;
        IF (SELECT COUNT(*) FROM @ids) < 2000
            BREAK;
    END
    SELECT @moved AS moved;
END
GO
-- rot_mark: record a step the caller's previous transaction completed ('sealed' or
-- 'emptied', up to @epoch). Each mark draws its sequence up to @epoch, under the same
-- application lock as the switch.
CREATE OR ALTER PROCEDURE {{fn_rot_mark}}
    @what  nvarchar(20),
    @epoch bigint
WITH EXECUTE AS OWNER
AS
BEGIN
    SET NOCOUNT ON; SET ROWCOUNT 0;
    SET XACT_ABORT ON;
    DECLARE @rc int, @drawn bigint;
    IF @what NOT IN (N'sealed', N'emptied')
        THROW 50012, 'rot_mark: unknown step (sealed or emptied)', 1;
    BEGIN TRANSACTION;
    -- one writer of the rotation state at a time (two rotators, a scheduler's and a
    -- person's, may run at once): the state is read again under this lock
    EXEC @rc = sys.sp_getapplock @Resource = {{rot_epoch_regclass}}, @LockMode = 'Exclusive',
                                 @LockOwner = 'Transaction';
    -- without the lock nothing is marked: the next pass finds the step due again and redoes it
    -- (a seal or a truncate that finds nothing left to move), then marks it
    IF @rc < 0
        THROW 50013, 'rot_mark: another rotator holds the rotation state; the step is marked on the next pass', 1;
    DECLARE @sealed bigint = (SELECT CAST(s.current_value AS bigint) FROM sys.sequences AS s
                            WHERE s.object_id = OBJECT_ID({{rot_sealed_regclass}}));
    DECLARE @emptied bigint = (SELECT CAST(s.current_value AS bigint) FROM sys.sequences AS s
                            WHERE s.object_id = OBJECT_ID({{rot_emptied_regclass}}));
    WHILE @what = N'sealed' AND @sealed < @epoch
    BEGIN
        SET @drawn = NEXT VALUE FOR {{rot_sealed}};
        SET @sealed = @drawn;
    END
    WHILE @what = N'emptied' AND @emptied < @epoch
    BEGIN
        SET @drawn = NEXT VALUE FOR {{rot_emptied}};
        SET @emptied = @drawn;
    END
    COMMIT TRANSACTION;
END
GO
-- rot_copy: move finished rows of slot @slot, with their payloads, to history: those with an
-- id above @after, at most @batch of them, in id order, so the archive job empties a large
-- generation in short transactions before the truncate's short lock. Rows are moved (DELETE
-- ... OUTPUT INTO history, as archive_batch), not copied as on PostgreSQL: archive_batch may
-- move a finished row of the same slot meanwhile, and a row copied without being deleted
-- would then reach history twice (its primary key refuses the second). The deletes leave
-- ghosts in a slot that the truncate is about to empty. @copied and @last_id (the next
-- call's @after; NULL when no row was left) return the outcome.
CREATE OR ALTER PROCEDURE {{fn_rot_copy}}
    @slot    smallint,
    @after   bigint,
    @batch   int,
    @copied  bigint = NULL OUTPUT,
    @last_id bigint = NULL OUTPUT
AS
BEGIN
    SET NOCOUNT ON; SET ROWCOUNT 0;
    SET XACT_ABORT ON;
    DECLARE @picked TABLE (id bigint NOT NULL PRIMARY KEY);
    DECLARE @moved TABLE (id bigint NOT NULL PRIMARY KEY, payload varbinary(max), headers nvarchar(max));
    IF @batch IS NULL OR @batch < 1 OR @batch > 4000
        THROW 50002, 'queuectl: archive batch must be 1 to 4000 rows (lock escalation starts at 5000)', 1;
    SET @copied = 0;
    BEGIN TRANSACTION;
    IF @slot = 0
    BEGIN
        INSERT INTO @picked (id)
        SELECT TOP (@batch) m.id
        FROM {{meta0}} AS m WITH (UPDLOCK, READPAST, ROWLOCK, INDEX(1), FORCESEEK)
        WHERE m.id > @after AND m.status >= 2
        ORDER BY m.id;
        DELETE d
        OUTPUT deleted.id, deleted.payload, deleted.headers INTO @moved (id, payload, headers)
        FROM {{data0}} AS d WITH (ROWLOCK, INDEX(1), FORCESEEK)
        JOIN @picked AS p ON p.id = d.id;
        DELETE m
        OUTPUT deleted.id, deleted.priority, deleted.due_at, deleted.status, deleted.title,
               deleted.attempts, deleted.max_attempts, deleted.lease_owner, deleted.enqueued_at,
               deleted.dequeued_at, deleted.finished_at, deleted.last_error, mv.payload, mv.headers,
               SYSUTCDATETIME()
        INTO {{history}} (id, priority, due_at, status, title, attempts, max_attempts, lease_owner,
                          enqueued_at, dequeued_at, finished_at, last_error, payload, headers,
                          archived_at)
        FROM {{meta0}} AS m WITH (ROWLOCK, INDEX(1), FORCESEEK)
        JOIN @picked AS p ON p.id = m.id
        LEFT JOIN @moved AS mv ON mv.id = m.id;
        SET @copied = @@ROWCOUNT;
    END
    ELSE IF @slot = 1
    BEGIN
        INSERT INTO @picked (id)
        SELECT TOP (@batch) m.id
        FROM {{meta1}} AS m WITH (UPDLOCK, READPAST, ROWLOCK, INDEX(1), FORCESEEK)
        WHERE m.id > @after AND m.status >= 2
        ORDER BY m.id;
        DELETE d
        OUTPUT deleted.id, deleted.payload, deleted.headers INTO @moved (id, payload, headers)
        FROM {{data1}} AS d WITH (ROWLOCK, INDEX(1), FORCESEEK)
        JOIN @picked AS p ON p.id = d.id;
        DELETE m
        OUTPUT deleted.id, deleted.priority, deleted.due_at, deleted.status, deleted.title,
               deleted.attempts, deleted.max_attempts, deleted.lease_owner, deleted.enqueued_at,
               deleted.dequeued_at, deleted.finished_at, deleted.last_error, mv.payload, mv.headers,
               SYSUTCDATETIME()
        INTO {{history}} (id, priority, due_at, status, title, attempts, max_attempts, lease_owner,
                          enqueued_at, dequeued_at, finished_at, last_error, payload, headers,
                          archived_at)
        FROM {{meta1}} AS m WITH (ROWLOCK, INDEX(1), FORCESEEK)
        JOIN @picked AS p ON p.id = m.id
        LEFT JOIN @moved AS mv ON mv.id = m.id;
        SET @copied = @@ROWCOUNT;
    END
    ELSE
    BEGIN
        INSERT INTO @picked (id)
        SELECT TOP (@batch) m.id
        FROM {{meta2}} AS m WITH (UPDLOCK, READPAST, ROWLOCK, INDEX(1), FORCESEEK)
        WHERE m.id > @after AND m.status >= 2
        ORDER BY m.id;
        DELETE d
        OUTPUT deleted.id, deleted.payload, deleted.headers INTO @moved (id, payload, headers)
        FROM {{data2}} AS d WITH (ROWLOCK, INDEX(1), FORCESEEK)
        JOIN @picked AS p ON p.id = d.id;
        DELETE m
        OUTPUT deleted.id, deleted.priority, deleted.due_at, deleted.status, deleted.title,
               deleted.attempts, deleted.max_attempts, deleted.lease_owner, deleted.enqueued_at,
               deleted.dequeued_at, deleted.finished_at, deleted.last_error, mv.payload, mv.headers,
               SYSUTCDATETIME()
        INTO {{history}} (id, priority, due_at, status, title, attempts, max_attempts, lease_owner,
                          enqueued_at, dequeued_at, finished_at, last_error, payload, headers,
                          archived_at)
        FROM {{meta2}} AS m WITH (ROWLOCK, INDEX(1), FORCESEEK)
        JOIN @picked AS p ON p.id = m.id
        LEFT JOIN @moved AS mv ON mv.id = m.id;
        SET @copied = @@ROWCOUNT;
    END
    COMMIT TRANSACTION;
    SET @last_id = (SELECT MAX(p.id) FROM @picked AS p);
END
GO
-- rot_next_empty: the oldest sealed epoch that is not emptied yet (@epoch), or NULL.
CREATE OR ALTER PROCEDURE {{fn_rot_next_empty}}
    @epoch bigint = NULL OUTPUT
WITH EXECUTE AS OWNER
AS
BEGIN
    SET NOCOUNT ON; SET ROWCOUNT 0;
    DECLARE @sealed bigint = (SELECT CAST(s.current_value AS bigint) FROM sys.sequences AS s
                            WHERE s.object_id = OBJECT_ID({{rot_sealed_regclass}}));
    DECLARE @emptied bigint = (SELECT CAST(s.current_value AS bigint) FROM sys.sequences AS s
                            WHERE s.object_id = OBJECT_ID({{rot_emptied_regclass}}));
    SET @epoch = CASE WHEN @emptied + 1 <= @sealed THEN @emptied + 1 END;
END
GO
-- rot_empty: archive and empty the oldest sealed epoch (header, 5); the caller has moved its
-- finished rows to history already (rot_copy, without a table lock). Under LOCK_TIMEOUT 50
-- (archive.py: EMPTY_LOCK_TIMEOUT_MS; error 1222 when the slot stays locked, and the job
-- retries rather than queue claims and acks behind it) the slot's meta and data tables are
-- locked (TABLOCKX, HOLDLOCK: the claims and acks of the few rows left there wait, nothing
-- else does), the state is read again under the lock (another rotator may have emptied this
-- epoch, marked it and switched new rows into the slot meanwhile: then nothing is done),
-- what finished since is moved to history, every unfinished row (PROCESSING, and READY rows
-- of late writers) moves to the current epoch's slot, and TRUNCATE TABLE empties both
-- tables, in one transaction. TRUNCATE takes a schema modification (Sch-M) lock on its
-- table (https://learn.microsoft.com/sql/t-sql/statements/truncate-table-transact-sql:
-- "always locks the table (including a schema (SCH-M) lock)"), which also waits for
-- readers of row versions (RCSI, SNAPSHOT) and NOLOCK readers of that table, within the same
-- LOCK_TIMEOUT. Returns one row: epoch (NULL when none waits), copied, moved. Run it as the
-- tables' owner: TRUNCATE TABLE needs ALTER on the table.
CREATE OR ALTER PROCEDURE {{fn_rot_empty}}
WITH EXECUTE AS OWNER
AS
BEGIN
    SET NOCOUNT ON; SET ROWCOUNT 0;
    SET XACT_ABORT ON;
    -- a SET inside a procedure is undone when it returns: the caller's timeout stays
    SET LOCK_TIMEOUT 50;
    DECLARE @epoch bigint, @again bigint, @slot smallint, @to smallint, @any bigint;
    DECLARE @copied bigint = 0, @moved bigint = 0, @step bigint, @after bigint = 0, @last bigint;
    DECLARE @ids nvarchar(max);
    EXEC {{fn_rot_next_empty}} @epoch = @epoch OUTPUT;
    IF @epoch IS NULL
    BEGIN
        SELECT CAST(NULL AS bigint) AS epoch, CAST(NULL AS bigint) AS copied, CAST(NULL AS bigint) AS moved;
        RETURN;
    END
    SET @slot = CAST(@epoch % 3 AS smallint);
    BEGIN TRANSACTION;
    IF @slot = 0
    BEGIN
        SELECT TOP (1) @any = m.id FROM {{meta0}} AS m WITH (TABLOCKX, HOLDLOCK);
        SELECT TOP (1) @any = d.id FROM {{data0}} AS d WITH (TABLOCKX, HOLDLOCK);
    END
    ELSE IF @slot = 1
    BEGIN
        SELECT TOP (1) @any = m.id FROM {{meta1}} AS m WITH (TABLOCKX, HOLDLOCK);
        SELECT TOP (1) @any = d.id FROM {{data1}} AS d WITH (TABLOCKX, HOLDLOCK);
    END
    ELSE
    BEGIN
        SELECT TOP (1) @any = m.id FROM {{meta2}} AS m WITH (TABLOCKX, HOLDLOCK);
        SELECT TOP (1) @any = d.id FROM {{data2}} AS d WITH (TABLOCKX, HOLDLOCK);
    END
    EXEC {{fn_rot_next_empty}} @epoch = @again OUTPUT;
    IF @again IS NULL OR @again <> @epoch
    BEGIN
        COMMIT TRANSACTION;
        SELECT CAST(NULL AS bigint) AS epoch, CAST(NULL AS bigint) AS copied, CAST(NULL AS bigint) AS moved;
        RETURN;
    END
    -- what finished since the precopy, in batches under escalation size
    WHILE 1 = 1
    BEGIN
        EXEC {{fn_rot_copy}} @slot = @slot, @after = @after, @batch = 4000, @copied = @step OUTPUT,
                               @last_id = @last OUTPUT;
        SET @copied += @step;
        IF @last IS NULL
            BREAK;
        SET @after = @last;
    END
    -- every unfinished row to the current epoch, 2,000 at a time
    DECLARE @now bigint = (SELECT CAST(s.current_value AS bigint) FROM sys.sequences AS s
                            WHERE s.object_id = OBJECT_ID({{rot_epoch_regclass}}));
    SET @to = CAST(@now % 3 AS smallint);
    WHILE 1 = 1
    BEGIN
        IF @slot = 0
        BEGIN
            SET @ids = (SELECT CONCAT(N'[', STRING_AGG(CAST(u.id AS nvarchar(max)), N','), N']')
                        FROM (SELECT TOP (2000) m.id FROM {{meta0}} AS m WHERE m.status < 2) AS u);
        END
        ELSE IF @slot = 1
        BEGIN
            SET @ids = (SELECT CONCAT(N'[', STRING_AGG(CAST(u.id AS nvarchar(max)), N','), N']')
                        FROM (SELECT TOP (2000) m.id FROM {{meta1}} AS m WHERE m.status < 2) AS u);
        END
        ELSE
        BEGIN
            SET @ids = (SELECT CONCAT(N'[', STRING_AGG(CAST(u.id AS nvarchar(max)), N','), N']')
                        FROM (SELECT TOP (2000) m.id FROM {{meta2}} AS m WHERE m.status < 2) AS u);
        END
        IF @ids = N'[]'
            BREAK;
        EXEC {{fn_rot_move}} @ids = @ids, @to = @to, @moved = @step OUTPUT;
        SET @moved += @step;
    END
    IF @slot = 0
    BEGIN
        TRUNCATE TABLE {{meta0}};
        TRUNCATE TABLE {{data0}};
    END
    ELSE IF @slot = 1
    BEGIN
        TRUNCATE TABLE {{meta1}};
        TRUNCATE TABLE {{data1}};
    END
    ELSE
    BEGIN
        TRUNCATE TABLE {{meta2}};
        TRUNCATE TABLE {{data2}};
    END
    COMMIT TRANSACTION;
    SELECT @epoch AS epoch, @copied AS copied, @moved AS moved;
END

-- name: create_rot_copy
-- reliable_0014 on PostgreSQL: the copy to history inserts in id order, so that two rotators
-- copying the same generation never deadlock on each other's keys. SQL Server's rot_copy (in
-- create_rotator above) picks its rows WITH (UPDLOCK, READPAST) and moves them: two rotators
-- never take the same row, so neither inserts a key the other holds. reliable_0015, 0017 and
-- 0018 on PostgreSQL change how its rot_copy looks rows up in history and inserts them
-- (without ON CONFLICT since 0018); SQL Server's inserts only the rows it moves out of the
-- slot. Empty on purpose.

-- name: create_rot_empty
-- reliable_0017 on PostgreSQL: rot_empty takes the epoch its caller precopied and the
-- transaction horizon it precopied from, and its copy under the lock looks up in history only
-- the rows finished since (PostgreSQL's rot_copy leaves the rows it copies in the slot, for
-- the truncate). SQL Server's rot_copy moves the rows it copies out of the slot, so what its
-- truncate finds there finished since already; its rot_empty (in create_rotator above) is
-- unchanged. Empty on purpose.

-- name: drop_rot_calls_unaware
-- reliable_0017 upgrade on PostgreSQL: drops rot_copy and rot_empty without the precopy's
-- horizon. Nothing was created here (see create_rot_empty). Empty on purpose.

-- name: drop_rot_calls_aware
-- reliable_0017 downgrade on PostgreSQL: drops rot_copy and rot_empty with the precopy's
-- horizon. Nothing was created here (see create_rot_empty). Empty on purpose.

-- name: drop_rotator
-- reliable_0012 downgrade: the rotator's calls.
DROP PROCEDURE IF EXISTS {{fn_rot_empty}};
DROP PROCEDURE IF EXISTS {{fn_rot_next_empty}};
DROP PROCEDURE IF EXISTS {{fn_rot_copy}};
DROP PROCEDURE IF EXISTS {{fn_rot_mark}};
DROP PROCEDURE IF EXISTS {{fn_rot_seal}};
DROP PROCEDURE IF EXISTS {{fn_rot_switch}};
DROP PROCEDURE IF EXISTS {{fn_rot_state}};

-- name: drop_rotation_functions
-- reliable_0012 downgrade, after reliable_0011's procedures are back: the writers' helpers.
DROP PROCEDURE IF EXISTS {{fn_rot_follow}};
DROP PROCEDURE IF EXISTS {{fn_rot_move}};

-- name: create_lease_calls
-- reliable_0013: PostgreSQL's extend_lease, nack and release on each generation slot's own
-- tables (a statement on its partitioned parents locks every slot). SQL Server's procedures
-- (create_functions) already run each call on the current slot's table first, then on the
-- other slots: nothing to add. Empty on purpose.

-- name: drop_lease_calls
-- reliable_0013 downgrade: nothing was created. Empty on purpose.
