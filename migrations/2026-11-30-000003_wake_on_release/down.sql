-- Removes wake-on-release: restores lease.release exactly as
-- 2026-11-30-000001 defined it, then drops the waiter registry.
CREATE OR REPLACE FUNCTION lease.release(key text, owner text, epoch bigint)
RETURNS TABLE (status text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_violations text[];
    v_now timestamptz;
BEGIN
    v_violations := lease._violations($1, true, $2, false, NULL, false, NULL, true, $3);
    IF cardinality(v_violations) > 0 THEN
        PERFORM lease._raise_invalid('release', v_violations);
    END IF;
    v_now := clock_timestamp();
    UPDATE lease.leases AS l
       SET owner = NULL, expires_at = NULL, lapsed_owner = NULL, epoch = l.epoch + 1
     WHERE l.key_hash = lease._key_hash($1) AND l.key = $1 AND l.owner = $2 AND l.epoch = $3 AND l.expires_at > v_now;
    IF FOUND THEN
        status := 'ok';
        RETURN NEXT;
        RETURN;
    END IF;
    status := lease._status_locked($1, $2, $3);
    IF status = 'ok' THEN
        UPDATE lease.leases AS l
           SET owner = NULL, expires_at = NULL, lapsed_owner = NULL, epoch = l.epoch + 1
         WHERE l.key_hash = lease._key_hash($1) AND l.key = $1;
    END IF;
    RETURN NEXT;
END;
$$;
DROP FUNCTION IF EXISTS lease._waiter_reset();
DROP FUNCTION IF EXISTS lease._waiter_unwatch(text);
DROP FUNCTION IF EXISTS lease._waiter_watch(text);
DROP FUNCTION IF EXISTS lease._waiter_unflag(bytea);
DROP TABLE IF EXISTS lease.waiters;
ALTER TABLE lease.leases DROP COLUMN IF EXISTS watched;
