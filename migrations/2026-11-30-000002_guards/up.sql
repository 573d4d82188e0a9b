-- leasehold: guards (docs/SPECIFICATION.md §2). A guard fences a resource (any
-- name the application chooses) with the epochs of one lease key.
--
-- The rules of 2026-11-30-000001 apply (security, names, hot paths first).
-- Input violations are listed resource, key, epoch (or up_to), then owner
-- and ttl: the order the guard functions' messages have always used.
--
-- Everything here runs inside the caller's transaction: an admission takes
-- effect only if the caller commits, and the row locks it takes last until
-- the caller's transaction ends, which is what serialises writers (G4) and
-- holds off a takeover until a lease-checked write commits (G6). Lease rows
-- are always locked before guard rows.

-- One row per fenced resource.
--   resource_hash: lease._key_hash(resource), the primary key (see
--          lease.leases.key_hash: any name length works).
--   lease_key: the key whose epochs fence it (G5: other keys' tokens are a misuse).
--   accepted_epoch: the record (G1): the highest epoch admitted, or one more
--          than the epoch lease.fence fenced through, whichever is greater;
--          0 before anything. Never decreases. Epochs below it are refused.
CREATE TABLE lease.guards (
    resource       text        NOT NULL,
    resource_hash  bytea       PRIMARY KEY,
    lease_key      text        NOT NULL,
    accepted_epoch bigint      NOT NULL,   -- >= 0, kept by the functions (no CHECK: see lease.leases)
    updated_at     timestamptz NOT NULL
);
REVOKE ALL ON TABLE lease.guards FROM PUBLIC;

-- Raised when a presented epoch is below what the resource admits (G2).
CREATE FUNCTION lease._raise_stale(resource text, presented bigint, accepted bigint)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    RAISE EXCEPTION 'stale fencing epoch % for resource %: it admits only epochs >= %', presented, resource, accepted
        USING ERRCODE = '55000',
              CONSTRAINT = 'lease_guard_stale_epoch',
              DETAIL = format('accepted=%s presented=%s resource=%s', accepted, presented, resource),
              HINT = 'A newer holder has written: stop acting on this lease; re-acquire for a new epoch if needed.';
END;
$$;

-- Raised when a token of another lease key is presented (G5).
CREATE FUNCTION lease._raise_wrong_key(resource text, fenced_by text, presented_key text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    RAISE EXCEPTION 'resource % is fenced by lease key %, not by %', resource, fenced_by, presented_key
        USING ERRCODE = '22023',
              CONSTRAINT = 'lease_guard_wrong_key',
              DETAIL = format('fenced_by=%s', fenced_by),
              HINT = 'Present a token of the lease key that fences this resource.';
END;
$$;

-- Raised when a lease-checked call finds the lease not held by (key, owner,
-- epoch) (G6); `reason` is the status renew would answer.
CREATE FUNCTION lease._raise_not_held(key text, owner text, epoch bigint, reason text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    RAISE EXCEPTION 'lease % is not held by % at epoch %: %', key, owner, epoch, reason
        USING ERRCODE = '55000',
              CONSTRAINT = 'lease_guard_lease_not_held',
              DETAIL = format('reason=%s key=%s owner=%s epoch=%s', reason, key, owner, epoch),
              HINT = 'Stop acting on this lease; re-acquire it for a new epoch if needed.';
END;
$$;

-- Admits (resource, key, epoch) without input checks (G1, G2, G5): one upsert
-- on the common path, which locks the guard row until the caller's
-- transaction ends. The reason for a refusal is read only when it did not
-- apply.
CREATE FUNCTION lease._admit(resource text, key text, epoch bigint)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_hash bytea := lease._key_hash(resource);
    v_row record;
BEGIN
    INSERT INTO lease.guards AS g (resource, resource_hash, lease_key, accepted_epoch, updated_at)
    VALUES (_admit.resource, v_hash, _admit.key, _admit.epoch, clock_timestamp())
    ON CONFLICT (resource_hash) DO UPDATE
       SET accepted_epoch = excluded.accepted_epoch,
           updated_at = excluded.updated_at
     WHERE g.resource = excluded.resource
       AND g.lease_key = excluded.lease_key
       AND g.accepted_epoch <= excluded.accepted_epoch;
    IF FOUND THEN
        -- docs/SPECIFICATION.md §1.4: durable at commit whatever the
        -- caller's session asked for (see lease.acquire).
        IF current_setting('synchronous_commit') IN ('off', 'local') THEN
            PERFORM set_config('synchronous_commit', 'on', true);
        END IF;
        RETURN;
    END IF;
    -- ON CONFLICT locked the row even though it did not update it, so this
    -- read sees the state that refused us.
    SELECT g.lease_key, g.accepted_epoch INTO v_row
      FROM lease.guards AS g
     WHERE g.resource_hash = v_hash AND g.resource = _admit.resource;
    IF v_row.lease_key <> key THEN
        PERFORM lease._raise_wrong_key(resource, v_row.lease_key, key);
    END IF;
    PERFORM lease._raise_stale(resource, epoch, v_row.accepted_epoch);
END;
$$;

-- Checks without input checks that the lease is held right now by (owner,
-- epoch) (G6) and returns its expiry; raises lease_guard_lease_not_held
-- otherwise. Locks the key's row until the caller's transaction ends, so no
-- takeover, release or renewal by anyone else can commit in between.
--
-- FOR NO KEY UPDATE, the lock lease.renew and lease.release themselves take,
-- rather than a share lock: two sessions holding a share lock that both go on
-- to renew or release in the same transaction would deadlock on the upgrade.
-- The price is that lease-checked transactions of one holder serialise.
CREATE FUNCTION lease._check_held(key text, owner text, epoch bigint)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_hash bytea := lease._key_hash(key);
    v_expires timestamptz;
    v_status text;
BEGIN
    SELECT l.expires_at INTO v_expires
      FROM lease.leases AS l
     WHERE l.key_hash = v_hash AND l.key = _check_held.key
       AND l.owner = _check_held.owner AND l.epoch = _check_held.epoch
       AND l.expires_at > clock_timestamp()
       FOR NO KEY UPDATE;
    IF FOUND THEN
        RETURN v_expires;
    END IF;
    v_status := lease._status_locked(v_hash, key, owner, epoch);
    IF v_status <> 'ok' THEN
        PERFORM lease._raise_not_held(key, owner, epoch, v_status);
    END IF;
    -- It became held between the two reads and is locked now.
    SELECT l.expires_at INTO v_expires
      FROM lease.leases AS l
     WHERE l.key_hash = v_hash AND l.key = _check_held.key;
    RETURN v_expires;
END;
$$;

-- Admits (resource, key, epoch) for a write in the caller's transaction (G1,
-- G2, G5). Locks the guard row until the caller's transaction ends.
CREATE FUNCTION lease.admit(resource text, key text, epoch bigint)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF resource IS NULL OR resource = '' OR key IS NULL OR key = '' OR epoch IS NULL OR epoch < 1 THEN
        PERFORM lease._raise_invalid('admit',
            lease._text_violations('resource', resource) || lease._text_violations('key', key)
            || lease._epoch_violations('epoch', epoch, 1));
    END IF;
    PERFORM lease._admit(resource, key, epoch);
END;
$$;

-- lease._check_held for clients (G6): the lease is held by (owner, epoch);
-- returns its expiry. Locks the key's row until the caller's transaction ends.
CREATE FUNCTION lease.check_held(key text, owner text, epoch bigint)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF key IS NULL OR key = '' OR owner IS NULL OR owner = '' OR epoch IS NULL THEN
        PERFORM lease._raise_invalid('check_held',
            lease._text_violations('key', key) || lease._text_violations('owner', owner)
            || lease._epoch_violations('epoch', epoch, NULL));
    END IF;
    RETURN lease._check_held(key, owner, epoch);
END;
$$;

-- Checks the lease is held (G6), then admits (G1, G2, G5); returns the
-- lease's expiry. Locks the key's row, then the guard row, until the caller's
-- transaction ends.
CREATE FUNCTION lease.admit_held(resource text, key text, owner text, epoch bigint)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_expires timestamptz;
BEGIN
    IF resource IS NULL OR resource = '' OR key IS NULL OR key = '' OR owner IS NULL OR owner = ''
       OR epoch IS NULL OR epoch < 1 THEN
        PERFORM lease._raise_invalid('admit_held',
            lease._text_violations('resource', resource) || lease._text_violations('key', key)
            || lease._epoch_violations('epoch', epoch, 1) || lease._text_violations('owner', owner));
    END IF;
    v_expires := lease._check_held(key, owner, epoch);
    PERFORM lease._admit(resource, key, epoch);
    RETURN v_expires;
END;
$$;

-- Renews the lease (G6; the heartbeat commits only together with the write),
-- then admits (G1, G2, G5); returns the new expiry. Locks the key's row, then
-- the guard row, until the caller's transaction ends.
CREATE FUNCTION lease.renew_admit(resource text, key text, owner text, epoch bigint, ttl interval)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_renewal record;
BEGIN
    IF resource IS NULL OR resource = '' OR key IS NULL OR key = '' OR owner IS NULL OR owner = ''
       OR epoch IS NULL OR epoch < 1
       OR ttl IS NULL OR NOT lease._plain_ttl(ttl) THEN
        PERFORM lease._raise_invalid('renew_admit',
            lease._text_violations('resource', resource) || lease._text_violations('key', key)
            || lease._epoch_violations('epoch', epoch, 1) || lease._text_violations('owner', owner)
            || lease._ttl_violations(ttl));
    END IF;
    SELECT r.status, r.expires_at INTO v_renewal
      FROM lease.renew(renew_admit.key, renew_admit.owner, renew_admit.epoch, renew_admit.ttl) AS r;
    IF v_renewal.status <> 'ok' THEN
        PERFORM lease._raise_not_held(key, owner, epoch, v_renewal.status);
    END IF;
    PERFORM lease._admit(resource, key, epoch);
    RETURN v_renewal.expires_at;
END;
$$;

-- Raises a resource's floor without writing: every epoch <= up_to is refused
-- from now on (for example the counter lease.inspect reports after a release
-- or lapse). Registers the resource if it is new. Returns the new record: the
-- lowest epoch the resource now admits. Locks the guard row until the
-- caller's transaction ends.
CREATE FUNCTION lease.fence(resource text, key text, up_to bigint)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_hash bytea;
    v_accepted bigint;
    v_fenced_by text;
BEGIN
    IF resource IS NULL OR resource = '' OR key IS NULL OR key = '' OR up_to IS NULL OR up_to < 0 THEN
        PERFORM lease._raise_invalid('fence',
            lease._text_violations('resource', resource) || lease._text_violations('key', key)
            || lease._epoch_violations('up_to', up_to, 0));
    END IF;
    v_hash := lease._key_hash(resource);
    INSERT INTO lease.guards AS g (resource, resource_hash, lease_key, accepted_epoch, updated_at)
    VALUES (fence.resource, v_hash, fence.key, fence.up_to + 1, clock_timestamp())
    ON CONFLICT (resource_hash) DO UPDATE
       SET accepted_epoch = GREATEST(g.accepted_epoch, excluded.accepted_epoch),
           updated_at = excluded.updated_at
     WHERE g.resource = excluded.resource AND g.lease_key = excluded.lease_key
    RETURNING g.accepted_epoch INTO v_accepted;
    IF NOT FOUND THEN
        SELECT g.lease_key INTO v_fenced_by
          FROM lease.guards AS g
         WHERE g.resource_hash = v_hash AND g.resource = fence.resource;
        PERFORM lease._raise_wrong_key(resource, v_fenced_by, key);
    END IF;
    -- §1.4: durable at commit (see lease.acquire).
    IF current_setting('synchronous_commit') IN ('off', 'local') THEN
        PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
    RETURN v_accepted;
END;
$$;

-- The resource's guard record: no row for a resource never admitted or
-- fenced. Locks nothing.
CREATE FUNCTION lease.inspect_guard(resource text)
RETURNS TABLE (lease_key text, accepted_epoch bigint)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF resource IS NULL OR resource = '' THEN
        PERFORM lease._raise_invalid('inspect_guard', lease._text_violations('resource', resource));
    END IF;
    RETURN QUERY
        SELECT g.lease_key, g.accepted_epoch
          FROM lease.guards AS g
         WHERE g.resource_hash = lease._key_hash(inspect_guard.resource) AND g.resource = inspect_guard.resource;
END;
$$;

REVOKE ALL ON FUNCTION lease._raise_stale(text, bigint, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._raise_wrong_key(text, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._raise_not_held(text, text, bigint, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._admit(text, text, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._check_held(text, text, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION lease.admit(text, text, bigint) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.check_held(text, text, bigint) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.admit_held(text, text, text, bigint) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.renew_admit(text, text, text, bigint, interval) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.fence(text, text, bigint) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.inspect_guard(text) TO PUBLIC;
