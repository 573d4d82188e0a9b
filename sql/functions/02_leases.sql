-- leasehold: the lease functions (docs/SPECIFICATION.md §1.3): acquire,
-- renew, release, inspect, generation.
--
-- Row locks on lease.leases (docs/SPECIFICATION.md §1.5). The modes are
-- chosen so that nothing a non-holder can do holds up a holder's renew:
-- * renew and release update the row and so take FOR NO KEY UPDATE: they
--   wait only for another renew, release or grant of the same key.
-- * A grant to a new owner (a FREE or LAPSED key) locks the row FOR UPDATE,
--   the one mode that conflicts with FOR KEY SHARE, so it waits for every
--   transaction that checked the lease (G6) before it takes over.
-- * Checks that change nothing (an idempotent same-owner acquire,
--   check_held, admit_held, admit, fence) take FOR KEY SHARE, which a
--   renew or release does not wait for. Under REPEATABLE READ or
--   SERIALIZABLE, acquire's check takes FOR SHARE instead: it fails with a
--   serialization failure when the row changed after the snapshot, where
--   FOR KEY SHARE would lock the old version and answer from the past.
-- * A refused call keeps no lock: refusals read without locking, or lock
--   in a subtransaction that is rolled back.
-- Every lock lease.acquire waits for is bounded by its wait (1 second when
-- there is none).

SET LOCAL lock_timeout = '5s';

-- The lock_timeout, in milliseconds, for acquire's locking steps: what is
-- `left` of the wait, or, for a call without a wait (`left` NULL), the
-- fixed bound of 1 second that docs/SPECIFICATION.md §1.5 states. Never 0,
-- which would mean "no limit", and never above what lock_timeout takes
-- (2^31 - 1 ms, about 24.8 days): a longer wait meets that cap first, and
-- lease.acquire then tries again while its wait lasts. Inlined: no SET
-- clause (every name is qualified instead) and `left` is used once, so a
-- volatile argument does not keep the planner from inlining it; a call
-- that is not inlined is parsed and planned at every use.
CREATE OR REPLACE FUNCTION lease._lock_budget("left" interval)
RETURNS text
LANGUAGE sql IMMUTABLE
AS $$
    SELECT COALESCE(LEAST(2147483647, GREATEST(1, pg_catalog.ceil(pg_catalog.date_part('epoch', "left") OPERATOR(pg_catalog.*) 1000)))::pg_catalog.int8::pg_catalog.text,
                    '1000')
$$;

-- Bounds the next lock wait of this transaction by what is `left` of a
-- call's bound (lease._lock_budget), until the transaction ends or the
-- caller puts its own lock_timeout back. Inlined.
CREATE OR REPLACE FUNCTION lease._limit_lock_wait("left" interval)
RETURNS text
LANGUAGE sql VOLATILE
AS $$ SELECT pg_catalog.set_config('lock_timeout', lease._lock_budget("left"), true) $$;

-- Raised when lease.acquire's wait ran out (SQLSTATE 57014). `reason` says
-- whether another owner held the key or another transaction kept its row
-- locked for the whole bound.
CREATE OR REPLACE FUNCTION lease._raise_wait_timeout(key text, wait interval, reason text)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION 'lease wait timed out: key % %', key, reason
        USING ERRCODE = '57014',
              CONSTRAINT = 'lease_wait_timeout',
              DETAIL = lease._detail('key', key, 'wait', wait::text),
              HINT = 'Retry later, wait longer, or inspect the key to see who holds it and until when.';
END;
$$;

-- Step A of lease._acquire_settle: locks the key's row FOR UPDATE if it is
-- FREE or LAPSED (the lock a grant to a new owner needs: it waits for the
-- transactions that checked the old grant, G6) and grants it to `owner`.
-- A member of a heartbeat group also locks its group, so a heartbeat in
-- flight is waited for, and the grant is looked at again. Answers the new
-- epoch and expiry, or NULLs when the row is live (or missing). Every lock
-- wait ends within `lock_left` of the call.
CREATE OR REPLACE FUNCTION lease._acquire_take_over(key_hash bytea, key text, owner text, ttl interval,
                                         lock_left interval,
                                         OUT epoch bigint, OUT expires_at timestamptz)
RETURNS record
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_key text COLLATE "C" := key;
    v_group bigint;
    v_live boolean := false;
    v_generation bigint;
    v_lock_deadline timestamptz := lease._expires_in(lock_left);
BEGIN
    PERFORM lease._limit_lock_wait(lock_left);
    SELECT l.group_id INTO v_group
      FROM lease.leases AS l
     WHERE l.key_hash = _acquire_take_over.key_hash AND l.key = v_key AND NOT lease._live(l)
       FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF v_group IS NOT NULL THEN
        PERFORM lease._limit_lock_wait(v_lock_deadline - clock_timestamp());
        PERFORM 1 FROM lease.groups AS g WHERE g.id = v_group FOR NO KEY UPDATE;
        SELECT lease._live(l) INTO v_live FROM lease.leases AS l WHERE l.key_hash = _acquire_take_over.key_hash;
    END IF;
    IF NOT v_live THEN
        PERFORM lease._limit_lock_wait(v_lock_deadline - clock_timestamp());
        v_generation := lease._generation(true);
        UPDATE lease.leases AS l
           SET owner = _acquire_take_over.owner COLLATE "C",
               epoch = lease._grant_epoch(l.epoch, v_generation, NULL),
               expires_at = lease._expires_in(_acquire_take_over.ttl),
               lapsed_owner = l.owner,
               group_id = NULL
         WHERE l.key_hash = _acquire_take_over.key_hash
        RETURNING l.epoch, l.expires_at INTO _acquire_take_over.epoch, _acquire_take_over.expires_at;
        PERFORM lease._left_groups(ARRAY[v_group]);
    END IF;
END;
$$;

-- Settles one attempt of lease.acquire under row locks, in a fixed number
-- of steps, and answers what it found: 'granted' (epoch and expiry set),
-- 'held' (the caller's own live grant: an idempotent success), 'denied'
-- (another owner's live grant) or 'busy' (a lock did not come within what
-- is `lock_left` of the call's bound). Called by lease.acquire when one
-- statement did not settle the key: a never-seen key, a row another
-- transaction has locked, the caller's own grant, a grant in a heartbeat
-- group, a lineage to record, or any denial outside READ COMMITTED.
--
-- The steps run in a subtransaction, every lock wait within lock_timeout
-- set to what is left of the bound, so a denial or a busy row keeps no
-- lock:
--   A. lease._acquire_take_over: a FREE or LAPSED row is granted.
--   B. otherwise read the row (under REPEATABLE READ or SERIALIZABLE with
--      FOR SHARE, which fails with 40001 when the row changed after the
--      snapshot, instead of answering from the past): no row: insert the
--      first grant (or, when a concurrent first grant won, go back to A
--      once); another owner's live grant: denied; the caller's: lock it
--      FOR KEY SHARE (holds off a takeover until the caller's transaction
--      ends, G6, without holding up its renewals).
-- A state that changed under four passes in a row is lease_contention at
-- once (a key that other sessions grant and release that fast).
CREATE OR REPLACE FUNCTION lease._acquire_settle(key_hash bytea, key text, owner text, ttl interval, lock_left interval,
                                      OUT outcome text, OUT epoch bigint, OUT expires_at timestamptz)
RETURNS record
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_key text COLLATE "C" := key;
    v_owner text COLLATE "C" := owner;
    v_hash bytea := key_hash;
    v_row record;
    v_share boolean := current_setting('transaction_isolation') <> 'read committed';
    v_saved_lock_timeout text := current_setting('lock_timeout');
    v_lock_deadline timestamptz := lease._expires_in(lock_left);
    v_generation bigint;
BEGIN
    BEGIN
        FOR v_pass IN 1..4 LOOP
            SELECT t.epoch, t.expires_at INTO epoch, expires_at
              FROM lease._acquire_take_over(v_hash, v_key, v_owner, ttl, v_lock_deadline - clock_timestamp()) AS t;
            IF epoch IS NOT NULL THEN
                outcome := 'granted';
                EXIT;
            END IF;
            PERFORM lease._limit_lock_wait(v_lock_deadline - clock_timestamp());
            IF v_share THEN
                SELECT l.owner, lease._live(l) AS live INTO v_row
                  FROM lease.leases AS l WHERE l.key_hash = v_hash AND l.key = v_key FOR SHARE;
            ELSE
                SELECT l.owner, lease._live(l) AS live INTO v_row
                  FROM lease.leases AS l WHERE l.key_hash = v_hash AND l.key = v_key;
            END IF;
            IF NOT FOUND THEN
                -- A first grant. ON CONFLICT DO NOTHING waits (within the
                -- bound) for a concurrent first grant of the key and then
                -- inserts nothing; the next pass finds that row.
                v_generation := lease._generation(true);
                INSERT INTO lease.leases AS l (key, key_hash, owner, epoch, expires_at, lapsed_owner, first_epoch)
                SELECT v_key, v_hash, v_owner, e.epoch, lease._expires_in(_acquire_settle.ttl), NULL, e.epoch
                  FROM (SELECT lease._grant_epoch(NULL, v_generation, g.pruned_through) AS epoch
                          FROM lease.lineage AS g WHERE g.singleton) AS e
                ON CONFLICT ON CONSTRAINT leases_pkey DO NOTHING
                RETURNING l.epoch, l.expires_at INTO _acquire_settle.epoch, _acquire_settle.expires_at;
                IF FOUND THEN
                    outcome := 'granted';
                    EXIT;
                END IF;
            ELSIF v_row.live AND v_row.owner <> v_owner THEN
                RAISE EXCEPTION USING ERRCODE = 'LH001';   -- denied: roll the locks back
            ELSIF v_row.live THEN
                SELECT l.epoch, lease._expiry(l) INTO epoch, expires_at
                  FROM lease.leases AS l
                 WHERE l.key_hash = v_hash AND l.owner = v_owner AND lease._live(l)
                   FOR KEY SHARE;
                IF FOUND THEN
                    outcome := 'held';
                    EXIT;
                END IF;
            END IF;
            -- Changed under this pass (a grant that ended, a first grant
            -- that won): one more.
        END LOOP;
        IF outcome IS NULL THEN
            PERFORM lease._raise_contention('acquire', v_key);
        END IF;
    EXCEPTION
        WHEN SQLSTATE 'LH001' THEN
            outcome := 'denied';   -- the attempt's locks are gone with it
        WHEN lock_not_available THEN
            outcome := 'busy';
    END;
    -- The bound outlives a committed subtransaction: put the caller's
    -- lock_timeout back.
    PERFORM set_config('lock_timeout', v_saved_lock_timeout, true);
END;
$$;

-- What lease.acquire does once an attempt was not granted: for a lock
-- wait that ran out (`busy`), try again at once while the wait lasts (a
-- wait longer than lock_timeout can take met the cap); for a denial, sleep
-- until the next poll (every 50 ms, never past the deadline). `left` is
-- what is left of the wait (NULL: a call without one). Raises
-- lease_wait_timeout when the wait is over.
CREATE OR REPLACE FUNCTION lease._acquire_wait(key text, wait interval, "left" interval, busy boolean)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF busy AND ("left" IS NULL OR "left" <= interval '0') THEN
        PERFORM lease._raise_wait_timeout(key, wait,
            CASE WHEN "left" IS NULL
                 THEN 'stayed locked by another transaction for 1 second (the bound of a call without a wait)'
                 ELSE format('stayed locked by another transaction for the whole wait of %s', wait) END);
    ELSIF NOT busy AND "left" <= interval '0' THEN
        PERFORM lease._raise_wait_timeout(key, wait,
            format('stayed held by another owner for the whole wait of %s', wait));
    ELSIF NOT busy THEN
        PERFORM pg_sleep(LEAST(0.05, EXTRACT(epoch FROM "left")::double precision));
    END IF;
END;
$$;

-- Grants `key` to `owner` for `ttl` when it is FREE, LAPSED or never seen
-- (docs/SPECIFICATION.md §1.3), waiting up to `wait` for it by polling
-- (lease._acquire_wait). A grant locks the key's row until the caller's
-- transaction ends; a denied or waiting attempt keeps no lock. A grant of
-- a new term notifies its observers (lease._on_change with lease_granted)
-- when it commits. A grant writes, so a read-only transaction (a standby,
-- a primary being demoted) is refused before anything is read: a denial
-- read there may be stale.
--
-- Each attempt reads the key's row once. Under READ COMMITTED another
-- owner's live grant is the common denial, decided from that read without
-- a lock. The common grants take one statement: a FREE or LAPSED row
-- outside any heartbeat group that nobody has locked (SKIP LOCKED never
-- waits) is granted by one UPDATE, a key without a row by one INSERT (ON
-- CONFLICT waits, within the bound, for a concurrent first grant, and
-- then inserts nothing), while the lineage row is current
-- (lease._current_lineage). Everything else is lease._acquire_settle's.
CREATE OR REPLACE FUNCTION lease.acquire(key text, owner text, ttl interval, wait interval DEFAULT '0',
                              OUT acquired boolean, OUT epoch bigint, OUT expires_at timestamptz)
RETURNS record
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_key text COLLATE "C" := key;
    v_owner text COLLATE "C" := owner;
    v_hash bytea := lease._key_hash(key);
    v_now timestamptz := clock_timestamp();
    v_deadline timestamptz;   -- NULL: no wait
    v_row record;
    v_outcome text;           -- this attempt's: granted, held, denied or busy
    v_saved_lock_timeout text;
    v_announced boolean;      -- an assignment, not PERFORM: no executor start
BEGIN
    IF NOT (lease._name_ok(v_key) AND lease._name_ok(v_owner) AND lease._ttl_ok(acquire.ttl)
            AND lease._wait_ok(acquire.wait) AND lease._allowed(v_key) AND NOT lease._read_only()) THEN
        PERFORM lease._refuse_call('acquire', v_key, v_owner, NULL, acquire.ttl, acquire.wait, true);
    END IF;
    IF v_now + acquire.wait > v_now THEN   -- by the time it adds: '1 mon -30 days' may wait a day
        v_deadline := v_now + acquire.wait;
    END IF;
    LOOP
        v_outcome := NULL;
        SELECT l.owner, lease._live(l) AS live, l.group_id INTO v_row
          FROM lease.leases AS l WHERE l.key_hash = v_hash AND l.key = v_key;
        IF FOUND AND v_row.live AND v_row.owner <> v_owner
           AND current_setting('transaction_isolation') = 'read committed' THEN
            v_outcome := 'denied';
        ELSIF FOUND AND NOT v_row.live AND v_row.group_id IS NULL THEN
            BEGIN   -- rolled back when nothing was granted: a recheck that failed keeps its lock
                UPDATE lease.leases AS l
                   SET owner = v_owner, epoch = lease._grant_epoch(l.epoch, lease._lineage_generation(lg, lg.last_timeline), NULL),
                       expires_at = lease._expires_in(acquire.ttl), lapsed_owner = l.owner
                  FROM (SELECT o.key_hash FROM lease.leases AS o
                         WHERE o.key_hash = v_hash AND NOT lease._live(o) AND o.group_id IS NULL
                           FOR UPDATE SKIP LOCKED) AS c,
                       lease._current_lineage() AS lg
                 WHERE l.key_hash = c.key_hash
                RETURNING l.epoch, l.expires_at, 'granted' INTO acquire.epoch, acquire.expires_at, v_outcome;
                IF NOT FOUND THEN
                    RAISE EXCEPTION USING ERRCODE = 'LH001';
                END IF;
            EXCEPTION WHEN SQLSTATE 'LH001' THEN NULL;
            END;
        ELSIF NOT FOUND THEN
            v_saved_lock_timeout := current_setting('lock_timeout');
            BEGIN
                PERFORM lease._limit_lock_wait(COALESCE(v_deadline, lease._expires_in(interval '1 second')) - clock_timestamp());
                INSERT INTO lease.leases AS l (key, key_hash, owner, epoch, expires_at, lapsed_owner, first_epoch)
                SELECT v_key, v_hash, v_owner, e.epoch, lease._expires_in(acquire.ttl), NULL, e.epoch
                  FROM (SELECT lease._grant_epoch(NULL, lease._lineage_generation(lg, lg.last_timeline),
                                                  lg.pruned_through) AS epoch
                          FROM lease._current_lineage() AS lg) AS e
                ON CONFLICT ON CONSTRAINT leases_pkey DO NOTHING
                RETURNING l.epoch, l.expires_at, 'granted' INTO acquire.epoch, acquire.expires_at, v_outcome;
            EXCEPTION WHEN lock_not_available THEN v_outcome := 'busy';
            END;
            PERFORM set_config('lock_timeout', v_saved_lock_timeout, true);
        END IF;
        IF v_outcome IS NULL THEN
            SELECT s.outcome, s.epoch, s.expires_at INTO v_outcome, epoch, expires_at
              FROM lease._acquire_settle(v_hash, v_key, v_owner, acquire.ttl,
                                         COALESCE(v_deadline - clock_timestamp(), interval '1 second')) AS s;
        END IF;
        IF v_outcome IN ('granted', 'held') THEN
            v_announced := CASE WHEN v_outcome = 'granted' THEN lease._on_change(v_hash, 'lease_granted') END;
            acquired := true;
            EXIT;
        ELSIF v_outcome = 'denied' AND v_deadline IS NULL THEN
            acquired := false;
            RETURN;
        END IF;
        PERFORM lease._acquire_wait(v_key, acquire.wait, v_deadline - clock_timestamp(), v_outcome = 'busy');
    END LOOP;
    PERFORM lease._make_durable();
END;
$$;

-- Extends the grant (key, owner, epoch) to now + ttl while it is live
-- (docs/SPECIFICATION.md §1.3); otherwise answers why not: not_owner,
-- lapsed or epoch_mismatch. A renewal locks the key's row until the
-- caller's transaction ends; a refusal locks nothing. One UPDATE on the
-- common path; a second only when a change committed between the first
-- and the status read made the grant match, and then lease_contention if
-- that one misses too.
CREATE OR REPLACE FUNCTION lease.renew(key text, owner text, epoch bigint, ttl interval,
                            OUT status text, OUT expires_at timestamptz)
RETURNS record
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_key text COLLATE "C" := key;
    v_owner text COLLATE "C" := owner;
    v_hash bytea;
    v_durable text;
BEGIN
    IF NOT (lease._name_ok(v_key) AND lease._name_ok(v_owner) AND renew.epoch IS NOT NULL
            AND lease._ttl_ok(renew.ttl) AND lease._allowed(v_key)) THEN
        PERFORM lease._refuse_call('renew', v_key, v_owner, renew.epoch, renew.ttl, NULL, false);
    END IF;
    v_hash := lease._key_hash(v_key);
    FOR v_pass IN 1..2 LOOP
        -- In a subtransaction, rolled back when nothing was renewed: an
        -- UPDATE that waited for a concurrent change locks the row's newest
        -- version before it checks the grant again, and would keep that
        -- lock (§1.5: a refusal keeps no lock).
        BEGIN
            UPDATE lease.leases AS l
               SET expires_at = lease._expires_in(renew.ttl)
             WHERE l.key_hash = v_hash AND l.key = v_key AND l.owner = v_owner AND l.epoch = renew.epoch
               AND lease._live(l)
            RETURNING l.expires_at INTO renew.expires_at;
            IF NOT FOUND THEN
                RAISE EXCEPTION USING ERRCODE = 'LH001';
            END IF;
            v_durable := lease._make_durable();   -- an assignment: no executor start
            status := 'ok';
            RETURN;
        EXCEPTION WHEN SQLSTATE 'LH001' THEN
            NULL;
        END;
        status := lease._status(v_hash, v_key, v_owner, renew.epoch);
        IF status <> 'ok' THEN
            RETURN;
        END IF;
    END LOOP;
    PERFORM lease._raise_contention('renew', v_key);
END;
$$;

-- Ends the grant (key, owner, epoch) while it is live: the key becomes FREE
-- and its counter moves on by one (docs/SPECIFICATION.md §1.3), its
-- waiters are woken, and a heartbeat group it was in counts it out;
-- otherwise answers why not. A release locks the key's row until the
-- caller's transaction ends; a refusal locks nothing. The row is locked
-- first, so the group it leaves is read from its newest version.
CREATE OR REPLACE FUNCTION lease.release(key text, owner text, epoch bigint, OUT status text)
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_key text COLLATE "C" := key;
    v_owner text COLLATE "C" := owner;
    v_hash bytea;
    v_group bigint;
    v_durable text;
BEGIN
    IF NOT (lease._name_ok(v_key) AND lease._name_ok(v_owner) AND release.epoch IS NOT NULL
            AND lease._allowed(v_key)) THEN
        PERFORM lease._refuse_call('release', v_key, v_owner, release.epoch, NULL, NULL, false);
    END IF;
    v_hash := lease._key_hash(v_key);
    FOR v_pass IN 1..2 LOOP
        -- In a subtransaction, rolled back when nothing was released, for
        -- the reason lease.renew gives.
        BEGIN
            -- A grant outside any heartbeat group: one UPDATE.
            UPDATE lease.leases AS l
               SET (key, key_hash, owner, epoch, expires_at, lapsed_owner, first_epoch, group_id, force_released) = ROW((lease._freed(l, NULL)).*)
             WHERE l.key_hash = v_hash AND l.key = v_key AND l.owner = v_owner AND l.epoch = release.epoch
               AND l.group_id IS NULL AND lease._live(l);
            IF NOT FOUND THEN
                -- A grant in a group: lock it to learn its group, then
                -- release it and count it out of the group.
                SELECT l.group_id INTO v_group
                  FROM lease.leases AS l
                 WHERE l.key_hash = v_hash AND l.key = v_key AND l.owner = v_owner AND l.epoch = release.epoch
                   AND l.group_id IS NOT NULL AND lease._live(l)
                   FOR NO KEY UPDATE;
                IF NOT FOUND THEN
                    RAISE EXCEPTION USING ERRCODE = 'LH001';
                END IF;
                UPDATE lease.leases AS l
                   SET (key, key_hash, owner, epoch, expires_at, lapsed_owner, first_epoch, group_id, force_released) = ROW((lease._freed(l, NULL)).*)
                 WHERE l.key_hash = v_hash;
                PERFORM lease._left_groups(ARRAY[v_group]);
            END IF;
            v_durable := lease._make_durable();   -- an assignment: no executor start
            PERFORM lease._on_change(v_hash, 'lease_released');
            status := 'ok';
            RETURN;
        EXCEPTION WHEN SQLSTATE 'LH001' THEN
            NULL;
        END;
        status := lease._status(v_hash, v_key, v_owner, release.epoch);
        IF status <> 'ok' THEN
            RETURN;
        END IF;
    END LOOP;
    PERFORM lease._raise_contention('release', v_key);
END;
$$;

-- The key's state as of the call (docs/SPECIFICATION.md §1.3): no row for a
-- never-seen key; owner and expiry only while a grant is live. Locks
-- nothing. A key under another role's namespace is refused, not shown (§4).
CREATE OR REPLACE FUNCTION lease.inspect(key text)
RETURNS TABLE (held boolean, owner text, epoch bigint, expires_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_key text COLLATE "C" := key;
BEGIN
    IF NOT (lease._name_ok(v_key) AND lease._allowed(v_key)) THEN
        PERFORM lease._refuse_call('inspect', v_key, NULL, NULL, NULL, NULL, false);
    END IF;
    RETURN QUERY
        SELECT s.live, CASE WHEN s.live THEN s.owner END, s.epoch, CASE WHEN s.live THEN s.expiry END
          FROM (SELECT lease._live(l) AS live, l.owner::text AS owner, l.epoch::bigint AS epoch,
                       lease._expiry(l) AS expiry
                  FROM lease.leases AS l
                 WHERE l.key_hash = lease._key_hash(v_key) AND l.key = v_key) AS s;
END;
$$;

-- The key's state in the words `leasehold inspect` and `leasehold ls` use
-- (docs/guide/operations.md, "Words"): `held` (a live grant), `lapsed` (a
-- grant whose expiry passed: anyone may take the key, and its holder's
-- renew answers `lapsed`) or `free` (no grant: released by its holder,
-- `ended` = 'released', or by an operator, `ended` = 'force_released').
-- owner and expires_at are the grant's, lapsed included; epoch is the
-- grant's, or the counter when free. No row for a never-seen key. Unlike
-- lease.inspect, whose pg_lease signature shows a lapsed grant as unowned,
-- it tells a lapsed grant from a released one, which is what a holder that
-- was refused needs to learn why. Locks nothing; the namespace rules apply
-- as to inspect (§4).
CREATE OR REPLACE FUNCTION lease.key_state(key text)
RETURNS TABLE (state text, owner text, epoch bigint, expires_at timestamptz, ended text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_key text COLLATE "C" := key;
BEGIN
    IF NOT (lease._name_ok(v_key) AND lease._allowed(v_key)) THEN
        PERFORM lease._refuse_call('key_state', v_key, NULL, NULL, NULL, NULL, false);
    END IF;
    RETURN QUERY
        SELECT CASE WHEN l.owner IS NULL THEN 'free' WHEN lease._live(l) THEN 'held' ELSE 'lapsed' END,
               l.owner::text, l.epoch::bigint, lease._expiry(l),
               CASE WHEN l.owner IS NOT NULL THEN NULL
                    WHEN l.force_released THEN 'force_released' ELSE 'released' END
          FROM lease.leases AS l
         WHERE l.key_hash = lease._key_hash(v_key) AND l.key = v_key;
END;
$$;

-- Why (key, owner, epoch) is not a live grant, for a holder whose renew or
-- release was refused: `status` is what renew and release answer now,
-- `reason` says what happened to the grant (held, lapsed, epoch_mismatch,
-- released, force_released, superseded, never_held: lease._refusal has the
-- table), and newest_epoch is the key's newest grant (NULL for a key with
-- no row). Reads only; checks its input and the namespace rules as renew
-- does, so a caller learns nothing renew would not have told it.
CREATE OR REPLACE FUNCTION lease.why_refused(key text, owner text, epoch bigint)
RETURNS TABLE (status text, reason text, newest_epoch bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_key text COLLATE "C" := key;
    v_owner text COLLATE "C" := owner;
BEGIN
    IF NOT (lease._name_ok(v_key) AND lease._name_ok(v_owner) AND why_refused.epoch IS NOT NULL
            AND lease._allowed(v_key)) THEN
        PERFORM lease._refuse_call('why_refused', v_key, v_owner, why_refused.epoch, NULL, NULL, false);
    END IF;
    RETURN QUERY SELECT r.status, r.reason, r.newest_epoch
                   FROM lease._refusal(lease._key_hash(v_key), v_key, v_owner, why_refused.epoch) AS r;
END;
$$;

-- The server's current generation and timeline (docs/SPECIFICATION.md
-- §1.2): the next grant's epoch is at least (generation << 40) + 1. Read
-- only, for any role and on a standby too (there it reports the timeline of
-- the last restartpoint). Answers nothing about any key.
CREATE OR REPLACE FUNCTION lease.generation(OUT generation bigint, OUT timeline bigint)
RETURNS record
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    generation := lease._generation(false);
    timeline := lease._timeline();
END;
$$;

REVOKE ALL ON FUNCTION lease._lock_budget(interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._limit_lock_wait(interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._raise_wait_timeout(text, interval, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._acquire_take_over(bytea, text, text, interval, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._acquire_settle(bytea, text, text, interval, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._acquire_wait(text, interval, interval, boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION lease.acquire(text, text, interval, interval) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.renew(text, text, bigint, interval) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.release(text, text, bigint) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.inspect(text) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.key_state(text) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.why_refused(text, text, bigint) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.generation() TO PUBLIC;

-- Every file of functions and every migration ends so (see
-- lease._drop_default_grants).
SELECT lease._drop_default_grants();
