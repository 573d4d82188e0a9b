-- leasehold: wake-on-release for client-side waiters (README.md, "Waiting for
-- a lease, keeping it, and stopping when it is gone"; docs/SPECIFICATION.md
-- §1.5 and §4).
--
-- A process that waits for keys keeps one listener session (LISTEN
-- lease_released) and registers, per key it waits for, one row in
-- lease.waiters. Every release notifies when a registration for the key
-- exists, with the key's digest (never its name) as
-- the payload.
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
-- * a release (lease._on_release) takes the same lock EXCLUSIVE (try): on
--   success it notifies iff a registration row for the key exists; on
--   failure (some registration is in flight) it notifies anyway.
--
-- Why no release can be missed. Take a registration R that returned a
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
-- Cost: a release calls lease._on_release (one try-lock and one index probe
-- of lease.waiters). benches/primitive.rs measures it; README.md
-- reports it.
--
-- Storage: a session may hold at most 10 000 registrations
-- (lease_waiter_limit); rows of sessions that are gone are pruned by
-- lease._waiter_reset.
--
-- No API function is redefined; lease._on_release, the hook that
-- 2026-11-30-000001 leaves empty, is filled in.
--
-- The rules of 2026-11-30-000001 apply, with these documented exceptions:
-- * lease._waiter_watch, lease._waiter_unwatch and lease._waiter_reset are
--   the waiting protocol's entry points, called by the Rust client's listener
--   session under the application's role. They keep the `_` of plumbing that
--   is not part of the SQL API, but are granted to PUBLIC and built like API
--   functions (SECURITY DEFINER, pinned search_path), as
--   docs/SPECIFICATION.md §4 states. They change only the calling session's
--   registrations (and _waiter_reset also rows of sessions that are gone).
-- * lease._on_release relies on its callers' pinned search_path (it is
--   granted to nobody and called only by API functions).

-- One row per (key, listener session) with interest in the key's release.
--   backend_pid: the registering session. Sessions are identified by pid
--   only: pg_stat_activity shows every role the pid of every session, but
--   other columns (backend_start) only to the session's own role, and these
--   functions run as the installing role. A stale row (its session gone, or
--   its pid reused) only costs an unneeded notification; lease._waiter_reset
--   prunes rows whose pid no longer runs in this database, and a listener's
--   own reset drops rows an earlier session with its pid left behind.
CREATE TABLE lease.waiters (
    key_hash    bytea   NOT NULL,
    backend_pid integer NOT NULL,
    PRIMARY KEY (key_hash, backend_pid)
);
-- For the per-session cap and the per-session deletes.
CREATE INDEX waiters_backend_pid ON lease.waiters (backend_pid);
REVOKE ALL ON TABLE lease.waiters FROM PUBLIC;

-- The per-key advisory lock of the waiting protocol, two-int form: a fixed
-- class id (0x6c68776b, "lhwk", so it cannot meet another leasehold lock: the
-- installer's lock uses the one-bigint form) and the first four bytes of the
-- key's digest. Different keys may share an id; that only makes a release
-- notify conservatively or a registration retry. Inlined by the planner.
CREATE FUNCTION lease._waiter_lock_id(key_hash bytea)
RETURNS integer
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$ SELECT ('x' || encode(substring(key_hash FROM 1 FOR 4), 'hex'))::bit(32)::integer $$;

-- How many registrations one session may hold (docs/SPECIFICATION.md §4;
-- the Rust client's WAITER_LIMIT). Inlined by the planner.
CREATE FUNCTION lease._waiter_limit()
RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT 10000 $$;

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
CREATE FUNCTION lease._waiter_watch(key text)
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_hash bytea;
    v_pid integer := pg_backend_pid();
BEGIN
    -- Every input rule of a key (not a hot path: the same check the API
    -- functions run on their error path, so new rules apply here too).
    PERFORM lease._raise_invalid('_waiter_watch', lease._text_violations('key', key));
    IF NOT lease._allowed(key) THEN
        PERFORM lease._raise_forbidden('_waiter_watch', 'key', key);
    END IF;
    v_hash := lease._key_hash(key);
    IF NOT pg_try_advisory_xact_lock_shared(1818785643, lease._waiter_lock_id(v_hash)) THEN
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
                      DETAIL = format('limit=%s', lease._waiter_limit()),
                      HINT = 'Withdraw registrations (lease._waiter_unwatch) or wait from more sessions.';
        END IF;
        INSERT INTO lease.waiters AS w (key_hash, backend_pid)
        VALUES (v_hash, v_pid)
        ON CONFLICT DO NOTHING;
    END IF;
    RETURN encode(v_hash, 'hex');
END;
$$;

-- Withdraws the calling session's interest in `key`.
CREATE FUNCTION lease._waiter_unwatch(key text)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    DELETE FROM lease.waiters AS w
     WHERE w.key_hash = lease._key_hash(_waiter_unwatch.key) AND w.backend_pid = pg_backend_pid();
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
CREATE FUNCTION lease._waiter_reset()
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

-- The notification, in lease._on_release: every function that frees a key
-- (lease.release, lease.force_release) calls it in the freeing transaction,
-- after its UPDATE; an acquire always sets an owner and a lapse is no write
-- at all, so it runs on every release and on nothing else. It decides
-- whether anybody may be waiting (see the top of this file). The payload is
-- the hex digest of the key: every session that LISTENs on the channel
-- receives it, whatever keys it may act on, and a digest names a key only to
-- whoever already knows (or guesses) the key.
--
-- A function call rather than the row trigger of earlier drafts: the
-- trigger's event queue and call cost every release about 20 µs, the call
-- about 2 (docs/PERFORMANCE.md). An UPDATE an administrator runs by hand on
-- lease.leases notifies nobody; waiters still find the key free at their
-- next poll (LeaseWaiterBuilder::fallback_poll).
--
-- No pinned search_path of its own: its only callers are the API functions,
-- which pin theirs, and it is granted to nobody.
CREATE OR REPLACE FUNCTION lease._on_release(key_hash bytea)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    -- Two statements, in this order: the look-up must take its snapshot
    -- after the lock is held (one statement would share one snapshot, taken
    -- before the lock). While lease.waiters has no pages it has no row,
    -- committed or not, so the look-up is skipped (a file size read instead
    -- of a query, as lease._allowed does): a registration that committed
    -- before the lock was taken has its row on a page, and VACUUM removes
    -- a page only once no row is on it.
    IF current_setting('transaction_isolation') <> 'read committed'
       OR NOT pg_try_advisory_xact_lock(1818785643, lease._waiter_lock_id(_on_release.key_hash)) THEN
        PERFORM pg_notify('lease_released', encode(_on_release.key_hash, 'hex'));
    ELSIF pg_relation_size('lease.waiters'::regclass) <> 0
          AND EXISTS (SELECT 1 FROM lease.waiters AS w WHERE w.key_hash = _on_release.key_hash) THEN
        PERFORM pg_notify('lease_released', encode(_on_release.key_hash, 'hex'));
    END IF;
END;
$$;

REVOKE ALL ON FUNCTION lease._waiter_lock_id(bytea) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._waiter_limit() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION lease._waiter_watch(text) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease._waiter_unwatch(text) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease._waiter_reset() TO PUBLIC;
