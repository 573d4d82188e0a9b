-- leasehold v1: guards (SPEC §2). A guard fences a resource (any name the
-- application chooses) with the epochs of one lease key.
--
-- Same security rules as the lease primitive: SECURITY DEFINER, search_path
-- pinned to pg_catalog then pg_temp, every reference schema-qualified, the
-- table closed to callers.
--
-- Everything here runs inside the caller's transaction: an admission takes
-- effect only if the caller commits, and the row locks it takes last until
-- the caller's transaction ends, which is what serialises writers (G4) and
-- holds off a takeover until a lease-checked write commits (G6).

-- One row per fenced resource, keyed by the SHA-256 of its name (set by the
-- functions, like lease.leases.key_hash, so any name length works).
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
CREATE FUNCTION lease._raise_stale(p_resource text, p_presented bigint, p_accepted bigint)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    RAISE EXCEPTION 'stale fencing epoch % for resource %: it admits only epochs >= %', p_presented, p_resource, p_accepted
        USING ERRCODE = '55000',
              CONSTRAINT = 'lease_guard_stale_epoch',
              DETAIL = format('accepted=%s presented=%s resource=%s', p_accepted, p_presented, p_resource),
              HINT = 'A newer holder has written: stop acting on this lease; re-acquire for a new epoch if needed.';
END;
$$;

-- Raised when a token of another lease key is presented (G5).
CREATE FUNCTION lease._raise_wrong_key(p_resource text, p_fenced_by text, p_presented_key text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    RAISE EXCEPTION 'resource % is fenced by lease key %, not by %', p_resource, p_fenced_by, p_presented_key
        USING ERRCODE = '22023',
              CONSTRAINT = 'lease_guard_wrong_key',
              DETAIL = format('fenced_by=%s', p_fenced_by),
              HINT = 'Present a token of the lease key that fences this resource.';
END;
$$;

CREATE FUNCTION lease._guard_violations(p_resource text, p_key text, p_epoch bigint, p_epoch_name text)
RETURNS text[]
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    v text[] := '{}';
BEGIN
    IF p_resource IS NULL THEN
        v := v || 'resource must not be NULL'::text;
    ELSIF p_resource = '' THEN
        v := v || 'resource must not be empty'::text;
    END IF;
    IF p_key IS NULL THEN
        v := v || 'key must not be NULL'::text;
    ELSIF p_key = '' THEN
        v := v || 'key must not be empty'::text;
    END IF;
    IF p_epoch IS NULL THEN
        v := v || format('%s must not be NULL', p_epoch_name);
    ELSIF p_epoch_name = 'epoch' AND p_epoch < 1 THEN
        v := v || 'epoch must be at least 1'::text;
    ELSIF p_epoch < 0 THEN
        v := v || format('%s must not be negative', p_epoch_name);
    END IF;
    RETURN v;
END;
$$;

-- Admits (resource, key, epoch) without input checks: one upsert on the
-- common path, which also locks the guard row until the caller's transaction
-- ends. The reason for a refusal is looked up only when it did not apply.
CREATE FUNCTION lease._admit(p_resource text, p_key text, p_epoch bigint)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_row record;
    v_hash bytea;
BEGIN
    v_hash := pg_catalog.sha256(pg_catalog.convert_to(p_resource, 'UTF8'));
    INSERT INTO lease.guards AS g (resource, resource_hash, lease_key, accepted_epoch, updated_at)
    VALUES (p_resource, v_hash, p_key, p_epoch, clock_timestamp())
    ON CONFLICT (resource_hash) DO UPDATE
       SET accepted_epoch = excluded.accepted_epoch,
           updated_at = excluded.updated_at
     WHERE g.resource = excluded.resource
       AND g.lease_key = excluded.lease_key
       AND g.accepted_epoch <= excluded.accepted_epoch;
    IF FOUND THEN
        RETURN;
    END IF;
    -- ON CONFLICT locked the row even though it did not update it, so this
    -- read sees the state that refused us.
    SELECT g.lease_key, g.accepted_epoch INTO v_row
      FROM lease.guards AS g
     WHERE g.resource_hash = v_hash AND g.resource = p_resource;
    IF v_row.lease_key <> p_key THEN
        PERFORM lease._raise_wrong_key(p_resource, v_row.lease_key, p_key);
    END IF;
    PERFORM lease._raise_stale(p_resource, p_epoch, v_row.accepted_epoch);
END;
$$;

-- The lease is held right now by (owner, epoch); lock its row until the
-- caller's transaction ends so that no takeover, release or renewal by anyone
-- else can commit in between. Returns the expiry.
--
-- FOR NO KEY UPDATE, the lock lease.renew and lease.release themselves take,
-- rather than a share lock: two sessions holding a share lock that both go on
-- to renew or release in the same transaction would deadlock on the upgrade.
-- The price is that lease-checked transactions of one holder serialise.
CREATE FUNCTION lease._check_held(p_key text, p_owner text, p_epoch bigint)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_expires timestamptz;
    v_status text;
    v_hash bytea := pg_catalog.sha256(pg_catalog.convert_to(p_key, 'UTF8'));
BEGIN
    SELECT l.expires_at INTO v_expires
      FROM lease.leases AS l
     WHERE l.key_hash = v_hash AND l.key = p_key
       AND l.owner = p_owner AND l.epoch = p_epoch AND l.expires_at > clock_timestamp()
       FOR NO KEY UPDATE;
    IF FOUND THEN
        RETURN v_expires;
    END IF;
    v_status := lease._status_locked(v_hash, p_key, p_owner, p_epoch);
    IF v_status = 'ok' THEN
        -- It became held between the two reads and is locked now.
        SELECT l.expires_at INTO v_expires FROM lease.leases AS l
         WHERE l.key_hash = v_hash AND l.key = p_key;
        RETURN v_expires;
    END IF;
    RAISE EXCEPTION 'lease % is not held by % at epoch %: %', p_key, p_owner, p_epoch, v_status
        USING ERRCODE = '55000',
              CONSTRAINT = 'lease_guard_lease_not_held',
              DETAIL = format('reason=%s key=%s owner=%s epoch=%s', v_status, p_key, p_owner, p_epoch),
              HINT = 'Stop acting on this lease; re-acquire it for a new epoch if needed.';
END;
$$;

CREATE FUNCTION lease.admit(resource text, key text, epoch bigint)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_violations text[];
BEGIN
    IF $1 IS NULL OR $1 = '' OR $2 IS NULL OR $2 = '' OR $3 IS NULL OR $3 < 1 THEN
        v_violations := lease._guard_violations($1, $2, $3, 'epoch');
        PERFORM lease._raise_invalid('admit', v_violations);
    END IF;
    PERFORM lease._admit($1, $2, $3);
END;
$$;

CREATE FUNCTION lease.check_held(key text, owner text, epoch bigint)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_violations text[];
BEGIN
    IF $1 IS NULL OR $1 = '' OR $2 IS NULL OR $2 = '' OR $3 IS NULL THEN
        v_violations := lease._violations($1, true, $2, false, NULL, false, NULL, true, $3);
        PERFORM lease._raise_invalid('check_held', v_violations);
    END IF;
    RETURN lease._check_held($1, $2, $3);
END;
$$;

CREATE FUNCTION lease.admit_held(resource text, key text, owner text, epoch bigint)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_violations text[];
    v_expires timestamptz;
BEGIN
    IF $1 IS NULL OR $1 = '' OR $2 IS NULL OR $2 = '' OR $3 IS NULL OR $3 = '' OR $4 IS NULL OR $4 < 1 THEN
        v_violations := lease._guard_violations($1, $2, $4, 'epoch')
                     || lease._violations($2, true, $3, false, NULL, false, NULL, false, NULL);
        -- key is checked by both lists; name each violation once.
        v_violations := ARRAY(SELECT t.v FROM unnest(v_violations) WITH ORDINALITY AS t(v, n) GROUP BY t.v ORDER BY min(t.n));
        PERFORM lease._raise_invalid('admit_held', v_violations);
    END IF;
    v_expires := lease._check_held($2, $3, $4);
    PERFORM lease._admit($1, $2, $4);
    RETURN v_expires;
END;
$$;

CREATE FUNCTION lease.renew_admit(resource text, key text, owner text, epoch bigint, ttl interval)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_violations text[];
    v_renewal record;
BEGIN
    IF $1 IS NULL OR $1 = '' OR $2 IS NULL OR $2 = '' OR $3 IS NULL OR $3 = '' OR $4 IS NULL OR $4 < 1
       OR $5 IS NULL OR $5 <= interval '0' OR $5 > interval '100 years' THEN
        v_violations := lease._guard_violations($1, $2, $4, 'epoch')
                     || lease._violations($2, true, $3, true, $5, false, NULL, false, NULL);
        -- key is checked by both lists; name each violation once.
        v_violations := ARRAY(SELECT t.v FROM unnest(v_violations) WITH ORDINALITY AS t(v, n) GROUP BY t.v ORDER BY min(t.n));
        PERFORM lease._raise_invalid('renew_admit', v_violations);
    END IF;
    -- The renewal's UPDATE locks the lease row until the caller's
    -- transaction ends: heartbeat and write commit together or not at all.
    SELECT r.status, r.expires_at INTO v_renewal FROM lease.renew($2, $3, $4, $5) AS r;
    IF v_renewal.status <> 'ok' THEN
        RAISE EXCEPTION 'lease % is not held by % at epoch %: %', $2, $3, $4, v_renewal.status
            USING ERRCODE = '55000',
                  CONSTRAINT = 'lease_guard_lease_not_held',
                  DETAIL = format('reason=%s key=%s owner=%s epoch=%s', v_renewal.status, $2, $3, $4),
                  HINT = 'Stop acting on this lease; re-acquire it for a new epoch if needed.';
    END IF;
    PERFORM lease._admit($1, $2, $4);
    RETURN v_renewal.expires_at;
END;
$$;

-- Raises a resource's floor without writing: every epoch <= up_to is refused
-- from now on (for example the counter lease.inspect reports after a release
-- or lapse). Registers the resource if it is new. Returns the new record:
-- the lowest epoch the resource now admits.
CREATE FUNCTION lease.fence(resource text, key text, up_to bigint)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_violations text[];
    v_row record;
BEGIN
    v_violations := lease._guard_violations($1, $2, $3, 'up_to');
    IF cardinality(v_violations) > 0 THEN
        PERFORM lease._raise_invalid('fence', v_violations);
    END IF;
    INSERT INTO lease.guards AS g (resource, resource_hash, lease_key, accepted_epoch, updated_at)
    VALUES ($1, pg_catalog.sha256(pg_catalog.convert_to($1, 'UTF8')), $2, $3 + 1, clock_timestamp())
    ON CONFLICT (resource_hash) DO UPDATE
       SET accepted_epoch = GREATEST(g.accepted_epoch, excluded.accepted_epoch),
           updated_at = excluded.updated_at
     WHERE g.resource = excluded.resource AND g.lease_key = excluded.lease_key
    RETURNING g.accepted_epoch INTO v_row;
    IF NOT FOUND THEN
        SELECT g.lease_key INTO v_row FROM lease.guards AS g
         WHERE g.resource_hash = pg_catalog.sha256(pg_catalog.convert_to($1, 'UTF8')) AND g.resource = $1;
        PERFORM lease._raise_wrong_key($1, v_row.lease_key, $2);
    END IF;
    RETURN v_row.accepted_epoch;
END;
$$;

CREATE FUNCTION lease.inspect_guard(resource text)
RETURNS TABLE (lease_key text, accepted_epoch bigint)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF $1 IS NULL OR $1 = '' THEN
        PERFORM lease._raise_invalid('inspect_guard',
            ARRAY[CASE WHEN $1 IS NULL THEN 'resource must not be NULL' ELSE 'resource must not be empty' END]);
    END IF;
    RETURN QUERY
        SELECT g.lease_key, g.accepted_epoch
          FROM lease.guards AS g
         WHERE g.resource_hash = pg_catalog.sha256(pg_catalog.convert_to($1, 'UTF8')) AND g.resource = $1;
END;
$$;

REVOKE ALL ON FUNCTION lease._raise_stale(text, bigint, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._raise_wrong_key(text, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._guard_violations(text, text, bigint, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._admit(text, text, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION lease._check_held(text, text, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION lease.admit(text, text, bigint) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.check_held(text, text, bigint) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.admit_held(text, text, text, bigint) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.renew_admit(text, text, text, bigint, interval) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.fence(text, text, bigint) TO PUBLIC;
GRANT EXECUTE ON FUNCTION lease.inspect_guard(text) TO PUBLIC;
