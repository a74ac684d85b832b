-- Least privilege on PostgreSQL (`queuectl grant`): roles get EXECUTE on the queue's
-- functions and nothing on its tables.
--
-- A function runs with its caller's rights unless it is SECURITY DEFINER, so the
-- queue's API functions are switched to SECURITY DEFINER here (they then run as their
-- owner, the role that installed the queue), each with a fixed search_path (pg_catalog,
-- then pg_temp last) so a caller cannot plant objects that the function would resolve
-- (every table the functions touch is schema-qualified already). PostgreSQL grants
-- EXECUTE on new functions to PUBLIC: that is revoked, or every role could use the
-- owner's rights. Done at grant time rather than in the install migration, so the
-- functions' definitions stay as installed. A revision that replaces them in place, or
-- by functions of other arguments, restores this itself (resecure_functions,
-- carry_function_grants); re-run `queuectl grant` after one that recreates them otherwise.
-- {{function_signatures}} are the queue's own functions as (name, argument types) pairs: a
-- name alone may also be another queue's overload.

-- name: role_exists
-- Whether a role of that name exists (grants name existing roles only).
SELECT count(*) AS n FROM pg_roles WHERE rolname = :role

-- name: secure_functions
-- SECURITY DEFINER with a safe search_path, and no EXECUTE for PUBLIC, on each function.
DO $grant$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN
        SELECT p.oid::regprocedure FROM pg_proc p
        WHERE p.pronamespace = {{schema_literal}}::regnamespace
          AND (p.proname, oidvectortypes(p.proargtypes)) IN ({{function_signatures}})
    LOOP
        -- f::text is the server's own quoted signature, e.g. queuectl.orders_ack(bigint[],text)
        EXECUTE 'ALTER FUNCTION ' || f::text || ' SECURITY DEFINER SET search_path = pg_catalog, pg_temp';
        EXECUTE 'REVOKE ALL ON FUNCTION ' || f::text || ' FROM PUBLIC';
    END LOOP;
END
$grant$

-- name: resecure_functions
-- Run by a queue revision right after it replaced functions in place (CREATE OR REPLACE):
-- that keeps their ACL, so what `queuectl grant` granted stays granted, but resets SECURITY
-- DEFINER and the fixed search_path, and a granted role without privileges on the tables
-- would then get "permission denied". A function whose EXECUTE is revoked from PUBLIC is
-- one that `queuectl grant` secured (a fresh function is executable by PUBLIC): it gets
-- both back. Functions never granted are left as installed.
DO $grant$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN
        SELECT p.oid::regprocedure FROM pg_proc p
        WHERE p.pronamespace = {{schema_literal}}::regnamespace
          AND (p.proname, oidvectortypes(p.proargtypes)) IN ({{function_signatures}})
          AND NOT p.prosecdef
          AND NOT has_function_privilege('public', p.oid, 'EXECUTE')
    LOOP
        EXECUTE 'ALTER FUNCTION ' || f::text || ' SECURITY DEFINER SET search_path = pg_catalog, pg_temp';
    END LOOP;
END
$grant$

-- name: carry_function_grants
-- Run by a queue revision that replaces a function by one with other arguments: it creates
-- the new one beside the old, runs this, then drops the old. A new function is executable by
-- PUBLIC and granted to nobody, so it gets what `queuectl grant` gave the old one: EXECUTE
-- revoked from PUBLIC when it was revoked there, and granted to each role it was granted to
-- (resecure_functions, run after, gives a secured one SECURITY DEFINER and its search_path
-- back). Nothing when either does not exist. {{function_literal}} is the function's name,
-- {{old_types}} and {{new_types}} its argument types before and after, as literals.
DO $grant$
DECLARE
    v_old regprocedure := to_regprocedure(format('%I.%I(%s)', {{schema_literal}}, {{function_literal}}, {{old_types}}));
    v_new regprocedure := to_regprocedure(format('%I.%I(%s)', {{schema_literal}}, {{function_literal}}, {{new_types}}));
    v_role regrole;
BEGIN
    IF v_old IS NULL OR v_new IS NULL THEN
        RETURN;
    END IF;
    IF NOT has_function_privilege('public', v_old, 'EXECUTE') THEN
        EXECUTE 'REVOKE ALL ON FUNCTION ' || v_new::text || ' FROM PUBLIC';
    END IF;
    FOR v_role IN
        SELECT a.grantee::regrole FROM pg_proc p, aclexplode(p.proacl) a
        WHERE p.oid = v_old AND a.privilege_type = 'EXECUTE' AND a.grantee NOT IN (0, p.proowner)
    LOOP
        EXECUTE 'GRANT EXECUTE ON FUNCTION ' || v_new::text || ' TO ' || v_role::text;
    END LOOP;
END
$grant$

-- name: grant_execute
-- The role may call these functions, and reach them in the schema, and read the catalog's
-- registry (which queues exist, their kind and settings: the client looks its queue up
-- there). No privilege on the queue's tables.
DO $grant$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN
        SELECT p.oid::regprocedure FROM pg_proc p
        WHERE p.pronamespace = {{schema_literal}}::regnamespace
          AND (p.proname, oidvectortypes(p.proargtypes)) IN ({{function_signatures}})
    LOOP
        EXECUTE 'GRANT EXECUTE ON FUNCTION ' || f::text || ' TO {{role}}';
    END LOOP;
END
$grant$;
GRANT USAGE ON SCHEMA {{schema}} TO {{role}};
GRANT SELECT ON {{schema}}.queues, {{schema}}.alembic_version TO {{role}}

-- name: granted_functions
-- The queue functions a role may execute (for the command's report and the tests).
SELECT p.proname AS function_name
FROM pg_proc p
WHERE p.pronamespace = {{schema_literal}}::regnamespace
  AND (p.proname, oidvectortypes(p.proargtypes)) IN ({{function_signatures}})
  AND has_function_privilege(:role, p.oid, 'EXECUTE')
ORDER BY 1
