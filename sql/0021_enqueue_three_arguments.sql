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
-- It is SECURITY INVOKER and does nothing its caller could not do: the inner call needs EXECUTE
-- on the nine-argument enqueue, which is checked for the caller as before. So every role may
-- execute this one (the migration runner grants it to PUBLIC after revoking PUBLIC from the rest),
-- and a role granted only the nine-argument enqueue, as docs/sql-api.md shows, keeps its calls.
-- Without a search_path of its own it runs on the caller's: it names the function and the type
-- with their schemas, and the cast from text to jsonb is jsonb's input function, found by type.
-- A text that is not JSON fails as it did, with SQLSTATE 22P02, raised inside this function.

DO $migration$
BEGIN
  EXECUTE replace($f$
CREATE FUNCTION _BATON_SCHEMA_.enqueue(queue text, type text, payload text)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY INVOKER AS $body$
BEGIN
  RETURN _BATON_SCHEMA_.enqueue(queue, type, payload::pg_catalog.jsonb);
END
$body$;
$f$, '_BATON_SCHEMA_', quote_ident(current_schema()));
END
$migration$;
