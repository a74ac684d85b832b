-- Pending sections that later revisions replaced on SQL Server, each named for the revision that
-- installed it: a queue installed at an older revision runs it, and so does the downgrade
-- that puts the body back. A revision that changed only PostgreSQL has an empty section
-- here, so it runs nothing on SQL Server. What a fresh install creates today is in
-- ../pending.sql.

-- name: create_dequeue_0002
-- Empty: pending_0002 changed PostgreSQL's dequeue only (pending.sql: create_dequeue says why SQL
-- Server's needs no change).

-- name: create_dequeue_0004
-- Empty: pending_0004 changed PostgreSQL's dequeue only (pending.sql: create_dequeue says why SQL
-- Server's needs no change).

-- name: create_dequeue_0005
-- Empty: pending_0005 changed PostgreSQL's dequeue only (its DELETE by row address); SQL
-- Server's deletes through its TOP pick with table hints (pending.sql: create_dequeue).
