-- Stack sections that later revisions replaced on SQL Server, each named for the revision that
-- installed it: a queue installed at an older revision runs it, and so does the downgrade
-- that puts the body back. A revision that changed only PostgreSQL has an empty section
-- here, so it runs nothing on SQL Server. What a fresh install creates today is in
-- ../stack.sql.

-- name: create_dequeue_0002
-- Empty: stack_0002 changed PostgreSQL's dequeue only (stack.sql: create_dequeue says why SQL
-- Server's needs no change).
