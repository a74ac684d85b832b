-- Activation on SQL Server: nothing to install. PostgreSQL consumers sleep on a
-- LISTEN/NOTIFY channel; SQL Server has no such channel for plain tables (Service Broker
-- would need a queue and a service per queue, and its own permissions), so SQL Server
-- consumers poll with a short back-off (the engine adapter's can_listen is false). The
-- sections exist so the same migrations (reliable_0002) run on both engines; each holds
-- no statement.

-- name: create_reliable_notify
-- reliable_0002 on SQL Server: no trigger (consumers poll).

-- name: drop_reliable_notify
-- Downgrade of reliable_0002 on SQL Server: nothing was created.

-- name: create_reliable_notify_0006
-- reliable_0006 on SQL Server: nothing (there is no notification to make conditional;
-- consumers poll).

-- name: create_reliable_notify_0011
-- reliable_0011 on SQL Server: nothing (no notification, no lock to try).

-- name: replace_reliable_notify_0002
-- Downgrade of reliable_0006 on SQL Server: nothing was created.

-- name: listen
-- Not used on SQL Server (no LISTEN): consumers poll.

-- name: unlisten
-- Not used on SQL Server (no UNLISTEN).

-- name: wait_begin
-- Not used on SQL Server (consumers poll, nobody waits on a channel).

-- name: wait_end
-- Not used on SQL Server.

-- name: notify
-- Not used on SQL Server (no NOTIFY): an enqueue needs no announcement when consumers poll.
