-- leasehold: wake-on-release for client-side waiters (README.md, "Waiting for
-- a lease, keeping it, and stopping when it is gone").
--
-- A process that waits for keys keeps one listener session (LISTEN
-- lease_released) and registers, per key it waits for, one row in
-- lease.waiters; while a key has registrations its lease row carries
-- `watched = true`. A trigger on the release transition calls pg_notify only
-- when that flag is set: a release nobody waits for does no extra statement,
-- no extra table access, and never touches the notification queue (whose
-- commit-time lock serialises all notifying transactions of the cluster).
--
-- Why a flag on the lease row rather than a look-up in lease.waiters: the row
-- is what a release locks and updates, so a registration and a release
-- serialise on the row lock, and the release sees the flag of the row version
-- it actually replaced. A separate look-up would cost a statement per release
-- (measured: +15 % release latency) and would need its own snapshot
-- reasoning.
--
-- No API function is redefined; the only addition to a release is the
-- notification of a watched key.
--
-- The rules of 2026-11-30-000001 apply, with these documented exceptions:
-- * lease._waiter_watch, lease._waiter_unwatch and lease._waiter_reset are
--   the waiting protocol's entry points, called by the Rust client's listener
--   session under the application's role. They keep the `_` of plumbing that
--   is not part of the SQL API, but are granted to PUBLIC and built like API
--   functions (SECURITY DEFINER, pinned search_path), as
--   docs/SPECIFICATION.md §4 states. They change only the calling session's
--   registrations and the `watched` flag of the keys concerned.
-- * lease._notify_released is a trigger function: it fires for any UPDATE of
--   lease.leases, including one an administrator runs by hand outside the API
--   functions, so it cannot rely on a caller's pinned search_path and pins
--   its own.

-- Whether anybody waits for the key's release (see above). Kept by the
-- `_waiter_*` functions; read by the trigger's WHEN clause.
ALTER TABLE lease.leases ADD COLUMN watched boolean NOT NULL DEFAULT false;

-- One row per (key, listener session) with interest in the key's release.
--   backend_pid/backend_start: the registering session; rows of sessions that
--   no longer exist are pruned by lease._waiter_reset (a stale row only costs
--   an unneeded notification, never correctness).
CREATE TABLE lease.waiters (
    key_hash      bytea       NOT NULL,
    backend_pid   integer     NOT NULL,
    backend_start timestamptz NOT NULL,
    PRIMARY KEY (key_hash, backend_pid)
);
REVOKE ALL ON TABLE lease.waiters FROM PUBLIC;

-- Registers the calling session's interest in releases of `key` and flags the
-- key's row, taking its row lock only if nobody holds it (SKIP LOCKED), until
-- the caller's transaction ends.
--
-- Returns false when the row is locked by an uncommitted writer (acquire,
-- renew, release, or a lease-checked guard write): the flag could not be set
-- now, and such a release may not notify. The caller re-checks the key and
-- calls again until it gets true. True means: every release that commits
-- from now on finds the flag (it must wait for this transaction's row lock,
-- then updates the flagged row version), and every release committed before
-- is visible to the caller's next acquire.
CREATE FUNCTION lease._waiter_watch(key text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_hash bytea;
BEGIN
    IF key IS NULL OR key = '' THEN
        PERFORM lease._raise_invalid('_waiter_watch', lease._text_violations('key', key));
    END IF;
    v_hash := lease._key_hash(key);
    INSERT INTO lease.waiters (key_hash, backend_pid, backend_start)
    SELECT v_hash, a.pid, a.backend_start
      FROM pg_stat_activity AS a
     WHERE a.pid = pg_backend_pid()
    ON CONFLICT DO NOTHING;
    PERFORM 1
       FROM lease.leases AS l
      WHERE l.key_hash = v_hash AND l.key = _waiter_watch.key
        FOR UPDATE SKIP LOCKED;
    IF FOUND THEN
        UPDATE lease.leases AS l
           SET watched = true
         WHERE l.key_hash = v_hash AND l.key = _waiter_watch.key AND NOT l.watched;
        RETURN true;
    END IF;
    -- Nothing locked: the key does not exist (a waiter is only ever denied by
    -- an existing row, so there is nothing to release), or a writer holds its
    -- row.
    RETURN NOT EXISTS (SELECT 1 FROM lease.leases AS l WHERE l.key_hash = v_hash AND l.key = _waiter_watch.key);
END;
$$;

-- Clears the flag of the row with `key_hash` when no registration is left.
-- Never waits: a row locked by a writer keeps its flag (a stale flag costs
-- one unneeded notification, and the next unwatch or reset clears it). Lock
-- and check are separate statements, so the check's snapshot is taken after
-- the lock and sees every registration committed before it. The row lock
-- lasts until the caller's transaction ends.
CREATE FUNCTION lease._waiter_unflag(key_hash bytea)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    PERFORM 1
       FROM lease.leases AS l
      WHERE l.key_hash = _waiter_unflag.key_hash AND l.watched
        FOR UPDATE SKIP LOCKED;
    IF FOUND THEN
        UPDATE lease.leases AS l
           SET watched = false
         WHERE l.key_hash = _waiter_unflag.key_hash
           AND NOT EXISTS (SELECT 1 FROM lease.waiters AS w WHERE w.key_hash = _waiter_unflag.key_hash);
    END IF;
END;
$$;

-- Withdraws the calling session's interest in `key`.
CREATE FUNCTION lease._waiter_unwatch(key text)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_hash bytea := lease._key_hash(key);
BEGIN
    DELETE FROM lease.waiters AS w
     WHERE w.key_hash = v_hash AND w.backend_pid = pg_backend_pid();
    IF FOUND THEN
        PERFORM lease._waiter_unflag(v_hash);
    END IF;
END;
$$;

-- Called by a listener session when it (re)connects and when it stops: drops
-- rows left by an earlier session with the same pid and rows of sessions that
-- are gone, and unflags keys nobody waits for any more. Returns how many
-- registrations it removed.
CREATE FUNCTION lease._waiter_reset()
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_removed integer := 0;
    v_hash bytea;
BEGIN
    FOR v_hash IN
        WITH gone AS (
            DELETE FROM lease.waiters AS w
             WHERE w.backend_pid = pg_backend_pid()
                OR NOT EXISTS (SELECT 1 FROM pg_stat_activity AS a
                                WHERE a.pid = w.backend_pid AND a.backend_start = w.backend_start)
            RETURNING w.key_hash)
        SELECT g.key_hash FROM gone AS g
    LOOP
        v_removed := v_removed + 1;
        PERFORM lease._waiter_unflag(v_hash);
    END LOOP;
    RETURN v_removed;
END;
$$;

-- The notification: a key goes from owned to FREE only by a release (an
-- acquire always sets an owner; a lapse is no write at all), so a row trigger
-- on exactly that transition, limited by its WHEN clause to watched rows,
-- notifies on every successful release of a watched key and on nothing else.
-- A WHEN clause that is false costs the release no function call and queues
-- no trigger event. NEW is the row version the release wrote, built from the
-- version it locked, so a registration that held the row lock is seen (see
-- lease._waiter_watch). The payload is the key (keys too long for a
-- notification payload send '' = "re-check every key").
CREATE FUNCTION lease._notify_released()
RETURNS trigger
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM pg_notify('lease_released', CASE WHEN octet_length(NEW.key) < 7900 THEN NEW.key ELSE '' END);
    RETURN NULL;
END;
$$;

CREATE TRIGGER notify_released
AFTER UPDATE OF owner ON lease.leases
FOR EACH ROW
WHEN (OLD.owner IS NOT NULL AND NEW.owner IS NULL AND NEW.watched)
EXECUTE FUNCTION lease._notify_released();

REVOKE ALL ON FUNCTION lease._waiter_unflag(bytea) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._notify_released() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION lease._waiter_watch(text) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease._waiter_unwatch(text) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease._waiter_reset() TO PUBLIC;
