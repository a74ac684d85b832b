-- Fifo sections that later revisions replaced on SQL Server, each named for the revision that
-- installed it: a queue installed at an older revision runs it, and so does the downgrade
-- that puts the body back. A revision that changed only PostgreSQL has an empty section
-- here, so it runs nothing on SQL Server. What a fresh install creates today is in
-- ../fifo.sql.

-- name: create_dequeue_lax_0002
-- Empty: fifo_0002 changed PostgreSQL's lax dequeue only (this procedure deletes through
-- its TOP pick, with no join to fix).

-- name: create_dequeue_strict_0002
-- Empty: fifo_0002 changed PostgreSQL's strict dequeue only (this procedure deletes through
-- its TOP pick, with no join to fix).
