-- Single-runner locks (installers, maintenance jobs) on PostgreSQL: session-level
-- advisory locks keyed by a text key. Hold them on a dedicated connection: they belong to
-- the session, so they do not work through a transaction-pooling proxy.

-- name: try_lock
-- Take the lock if free; true when taken, false at once when someone else holds it.
SELECT pg_try_advisory_lock(hashtextextended(:key, 0))

-- name: wait_lock
-- Take the lock, waiting as long as it takes.
SELECT pg_advisory_lock(hashtextextended(:key, 0))

-- name: unlock
SELECT pg_advisory_unlock(hashtextextended(:key, 0))
