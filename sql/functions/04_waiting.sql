-- leasehold: wake-on-release for client-side waiters (docs/guide/waiting-and-keeping.md; docs/SPECIFICATION.md
-- §1.5 and §4).
--
-- A process that waits for or observes keys keeps one listener session
-- (LISTEN lease_released, lease_granted) and registers, per key, one row
-- in lease.waiters. Every release, and every grant of a new term, notifies
-- when a registration for the key exists, with the key's digest (never its
-- name) as the payload: waiters wake on releases, observers of an election
-- (Election::observe) on both.
--
-- What registration must never do: hold up a holder. docs/SPECIFICATION.md
-- §1.5 says a call by a caller that does not hold the lease takes no lock
-- that outlives the call, and `lease._waiter_watch` is granted to PUBLIC and
-- may be called inside a transaction the caller keeps open. So registration
-- takes no lock on the lease row at all. Registrations and releases of a key
-- meet on a per-key advisory lock instead, and only ever *try* it, so
-- neither side can wait for the other:
--
-- * a registration takes the key's advisory lock SHARED (try): on success it
--   inserts its row, and the lock lasts until the registration's transaction
--   ends, i.e. until the row is committed (or rolled back);
-- * a release or a grant (lease._on_change) takes the same lock EXCLUSIVE
--   (try): on success it notifies iff a registration row for the key
--   exists; on failure (some registration is in flight) it notifies anyway.
--
-- Why no release can be missed (a grant is a change X the same way). Take a registration R that returned a
-- digest (success) and a release X that commits. X's exclusive lock, once
-- taken, is held until X's transaction ends; R's shared lock until R's
-- transaction ends. Two holders of conflicting modes cannot overlap, so
-- exactly one of these is true:
--   1. R's transaction ended before X took the lock. A transaction's
--      commit is visible to every snapshot taken after its locks are
--      released (PostgreSQL marks it committed before releasing its locks),
--      and the release's EXISTS takes its snapshot after the lock (READ
--      COMMITTED: a new snapshot per statement). So X sees R's row and
--      notifies. Under REPEATABLE READ or SERIALIZABLE the look-up would read
--      the transaction's older snapshot, so it notifies unconditionally.
--   2. R took its lock after X's transaction ended. R's try can only succeed
--      then (before, X's exclusive lock refuses it), so X committed before R
--      returned, and the waiter's next acquire, which the client always makes
--      after a successful registration, sees the key free.
--   3. R held its lock when X tried: X's try fails and X notifies.
-- A registration that cannot take its lock (a release of the key, or of a
-- key whose 32-bit lock id collides, is in flight) returns NULL and the
-- client re-checks the key and calls again, as it did when the old design
-- met a locked row.
--
-- What a hostile role can do with the advisory lock (any role may take
-- advisory locks): hold the key's id shared, which makes every release of
-- the key notify (extra wake-ups, each a re-check by the waiters), or hold it
-- exclusive, which makes registrations of the key return NULL, so the
-- client polls that key (LeaseWaiterBuilder::fallback_poll) instead of
-- being notified. Both cost liveness (latency, extra work), never safety:
-- whether a waiter gets a lease is decided by lease.acquire alone.
--
-- Cost: a release, and a grant of a new term, calls lease._on_change (one
-- try-lock, and an index probe of lease.waiters once it has rows). benches/primitive.rs measures it;
-- docs/guide/benchmarks.md reports it.
--
-- Storage: a session may hold at most 10 000 registrations
-- (lease_waiter_limit); rows of sessions that are gone are pruned by
-- lease._waiter_reset.
--
-- The table (lease.waiters), the lock id (lease._waiter_lock_id) and the
-- changing side (lease._on_change) are in migration 000001_tables and 01_rules.sql.
--
-- The rules of migration 000001_tables apply, with one documented exception:
-- * lease._waiter_watch, lease._waiter_unwatch and lease._waiter_reset are
--   the waiting protocol's entry points, called by the Rust client's listener
--   session under the application's role. They keep the `_` of plumbing that
--   is not part of the SQL API, but are granted to PUBLIC and built like API
--   functions (SECURITY DEFINER, pinned search_path), as
--   docs/SPECIFICATION.md §4 states. They change only the calling session's
--   registrations (and _waiter_reset also rows of sessions that are gone).

SET LOCAL lock_timeout = '5s';

-- Registers the calling session's interest in releases of `key`. Returns the
-- key's digest (hex of lease._key_hash(key), the payload its release
-- notification will carry) when registered; NULL when a release of the key
-- is in flight right now, so the registration could not be made safely: the
-- caller re-checks the key and calls again.
--
-- Takes no lock on the lease row; the only lock that outlives the call is
-- the key's advisory lock in SHARE mode until the caller's transaction ends,
-- which nothing ever waits for (everybody only tries it). See the top of
-- this file for why no release is missed.
--
-- Refuses with 42501 lease_namespace_denied when the caller may not act on
-- the key (§4) and with 22023 lease_waiter_limit when the session already
-- holds lease._waiter_limit() registrations.
CREATE OR REPLACE FUNCTION lease._waiter_watch(key text)
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_key text COLLATE "C" := key;
    v_hash bytea;
    v_pid integer := pg_backend_pid();
BEGIN
    IF NOT lease._name_ok(v_key) THEN
        PERFORM lease._raise_invalid('_waiter_watch', lease._text_violations('key', v_key));
    END IF;
    IF NOT lease._allowed(v_key) THEN
        PERFORM lease._raise_forbidden('_waiter_watch', 'key', v_key);
    END IF;
    v_hash := lease._key_hash(v_key);
    IF NOT pg_try_advisory_xact_lock_shared(lease._waiter_class(), lease._waiter_lock_id(v_hash)) THEN
        RETURN NULL;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM lease.waiters AS w
                    WHERE w.key_hash = v_hash AND w.backend_pid = v_pid) THEN
        -- The cap: counting stops at the cap, so a registration costs at
        -- most that many index entries.
        IF (SELECT count(*) FROM (SELECT 1 FROM lease.waiters AS w
                                    WHERE w.backend_pid = v_pid
                                    LIMIT lease._waiter_limit()) AS s) >= lease._waiter_limit() THEN
            RAISE EXCEPTION 'lease._waiter_watch: this session already holds % waiter registrations, the limit', lease._waiter_limit()
                USING ERRCODE = '22023',
                      CONSTRAINT = 'lease_waiter_limit',
                      DETAIL = lease._detail('limit', lease._waiter_limit()::text),
                      HINT = 'Withdraw registrations (lease._waiter_unwatch) or wait from more sessions.';
        END IF;
        INSERT INTO lease.waiters AS w (key_hash, backend_pid)
        VALUES (v_hash, v_pid)
        ON CONFLICT DO NOTHING;
    END IF;
    RETURN encode(v_hash, 'hex');
END;
$$;

-- Withdraws the calling session's interest in `key`. Changes only the
-- calling session's own row, so it needs no namespace check; a NULL key
-- matches nothing.
CREATE OR REPLACE FUNCTION lease._waiter_unwatch(key text)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_key text COLLATE "C" := key;
BEGIN
    DELETE FROM lease.waiters AS w
     WHERE w.key_hash = lease._key_hash(v_key) AND w.backend_pid = pg_backend_pid();
END;
$$;

-- Called by a listener session when it (re)connects and when it stops: drops
-- the rows of the calling session's pid (an earlier session with the same pid
-- may have left them) and the rows of pids that no longer run a session in
-- this database. Returns how many registrations it removed.
--
-- pg_stat_clear_snapshot first: a session reads pg_stat_activity once per
-- transaction and keeps that copy, so a caller that read it earlier in an
-- open transaction would otherwise make this function prune the rows of
-- every session started since.
CREATE OR REPLACE FUNCTION lease._waiter_reset()
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_removed integer;
BEGIN
    PERFORM pg_stat_clear_snapshot();
    DELETE FROM lease.waiters AS w
     WHERE w.backend_pid = pg_backend_pid()
        OR NOT EXISTS (SELECT 1 FROM pg_stat_activity AS a
                        WHERE a.pid = w.backend_pid AND a.datname = current_database());
    GET DIAGNOSTICS v_removed = ROW_COUNT;
    RETURN v_removed;
END;
$$;

GRANT EXECUTE ON FUNCTION lease._waiter_watch(text) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease._waiter_unwatch(text) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease._waiter_reset() TO PUBLIC;

-- Every file of functions and every migration ends so (see
-- lease._drop_default_grants).
SELECT lease._drop_default_grants();
