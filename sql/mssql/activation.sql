-- Activation on SQL Server: nothing to install. PostgreSQL consumers sleep on a
-- LISTEN/NOTIFY channel; SQL Server has no such channel for plain tables (Service Broker
-- would need a queue and a service per queue, and its own permissions), so SQL Server
-- consumers poll with a short back-off (the engine adapter's can_listen is false). The
-- sections exist so the same migrations (reliable_0002) run on both engines; each holds
-- no statement.

-- name: create_reliable_notify
-- Nothing on SQL Server: there is no notification to send or make conditional, and no
-- lock to try; consumers poll.

-- name: create_notify_trigger
-- No trigger on SQL Server (consumers poll).

-- name: drop_reliable_notify
-- Nothing was created on SQL Server.

-- name: drop_wait_functions
-- Nothing was created on SQL Server.

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

-- name: seat_take
-- Not used on SQL Server (no LISTEN, so no looker's seat: consumers poll).

-- name: seat_leave
-- Not used on SQL Server.
