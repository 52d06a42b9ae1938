-- enqueue(queue, type, payload) without its defaults (issue 16's producers). A call that leaves
-- arguments out costs their defaults on every parse: PostgreSQL reads enqueue's six defaults from
-- their stored text once to resolve the call and again to plan it (stringToNode, about 23,000
-- instructions each time; bench/enqueue_instructions). The common call names three arguments,
-- the payload as a literal or an untyped parameter, so it paid 47,000 instructions of 406,000.
--
-- This function takes that call: a payload of type text (or unknown, as a literal is) resolves
-- here, since PostgreSQL prefers the string category for an unknown argument; a jsonb payload,
-- a fourth argument or a named option still resolves to the nine-argument enqueue. Its body
-- calls that enqueue with a typed payload from a plan PL/pgSQL keeps for the session, so the
-- defaults are read once a session instead of twice a call, and the job, its checks and its
-- wake-up are the nine-argument function's own.
--
-- It is SECURITY INVOKER and does nothing its caller could not do: every call first checks that
-- its caller may EXECUTE the nine-argument enqueue, and refuses it as PostgreSQL would (SQLSTATE
-- 42501, "permission denied for function enqueue"). PostgreSQL's own check of the inner call is
-- not enough: PL/pgSQL sets a simple expression up once a transaction, and checks EXECUTE only
-- then, so a role that called after another one in the same transaction would ride on that
-- role's check: shown after SET ROLE (the test). After an application's SQL-language SECURITY
-- DEFINER function that enqueued first, the stranger was refused even without this check; the
-- test keeps that case too, since nothing says other callers' contexts are kept apart.
-- The nine-argument function is named by its oid, written in here when the migration runs (a
-- signature in the body would have its type names looked up on the caller's path); an oid that
-- no longer names it refuses every call. So every role may execute this one (the migration
-- runner grants it to PUBLIC after revoking PUBLIC from the rest), and a role granted only the
-- nine-argument enqueue, as docs/sql-api.md shows, keeps its calls.
-- Without a search_path of its own it runs on the caller's: it names the functions and types
-- with their schemas, and the cast from text to jsonb is jsonb's input function, found by type.
-- A text that is not JSON fails with SQLSTATE 22P02 as before, now raised inside this function.

DO $migration$
BEGIN
  EXECUTE replace(replace($f$
CREATE FUNCTION _BATON_SCHEMA_.enqueue(queue text, type text, payload text)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY INVOKER AS $body$
BEGIN
  IF pg_catalog.has_function_privilege(_NINE_ARGUMENTS_::pg_catalog.oid, 'EXECUTE') IS NOT TRUE
  THEN
    RAISE EXCEPTION USING ERRCODE = '42501', MESSAGE = 'permission denied for function enqueue';
  END IF;
  RETURN _BATON_SCHEMA_.enqueue(queue, type, payload::pg_catalog.jsonb);
END
$body$;
$f$, '_BATON_SCHEMA_', quote_ident(current_schema())),
    '_NINE_ARGUMENTS_',
    'enqueue(text, text, jsonb, integer, timestamptz, integer, text, text, integer)'
      ::regprocedure::oid::text);
END
$migration$;
