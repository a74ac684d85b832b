-- Single-runner locks (installers, maintenance jobs, pipeline exports) on PostgreSQL:
-- session-level advisory locks keyed by a text key. Hold them on a dedicated connection:
-- they belong to the session, so they do not work through a transaction-pooling proxy.
--
-- Any role that can connect can take any advisory lock key. queuectl's keys end in the
-- catalog's lock seed (table lock_seed, readable by the catalog's owner only: queuectl.locks),
-- so a role that cannot read it cannot compute them; pg_locks still shows the key of a held
-- lock to everyone, so a role watching it could take that key between two runs. Waits are
-- therefore bounded, and the holder is named (holder, below).

-- name: try_lock
-- Take the lock if free; true when taken, false at once when someone else holds it.
SELECT pg_try_advisory_lock(hashtextextended(:key, 0))

-- name: unlock
SELECT pg_advisory_unlock(hashtextextended(:key, 0))

-- name: holder
-- The session holding the lock. pg_stat_activity shows every session's pid, role and
-- application to everyone; its start time only to its own role and privileged roles.
SELECT a.pid, a.usename AS role_name, a.application_name, a.backend_start
FROM pg_locks l
JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND ((l.classid::bigint << 32) | l.objid::bigint) = hashtextextended(:key, 0)
LIMIT 1

-- name: read_seed
SELECT seed FROM {{schema}}.lock_seed WHERE id = 1

-- name: create_seed
-- The catalog's lock seed (revision catalog_0004): 244 random bits, readable by the table's
-- owner (the role that installed the catalog) and superusers only.
CREATE TABLE {{schema}}.lock_seed (
    id smallint PRIMARY KEY CHECK (id = 1),
    seed text NOT NULL
);
INSERT INTO {{schema}}.lock_seed (id, seed)
VALUES (1, replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', ''));
REVOKE ALL ON {{schema}}.lock_seed FROM PUBLIC

-- name: drop_seed
DROP TABLE IF EXISTS {{schema}}.lock_seed
