-- Removes wake-on-release: the waiter registry and the notification in the
-- release hook. The lease functions were never redefined.
-- The release hook goes back to doing nothing (as 2026-11-30-000001 left it).
CREATE OR REPLACE FUNCTION lease._on_release(key_hash bytea)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
END;
$$;
DROP FUNCTION IF EXISTS lease._waiter_reset();
DROP FUNCTION IF EXISTS lease._waiter_unwatch(text);
DROP FUNCTION IF EXISTS lease._waiter_watch(text);
DROP FUNCTION IF EXISTS lease._waiter_limit();
DROP FUNCTION IF EXISTS lease._waiter_lock_id(bytea);
DROP TABLE IF EXISTS lease.waiters;
