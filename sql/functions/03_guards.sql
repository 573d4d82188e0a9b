-- leasehold: guards (docs/SPECIFICATION.md §2). A guard fences a resource
-- (any name the application chooses) with the epochs of one lease key.
--
-- Everything here runs inside the caller's transaction: an admission takes
-- effect only if the caller commits, and the row locks it takes last until
-- the caller's transaction ends, which is what serialises writers (G4) and
-- holds off a takeover until a lease-checked write commits (G6).
--
-- Lock order (docs/SPECIFICATION.md §1.5): every call that touches a guard
-- row locks the lease key's row first, so two calls of one key never wait
-- for each other's rows in opposite orders. admit, fence, check_held and
-- admit_held lock the lease row FOR KEY SHARE; renew_admit FOR NO KEY
-- UPDATE (it renews).
--
-- Input violations are listed resource, key, epoch (or up_to), then owner
-- and ttl.

SET LOCAL lock_timeout = '5s';

-- Raised when a presented epoch is below what the resource admits (G2).
CREATE OR REPLACE FUNCTION lease._raise_stale(resource text, presented bigint, accepted bigint)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION 'stale fencing epoch % for resource %: it admits only epochs >= %', presented, resource, accepted
        USING ERRCODE = '55000',
              CONSTRAINT = 'lease_guard_stale_epoch',
              DETAIL = lease._detail('accepted', accepted::text, 'presented', presented::text, 'resource', resource),
              HINT = 'This holder was superseded (a newer grant, a release, a newer write or a fence): stop acting on this lease; re-acquire for a new epoch if needed.';
END;
$$;

-- Raised when a token of another lease key is presented (G5).
CREATE OR REPLACE FUNCTION lease._raise_wrong_key(resource text, fenced_by text, presented_key text)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION 'resource % is fenced by lease key %, not by %', resource, fenced_by, presented_key
        USING ERRCODE = '22023',
              CONSTRAINT = 'lease_guard_wrong_key',
              DETAIL = lease._detail('fenced_by', fenced_by),
              HINT = 'Present a token of the lease key that fences this resource.';
END;
$$;

-- Raised when a lease-checked call finds the lease not held by (key, owner,
-- epoch) (G6); `reason` is the status renew would answer. `fenced_table`
-- names the fenced table whose write was refused (NULL for a guard call).
CREATE OR REPLACE FUNCTION lease._raise_not_held(key text, owner text, epoch bigint, status text, reason text,
                                      newest_epoch bigint, fenced_table text)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION '%lease % is not held by % at epoch %: %',
            CASE WHEN fenced_table IS NULL THEN '' ELSE format('write to table %s refused: ', fenced_table) END,
            key, owner, epoch,
            CASE WHEN reason = 'superseded' THEN format('superseded by epoch %s', newest_epoch)
                 WHEN reason = 'lapsed' AND newest_epoch > epoch THEN format('lapsed, and taken over at epoch %s', newest_epoch)
                 WHEN reason = 'epoch_mismatch' THEN format('epoch_mismatch: the owner holds epoch %s', newest_epoch)
                 ELSE reason END
        USING ERRCODE = '55000',
              CONSTRAINT = 'lease_guard_lease_not_held',
              DETAIL = lease._detail('reason', status, 'why', reason, 'newest', newest_epoch::text, 'key', key,
                                     'owner', owner, 'epoch', epoch::text, 'table', fenced_table),
              HINT = 'Stop acting on this lease; re-acquire it for a new epoch if needed.';
END;
$$;

-- Raised when a presented epoch was never granted: above the key's counter,
-- or any epoch of a key that was never leased in this database (G7).
CREATE OR REPLACE FUNCTION lease._raise_not_granted(resource text, key text, presented bigint, counter bigint)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION 'epoch % of lease key % was never granted, so it cannot fence resource %', presented, key, resource
        USING ERRCODE = '22023',
              CONSTRAINT = 'lease_guard_epoch_not_granted',
              DETAIL = lease._detail('counter', counter::text, 'presented', presented::text),
              HINT = 'Present the epoch of a grant of this key; lease.inspect reports the key''s counter.';
END;
$$;

-- A key name as an error message may show it to the caller: hidden when the
-- key is under a namespace the caller may not act on (§4).
CREATE OR REPLACE FUNCTION lease._shown_key(key text)
RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN CASE WHEN lease._allowed(key) THEN key ELSE '(a key of another role)' END;
END;
$$;

-- Admits (resource, key, epoch), the key's row already locked by the caller
-- and the input checked (G1, G2, G5): one upsert on the common path, which
-- locks the guard row until the caller's transaction ends. The reason for a
-- refusal is read only when it did not apply.
CREATE OR REPLACE FUNCTION lease._admit(resource text, key text, epoch bigint)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_resource text COLLATE "C" := resource;
    v_key text COLLATE "C" := key;
    v_hash bytea := lease._key_hash(resource);
    v_row record;
BEGIN
    INSERT INTO lease.guards AS g (resource, resource_hash, lease_key, accepted_epoch, updated_at)
    VALUES (v_resource, v_hash, v_key, _admit.epoch, clock_timestamp())
    ON CONFLICT ON CONSTRAINT guards_pkey DO UPDATE
       SET accepted_epoch = excluded.accepted_epoch,
           updated_at = excluded.updated_at
     WHERE g.resource = excluded.resource
       AND g.lease_key = excluded.lease_key
       AND g.accepted_epoch <= excluded.accepted_epoch;
    IF FOUND THEN
        PERFORM lease._make_durable();
        RETURN;
    END IF;
    -- ON CONFLICT locked the row even though it did not update it, so this
    -- read sees the state that refused us.
    SELECT g.lease_key, g.accepted_epoch INTO v_row
      FROM lease.guards AS g
     WHERE g.resource_hash = v_hash AND g.resource = v_resource;
    IF v_row.lease_key <> v_key THEN
        PERFORM lease._raise_wrong_key(v_resource, lease._shown_key(v_row.lease_key), v_key);
    END IF;
    PERFORM lease._raise_stale(v_resource, _admit.epoch, v_row.accepted_epoch);
END;
$$;

-- Checks, input already checked, that the lease is held right now by
-- (owner, epoch) (G6) and returns its effective expiry; raises
-- lease_guard_lease_not_held otherwise, naming `fenced_table` when a fenced
-- table's write is being checked. Locks the key's row FOR KEY SHARE until
-- the caller's transaction ends: no grant to anybody else can commit in
-- between, while the holder's own renew and release are not held up.
CREATE OR REPLACE FUNCTION lease._check_held(key text, owner text, epoch bigint, fenced_table text)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_key text COLLATE "C" := key;
    v_owner text COLLATE "C" := owner;
    v_hash bytea := lease._key_hash(key);
    v_expires timestamptz;
    v_why record;
BEGIN
    FOR v_pass IN 1..2 LOOP
        SELECT lease._expiry(l) INTO v_expires
          FROM lease.leases AS l
         WHERE l.key_hash = v_hash AND l.key = v_key
           AND l.owner = v_owner AND l.epoch = _check_held.epoch
           AND lease._live(l)
           FOR KEY SHARE;
        IF FOUND THEN
            RETURN v_expires;
        END IF;
        SELECT * INTO v_why FROM lease._refusal(v_hash, v_key, v_owner, _check_held.epoch);
        IF v_why.status <> 'ok' THEN
            PERFORM lease._raise_not_held(v_key, v_owner, _check_held.epoch, v_why.status,
                                          v_why.reason, v_why.newest_epoch, fenced_table);
        END IF;
    END LOOP;
    PERFORM lease._raise_contention('check_held', v_key);
    RETURN NULL;
END;
$$;

-- Admits (resource, key, epoch) for a write in the caller's transaction (G1,
-- G2, G5), refusing an epoch the key never granted (G7: above its counter,
-- or the counter of a FREE row) and, as stale, an epoch below the key's
-- newest grant (G2: superseded, even before the successor writes) or below
-- the first epoch of the key's row: such an epoch belongs to an
-- incarnation of the key whose row was pruned, and the resource's own
-- record may have been pruned with it (docs/SPECIFICATION.md §1.8, I16).
-- Locks the key's row FOR KEY SHARE and the guard row until the caller's
-- transaction ends.
CREATE OR REPLACE FUNCTION lease.admit(resource text, key text, epoch bigint)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_resource text COLLATE "C" := resource;
    v_key text COLLATE "C" := key;
    v_epoch bigint := epoch;
    v_row record;
BEGIN
    IF NOT (lease._name_ok(v_resource) AND lease._name_ok(v_key) AND v_epoch IS NOT NULL AND v_epoch >= 1) THEN
        PERFORM lease._raise_invalid('admit',
            lease._text_violations('resource', v_resource) || lease._text_violations('key', v_key)
            || lease._epoch_violations('epoch', v_epoch, 1));
    END IF;
    IF NOT lease._allowed(v_key) THEN
        PERFORM lease._raise_forbidden('admit', 'key', v_key);
    END IF;
    IF NOT lease._allowed(v_resource) THEN
        PERFORM lease._raise_forbidden('admit', 'resource', v_resource);
    END IF;
    SELECT l.epoch, l.first_epoch, l.owner IS NULL AS free INTO v_row
      FROM lease.leases AS l
     WHERE l.key_hash = lease._key_hash(v_key) AND l.key = v_key
       FOR KEY SHARE;
    -- Only the key's newest grant is admitted: its epoch, on a row that
    -- holds a grant (held or lapsed). One test on that path; the reason
    -- is sorted out only for a refusal.
    IF NOT FOUND OR v_epoch <> v_row.epoch OR v_row.free THEN
        -- Never granted: above the counter, or the counter of a FREE row,
        -- which is one above its last grant.
        IF NOT FOUND OR v_epoch >= v_row.epoch THEN
            PERFORM lease._raise_not_granted(v_resource, v_key, v_epoch, COALESCE(v_row.epoch, 0));
        END IF;
        -- An epoch of a pruned incarnation of the key (§1.8).
        IF v_epoch < v_row.first_epoch THEN
            PERFORM lease._raise_stale(v_resource, v_epoch, v_row.first_epoch);
        END IF;
        -- Superseded: the key was granted again, released or
        -- force-released since this epoch was granted, whether or not
        -- anybody wrote since. The lowest epoch the key can present now is
        -- its current grant's, or the next grant's when the row is FREE.
        PERFORM lease._raise_stale(v_resource, v_epoch, v_row.epoch + v_row.free::integer);
    END IF;
    PERFORM lease._admit(v_resource, v_key, v_epoch);
END;
$$;

-- lease._check_held for clients (G6): the lease is held by (owner, epoch);
-- returns its expiry. Locks the key's row FOR KEY SHARE until the caller's
-- transaction ends.
CREATE OR REPLACE FUNCTION lease.check_held(key text, owner text, epoch bigint)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_key text COLLATE "C" := key;
    v_owner text COLLATE "C" := owner;
    v_epoch bigint := epoch;
BEGIN
    IF NOT (lease._name_ok(v_key) AND lease._name_ok(v_owner) AND v_epoch IS NOT NULL) THEN
        PERFORM lease._raise_invalid('check_held',
            lease._text_violations('key', v_key) || lease._text_violations('owner', v_owner)
            || lease._epoch_violations('epoch', v_epoch, NULL));
    END IF;
    IF NOT lease._allowed(v_key) THEN
        PERFORM lease._raise_forbidden('check_held', 'key', v_key);
    END IF;
    RETURN lease._check_held(v_key, v_owner, v_epoch, NULL);
END;
$$;

-- Checks the lease is held (G6), then admits (G1, G2, G5); returns the
-- lease's expiry. Locks the key's row FOR KEY SHARE, then the guard row,
-- until the caller's transaction ends.
CREATE OR REPLACE FUNCTION lease.admit_held(resource text, key text, owner text, epoch bigint)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_resource text COLLATE "C" := resource;
    v_key text COLLATE "C" := key;
    v_owner text COLLATE "C" := owner;
    v_epoch bigint := epoch;
    v_expires timestamptz;
BEGIN
    IF NOT (lease._name_ok(v_resource) AND lease._name_ok(v_key) AND lease._name_ok(v_owner) AND v_epoch IS NOT NULL AND v_epoch >= 1) THEN
        PERFORM lease._raise_invalid('admit_held',
            lease._text_violations('resource', v_resource) || lease._text_violations('key', v_key)
            || lease._epoch_violations('epoch', v_epoch, 1) || lease._text_violations('owner', v_owner));
    END IF;
    IF NOT lease._allowed(v_key) THEN
        PERFORM lease._raise_forbidden('admit_held', 'key', v_key);
    END IF;
    IF NOT lease._allowed(v_resource) THEN
        PERFORM lease._raise_forbidden('admit_held', 'resource', v_resource);
    END IF;
    v_expires := lease._check_held(v_key, v_owner, v_epoch, NULL);
    PERFORM lease._admit(v_resource, v_key, v_epoch);
    RETURN v_expires;
END;
$$;

-- Renews the lease (G6; the heartbeat commits only together with the write),
-- then admits (G1, G2, G5); returns the new expiry. Locks the key's row FOR
-- NO KEY UPDATE, then the guard row, until the caller's transaction ends.
CREATE OR REPLACE FUNCTION lease.renew_admit(resource text, key text, owner text, epoch bigint, ttl interval)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_resource text COLLATE "C" := resource;
    v_key text COLLATE "C" := key;
    v_owner text COLLATE "C" := owner;
    v_epoch bigint := epoch;
    v_ttl interval := ttl;
    v_renewal record;
    v_why record;
BEGIN
    IF NOT (lease._name_ok(v_resource) AND lease._name_ok(v_key) AND lease._name_ok(v_owner) AND v_epoch IS NOT NULL AND v_epoch >= 1
            AND lease._ttl_ok(v_ttl)) THEN
        PERFORM lease._raise_invalid('renew_admit',
            lease._text_violations('resource', v_resource) || lease._text_violations('key', v_key)
            || lease._epoch_violations('epoch', v_epoch, 1) || lease._text_violations('owner', v_owner)
            || lease._ttl_violations(v_ttl));
    END IF;
    IF NOT lease._allowed(v_resource) THEN
        PERFORM lease._raise_forbidden('renew_admit', 'resource', v_resource);
    END IF;
    -- lease.renew checks the key's namespace.
    SELECT r.status, r.expires_at INTO v_renewal FROM lease.renew(v_key, v_owner, v_epoch, v_ttl) AS r;
    IF v_renewal.status <> 'ok' THEN
        SELECT * INTO v_why FROM lease._refusal(lease._key_hash(v_key), v_key, v_owner, v_epoch);
        IF v_why.status = 'ok' THEN
            -- Cannot be (a refused grant never becomes live again); the
            -- renew's own answer then.
            PERFORM lease._raise_not_held(v_key, v_owner, v_epoch, v_renewal.status, v_renewal.status, NULL, NULL);
        END IF;
        PERFORM lease._raise_not_held(v_key, v_owner, v_epoch, v_why.status, v_why.reason, v_why.newest_epoch, NULL);
    END IF;
    PERFORM lease._admit(v_resource, v_key, v_epoch);
    RETURN v_renewal.expires_at;
END;
$$;

-- An operator action (G7; granted to nobody by default): raises a
-- resource's floor without writing, so every epoch <= up_to is refused from
-- now on (for example the counter lease.inspect reports after a release or
-- lapse). Refuses an up_to above the key's counter: an epoch never granted
-- fences nothing. Registers the resource if it is new. Returns the new
-- record: the lowest epoch the resource now admits. Locks the key's row FOR
-- KEY SHARE and the guard row until the caller's transaction ends.
-- Namespace rules do not apply to operators.
CREATE OR REPLACE FUNCTION lease.fence(resource text, key text, up_to bigint)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_resource text COLLATE "C" := resource;
    v_key text COLLATE "C" := key;
    v_up_to bigint := up_to;
    v_hash bytea;
    v_counter bigint;
    v_accepted bigint;
    v_fenced_by text;
BEGIN
    IF NOT (lease._name_ok(v_resource) AND lease._name_ok(v_key) AND v_up_to IS NOT NULL AND v_up_to >= 0
            AND v_up_to < 9223372036854775807) THEN
        PERFORM lease._raise_invalid('fence',
            lease._text_violations('resource', v_resource) || lease._text_violations('key', v_key)
            || lease._epoch_violations('up_to', v_up_to, 0)
            || CASE WHEN v_up_to = 9223372036854775807 THEN ARRAY['up_to must be below 9223372036854775807']
                    ELSE ARRAY[]::text[] END);
    END IF;
    SELECT l.epoch INTO v_counter
      FROM lease.leases AS l
     WHERE l.key_hash = lease._key_hash(v_key) AND l.key = v_key
       FOR KEY SHARE;
    IF v_up_to > COALESCE(v_counter, 0) THEN
        PERFORM lease._raise_not_granted(v_resource, v_key, v_up_to, COALESCE(v_counter, 0));
    END IF;
    v_hash := lease._key_hash(v_resource);
    INSERT INTO lease.guards AS g (resource, resource_hash, lease_key, accepted_epoch, updated_at)
    VALUES (v_resource, v_hash, v_key, v_up_to + 1, clock_timestamp())
    ON CONFLICT ON CONSTRAINT guards_pkey DO UPDATE
       SET accepted_epoch = GREATEST(g.accepted_epoch, excluded.accepted_epoch),
           updated_at = excluded.updated_at
     WHERE g.resource = excluded.resource AND g.lease_key = excluded.lease_key
    RETURNING g.accepted_epoch INTO v_accepted;
    IF NOT FOUND THEN
        SELECT g.lease_key INTO v_fenced_by
          FROM lease.guards AS g
         WHERE g.resource_hash = v_hash AND g.resource = v_resource;
        PERFORM lease._raise_wrong_key(v_resource, v_fenced_by, v_key);
    END IF;
    PERFORM lease._make_durable();
    RETURN v_accepted;
END;
$$;

-- The resource's guard record: no row for a resource never admitted or
-- fenced. Locks nothing. Refused when the resource, or the key that fences
-- it, is under a namespace the caller may not act on (§4).
CREATE OR REPLACE FUNCTION lease.inspect_guard(resource text)
RETURNS TABLE (lease_key text, accepted_epoch bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_resource text COLLATE "C" := resource;
    v_row record;
BEGIN
    IF NOT lease._name_ok(v_resource) THEN
        PERFORM lease._raise_invalid('inspect_guard', lease._text_violations('resource', v_resource));
    END IF;
    IF NOT lease._allowed(v_resource) THEN
        PERFORM lease._raise_forbidden('inspect_guard', 'resource', v_resource);
    END IF;
    SELECT g.lease_key, g.accepted_epoch INTO v_row
      FROM lease.guards AS g
     WHERE g.resource_hash = lease._key_hash(v_resource) AND g.resource = v_resource;
    IF FOUND THEN
        IF NOT lease._allowed(v_row.lease_key) THEN
            PERFORM lease._raise_forbidden('inspect_guard', 'resource', v_resource);
        END IF;
        lease_key := v_row.lease_key;
        accepted_epoch := v_row.accepted_epoch;
        RETURN NEXT;
    END IF;
END;
$$;

REVOKE ALL ON FUNCTION lease._raise_stale(text, bigint, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._raise_wrong_key(text, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._raise_not_held(text, text, bigint, text, text, bigint, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._raise_not_granted(text, text, bigint, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._shown_key(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._admit(text, text, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._check_held(text, text, bigint, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION lease.admit(text, text, bigint) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.check_held(text, text, bigint) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.admit_held(text, text, text, bigint) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.renew_admit(text, text, text, bigint, interval) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.inspect_guard(text) TO PUBLIC;
-- lease.fence is an operator action: PUBLIC keeps the EXECUTE it gets by
-- default only until this REVOKE (G7).
REVOKE ALL ON FUNCTION lease.fence(text, text, bigint) FROM PUBLIC;

-- Every file of functions and every migration ends so (see
-- lease._drop_default_grants).
SELECT lease._drop_default_grants();
